"""Gemma 1/2/3: explicit head_dim, 4 norms per layer from Gemma-2 on, local/global layer patterns, tied embeddings.

Gemma-3 configs (the multimodal text_config especially) omit fields that come from Gemma3TextConfig class
defaults; architectures/defaults.py holds them.
"""

from __future__ import annotations

from kvplan.architectures import base, decoder
from kvplan.architectures.base import Cfg

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


def gemma3n(top: Cfg, c: Cfg):
    """Gemma-3n text (Gemma3nTextModel): the last num_kv_shared_layers layers reuse the KV of the last earlier
    layer of their type (Gemma3nTextConfig.kv_sharing_modes) and have no k/v projections of their own;
    per-layer intermediate sizes; AltUp, LAuReL and per-layer input embeddings around every layer."""
    from kvplan.spec import SharedKV, WeightPart

    c.need_all("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
    n, h, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    dims = base.attention_dims(c)
    kinds = base.kinds_from_layer_types(c, n) or ["full" if (i + 1) % 5 == 0 else "sliding" for i in range(n)]
    shared = int(c.get("num_kv_shared_layers", default=15) or 0)
    first_shared = n - shared
    window = c.get("sliding_window", default=512)
    caches = []
    for i, kind in enumerate(kinds):
        if i >= first_shared:
            producer = max(j for j in range(first_shared) if kinds[j] == kind)
            caches.append((i, SharedKV(producer)))
        else:
            caches.append((i, base.attention_cache(kind, dims, window)))
    inter = c.get("intermediate_size", default=16384)
    inters = inter if isinstance(inter, list) else [inter] * n
    alt, rank = int(c.get("altup_num_inputs", default=4)), int(c.get("laurel_rank", default=64))
    per_layer = int(c.get("hidden_size_per_layer_input", default=256))
    per_vocab = int(c.get("vocab_size_per_layer_input", default=262144))
    weights = [base.embedding(vocab, h)]
    for i in range(n):
        weights += base.linear("self_attn.q_proj", h, dims.heads * dims.head_dim, layer=i)
        weights += base.norm("self_attn.q_norm", dims.head_dim, layer=i)
        if i < first_shared:
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
        weights += base.linear("laurel.linear_left", h, rank, layer=i) + base.linear("laurel.linear_right", rank, h, layer=i)
        weights += base.norm("laurel.post_laurel_norm", h, layer=i)
        weights += base.linear("per_layer_input_gate", h, per_layer, layer=i)
        weights += base.linear("per_layer_projection", per_layer, h, layer=i)
        weights += base.norm("post_per_layer_input_norm", h, layer=i)
    weights += base.norm("norm", h)
    weights.append(WeightPart("embed_tokens_per_layer", (per_vocab, n * per_layer), "embedding", "text", "vocab"))
    weights += base.linear("per_layer_model_projection", h, n * per_layer, split="replicated")
    weights += base.norm("per_layer_projection_norm", per_layer)
    for name in ("altup_projections", "altup_unembed_projections"):
        weights += [WeightPart(name, (h, h), "linear", "text", "replicated", None, alt - 1)]
    is_tied = base.tied(top, c, True)
    weights += base.lm_head(vocab, h, is_tied)
    return caches, weights, is_tied
