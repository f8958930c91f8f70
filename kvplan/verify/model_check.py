"""`kvplan verify --with-model`: run transformers' own model code for the config and measure the cache it builds.

* meta: the full model is built on the meta device from the config (exact shapes, no memory) and one forward of
  [batch, ctx] tokens runs with use_cache=True; every tensor the returned cache holds is summed (numel x element
  size), layer by layer, and set beside the hf layout's CachePlan group by group.
* cpu / cuda (--device given): a real forward on a scaled copy of the config -- tiny hidden size, FFN, vocabulary
  and expert count, the same layers, heads, head dims, windows and layer patterns, token ids kept inside the
  vocabulary. A scaled copy is used only where it caches the same shapes as the full model (checked on meta
  first): families whose head_dim follows hidden_size (gpt2, bloom, opt, falcon, mpt, whisper ...) or whose state
  follows it (Mamba) cannot be scaled, and say so.

MoE blocks on meta use transformers' data-independent `experts_implementation="batched_mm"` (the default eager
path indexes experts by routing results, which meta tensors do not have); attention and cache code are untouched.
"""

from __future__ import annotations

import contextlib
import copy
import os
from dataclasses import dataclass, field
from typing import Any

from kvplan.errors import EnvironmentProblem, InputError

TRANSFORMERS_MISSING = ('--with-model runs the real model code from transformers, which is not installed: '
                        'pip install "transformers>=5.15"')

# MiniMax-M3's flat text config (aiconfigurator's copy: model_type minimax_m3, MiniMaxM3ForCausalLM) is what
# transformers builds as minimax_m3_vl_text (MiniMaxM3VLTextConfig reads the same fields), the hf engine's reading
MODEL_TYPE_ALIASES = {"RefinedWebModel": "falcon", "RefinedWeb": "falcon", "minimax_m3": "minimax_m3_vl_text"}
ARCH_ALIASES = {"RWForCausalLM": "FalconForCausalLM", "MPTForCausalLM": "MptForCausalLM",
                "MiniMaxM3ForCausalLM": "MiniMaxM3VLForCausalLM"}
# Text-only files of a model transformers ships only inside its multimodal wrapper (aiconfigurator's curated
# Step-3.7-Flash: a flat step3p7 file naming Step3p7FlashForCausalLM, a class no engine has): the file's fields become
# the wrapper's text_config, beside a token vision tower (the cache does not depend on it); ties follow the file.
TEXT_ONLY_ARCHS = {"Step3p7FlashForCausalLM": "Step3p7ForConditionalGeneration"}
TOKEN_TOWER = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 1, "image_size": 28, "patch_size": 14}
# Routed experts with no data-independent path in transformers 5.24 (Step3p7Experts loops over the experts the router
# hit: torch.nonzero, which a meta tensor cannot answer, and it ignores experts_implementation): on meta their MoE
# layers are built as the model's dense MLP (mlp_layer_types). Only the attention layers write the cache; a run on a
# real device keeps the MoE layers.
META_DENSE_MLP = ("step3p7",)
DROP_KEYS = ("auto_map", "_name_or_path", "transformers_version", "quantization_config", "torch_dtype", "dtype",
             "model_type")
AUX_ATTRS = ("_sliding_window_tensor", "cumulative_length", "indexer_cumulative_length")
INDEXER_ATTRS = ("indexer_keys",)  # DynamicIndexedLayer's DSA indexer key cache (a group of its own in the plan)

SCALED_HIDDEN = 64
SCALED_FFN = 32
SCALED_VOCAB = 128
SCALED_EXPERTS = 4
SCALED_TOPK = 2
HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model")
FFN_KEYS = ("intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size", "ffn_dim", "d_ff",
            "n_inner", "intermediate_size_mlp", "decoder_ffn_dim", "encoder_ffn_dim", "ffn_hidden_size")
EXPERT_KEYS = ("num_local_experts", "num_experts", "n_routed_experts", "moe_num_experts")
TOPK_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk")


def require_transformers() -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    try:
        import transformers
    except ImportError:
        raise EnvironmentProblem(TRANSFORMERS_MISSING) from None
    return transformers


@contextlib.contextmanager
def _quiet():
    import logging
    import warnings

    from transformers.utils import logging as hf_logging

    old = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            yield
        finally:
            hf_logging.set_verbosity(old)
            logging.disable(logging.NOTSET)


# ---------------------------------------------------------------------------------------------- build
def hf_config(raw: dict[str, Any], *, experts_implementation: str | None = None) -> Any:
    """A raw config.json dict -> transformers' native config object; one clear line when it has none."""
    transformers = require_transformers()
    d = copy.deepcopy(raw)
    mt = MODEL_TYPE_ALIASES.get(d.get("model_type"), d.get("model_type"))
    arch = (d.get("architectures") or [None])[0]
    if not mt:
        raise InputError("--with-model: the config has no model_type, so transformers cannot build it")
    for k in DROP_KEYS:
        d.pop(k, None)
    kwargs = {"experts_implementation": experts_implementation} if experts_implementation else {}
    if arch in TEXT_ONLY_ARCHS:
        d.pop("architectures", None)
        tie = {"tie_word_embeddings": d["tie_word_embeddings"]} if "tie_word_embeddings" in d else {}
        d = {"text_config": d, "vision_config": dict(TOKEN_TOWER), **tie}
    try:
        with _quiet():
            return transformers.AutoConfig.for_model(mt, **d, **kwargs)
    except Exception as e:  # unknown model_type (ValueError/KeyError) or a config validator's refusal
        from transformers.models.auto.configuration_auto import CONFIG_MAPPING

        if mt not in CONFIG_MAPPING:
            remote = " (the family exists only as remote code on the Hub, which kvplan never runs)" \
                if raw.get("auto_map") else ""
            raise EnvironmentProblem(
                f"--with-model: transformers {transformers.__version__} cannot build model_type {mt!r}"
                f"{' (' + arch + ')' if arch else ''}{remote}; verify it without --with-model") from None
        reason = " ".join(str(e).split())
        raise EnvironmentProblem(f"--with-model: transformers {transformers.__version__} rejects this config: "
                                 f"{reason[:300]}") from None


def model_class(raw: dict[str, Any]) -> Any:
    transformers = require_transformers()
    arch = (raw.get("architectures") or [None])[0]
    if not arch:
        raise InputError("--with-model: the config names no architectures[0] class to build")
    cls = getattr(transformers, TEXT_ONLY_ARCHS.get(arch) or ARCH_ALIASES.get(arch, arch), None)
    if cls is None:
        remote = " (the family exists only as remote code on the Hub, which kvplan never runs)" \
            if raw.get("auto_map") else ""
        raise EnvironmentProblem(f"--with-model: transformers {transformers.__version__} has no class {arch!r}"
                                 f"{remote}; verify it without --with-model")
    return cls


def build_model(raw: dict[str, Any], dtype: Any, device: str, *, experts_implementation: str | None) -> Any:
    import torch

    cfg = hf_config(raw, experts_implementation=experts_implementation)
    cls = model_class(raw)
    try:
        with _quiet(), torch.device(device):
            model = cls._from_config(cfg, dtype=dtype)
    except Exception as e:  # a class that cannot be built from this config: one line
        raise EnvironmentProblem(f"--with-model: transformers cannot build {cls.__name__} from this config "
                                 f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    model.eval()
    return model


# ---------------------------------------------------------------------------------------------- cache walk
def _collect(obj: Any, prefix: str, out: list, seen: set, depth: int = 0) -> None:
    import torch

    if depth > 6:
        return
    if isinstance(obj, torch.Tensor):
        if id(obj) not in seen:
            seen.add(id(obj))
            out.append((prefix, obj))
        return
    if isinstance(obj, dict):
        for k, v in obj.items():
            _collect(v, f"{prefix}[{k}]", out, seen, depth + 1)
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _collect(v, f"{prefix}[{i}]", out, seen, depth + 1)
        return
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        if depth == 0 or (type(obj).__module__ or "").startswith("transformers"):
            for k, v in vars(obj).items():
                _collect(v, f"{prefix}.{k}" if prefix else k, out, seen, depth + 1)


def _is_aux(name: str, t: Any) -> bool:
    """0-d bookkeeping (window sizes, length counters) is not cache state."""
    return name.split(".")[-1].split("[")[0] in AUX_ATTRS or t.dim() == 0


@dataclass
class LayerCacheBytes:
    index: int
    cls: str
    cross: bool
    tensors: list[tuple[str, tuple[int, ...], str, int]]  # name, shape, dtype, bytes (numel x element size)
    storage_bytes: int

    @property
    def bytes(self) -> int:
        return sum(t[3] for t in self.tensors)


def cache_layers(cache: Any) -> tuple[list[LayerCacheBytes], int]:
    """Every layer of a transformers Cache (self, then cross for EncoderDecoderCache) and the bytes of tensors
    held outside the layers."""
    from transformers.cache_utils import Cache, EncoderDecoderCache

    seen: set[int] = set()
    storages: set[int] = set()

    def one(c: Any, cross: bool) -> tuple[list[LayerCacheBytes], int]:
        if not isinstance(c, Cache):
            raise EnvironmentProblem(f"--with-model: the model returned {type(c).__name__}, not a transformers Cache")
        layers = []
        for i, layer in enumerate(c.layers):
            found: list = []
            _collect(layer, "", found, seen)
            rows, st = [], 0
            for name, t in found:
                if _is_aux(name, t):
                    continue
                rows.append((name, tuple(int(s) for s in t.shape), str(t.dtype).replace("torch.", ""),
                             int(t.numel() * t.element_size())))
                if t.device.type != "meta":
                    s = t.untyped_storage()
                    if s.data_ptr() not in storages:
                        storages.add(s.data_ptr())
                        st += s.nbytes()
            layers.append(LayerCacheBytes(i, type(layer).__name__, cross, rows, st))
        extra: list = []
        for k, v in vars(c).items():
            if k != "layers":
                _collect(v, k, extra, seen, 1)
        return layers, sum(int(t.numel() * t.element_size()) for n, t in extra if not _is_aux(n, t))

    if isinstance(cache, EncoderDecoderCache):
        a, ea = one(cache.self_attention_cache, False)
        b, eb = one(cache.cross_attention_cache, True)
        return a + b, ea + eb
    return one(cache, False)


def _inputs(model: Any, batch: int, ctx: int, encoder_len: int | None, device: str) -> dict[str, Any]:
    import torch

    cfg = model.config
    vocab = cfg.get_text_config(decoder=True).vocab_size

    def ids(n: int) -> Any:
        if device == "meta":
            return torch.zeros((batch, n), dtype=torch.long, device="meta")
        g = torch.Generator().manual_seed(0)
        return torch.randint(0, min(vocab, 1000), (batch, n), generator=g).to(device)

    if cfg.model_type == "mllama":
        return _mllama_inputs(cfg, ids(ctx), batch, ctx, encoder_len, model.dtype, device)
    if not getattr(cfg, "is_encoder_decoder", False):
        return {"input_ids": ids(ctx)}
    if cfg.model_type == "whisper":
        feats = torch.zeros((batch, cfg.num_mel_bins, 2 * cfg.max_source_positions), dtype=model.dtype, device=device)
        return {"input_features": feats, "decoder_input_ids": ids(ctx)}
    return {"input_ids": ids(encoder_len or getattr(cfg, "n_positions", None) or 512), "decoder_input_ids": ids(ctx)}


def _mllama_inputs(cfg: Any, ids: Any, batch: int, ctx: int, encoder_len: int | None, dtype: Any, device: str
                   ) -> dict[str, Any]:
    """Llama-3.2-Vision: its cross-attention layers cache only when images are given, so the forward gets as many
    images of max_num_tiles (unmasked) tiles as the planned vision positions hold (encoder_len / (tiles x
    ((image_size // patch_size)^2 + 1)), at least one), each visible to every text token."""
    import torch

    v = cfg.vision_config
    tiles, size = v.max_num_tiles, v.image_size
    per_image = tiles * ((size // v.patch_size) ** 2 + 1)
    images = max(1, (encoder_len or per_image) // per_image)
    return {
        "input_ids": ids,
        "pixel_values": torch.zeros((batch, images, tiles, v.num_channels, size, size), dtype=dtype, device=device),
        "aspect_ratio_ids": torch.ones((batch, images), dtype=torch.long, device=device),
        "aspect_ratio_mask": torch.ones((batch, images, tiles), dtype=torch.long, device=device),
        "cross_attention_mask": torch.ones((batch, ctx, images, tiles), dtype=torch.long, device=device),
    }


def _text_forward(model: Any, inputs: dict[str, Any]) -> Any:
    """One forward with use_cache=True. transformers 5.19-5.24's Llama4ForConditionalGeneration raises
    AttributeError ('image_outputs') after its text model ran on a text-only input; then its own language model,
    the code the wrapper delegates to, is called with the same input_ids."""
    try:
        return model(**inputs, use_cache=True, return_dict=True)
    except RuntimeError as e:
        # transformers 5.24's Gemma4Model builds its attention masks before its language model creates the
        # cache; with no cache the mask code looks for packed sequences (Tensor.item()), which a meta tensor
        # cannot answer. Handing it the DynamicCache it would have built itself changes nothing else.
        if "meta tensors" not in str(e) or set(inputs) != {"input_ids"}:
            raise
        import inspect

        from transformers import DynamicCache

        name = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"
        return model(**inputs, **{name: DynamicCache(config=model.config)}, use_cache=True, return_dict=True)
    except AttributeError:
        lm = getattr(model, "language_model", None)
        if lm is None or set(inputs) != {"input_ids"}:
            raise
        return lm(**inputs, use_cache=True, return_dict=True)


def run_forward(raw: dict[str, Any], dtype: Any, batch: int, ctx: int, encoder_len: int | None, device: str
                ) -> tuple[list[LayerCacheBytes], int, str]:
    import torch

    if device == "meta" and raw.get("model_type") in META_DENSE_MLP:
        raw = copy.deepcopy(raw)
        text = raw["text_config"] if isinstance(raw.get("text_config"), dict) else raw
        text.pop("moe_layers_enum", None)
        text["mlp_layer_types"] = ["dense"] * hf_config(raw).get_text_config(decoder=True).num_hidden_layers
    model = build_model(raw, dtype, device, experts_implementation="batched_mm" if device == "meta" else None)
    try:
        inputs = _inputs(model, batch, ctx, encoder_len, device)
        with _quiet(), torch.no_grad():
            out = _text_forward(model, inputs)
    except EnvironmentProblem:
        raise
    except Exception as e:
        raise EnvironmentProblem(f"--with-model: the {type(model).__name__} forward on {device} failed "
                                 f"({type(e).__name__}: {str(e).splitlines()[0][:200]})") from None
    cache = getattr(out, "past_key_values", None)
    if cache is None:
        cache = getattr(out, "cache_params", None)
    if cache is None:
        raise EnvironmentProblem(f"--with-model: {type(model).__name__} returned no cache")
    layers, extra = cache_layers(cache)
    name = type(model).__name__
    del out, cache, model
    return layers, extra, name


# ---------------------------------------------------------------------------------------------- scaling
def _clamp_ids(d: dict[str, Any], vocab: int) -> None:
    for k, v in list(d.items()):
        if not k.endswith("token_id") and not k.endswith("token_ids"):
            continue
        if isinstance(v, int) and v >= vocab:
            d[k] = vocab - 1
        elif isinstance(v, list):
            d[k] = [min(x, vocab - 1) if isinstance(x, int) else x for x in v]


def _effective_head_dim(cfg: Any) -> int | None:
    head_dim = getattr(cfg, "head_dim", None)
    if isinstance(head_dim, int) and head_dim > 0:
        return head_dim
    hidden = next((getattr(cfg, k) for k in HIDDEN_KEYS if isinstance(getattr(cfg, k, None), int)), None)
    heads = getattr(cfg, "num_attention_heads", None)
    return hidden // heads if isinstance(hidden, int) and isinstance(heads, int) and heads else None


def scaled_hidden(d: dict[str, Any]) -> int:
    """A small width the family's validators accept: a multiple of the attention heads (and so of KV heads)."""
    heads = d.get("num_attention_heads") or d.get("n_head") or d.get("num_heads") or d.get("n_heads")
    if isinstance(heads, int) and heads > 0:
        return heads * max(1, -(-SCALED_HIDDEN // heads // 2))
    return SCALED_HIDDEN


def _scale_text(d: dict[str, Any], full_text_cfg: Any) -> None:
    head_dim = _effective_head_dim(full_text_cfg)
    hidden = scaled_hidden(d)
    for k in HIDDEN_KEYS:
        if isinstance(d.get(k), int):
            d[k] = hidden
    if isinstance(head_dim, int) and head_dim > 0:
        d["head_dim"] = head_dim  # keep the cached head size although hidden_size shrank
    for k in FFN_KEYS:
        if isinstance(d.get(k), int):
            d[k] = SCALED_FFN
    if isinstance(d.get("word_embed_proj_dim"), int):
        d["word_embed_proj_dim"] = hidden
    if isinstance(d.get("q_lora_rank"), int):
        d["q_lora_rank"] = 32
    for k in EXPERT_KEYS:
        if isinstance(d.get(k), int) and d[k] > SCALED_EXPERTS:
            d[k] = SCALED_EXPERTS
    for k in TOPK_KEYS:
        if isinstance(d.get(k), int) and d[k] > SCALED_TOPK:
            d[k] = SCALED_TOPK
    for k in ("n_group", "topk_group"):
        if isinstance(d.get(k), int):
            d[k] = 1
    for k in ("vocab_size", "padded_vocab_size"):
        if isinstance(d.get(k), int):
            d[k] = SCALED_VOCAB
    _clamp_ids(d, SCALED_VOCAB)


def _scale_vision(d: dict[str, Any], text_hidden: int) -> None:
    heads = d.get("num_attention_heads") or d.get("num_heads") or 1
    for k in ("hidden_size", "embed_dim"):
        if isinstance(d.get(k), int):
            d[k] = 16 * int(heads)
    for k in ("intermediate_size",):
        if isinstance(d.get(k), int):
            d[k] = SCALED_FFN
    for k in ("num_hidden_layers", "depth"):
        if isinstance(d.get(k), int):
            d[k] = 1
    if isinstance(d.get("out_hidden_size"), int):
        d["out_hidden_size"] = text_hidden
    if "deepstack_visual_indexes" in d:
        d["deepstack_visual_indexes"] = []
    for k in ("projector_input_dim", "projector_output_dim", "vision_output_dim"):
        if isinstance(d.get(k), int):
            d[k] = text_hidden


def scaled_config(raw: dict[str, Any]) -> dict[str, Any]:
    """A copy of the config with tiny widths and the same cache geometry (where the family allows)."""
    full = hf_config(raw)
    d = copy.deepcopy(raw)
    if isinstance(d.get("text_config"), dict):
        _scale_text(d["text_config"], full.get_text_config(decoder=True))
        text_hidden = next((d["text_config"][k] for k in HIDDEN_KEYS if k in d["text_config"]), SCALED_HIDDEN)
        _clamp_ids(d, SCALED_VOCAB)
        for k in ("image_token_id", "image_token_index", "video_token_id", "boi_token_index", "eoi_token_index",
                  "vision_start_token_id", "vision_end_token_id"):
            if isinstance(d.get(k), int):
                d[k] = SCALED_VOCAB - 1
    else:
        _scale_text(d, full.get_text_config(decoder=True))
        text_hidden = next((d[k] for k in HIDDEN_KEYS if k in d), SCALED_HIDDEN)
    if isinstance(d.get("vision_config"), dict):
        _scale_vision(d["vision_config"], text_hidden)
    return d


# ---------------------------------------------------------------------------------------------- comparison
@dataclass
class GroupCompare:
    kind: str
    layers: int
    predicted_bytes: int
    measured_bytes: int
    predicted_shapes: dict[str, int]
    measured_shapes: dict[str, int]

    @property
    def passed(self) -> bool:
        return self.predicted_bytes == self.measured_bytes

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "layers": self.layers, "predicted_bytes": self.predicted_bytes,
                "measured_bytes": self.measured_bytes, "passed": self.passed,
                "predicted_tensors": self.predicted_shapes, "measured_tensors": self.measured_shapes}


@dataclass
class ModelRun:
    device: str
    model_class: str
    measured_bytes: int
    groups: list[GroupCompare]
    unassigned_bytes: int
    extra_bytes: int
    storage_bytes: int | None = None
    status: str = "ran"  # ran | skipped
    reason: str | None = None
    config_scaled: bool = False

    @property
    def passed(self) -> bool:
        if self.status != "ran":
            return True
        return all(g.passed for g in self.groups) and self.unassigned_bytes == 0 and self.extra_bytes == 0

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "status": self.status, "reason": self.reason, "model_class": self.model_class,
                "config_scaled": self.config_scaled, "measured_bytes": self.measured_bytes,
                "unassigned_bytes": self.unassigned_bytes, "extra_bytes": self.extra_bytes,
                "storage_bytes": self.storage_bytes, "groups": [g.to_json() for g in self.groups],
                "passed": self.passed}


@dataclass
class ModelCheck:
    transformers_version: str
    engine: str
    predicted_bytes: int
    runs: list[ModelRun] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def measured_bytes(self) -> int | None:
        return self.runs[0].measured_bytes if self.runs else None

    @property
    def passed(self) -> bool:
        return all(r.passed for r in self.runs)

    def to_json(self) -> dict[str, Any]:
        return {"transformers": self.transformers_version, "engine": self.engine,
                "predicted_bytes": self.predicted_bytes, "measured_bytes": self.measured_bytes,
                "runs": [r.to_json() for r in self.runs], "notes": self.notes, "passed": self.passed}


def _shape_key(shape: tuple[int, ...], dtype: str) -> str:
    return f"{dtype}[{','.join(str(s) for s in shape)}]"


def compare(plan: Any, layers: list[LayerCacheBytes], extra: int, device: str, cls: str) -> ModelRun:
    groups: list[GroupCompare] = []
    claimed: set[tuple[bool, int, str]] = set()
    separate_cross = any(lc.cross for lc in layers)  # EncoderDecoderCache; Mllama keeps cross layers in its one cache
    # a layer in several groups: a tensor a group names exactly is that group's (DeepSeek-V4's keys, compressed_kv[...],
    # buffer_*[...], overlap_*[...]; MiniMax-M3's idx_keys); else a DSA layer's indexer keys belong to the indexer
    # group and the rest to the latent's
    named: dict[tuple[bool, int], set[str]] = {}
    for g in plan.groups:
        for i in g.layer_ids:
            named.setdefault((g.kind == "cross", i), set()).update(t.name for t in g.tensors)

    def claims(g: Any, index: int, name: str) -> bool:
        if name in named.get((g.kind == "cross", index), ()):
            return any(t.name == name for t in g.tensors)
        return (name in INDEXER_ATTRS) == (g.kind == "indexer")

    for g in plan.groups:
        cross = g.kind == "cross" and separate_cross
        ids = set(g.layer_ids)
        mine = [(lc.index, t) for lc in layers if lc.cross == cross and lc.index in ids for t in lc.tensors
                if claims(g, lc.index, t[0])]
        claimed.update((cross, i, t[0]) for i, t in mine)
        pshapes: dict[str, int] = {}
        for t in g.tensors:
            key = _shape_key(t.shape, t.dtype)
            pshapes[key] = pshapes.get(key, 0) + t.count
        mshapes: dict[str, int] = {}
        for _, (_, shape, dtype, _) in mine:
            key = _shape_key(shape, dtype)
            mshapes[key] = mshapes.get(key, 0) + 1
        groups.append(GroupCompare(g.kind, len(g.layer_ids), g.bytes, sum(t[3] for _, t in mine), pshapes, mshapes))
    unassigned = sum(t[3] for lc in layers for t in lc.tensors if (lc.cross, lc.index, t[0]) not in claimed)
    total = sum(lc.bytes for lc in layers) + extra
    storage = None if device == "meta" else sum(lc.storage_bytes for lc in layers)
    return ModelRun(device, cls, total, groups, unassigned, extra, storage)


def _geometry(layers: list[LayerCacheBytes]) -> list[tuple]:
    return [(lc.cross, lc.index, tuple((s, d) for _, s, d, _ in lc.tensors)) for lc in layers]


def check_model(setup: Any, plan: Any, ctx: int, batch: int, device: str | None) -> ModelCheck:
    """Meta forward of the full config (always) and, with a device, a real forward of a scaled copy."""
    transformers = require_transformers()
    import torch

    raw = setup.resolved.config
    kd, vd = setup.kvd.k, setup.kvd.v
    if kd != vd or kd.torch_name not in ("float16", "bfloat16", "float32"):
        raise InputError("--with-model runs the model in one float dtype: use --kv-dtype fp16, bf16 or fp32")
    dtype = getattr(torch, kd.torch_name)
    cross = [g for g in plan.groups if g.kind == "cross"]
    enc_len = cross[0].tokens if cross else None
    mc = ModelCheck(transformers.__version__, plan.engine, plan.kv_bytes)
    model_class(raw)  # a clear line before any work for families transformers lacks
    layers, extra, cls = run_forward(raw, dtype, batch, ctx, enc_len, "meta")
    meta = compare(plan, layers, extra, "meta", cls)
    mc.runs.append(meta)
    if device is None or device == "meta":
        return mc
    scaled = scaled_config(raw)
    try:
        s_layers, s_extra, _ = run_forward(scaled, dtype, batch, ctx, enc_len, "meta")
    except EnvironmentProblem as e:
        mc.runs.append(ModelRun(device, cls, 0, [], 0, 0, status="skipped", config_scaled=True,
                                reason=f"the scaled config does not build: {e}"))
        return mc
    if _geometry(s_layers) != _geometry(layers):
        mc.runs.append(ModelRun(device, cls, 0, [], 0, 0, status="skipped", config_scaled=True, reason=(
            f"{raw.get('model_type')}: the cache shapes follow the hidden size in this family (head_dim or state "
            "width is not configurable), so a scaled copy would cache different shapes; the meta check above "
            "uses the full config")))
        return mc
    try:
        r_layers, r_extra, r_cls = run_forward(scaled, dtype, batch, ctx, enc_len, device)
    except EnvironmentProblem as e:
        mc.runs.append(ModelRun(device, cls, 0, [], 0, 0, status="skipped", config_scaled=True, reason=str(e)))
        return mc
    run = compare(plan, r_layers, r_extra, device, r_cls)
    run.config_scaled = True
    mc.runs.append(run)
    mc.notes.append(f"the {device} forward ran a scaled copy (hidden = a multiple of the heads near {SCALED_HIDDEN}, FFN {SCALED_FFN}, vocab "
                    f"{SCALED_VOCAB}, at most {SCALED_EXPERTS} experts) with the same cache shapes as the full "
                    "config on meta")
    return mc
