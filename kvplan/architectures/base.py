"""Shared pieces for the family modules: a config accessor, layer patterns, weight blocks, max context.

Family quirks do NOT live here: each family module states its own (biases, norms, patterns); this file holds
only what several families share.
"""

from __future__ import annotations

import reprlib
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

from kvplan import dtypes
from kvplan.architectures import modelopt_mixed
from kvplan.errors import ConfigError
from kvplan.spec import (
    QUANT_SOURCE_KEY,
    ChunkedLocal,
    FullAttention,
    LayerCache,
    NoCache,
    Quantization,
    SlidingWindow,
    WeightPart,
)

_MISSING = object()
_BRIEF = reprlib.Repr()
_BRIEF.maxstring, _BRIEF.maxother, _BRIEF.maxlist, _BRIEF.maxdict, _BRIEF.maxlevel = 60, 60, 4, 4, 2


def brief(value) -> str:
    """A config value as an error line shows it: repr, cut short (a 10,000-entry list stays one short line)."""
    return _BRIEF.repr(value)


class Cfg:
    """Read-only view of one (sub)config dict with class defaults and missing-field reporting.

    `defaults` are the transformers config-class defaults for fields a config.json may omit (the Gemma-3
    text_config ships without head counts, for instance). Every `need` records what is missing so the user gets
    ONE line naming all missing fields.
    """

    def __init__(self, raw: dict[str, Any], defaults: dict[str, Any] | None = None, where: str = "config"):
        self.raw = raw
        self.defaults = defaults or {}
        self.where = where

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def get(self, *keys: str, default: Any = None) -> Any:
        """First non-null value among `keys` (then class defaults, then `default`)."""
        for k in keys:
            v = self.raw.get(k)
            if v is not None:
                return v
        for k in keys:
            if self.defaults.get(k) is not None:
                return self.defaults[k]
        return default

    def need(self, *keys: str) -> Any:
        value = self.get(*keys, default=_MISSING)
        if value is _MISSING:
            raise MissingFields(self.where, [" / ".join(keys)])
        return value

    def need_int(self, *keys: str) -> int:
        value = self.need(*keys)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or int(value) != value or value < 0:
            raise ConfigError(f"{self.where}: {keys[0]} must be a non-negative integer, found {brief(value)}")
        return int(value)

    def sub(self, key: str, defaults: dict[str, Any] | None = None) -> "Cfg":
        value = self.raw.get(key)
        if not isinstance(value, dict):
            return Cfg({}, defaults, f"{self.where}.{key}")
        return Cfg(value, defaults, f"{self.where}.{key}")

    def need_all(self, *specs: Sequence[str] | str) -> None:
        """Check several fields at once so the error names every missing one."""
        missing = []
        for spec in specs:
            keys = (spec,) if isinstance(spec, str) else tuple(spec)
            if self.get(*keys, default=_MISSING) is _MISSING:
                missing.append(" / ".join(keys))
        if missing:
            raise MissingFields(self.where, missing)


class MissingFields(ConfigError):
    def __init__(self, where: str, fields: list[str]):
        super().__init__(f"{where} lacks {', '.join(fields)}, needed to size this model")


# ---------------------------------------------------------------------------------------------- dtype, tying
def model_dtype(*cfgs: Cfg) -> str | None:
    for c in cfgs:
        for key in ("torch_dtype", "dtype"):
            d = dtypes.from_config(c.raw.get(key))
            if d:
                return d
    return None


def tied(top: Cfg, text: Cfg, class_default: bool) -> bool:
    """tie_word_embeddings: the text config's own value, else the top-level one, else the class default."""
    for c in (text, top):
        v = c.raw.get("tie_word_embeddings")
        if v is not None:
            return bool(v)
    return class_default


# ---------------------------------------------------------------------------------------------- layer kinds
LAYER_TYPE_KINDS = {
    "full_attention": "full",
    "attention": "full",
    "global_attention": "full",
    "sliding_attention": "sliding",
    "local_attention": "sliding",
    "chunked_attention": "chunked",
    "linear_attention": "linear",
    "mamba": "mamba",
    "mamba2": "mamba",
    "mlp": "none",
    "moe": "none",
}


def kinds_from_layer_types(cfg: Cfg, n: int) -> list[str] | None:
    layer_types = cfg.raw.get("layer_types")
    if layer_types is None:
        return None
    if not isinstance(layer_types, list) or len(layer_types) != n:
        found = f"{len(layer_types)} entries" if isinstance(layer_types, list) else brief(layer_types)
        raise ConfigError(f"{cfg.where}: layer_types must list one entry per layer ({n}), found {found}")
    out = []
    for t in layer_types:
        if t not in LAYER_TYPE_KINDS:
            raise ConfigError(
                f"{cfg.where}: unknown layer type {brief(t)} in layer_types; known: {', '.join(LAYER_TYPE_KINDS)}"
            )
        out.append(LAYER_TYPE_KINDS[t])
    return out


@dataclass(frozen=True)
class AttnDims:
    """Attention widths as a config states them (heads, KV heads, K and V head dims)."""
    heads: int
    kv_heads: int
    head_dim: int
    head_dim_v: int


def attention_dims(c: Cfg, heads_keys=("num_attention_heads",), kv_keys=("num_key_value_heads",)) -> AttnDims:
    """Heads, KV heads (default = heads, i.e. MHA) and head_dim (explicit when given, never re-derived)."""
    heads = c.need_int(*heads_keys)
    if heads <= 0:
        raise ConfigError(f"{c.where}: {heads_keys[0]} must be positive, found {heads}")
    kv = c.get(*kv_keys)
    kv = heads if kv is None else int(kv)
    head_dim = c.get("head_dim")
    if head_dim is None:
        head_dim = c.need_int("hidden_size") // heads
    return AttnDims(heads, kv, int(head_dim), int(head_dim))


def attention_cache(kind: str, dims: AttnDims, window: int | None = None, chunk: int | None = None) -> LayerCache:
    if kind == "full":
        return FullAttention(dims.kv_heads, dims.head_dim, dims.head_dim_v)
    if kind == "sliding":
        if not window:
            raise ConfigError("a sliding-window layer needs sliding_window in the config")
        return SlidingWindow(dims.kv_heads, dims.head_dim, dims.head_dim_v, window=int(window))
    if kind == "chunked":
        if not chunk:
            raise ConfigError("a chunked-attention layer needs attention_chunk_size in the config")
        return ChunkedLocal(dims.kv_heads, dims.head_dim, dims.head_dim_v, chunk=int(chunk))
    if kind == "none":
        return NoCache()
    raise ConfigError(f"layer kind {kind!r} has no attention cache")


# ---------------------------------------------------------------------------------------------- weight blocks
def embedding(vocab: int, hidden: int, name: str = "embed_tokens", part: str = "text") -> WeightPart:
    return WeightPart(name, (vocab, hidden), "embedding", part, "vocab")


def lm_head(vocab: int, hidden: int, is_tied: bool, part: str = "text") -> list[WeightPart]:
    return [] if is_tied else [WeightPart("lm_head", (vocab, hidden), "lm_head", part, "vocab")]


def linear(
    name: str, d_in: int, d_out: int, *, bias: bool = False, split: str = "column", layer: int | None = None,
    part: str = "text", role: str = "linear", count: int = 1,
) -> list[WeightPart]:
    """A Linear(d_in -> d_out): weight [d_out, d_in] and optional bias [d_out]."""
    parts = [WeightPart(name, (d_out, d_in), role, part, split if role == "linear" else "expert", layer, count)]
    if bias:
        bias_split = "column" if split == "column" else "replicated"
        parts.append(WeightPart(f"{name}.bias", (d_out,), "bias", part, bias_split if role == "linear" else "expert", layer, count))
    return parts


def norm(name: str, dim: int, *, bias: bool = False, layer: int | None = None, part: str = "text") -> list[WeightPart]:
    parts = [WeightPart(name, (dim,), "norm", part, "replicated", layer)]
    if bias:
        parts.append(WeightPart(f"{name}.bias", (dim,), "norm", part, "replicated", layer))
    return parts


def attention_block(
    layer: int, hidden: int, d: AttnDims, *, qkv_bias: bool = False, o_bias: bool = False,
    q_bias: bool | None = None, k_bias: bool | None = None, v_bias: bool | None = None, part: str = "text",
    prefix: str = "self_attn",
) -> list[WeightPart]:
    qb = qkv_bias if q_bias is None else q_bias
    kb = qkv_bias if k_bias is None else k_bias
    vb = qkv_bias if v_bias is None else v_bias
    return [
        *linear(f"{prefix}.q_proj", hidden, d.heads * d.head_dim, bias=qb, layer=layer, part=part),
        *linear(f"{prefix}.k_proj", hidden, d.kv_heads * d.head_dim, bias=kb, layer=layer, part=part),
        *linear(f"{prefix}.v_proj", hidden, d.kv_heads * d.head_dim_v, bias=vb, layer=layer, part=part),
        *linear(f"{prefix}.o_proj", d.heads * d.head_dim_v, hidden, bias=o_bias, split="row", layer=layer, part=part),
    ]


def gated_mlp(layer: int | None, hidden: int, inter: int, *, bias: bool = False, prefix: str = "mlp", part: str = "text") -> list[WeightPart]:
    return [
        *linear(f"{prefix}.gate_proj", hidden, inter, bias=bias, layer=layer, part=part),
        *linear(f"{prefix}.up_proj", hidden, inter, bias=bias, layer=layer, part=part),
        *linear(f"{prefix}.down_proj", inter, hidden, bias=bias, split="row", layer=layer, part=part),
    ]


def plain_mlp(layer: int | None, hidden: int, inter: int, *, bias: bool = True, prefix: str = "mlp", part: str = "text",
              names: tuple[str, str] = ("fc1", "fc2")) -> list[WeightPart]:
    return [
        *linear(f"{prefix}.{names[0]}", hidden, inter, bias=bias, layer=layer, part=part),
        *linear(f"{prefix}.{names[1]}", inter, hidden, bias=bias, split="row", layer=layer, part=part),
    ]


def experts(layer: int, hidden: int, inter: int, n: int, *, prefix: str = "mlp.experts") -> list[WeightPart]:
    """n gated experts, each gate/up [inter, hidden] and down [hidden, inter] (bias-free)."""
    return [
        WeightPart(f"{prefix}.gate_up_proj", (2 * inter, hidden), "expert", "text", "expert", layer, n),
        WeightPart(f"{prefix}.down_proj", (hidden, inter), "expert", "text", "expert", layer, n),
    ]


def qwen_moe_layer(c: Cfg, layer: int, n: int) -> bool:
    """transformers Qwen2/3-MoE and Qwen3-Next decoder layers: sparse iff num_experts > 0, the layer is not in
    mlp_only_layers and (layer + 1) % decoder_sparse_step == 0."""
    step = int(c.get("decoder_sparse_step", default=1))
    return n > 0 and layer not in (c.get("mlp_only_layers", default=[]) or []) and (layer + 1) % step == 0


def qwen_moe_block(c: Cfg, layer: int, hidden: int, n: int) -> list[WeightPart]:
    """The Qwen sparse MoE block: router, gated experts of moe_intermediate_size and, when
    shared_expert_intermediate_size is set, a gated shared expert with its sigmoid gate."""
    parts = router(layer, hidden, n) + experts(layer, hidden, c.need_int("moe_intermediate_size"), n)
    shared = int(c.get("shared_expert_intermediate_size", default=0))
    if shared:
        parts += gated_mlp(layer, hidden, shared, prefix="mlp.shared_expert")
        parts += router(layer, hidden, 1, name="mlp.shared_expert_gate")
    return parts


def router(layer: int, hidden: int, n: int, *, bias: bool = False, name: str = "mlp.gate") -> list[WeightPart]:
    parts = [WeightPart(name, (n, hidden), "other", "text", "replicated", layer)]
    if bias:
        parts.append(WeightPart(f"{name}.bias", (n,), "other", "text", "replicated", layer))
    return parts


def in_part(parts: list[WeightPart], part: str) -> list[WeightPart]:
    """The same weights attributed to another part (vision, encoder, mtp); built directly, as dataclasses.replace
    inspects the fields anew for each of thousands of parts."""
    return [WeightPart(w.name, w.shape, w.role, part, w.split, w.layer, w.count, w.stored_bytes) for w in parts]


def decoder_layer_norms(layer: int, hidden: int, count: int, *, bias: bool = False) -> list[WeightPart]:
    names = ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm", "post_feedforward_layernorm")
    out: list[WeightPart] = []
    for name in names[:count]:
        out += norm(name, hidden, bias=bias, layer=layer)
    return out


# ---------------------------------------------------------------------------------------------- max context
HF_MAX_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")
# vLLM ModelConfig._get_and_verify_max_len (vllm/config/model.py): the smallest of these keys
VLLM_MAX_KEYS = (
    "max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "model_max_length",
    "max_target_positions", "max_sequence_length", "max_seq_length", "seq_len",
)


def hf_max_ctx(*cfgs: Cfg, keys: Iterable[str] = HF_MAX_KEYS) -> tuple[int | None, str]:
    """transformers / llama.cpp: the first of max_position_embeddings, n_positions, max_seq_len, seq_length."""
    for c in cfgs:
        for k in keys:
            v = c.get(k)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0:
                return int(v), f"{c.where}.{k}"
    return None, "none (no position limit in the config)"


def vllm_max_ctx(c: Cfg) -> tuple[int | None, str]:
    """vLLM ModelConfig._get_and_verify_max_len: the smallest of its length keys (model_max_length wins when
    set), 2048 when the config has none, then the rope-scaling factor for rope types other than
    su/longrope/llama3 (yarn scales original_max_position_embeddings); Gemma-3 is already scaled."""
    found = [(int(c.get(k)), k) for k in VLLM_MAX_KEYS if _is_len(c.get(k))]
    if _is_len(c.get("model_max_length")):
        value, key = int(c.get("model_max_length")), "model_max_length"
    elif found:
        value, key = min(found)
    else:
        return 2048, "vLLM default 2048 (the config has no length key)"
    source = f"{c.where}.{key}"
    rope = c.get("rope_scaling")
    if isinstance(rope, dict) and "gemma3" not in str(c.get("model_type", default="")):
        rope_type = rope.get("rope_type", rope.get("type"))
        if rope_type in ("su", "longrope", "llama3"):
            return value, source
        if rope.get("factor", 1.0) is None:  # vLLM multiplies by it: a null factor stops its start-up
            raise ConfigError(f"{c.where}.rope_scaling.factor is null for rope type {str(rope_type)[:40]!r}; "
                              "give a number (vLLM scales max_model_len by it)")
        factor = float(rope.get("factor", 1.0))
        if factor != 1.0 or rope_type == "yarn":
            if rope_type == "yarn" and rope.get("original_max_position_embeddings"):
                value = int(rope["original_max_position_embeddings"])
            value = int(value * factor)
            source += f" x rope_scaling.factor {rope.get('factor', 1.0)} ({rope_type})"
    return value, source


def _is_len(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


# ---------------------------------------------------------------------------------------------- quantization
def quantization(top: Cfg, text: Cfg) -> Quantization | None:
    q = top.raw.get("quantization_config") or text.raw.get("quantization_config")
    if not isinstance(q, dict):
        return None
    found = _quantization(q, top, text)
    source = q.get(QUANT_SOURCE_KEY)  # read from the export's hf_quant_config.json (model_ref.with_modelopt_quant)
    return replace(found, source=str(source)) if isinstance(source, str) else found


def _quantization(q: dict[str, Any], top: Cfg, text: Cfg) -> Quantization:
    method = str(q.get("quant_method", "")).lower()
    kv_hint = _kv_hint(q)
    algo = str(q.get("quant_algo") or "").upper()
    if method in ("", "modelopt") and algo == "MIXED_PRECISION":
        return _modelopt_mixed(q, kv_hint)
    if method in ("", "modelopt") and algo == "FP8":
        # a ModelOpt FP8 export (W8A8, static): fp8 weights, a weight_scale and an input_scale per tensor (fp32)
        return Quantization("fp8", "ModelOpt FP8 weights, an fp32 weight and input scale per tensor (quant_algo FP8)",
                            None, _modelopt_excluded(q), kv_hint, per_tensor_scale=True)
    if method == "fp8":
        block = q.get("weight_block_size")
        detail = f"fp8 ({q.get('fmt', 'e4m3')}) weights" + (f", fp32 scale per {block[0]}x{block[1]} block" if block else "")
        experts = None
        if str(top.raw.get("expert_dtype") or text.raw.get("expert_dtype") or "").lower() == "fp4":
            experts = "mxfp4"  # DeepSeek-V4: "MXFP4 experts with ue8m0 FP8 linear scales" (vLLM's quant_config)
            detail += "; routed experts MXFP4 (expert_dtype fp4: 17 B per 32 weights)"
        return Quantization("fp8", detail, tuple(block) if block else None, tuple(q.get("modules_to_not_convert") or ()),
                            kv_hint, expert_method=experts)
    nvfp4 = _nvfp4(q, method, algo)
    if nvfp4 is not None:
        return nvfp4
    if method == "mxfp4":
        return Quantization(
            "mxfp4", "MXFP4 experts: 4-bit values + one 8-bit scale per 32 (17 B / 32 weights)", (32,),
            tuple(q.get("modules_to_not_convert") or ()), kv_hint,
        )
    if method in ("gptq", "awq") or q.get("bits") == 4:
        group = int(q.get("group_size", 128) or 128)
        return Quantization("int4", f"{method} int4, group size {group}", (group,), (), kv_hint)
    named = f"quant_method {method!r}" + (f", quant_algo {algo!r}" if algo else "")
    return Quantization(method or "unknown", f"quantized ({named})", None, (), kv_hint)


def _nvfp4(q: dict[str, Any], method: str, algo: str) -> Quantization | None:
    """NVIDIA's NVFP4 exports: ModelOpt (quant_algo NVFP4; flat `group_size`/`exclude_modules`, or newer
    `config_groups`/`ignore`) and compressed-tensors' nvfp4-pack-quantized. Per quantized linear the checkpoint
    holds weight uint8 [out, in/2], weight_scale fp8 [out, in/group], and two fp32 scalars (weight_scale_2 /
    input_scale, or weight_global_scale / input_global_scale); the excluded modules stay 16-bit."""
    groups = q.get("config_groups") if isinstance(q.get("config_groups"), dict) else {}
    weight_schemes = [g.get("weights") for g in groups.values() if isinstance(g, dict) and isinstance(g.get("weights"), dict)]
    is_fp4 = any(w.get("num_bits") == 4 and w.get("type") == "float" and w.get("group_size") == 16 for w in weight_schemes)
    if not (algo == "NVFP4" or (method == "compressed-tensors" and q.get("format") == "nvfp4-pack-quantized" and is_fp4)):
        return None
    group = int(q.get("group_size") or next((w.get("group_size") for w in weight_schemes if w.get("group_size")), 16))
    excluded = _modelopt_excluded(q)
    source = "ModelOpt" if method in ("modelopt", "") else method
    return Quantization("nvfp4", f"NVFP4 weights ({source}): 4-bit values + an fp8 scale per {group} + two fp32 "
                        f"scalars per tensor; {len(excluded)} excluded module pattern(s) stay 16-bit", (group,),
                        excluded, _kv_hint(q))


def _modelopt_mixed(q: dict[str, Any], kv_hint: str | None) -> Quantization:
    """ModelOpt MIXED_PRECISION: a format per module in quantized_layers (modelopt_mixed.py maps them onto the
    weight parts once they are built); a format kvplan has no storage rule for leaves the export uncounted."""
    table = modelopt_mixed.entries(q.get("quantized_layers") if isinstance(q.get("quantized_layers"), dict) else {})
    if isinstance(table, str) or not table:
        what = f"{table} modules" if isinstance(table, str) else "no quantized_layers"
        return Quantization(modelopt_mixed.UNCOUNTED, f"quantized (ModelOpt MIXED_PRECISION with {what})", None, (),
                            kv_hint)
    counts = Counter(algo for algo, _ in table.values())
    listed = ", ".join(f"{n:,} {algo}" for algo, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return Quantization("mixed", f"ModelOpt MIXED_PRECISION: {listed} modules as quantized_layers names them, the "
                        "rest 16-bit", None, _modelopt_excluded(q), kv_hint, mixed_entries=tuple(table.items()))


def _modelopt_excluded(q: dict[str, Any]) -> tuple[str, ...]:
    """The modules an export leaves 16-bit: ModelOpt's exclude_modules (hf_quant_config.json, older config.json)
    or ignore (newer config.json, compressed-tensors)."""
    return tuple(str(m) for m in (q.get("exclude_modules") or q.get("ignore") or ()))


def kv_cache_scales(quant: Quantization | None, weights: list[WeightPart]) -> list[WeightPart]:
    """A ModelOpt export (NVFP4 or FP8) with an fp8 KV cache stores two fp32 scalars per attention layer,
    self_attn.k_proj.k_scale and self_attn.v_proj.v_scale: one 8-byte part per layer that has a self_attn.k_proj
    (ModelOpt's names; latent-attention layers name theirs otherwise and are not counted)."""
    modelopt = quant is not None and (quant.method in ("nvfp4", "mixed") or quant.per_tensor_scale)
    if quant is None or not modelopt or quant.kv_dtype_hint != "fp8_e4m3":
        return []
    layers = sorted({w.layer for w in weights if w.name == "self_attn.k_proj" and w.part == "text" and w.layer is not None})
    # shape (0,): stored scalars that are no model parameter (transformers' count leaves them out)
    return [WeightPart("self_attn.kv_scales", (0,), "quant_scale", "text", "replicated", i, stored_bytes=8)
            for i in layers]


def _kv_hint(q: dict[str, Any]) -> str | None:
    """KV dtype a checkpoint asks for (compressed-tensors kv_cache_scheme, modelopt kv_cache_quant_algo)."""
    scheme = q.get("kv_cache_scheme")
    if isinstance(scheme, str) and scheme.upper() == "FP8":  # a ModelOpt export's config.json
        return "fp8_e4m3"
    if isinstance(scheme, dict):
        if scheme.get("type") == "float" and scheme.get("num_bits") == 8:
            return "fp8_e4m3"
        if scheme.get("type") == "int" and scheme.get("num_bits") == 8:
            return "int8"
    algo = q.get("kv_cache_quant_algo")
    if isinstance(algo, str) and algo.upper() == "FP8":
        return "fp8_e4m3"
    return None
