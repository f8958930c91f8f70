"""Rotary cos/sin tables: memory that is neither weights nor KV, built when the model is.

vLLM's (and SGLang's) `get_rope` precomputes one table of [rows, rotary_dim] (cos and sin halves side by side) per
distinct rotary embedding, in the model dtype (`cache.to(dtype)`), and shares it between the layers that ask for the
same one. It is allocated on the GPU while the model is built, so vLLM's "Model loading took N GiB" includes it:
Llama-4-Scout's 10,485,760 positions x 128 x 2 B = 2.5 GiB per GPU (vLLM 0.19, tests/data/wild-logs.yaml).

Rows by rope type (vLLM 0.19 / 0.32 rotary_embedding/): default, llama3, proportional = max_position; linear and
dynamic = max_position x factor; yarn and deepseek_yarn = original_max_position x factor; longrope = original +
max_position (a short and a long table, concatenated); multimodal rope (mrope_section) starts from 4 x the length.
Which tables a model has is its family's code (one place each, below); the vLLM oracle records them
(tests/test_engine_vllm.py, test_vllm_rope_tables).
"""

from __future__ import annotations

import math
from typing import Any, Callable

from kvplan.architectures.base import Cfg
from kvplan.spec import RopeTable


# Families whose vLLM model code has no rotary table: state-space models, learned or ALiBi positions, NoPE hybrids;
# GPT-NeoX and Starcoder2 run through vLLM's Transformers backend in 0.32 (transformers' rotary keeps no table), and
# SmolLM3 through vLLM's (registry.py: SmolLM3ForCausalLM -> TransformersForCausalLM) and SGLang's (no native class)
NO_TABLE_FAMILIES = frozenset({"mamba", "mamba2", "jamba", "nemotron-h", "bloom", "mpt", "gpt2", "opt", "t5", "mt5",
                               "whisper", "gpt-neox", "starcoder2", "smollm3"})


def parameters(c: Cfg) -> dict[str, Any]:
    """The config's rope settings as vLLM normalises them: rope_scaling merged into rope_parameters, `type` read as
    `rope_type` ("su" is longrope, "mrope" is the default rope with sections), rope_theta beside them."""
    rp: dict[str, Any] = {}
    for key in ("rope_scaling", "rope_parameters"):
        value = c.raw.get(key)
        if isinstance(value, dict) and not _per_layer_type(value):
            rp.update(value)
    if rp.get("original_max_position_embeddings") is None and c.get("original_max_position_embeddings"):
        rp["original_max_position_embeddings"] = c.get("original_max_position_embeddings")  # Phi-3's top-level field
    kind = str(rp.get("rope_type", rp.get("type", "default")) or "default")
    rp["rope_type"] = {"su": "longrope", "mrope": "default"}.get(kind, kind)
    rp.setdefault("rope_theta", c.get("rope_theta", default=10000.0))
    return rp


def _per_layer_type(value: dict[str, Any]) -> bool:
    return bool(value) and all(isinstance(v, dict) for v in value.values())


def rows(rp: dict[str, Any], max_position: int) -> int:
    kind, factor = rp["rope_type"], rp.get("factor")
    start = 4 if "mrope_section" in rp else 1
    if kind in ("yarn", "deepseek_yarn", "deepseek_llama_scaling") and factor:
        original = int(rp.get("original_max_position_embeddings") or max_position)
        return math.ceil(original * start * float(factor))
    if kind in ("linear", "dynamic") and factor:
        return math.ceil(max_position * start * float(factor))
    if kind == "longrope":
        return int(rp.get("original_max_position_embeddings") or max_position) + max_position
    return max_position * start


def _rotary_dim(c: Cfg, head_dim: int, rp: dict[str, Any]) -> int:
    if rp.get("rope_type") == "proportional":  # Gemma 4: the table spans the whole head (unrotated pairs cos 1, sin 0)
        return head_dim
    if c.get("rotary_dim"):  # MiniMax-M2 states it
        return int(c.get("rotary_dim"))
    factor = rp.get("partial_rotary_factor", c.get("partial_rotary_factor", "rotary_pct", default=1.0))
    return int(head_dim * float(factor or 1.0))


def _head_dim(c: Cfg) -> int:
    hd = c.get("head_dim")
    if hd:
        return int(hd)
    return int(c.get("hidden_size", default=0) or 0) // max(1, int(c.get("num_attention_heads", default=1) or 1))


def _max_position(c: Cfg) -> int:
    return int(c.get("max_position_embeddings", "seq_length", "n_positions", default=0) or 0)


def _one(c: Cfg, head_dim: int | None = None, fp32: bool = False) -> tuple[RopeTable, ...]:
    rp = parameters(c)
    n = _max_position(c)
    dim = _rotary_dim(c, head_dim or _head_dim(c), rp)
    return (RopeTable(rows(rp, n), dim, fp32),) if n and dim else ()


def _per_layer_kind(c: Cfg, local_theta_key: str, local_type_default: bool, global_head_dim_key: str | None):
    """Gemma-3 / 3n / 4, MiMo: sliding layers use another theta (and Gemma 4 full layers another head_dim) than
    full layers: one rotary embedding per distinct setting (get_rope shares equal ones). Transformers-v5 files give
    rope_parameters per layer type instead."""
    n, head = _max_position(c), _head_dim(c)
    full_head = int(c.get(global_head_dim_key, default=head) or head) if global_head_dim_key else head
    per_type = c.raw.get("rope_parameters")
    if isinstance(per_type, dict) and _per_layer_type(per_type):
        by_kind = (("sliding_attention", head), ("full_attention", full_head))
        variants = [(dict(per_type[kind]), dim) for kind, dim in by_kind if per_type.get(kind)]
        for rp, _ in variants:
            rp["rope_type"] = str(rp.get("rope_type", "default"))
    else:
        full = parameters(c)
        local = {"rope_type": "default"} if local_type_default else dict(full)
        local["rope_theta"] = c.get(local_theta_key, default=full["rope_theta"])
        variants = [(full, full_head), (local, head)]
    distinct = {(rows(rp, n), _rotary_dim(c, dim, rp), str(sorted(rp.items(), key=str))): None for rp, dim in variants}
    return tuple(RopeTable(r, d) for r, d, _ in distinct if n and d)


def _gemma(top: Cfg, c: Cfg) -> tuple[RopeTable, ...]:
    if str(c.get("model_type", default="")) in ("gemma", "gemma2"):
        return _one(c)
    return _per_layer_kind(c, "rope_local_base_freq", local_type_default=True, global_head_dim_key=None)


def _gemma3n(top: Cfg, c: Cfg) -> tuple[RopeTable, ...]:
    """Gemma-3n: as Gemma-3, but the config class's thetas apply when the file states none (Gemma3nTextConfig
    default_theta: global 1e6 for the full layers' rope_theta, local 1e4 for rope_local_base_freq); vLLM builds one
    get_rope per layer from config.rope_parameters[layer_type] (models/gemma3n.py Gemma3nAttention)."""
    defaults = {"rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0}
    missing = {k: v for k, v in defaults.items() if c.raw.get(k) is None}
    if missing and not isinstance(c.raw.get("rope_parameters"), dict):
        c = Cfg({**c.raw, **missing}, c.defaults, c.where)
    return _per_layer_kind(c, "rope_local_base_freq", local_type_default=True, global_head_dim_key=None)


def _gemma4(top: Cfg, c: Cfg) -> tuple[RopeTable, ...]:
    return _per_layer_kind(c, "rope_local_base_freq", local_type_default=False, global_head_dim_key="global_head_dim")


def _mimo(top: Cfg, c: Cfg) -> tuple[RopeTable, ...]:
    """MiMo-V2-Flash: full and sliding layers build a default rope each with their own theta (swa_rope_theta)."""
    return _per_layer_kind(c, "swa_rope_theta", local_type_default=False, global_head_dim_key=None)


def _mla(top: Cfg, c: Cfg) -> tuple[RopeTable, ...]:
    """DeepSeek MLA: the rope part of the key (qk_rope_head_dim) is rotated whole."""
    return _one(c, head_dim=int(c.get("qk_rope_head_dim", default=0) or 0))


def _gpt_oss(top: Cfg, c: Cfg) -> tuple[RopeTable, ...]:
    return _one(c, fp32=True)


def _chatglm(top: Cfg, c: Cfg) -> tuple[RopeTable, ...]:
    """ChatGLM rotates half of each head (rotary_dim = head_dim // 2) over seq_length positions."""
    head = int(c.get("kv_channels", default=_head_dim(c)) or 0)
    n = _max_position(c)
    return (RopeTable(n, head // 2),) if n and head else ()


def _falcon(top: Cfg, c: Cfg) -> tuple[RopeTable, ...]:
    return () if c.get("alibi", default=False) else _one(c)


def _llama4(top: Cfg, c: Cfg) -> tuple[RopeTable, ...]:
    """Llama-4: one rope for its RoPE (chunked) layers, none for the NoPE ones."""
    from kvplan.architectures import llama4

    return _one(c) if "chunked" in llama4.layer_kinds(c, int(c.get("num_hidden_layers", default=0) or 0)) else ()


def _granite_hybrid(top: Cfg, c: Cfg) -> tuple[RopeTable, ...]:
    """vLLM's GraniteMoeHybrid attention builds get_rope only for position_embedding_type 'rope' (Granite-4.0-H
    says 'nope'), over hidden_size / heads."""
    if c.get("position_embedding_type") != "rope":
        return ()
    return _one(c, int(c.get("hidden_size")) // int(c.get("num_attention_heads")))


def _zamba2(top: Cfg, c: Cfg) -> tuple[RopeTable, ...]:
    """vLLM's Zamba2Attention builds get_rope only with use_mem_rope, over the shared attention's whole head
    (attention_head_dim = 2 x hidden / heads) and max_position_embeddings (16384 with use_long_context)."""
    from kvplan.architectures import zamba2

    if not c.get("use_mem_rope", default=False):
        return ()
    long = zamba2.max_ctx(c)
    n = long[0] if long else _max_position(c)
    dim = 2 * int(c.get("hidden_size", default=2560)) // int(c.get("num_attention_heads", default=32))
    return (RopeTable(rows(parameters(c), n), dim),) if n and dim else ()


def _cohere2(top: Cfg, c: Cfg) -> tuple[RopeTable, ...]:
    """Cohere2: every layer builds get_rope(head_dim, max_position=model_max_length or max_position_embeddings,
    rope_parameters, is_neox_style=False) (vLLM 0.32 and SGLang 0.5.10 commandr.py CohereAttention); the NoPE layers
    hold it too, unused. head_dim is hidden_size // heads (Cohere2Config), rotated whole (rotary_pct is not read)."""
    rp = parameters(c)
    n = int(c.get("model_max_length", default=0) or 0) or _max_position(c)
    head = int(c.get("hidden_size", default=0) or 0) // max(1, int(c.get("num_attention_heads", default=1) or 1))
    dim = int(head * float(rp.get("partial_rotary_factor", 1.0) or 1.0))
    return (RopeTable(rows(rp, n), dim),) if n and dim else ()


def _minimax01(top: Cfg, c: Cfg) -> tuple[RopeTable, ...]:
    """MiniMax-01 (vLLM 0.10.1-0.23 models/minimax_text_01.py): one table of rotary_dim (else head_dim) built in fp32
    (0.10.x MiniMaxText01RotaryEmbedding cache_dtype=torch.float32; 0.13+ get_rope(dtype=torch.float32)) over
    max_position = min(max_position_embeddings, max_model_len)."""
    return tuple(RopeTable(t.rows, t.dim, fp32=True, capped=True) for t in _one(c))


FAMILY_TABLES: dict[str, Callable[[Cfg, Cfg], tuple[RopeTable, ...]]] = {
    "gemma": _gemma, "gemma3n": _gemma3n, "gemma4": _gemma4, "mimo-v2-flash": _mimo, "deepseek-mla": _mla,
    "deepseek-v4": _mla, "gpt-oss": _gpt_oss, "chatglm": _chatglm, "falcon": _falcon, "llama4": _llama4,
    "granite-hybrid": _granite_hybrid, "zamba2": _zamba2, "cohere2": _cohere2, "minimax-01": _minimax01,
}


def tables(family: str, model_type: str, top: Cfg, text: Cfg) -> tuple[RopeTable, ...]:
    """The rotary tables vLLM's model code for this family builds."""
    if family in NO_TABLE_FAMILIES or model_type in NO_TABLE_FAMILIES:
        return ()
    build = FAMILY_TABLES.get(family)
    return build(top, text) if build else _one(text)
