"""MiniMax-01 lightning attention: MiniMax-Text-01 (remote-code model_type minimax_text_01), MiniMax-M1 (minimax_m1,
MiniMaxM1ForCausalLM, the same architecture) and transformers' native `minimax` (MiniMaxConfig, the -hf checkpoints).

Layers are lightning (linear) attention or softmax attention (GQA), every layer a MoE of num_local_experts gated
experts with a softmax router:

- which layer is which: `attn_type_list` (0 = lightning, 1 = softmax; the remote code and vLLM read it) or
  `layer_types` ("linear_attention" / "full_attention"; transformers' MiniMaxConfig, which vLLM also maps). A native
  config without layer_types alternates as MiniMaxConfig.__post_init__ fills it: even layers full, odd layers linear.
  A remote-code config without either list is refused (its modeling code indexes config.attn_type_list).
- a lightning layer keeps one head_dim x head_dim matrix per head for each request (LightningState); a softmax layer
  keeps K/V of num_key_value_heads x head_dim per token.
- weights as vLLM (0.10.1-0.23 models/minimax_text_01.py), the remote code and transformers' models/minimax build
  them: lightning layers qkv_proj (hidden -> 3 x heads x head_dim), output_gate (hidden -> heads x head_dim), out_proj
  and an RMS norm over heads x head_dim; softmax layers q/k/v/o without bias; the router [experts, hidden] (kept in
  fp32 by vLLM's ReplicatedLinear(params_dtype=float32) and stored so in the checkpoint: MiniMax-M1's
  model.safetensors.index.json total_size is 912,210,767,872 B = 2 x 456,089,655,296 parameters + 2 x 80 x 32 x
  6144 for the fp32 gates), experts w1/w3 [I, hidden] and w2 [hidden, I], two norms per layer, a final norm,
  untied lm_head.

Configs the engines read differently are refused rather than sized one way: a shared expert
(shared_intermediate_size > 0: vLLM and the remote code build shared_mlp + an fp32 coefficient, transformers'
native class builds none), a single expert (vLLM builds a dense MLP, transformers a one-expert MoE), no head_dim
(transformers derives hidden / heads, vLLM reads config.head_dim and fails), attn_type_list and layer_types that
disagree (vLLM takes attn_type_list, transformers layer_types), tied embeddings (vLLM always builds an lm_head).
"""

from __future__ import annotations

from kvplan.architectures import base
from kvplan.architectures.base import Cfg
from kvplan.errors import ConfigError
from kvplan.spec import FullAttention, LightningState, WeightPart

NATIVE = "minimax"  # transformers' MiniMaxConfig
REMOTE = ("minimax_text_01", "minimax_m1")
MODEL_TYPES = (NATIVE, *REMOTE)
FP32 = 4


def _from_attn_type_list(c: Cfg, n: int) -> list[bool] | None:
    """attn_type_list -> one flag per layer, True = lightning (0)."""
    types = c.raw.get("attn_type_list")
    if types is None:
        return None
    if len(types) != n:  # the schema has checked it is a list of 0 / 1
        raise ConfigError(f"{c.where}: attn_type_list must give one 0 (lightning) or 1 (softmax attention) per layer "
                          f"({n}), found {len(types)} entries")
    return [t == 0 for t in types]


def _from_layer_types(c: Cfg, n: int) -> list[bool] | None:
    types = c.raw.get("layer_types")
    if types is None:
        return None
    if len(types) != n or any(t not in ("linear_attention", "full_attention") for t in types):
        found = f"{len(types)} entries" if len(types) != n else "other names"
        raise ConfigError(f"{c.where}: layer_types must list 'linear_attention' or 'full_attention' for each of the "
                          f"{n} layers (found {found})")
    return [t == "linear_attention" for t in types]


def lightning_layers(c: Cfg, n: int) -> list[bool]:
    """Which layers are lightning attention (see the module docstring)."""
    by_list, by_types = _from_attn_type_list(c, n), _from_layer_types(c, n)
    if by_list is not None and by_types is not None and by_list != by_types:
        raise ConfigError(f"{c.where}: attn_type_list and layer_types name different lightning layers: vLLM reads "
                          "attn_type_list, transformers layer_types; kvplan does not pick one")
    if by_list is not None:
        return by_list
    if by_types is not None:
        return by_types
    if str(c.get("model_type", default="")) == NATIVE:
        return [i % 2 == 1 for i in range(n)]  # MiniMaxConfig: "full_attention" if (i + 1) % 2 else "linear_attention"
    raise ConfigError(f"{c.where}: a {c.get('model_type')} config needs attn_type_list (0 = lightning, 1 = softmax "
                      "attention, one per layer): its modeling code reads it, and without it vLLM would make every "
                      "layer softmax attention")


def _check(c: Cfg, hidden: int, heads: int) -> tuple[int, int]:
    if c.get("head_dim") is None:
        raise ConfigError(f"{c.where} lacks head_dim: transformers would use hidden_size / num_attention_heads "
                          f"({hidden // heads}), vLLM's lightning layers read config.head_dim and cannot build the "
                          "model without it; kvplan does not pick one")
    shared = c.get("shared_intermediate_size", default=0) or 0
    if shared:
        raise ConfigError(f"{c.where}: shared_intermediate_size {shared}: vLLM and the remote code add a shared expert "
                          "(shared_mlp and an fp32 coefficient), transformers' native MiniMax class has none; no "
                          "released MiniMax-01 model has one, and kvplan does not size it one way")
    experts = c.need_int("num_local_experts")
    if experts < 2:
        raise ConfigError(f"{c.where}: num_local_experts {experts}: vLLM builds a dense MLP for one expert, "
                          "transformers a one-expert MoE with a router; kvplan does not pick one")
    return int(c.get("head_dim")), experts


def _untied(top: Cfg, c: Cfg) -> bool:
    if base.tied(top, c, False):
        raise ConfigError(f"{c.where}: tie_word_embeddings true: vLLM's MiniMaxText01ForCausalLM always builds its own "
                          "lm_head, transformers would tie it; kvplan does not pick one")
    return False


def _fp32(name: str, shape: tuple[int, int], layer: int) -> WeightPart:
    """The router: fp32 in vLLM (ReplicatedLinear params_dtype=torch.float32) and in the released checkpoint."""
    return WeightPart(name, shape, "other", "text", "replicated", layer, stored_bytes=FP32 * shape[0] * shape[1])


def build(top: Cfg, c: Cfg):
    c.need_all("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "intermediate_size",
               "num_local_experts")
    n, hidden, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    heads, inter = c.need_int("num_attention_heads"), c.need_int("intermediate_size")
    head_dim, experts = _check(c, hidden, heads)
    kv = int(c.get("num_key_value_heads", default=heads))
    lightning = lightning_layers(c, n)
    inner = heads * head_dim
    full = FullAttention(kv, head_dim, head_dim)
    state = LightningState(0, 1, num_heads=heads, head_dim=head_dim)
    caches, weights = [], [base.embedding(vocab, hidden)]
    for i in range(n):
        if lightning[i]:
            caches.append((i, state))
            weights += base.linear("self_attn.qkv_proj", hidden, 3 * inner, layer=i)
            weights += base.linear("self_attn.output_gate", hidden, inner, layer=i)
            weights += base.linear("self_attn.out_proj", inner, hidden, split="row", layer=i)
            weights.append(WeightPart("self_attn.norm", (inner,), "norm", "text", "column", i))  # MiniMaxText01RMSNormTP
        else:
            caches.append((i, full))
            weights += base.attention_block(i, hidden, base.AttnDims(heads, kv, head_dim, head_dim))
        weights.append(_fp32("block_sparse_moe.gate", (experts, hidden), i))
        weights += base.experts(i, hidden, inter, experts, prefix="block_sparse_moe.experts")
        weights += base.decoder_layer_norms(i, hidden, 2)
    weights += base.norm("norm", hidden)
    is_tied = _untied(top, c)
    weights += base.lm_head(vocab, hidden, is_tied)
    return caches, weights, is_tied
