"""Parameter count and weight bytes from a ModelSpec's weight parts (exact integers).

Storage rules (one table, WEIGHT_FORMATS): 16/32-bit floats store every parameter; quantized formats apply to
the linear and expert weights of the text/encoder stacks, everything else (embeddings, norms, routers, biases,
vision tower) stays in the model's 16-bit dtype. Quantized checkpoints declare their format in
quantization_config: DeepSeek fp8 with an fp32 scale per 128x128 block, gpt-oss MXFP4 experts (17 B / 32
weights), GPTQ/AWQ int4 with fp16 scales and packed int32 zero points per group, NVIDIA NVFP4 (4-bit values, an
fp8 scale per 16, two fp32 scalars per tensor; the export's excluded modules in 16-bit).
"""

from __future__ import annotations

import fnmatch
import math

from dataclasses import dataclass

from kvplan import dtypes
from kvplan.errors import InputError
from kvplan.parallel import cdiv, pp_partition
from kvplan.spec import COUNTED_WEIGHT_FORMATS, ModelSpec, Quantization, WeightPart

FLOAT_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
WEIGHT_DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8", "int4")
QUANTIZED_ROLES = ("linear", "expert")
QUANTIZED_PARTS = ("text", "encoder", "mtp")


def canonical_weight_dtype(flag: str) -> str | None:
    """A --weight-dtype / weight_dtype value by its canonical name (the KV dtype aliases apply), None if unknown."""
    key = dtypes.canonical(flag)
    key = "fp8" if key == "fp8_e4m3" else key
    return key if key in WEIGHT_DTYPES else None


@dataclass(frozen=True)
class WeightFormat:
    """How a checkpoint stores its weights: 16-bit floats, or a quantization counted tensor by tensor."""
    name: str
    description: str
    quant: Quantization | None  # None: every parameter in the float dtype

    def float_dtype(self, default: str) -> str:
        """The dtype unquantized tensors are counted in: a float --weight-dtype (fp32 weights are 4 B each) or the
        engine's load dtype."""
        return self.name if self.quant is None and self.name in FLOAT_BYTES else default


def weight_format(spec: ModelSpec, flag: str | None, float_dtype: str) -> WeightFormat:
    """--weight-dtype, else the checkpoint's quantization_config, else the float dtype the engine loads.
    Weights that state their stored bytes (a GGUF file) are taken as stored: no flag applies to them."""
    if spec.weights and all(w.stored_bytes is not None for w in spec.weights):
        if flag:
            raise InputError(f"{{weight_dtype}} does not apply to a GGUF file: its tensors are counted as stored "
                             f"({spec.stored_format or 'quantized'})", fields=("weight_dtype",))
        return WeightFormat(spec.stored_format or "stored", "tensors as the file stores them", None)
    if flag:
        key = canonical_weight_dtype(flag)
        if key is None:
            raise InputError(f"unknown weight dtype {flag!r}; accepted: {', '.join(WEIGHT_DTYPES)}")
        if key in FLOAT_BYTES:
            return WeightFormat(key, f"{key} (--weight-dtype)", None)
        if key == "int4":
            return WeightFormat("int4", "int4 linear weights + fp16 scale and packed zero point per group of 128 "
                                "(AWQ layout); embeddings, norms and lm_head in " + float_dtype,
                                Quantization("int4", "awq", (128,)))
        return WeightFormat(key, f"{key} linear weights + one fp32 scale per output channel; embeddings, norms and "
                            f"lm_head in {float_dtype}", Quantization(key, "per-channel", None))
    q = spec.quantization
    if q is not None and q.method in COUNTED_WEIGHT_FORMATS:
        return WeightFormat(q.method, f"{q.detail} ({q.source}); other tensors in {float_dtype}", q)
    return WeightFormat(float_dtype, f"{float_dtype} (model dtype)", None)


def part_bytes(w: WeightPart, fmt: WeightFormat, float_bytes: int) -> int:
    if w.stored_bytes is not None:
        return w.stored_bytes
    q = fmt.quant
    if q is not None and q.method == "mixed":
        return _mixed_part_bytes(w, q, float_bytes)
    if q is None or w.role not in QUANTIZED_ROLES or w.part not in QUANTIZED_PARTS:
        return w.params * float_bytes
    method = q.expert_method if q.expert_method and w.role == "expert" else q.method
    if method == "mxfp4" and w.role != "expert":
        return w.params * float_bytes  # gpt-oss: attention, router, embeddings stay 16-bit
    if (method == "nvfp4" or q.per_tensor_scale) and excluded_module(w, q.excluded):
        return w.params * float_bytes  # a ModelOpt export's exclude_modules / ignore stay 16-bit
    n = w.params // w.count
    out_dim, in_dim = (w.shape[0], math.prod(w.shape[1:])) if len(w.shape) >= 2 else (1, n)
    if method == "fp8" and q.block:
        bo, bi = q.block[0], q.block[1] if len(q.block) > 1 else q.block[0]
        per = n + cdiv(out_dim, bo) * cdiv(in_dim, bi) * 4
    elif method == "fp8" and q.per_tensor_scale:
        per = n + 8  # ModelOpt W8A8: weight_scale and input_scale, one fp32 each (vLLM KFp8StaticTensor)
    elif method in ("fp8", "int8"):
        per = n + out_dim * 4
    elif method == "mxfp4":
        per = cdiv(n, 32) * 17
    elif method == "nvfp4":
        per = _nvfp4_bytes(n, out_dim, in_dim, q.block[0] if q.block else 16, 8 * _checkpoint_tensors(w))
    elif method == "int4":
        g = q.block[0] if q.block else 128
        groups = cdiv(in_dim, g)
        per = n // 2 + groups * out_dim * 2 + groups * cdiv(out_dim, 8) * 4
    else:  # pragma: no cover - formats are closed above
        per = n * float_bytes
    return per * w.count


def _checkpoint_tensors(w: WeightPart) -> int:
    """Checkpoint tensors in one kvplan tensor: an expert gate_up part is two (exports keep gate_proj and up_proj
    apart), each with its own scalars."""
    return 2 if w.role == "expert" and w.name.endswith("gate_up_proj") else 1


def _nvfp4_bytes(n: int, out_dim: int, in_dim: int, group: int, scalars: int) -> int:
    """weight uint8 [out, in/2] + weight_scale fp8 [out, in/group] + the fp32 scalars (weight_scale_2, and
    input_scale where activations are FP4 too)."""
    return n // 2 + out_dim * cdiv(in_dim, group) + scalars


def _mixed_part_bytes(w: WeightPart, q: Quantization, float_bytes: int) -> int:
    """ModelOpt MIXED_PRECISION, per module as vLLM 0.32's modelopt.py schemes store it: NVFP4 (W4A4: weight_scale_2
    and input_scale), W4A16_NVFP4 (weight_scale_2 only: KNvfp4Static), FP8 (per-tensor weight_scale and input_scale:
    KFp8StaticTensor), MXFP8 (fp8 values + a uint8 e8m0 scale per 32: KMxfp8Static); modules without an entry, or
    excluded, 16-bit."""
    found = q.part_format(w.name, w.layer, w.part)
    if found is None or excluded_module(w, q.excluded):
        return w.params * float_bytes
    algo, group = found
    n = w.params // w.count
    out_dim, in_dim = (w.shape[0], math.prod(w.shape[1:])) if len(w.shape) >= 2 else (1, n)
    tensors = _checkpoint_tensors(w)
    if algo == "NVFP4":
        per = _nvfp4_bytes(n, out_dim, in_dim, group, 8 * tensors)
    elif algo == "W4A16_NVFP4":
        per = _nvfp4_bytes(n, out_dim, in_dim, group, 4 * tensors)
    elif algo == "FP8":
        per = n + 8 * tensors
    else:  # MXFP8: the formats are closed by modelopt_mixed.MIXED_ALGOS
        per = n + out_dim * cdiv(in_dim, 32)
    return per * w.count


def excluded_module(w: WeightPart, patterns: tuple[str, ...]) -> bool:
    """Whether an export's exclusion list (ModelOpt exclude_modules / ignore: fnmatch wildcards over module paths)
    names the module a part belongs to. kvplan's parts carry the path below the decoder stack, so a pattern is
    compared from its `layers.` on: `model.language_model.layers.3.self_attn*` matches layers.3.self_attn.q_proj."""
    path = w.name if w.layer is None else f"layers.{w.layer}.{w.name}"
    for pattern in patterns:
        if w.part != "mtp" and (pattern.startswith("mtp") or ".mtp." in pattern):
            continue  # `mtp.layers.0*` is the MTP module's layer 0, not the decoder's (Qwen3.6 NVFP4 exports)
        core = pattern[pattern.find("layers."):] if "layers." in pattern else pattern
        if fnmatch.fnmatchcase(path, core) or fnmatch.fnmatchcase(path, "*." + core):
            return True
    return False


def total_bytes(spec: ModelSpec, fmt: WeightFormat, float_dtype: str, *, include_mtp: bool = False) -> int:
    fb = FLOAT_BYTES[float_dtype]
    return sum(part_bytes(w, fmt, fb) for w in spec.weights if include_mtp or w.part != "mtp")


def per_gpu_bytes(spec: ModelSpec, fmt: WeightFormat, float_dtype: str, tp: int, pp: int, stage: int,
                  *, include_mtp: bool = False, only=None) -> int:
    """Weights on one GPU of `stage`: its layers (embeddings on the first stage, final norm and lm_head on the
    last; a tied lm_head is a copy on the last stage when pp > 1), sharded tensors / tp (rounded up).
    only: a WeightPart predicate, to count a subset (the routed experts, for decode-speed bounds)."""
    fb = FLOAT_BYTES[float_dtype]
    stages = pp_partition(spec.num_layers, pp)
    layers = set(stages[stage])
    first, last = stage == 0, stage == pp - 1
    total = 0
    for w in spec.weights:
        if (w.part == "mtp" and not include_mtp) or (only is not None and not only(w)):
            continue
        if w.layer is not None and w.part in ("text", "mtp"):
            if w.layer not in layers and not (w.part == "mtp" and last):
                continue
        elif w.role == "embedding" and w.part == "text" and not first:
            continue
        elif w.role in ("lm_head", "norm") and w.layer is None and w.part == "text" and not last:
            continue
        elif w.part in ("vision", "encoder") and not first:
            continue
        b = part_bytes(w, fmt, fb)
        total += b if w.split == "replicated" or tp == 1 else cdiv(b, tp)
    if spec.tied_embeddings and pp > 1 and last and only is None:
        emb = next((w for w in spec.weights if w.role == "embedding" and w.part == "text"), None)
        if emb is not None:
            total += cdiv(part_bytes(emb, fmt, fb), tp)
    return total


def params_breakdown(spec: ModelSpec) -> dict[str, int]:
    out = {"params": spec.params, "text_params": spec.params_of("text")}
    for part in ("vision", "encoder", "mtp"):
        n = spec.params_of(part)
        if n:
            out[f"{part}_params"] = n
    return out
