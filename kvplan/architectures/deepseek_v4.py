"""DeepSeek-V4 (model_type deepseek_v4; sgl-project's FP8 copies say deepseek_ref): recognised by
`compress_ratios`, the field no other family carries.

Every layer attends over a 128-token sliding window of one 512-wide vector that is both K and V (single KV head,
head_dim = nope + rope). `compress_ratios[i]` adds, per layer: 0 nothing; 4 compressed sparse attention (one entry
per 4 tokens, a lightning indexer keeping one key per 4 tokens, fp32 compressor states for the overlapping
entries); 128 heavy compression (one entry per 128 tokens). The list has one entry more than the layers: the MTP
layer's (0). Weights follow transformers 5.24 modeling_deepseek_v4.py (its meta-device count is the test's oracle):
grouped low-rank output projection (o_groups x o_lora_rank), attention sinks, manifold-constrained
hyper-connections (hc_mult residual streams, fp32), MoE on every layer (the first num_hash_layers route by a token
table), MTP layers as part "mtp" (transformers does not build them; vLLM and the checkpoint do).
Stored dtypes (quantization_config fp8 with ue8m0 block scales, `expert_dtype: fp4` MXFP4 experts; fp32 for
hyper-connections, sinks and compressor position biases; bf16 for compressor and indexer gate/kv projections,
which vLLM builds unquantized) are set per part here.
"""

from __future__ import annotations

from kvplan.architectures import base
from kvplan.architectures.base import Cfg
from kvplan.errors import ConfigError
from kvplan.spec import CompressedIndexerKeys, CompressedLatent, CompressorState, SlidingLatent, WeightPart

RATIOS = (0, 4, 128)


def is_deepseek_v4(c: Cfg) -> bool:
    """Both of V4's own fields: the per-layer compression and the hyper-connection streams."""
    return c.get("compress_ratios") is not None and c.get("hc_mult") is not None


def ratios(c: Cfg, n: int) -> list[int]:
    r = c.need("compress_ratios")
    if not isinstance(r, list) or len(r) < n or any(x not in RATIOS for x in r[:n]):
        raise ConfigError(f"{c.where}: compress_ratios must give 0, 4 or 128 for each of the {n} layers")
    return [int(x) for x in r[:n]]


def _fp32(name: str, shape: tuple[int, ...], layer: int | None, split: str = "replicated") -> WeightPart:
    n = 1
    for d in shape:
        n *= d
    return WeightPart(name, shape, "other", "text", split, layer, stored_bytes=4 * n)


def _unquantized(name: str, d_in: int, d_out: int, layer: int) -> WeightPart:
    """A projection vLLM builds with quant_config=None (compressor fused_wkv_wgate, indexer weights_proj)."""
    return WeightPart(name, (d_out, d_in), "other", "text", "replicated", layer)


def _compressor(prefix: str, hidden: int, dim: int, ratio: int, layer: int) -> list[WeightPart]:
    """DeepseekV4HCACompressor (ratio 128) / CSACompressor (ratio 4: two overlapping entries, so 2 x dim)."""
    width = dim * (2 if ratio == 4 else 1)
    return [_unquantized(f"{prefix}.kv_proj", hidden, width, layer), _unquantized(f"{prefix}.gate_proj", hidden, width, layer),
            _fp32(f"{prefix}.position_bias", (ratio if ratio == 4 else 128, width), layer),
            *base.norm(f"{prefix}.kv_norm", dim, layer=layer)]


def _attention(c: Cfg, layer: int, hidden: int, ratio: int) -> list[WeightPart]:
    heads, dim, q_lora = c.need_int("num_attention_heads"), c.need_int("head_dim"), c.need_int("q_lora_rank")
    groups, o_lora = c.need_int("o_groups"), c.need_int("o_lora_rank")
    p = "self_attn"
    parts = (base.linear(f"{p}.q_a_proj", hidden, q_lora, split="replicated", layer=layer)
             + base.norm(f"{p}.q_a_norm", q_lora, layer=layer)
             + base.linear(f"{p}.q_b_proj", q_lora, heads * dim, layer=layer)
             + base.linear(f"{p}.kv_proj", hidden, dim, split="replicated", layer=layer)
             + base.norm(f"{p}.kv_norm", dim, layer=layer)
             + [WeightPart(f"{p}.o_a_proj", (groups * o_lora, heads * dim // groups), "linear", "text", "column", layer)]
             + base.linear(f"{p}.o_b_proj", groups * o_lora, hidden, split="row", layer=layer)
             + [_fp32(f"{p}.sinks", (heads,), layer, "column")])
    if ratio:
        parts += _compressor(f"{p}.compressor", hidden, dim, ratio, layer)
    if ratio == 4:
        ih, idim = c.need_int("index_n_heads"), c.need_int("index_head_dim")
        parts += _compressor(f"{p}.compressor.indexer", hidden, idim, 4, layer)
        parts += base.linear(f"{p}.compressor.indexer.q_b_proj", q_lora, ih * idim, split="replicated", layer=layer)
        parts += [_unquantized(f"{p}.compressor.indexer.weights_proj", hidden, ih, layer)]
    return parts


def _hyper_connection(name: str, hidden: int, mult: int, layer: int | None, *, head: bool = False) -> list[WeightPart]:
    """DeepseekV4HyperConnection (fn [(2 + N) N, N h], base, scale [3]) or, for the head, DeepseekV4HyperHead
    (fn [N, N h], base [N], scale [1]); all fp32."""
    mixes = mult if head else (2 + mult) * mult
    return [_fp32(f"{name}.fn", (mixes, mult * hidden), layer), _fp32(f"{name}.base", (mixes,), layer),
            _fp32(f"{name}.scale", (1 if head else 3,), layer)]


def _layer(c: Cfg, layer: int, hidden: int, ratio: int, *, router_bias: bool) -> list[WeightPart]:
    experts, inter = c.need_int("n_routed_experts"), c.need_int("moe_intermediate_size")
    shared = int(c.get("n_shared_experts", default=1) or 0)
    mult = c.need_int("hc_mult")
    parts = _attention(c, layer, hidden, ratio)
    parts += base.router(layer, hidden, experts, bias=router_bias) + base.experts(layer, hidden, inter, experts)
    if shared:
        parts += base.gated_mlp(layer, hidden, inter * shared, prefix="mlp.shared_experts")
    parts += _hyper_connection("attn_hc", hidden, mult, layer) + _hyper_connection("ffn_hc", hidden, mult, layer)
    return parts + base.decoder_layer_norms(layer, hidden, 2)


def caches_of(c: Cfg, layer: int, ratio: int) -> list:
    """One layer's caches, in the order vLLM registers them (attention.py: the indexer's, the window, the
    compressed latent, the compressor state)."""
    dim, rope, window = c.need_int("head_dim"), c.need_int("qk_rope_head_dim"), c.need_int("sliding_window")
    out = []
    if ratio == 4:
        idim = c.need_int("index_head_dim")
        out += [CompressedIndexerKeys(idim, ratio), CompressorState(2 * 2 * idim, 2 * ratio, ratio)]
    out.append(SlidingLatent(dim, rope, window))
    if ratio:
        overlap = 2 if ratio == 4 else 1
        out += [CompressedLatent(dim, rope, 0, ratio), CompressorState(2 * overlap * dim, overlap * ratio, ratio)]
    return [(layer, x) for x in out]


def build(top: Cfg, c: Cfg):
    c.need_all("num_hidden_layers", "hidden_size", "vocab_size", "num_attention_heads", "head_dim", "q_lora_rank",
               "o_groups", "o_lora_rank", "n_routed_experts", "moe_intermediate_size", "hc_mult", "sliding_window",
               "qk_rope_head_dim")
    if int(c.get("num_key_value_heads", default=1)) != 1:
        raise ConfigError(f"{c.where}: DeepSeek-V4 attention has one shared K=V head; num_key_value_heads "
                          f"{c.get('num_key_value_heads')} is not a layout kvplan knows")
    n, hidden, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    per_layer = ratios(c, n)
    mult = c.need_int("hc_mult")
    caches, weights = [], [base.embedding(vocab, hidden)]
    for i, r in enumerate(per_layer):
        caches += caches_of(c, i, r)
        # the routers' e_score_correction_bias and the hash layers' tid2eid table are buffers, not parameters
        weights += _layer(c, i, hidden, r, router_bias=False)
    weights += base.norm("norm", hidden) + _hyper_connection("hc_head", hidden, mult, None, head=True)
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, hidden, is_tied)
    # MTP (vLLM models/deepseek_v4 mtp, the checkpoint's mtp.*): a window-only layer whose router keeps its bias as
    # a parameter, e_proj/h_proj, enorm/hnorm, a head norm and its own hyper-connection head; the embedding and
    # the output head are shared with the main model.
    for j in range(int(c.get("num_nextn_predict_layers", default=0) or 0)):
        i = n + j
        mtp = _layer(c, i, hidden, 0, router_bias=True)
        mtp += base.linear("e_proj", hidden, hidden, split="replicated", layer=i)
        mtp += base.linear("h_proj", hidden, hidden, split="replicated", layer=i)
        mtp += base.norm("enorm", hidden, layer=i) + base.norm("hnorm", hidden, layer=i)
        mtp += base.norm("shared_head.norm", hidden, layer=i) + _hyper_connection("hc_head", hidden, mult, i, head=True)
        weights += base.in_part(mtp, "mtp")
    return caches, weights, is_tied
