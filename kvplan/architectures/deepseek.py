"""DeepSeek-V2/V3, Kimi-K2 and other MLA models, recognised by their fields (kv_lora_rank), not by model_type.

Cache per layer: the compressed latent (kv_lora_rank) + the shared RoPE key (qk_rope_head_dim).
MoE: layers >= first_k_dense_replace with layer % moe_layer_freq == 0 are sparse (routed + shared experts).
Multi-token-prediction layers (num_nextn_predict_layers) are listed as part "mtp": outside params and weights.
DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5), recognised as vLLM does by `index_topk`: the latent of every
layer plus, on layers that run their own lightning indexer, one `index_head_dim` key per token (IndexerKeys).
"""

from __future__ import annotations

from kvplan.architectures import base
from kvplan.architectures.base import Cfg
from kvplan.errors import ConfigError
from kvplan.spec import IndexerKeys, LatentAttention, SparseLatentAttention, WeightPart


# MLA configs that also carry layers this module does not build: KDA linear-attention layers (linear_attn_config).
# Kimi Linear / Kimi-K3 (model_type kimi_linear) are read by architectures/kimi.py; any other model_type with them is
# left to the unknown-family check, which refuses it by those fields rather than size every layer as MLA.
NOT_DEEPSEEK_FIELDS = ("linear_attn_config",)


def is_mla(c: Cfg) -> bool:
    return (c.get("kv_lora_rank") is not None and c.get("qk_rope_head_dim") is not None
            and not any(c.get(f) is not None for f in NOT_DEEPSEEK_FIELDS))


def is_sparse(c: Cfg) -> bool:
    """vLLM's `is_v32 = hasattr(config, "index_topk")` (models/deepseek_v2.py); SGLang's is_deepseek_dsa also."""
    return c.get("index_topk") is not None


def own_indexer_layers(c: Cfg, n: int) -> list[bool]:
    """Which layers run (and cache for) their own indexer; the others reuse the previous one's top-k and keep no
    indexer keys. The three engines that read it agree: transformers' GlmMoeDsaConfig.indexer_types (from
    `index_topk_pattern`, else `index_topk_freq` / `index_skip_topk_offset`), vLLM's DeepseekV2Attention
    `_skip_topk`, llama.cpp's is_indexer_full (GLM-5.2: layers 0-2 and every 4th)."""
    types = c.get("indexer_types")
    if types is not None:
        if len(types) < n or any(t not in ("full", "shared") for t in types[:n]):
            raise ConfigError(f"{c.where}: indexer_types must name 'full' or 'shared' for each of the {n} layers")
        return [t == "full" for t in types[:n]]
    pattern = c.get("index_topk_pattern")
    if pattern is not None:
        if any(ch not in "FS" for ch in pattern):
            raise ConfigError(f"{c.where}: index_topk_pattern must be letters F (own indexer) and S (shared), "
                              f"found {pattern[:40]!r}")
        return [i >= len(pattern) or pattern[i] == "F" for i in range(n)]
    return every_nth_indexer(n, int(c.get("index_topk_freq", default=1)), int(c.get("index_skip_topk_offset", default=2)))


def every_nth_indexer(n: int, freq: int, offset: int) -> list[bool]:
    """The shared-indexer rule: layers before `offset` - 1 and then every `freq`-th keep their own indexer
    (GLM-5.2: freq 4, offset 3 -> layers 0-2, 6, 10, ...; llama.cpp hard-codes the same list for GLM-5.2 GGUFs)."""
    return [max(i - offset + 1, 0) % freq == 0 for i in range(n)]


def _indexer(c: Cfg, layer: int, hidden: int) -> list[WeightPart]:
    """The lightning indexer (transformers DeepseekV32Indexer / GlmMoeDsaIndexer): replicated on every TP rank."""
    heads, dim, q_lora = c.need_int("index_n_heads"), c.need_int("index_head_dim"), c.need_int("q_lora_rank")
    return (base.linear("self_attn.indexer.wq_b", q_lora, heads * dim, split="replicated", layer=layer)
            + base.linear("self_attn.indexer.wk", hidden, dim, split="replicated", layer=layer)
            + base.norm("self_attn.indexer.k_norm", dim, bias=True, layer=layer)
            + base.linear("self_attn.indexer.weights_proj", hidden, heads, split="replicated", layer=layer))


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
    freq = c.get("moe_layer_freq", default=1)
    sparse = bool(freq[layer]) if isinstance(freq, list) and layer < len(freq) else layer % int(freq or 1) == 0
    if n_routed and layer >= first_dense and sparse:
        moe_inter = c.need_int("moe_intermediate_size")
        parts = base.router(layer, hidden, n_routed) + base.experts(layer, hidden, moe_inter, n_routed)
        shared = int(c.get("n_shared_experts", default=0) or 0)
        if shared:
            parts += base.gated_mlp(layer, hidden, moe_inter * shared, prefix="mlp.shared_experts")
    else:
        parts = base.gated_mlp(layer, hidden, c.need_int("intermediate_size"))
    return parts


def _layer(c: Cfg, layer: int, hidden: int, indexer: bool = False) -> list[WeightPart]:
    parts = _attention(c, layer, hidden) + _mlp(c, layer, hidden) + base.decoder_layer_norms(layer, hidden, 2)
    return parts + (_indexer(c, layer, hidden) if indexer else [])


def build(top: Cfg, c: Cfg):
    c.need_all("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "kv_lora_rank",
               "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
    n, hidden, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    sparse = is_sparse(c)
    latent = (c.need_int("kv_lora_rank"), c.need_int("qk_rope_head_dim"), c.need_int("num_attention_heads"),
              c.need_int("qk_nope_head_dim"), c.need_int("v_head_dim"))
    cache = SparseLatentAttention(*latent) if sparse else LatentAttention(*latent)
    indexed = own_indexer_layers(c, n) if sparse else [False] * n
    keys = IndexerKeys(c.need_int("index_head_dim")) if sparse else None
    caches = []
    for i in range(n):
        caches.append((i, cache))
        if indexed[i]:
            caches.append((i, keys))
    weights = [base.embedding(vocab, hidden)]
    for i in range(n):
        weights += _layer(c, i, hidden, indexed[i])
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
        weights += base.in_part(_layer(c, i, hidden, sparse), "mtp")  # MTP layers always build an indexer
    return caches, weights, is_tied
