"""Independent oracle: exact parameter counts and KV-cache bytes from the real
`transformers` model code (test-only; never imported by kvplan itself).

Everything is built on the ``meta`` device: no weights are allocated, and a
forward pass on meta tensors runs the real attention / cache code with shapes
only.  The cache object returned by the forward is then walked and every tensor
it holds is summed (numel * element_size).

Pinned to transformers 5.23 (see docs/research/ORACLE_NOTES.md for findings).

Public API
----------
hf_param_counts(config: dict) -> dict
hf_cache_bytes(config: dict, batch, ctx, dtype="float16", encoder_len=None) -> dict
SKIP_REMOTE_CODE: dict[dirname, reason]
buildable(dirname) -> bool
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

CONFIG_ROOT = Path(__file__).resolve().parent.parent / "model_configs"

SKIP_REMOTE_CODE = {
    "THUDM--chatglm3-6b": (
        "model_type 'chatglm' / ChatGLMModel exists only as trust_remote_code Hub code "
        "(auto_map -> configuration_chatglm/modeling_chatglm); transformers has no native class "
        "(its native GLM family, 'glm', uses a different config/weight layout)."
    ),
    "Qwen--Qwen-7B": (
        "model_type 'qwen' / QWenLMHeadModel exists only as trust_remote_code Hub code "
        "(auto_map -> configuration_qwen/modeling_qwen); transformers only ships qwen2+."
    ),
}

# Legacy / remote-code names that have a native transformers equivalent.
MODEL_TYPE_ALIASES = {
    "RefinedWebModel": "falcon",
    "RefinedWeb": "falcon",
}
ARCH_ALIASES = {
    "RWForCausalLM": "FalconForCausalLM",
    "MPTForCausalLM": "MptForCausalLM",
}
# Text-only files of a model transformers ships only inside its multimodal wrapper (aiconfigurator's curated
# Step-3.7-Flash names Step3p7FlashForCausalLM, a class no engine has): the file's fields become the wrapper's
# text_config and the tower is dropped after the build, so the count is the language model and its head.
TEXT_ONLY_ARCHS = {"Step3p7FlashForCausalLM": ("Step3p7ForConditionalGeneration",
                                               ("model.vision_model", "model.multi_modal_projector"))}
_TOKEN_TOWER = {"hidden_size": 16, "num_hidden_layers": 1, "num_attention_heads": 1, "image_size": 28, "patch_size": 14}
# Routed experts with no data-independent path in transformers 5.24 (Step3p7Experts loops over the experts the
# router hit: torch.nonzero on meta, and it ignores experts_implementation): on meta those layers are built as the
# model's dense MLP. Only attention writes the cache; real-device forwards keep the MoE layers (tests/test_step3p7.py).
META_DENSE_MLP = ("step3p7",)


def meta_dense_mlp(config: dict) -> dict:
    """The config with every MLP dense where META_DENSE_MLP applies (the cache is unchanged), else as given."""
    if config.get("model_type") not in META_DENSE_MLP:
        return config
    d = copy.deepcopy(config)
    text = d["text_config"] if isinstance(d.get("text_config"), dict) else d
    text.pop("moe_layers_enum", None)
    text["mlp_layer_types"] = ["dense"] * make_hf_config(config).get_text_config(decoder=True).num_hidden_layers
    return d

# Keys that must not reach the native config class.
_DROP_KEYS = ("auto_map", "_name_or_path", "transformers_version", "quantization_config")


def buildable(dirname: str) -> bool:
    """True when `dirname` (a model_configs/ folder name) can be built with native transformers."""
    return dirname not in SKIP_REMOTE_CODE and (CONFIG_ROOT / dirname / "config.json").is_file()


def load_config(dirname: str) -> dict:
    with open(CONFIG_ROOT / dirname / "config.json") as f:
        return json.load(f)


# --------------------------------------------------------------------------- build


def _torch_dtype(dtype):
    import torch

    if isinstance(dtype, torch.dtype):
        return dtype
    return {"float16": torch.float16, "fp16": torch.float16, "bfloat16": torch.bfloat16,
            "bf16": torch.bfloat16, "float32": torch.float32, "fp32": torch.float32}[str(dtype)]


def make_hf_config(config: dict, *, experts_implementation: str | None = None,
                   attn_implementation: str | None = None):
    """Raw config.json dict -> native transformers PreTrainedConfig."""
    from transformers import AutoConfig

    d = copy.deepcopy(config)
    mt = d.get("model_type")
    mt = MODEL_TYPE_ALIASES.get(mt, mt)
    if mt is None:
        raise ValueError("config has no model_type")
    d.pop("model_type", None)
    for k in _DROP_KEYS:
        d.pop(k, None)
    # quantization_config is dropped: we want the unquantized (logical) parameters / cache.
    # torch_dtype/dtype from the file are irrelevant: the dtype is passed explicitly.
    d.pop("torch_dtype", None)
    d.pop("dtype", None)
    kwargs = {}
    if experts_implementation is not None:
        kwargs["experts_implementation"] = experts_implementation
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    if (config.get("architectures") or [None])[0] in TEXT_ONLY_ARCHS:
        d.pop("architectures", None)
        tie = {"tie_word_embeddings": d["tie_word_embeddings"]} if "tie_word_embeddings" in d else {}
        d = {"text_config": d, "vision_config": dict(_TOKEN_TOWER), **tie}
    cfg = AutoConfig.for_model(mt, **d, **kwargs)
    return cfg


def model_class(config: dict):
    import transformers

    arch = config["architectures"][0]
    arch = TEXT_ONLY_ARCHS[arch][0] if arch in TEXT_ONLY_ARCHS else ARCH_ALIASES.get(arch, arch)
    cls = getattr(transformers, arch, None)
    if cls is None:
        raise ValueError(f"transformers has no class {arch!r}")
    return cls


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


def build_meta_model(config: dict, dtype="float16", *, experts_implementation=None,
                     attn_implementation=None, device="meta"):
    """Instantiate the native class on the meta device (no memory).

    `device="cpu"` builds a real randomly-initialised model instead (used only by the
    meta-vs-real validation in dev/oracle_dump.py --validate-real)."""
    import torch

    cfg = make_hf_config(config, experts_implementation=experts_implementation,
                         attn_implementation=attn_implementation)
    cls = model_class(config)
    td = _torch_dtype(dtype)
    with _quiet(), torch.device(device):
        model = cls._from_config(cfg, dtype=td)
    for path in TEXT_ONLY_ARCHS.get(config["architectures"][0], ("", ()))[1]:
        parent, name = path.rsplit(".", 1)
        setattr(model.get_submodule(parent), name, None)
    model.eval()
    return model


# --------------------------------------------------------------------------- params


_VISION_KEYS = ("vision", "visual", "multi_modal_projector", "mm_projector", "image_newline")


def _is_vision_name(name: str) -> bool:
    return any(k in part for part in name.split(".") for k in _VISION_KEYS)


def hf_param_counts(config: dict, dtype="float16") -> dict:
    """Exact parameter counts from the real transformers class built on meta.

    `params` = sum(p.numel() for p in model.parameters()) which yields shared (tied)
    Parameters only once.  Buffers are not included (reported separately as `buffers`).
    """
    model = build_meta_model(config, dtype)
    cfg = model.config
    is_ed = _is_encoder_decoder(cfg)
    seen = set()
    total = 0
    by_prefix: dict[str, int] = {}
    vision = encoder = mtp = 0
    names_by_id: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names_by_id.setdefault(id(p), []).append(name)
    for name, p in model.named_parameters():  # remove_duplicate=True: first name of each tensor
        n = p.numel()
        total += n
        parts = name.split(".")
        for depth in (1, 2):
            if len(parts) > depth:
                key = ".".join(parts[:depth])
                by_prefix[key] = by_prefix.get(key, 0) + n
        if _is_vision_name(name):
            vision += n
        if is_ed and (".encoder." in f".{name}" or name.startswith("encoder.")):
            encoder += n
        if "mtp" in name or "nextn" in name:
            mtp += n
        seen.add(id(p))
    shared = {names[0]: names[1:] for names in names_by_id.values() if len(names) > 1}
    tie_flag = None
    try:
        tie_flag = bool(cfg.get_text_config(decoder=True).tie_word_embeddings)
    except Exception:
        tie_flag = bool(getattr(cfg, "tie_word_embeddings", False))
    # "tied": does the output embedding actually share storage with the input embedding?
    tied = False
    try:
        oe = model.get_output_embeddings()
        ie = model.get_input_embeddings()
        tied = oe is not None and ie is not None and oe.weight is ie.weight
    except Exception:
        pass
    buffers = sum(b.numel() for _, b in model.named_buffers())
    # persistent buffers are saved with the weights (state_dict), e.g. the routers' e_score_correction_bias
    persistent = sum(b.numel() for mod in model.modules() for n, b in mod._buffers.items()
                     if b is not None and n not in mod._non_persistent_buffers_set)
    mtp_built_in_class = mtp > 0
    mtp_cfg_layers = getattr(cfg.get_text_config(decoder=True), "num_mtp_layers", None)
    mtp_extra = mtp_error = None
    if mtp_cfg_layers:
        try:
            mtp_extra = _mtp_param_count(model, mtp_cfg_layers, seen)
        except ValueError as e:  # Step-3.7 with 45 layer_types and no MTP entries: get_mtp_config calls it ambiguous
            mtp_error = str(e)
    out = {
        "params": total,
        "by_prefix": dict(sorted(by_prefix.items())),
        "class": type(model).__name__,
        "tied": tied,
        "tie_word_embeddings_cfg": tie_flag,
        "shared_params": shared,
        "buffers_numel": buffers,
        "persistent_buffers_numel": persistent,
        "vision_params": vision,
        "encoder_params": encoder,
        # MTP: transformers 5.23 never builds MTP layers inside *ForCausalLM; they live in a
        # separate transformers.modeling_layers.MtpModel created by generate(use_mtp=True).
        # mtp_params = params of that MtpModel that are NOT shared with the main model.
        "mtp_params": mtp if mtp_built_in_class else (mtp_extra or 0),
        "mtp_in_main_class": mtp_built_in_class,
        "num_mtp_layers_cfg": mtp_cfg_layers,
        "mtp_error": mtp_error,
    }
    del model
    return out


def _mtp_param_count(model, num_mtp_layers, main_ids):
    """Params of transformers' separate MtpModel (built on meta) not shared with `model`."""
    import torch
    from transformers.modeling_layers import MtpModel

    with _quiet(), torch.device("meta"):
        mtp = MtpModel(model, num_mtp_layers)
    n = sum(p.numel() for p in mtp.parameters() if id(p) not in main_ids)
    del mtp
    return n


# --------------------------------------------------------------------------- cache


def _collect_tensors(obj, prefix, out, seen, depth=0):
    """Walk every attribute / dict / list of a cache layer and record each tensor once."""
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
            _collect_tensors(v, f"{prefix}[{k}]", out, seen, depth + 1)
        return
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _collect_tensors(v, f"{prefix}[{i}]", out, seen, depth + 1)
        return
    if hasattr(obj, "__dict__") and not isinstance(obj, type):
        # only walk plain python objects that belong to cache machinery
        mod = type(obj).__module__ or ""
        if depth == 0 or mod.startswith("transformers"):
            for k, v in vars(obj).items():
                _collect_tensors(v, f"{prefix}.{k}" if prefix else k, out, seen, depth + 1)


# 0-d / tiny bookkeeping tensors (sliding-window size, cumulative length counters) are not
# cache *state*; they are reported as aux_bytes and excluded from `total`.
_AUX_ATTRS = ("_sliding_window_tensor", "cumulative_length", "indexer_cumulative_length")


def _is_aux(name: str, t) -> bool:
    leaf = name.split(".")[-1].split("[")[0]
    return leaf in _AUX_ATTRS or t.dim() == 0


def _layer_report(layer, index, seen):
    tensors = []
    _collect_tensors(layer, "", tensors, seen)
    rows, aux = [], []
    for name, t in tensors:
        b = t.numel() * t.element_size()
        row = (name, tuple(int(s) for s in t.shape), str(t.dtype).replace("torch.", ""), int(b))
        (aux if _is_aux(name, t) else rows).append(row)
    return {
        "index": index,
        "class": type(layer).__name__,
        "tensors": rows,
        "bytes": sum(r[3] for r in rows),
        "aux": aux,
        "aux_bytes": sum(r[3] for r in aux),
    }


def cache_report(cache) -> dict:
    """Sum every tensor held by a transformers Cache (DynamicCache or EncoderDecoderCache)."""
    from transformers.cache_utils import Cache, EncoderDecoderCache

    seen: set[int] = set()

    def one(c):
        if not isinstance(c, Cache):
            raise TypeError(f"past_key_values is {type(c).__name__}, not a transformers Cache")
        layers = [_layer_report(layer, i, seen) for i, layer in enumerate(c.layers)]
        # tensors attached directly to the Cache object itself (not to a layer)
        extra = []
        for k, v in vars(c).items():
            if k == "layers":
                continue
            _collect_tensors(v, k, extra, seen, depth=1)
        extra_rows = [(n, tuple(t.shape), str(t.dtype), t.numel() * t.element_size()) for n, t in extra]
        return layers, extra_rows

    if isinstance(cache, EncoderDecoderCache):
        self_layers, e1 = one(cache.self_attention_cache)
        cross_layers, e2 = one(cache.cross_attention_cache)
        extra = e1 + e2
        self_b = sum(l["bytes"] for l in self_layers)
        cross_b = sum(l["bytes"] for l in cross_layers)
        for l in cross_layers:
            l["cross"] = True
    else:
        self_layers, extra = one(cache)
        cross_layers = []
        self_b = sum(l["bytes"] for l in self_layers)
        cross_b = 0
    extra_b = sum(r[3] for r in extra)
    return {
        "cache_class": type(cache).__name__,
        "total": self_b + cross_b + extra_b,
        "self_bytes": self_b,
        "cross_bytes": cross_b,
        "extra_bytes": extra_b,
        "extra_tensors": extra,
        "aux_bytes": sum(l["aux_bytes"] for l in self_layers + cross_layers),
        "layers": self_layers,
        "cross_layers": cross_layers,
    }


def _is_encoder_decoder(cfg) -> bool:
    return bool(getattr(cfg, "is_encoder_decoder", False))


def _model_inputs(model, batch, ctx, encoder_len, device="meta"):
    import torch

    cfg = model.config

    def tokens(n):
        if device == "meta":
            return torch.zeros((batch, n), dtype=torch.long, device="meta")
        g = torch.Generator().manual_seed(0)
        vocab = cfg.get_text_config(decoder=True).vocab_size
        return torch.randint(0, min(vocab, 1000), (batch, n), generator=g)

    ids = tokens(ctx)
    if not _is_encoder_decoder(cfg):
        return {"input_ids": ids}, None
    mt = cfg.model_type
    if mt == "whisper":
        frames = 2 * cfg.max_source_positions
        feats = torch.zeros((batch, cfg.num_mel_bins, frames), dtype=model.dtype, device=device)
        return {"input_features": feats, "decoder_input_ids": ids}, cfg.max_source_positions
    enc_len = encoder_len if encoder_len is not None else getattr(cfg, "n_positions", None) or 512
    enc_ids = tokens(enc_len)
    return {"input_ids": enc_ids, "decoder_input_ids": ids}, enc_len


def text_forward(model, inputs: dict):
    """One forward with use_cache=True. transformers 5.19-5.24's multimodal wrappers (Llama4ForConditionalGeneration)
    raise AttributeError ('image_outputs') on a text-only forward after the text model has run; then the wrapper's
    own language model is called with the same input_ids, which is the code path the wrapper delegates to."""
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


def hf_cache_bytes(config: dict, batch: int, ctx: int, dtype="float16", encoder_len=None,
                   *, device="meta", experts_implementation="batched_mm") -> dict:
    """Build the FULL model on meta in `dtype`, run one forward of [batch, ctx] with
    use_cache=True, and sum every tensor held by the returned cache object."""
    import time

    import torch

    t0 = time.perf_counter()
    # MoE experts: the default "eager" path loops over experts hit (torch.where/nonzero on the
    # routing mask -> data dependent, impossible on meta).  "batched_mm" is transformers' own
    # data-independent experts implementation (gather weights by expert id + bmm).  Selecting
    # it via config does not touch attention / cache code.
    dense = meta_dense_mlp(config) if device == "meta" else config
    model = build_meta_model(dense, dtype, experts_implementation=experts_implementation, device=device)
    t1 = time.perf_counter()
    inputs, enc_len = _model_inputs(model, batch, ctx, encoder_len, device)
    with _quiet(), torch.no_grad():
        out = text_forward(model, inputs)
    t2 = time.perf_counter()
    cache = getattr(out, "past_key_values", None)
    if cache is None:  # Mamba-style outputs
        cache = getattr(out, "cache_params", None)
    rep = cache_report(cache)
    rep.update({
        "batch": batch, "ctx": ctx, "dtype": str(dtype), "encoder_len": enc_len,
        "class": type(model).__name__,
        # No module was monkeypatched: every bundled config runs unmodified on meta
        # (MoE via the config switch experts_implementation="batched_mm" only).
        "patches": [],
        "meta_dense_mlp": dense is not config,
        "experts_implementation": experts_implementation,
        "seconds": {"build": round(t1 - t0, 3), "forward": round(t2 - t1, 3)},
    })
    del out, cache, model
    return rep


# --------------------------------------------------------------------------- context limits


def max_forward_positions(config: dict) -> int | None:
    """Longest decoder sequence a real (non-meta) forward accepts, or None if unbounded.

    On meta an out-of-range nn.Embedding lookup does NOT raise, so this is derived from the
    model structure instead: learned absolute position tables of the decoder (gpt2 wpe,
    OPT embed_positions minus its offset 2, Whisper decoder embed_positions), and MPT's ALiBi
    bias, which transformers precomputes for exactly config.max_seq_len key positions
    (MptModel.forward -> build_mpt_alibi_tensor(num_heads, max_seq_len); a longer key
    length fails to broadcast, also on meta).  RoPE / ALiBi(bloom) / relative(T5) models
    have no hard limit in transformers (max_position_embeddings is not enforced).
    """
    import torch

    cfg = make_hf_config(config)
    if cfg.model_type == "mpt":
        return int(cfg.max_seq_len)
    model = build_meta_model(config)
    limits = []
    for name, m in model.named_modules():
        if not isinstance(m, torch.nn.Embedding):
            continue
        leaf = name.split(".")[-1]
        if leaf not in ("wpe", "embed_positions", "position_embeddings"):
            continue
        if "encoder" in name.split(".") or _is_vision_name(name):
            continue
        limits.append(m.num_embeddings - int(getattr(m, "offset", 0) or 0))
    del model
    return min(limits) if limits else None


def default_ctx_long(config: dict, cap: int = 8200) -> int:
    lim = max_forward_positions(config)
    return cap if lim is None else min(cap, lim)


# --------------------------------------------------------------------------- Llama-3.2-Vision (mllama)


def mllama_cache_bytes(config: dict, batch: int, ctx: int, images: int, dtype="float16", device="meta") -> dict:
    """MllamaForConditionalGeneration, one forward of [batch, ctx] text tokens with `images` images per sequence of
    max_num_tiles tiles each (pixel_values [batch, images, tiles, channels, image_size, image_size], every tile
    unmasked), use_cache=True; the bytes of every tensor the returned cache holds. The cross-attention layers cache
    K/V of the projected vision states; the self-attention layers K/V of the text."""
    import torch

    model = build_meta_model(config, dtype, device=device)
    v = model.config.vision_config
    td = _torch_dtype(dtype)
    size, tiles = v.image_size, v.max_num_tiles
    image_token = model.config.image_token_id
    if device == "meta":
        ids = torch.zeros((batch, ctx), dtype=torch.long, device="meta")
    else:
        g = torch.Generator().manual_seed(0)
        ids = torch.randint(0, min(model.config.text_config.vocab_size, 1000), (batch, ctx), generator=g)
        ids[:, :images] = image_token
    inputs = {
        "input_ids": ids,
        "pixel_values": torch.zeros((batch, images, tiles, v.num_channels, size, size), dtype=td, device=device),
        "aspect_ratio_ids": torch.ones((batch, images), dtype=torch.long, device=device),
        "aspect_ratio_mask": torch.ones((batch, images, tiles), dtype=torch.long, device=device),
        "cross_attention_mask": torch.ones((batch, ctx, images, tiles), dtype=torch.long, device=device),
    }
    with _quiet(), torch.no_grad():
        out = model(**inputs, use_cache=True, return_dict=True)
    rep = cache_report(out.past_key_values)
    rep.update({"batch": batch, "ctx": ctx, "images": images, "dtype": str(dtype), "class": type(model).__name__})
    del out, model
    return rep
