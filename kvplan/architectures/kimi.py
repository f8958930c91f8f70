"""Kimi Linear and Kimi-K3 (model_type kimi_linear, Kimi-K3's nested text_config): Kimi Delta Attention (KDA, a
gated delta-rule linear attention with q/k/v short convolutions) interleaved with MLA layers.

Which layers are KDA: `linear_attn_config.kda_layers`, 1-based (vLLM transformers_utils/configs/kimi_linear.py
is_kda_layer: `(layer_idx + 1) in kda_layers`; transformers' KimiLinearConfig: `layer_types[layer - 1]`); every other
layer is MLA (vLLM builds MLA for any layer not in kda_layers; full_attn_layers must name exactly those).
Weights as vLLM 0.32's models/kimi_k3 builds them (the checkpoint's tensors): Kimi-Linear's KDA
(model_executor/layers/mamba/gdn/kimi_gdn_linear_attn.py KimiGatedDeltaNetAttention) has low-rank f and g gates;
Kimi-K3's (use_full_rank_gate: models/kimi_k3/nvidia/kda.py KimiK3DeltaAttention) a full-rank g. MLA
(models/kimi_k3/nvidia/mla.py) adds an output gate (mla_use_output_gate). The MoE (model.py KimiMoE) routes in
routed_expert_hidden_size when set (latent MoE: replicated down/up projections and an optional norm); Kimi-K3's
Attention Residuals (attn_res_block_size) add two norms and two 1-wide projections per layer.
"""

from __future__ import annotations

from kvplan.architectures import base
from kvplan.architectures.base import Cfg
from kvplan.errors import ConfigError
from kvplan.spec import KimiDeltaState, LatentAttention, WeightPart


def _layer_is_kda(c: Cfg, n: int) -> list[bool]:
    """kda_layers (1-based) -> one flag per layer; full_attn_layers must be the rest (both lists are read by the
    engines, and a config where they disagree has no single reading)."""
    lac = c.get("linear_attn_config")
    if not isinstance(lac, dict) or not isinstance(lac.get("kda_layers"), list) \
            or not isinstance(lac.get("full_attn_layers"), list):
        raise ConfigError(f"{c.where}: linear_attn_config must be an object with kda_layers and full_attn_layers "
                          "lists (1-based layer numbers)")
    kda, full = lac["kda_layers"], lac["full_attn_layers"]
    if any(isinstance(i, bool) or not isinstance(i, int) or not 1 <= i <= n for i in [*kda, *full]):
        raise ConfigError(f"{c.where}: linear_attn_config.kda_layers / full_attn_layers must be layer numbers from 1 "
                          f"to num_hidden_layers ({n}), found {base.brief(kda)} / {base.brief(full)}")
    if sorted([*kda, *full]) != list(range(1, n + 1)):
        raise ConfigError(f"{c.where}: linear_attn_config.kda_layers and full_attn_layers must together name each of "
                          f"the {n} layers once (1-based)")
    kda_set = set(kda)
    return [i + 1 in kda_set for i in range(n)]


def _kda_geometry(c: Cfg) -> tuple[int, int, int, bool, float | None]:
    lac = c.sub("linear_attn_config")
    lac.need_all("num_heads", "head_dim", "short_conv_kernel_size")
    bound = lac.get("gate_lower_bound")
    return (lac.need_int("num_heads"), lac.need_int("head_dim"), lac.need_int("short_conv_kernel_size"),
            bool(lac.get("use_full_rank_gate", default=False)), None if bound is None else float(bound))


def _kda(layer: int, hidden: int, heads: int, head_dim: int, kernel: int, full_rank_gate: bool) -> list[WeightPart]:
    """KDA's projections: q, k, v (and Kimi-K3's full-rank output gate g), the decay gate f_a -> f_b, beta (b),
    Kimi-Linear's low-rank output gate g_a -> g_b, the three depthwise convolutions, A_log (per head), dt_bias (per
    channel), the gated output norm (head_dim) and o_proj. f_a and g_a are replicated on every TP rank."""
    proj, i = heads * head_dim, layer

    def lin(name, d_in, d_out, split="column"):
        return base.linear(f"self_attn.{name}", d_in, d_out, split=split, layer=i)

    parts = lin("q_proj", hidden, proj) + lin("k_proj", hidden, proj) + lin("v_proj", hidden, proj)
    parts += lin("b_proj", hidden, heads)
    parts += lin("f_a_proj", hidden, head_dim, "replicated") + lin("f_b_proj", head_dim, proj)
    if full_rank_gate:
        parts += lin("g_proj", hidden, proj)
    else:
        parts += lin("g_a_proj", hidden, head_dim, "replicated") + lin("g_b_proj", head_dim, proj)
    parts += [WeightPart(f"self_attn.{x}_conv1d", (proj, 1, kernel), "other", "text", "column", i) for x in "qkv"]
    parts += [WeightPart("self_attn.A_log", (heads,), "other", "text", "column", i),
              WeightPart("self_attn.dt_bias", (proj,), "other", "text", "column", i)]
    parts += base.norm("self_attn.o_norm", head_dim, layer=i)
    return parts + lin("o_proj", proj, hidden, "row")


def _mla(c: Cfg, layer: int, hidden: int) -> list[WeightPart]:
    """MultiHeadLatentAttention: q_proj (Kimi-Linear) or q_a -> q_a_layernorm -> q_b (q_lora_rank), the replicated
    kv_a projection to latent + rope, kv_a_layernorm, kv_b, o_proj, and with mla_use_output_gate a per-head-channel
    gate of heads x v_head_dim."""
    heads, nope, rope, v = (c.need_int(k) for k in ("num_attention_heads", "qk_nope_head_dim", "qk_rope_head_dim",
                                                    "v_head_dim"))
    kv_lora, q_lora = c.need_int("kv_lora_rank"), c.get("q_lora_rank")

    def lin(name, d_in, d_out, split="column"):
        return base.linear(f"self_attn.{name}", d_in, d_out, split=split, layer=layer)

    if q_lora:
        parts = lin("q_a_proj", hidden, int(q_lora), "replicated") + base.norm("self_attn.q_a_layernorm", int(q_lora), layer=layer)
        parts += lin("q_b_proj", int(q_lora), heads * (nope + rope))
    else:
        parts = lin("q_proj", hidden, heads * (nope + rope))
    parts += lin("kv_a_proj_with_mqa", hidden, kv_lora + rope, "replicated")
    parts += base.norm("self_attn.kv_a_layernorm", kv_lora, layer=layer)
    parts += lin("kv_b_proj", kv_lora, heads * (nope + v))
    if c.get("mla_use_output_gate"):
        parts += lin("g_proj", hidden, heads * v)
    return parts + lin("o_proj", heads * v, hidden, "row")


def _moe(c: Cfg, layer: int, hidden: int) -> list[WeightPart]:
    """KimiMoE: router (+ e_score_correction_bias), gated experts of moe_intermediate_size working in
    routed_expert_hidden_size when set (with replicated down/up projections and, with latent_moe_use_norm, an RMS
    norm between), and num_shared_experts x moe_intermediate_size of gated shared expert at the full width."""
    c.need_all("num_experts", "moe_intermediate_size")
    n, inter = c.need_int("num_experts"), c.need_int("moe_intermediate_size")
    latent = c.get("routed_expert_hidden_size")
    width = int(latent) if latent else hidden
    parts = base.router(layer, hidden, n, name="block_sparse_moe.gate")
    parts.append(WeightPart("block_sparse_moe.gate.e_score_correction_bias", (n,), "other", "text", "replicated", layer))
    parts += base.experts(layer, width, inter, n, prefix="block_sparse_moe.experts")
    if latent:
        parts += base.linear("block_sparse_moe.routed_expert_down_proj", hidden, width, split="replicated", layer=layer)
        if c.get("latent_moe_use_norm"):
            parts += base.norm("block_sparse_moe.routed_expert_norm", width, layer=layer)
        parts += base.linear("block_sparse_moe.routed_expert_up_proj", width, hidden, split="replicated", layer=layer)
    shared = int(c.get("num_shared_experts", default=0) or 0)
    if shared:
        parts += base.gated_mlp(layer, hidden, inter * shared, prefix="block_sparse_moe.shared_experts")
    return parts


def _attn_res(layer: int | None, hidden: int, names: tuple[str, ...]) -> list[WeightPart]:
    """Attention Residuals: an RMS norm and a 1-wide replicated projection per named stream."""
    parts: list[WeightPart] = []
    for name in names:
        parts += base.norm(f"{name}_res_norm", hidden, layer=layer)
        parts += base.linear(f"{name}_res_proj", hidden, 1, split="replicated", layer=layer)
    return parts


def build(top: Cfg, c: Cfg):
    c.need_all("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads", "kv_lora_rank",
               "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim", "intermediate_size")
    n, hidden, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    is_kda = _layer_is_kda(c, n)
    heads, head_dim, kernel, full_rank_gate, bound = _kda_geometry(c)
    kda_cache = KimiDeltaState(3 * heads * head_dim, kernel, heads, head_dim, head_dim,
                               full_rank_gate=full_rank_gate, gate_lower_bound=bound)
    mla_cache = LatentAttention(c.need_int("kv_lora_rank"), c.need_int("qk_rope_head_dim"),
                                c.need_int("num_attention_heads"), c.need_int("qk_nope_head_dim"), c.need_int("v_head_dim"))
    moe = c.get("num_experts") is not None
    first_dense, freq = int(c.get("first_k_dense_replace", default=0)), int(c.get("moe_layer_freq", default=1) or 1)
    attn_res = c.get("attn_res_block_size") is not None
    caches, weights = [], [base.embedding(vocab, hidden)]
    for i in range(n):
        if is_kda[i]:
            caches.append((i, kda_cache))
            weights += _kda(i, hidden, heads, head_dim, kernel, full_rank_gate)
        else:
            caches.append((i, mla_cache))
            weights += _mla(c, i, hidden)
        if moe and i >= first_dense and i % freq == 0:  # KimiDecoderLayer.is_moe_layer
            weights += _moe(c, i, hidden)
        else:
            weights += base.gated_mlp(i, hidden, c.need_int("intermediate_size"))
        weights += base.decoder_layer_norms(i, hidden, 2)
        if attn_res:
            weights += _attn_res(i, hidden, ("self_attention", "mlp"))
    weights += base.norm("norm", hidden)
    if attn_res:
        weights += _attn_res(None, hidden, ("output_attn",))
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, hidden, is_tied)
    return caches, weights, is_tied
