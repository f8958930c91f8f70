"""Nemotron-NAS / DeciLM (block_configs): per-layer attention heads (n_heads_in_group), no-op or linear
attention and FFN blocks. A no-op or linear-replaced attention keeps no cache (vLLM get_total_num_kv_heads
reads the same block configs)."""

from __future__ import annotations

import math

from kvplan.architectures import base
from kvplan.architectures.base import AttnDims, Cfg
from kvplan.errors import ConfigError
from kvplan.spec import FullAttention, NoCache


def ffn_mult_to_intermediate(ffn_mult: float, hidden: int) -> int:
    """DeciLM's _ffn_mult_to_intermediate_size: int(2 * mult * hidden / 3) rounded up to a multiple of 256."""
    inter = int(2 * ffn_mult * hidden / 3)
    return 256 * math.ceil(inter / 256)


def build(top: Cfg, c: Cfg):
    c.need_all("hidden_size", "num_attention_heads", "vocab_size", "block_configs")
    blocks = c.need("block_configs")
    if not isinstance(blocks, list) or not blocks:
        raise ConfigError(f"{c.where}: block_configs must be a non-empty list of per-layer blocks")
    h, heads, vocab = c.need_int("hidden_size"), c.need_int("num_attention_heads"), c.need_int("vocab_size")
    head_dim = int(c.get("head_dim", default=h // heads))
    caches, weights = [], [base.embedding(vocab, h)]
    for i, block in enumerate(blocks):
        attn, ffn = block.get("attention", {}) or {}, block.get("ffn", {}) or {}
        if attn.get("no_op") or attn.get("replace_with_linear"):
            caches.append((i, NoCache(zero_kv_heads=True)))
            if attn.get("replace_with_linear"):
                weights += base.linear("self_attn.linear_attn", h, h, layer=i)
        else:
            group = attn.get("n_heads_in_group")
            if not group:
                raise ConfigError(f"{c.where}: block_configs[{i}].attention lacks n_heads_in_group")
            kv = heads // int(group)
            caches.append((i, FullAttention(kv, head_dim, head_dim)))
            weights += base.attention_block(i, h, AttnDims(heads, kv, head_dim, head_dim))
            weights += base.norm("input_layernorm", h, layer=i)
        if ffn.get("no_op"):
            continue
        weights += base.norm("post_attention_layernorm", h, layer=i)
        if ffn.get("replace_with_linear"):
            weights += base.linear("mlp.linear_mlp", h, h, layer=i)
        else:
            weights += base.gated_mlp(i, h, ffn_mult_to_intermediate(float(ffn.get("ffn_mult", 1.0)), h))
    weights += base.norm("norm", h)
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, h, is_tied)
    return caches, weights, is_tied
