"""The default path: a plain decoder-only transformer (llama naming) and its small, data-driven variants.

Per-model_type differences that are only a matter of biases, norms, MLP shape, qk-norm and class defaults
are rows in QUIRKS (data), not branches. Families whose structure differs live in their own modules.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.architectures import base
from kvplan.architectures.base import AttnDims, Cfg
from kvplan.errors import ConfigError
from kvplan.spec import LayerCache, WeightPart


@dataclass(frozen=True)
class Quirks:
    """How a llama-like family departs from llama: biases, MLP shape, norms (one row per family)."""
    q_bias: str | bool = "attention_bias"  # a config key to read, or a fixed value
    k_bias: str | bool = "attention_bias"
    v_bias: str | bool = "attention_bias"
    o_bias: str | bool = "attention_bias"
    mlp: str = "gated"  # gated (gate/up/down) | plain (fc1/fc2)
    mlp_bias: str | bool = "mlp_bias"
    norms_per_layer: int = 2
    norm_bias: bool = False  # LayerNorm with bias (vs RMSNorm weight only)
    qk_norm: str | None = None  # None | "head_dim" | "per_head" | a config key gating "head_dim"
    qk_norm_flag: str | None = None  # config key that switches qk norm on (cohere use_qk_norm)
    tied_default: bool = False
    # how sliding_window applies without layer_types: all | qwen (layers >= max_window_layers, if use_sliding_window)
    # | nope (SmolLM3: the NoPE layers, no_rope_layers[i] == 0, if use_sliding_window)
    sliding: str = "all"
    sliding_gate: str | None = None  # config key that must be true for sliding_window to apply
    moe: str | None = None  # None | "mixtral" | "qwen_moe"
    lm_head_bias: bool = False  # Phi-1/1.5/2: nn.Linear(hidden, vocab, bias=True)
    defaults: tuple[tuple[str, object], ...] = ()


QUIRKS: dict[str, Quirks] = {
    "llama": Quirks(),
    "mistral": Quirks(),
    "mixtral": Quirks(moe="mixtral"),
    # MiniMax-M2 / M2.5 / M2.7: every layer a Mixtral-style MoE (sigmoid router, routing bias a buffer), q/k RMSNorm
    # over all heads (heads x head_dim weights); the MTP modules are not built by transformers and left out
    "minimax_m2": Quirks(mlp_bias=False, qk_norm="per_head", qk_norm_flag="use_qk_norm", moe="mixtral"),
    "qwen2": Quirks(q_bias=True, k_bias=True, v_bias=True, o_bias=False, mlp_bias=False, sliding="qwen",
                    sliding_gate="use_sliding_window"),
    "qwen2_moe": Quirks(q_bias=True, k_bias=True, v_bias=True, o_bias=False, mlp_bias=False, sliding="qwen",
                        sliding_gate="use_sliding_window", moe="qwen_moe"),
    "qwen3": Quirks(mlp_bias=False, qk_norm="head_dim", sliding="qwen", sliding_gate="use_sliding_window"),
    "qwen3_moe": Quirks(mlp_bias=False, qk_norm="head_dim", sliding="qwen", sliding_gate="use_sliding_window",
                        moe="qwen_moe"),
    "qwen3_vl_text": Quirks(mlp_bias=False, qk_norm="head_dim", sliding="none"),
    "qwen3_vl_moe_text": Quirks(mlp_bias=False, qk_norm="head_dim", sliding="none", moe="qwen_moe"),
    "phi3": Quirks(q_bias=False, k_bias=False, v_bias=False, o_bias=False, mlp_bias=False),
    # Granite 3.x (transformers models/granite GraniteForCausalLM): llama's block; its embedding, residual,
    # attention and logits multipliers scale activations, not the parameters or the cache
    "granite": Quirks(),
    # Phi-1/1.5/2 (PhiForCausalLM): attention and a plain fc1/fc2 MLP in parallel after ONE LayerNorm, biases
    # everywhere (q/k/v/dense, fc1/fc2, the norms and the output head)
    "phi": Quirks(q_bias=True, k_bias=True, v_bias=True, o_bias=True, mlp="plain", mlp_bias=True, norms_per_layer=1,
                  norm_bias=True, lm_head_bias=True),
    "cohere": Quirks(mlp_bias=False, norms_per_layer=1, qk_norm="per_head", qk_norm_flag="use_qk_norm",
                     tied_default=True),
    # SmolLM3 (transformers 5.24 models/smollm3): llama's block; SmolLM3Config.__post_init__ slides the NoPE layers
    # (no_rope_layers[i] == 0, default every no_rope_layer_interval-th) when use_sliding_window and sliding_window
    "smollm3": Quirks(tied_default=True, sliding="nope", sliding_gate="use_sliding_window"),
    "starcoder2": Quirks(q_bias="use_bias", k_bias="use_bias", v_bias="use_bias", o_bias="use_bias", mlp="plain",
                         mlp_bias="use_bias", norm_bias=True, tied_default=True, defaults=(("use_bias", True),)),
}


def quirks_for(model_type: str) -> Quirks:
    return QUIRKS.get(model_type, Quirks())


def _flag(c: Cfg, value: str | bool) -> bool:
    return bool(c.get(value, default=False)) if isinstance(value, str) else value


def layer_kinds(c: Cfg, q: Quirks, n: int) -> list[str]:
    """Per-layer attention kind: layer_types when present, else the family's sliding_window rule."""
    from_types = base.kinds_from_layer_types(c, n)
    if from_types is not None:
        return from_types
    window = c.get("sliding_window")
    if not window or q.sliding == "none" or (q.sliding_gate and not c.get(q.sliding_gate, default=False)):
        return ["full"] * n
    if q.sliding == "nope":
        return ["full" if rope else "sliding" for rope in no_rope_layers(c, n)]
    if q.sliding == "qwen":  # transformers Qwen2Config: sliding for layers >= max_window_layers
        start = int(c.get("max_window_layers", default=0))
        return ["sliding" if i >= start else "full" for i in range(n)]
    return ["sliding"] * n


def no_rope_layers(c: Cfg, n: int) -> list[int]:
    """SmolLM3Config: no_rope_layers (1 = the layer rotates, 0 = NoPE), else int((i + 1) % no_rope_layer_interval != 0)."""
    flags = c.raw.get("no_rope_layers")
    if flags is None:
        interval = int(c.get("no_rope_layer_interval", default=4))
        if interval < 1:
            raise ConfigError(f"{c.where}: no_rope_layer_interval must be at least 1 (transformers computes "
                              f"(i + 1) % no_rope_layer_interval), found {interval}")
        return [int((i + 1) % interval != 0) for i in range(n)]
    if len(flags) != n:
        raise ConfigError(f"{c.where}: no_rope_layers must list one flag per layer ({n}), found {len(flags)}")
    return [int(f) for f in flags]


def smollm3(top: Cfg, c: Cfg):
    """SmolLM3 (model_type smollm3): the llama-style decoder of its QUIRKS row; num_key_value_heads null means MHA
    (SmolLM3Config.__post_init__), absent means the class default 4."""
    if "num_key_value_heads" in c.raw and c.raw["num_key_value_heads"] is None:
        c = Cfg({**c.raw, "num_key_value_heads": c.need_int("num_attention_heads")}, c.defaults, c.where)
    return build(top, c, quirks_for("smollm3"))


def build_layers(c: Cfg, q: Quirks, dims: AttnDims, kinds: list[str]) -> list[tuple[int, LayerCache]]:
    window = c.get("sliding_window")
    chunk = c.get("attention_chunk_size")
    return [(i, base.attention_cache(k, dims, window, chunk)) for i, k in enumerate(kinds)]


def attention_weights(c: Cfg, q: Quirks, layer: int, hidden: int, dims: AttnDims) -> list[WeightPart]:
    parts = base.attention_block(
        layer, hidden, dims,
        q_bias=_flag(c, q.q_bias), k_bias=_flag(c, q.k_bias), v_bias=_flag(c, q.v_bias), o_bias=_flag(c, q.o_bias),
    )
    use_qk = q.qk_norm is not None and (q.qk_norm_flag is None or c.get(q.qk_norm_flag, default=False))
    if use_qk and q.qk_norm == "head_dim":
        parts += base.norm("self_attn.q_norm", dims.head_dim, layer=layer)
        parts += base.norm("self_attn.k_norm", dims.head_dim, layer=layer)
    elif use_qk and q.qk_norm == "per_head":
        parts.append(WeightPart("self_attn.q_norm", (dims.heads, dims.head_dim), "norm", "text", "replicated", layer))
        parts.append(WeightPart("self_attn.k_norm", (dims.kv_heads, dims.head_dim), "norm", "text", "replicated", layer))
    return parts


def mlp_weights(c: Cfg, q: Quirks, layer: int, hidden: int) -> list[WeightPart]:
    moe = _moe_for_layer(c, q, layer)
    if moe is not None:
        return moe
    inter = c.need_int("intermediate_size")
    if q.mlp == "plain":
        return base.plain_mlp(layer, hidden, inter, bias=_flag(c, q.mlp_bias), names=("c_fc", "c_proj"))
    return base.gated_mlp(layer, hidden, inter, bias=_flag(c, q.mlp_bias))


def _moe_for_layer(c: Cfg, q: Quirks, layer: int) -> list[WeightPart] | None:
    if q.moe == "mixtral":
        n = c.need_int("num_local_experts")
        return base.router(layer, hidden := c.need_int("hidden_size"), n) + base.experts(
            layer, hidden, c.need_int("intermediate_size"), n
        )
    if q.moe == "qwen_moe":
        n = int(c.get("num_experts", default=0))
        return base.qwen_moe_block(c, layer, c.need_int("hidden_size"), n) if base.qwen_moe_layer(c, layer, n) else None
    return None


def build(top: Cfg, c: Cfg, q: Quirks | None = None):
    """ModelSpec pieces for a plain decoder: (caches, weights, tied)."""
    q = q or quirks_for(str(c.get("model_type", default="")))
    if q.defaults:
        c = Cfg(c.raw, {**dict(q.defaults), **c.defaults}, c.where)
    c.need_all("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size")
    n = c.need_int("num_hidden_layers")
    hidden = c.need_int("hidden_size")
    vocab = c.need_int("vocab_size")
    dims = base.attention_dims(c)
    kinds = layer_kinds(c, q, n)
    caches = build_layers(c, q, dims, kinds)
    is_tied = base.tied(top, c, q.tied_default)
    weights: list[WeightPart] = [base.embedding(vocab, hidden)]
    for i in range(n):
        weights += attention_weights(c, q, i, hidden, dims)
        weights += mlp_weights(c, q, i, hidden)
        weights += base.decoder_layer_norms(i, hidden, q.norms_per_layer, bias=q.norm_bias)
    weights += base.norm("norm", hidden, bias=q.norm_bias)
    weights += base.lm_head(vocab, hidden, is_tied)
    if q.lm_head_bias:
        weights.append(WeightPart("lm_head.bias", (vocab,), "bias", "text", "vocab"))
    return caches, weights, is_tied

