"""Zamba2 (model_type zamba2: Zyphra's Zamba2-1.2B / 2.7B / 7B): a stack of Mamba-2 layers; on the layers that
layers_block_type marks "hybrid", a SHARED transformer block runs first (num_mem_blocks blocks, used in turn) on
the concatenation of the hidden state and the token embeddings (2 x hidden_size wide, attention_head_dim =
2 x hidden / heads), its output goes through the position's own hidden x hidden `linear` and is added to the input
of that layer's Mamba-2 mixer. Every layer keeps a Mamba-2 state; a hybrid layer also keeps K/V of its own
(transformers' LinearAttentionAndFullAttentionLayer, vLLM's one Attention per hybrid position in dpa_list)
although the block's weights are shared. Each hybrid position has its own low-rank adapters: on the MLP's
gate_up projection always (both engines build it whatever use_shared_mlp_adapter says, a key neither reads), on
q/k/v when use_shared_attention_adapter.

Read from transformers 5.24 models/zamba2 (Zamba2Config.__post_init__, Zamba2Model.get_layers, Zamba2Attention,
Zamba2MLP, Zamba2MambaMixer) and vLLM 0.32 models/zamba2.py. Where the two would build different models, the
config is refused: K/V heads other than the attention heads (vLLM builds them all), a shared block tied in vLLM
but not in transformers (transformers ties the blocks, like lm_head, only when tie_word_embeddings), a Mamba conv
without bias (transformers always builds one), more shared blocks than hybrid layers, and derived widths a config
restates differently (Zamba2Config keeps a config's attention_head_dim / attention_hidden_size / mamba_headdim /
hybrid_layer_ids over its own).
"""

from __future__ import annotations

from kvplan.architectures import base
from kvplan.architectures.base import Cfg
from kvplan.architectures.hybrid import _mamba2_mixer
from kvplan.errors import ConfigError
from kvplan.spec import FullAttention, MambaState, WeightPart

# Zamba2Config's layers_block_type when the config has none (54 layers: Zamba2-2.7B's pattern)
DEFAULT_PATTERN = (["mamba"] + (["mamba"] * 5 + ["hybrid"]) * 7 + ["mamba"] * 4 + ["hybrid"] + ["mamba"] * 3
                   + ["hybrid"] + ["mamba"] * 2)
LONG_CONTEXT = 16384  # Zamba2Config: use_long_context sets max_position_embeddings to this


def _blocks(c: Cfg, n: int) -> list[str]:
    """layers_block_type as transformers reads it: legacy 'mamba' is 'linear_attention'; any entry other than
    'hybrid' builds a plain Mamba-2 layer in both engines, so only the two names are accepted."""
    raw = c.raw.get("layers_block_type", c.raw.get("layer_types"))
    blocks = list(DEFAULT_PATTERN) if raw is None else raw
    if not isinstance(blocks, list) or any(b not in ("mamba", "linear_attention", "hybrid") for b in blocks):
        raise ConfigError(f"{c.where}: layers_block_type must list 'mamba' (or 'linear_attention') and 'hybrid', found "
                          f"{base.brief(blocks)} (Zyphra's older 'm' / 'g' names are refused by transformers 5.24 too)")
    if len(blocks) != n:
        where = "the default 54-layer pattern (no layers_block_type)" if raw is None else f"{len(blocks)} entries"
        raise ConfigError(f"{c.where}: num_hidden_layers {n} differs from layers_block_type's {where}: transformers "
                          "refuses such a config")
    return ["hybrid" if b == "hybrid" else "mamba" for b in blocks]


def _same(c: Cfg, key: str, derived, what: str) -> None:
    given = c.raw.get(key)
    if given is not None and given != derived:
        raise ConfigError(f"{c.where}: {key} {base.brief(given)} differs from {what} = {base.brief(derived)}: "
                          "transformers keeps the config's value, vLLM's Zamba2 code derives its own in places")


def build(top: Cfg, c: Cfg):
    n, h = int(c.get("num_hidden_layers", default=54)), int(c.get("hidden_size", default=2560))
    vocab = int(c.get("vocab_size", default=32000))
    kinds = _blocks(c, n)
    hybrid = [i for i, k in enumerate(kinds) if k == "hybrid"]
    _same(c, "hybrid_layer_ids", hybrid, "the 'hybrid' entries of layers_block_type")

    heads = int(c.get("num_attention_heads", default=32))
    kv = int(c.get("num_key_value_heads", default=heads))
    if kv != heads:
        raise ConfigError(f"{c.where}: num_key_value_heads {kv} differs from num_attention_heads {heads}: transformers "
                          "builds K/V with the former, vLLM's Zamba2Attention (and the q/k/v adapters) with every head")
    if (2 * h) % heads:
        raise ConfigError(f"{c.where}: num_attention_heads {heads} does not divide the shared attention's width "
                          f"2 x hidden_size = {2 * h} (vLLM's Zamba2Attention raises)")
    attn_width, head_dim = 2 * h, 2 * h // heads
    _same(c, "attention_hidden_size", attn_width, "2 x hidden_size")
    _same(c, "attention_head_dim", head_dim, "2 x hidden_size / num_attention_heads")

    m_heads, inner = int(c.get("n_mamba_heads", default=8)), int(c.get("mamba_expand", default=2)) * h
    if inner % m_heads:
        raise ConfigError(f"{c.where}: n_mamba_heads {m_heads} does not divide mamba_expand x hidden_size = {inner}")
    m_head = inner // m_heads
    _same(c, "mamba_headdim", m_head, "mamba_expand x hidden_size / n_mamba_heads")
    groups, state = int(c.get("mamba_ngroups", default=1)), int(c.get("mamba_d_state", default=64))
    kernel = int(c.get("mamba_d_conv", default=4))
    if not c.get("use_conv_bias", default=True):
        raise ConfigError(f"{c.where}: use_conv_bias false: transformers' Zamba2MambaMixer builds the conv bias "
                          "anyway, vLLM's MambaMixer2 follows the flag")
    if not base.tied(top, c, True):
        raise ConfigError(f"{c.where}: tie_word_embeddings false: transformers then builds an untied copy of the "
                          "shared block at every hybrid layer and an lm_head, vLLM shares both regardless")
    mem_blocks = int(c.get("num_mem_blocks", default=1))
    if hybrid and mem_blocks > len(hybrid):
        raise ConfigError(f"{c.where}: num_mem_blocks {mem_blocks} exceeds the {len(hybrid)} hybrid layers: vLLM "
                          f"builds {mem_blocks} shared blocks, transformers {len(hybrid)}")

    bias = bool(c.get("add_bias_linear", default=False))
    inter = int(c.get("intermediate_size", default=0) or 4 * h)  # Zamba2Config: intermediate_size or 4 x hidden
    rank = int(c.get("adapter_rank", default=128))
    attn_adapters = bool(c.get("use_shared_attention_adapter", default=False))

    attn_cache = FullAttention(heads, head_dim, head_dim)
    state_cache = MambaState(inner + 2 * groups * state, kernel, (m_heads, m_head, state), groups)
    caches, weights = [], [base.embedding(vocab, h)]
    for i, kind in enumerate(kinds):
        prefix = "mamba_decoder." if kind == "hybrid" else ""
        if kind == "hybrid":
            caches.append((i, attn_cache))
        caches.append((i, state_cache))
        weights += base.norm(f"{prefix}input_layernorm", h, layer=i)
        weights += _mamba2_mixer(i, h, m_heads, m_head, groups, state, kernel, proj_bias=bias, conv_bias=True,
                                 prefix=f"{prefix}mamba")
        if kind == "hybrid":
            weights += _hybrid_position(hybrid.index(i), i, h, heads, head_dim, inter, rank, mem_blocks, bias,
                                        attn_adapters)
    weights += base.norm("final_layernorm", h)
    return caches, weights, True


def _hybrid_position(k: int, layer: int, h: int, heads: int, head_dim: int, inter: int, rank: int, mem_blocks: int,
                     bias: bool, attn_adapters: bool) -> list[WeightPart]:
    """The k-th hybrid layer: its own `linear` (hidden x hidden, ReplicatedLinear in vLLM) and adapters, and -- the
    first time shared block k % num_mem_blocks is used -- that block (counted once, charged to this layer)."""
    st = "shared_transformer"
    parts = base.linear("linear", h, h, split="replicated", layer=layer)
    if k < mem_blocks:
        parts += base.norm(f"{st}.input_layernorm", 2 * h, layer=layer)
        parts += base.norm(f"{st}.pre_ff_layernorm", h, layer=layer)
        for name in ("q_proj", "k_proj", "v_proj"):  # 2 x hidden in, heads x head_dim = 2 x hidden out
            parts += base.linear(f"{st}.self_attn.{name}", 2 * h, heads * head_dim, layer=layer)
        parts += base.linear(f"{st}.self_attn.o_proj", heads * head_dim, h, split="row", layer=layer)
        parts += base.linear(f"{st}.feed_forward.gate_up_proj", h, 2 * inter, bias=bias, layer=layer)
        parts += base.linear(f"{st}.feed_forward.down_proj", inter, h, bias=bias, split="row", layer=layer)
    # adapters: Sequential(Linear(in, rank), Linear(rank, out)); vLLM's Zamba2LoRA splits both over tp (A gathers)
    parts += _adapter(f"{st}.feed_forward.gate_up_proj_adapter_list.{k}", h, rank, 2 * inter, layer)
    if attn_adapters:
        for name in ("q", "k", "v"):
            parts += _adapter(f"{st}.self_attn.linear_{name}_adapter_list.{k}", 2 * h, rank, 2 * h, layer)
    return parts


def _adapter(name: str, d_in: int, rank: int, d_out: int, layer: int) -> list[WeightPart]:
    return base.linear(f"{name}.0", d_in, rank, layer=layer) + base.linear(f"{name}.1", rank, d_out, layer=layer)


def max_ctx(c: Cfg) -> tuple[int, str] | None:
    """use_long_context: Zamba2Config sets max_position_embeddings to 16384 (transformers and vLLM, which reads the
    same config object)."""
    if c.get("use_long_context", default=False):
        return LONG_CONTEXT, f"{c.where}.use_long_context (Zamba2Config: max_position_embeddings {LONG_CONTEXT:,})"
    return None
