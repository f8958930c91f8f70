"""DeepSeek-V2/V3, Kimi-K2 and other MLA models, recognised by their fields (kv_lora_rank), not by model_type.

Cache per layer: the compressed latent (kv_lora_rank) + the shared RoPE key (qk_rope_head_dim).
MoE: layers >= first_k_dense_replace with layer % moe_layer_freq == 0 are sparse (routed + shared experts).
Multi-token-prediction layers (num_nextn_predict_layers) are listed as part "mtp": outside params and weights.
"""

from __future__ import annotations

from kvplan.architectures import base
from kvplan.architectures.base import Cfg
from kvplan.spec import LatentAttention, WeightPart


def is_mla(c: Cfg) -> bool:
    return c.get("kv_lora_rank") is not None and c.get("qk_rope_head_dim") is not None


def _attention(c: Cfg, layer: int, hidden: int) -> list[WeightPart]:
    heads, nope, rope, v = (c.need_int(k) for k in ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"))
    kv_lora = c.need_int("kv_lora_rank")
    q_lora = c.get("q_lora_rank")
    bias = bool(c.get("attention_bias", default=False))

    def lin(name, i, o, b=False, split="column"):
        return base.linear(name, i, o, bias=b, split=split, layer=layer)

    parts: list[WeightPart] = []
    if q_lora:
        parts += lin("self_attn.q_a_proj", hidden, int(q_lora), bias, "replicated")
        parts += [WeightPart("self_attn.q_a_layernorm", (int(q_lora),), "norm", "text", "replicated", layer)]
        parts += lin("self_attn.q_b_proj", int(q_lora), heads * (nope + rope))
    else:
        parts += lin("self_attn.q_proj", hidden, heads * (nope + rope))
    parts += lin("self_attn.kv_a_proj_with_mqa", hidden, kv_lora + rope, bias, "replicated")
    parts += [WeightPart("self_attn.kv_a_layernorm", (kv_lora,), "norm", "text", "replicated", layer)]
    parts += lin("self_attn.kv_b_proj", kv_lora, heads * (nope + v))
    parts += lin("self_attn.o_proj", heads * v, hidden, split="row")
    return parts


def _mlp(c: Cfg, layer: int, hidden: int) -> list[WeightPart]:
    n_routed = int(c.get("n_routed_experts", default=0) or 0)
    first_dense = int(c.get("first_k_dense_replace", default=0))
    freq = int(c.get("moe_layer_freq", default=1))
    if n_routed and layer >= first_dense and layer % freq == 0:
        moe_inter = c.need_int("moe_intermediate_size")
        parts = base.router(layer, hidden, n_routed) + base.experts(layer, hidden, moe_inter, n_routed)
        shared = int(c.get("n_shared_experts", default=0) or 0)
        if shared:
            parts += base.gated_mlp(layer, hidden, moe_inter * shared, prefix="mlp.shared_experts")
    else:
        parts = base.gated_mlp(layer, hidden, c.need_int("intermediate_size"))
    return parts


def _layer(c: Cfg, layer: int, hidden: int) -> list[WeightPart]:
    return _attention(c, layer, hidden) + _mlp(c, layer, hidden) + base.decoder_layer_norms(layer, hidden, 2)


def build(top: Cfg, c: Cfg):
    c.need_all("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "kv_lora_rank",
               "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
    n, hidden, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    cache = LatentAttention(
        c.need_int("kv_lora_rank"), c.need_int("qk_rope_head_dim"), c.need_int("num_attention_heads"),
        c.need_int("qk_nope_head_dim"), c.need_int("v_head_dim"),
    )
    caches = [(i, cache) for i in range(n)]
    weights = [base.embedding(vocab, hidden)]
    for i in range(n):
        weights += _layer(c, i, hidden)
    weights += base.norm("norm", hidden)
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, hidden, is_tied)
    # DeepSeek-V3 checkpoints store each MTP module with its own embedding and head copies
    for j in range(int(c.get("num_nextn_predict_layers", default=0) or 0)):
        i = n + j
        weights += [
            WeightPart("mtp.embed_tokens", (vocab, hidden), "embedding", "mtp", "vocab", i),
            WeightPart("mtp.enorm", (hidden,), "norm", "mtp", "replicated", i),
            WeightPart("mtp.hnorm", (hidden,), "norm", "mtp", "replicated", i),
            WeightPart("mtp.eh_proj", (hidden, 2 * hidden), "linear", "mtp", "replicated", i),
            WeightPart("mtp.shared_head.norm", (hidden,), "norm", "mtp", "replicated", i),
            WeightPart("mtp.shared_head.head", (vocab, hidden), "lm_head", "mtp", "vocab", i),
        ]
        weights += base.in_part(_layer(c, i, hidden), "mtp")
    return caches, weights, is_tied
