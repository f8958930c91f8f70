"""StepFun Step-3.7 (model_type step3p7): Step3p7ForConditionalGeneration with a step3p5 text_config (the Hub release,
vendor spellings), or the flat text-only Step3p7FlashForCausalLM file NVIDIA's aiconfigurator curates (a class name
no engine has: its fields are read as the wrapper's text_config, without a tower).

Read the way transformers 5.24's Step3p7TextConfig reads it (models/step3p7/configuration_step3p7.py "cfg",
modeling_step3p7.py "mod"); vLLM 0.32 builds the language model as Step3p5ForCausalLM (model_executor/models/
step3p5.py "v35") from the same fields:
- attention: GQA of head_dim (default 128) on every layer, q_norm / k_norm of head_dim, and a gate g_proj after the
  attention: [heads, hidden] (one sigmoid per head) while `gating` is True (a class attribute) or "per-head", else
  [heads x head_dim, hidden] (mod:692-695; vLLM builds it only with use_head_wise_attn_gate, v35:225). layer_types
  picks full or sliding attention; sliding layers keep num_key_value_heads x head_dim and may run other query heads
  (num_sliding_attention_heads, else the legacy attention_other_setting.num_attention_heads: cfg:228-247,
  mod:750). vLLM's attention_other_setting may also change the sliding layers' KV heads / head_dim (v35:416-424);
  transformers never does, so a config where they differ is refused.
- window: sliding_window (512); transformers' DynamicSlidingWindowLayer keeps window - 1 tokens, vLLM builds a
  SlidingWindowSpec of the window (the engines' own rules).
- MLP: mlp_layer_types, else the legacy moe_layers_enum (comma-separated string or list of MoE layer indices),
  else layers 3.. sparse (cfg:214-226; neither engine reads first_k_dense_replace, and cfg's moe_layer_freq branch
  never runs). vLLM's own default without moe_layers_enum is layers 1.. (v35:470-474): the configs that reach it
  through transformers' class have had moe_layers_enum consumed, so a release config is read right only with its
  own (remote-code) config class; kvplan follows transformers. Sparse layers: a bias-free router [experts, hidden]
  (its e_score_correction_bias a buffer; vLLM's router_bias is an fp32 parameter), routed experts of
  moe_intermediate_size (n_routed_experts = moe_num_experts = num_local_experts, default 288) and ONE always-on
  shared expert of share_expert_dim; dense layers a gated MLP of intermediate_size. attention_bias / mlp_bias as
  transformers reads them (vLLM puts no bias on o_proj or the MLPs).
- norms: Gemma-style RMSNorm weights (input / post-attention, final); lm_head untied unless the top-level
  tie_word_embeddings says so (Step3p7ForConditionalGeneration ties by its own config, not text_config's; vLLM's
  Step3p5ForCausalLM never ties).
- MTP (num_nextn_predict_layers, 3): transformers skips the checkpoint's layers.45-47 (part "mtp", outside params);
  the checkpoint and vLLM's Step3p5MTP (step3p5_mtp.py) hold per layer enorm, hnorm, eh_proj [hidden, 2 hidden], a
  decoder block and shared_head norm + head [vocab, hidden] (its own, not the main lm_head); the embedding is shared
  with the main model. Each MTP layer's attention / MLP kind is the padded tail of layer_types / mlp_layer_types (or
  mtp_layer_types / mtp_mlp_layer_types, or its index in moe_layers_enum); without one, full attention and a dense
  MLP (cfg's defaults).
Fields only the curated file uses (num_experts, first_k_dense_replace, n_shared_experts) are read by neither engine:
accepted when they agree with the engines' reading, refused when they contradict it. Checked in tests/test_step3p7.py.
"""

from __future__ import annotations

from kvplan.architectures import base
from kvplan.architectures.base import AttnDims, Cfg
from kvplan.errors import ConfigError
from kvplan.spec import WeightPart

ATTENTION_KINDS = {"full_attention": "full", "sliding_attention": "sliding"}
MLP_KINDS = ("dense", "sparse")
DEFAULT_FIRST_SPARSE = 3  # Step3p7TextConfig: no mlp_layer_types / moe_layers_enum -> layers 3.. are MoE


def _tail_list(c: Cfg, key: str, n: int, mtp: int, allowed) -> list[str] | None:
    """A per-layer list of n entries, or n + mtp (the Hub release pads layer_types with the MTP layers)."""
    v = c.raw.get(key)
    if v is None:
        return None
    if not isinstance(v, list) or len(v) not in (n, n + mtp):
        found = f"{len(v)} entries" if isinstance(v, list) else base.brief(v)
        want = f"{n} or {n + mtp}" if mtp else f"{n}"
        raise ConfigError(f"{c.where}: {key} must list one entry per layer ({want} with the MTP layers), found {found}")
    bad = sorted({str(x) for x in v if x not in allowed})
    if bad:
        raise ConfigError(f"{c.where}: Step-3.7 {key} entries are {' / '.join(allowed)}; found {', '.join(bad)}")
    return list(v)


def _moe_layers_enum(c: Cfg) -> set[int] | None:
    v = c.raw.get("moe_layers_enum")
    if v is None:
        return None
    items = v.split(",") if isinstance(v, str) else v
    try:
        return {int(str(i).strip()) for i in items if str(i).strip()}
    except ValueError:
        raise ConfigError(f"{c.where}.moe_layers_enum must list layer indices, found {base.brief(v)}") from None


def attention_kinds(c: Cfg, n: int, mtp: int) -> list[str]:
    """'full' / 'sliding' for the n decoder layers and then the mtp MTP layers."""
    types = _tail_list(c, "layer_types", n, mtp, tuple(ATTENTION_KINDS))
    mtp_types = _tail_list(Cfg({"mtp_layer_types": c.raw.get("mtp_layer_types")}, where=c.where), "mtp_layer_types",
                           mtp, 0, tuple(ATTENTION_KINDS))
    main = types[:n] if types else ["full_attention"] * n
    tail = mtp_types or (types[n:] if types and len(types) > n else ["full_attention"] * mtp)
    return [ATTENTION_KINDS[t] for t in main + tail]


def sparse_layers(c: Cfg, n: int, mtp: int) -> list[bool]:
    """MoE (True) or dense per decoder layer and then per MTP layer, as Step3p7TextConfig derives mlp_layer_types."""
    types = _tail_list(c, "mlp_layer_types", n, mtp, MLP_KINDS)
    mtp_types = _tail_list(Cfg({"mtp_mlp_layer_types": c.raw.get("mtp_mlp_layer_types")}, where=c.where),
                           "mtp_mlp_layer_types", mtp, 0, MLP_KINDS)
    if types is not None:
        main = [t == "sparse" for t in types[:n]]
        tail = mtp_types or (types[n:] if len(types) > n else ["dense"] * mtp)
        return main + [t == "sparse" for t in tail]
    listed = _moe_layers_enum(c)
    moe = listed if listed is not None else set(range(DEFAULT_FIRST_SPARSE, n))
    out = [i in moe for i in range(n + mtp)]
    if mtp_types:
        out[n:] = [t == "sparse" for t in mtp_types]
    first_dense = c.get("first_k_dense_replace")
    if first_dense is not None and out[:n] != [i >= first_dense for i in range(n)]:
        shown = ",".join(str(i) for i in range(n) if out[i]) or "none"
        raise ConfigError(f"{c.where}: first_k_dense_replace {first_dense} contradicts the MoE layers Step-3.7's "
                          f"engines build ({shown}: from mlp_layer_types / moe_layers_enum, else layers "
                          f"{DEFAULT_FIRST_SPARSE}..); neither transformers nor vLLM reads first_k_dense_replace "
                          "for step3p7: give moe_layers_enum")
    return out


def sliding_head_count(c: Cfg) -> int:
    """Query heads of a sliding layer: num_sliding_attention_heads, else the legacy
    attention_other_setting.num_attention_heads, else num_attention_heads (Step3p7TextConfig.__post_init__)."""
    other = c.get("attention_other_setting") or {}
    if not isinstance(other, dict):
        raise ConfigError(f"{c.where}.attention_other_setting must be an object, found {base.brief(other)}")
    swa = c.get("num_sliding_attention_heads")
    if swa is None:
        swa = other.get("num_attention_heads")
    return int(swa) if swa is not None else c.need_int("num_attention_heads")


def layer_heads(c: Cfg, n: int, kinds: list[str]) -> list[int]:
    """Query heads per layer (decoder layers, then MTP layers); a re-saved config's per_layer_config (transformers
    writes {"1": {"num_attention_heads": 96}, ...}) overrides the decoder layers it names."""
    heads, swa = c.need_int("num_attention_heads"), sliding_head_count(c)
    out = [swa if k == "sliding" else heads for k in kinds]
    explicit = c.raw.get("per_layer_config")
    if isinstance(explicit, dict):
        for key, value in explicit.items():
            try:
                idx = int(key)
            except (TypeError, ValueError):
                raise ConfigError(f"{c.where}.per_layer_config: keys are layer indices, "
                                  f"found {base.brief(key)}") from None
            if not 0 <= idx < n or not isinstance(value, dict) or set(value) - {"num_attention_heads"}:
                raise ConfigError(f"{c.where}.per_layer_config: Step-3.7 overrides num_attention_heads of a layer in "
                                  f"0..{n - 1}; found {base.brief(key)}: {base.brief(value)}")
            if value.get("num_attention_heads") is not None:
                out[idx] = int(value["num_attention_heads"])
    return out


def _check_engines_agree(c: Cfg, kv: int, head_dim: int, experts: int) -> None:
    """Refuse what the engines read differently, and curated fields that contradict the engines' reading."""
    for key in ("sparse_attention_config", "index_n_heads", "index_head_dim"):
        if c.raw.get(key) is not None:
            raise ConfigError(f"{c.where}: {key}: Step-3.7 sparse-attention (lightning indexer) layers are not a "
                              "layout kvplan models")
    other = c.get("attention_other_setting") or {}
    if isinstance(other, dict):
        kind = other.get("attention_type")
        if kind is not None and kind != "sliding_attention":
            raise ConfigError(f"{c.where}.attention_other_setting.attention_type {base.brief(kind)}: transformers "
                              "applies it to the sliding layers, vLLM to the layers of that type")
        for key, value in (("num_attention_groups", kv), ("head_dim", head_dim)):
            if other.get(key) is not None and int(other[key]) != value:
                raise ConfigError(f"{c.where}.attention_other_setting.{key} {other[key]} differs from the full "
                                  f"layers' {value}: vLLM caches it on the sliding layers, transformers does not "
                                  "(Step3p7TextConfig keeps only the head count); kvplan will not pick one")
    named = c.get("num_experts")
    if named is not None and int(named) != experts:
        raise ConfigError(f"{c.where}: num_experts {named} contradicts the {experts} routed experts Step-3.7's engines "
                          "build (n_routed_experts / moe_num_experts, default 288); neither reads num_experts")
    shared = c.get("n_shared_experts")
    if shared is not None and int(shared) != 1:
        raise ConfigError(f"{c.where}: n_shared_experts {shared}: Step-3.7's MoE layers have one shared expert of "
                          "share_expert_dim (neither engine reads n_shared_experts)")


def _gate_width(c: Cfg, heads: int, head_dim: int) -> int:
    gating = c.get("gating", default=True)
    return heads if gating is True or gating == "per-head" else heads * head_dim


def _layer(c: Cfg, i: int, hidden: int, d: AttnDims, sparse: bool, experts: int) -> list[WeightPart]:
    bias = bool(c.get("attention_bias", default=False))
    mlp_bias = bool(c.get("mlp_bias", default=False))
    parts = base.attention_block(i, hidden, d, qkv_bias=bias, o_bias=bias)
    parts += base.norm("self_attn.q_norm", d.head_dim, layer=i) + base.norm("self_attn.k_norm", d.head_dim, layer=i)
    parts += base.linear("self_attn.g_proj", hidden, _gate_width(c, d.heads, d.head_dim), layer=i)
    if sparse:
        parts += base.router(i, hidden, experts)
        parts += base.experts(i, hidden, c.need_int("moe_intermediate_size"), experts)
        parts += base.gated_mlp(i, hidden, c.need_int("share_expert_dim"), bias=mlp_bias, prefix="mlp.shared_experts")
    else:
        parts += base.gated_mlp(i, hidden, c.need_int("intermediate_size"), bias=mlp_bias)
    return parts + base.decoder_layer_norms(i, hidden, 2)


def build(top: Cfg, c: Cfg):
    c.need_all("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "head_dim")
    n, hidden, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    mtp = int(c.get("num_nextn_predict_layers", default=0) or 0)
    kv = int(c.get("num_key_value_heads", "num_attention_groups", default=c.need_int("num_attention_heads")))
    head_dim = c.need_int("head_dim")
    experts = int(c.get("n_routed_experts", "moe_num_experts", "num_local_experts", default=0))
    _check_engines_agree(c, kv, head_dim, experts)
    kinds = attention_kinds(c, n, mtp)
    sparse = sparse_layers(c, n, mtp)
    if any(sparse) and experts <= 0:
        raise ConfigError(f"{c.where}: MoE layers need n_routed_experts (or moe_num_experts) above 0")
    heads = layer_heads(c, n, kinds)
    window = c.need_int("sliding_window") if "sliding" in kinds[:n] else None

    caches, weights = [], [base.embedding(vocab, hidden)]
    for i in range(n + mtp):
        d = AttnDims(heads[i], kv, head_dim, head_dim)
        layer = _layer(c, i, hidden, d, sparse[i], experts)
        if i < n:
            caches.append((i, base.attention_cache(kinds[i], d, window)))
            weights += layer
            continue
        # MTP (vLLM Step3p5AMultiTokenPredictorLayer; the checkpoint's model.layers.{n+j}.*): not in params
        layer += base.norm("enorm", hidden, layer=i) + base.norm("hnorm", hidden, layer=i)
        layer += base.linear("eh_proj", 2 * hidden, hidden, split="replicated", layer=i)
        layer += base.norm("shared_head.norm", hidden, layer=i)
        layer.append(WeightPart("shared_head.head", (vocab, hidden), "lm_head", "text", "vocab", i))
        weights += base.in_part(layer, "mtp")
    weights += base.norm("norm", hidden)
    is_tied = bool(top.raw.get("tie_word_embeddings") or False)
    weights += base.lm_head(vocab, hidden, is_tied)
    return caches, weights, is_tied
