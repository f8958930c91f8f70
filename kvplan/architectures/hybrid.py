"""State-space and hybrid models: only their attention layers hold a growing KV cache.

mamba (state only), mamba2, jamba (attn_layer_period/offset), nemotron-h (hybrid_override_pattern),
qwen3-next and qwen3.5 (full_attention_interval / layer_types, Gated DeltaNet linear attention), Granite-4.0-H
(granitemoehybrid: layer_types) and Bamba (attn_layer_indices), Mamba-2 + attention, lfm2 (layer_types /
full_attn_idxs, gated short convolution), falcon-h1 (attention and Mamba-2 side by side in every layer).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from kvplan.architectures import base
from kvplan.architectures.base import Cfg
from kvplan.errors import ConfigError
from kvplan.spec import FullAttention, LinearAttentionState, MambaState, NoCache, ShortConvState, WeightPart


def _dt_rank(c: Cfg, key: str, hidden: int) -> int:
    rank = c.get(key, default="auto")
    return math.ceil(hidden / 16) if rank == "auto" else int(rank)


def _mamba1_mixer(layer: int, hidden: int, inter: int, state: int, kernel: int, dt_rank: int, *,
                  proj_bias: bool, conv_bias: bool, prefix: str, inner_norms: bool = False) -> list[WeightPart]:
    """MambaMixer: in_proj (x, z), depthwise conv, x_proj (dt, B, C), dt_proj, A_log, D, out_proj."""
    p = prefix
    parts = base.linear(f"{p}.in_proj", hidden, 2 * inter, bias=proj_bias, layer=layer)
    parts.append(WeightPart(f"{p}.conv1d", (inter, 1, kernel), "other", "text", "column", layer))
    if conv_bias:
        parts.append(WeightPart(f"{p}.conv1d.bias", (inter,), "bias", "text", "column", layer))
    parts += base.linear(f"{p}.x_proj", inter, dt_rank + 2 * state, split="row", layer=layer)
    parts += base.linear(f"{p}.dt_proj", dt_rank, inter, bias=True, layer=layer)
    parts.append(WeightPart(f"{p}.A_log", (inter, state), "other", "text", "column", layer))
    parts.append(WeightPart(f"{p}.D", (inter,), "other", "text", "column", layer))
    parts += base.linear(f"{p}.out_proj", inter, hidden, bias=proj_bias, split="row", layer=layer)
    if inner_norms:  # Jamba's dt/B/C layernorms
        parts += base.norm(f"{p}.dt_layernorm", dt_rank, layer=layer)
        parts += base.norm(f"{p}.b_layernorm", state, layer=layer)
        parts += base.norm(f"{p}.c_layernorm", state, layer=layer)
    return parts


def _mamba2_mixer(layer: int, hidden: int, heads: int, head_dim: int, groups: int, state: int, kernel: int, *,
                  proj_bias: bool, conv_bias: bool, prefix: str = "mixer") -> list[WeightPart]:
    """Mamba2Mixer: in_proj (z, x, B, C, dt), depthwise conv over x|B|C, dt_bias, A_log, D, gated norm, out_proj."""
    inter = heads * head_dim
    conv_dim = inter + 2 * groups * state
    p = prefix
    parts = base.linear(f"{p}.in_proj", hidden, inter + conv_dim + heads, bias=proj_bias, layer=layer)
    parts.append(WeightPart(f"{p}.conv1d", (conv_dim, 1, kernel), "other", "text", "column", layer))
    if conv_bias:
        parts.append(WeightPart(f"{p}.conv1d.bias", (conv_dim,), "bias", "text", "column", layer))
    for name in ("dt_bias", "A_log", "D"):
        parts.append(WeightPart(f"{p}.{name}", (heads,), "other", "text", "column", layer))
    parts += base.norm(f"{p}.norm", inter, layer=layer)
    parts += base.linear(f"{p}.out_proj", inter, hidden, bias=proj_bias, split="row", layer=layer)
    return parts


def mamba(top: Cfg, c: Cfg):
    """MambaForCausalLM: every layer a Mamba-1 mixer; state conv (intermediate x kernel) + SSM (intermediate x state)."""
    c.need_all(("num_hidden_layers", "n_layer"), "hidden_size", "vocab_size", "state_size", "conv_kernel")
    n, h, vocab = c.need_int("num_hidden_layers", "n_layer"), c.need_int("hidden_size"), c.need_int("vocab_size")
    inter = int(c.get("intermediate_size", default=int(c.get("expand", default=2)) * h))
    state, kernel = c.need_int("state_size"), c.need_int("conv_kernel")
    cache = MambaState(inter, kernel, (inter, state))
    weights = [base.embedding(vocab, h, "embeddings")]
    for i in range(n):
        weights += base.norm("norm", h, layer=i)
        weights += _mamba1_mixer(i, h, inter, state, kernel, _dt_rank(c, "time_step_rank", h),
                                 proj_bias=bool(c.get("use_bias", default=False)),
                                 conv_bias=bool(c.get("use_conv_bias", default=True)), prefix="mixer")
    weights += base.norm("norm_f", h)
    is_tied = base.tied(top, c, True)
    weights += base.lm_head(vocab, h, is_tied)
    return [(i, cache) for i in range(n)], weights, is_tied


def mamba2(top: Cfg, c: Cfg):
    """Mamba2ForCausalLM: every layer a Mamba-2 mixer."""
    c.need_all("num_hidden_layers", "hidden_size", "vocab_size", "state_size", "conv_kernel", "num_heads", "head_dim")
    n, h, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    heads, head_dim, state = c.need_int("num_heads"), c.need_int("head_dim"), c.need_int("state_size")
    groups, kernel = int(c.get("n_groups", default=1)), c.need_int("conv_kernel")
    cache = MambaState(heads * head_dim + 2 * groups * state, kernel, (heads, head_dim, state), groups)
    weights = [base.embedding(vocab, h, "embeddings")]
    for i in range(n):
        weights += base.norm("norm", h, layer=i)
        weights += _mamba2_mixer(i, h, heads, head_dim, groups, state, kernel,
                                 proj_bias=bool(c.get("use_bias", default=False)),
                                 conv_bias=bool(c.get("use_conv_bias", default=True)))
    weights += base.norm("norm_f", h)
    is_tied = base.tied(top, c, True)
    weights += base.lm_head(vocab, h, is_tied)
    return [(i, cache) for i in range(n)], weights, is_tied


def jamba(top: Cfg, c: Cfg):
    """JambaForCausalLM: attention where layer % attn_layer_period == attn_layer_offset, Mamba-1 elsewhere;
    MoE where layer % expert_layer_period == expert_layer_offset."""
    c.need_all("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads", "intermediate_size")
    n, h, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    a_period, a_offset = int(c.get("attn_layer_period", default=8)), int(c.get("attn_layer_offset", default=4))
    e_period, e_offset = int(c.get("expert_layer_period", default=2)), int(c.get("expert_layer_offset", default=1))
    experts, inter = int(c.get("num_experts", default=16)), c.need_int("intermediate_size")
    dims = base.attention_dims(c)
    m_inter = int(c.get("mamba_expand", default=2)) * h
    state, kernel = int(c.get("mamba_d_state", default=16)), int(c.get("mamba_d_conv", default=4))
    attn_cache, state_cache = FullAttention(dims.kv_heads, dims.head_dim, dims.head_dim), MambaState(m_inter, kernel, (m_inter, state))
    caches, weights = [], [base.embedding(vocab, h)]
    for i in range(n):
        if i % a_period == a_offset:
            caches.append((i, attn_cache))
            weights += base.attention_block(i, h, dims)
        else:
            caches.append((i, state_cache))
            weights += _mamba1_mixer(i, h, m_inter, state, kernel, _dt_rank(c, "mamba_dt_rank", h),
                                     proj_bias=bool(c.get("mamba_proj_bias", default=False)),
                                     conv_bias=bool(c.get("mamba_conv_bias", default=True)), prefix="mamba", inner_norms=True)
        if experts > 1 and i % e_period == e_offset:
            weights += base.router(i, h, experts, name="feed_forward.router")
            weights += base.experts(i, h, inter, experts, prefix="feed_forward.experts")
        else:
            weights += base.gated_mlp(i, h, inter, prefix="feed_forward")
        weights += base.norm("input_layernorm", h, layer=i) + base.norm("pre_ff_layernorm", h, layer=i)
    weights += base.norm("final_layernorm", h)
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, h, is_tied)
    return caches, weights, is_tied


_NEMOTRON_H_PATTERN = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
# layers_block_type names (transformers NemotronHConfig: legacy 'mamba' / 'attention' are remapped on load)
_NEMOTRON_H_BLOCKS = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention",
                      "full_attention": "attention", "mlp": "mlp", "moe": "moe"}


def _nemotron_h_kinds(c: Cfg) -> list[str]:
    """One mixer per layer: layers_block_type (Nemotron-3 Ultra; its length is the layer count, as transformers
    reads it) or the older hybrid_override_pattern string (M mamba2, * attention, - MLP, E MoE)."""
    blocks = c.raw.get("layers_block_type")
    if blocks is not None:
        if not isinstance(blocks, list) or not blocks or any(b not in _NEMOTRON_H_BLOCKS for b in blocks):
            raise ConfigError(f"{c.where}: layers_block_type must be a non-empty list of "
                              f"{', '.join(_NEMOTRON_H_BLOCKS)}, found {base.brief(blocks)}")
        return [_NEMOTRON_H_BLOCKS[b] for b in blocks]
    c.need_all("num_hidden_layers", "hybrid_override_pattern")
    n, pattern = c.need_int("num_hidden_layers"), c.need("hybrid_override_pattern")
    if not isinstance(pattern, str) or len(pattern) != n or set(pattern) - set(_NEMOTRON_H_PATTERN):
        found = f"{len(pattern)} characters" if isinstance(pattern, str) else base.brief(pattern)
        raise ConfigError(f"{c.where}: hybrid_override_pattern must have {n} characters from 'M*-E' (found {found})")
    return [_NEMOTRON_H_PATTERN[ch] for ch in pattern]


def _nemotron_h_moe(c: Cfg, layer: int, hidden: int) -> list[WeightPart]:
    """NemotronHMoE: a router, non-gated relu2 experts (up, down) working in moe_latent_size when set (with a
    replicated projection into and out of it: Nemotron-3 Super / Ultra's latent MoE), and a shared expert."""
    c.need_all("n_routed_experts", "moe_intermediate_size")
    n, inter = c.need_int("n_routed_experts"), c.need_int("moe_intermediate_size")
    latent = c.get("moe_latent_size", default=None)
    width = int(latent) if latent else hidden
    bias = bool(c.get("mlp_bias", default=False))
    parts = base.router(layer, hidden, n)
    parts += [WeightPart("mixer.experts.up_proj", (inter, width), "expert", "text", "expert", layer, n),
              WeightPart("mixer.experts.down_proj", (width, inter), "expert", "text", "expert", layer, n)]
    if latent:
        parts += base.linear("mixer.fc1_latent_proj", hidden, width, bias=bias, split="replicated", layer=layer)
        parts += base.linear("mixer.fc2_latent_proj", width, hidden, bias=bias, split="replicated", layer=layer)
    shared = int(c.get("moe_shared_expert_intermediate_size", default=0) or 0) * int(c.get("n_shared_experts", default=1) or 0)
    if shared:
        parts += base.plain_mlp(layer, hidden, shared, bias=bias, prefix="mixer.shared_experts", names=("up_proj", "down_proj"))
    return parts


def nemotron_h(top: Cfg, c: Cfg):
    """NemotronHForCausalLM (Nemotron-H, Nemotron-3 Nano / Super / Ultra): one mixer per layer -- Mamba-2, attention,
    an MLP or a MoE block. Only attention layers grow a KV cache; the multi-token-prediction layers
    (num_nextn_predict_layers) are not built by transformers nor loaded without speculative decoding."""
    c.need_all("hidden_size", "vocab_size", "num_attention_heads")
    h, vocab = c.need_int("hidden_size"), c.need_int("vocab_size")
    kinds = _nemotron_h_kinds(c)
    heads = c.need_int("num_attention_heads")
    head_dim = int(c.get("attention_head_dim", "head_dim", default=h // heads))
    dims = base.AttnDims(heads, int(c.get("num_key_value_heads", default=heads)), head_dim, head_dim)
    caches, weights = [], [base.embedding(vocab, h, "embeddings")]
    if "mamba" in kinds:
        c.need_all("mamba_num_heads", "mamba_head_dim", "ssm_state_size", "conv_kernel")
        m_heads, m_head_dim = c.need_int("mamba_num_heads"), c.need_int("mamba_head_dim")
        groups, state, kernel = int(c.get("n_groups", default=8)), c.need_int("ssm_state_size"), c.need_int("conv_kernel")
        state_cache = MambaState(m_heads * m_head_dim + 2 * groups * state, kernel, (m_heads, m_head_dim, state), groups)
    attn_cache = FullAttention(dims.kv_heads, head_dim, head_dim)
    bias = bool(c.get("attention_bias", default=False))
    for i, kind in enumerate(kinds):
        weights += base.norm("norm", h, layer=i)
        if kind == "mamba":
            caches.append((i, state_cache))
            weights += _mamba2_mixer(i, h, m_heads, m_head_dim, groups, state, kernel,
                                     proj_bias=bool(c.get("mamba_proj_bias", "use_bias", default=False)),
                                     conv_bias=bool(c.get("use_conv_bias", default=True)))
        elif kind == "attention":
            caches.append((i, attn_cache))
            weights += base.attention_block(i, h, dims, qkv_bias=bias, o_bias=bias, prefix="mixer")
        elif kind == "moe":
            caches.append((i, NoCache()))
            weights += _nemotron_h_moe(c, i, h)
        else:
            caches.append((i, NoCache()))
            weights += base.plain_mlp(i, h, c.need_int("intermediate_size"), bias=bool(c.get("mlp_bias", default=False)),
                                      prefix="mixer", names=("up_proj", "down_proj"))
    weights += base.norm("norm_f", h)
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, h, is_tied)
    return caches, weights, is_tied


@dataclass(frozen=True)
class _GatedDeltaNet:
    """The Gated DeltaNet linear-attention mixer of Qwen3-Next and Qwen3.5 (and its recurrent state)."""

    k_heads: int
    v_heads: int
    k_dim: int
    v_dim: int
    kernel: int

    @classmethod
    def of(cls, c: Cfg) -> "_GatedDeltaNet":
        return cls(int(c.get("linear_num_key_heads", default=16)), int(c.get("linear_num_value_heads", default=32)),
                   int(c.get("linear_key_head_dim", default=128)), int(c.get("linear_value_head_dim", default=128)),
                   int(c.get("linear_conv_kernel_dim", default=4)))

    @property
    def conv_dim(self) -> int:  # q, k and v go through the short convolution
        return 2 * self.k_heads * self.k_dim + self.v_heads * self.v_dim

    @property
    def cache(self) -> LinearAttentionState:
        return LinearAttentionState(self.conv_dim, self.kernel, self.v_heads, self.k_dim, self.v_dim)

    def weights(self, layer: int, hidden: int, *, split_projections: bool) -> list[WeightPart]:
        """in_proj_qkvz + in_proj_ba (Qwen3-Next) or in_proj_qkv, _z, _b, _a (Qwen3.5): the same parameters."""
        value_dim, i = self.v_heads * self.v_dim, layer
        if split_projections:
            parts = base.linear("linear_attn.in_proj_qkv", hidden, self.conv_dim, layer=i)
            parts += base.linear("linear_attn.in_proj_z", hidden, value_dim, layer=i)
            parts += base.linear("linear_attn.in_proj_b", hidden, self.v_heads, layer=i)
            parts += base.linear("linear_attn.in_proj_a", hidden, self.v_heads, layer=i)
        else:
            parts = base.linear("linear_attn.in_proj_qkvz", hidden, self.conv_dim + value_dim, layer=i)
            parts += base.linear("linear_attn.in_proj_ba", hidden, 2 * self.v_heads, layer=i)
        parts.append(WeightPart("linear_attn.conv1d", (self.conv_dim, 1, self.kernel), "other", "text", "column", i))
        parts += [WeightPart(f"linear_attn.{p}", (self.v_heads,), "other", "text", "column", i) for p in ("dt_bias", "A_log")]
        parts += base.norm("linear_attn.norm", self.v_dim, layer=i)
        parts += base.linear("linear_attn.out_proj", value_dim, hidden, split="row", layer=i)
        return parts


def _gated_full_attention(layer: int, hidden: int, dims: base.AttnDims) -> list[WeightPart]:
    """Gated full attention: q_proj also emits a per-head output gate; RMS q/k norms over head_dim."""
    i, hd = layer, dims.head_dim
    parts = base.linear("self_attn.q_proj", hidden, 2 * dims.heads * hd, layer=i)
    parts += base.linear("self_attn.k_proj", hidden, dims.kv_heads * hd, layer=i)
    parts += base.linear("self_attn.v_proj", hidden, dims.kv_heads * hd, layer=i)
    parts += base.linear("self_attn.o_proj", dims.heads * hd, hidden, split="row", layer=i)
    return parts + base.norm("self_attn.q_norm", hd, layer=i) + base.norm("self_attn.k_norm", hd, layer=i)


def _linear_and_full_kinds(c: Cfg, n: int) -> list[str]:
    kinds = base.kinds_from_layer_types(c, n)
    if kinds is None:
        interval = int(c.get("full_attention_interval", default=4))
        kinds = ["linear" if (i + 1) % interval else "full" for i in range(n)]
    return kinds


def _gdn_hybrid(top: Cfg, c: Cfg, *, split_projections: bool, moe_on_layer):
    """Gated DeltaNet except every full_attention_interval-th layer (gated full attention); the MLP of each layer
    from moe_on_layer(layer) -> number of experts (0: the dense MLP)."""
    n, h, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    dims, gdn = base.attention_dims(c), _GatedDeltaNet.of(c)
    full_cache = FullAttention(dims.kv_heads, dims.head_dim, dims.head_dim)
    caches, weights = [], [base.embedding(vocab, h)]
    for i, kind in enumerate(_linear_and_full_kinds(c, n)):
        if kind == "full":
            caches.append((i, full_cache))
            weights += _gated_full_attention(i, h, dims)
        else:
            caches.append((i, gdn.cache))
            weights += gdn.weights(i, h, split_projections=split_projections)
        experts = moe_on_layer(i)
        weights += base.qwen_moe_block(c, i, h, experts) if experts else base.gated_mlp(i, h, c.need_int("intermediate_size"))
        weights += base.decoder_layer_norms(i, h, 2)
    weights += base.norm("norm", h)
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, h, is_tied)
    return caches, weights, is_tied


def qwen3_next(top: Cfg, c: Cfg):
    """Qwen3NextForCausalLM: Gated DeltaNet + gated full attention; MoE with a gated shared expert where
    (layer + 1) % decoder_sparse_step == 0 and the layer is not in mlp_only_layers."""
    c.need_all("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads", "moe_intermediate_size")
    experts = int(c.get("num_experts", default=512))
    return _gdn_hybrid(top, c, split_projections=False,
                       moe_on_layer=lambda i: experts if base.qwen_moe_layer(c, i, experts) else 0)


def qwen3_5(top: Cfg, c: Cfg):
    """Qwen3_5ForConditionalGeneration / Qwen3_5MoeForConditionalGeneration (transformers models/qwen3_5,
    qwen3_5_moe): Qwen3-Next's layer pattern with separate in_proj_qkv/z/b/a projections; qwen3_5 has a dense MLP
    on every layer, qwen3_5_moe the sparse MoE block (router, experts, gated shared expert) on every layer.
    The multi-token-prediction layers (mtp_num_hidden_layers) are not built by transformers nor loaded by an engine
    without speculative decoding: left out."""
    c.need_all("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads")
    moe = str(c.get("model_type", default="")).startswith("qwen3_5_moe")
    if moe:
        c.need_all("num_experts", "moe_intermediate_size")
    else:
        c.need_all("intermediate_size")
    experts = c.need_int("num_experts") if moe else 0
    return _gdn_hybrid(top, c, split_projections=True, moe_on_layer=lambda i: experts)


# ---------------------------------------------------------------------------------------------- Granite-4.0-H, Bamba
def _ibm_mamba2(c: Cfg, hidden: int) -> tuple[int, int, int, int, int]:
    """The mamba_* fields GraniteMoeHybridConfig and BambaConfig share (transformers 5.24 class defaults): heads,
    head_dim ('auto' = mamba_expand * hidden // heads), groups, d_state, d_conv. Both engines size the mixer's inner
    width as mamba_expand * hidden and transformers refuses heads * head_dim != that width: so does kvplan."""
    heads, inner = int(c.get("mamba_n_heads", default=128)), int(c.get("mamba_expand", default=2)) * hidden
    head_dim = c.get("mamba_d_head", default="auto")
    head_dim = inner // heads if head_dim == "auto" else int(head_dim)
    if heads * head_dim != inner:
        raise ConfigError(f"{c.where}: mamba_n_heads {heads} x mamba_d_head {head_dim} must equal mamba_expand x "
                          f"hidden_size = {inner} (transformers refuses such a config)")
    return (heads, head_dim, int(c.get("mamba_n_groups", default=1)), int(c.get("mamba_d_state", default=256)),
            int(c.get("mamba_d_conv", default=4)))


def _ibm_hybrid_layers(c: Cfg, hidden: int, mixer_prefix: str):
    """Per layer: a Mamba-2 mixer (MambaState) or attention (FullAttention) and its weights; the rest of the
    decoder layer is the caller's."""
    heads, head_dim, groups, state, kernel = _ibm_mamba2(c, hidden)
    state_cache = MambaState(heads * head_dim + 2 * groups * state, kernel, (heads, head_dim, state), groups)
    proj_bias, conv_bias = bool(c.get("mamba_proj_bias", default=False)), bool(c.get("mamba_conv_bias", default=True))

    def mamba_layer(i: int):
        return state_cache, _mamba2_mixer(i, hidden, heads, head_dim, groups, state, kernel, proj_bias=proj_bias,
                                          conv_bias=conv_bias, prefix=mixer_prefix)
    return mamba_layer


_GRANITE_HYBRID_BLOCKS = {"mamba": "mamba", "linear_attention": "mamba", "attention": "attention",
                          "full_attention": "attention"}


def granite_hybrid(top: Cfg, c: Cfg):
    """GraniteMoeHybridForCausalLM (Granite-4.0-H and Granite-4.0 dense): layer_types (legacy mamba / attention,
    remapped by transformers to linear_attention / full_attention; required, as the engines' defaults differ)
    picks a Mamba-2 mixer or attention; every layer then has a MoE block when num_local_experts > 0 (router +
    gated experts of intermediate_size) and the gated shared_mlp of shared_intermediate_size (vLLM builds none at 0,
    transformers an empty one: no weights either way). Attention head_dim is hidden_size / heads in vLLM
    (models/granitemoehybrid.py), which ignores a head_dim key; transformers reads one: refused when they differ."""
    c.need_all("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads")
    n, h, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    blocks = c.raw.get("layer_types")
    if blocks is None:
        raise ConfigError(f"{c.where}: a granitemoehybrid config needs layer_types: without it transformers and vLLM "
                          "make every layer Mamba-2 and SGLang every 6th layer attention")
    if not isinstance(blocks, list) or len(blocks) != n or any(b not in _GRANITE_HYBRID_BLOCKS for b in blocks):
        found = f"{len(blocks)} entries" if isinstance(blocks, list) and len(blocks) != n else base.brief(blocks)
        raise ConfigError(f"{c.where}: layer_types must list {n} of {', '.join(_GRANITE_HYBRID_BLOCKS)}, found {found}")
    heads = c.need_int("num_attention_heads")
    head_dim = h // heads
    if c.get("head_dim") is not None and int(c.get("head_dim")) != head_dim:
        raise ConfigError(f"{c.where}: head_dim {c.get('head_dim')} differs from hidden_size / num_attention_heads = "
                          f"{head_dim}, which vLLM's GraniteMoeHybrid attention uses (transformers reads head_dim): "
                          "the engines would build different models")
    dims = base.AttnDims(heads, int(c.get("num_key_value_heads", default=heads)), head_dim, head_dim)
    attn_cache = FullAttention(dims.kv_heads, head_dim, head_dim)
    bias = bool(c.get("attention_bias", default=False))
    experts, shared = int(c.get("num_local_experts", default=8)), int(c.get("shared_intermediate_size", default=1024))
    inter = int(c.get("intermediate_size", default=11008))
    mamba_layer = _ibm_hybrid_layers(c, h, "mamba") if "mamba" in {_GRANITE_HYBRID_BLOCKS[b] for b in blocks} else None
    caches, weights = [], [base.embedding(vocab, h)]
    for i, b in enumerate(blocks):
        if _GRANITE_HYBRID_BLOCKS[b] == "mamba":
            cache, parts = mamba_layer(i)
            caches.append((i, cache))
            weights += parts
        else:
            caches.append((i, attn_cache))
            weights += base.attention_block(i, h, dims, qkv_bias=bias, o_bias=bias)
        if experts > 0:
            weights += base.router(i, h, experts, name="block_sparse_moe.router")
            weights += base.experts(i, h, inter, experts, prefix="block_sparse_moe.experts")
        if shared:
            weights += base.linear("shared_mlp.input_linear", h, 2 * shared, layer=i)
            weights += base.linear("shared_mlp.output_linear", shared, h, split="row", layer=i)
        weights += base.decoder_layer_norms(i, h, 2)
    weights += base.norm("norm", h)
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, h, is_tied)
    return caches, weights, is_tied


def _lfm2_kinds(c: Cfg, n: int) -> list[str]:
    """Lfm2Config.__post_init__: layer_types when given (a layer is attention unless "conv": Lfm2DecoderLayer), else
    full_attention on full_attn_idxs (every layer when absent) and conv elsewhere."""
    types = c.raw.get("layer_types")
    if types is None:
        idxs = c.raw.get("full_attn_idxs")
        idxs = set(range(n)) if idxs is None else set(idxs)
        return ["full" if i in idxs else "conv" for i in range(n)]
    if not isinstance(types, list) or len(types) != n or any(t not in ("conv", "full_attention") for t in types):
        found = f"{len(types)} entries" if isinstance(types, list) else base.brief(types)
        raise ConfigError(f"{c.where}: layer_types must list 'conv' or 'full_attention' for each of the {n} layers "
                          f"(found {found})")
    return ["conv" if t == "conv" else "full" for t in types]


def _lfm2_ffn(c: Cfg, hidden: int) -> int:
    """Lfm2MLP's width: block_ff_dim (or intermediate_size), cut to 2/3, times block_ffn_dim_multiplier, rounded up
    to block_multiple_of when block_auto_adjust_ff_dim. transformers rounds only when the multiplier is set, vLLM
    (models/lfm2.py Lfm2MLP) always: a config where that differs is refused."""
    inter = int(c.get("block_ff_dim", "intermediate_size", default=12288))
    if not c.get("block_auto_adjust_ff_dim", default=True):
        return inter
    inter = int(2 * inter / 3)
    of = int(c.get("block_multiple_of", default=256))
    mult = c.raw["block_ffn_dim_multiplier"] if "block_ffn_dim_multiplier" in c.raw else 1.0  # null is meant
    if mult is None:
        if inter % of:
            raise ConfigError(f"{c.where}: block_ffn_dim_multiplier null: transformers keeps the MLP width {inter}, "
                              f"vLLM rounds it up to a multiple of {of}; kvplan does not pick one")
        return inter
    inter = int(mult * inter)
    return of * ((inter + of - 1) // of)


def _lfm2_moe_mlp(c: Cfg, layer: int, hidden: int) -> list[WeightPart]:
    """Lfm2MoeSparseMoeBlock (transformers models/lfm2_moe; vLLM Lfm2MoeSparseMoeBlock): a router, its fp32
    expert_bias when use_expert_bias (a persistent buffer in transformers, gate.e_score_correction_bias in vLLM: in
    the checkpoint either way) and num_experts gated experts of moe_intermediate_size."""
    c.need_all("num_experts", "moe_intermediate_size")
    n, inter = c.need_int("num_experts"), c.need_int("moe_intermediate_size")
    parts = base.router(layer, hidden, n, name="feed_forward.gate")
    if c.get("use_expert_bias", default=True):
        parts.append(WeightPart("feed_forward.expert_bias", (n,), "other", "text", "replicated", layer))
    return parts + base.experts(layer, hidden, inter, n, prefix="feed_forward.experts")


def lfm2(top: Cfg, c: Cfg):
    """Lfm2ForCausalLM / Lfm2MoeForCausalLM: each layer an attention block (q/k RMS norms over head_dim) or a gated short convolution
    (in_proj to B, C, x; depthwise conv of conv_L_cache taps; out_proj), then a SwiGLU MLP (w1, w3, w2); only the
    attention layers grow a KV cache, a conv layer keeps conv_L_cache - 1 inputs (vLLM short_conv_state_shape). The
    conv width is conv_dim and the MLP's block_dim in vLLM (both read from the config, which must carry them), hidden_size
    in transformers: refused where they differ. lfm2_moe convolves hidden_size channels in both, has no
    full_attn_idxs (layer_types is required), and puts a plain SwiGLU of intermediate_size on the first
    num_dense_layers layers, the sparse MoE block on the rest."""
    c.need_all("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads")
    moe = str(c.get("model_type", default="")) == "lfm2_moe"
    if moe:
        c.need_all("layer_types")
    n, h, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    heads = c.need_int("num_attention_heads")
    head_dim = h // heads  # vLLM Lfm2Attention: hidden_size // num_attention_heads
    if int(c.get("head_dim", default=head_dim)) != head_dim:
        raise ConfigError(f"{c.where}: head_dim {c.get('head_dim')} differs from hidden_size / num_attention_heads "
                          f"({head_dim}): transformers reads head_dim, vLLM the quotient")
    conv_dim = h if moe else int(c.get("conv_dim", default=h))
    if conv_dim != h:
        raise ConfigError(f"{c.where}: conv_dim {conv_dim} differs from hidden_size {h}: vLLM convolves conv_dim "
                          "channels, transformers hidden_size")
    if not moe and int(c.get("block_dim", default=h)) != h:
        raise ConfigError(f"{c.where}: block_dim {c.get('block_dim')} differs from hidden_size {h}: vLLM builds the "
                          "MLP on block_dim, transformers on hidden_size")
    dims = base.AttnDims(heads, int(c.get("num_key_value_heads", default=heads)), head_dim, head_dim)
    kernel, conv_bias = int(c.get("conv_L_cache", default=3)), bool(c.get("conv_bias", default=False))
    ffn = c.need_int("intermediate_size") if moe else _lfm2_ffn(c, h)
    dense_layers = int(c.get("num_dense_layers", default=2)) if moe else n
    attn_cache, conv_cache = FullAttention(dims.kv_heads, head_dim, head_dim), ShortConvState(conv_dim, kernel)
    caches, weights = [], [base.embedding(vocab, h)]
    for i, kind in enumerate(_lfm2_kinds(c, n)):
        if kind == "full":
            caches.append((i, attn_cache))
            weights += base.linear("self_attn.q_proj", h, heads * head_dim, layer=i)
            weights += base.linear("self_attn.k_proj", h, dims.kv_heads * head_dim, layer=i)
            weights += base.linear("self_attn.v_proj", h, dims.kv_heads * head_dim, layer=i)
            weights += base.linear("self_attn.out_proj", heads * head_dim, h, split="row", layer=i)
            weights += base.norm("self_attn.q_layernorm", head_dim, layer=i) + base.norm("self_attn.k_layernorm", head_dim, layer=i)
        else:
            caches.append((i, conv_cache))
            weights += base.linear("conv.in_proj", h, 3 * conv_dim, bias=conv_bias, layer=i)
            weights.append(WeightPart("conv.conv", (conv_dim, 1, kernel), "other", "text", "column", i))
            if conv_bias:
                weights.append(WeightPart("conv.conv.bias", (conv_dim,), "bias", "text", "column", i))
            weights += base.linear("conv.out_proj", conv_dim, h, bias=conv_bias, split="row", layer=i)
        if i < dense_layers:
            weights += base.linear("feed_forward.w1", h, ffn, layer=i) + base.linear("feed_forward.w3", h, ffn, layer=i)
            weights += base.linear("feed_forward.w2", ffn, h, split="row", layer=i)
        else:
            weights += _lfm2_moe_mlp(c, i, h)
        weights += base.norm("operator_norm", h, layer=i) + base.norm("ffn_norm", h, layer=i)
    weights += base.norm("embedding_norm", h)
    is_tied = bool(c.get("tie_embedding", default=base.tied(top, c, True)))
    weights += base.lm_head(vocab, h, is_tied)
    return caches, weights, is_tied


def bamba(top: Cfg, c: Cfg):
    """BambaForCausalLM (transformers models/bamba): attention on the layers listed in attn_layer_indices, Mamba-2
    elsewhere (none listed: every layer Mamba-2); a gated MLP (mlp_bias) on every layer. KV heads: 8 when the key is
    absent, num_attention_heads when null (BambaConfig), head_dim is a head_dim key else hidden_size / heads."""
    c.need_all("hidden_size", "vocab_size", "num_hidden_layers", "num_attention_heads", "intermediate_size")
    n, h, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    attn = c.raw.get("attn_layer_indices") or []
    if any(not 0 <= i < n for i in attn):
        raise ConfigError(f"{c.where}: attn_layer_indices must name layers 0..{n - 1}, found {base.brief(attn)}")
    heads = c.need_int("num_attention_heads")
    head_dim = int(c.get("head_dim", default=h // heads))
    kv = c.raw.get("num_key_value_heads", 8)  # BambaConfig: absent = 8, null = num_attention_heads
    dims = base.AttnDims(heads, heads if kv is None else int(kv), head_dim, head_dim)
    attn_cache = FullAttention(dims.kv_heads, head_dim, head_dim)
    bias, mlp_bias = bool(c.get("attention_bias", default=False)), bool(c.get("mlp_bias", default=False))
    inter = c.need_int("intermediate_size")
    mamba_layer = _ibm_hybrid_layers(c, h, "mamba") if len(set(attn)) < n else None
    caches, weights = [], [base.embedding(vocab, h)]
    for i in range(n):
        if i in attn:
            caches.append((i, attn_cache))
            weights += base.attention_block(i, h, dims, qkv_bias=bias, o_bias=bias)
        else:
            cache, parts = mamba_layer(i)
            caches.append((i, cache))
            weights += parts
        weights += base.gated_mlp(i, h, inter, bias=mlp_bias, prefix="feed_forward")
        weights += base.norm("input_layernorm", h, layer=i) + base.norm("pre_ff_layernorm", h, layer=i)
    weights += base.norm("final_layernorm", h)
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, h, is_tied)
    return caches, weights, is_tied


def falcon_h1(top: Cfg, c: Cfg):
    """FalconH1ForCausalLM: every layer runs attention and a Mamba-2 mixer side by side (then a SwiGLU MLP), so each
    layer holds a KV cache and a Mamba-2 state. mamba_d_ssm is FalconH1Config's 1024 when absent and
    mamba_expand x hidden_size when null; mamba_d_head "auto" is d_ssm / mamba_n_heads. The mu-P multipliers scale
    activations only (mup_vector is a non-persistent buffer): no weights, no cache. Biases vLLM 0.32 does not build
    (models/falcon_h1.py: qkv/o and MLP bias-free, the mixer's out_proj biased by mamba_proj_bias where transformers
    reads projectors_bias) are refused."""
    c.need_all("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads")
    n, h, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    for key in ("attention_bias", "mlp_bias"):
        if c.get(key, default=False):
            raise ConfigError(f"{c.where}: {key} true: transformers builds those biases, vLLM's Falcon-H1 does not")
    proj_bias = bool(c.get("mamba_proj_bias", default=False))
    if bool(c.get("projectors_bias", default=False)) != proj_bias:
        raise ConfigError(f"{c.where}: projectors_bias differs from mamba_proj_bias: the mixer's out_proj bias follows "
                          "projectors_bias in transformers, mamba_proj_bias in vLLM")
    heads = c.need_int("num_attention_heads")
    dims = base.AttnDims(heads, int(c.get("num_key_value_heads", default=heads)),
                         int(c.get("head_dim", default=h // heads)), int(c.get("head_dim", default=h // heads)))
    d_ssm = c.raw["mamba_d_ssm"] if "mamba_d_ssm" in c.raw else 1024
    d_ssm = int(c.get("mamba_expand", default=2)) * h if d_ssm is None else int(d_ssm)
    m_heads = int(c.get("mamba_n_heads", default=128))
    m_head = c.get("mamba_d_head", default="auto")
    m_head = d_ssm // m_heads if m_head == "auto" else int(m_head)
    if m_heads * m_head != d_ssm:
        raise ConfigError(f"{c.where}: mamba_n_heads {m_heads} x mamba_d_head {m_head} is not mamba_d_ssm {d_ssm} "
                          "(FalconH1Config.validate_architecture)")
    groups, state = int(c.get("mamba_n_groups", default=1)), int(c.get("mamba_d_state", default=256))
    kernel = int(c.get("mamba_d_conv", default=4))
    attn_cache = FullAttention(dims.kv_heads, dims.head_dim, dims.head_dim)
    state_cache = MambaState(d_ssm + 2 * groups * state, kernel, (m_heads, m_head, state), groups)
    inter = c.need_int("intermediate_size")
    caches, weights = [], [base.embedding(vocab, h)]
    for i in range(n):
        caches += [(i, attn_cache), (i, state_cache)]
        weights += base.attention_block(i, h, dims)
        mixer = _mamba2_mixer(i, h, m_heads, m_head, groups, state, kernel, proj_bias=proj_bias,
                              conv_bias=bool(c.get("mamba_conv_bias", default=True)), prefix="mamba")
        if not c.get("mamba_rms_norm", default=False):
            mixer = [w for w in mixer if w.name != "mamba.norm"]
        weights += mixer
        weights += base.gated_mlp(i, h, inter, prefix="feed_forward")
        weights += base.norm("input_layernorm", h, layer=i) + base.norm("pre_ff_layernorm", h, layer=i)
    weights += base.norm("final_layernorm", h)
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, h, is_tied)
    return caches, weights, is_tied
