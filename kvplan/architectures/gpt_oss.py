"""gpt-oss: alternating sliding (128) / full layers from layer_types, attention sinks, biased MoE experts."""

from __future__ import annotations

from kvplan.architectures import base
from kvplan.architectures.base import Cfg
from kvplan.spec import WeightPart


def build(top: Cfg, c: Cfg):
    c.need_all("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "intermediate_size",
               ("num_local_experts",))
    n, hidden, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    inter, experts = c.need_int("intermediate_size"), c.need_int("num_local_experts")
    dims = base.attention_dims(c)
    # transformers GptOssConfig: layer i is sliding iff (i + 1) % 2 when layer_types is absent
    kinds = base.kinds_from_layer_types(c, n) or ["sliding" if (i + 1) % 2 else "full" for i in range(n)]
    window = c.get("sliding_window", default=128)
    caches = [(i, base.attention_cache(k, dims, window)) for i, k in enumerate(kinds)]
    bias = bool(c.get("attention_bias", default=True))
    weights = [base.embedding(vocab, hidden)]
    for i in range(n):
        weights += base.attention_block(i, hidden, dims, qkv_bias=bias, o_bias=bias)
        weights.append(WeightPart("self_attn.sinks", (dims.heads,), "other", "text", "column", i))
        weights += base.router(i, hidden, experts, bias=True, name="mlp.router")
        weights += [
            WeightPart("mlp.experts.gate_up_proj", (hidden, 2 * inter), "expert", "text", "expert", i, experts),
            WeightPart("mlp.experts.gate_up_proj_bias", (2 * inter,), "bias", "text", "expert", i, experts),
            WeightPart("mlp.experts.down_proj", (inter, hidden), "expert", "text", "expert", i, experts),
            WeightPart("mlp.experts.down_proj_bias", (hidden,), "bias", "text", "expert", i, experts),
        ]
        weights += base.decoder_layer_norms(i, hidden, 2)
    weights += base.norm("norm", hidden)
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, hidden, is_tied)
    return caches, weights, is_tied
