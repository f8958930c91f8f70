"""Llama-4: chunked local attention on RoPE layers (3 of 4), global NoPE layers, MoE with a shared expert.

transformers Llama4TextConfig: no_rope_layers[i] = 1 for RoPE layers ((i+1) % no_rope_layer_interval != 0,
interval 4) and those layers are "chunked_attention" with attention_chunk_size (8192).
"""

from __future__ import annotations

from kvplan.architectures import base
from kvplan.architectures.base import Cfg
from kvplan.spec import WeightPart


def layer_kinds(c: Cfg, n: int) -> list[str]:
    kinds = base.kinds_from_layer_types(c, n)
    if kinds is not None:
        return kinds
    if not c.get("attention_chunk_size", default=8192):
        return ["full"] * n
    interval = int(c.get("no_rope_layer_interval", default=4))
    rope_layers = c.raw.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(n)]
    return ["chunked" if rope else "full" for rope in rope_layers]


def build(top: Cfg, c: Cfg):
    c.need_all("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "intermediate_size")
    n, hidden, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    dims = base.attention_dims(c)
    chunk = c.get("attention_chunk_size", default=8192)
    caches = [(i, base.attention_cache(k, dims, chunk=chunk)) for i, k in enumerate(layer_kinds(c, n))]
    step = int(c.get("interleave_moe_layer_step", default=1))
    moe_layers = c.raw.get("moe_layers")
    moe_layers = set(moe_layers if moe_layers is not None else range(step - 1, n, step))
    experts = int(c.get("num_local_experts", default=16))
    inter, inter_mlp = c.need_int("intermediate_size"), int(c.get("intermediate_size_mlp", default=16384))
    bias = bool(c.get("attention_bias", default=False))
    weights = [base.embedding(vocab, hidden)]
    for i in range(n):
        weights += base.attention_block(i, hidden, dims, qkv_bias=bias, o_bias=bias)
        if i in moe_layers:
            weights += base.router(i, hidden, experts, name="feed_forward.router")
            weights += [
                WeightPart("feed_forward.experts.gate_up_proj", (hidden, 2 * inter), "expert", "text", "expert", i, experts),
                WeightPart("feed_forward.experts.down_proj", (inter, hidden), "expert", "text", "expert", i, experts),
            ]
            weights += base.gated_mlp(i, hidden, inter, prefix="feed_forward.shared_expert")
        else:
            weights += base.gated_mlp(i, hidden, inter_mlp, prefix="feed_forward")
        weights += base.decoder_layer_norms(i, hidden, 2)
    weights += base.norm("norm", hidden)
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, hidden, is_tied)
    return caches, weights, is_tied
