"""Gemma 1/2/3/3n/4: explicit head_dim, 4 norms per layer from Gemma-2 on, local/global layer patterns, tied embeddings.

Gemma-3/4 configs (the multimodal text_config especially) omit fields that come from the Gemma3TextConfig /
Gemma4TextConfig class defaults; architectures/defaults.py holds them.
"""

from __future__ import annotations

from kvplan.architectures import base, decoder
from kvplan.architectures.base import AttnDims, Cfg
from kvplan.errors import ConfigError

_QUIRKS = {
    "gemma": decoder.Quirks(mlp_bias=False, tied_default=True, sliding="none"),
    "gemma2": decoder.Quirks(mlp_bias=False, norms_per_layer=4, tied_default=True),
    "gemma3_text": decoder.Quirks(mlp_bias=False, norms_per_layer=4, qk_norm="head_dim", tied_default=True),
}


def _pattern(c: Cfg, model_type: str, n: int) -> list[str]:
    """Gemma-2: layer i is sliding iff (i+1) % 2; Gemma-3: full iff (i+1) % sliding_window_pattern == 0 (default 6)."""
    if model_type == "gemma2":
        period = 2
    else:
        period = int(c.raw.get("sliding_window_pattern") or c.raw.get("_sliding_window_pattern") or 6)
    return ["sliding" if (i + 1) % period else "full" for i in range(n)]


def build(top: Cfg, c: Cfg):
    model_type = str(c.get("model_type", default="gemma"))
    if model_type == "gemma3":
        model_type = "gemma3_text"
    q = _QUIRKS.get(model_type, _QUIRKS["gemma"])
    if model_type != "gemma" and c.raw.get("layer_types") is None:
        kinds = _pattern(c, model_type, c.need_int("num_hidden_layers"))
        c = Cfg({**c.raw, "layer_types": [f"{k}_attention" for k in kinds]}, c.defaults, c.where)
    return decoder.build(top, c, q)


# Gemma-3n, where each rule lives (transformers 5.24 models/gemma3n: configuration_gemma3n.py (cfg), modeling (mod);
# vLLM 0.32 model_executor/models/gemma3n.py (vg3n)):
#   layer kinds: layer_types, else full iff (i+1) % 5 == 0 (cfg Gemma3nTextConfig.__post_init__);
#   KV sharing: the last num_kv_shared_layers layers reuse the last earlier layer of their kind (cfg kv_sharing_modes;
#   a kind with no earlier layer is refused there); they have q_proj, q_norm, o_proj only (mod Gemma3nTextAttention,
#   vg3n Gemma3nAttention); vLLM registers no KV spec for them (kv_sharing_target_layer_name);
#   per-layer input embeddings, AltUp, LAuReL: mod Gemma3nTextModel / Gemma3nTextDecoderLayer; tensor-parallel
#   splits as vLLM builds them: per_layer_input_gate / per_layer_projection / AltUp coefficients ReplicatedLinear,
#   LAuReL column + row, per_layer_model_projection and the AltUp projections ColumnParallelLinear (vg3n).
GEMMA3N_SHARED_DEFAULT = 15  # Gemma3nTextConfig.num_kv_shared_layers


def gemma3n_layer_types(c: Cfg, n: int) -> list[str]:
    kinds = base.kinds_from_layer_types(c, n) or ["full" if (i + 1) % 5 == 0 else "sliding" for i in range(n)]
    bad = sorted({k for k in kinds if k not in ("full", "sliding")})
    if bad:
        raise ConfigError(f"{c.where}: Gemma-3n layers are full or sliding attention; layer_types has {', '.join(bad)}")
    return kinds


def gemma3n_kv_producers(c: Cfg, kinds: list[str]) -> list[int | None]:
    """Gemma3nTextConfig.kv_sharing_modes: the last num_kv_shared_layers layers reuse the K/V of the last earlier
    layer of their kind; None = the layer keeps its own."""
    n = len(kinds)
    shared = int(c.get("num_kv_shared_layers", default=GEMMA3N_SHARED_DEFAULT) or 0)
    if shared > n:
        raise ConfigError(f"{c.where}: num_kv_shared_layers ({shared}) exceeds num_hidden_layers ({n})")
    first = n - shared
    out: list[int | None] = []
    for i, kind in enumerate(kinds):
        earlier = [j for j in range(first) if kinds[j] == kind] if i >= first else []
        if i >= first and not earlier:
            raise ConfigError(f"{c.where}: shared layer {i} ({kind} attention) has no earlier {kind} layer to reuse "
                              f"(num_kv_shared_layers {shared} of {n}; transformers refuses this config)")
        out.append(earlier[-1] if earlier else None)
    return out


def gemma3n(top: Cfg, c: Cfg):
    """Gemma-3n text (Gemma3nTextModel): the last num_kv_shared_layers layers reuse the KV of the last earlier
    layer of their kind and have no k/v projections of their own; per-layer intermediate sizes; AltUp, LAuReL and
    per-layer input embeddings around every layer."""
    from kvplan.spec import SharedKV, WeightPart

    c.need_all("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
    n, h, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    dims = base.attention_dims(c)
    kinds = gemma3n_layer_types(c, n)
    producers = gemma3n_kv_producers(c, kinds)
    window = c.get("sliding_window", default=512)
    caches = [(i, SharedKV(p) if p is not None else base.attention_cache(kind, dims, window))
              for i, (kind, p) in enumerate(zip(kinds, producers))]
    inter = c.get("intermediate_size", default=16384)
    inters = inter if isinstance(inter, list) else [inter] * n
    if len(inters) != n:
        raise ConfigError(f"{c.where}.intermediate_size: {len(inters)} values for {n} layers (transformers wants one "
                          "per layer or one for all)")
    alt, rank = int(c.get("altup_num_inputs", default=4)), int(c.get("laurel_rank", default=64))
    per_layer = int(c.get("hidden_size_per_layer_input", default=256))
    per_vocab = int(c.get("vocab_size_per_layer_input", default=262144))
    weights = [base.embedding(vocab, h)]
    for i in range(n):
        weights += base.linear("self_attn.q_proj", h, dims.heads * dims.head_dim, layer=i)
        weights += base.norm("self_attn.q_norm", dims.head_dim, layer=i)
        if producers[i] is None:
            weights += base.linear("self_attn.k_proj", h, dims.kv_heads * dims.head_dim, layer=i)
            weights += base.linear("self_attn.v_proj", h, dims.kv_heads * dims.head_dim, layer=i)
            weights += base.norm("self_attn.k_norm", dims.head_dim, layer=i)
        weights += base.linear("self_attn.o_proj", dims.heads * dims.head_dim, h, split="row", layer=i)
        weights += base.gated_mlp(i, h, int(inters[i]))
        weights += base.decoder_layer_norms(i, h, 4)
        weights += [
            WeightPart("altup.correct_output_scale", (h,), "other", "text", "replicated", i),
            WeightPart("altup.correction_coefs", (alt, alt), "other", "text", "replicated", i),
            WeightPart("altup.prediction_coefs", (alt * alt, alt), "other", "text", "replicated", i),
            WeightPart("altup.modality_router", (alt, h), "other", "text", "replicated", i),
        ]
        weights += base.norm("altup.router_norm", h, layer=i)
        weights += base.linear("laurel.linear_left", h, rank, layer=i)
        weights += base.linear("laurel.linear_right", rank, h, split="row", layer=i)
        weights += base.norm("laurel.post_laurel_norm", h, layer=i)
        weights += base.linear("per_layer_input_gate", h, per_layer, split="replicated", layer=i)
        weights += base.linear("per_layer_projection", per_layer, h, split="replicated", layer=i)
        weights += base.norm("post_per_layer_input_norm", h, layer=i)
    weights += base.norm("norm", h)
    weights.append(WeightPart("embed_tokens_per_layer", (per_vocab, n * per_layer), "embedding", "text", "vocab"))
    weights += base.linear("per_layer_model_projection", h, n * per_layer)
    weights += base.norm("per_layer_projection_norm", per_layer)
    for name in ("altup_projections", "altup_unembed_projections"):
        weights += [WeightPart(name, (h, h), "linear", "text", "column", None, alt - 1)]
    is_tied = base.tied(top, c, True)
    weights += base.lm_head(vocab, h, is_tied)
    return caches, weights, is_tied


# ---------------------------------------------------------------------------------------------- Gemma 4
# transformers 5.24 models/gemma4/configuration_gemma4.py (cfg) Gemma4TextConfig.__post_init__ and modeling_gemma4.py
# (mod); vLLM 0.32 model_executor/models/gemma4.py (vg4) reads the same config object. Where each rule lives:
#   layer kinds, last layer full: cfg:188-199; full layers' head_dim / KV heads: cfg:208-221, mod:1152, vg4:578;
#   K = V (no v_proj, K and V both cached): mod:1154, 1179-1184, 1218, 1228, vg4:97-107, 423-432, 539;
#   window 'all' -> w // 2 + 1: cfg:184-186; KV sharing: cfg:226-251, vg4:473-495 (no vLLM spec for consumers:
#   v1/worker/gpu_model_runner.py:7162-7172, transformers DummyLayer: cache_utils.py:1980-1985); double-wide MLP on
#   shared layers: mod:1054-1059, vg4:596-607; PLE: mod:1345-1350, 1566-1580; MoE beside the dense MLP: mod:1352-1358,
#   1258-1264, 1294-1305 (vLLM keys it on num_experts, vg4:630). Checked in tests/test_gemma4.py.
GEMMA4_SLIDING_PATTERN = 6  # Gemma4TextConfig.__post_init__: no layer_types -> 5 sliding : 1 full


def gemma4_layer_types(c: Cfg, n: int) -> list[str]:
    """'full' / 'sliding' per layer: layer_types (or the 5:1 default pattern); transformers forces the last layer
    to full attention whatever the config says."""
    kinds = base.kinds_from_layer_types(c, n)
    if kinds is None:
        kinds = ["sliding" if (i + 1) % GEMMA4_SLIDING_PATTERN else "full" for i in range(n)]
    bad = sorted({k for k in kinds if k not in ("full", "sliding")})
    if bad:
        raise ConfigError(f"{c.where}: Gemma 4 layers are full or sliding attention; layer_types has {', '.join(bad)}")
    if kinds:
        kinds[-1] = "full"
    return kinds


def gemma4_window(c: Cfg) -> int:
    """sliding_window as the config class leaves it: use_bidirectional_attention 'all' halves it (+1, 'exclusive
    bounds'); both transformers and vLLM read the converted value."""
    window = c.need_int("sliding_window")
    if c.get("use_bidirectional_attention") == "all":
        window = window // 2 + 1
    return window


def gemma4_layer_dims(c: Cfg, kinds: list[str]) -> list[AttnDims]:
    """Per layer (heads, KV heads, head_dim): Gemma4TextAttention reads config.per_layer_config[layer_idx]. Without
    an explicit per_layer_config (the released configs), the config class builds one: full-attention layers take
    global_head_dim (default 512) and, only when attention_k_eq_v is set, num_global_key_value_heads (when given).
    A config re-saved by transformers >= 5.24 carries per_layer_config itself ({"05": {"head_dim": 512, ...}});
    it then wins and global_head_dim is ignored, as in the config class."""
    n = len(kinds)
    heads = c.need_int("num_attention_heads")
    kv = int(c.get("num_key_value_heads", default=heads))
    head_dim = c.need_int("head_dim")
    explicit = c.raw.get("per_layer_config")
    overrides: dict[int, dict] = {}
    if isinstance(explicit, dict):
        for key, value in explicit.items():
            try:
                idx = int(key)
            except (TypeError, ValueError):
                raise ConfigError(f"{c.where}.per_layer_config: keys are layer indices, found {base.brief(key)}") from None
            if not 0 <= idx < n or not isinstance(value, dict):
                raise ConfigError(f"{c.where}.per_layer_config: {base.brief(key)} is not a layer index in 0..{n - 1} "
                                  "with an object of overrides")
            overrides[idx] = value
    else:
        layer = {"head_dim": int(c.get("global_head_dim", default=512))}
        global_kv = c.get("num_global_key_value_heads")
        if c.get("attention_k_eq_v", default=False) and global_kv is not None:
            layer["num_key_value_heads"] = int(global_kv)
        overrides = {i: layer for i, k in enumerate(kinds) if k == "full"}
    dims = []
    for i in range(n):
        o = overrides.get(i, {})
        hd = int(o.get("head_dim") or head_dim)
        dims.append(AttnDims(heads, int(o.get("num_key_value_heads") or kv), hd, hd))
    return dims


def gemma4_kv_producers(c: Cfg, kinds: list[str]) -> list[int | None]:
    """Gemma4TextConfig.kv_sharing_modes: the last num_kv_shared_layers layers reuse the K/V of the last earlier
    layer of their type (vLLM's kv_sharing_target_layer_name picks the same layer); None = the layer keeps its own."""
    n = len(kinds)
    shared = int(c.get("num_kv_shared_layers", default=0) or 0)
    if shared > n:
        raise ConfigError(f"{c.where}: num_kv_shared_layers ({shared}) exceeds num_hidden_layers ({n})")
    if shared == n and n:
        raise ConfigError(f"{c.where}: every layer reuses KV it does not compute (num_kv_shared_layers = "
                          "num_hidden_layers: a Gemma 4 assistant/draft model reading its target's cache); kvplan "
                          "sizes the target model, not the assistant alone")
    first = n - shared
    out: list[int | None] = []
    for i, kind in enumerate(kinds):
        if i < first:
            out.append(None)
            continue
        earlier = [j for j in range(first) if kinds[j] == kind]
        if not earlier:
            raise ConfigError(f"{c.where}: shared layer {i} ({kind} attention) has no earlier {kind} layer to reuse "
                              "(transformers refuses this config)")
        out.append(earlier[-1])
    return out


def gemma4(top: Cfg, c: Cfg):
    """Gemma 4 text (Gemma4TextModel, inside Gemma4ForConditionalGeneration): sliding layers of head_dim x
    num_key_value_heads, full layers of global_head_dim (x num_global_key_value_heads with attention_k_eq_v, where
    the full layers have no v_proj: V is the k_proj output, but both engines still cache K and V); KV sharing
    (num_kv_shared_layers), per-layer input embeddings (hidden_size_per_layer_input), and with enable_moe_block a
    router + experts beside the dense MLP in every layer."""
    from kvplan.spec import SharedKV, WeightPart

    c.need_all("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "head_dim", "sliding_window")
    n, h, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    kinds = gemma4_layer_types(c, n)
    dims = gemma4_layer_dims(c, kinds)
    producers = gemma4_kv_producers(c, kinds)
    window = gemma4_window(c)
    k_eq_v = bool(c.get("attention_k_eq_v", default=False))
    bias = bool(c.get("attention_bias", default=False))
    inter = c.need_int("intermediate_size")
    double_wide = bool(c.get("use_double_wide_mlp", default=False))
    # 0 (the 26B/31B configs) or null: no per-layer input embeddings; absent: the class default 256
    written_null = "hidden_size_per_layer_input" in c.raw and c.raw["hidden_size_per_layer_input"] is None
    per_layer = 0 if written_null else int(c.get("hidden_size_per_layer_input") or 0)
    moe = bool(c.get("enable_moe_block", default=False))
    if moe:
        c.need_all("num_experts", "moe_intermediate_size", "top_k_experts")
        experts, expert_inter = c.need_int("num_experts"), c.need_int("moe_intermediate_size")

    caches = []
    for i, (kind, d, producer) in enumerate(zip(kinds, dims, producers)):
        caches.append((i, SharedKV(producer) if producer is not None else base.attention_cache(kind, d, window)))

    weights = [base.embedding(vocab, h)]
    for i, (kind, d, producer) in enumerate(zip(kinds, dims, producers)):
        weights += base.linear("self_attn.q_proj", h, d.heads * d.head_dim, bias=bias, layer=i)
        weights += base.norm("self_attn.q_norm", d.head_dim, layer=i)
        if producer is None:  # a KV-sharing layer has no k/v projections or k_norm (v_norm has no weight anywhere)
            weights += base.linear("self_attn.k_proj", h, d.kv_heads * d.head_dim, bias=bias, layer=i)
            if not (k_eq_v and kind == "full"):
                weights += base.linear("self_attn.v_proj", h, d.kv_heads * d.head_dim, bias=bias, layer=i)
            weights += base.norm("self_attn.k_norm", d.head_dim, layer=i)
        weights += base.linear("self_attn.o_proj", d.heads * d.head_dim, h, bias=bias, split="row", layer=i)
        weights += base.gated_mlp(i, h, inter * (2 if double_wide and producer is not None else 1))
        weights += base.decoder_layer_norms(i, h, 4)
        if per_layer:
            # vLLM: ReplicatedLinear (one copy per GPU); the packed table and its projection split like other layers
            weights += base.linear("per_layer_input_gate", h, per_layer, split="replicated", layer=i)
            weights += base.linear("per_layer_projection", per_layer, h, split="replicated", layer=i)
            weights += base.norm("post_per_layer_input_norm", h, layer=i)
        if moe:
            weights += base.router(i, h, experts, name="router.proj")
            weights += [WeightPart("router.scale", (h,), "other", "text", "replicated", i),
                        WeightPart("router.per_expert_scale", (experts,), "other", "text", "replicated", i)]
            weights += base.experts(i, h, expert_inter, experts, prefix="experts")
            for name in ("post_feedforward_layernorm_1", "post_feedforward_layernorm_2", "pre_feedforward_layernorm_2"):
                weights += base.norm(name, h, layer=i)
    weights += base.norm("norm", h)
    if per_layer:
        per_vocab = int(c.get("vocab_size_per_layer_input", default=262_144))
        weights.append(WeightPart("embed_tokens_per_layer", (per_vocab, n * per_layer), "embedding", "text", "vocab"))
        weights += base.linear("per_layer_model_projection", h, n * per_layer)
        weights += base.norm("per_layer_projection_norm", per_layer)
    is_tied = base.tied(top, c, True)
    weights += base.lm_head(vocab, h, is_tied)
    return caches, weights, is_tied
