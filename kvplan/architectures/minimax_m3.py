"""MiniMax-M3 (model_type minimax_m3: the text backbone vLLM builds as MiniMaxM3SparseForCausalLM; the Hub's
minimax_m3_vl checkpoint nests the same fields in text_config). Read as vLLM 0.32's models/minimax_m3/nvidia/model.py
builds it:

- every layer keeps full GQA K/V (num_key_value_heads x head_dim); a layer whose
  sparse_attention_config.sparse_attention_freq entry is non-zero (MiniMaxM3SparseAttention) also keeps one
  sparse_index_dim-wide index key per token (common/indexer.py MiniMaxM3IndexerCache: an MLAAttentionSpec of one
  head; the index key projection is "a single shared head, replicated to every rank", layers/linear.py
  MinimaxM3QKVParallelLinearWithIndexer);
- weights: q/k/v (+ index_q of sparse_num_index_heads x sparse_index_dim and index_k of sparse_index_dim on sparse
  layers), o_proj, per-head q/k norms (and index q/k norms); a dense MLP of dense_intermediate_size where
  moe_layer_freq is 0, else the MoE: an fp32 router (GateLinear params_dtype float32), with use_routing_bias an fp32
  e_score_correction_bias, a shared expert of intermediate_size x n_shared_experts and num_local_experts experts of
  intermediate_size; two layer norms; MTP: num_mtp_modules modules (MiniMaxM3MTP, speculative decoding only: the
  main model skips "mtp." weights), each enorm, hnorm, eh_proj, one sparse-attention MoE decoder layer and a norm.

vLLM never builds index value/output projections (the layer's docstring: M3 always sets sparse_disable_index_value),
so a config that enables them on a sparse layer is refused rather than sized without them.
"""

from __future__ import annotations

from kvplan.architectures import base
from kvplan.architectures.base import AttnDims, Cfg
from kvplan.errors import ConfigError
from kvplan.spec import FullAttention, MsaIndexerKeys, WeightPart

FP32 = 4


def _flags(c: Cfg, key: str, n: int, default: list[int]) -> list[int]:
    v = c.get(key)
    if v is None:
        return default
    if not isinstance(v, list) or len(v) != n:
        raise ConfigError(f"{c.where}.{key} must be one 0 or 1 per layer ({n}), found {base.brief(v)}")
    return [int(x != 0) for x in v]


def _fp32(name: str, shape: tuple[int, ...], layer: int, part: str) -> WeightPart:
    """A tensor vLLM keeps in fp32 whatever the model dtype (the router, its correction bias)."""
    n = 1
    for d in shape:
        n *= d
    return WeightPart(name, shape, "other", part, "replicated", layer, stored_bytes=FP32 * n)


def _layer(c: Cfg, i: int, d: AttnDims, sparse: bool, moe: bool, part: str = "text") -> list[WeightPart]:
    hidden = c.need_int("hidden_size")
    parts = base.attention_block(i, hidden, d, part=part)
    parts += base.norm("self_attn.q_norm", d.head_dim, layer=i, part=part)
    parts += base.norm("self_attn.k_norm", d.head_dim, layer=i, part=part)
    if sparse:
        s = c.sub("sparse_attention_config")
        idim, iheads = s.need_int("sparse_index_dim"), s.need_int("sparse_num_index_heads")
        parts += base.linear("self_attn.index_q_proj", hidden, iheads * idim, layer=i, part=part)
        parts += base.linear("self_attn.index_k_proj", hidden, idim, split="replicated", layer=i, part=part)
        parts += base.norm("self_attn.index_q_norm", idim, layer=i, part=part)
        parts += base.norm("self_attn.index_k_norm", idim, layer=i, part=part)
    if moe:
        experts, inter = c.need_int("num_local_experts"), c.need_int("intermediate_size")
        parts.append(_fp32("block_sparse_moe.gate", (experts, hidden), i, part))
        if c.get("use_routing_bias", default=False):
            parts.append(_fp32("block_sparse_moe.e_score_correction_bias", (experts,), i, part))
        shared = int(c.get("n_shared_experts", default=0) or 0)
        if shared:
            parts += base.gated_mlp(i, hidden, inter * shared, prefix="block_sparse_moe.shared_experts", part=part)
        expert_parts = base.experts(i, hidden, inter, experts, prefix="block_sparse_moe.experts")
        parts += base.in_part(expert_parts, part) if part != "text" else expert_parts
    else:
        parts += base.gated_mlp(i, hidden, c.need_int("dense_intermediate_size"), part=part)
    for name in ("input_layernorm", "post_attention_layernorm"):
        parts += base.norm(name, hidden, layer=i, part=part)
    return parts


def build(top: Cfg, c: Cfg):
    c.need_all("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
               "intermediate_size", "num_local_experts", "sparse_attention_config")
    n, hidden, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    d = base.attention_dims(c)
    s = c.sub("sparse_attention_config")
    sparse = _flags(s, "sparse_attention_freq", n, [0] * n)
    no_value = _flags(s, "sparse_disable_index_value", n, [1] * n)
    if any(sp and not nv for sp, nv in zip(sparse, no_value)):
        raise ConfigError(f"{s.where}.sparse_disable_index_value is 0 on a sparse layer: vLLM 0.32 builds no index "
                          "value/output projections (models/minimax_m3 always disables them), so kvplan will not size "
                          "such a model")
    if any(sparse):
        s.need_all("sparse_index_dim", "sparse_num_index_heads")
    moe = _flags(c, "moe_layer_freq", n, [1] * n)  # vLLM _is_moe_layer: every layer MoE when absent
    if not all(moe) and c.get("dense_intermediate_size") is None:
        raise base.MissingFields(c.where, ["dense_intermediate_size"])
    full = FullAttention(d.kv_heads, d.head_dim, d.head_dim)
    caches, weights = [], [base.embedding(vocab, hidden)]
    for i in range(n):
        caches.append((i, full))
        if sparse[i]:
            caches.append((i, MsaIndexerKeys(s.need_int("sparse_index_dim"))))
        weights += _layer(c, i, d, bool(sparse[i]), bool(moe[i]))
    weights += base.norm("norm", hidden)
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, hidden, is_tied)
    # MiniMaxM3MTP: num_mtp_modules predictor layers (vLLM's n_predict), each a sparse-attention MoE layer
    for m in range(int(c.get("num_mtp_modules", default=0) or 0)):
        layer = n + m
        weights += base.norm("mtp.enorm", hidden, layer=layer, part="mtp")
        weights += base.norm("mtp.hnorm", hidden, layer=layer, part="mtp")
        weights += base.linear("mtp.eh_proj", 2 * hidden, hidden, split="replicated", layer=layer, part="mtp")
        weights += _layer(c, layer, d, bool(any(sparse)), True, part="mtp")
        weights += base.norm("mtp.final_layernorm", hidden, layer=layer, part="mtp")
    return caches, weights, is_tied
