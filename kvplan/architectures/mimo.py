"""MiMo-V2-Flash (model_type mimo_v2_flash): hybrid_layer_pattern (0 full attention, 1 sliding window of
sliding_window_size tokens with its own heads, swa_num_*), K heads of head_dim and V heads of v_head_dim (192 / 128),
attention sinks on the sliding layers, and MoE layers where moe_layer_freq has a 1 (routed experts only, a sigmoid
router). vLLM reads these fields (model_executor/models/mimo_v2.py); transformers' MiMoV2FlashConfig derives the
same pattern (full at layer 0 and every 6th) and SWA KV heads (twice the full layers') when they are absent."""

from __future__ import annotations

from dataclasses import replace

from kvplan.architectures import base
from kvplan.architectures.base import AttnDims, Cfg
from kvplan.errors import ConfigError
from kvplan.spec import WeightPart


def _per_layer(c: Cfg, key: str, n: int, default: list[int]) -> list[int]:
    v = c.get(key)
    if v is None:
        return default
    if not isinstance(v, list) or len(v) != n or any(x not in (0, 1) for x in v):
        raise ConfigError(f"{c.where}.{key} must be one 0 or 1 per layer ({n}), found {base.brief(v)}")
    return list(v)


def build(top: Cfg, c: Cfg):
    c.need_all("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
               "intermediate_size", "moe_intermediate_size", ("n_routed_experts", "num_local_experts"))
    n, hidden, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    heads, kv = c.need_int("num_attention_heads"), c.need_int("num_key_value_heads")
    dk = int(c.get("head_dim", default=192))
    dv = int(c.get("v_head_dim", default=dk))
    full = AttnDims(heads, kv, dk, dv)
    swa = AttnDims(int(c.get("swa_num_attention_heads", default=heads)), int(c.get("swa_num_key_value_heads", default=2 * kv)),
                   int(c.get("swa_head_dim", default=dk)), int(c.get("swa_v_head_dim", default=dv)))
    window = c.get("sliding_window_size", "sliding_window")
    sliding = _per_layer(c, "hybrid_layer_pattern", n, [0 if i == 0 or (i + 1) % 6 == 0 else 1 for i in range(n)])
    sparse = _per_layer(c, "moe_layer_freq", n, [0] + [1] * (n - 1))
    experts = int(c.get("n_routed_experts", "num_local_experts"))
    moe_inter, inter = c.need_int("moe_intermediate_size"), c.need_int("intermediate_size")
    bias = bool(c.get("attention_bias", default=False))
    caches, weights = [], [base.embedding(vocab, hidden)]
    for i in range(n):
        d = swa if sliding[i] else full
        cache = base.attention_cache("sliding" if sliding[i] else "full", d, window)
        if sliding[i] and c.get("sliding_window_size") is not None:
            # transformers' MiMoV2FlashConfig: sliding_window = sliding_window_size + 1; vLLM uses sliding_window_size
            cache = replace(cache, hf_window=int(c.get("sliding_window_size")) + 1)
        caches.append((i, cache))
        weights += base.attention_block(i, hidden, d, qkv_bias=bias)
        if c.get("add_swa_attention_sink_bias" if sliding[i] else "add_full_attention_sink_bias",
                 default=bool(sliding[i])):
            weights.append(WeightPart("self_attn.sinks", (d.heads,), "other", "text", "column", i))
        if sparse[i]:
            weights += base.router(i, hidden, experts) + base.experts(i, hidden, moe_inter, experts)
        else:
            weights += base.gated_mlp(i, hidden, inter)
        weights += base.decoder_layer_norms(i, hidden, 2)
    weights += base.norm("norm", hidden)
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, hidden, is_tied)
    return caches, weights, is_tied
