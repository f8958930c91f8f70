"""config.json -> ModelSpec. One small module per family quirk; this file only picks the family.

Families are recognised by their fields first (block_configs, MLA's kv_lora_rank), then by model_type;
anything else goes down the default plain-decoder path (llama naming).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Callable

from kvplan.architectures import (
    base, classic, cohere2, decoder, deepseek, deepseek_v4, defaults, encdec, gemma, gpt_oss, hybrid, kimi, llama4,
    mimo, minimax01, minimax_m3, mllama, modelopt_mixed, nemotron_nas, rope, schema, step, vision, zamba2,
)
from kvplan.architectures.base import Cfg
from kvplan.errors import ConfigError
from kvplan.spec import (
    COUNTED_WEIGHT_FORMATS, ModelSpec, Quantization, SlidingWindow, WeightPart, Widths, WindowBeyondContext,
)

TEXT_CONFIG_KEYS = ("text_config", "llm_config", "language_config")


@dataclass(frozen=True)
class Family:
    """A model family: how to recognise its config, how to build its layers, where its context limit lives."""
    name: str
    matches: Callable[[Cfg, Cfg], bool]
    build: Callable[[Cfg, Cfg], tuple]
    max_ctx_keys: tuple[str, ...] = base.HF_MAX_KEYS
    # a config flag that sets the length limit for transformers and vLLM alike (Zamba2's use_long_context)
    context_limit: Callable[[Cfg], tuple[int, str] | None] | None = None


def _mt(*names: str) -> Callable[[Cfg, Cfg], bool]:
    return lambda top, text: str(text.get("model_type", default="")) in names or str(top.get("model_type", default="")) in names


FAMILIES: tuple[Family, ...] = (
    Family("nemotron-nas", lambda top, text: text.has("block_configs"), nemotron_nas.build),
    Family("deepseek-v4", lambda top, text: deepseek_v4.is_deepseek_v4(text), deepseek_v4.build),
    # Kimi Linear / Kimi-K3 (its text_config): KDA + MLA; transformers maps max_position_embeddings to model_max_length
    Family("kimi-linear", _mt("kimi_linear"), kimi.build, ("max_position_embeddings", "model_max_length")),
    Family("deepseek-mla", lambda top, text: deepseek.is_mla(text), deepseek.build),
    Family("mamba", _mt("mamba", "falcon_mamba"), hybrid.mamba),
    Family("mamba2", _mt("mamba2"), hybrid.mamba2),
    Family("jamba", _mt("jamba"), hybrid.jamba),
    Family("nemotron-h", _mt("nemotron_h"), hybrid.nemotron_h),
    Family("granite-hybrid", _mt("granitemoehybrid"), hybrid.granite_hybrid),
    Family("bamba", _mt("bamba"), hybrid.bamba),
    Family("qwen3-next", _mt("qwen3_next"), hybrid.qwen3_next),
    Family("lfm2", _mt("lfm2", "lfm2_moe"), hybrid.lfm2),
    Family("falcon-h1", _mt("falcon_h1"), hybrid.falcon_h1),
    Family("zamba2", _mt("zamba2"), zamba2.build, context_limit=zamba2.max_ctx),
    Family("qwen3.5", _mt("qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"), hybrid.qwen3_5),
    Family("falcon", _mt("falcon", "RefinedWeb", "RefinedWebModel"), classic.falcon),
    Family("mpt", _mt("mpt"), classic.mpt, ("max_seq_len",)),
    Family("dbrx", _mt("dbrx"), classic.dbrx, ("max_seq_len",)),
    Family("chatglm", _mt("chatglm", "glm"), classic.chatglm, ("seq_length", "max_position_embeddings")),
    Family("qwen-v1", _mt("qwen"), classic.qwen_v1, ("seq_length", "max_position_embeddings")),
    Family("gpt2", _mt("gpt2", "gpt_bigcode"), classic.gpt2),
    Family("bloom", _mt("bloom"), classic.bloom),
    Family("opt", _mt("opt"), classic.opt),
    Family("gpt-neox", _mt("gpt_neox"), classic.gpt_neox),
    Family("gemma3n", _mt("gemma3n", "gemma3n_text"), gemma.gemma3n),
    Family("gemma4", _mt("gemma4", "gemma4_text"), gemma.gemma4),
    Family("gemma", _mt("gemma", "gemma2", "gemma3", "gemma3_text"), gemma.build),
    Family("gpt-oss", _mt("gpt_oss"), gpt_oss.build),
    Family("mimo-v2-flash", _mt("mimo_v2_flash"), mimo.build),
    # MiniMax-01 lightning attention: MiniMax-Text-01 / MiniMax-M1 (remote code) and transformers' native minimax
    Family("minimax-01", _mt(*minimax01.MODEL_TYPES), minimax01.build),
    # MiniMax-M3: the flat text config (aiconfigurator's copy) or vLLM's / transformers' text-config types
    Family("minimax-m3", _mt("minimax_m3", "minimax_m3_text", "minimax_m3_vl_text"), minimax_m3.build),
    # Step-3.7: the step3p7 wrapper (its text_config is model_type step3p5) or the flat text-only file
    Family("step-3.7", _mt("step3p7"), step.build),
    Family("llama4", _mt("llama4", "llama4_text"), llama4.build),
    Family("cohere2", _mt("cohere2"), cohere2.build),
    Family("smollm3", _mt("smollm3"), decoder.smollm3),
)
DEFAULT = Family("decoder", lambda top, text: True, decoder.build)
ENCODER_DECODER = {"t5": (encdec.t5, ("n_positions",)), "mt5": (encdec.t5, ("n_positions",)),
                   "whisper": (encdec.whisper, ("max_target_positions",)),
                   # Llama-3.2-Vision: cross-attention layers over the vision tower's output (architectures/mllama.py)
                   "mllama": (mllama.build, base.HF_MAX_KEYS),
                   "bart": (encdec.bart, ("max_position_embeddings",)),
                   "mbart": (encdec.bart, ("max_position_embeddings",))}


def text_view(top: Cfg) -> Cfg:
    """The language model's config (a nested text_config / llm_config / language_config, or the top level),
    read with its transformers class defaults."""
    text = top
    for key in TEXT_CONFIG_KEYS:
        if isinstance(top.raw.get(key), dict):
            text = top.sub(key)
            break
    model_type = str(text.raw.get("model_type") or top.raw.get("model_type") or "")
    return Cfg(text.raw, defaults.for_model_type(model_type), text.where)


# Fields that mean a cache other than plain attention. For a model_type kvplan does not know, reading such a
# config as a llama-style decoder would print a plain-attention figure for a model that is not one: refused
# instead, naming the fields. (Known families read them in their own modules.)
FOREIGN_CACHE_FIELDS: dict[str, tuple[str, ...]] = {
    "linear-attention state": ("linear_num_value_heads", "linear_num_key_heads", "linear_key_head_dim",
                               "linear_value_head_dim", "linear_conv_kernel_dim", "full_attention_interval",
                               "linear_attn_config", "attn_type_list", "decoder_attention_types"),
    "Mamba/SSM state": ("mamba_d_state", "mamba_d_conv", "mamba_expand", "mamba_num_heads", "ssm_state_size",
                        "state_size", "time_step_rank", "hybrid_override_pattern", "layers_block_type",
                        "attn_layer_period", "mamba_dt_rank", "ssm_cfg"),
    "short-convolution state": ("conv_L_cache", "conv_bias", "block_dim", "full_attn_idxs"),
    "latent attention": ("kv_lora_rank", "q_lora_rank", "compress_ratios"),
    "sparse-attention index": ("index_topk", "index_n_heads", "index_head_dim", "sparse_attention_config"),
    "per-layer attention kinds": ("hybrid_layer_pattern", "swa_num_key_value_heads", "swa_head_dim",
                                  "swa_num_attention_heads"),
    # not a cache field: the weights of an unknown mixture-of-experts family would be a llama-style guess, off by
    # the experts (MiniMax-M2 read so: 4.8 of 229 billion parameters)
    "mixture-of-experts weights": ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts",
                                   "moe_intermediate_size"),
    "shared KV": ("num_kv_shared_layers", "kv_sharing"),
    "cross attention": ("cross_attention_layers",),
}


# Config fields that declare a state dtype (Qwen3.5 mamba_ssm_dtype, Nemotron-H mamba_ssm_cache_dtype), kept on the
# spec as written for the engines that honour them.
STATE_DTYPE_FIELDS = ("mamba_ssm_dtype", "mamba_ssm_cache_dtype")


def _unknown_family(text: Cfg) -> list[str]:
    """A config whose model_type no family module claims: refuse one that carries non-plain cache fields, else
    the warning every output repeats."""
    model_type = str(text.raw.get("model_type") or "")
    if model_type in decoder.QUIRKS:
        return []
    found = {what: [f for f in names if text.raw.get(f) is not None] for what, names in FOREIGN_CACHE_FIELDS.items()}
    found = {what: fs for what, fs in found.items() if fs}
    shown_type = f"model_type '{model_type}'" if model_type else "a config without model_type"
    if found:
        detail = "; ".join(f"{what}: {', '.join(fs)}" for what, fs in found.items())
        raise ConfigError(f"{text.where}: {shown_type} is not a family kvplan knows, and its config carries fields "
                          f"kvplan cannot interpret for it ({detail}); kvplan will not size it as a plain decoder "
                          "(the README's family table lists what it sizes)")
    window = " (sliding_window applied to every layer)" if text.raw.get("sliding_window") else ""
    return [f"{shown_type} is not a family kvplan knows: sized as a llama-style decoder from its standard fields "
            f"(layers, heads, KV heads, head_dim){window}; check the figure against the model's code"]


def family_of(top: Cfg, text: Cfg) -> Family:
    for fam in FAMILIES:
        if fam.matches(top, text):
            return fam
    return DEFAULT


def _windows_beyond_context(caches, max_ctx):
    """A sliding window no shorter than the model's context never slides (Phi-3.5: 262,144 vs 131,072)."""
    if not max_ctx:
        return caches, 0
    out, widened = [], 0
    for i, c in caches:
        if isinstance(c, SlidingWindow) and c.window >= max_ctx:
            widened = c.window
            c = WindowBeyondContext(c.kv_heads, c.head_dim_k, c.head_dim_v, window=c.window)
        out.append((i, c))
    return out, widened


def normalize(config: dict[str, Any], *, encoder_len: int | None = None) -> ModelSpec:
    """Build the ModelSpec of a raw config.json dict."""
    if not isinstance(config, dict):
        raise ConfigError("a model config must be a JSON object")
    config = schema.validate(config)
    top = Cfg(config)
    text = text_view(top)
    model_type = str(text.get("model_type", default=top.get("model_type", default="")))
    arch = (top.get("architectures") or text.get("architectures") or [""])[0]
    top_type = str(top.get("model_type", default=""))
    notes: list[str] = []
    warnings: list[str] = []
    if top_type in ENCODER_DECODER:
        build, keys = ENCODER_DECODER[top_type]
        caches, weights, tied, n_layers, enc_len, _dims = build(top, text, encoder_len)
        family, is_enc_dec, fam = top_type, True, None
        notes.append(mllama.encoder_note(top, enc_len) if top_type == "mllama"
                     else f"cross-attention over {enc_len:,} encoder positions per sequence")
    else:
        fam = family_of(top, text)
        if fam is DEFAULT:
            warnings.extend(_unknown_family(text))
        caches, weights, tied = fam.build(top, text)
        family, keys, is_enc_dec, enc_len = fam.name, fam.max_ctx_keys, False, None
        n_layers = max((i for i, _ in caches), default=-1) + 1
        tower, tower_notes = vision.vision_weights(top, int(text.get("hidden_size", "d_model", default=0) or 0))
        weights = list(weights) + tower
        warnings.extend(tower_notes)
    if not caches:
        raise ConfigError("the config describes a model without layers (num_hidden_layers is 0?)")
    max_ctx, max_src = base.hf_max_ctx(text, top, keys=keys)
    vmax, vsrc = base.vllm_max_ctx(text)
    if family in ("mamba", "mamba2"):
        max_ctx, max_src = None, "none (a state-space model has no position limit)"
        vmax, vsrc = None, max_src
    limit = fam.context_limit(text) if fam is not None and fam.context_limit else None
    if limit:
        (max_ctx, max_src), (vmax, vsrc) = limit, limit
    caches, widened = _windows_beyond_context(caches, max_ctx)
    if widened:
        notes.append(f"sliding_window {widened:,} >= the model's {max_ctx:,}-token limit: full attention "
                     "(vLLM still reserves it as a sliding window: one block more per request)")
    # MiniMax-M3 states its MTP modules as num_mtp_modules (7; vLLM's n_predict) beside num_nextn_predict_layers 1
    # (Qwen3-Next / Qwen3.5 as mtp_num_hidden_layers)
    mtp = int(text.get("num_mtp_modules", "num_nextn_predict_layers", "mtp_num_hidden_layers", default=0) or 0)
    quant = base.quantization(top, text)
    if quant is not None and quant.method == "mixed":
        quant = _map_mixed(quant, weights)
    if quant is not None and quant.method not in COUNTED_WEIGHT_FORMATS:
        warnings.append(f"the checkpoint's weights are {quant.detail.split(';')[0]}, a format kvplan does not count: "
                        "weights are counted unquantized (an upper bound); --weight-dtype counts another format")
    weights = [*weights, *base.kv_cache_scales(quant, weights)]
    return ModelSpec(
        architecture=arch or model_type,
        model_type=model_type,
        family=family,
        num_layers=n_layers,
        caches=tuple(caches),
        dtype=base.model_dtype(text, top),
        weights=tuple(weights),
        max_ctx=max_ctx,
        max_ctx_source=max_src,
        vllm_max_ctx=vmax,
        vllm_max_ctx_source=vsrc,
        tied_embeddings=tied,
        quantization=quant,
        is_encoder_decoder=is_enc_dec,
        encoder_len=enc_len,
        mtp_layers=mtp,
        notes=tuple(notes),
        widths=_widths(text),
        warnings=tuple(warnings),
        config_state_dtypes=tuple((k, str(text.raw[k])) for k in STATE_DTYPE_FIELDS if text.raw.get(k) is not None),
        mamba_chunk_size=_mamba_chunk_size(text),
        rope_tables=rope.tables(family, model_type, top, text),
        encoder_shape=encdec.whisper_encoder(text) if family == "whisper" else None,
    )


def _map_mixed(quant: Quantization, weights: list[WeightPart]) -> Quantization:
    """A MIXED_PRECISION export's formats on kvplan's weight parts; entries naming modules kvplan does not build
    leave the whole export uncounted (warned below with the other uncounted formats), never partly guessed."""
    mapping = modelopt_mixed.assign(weights, dict(quant.mixed_entries))
    if mapping.unmatched:
        n, shown = len(mapping.unmatched), mapping.unmatched[0]
        return replace(quant, method=modelopt_mixed.UNCOUNTED,
                       detail=f"quantized (ModelOpt MIXED_PRECISION: {n:,} of its {len(quant.mixed_entries):,} "
                              f"quantized_layers entries name modules kvplan does not build, e.g. {shown!r})")
    return replace(quant, part_formats=tuple(mapping.formats.items()))


def _mamba_chunk_size(c: Cfg) -> int:
    """mamba_chunk_size (Bamba, Falcon-H1, Granite), else chunk_size (Mamba-2, Nemotron-H, Zamba2): the order of
    vLLM's ModelConfig.get_mamba_chunk_size (schema.py holds both to positive integers); 0 when neither is set."""
    value = c.raw.get("mamba_chunk_size")
    if value is None:
        value = c.raw.get("chunk_size")
    return int(value or 0)


def _widths(c: Cfg) -> Widths:
    hidden = int(c.get("hidden_size", "d_model", "n_embd", "n_embed", default=0) or 0)
    vocab = int(c.get("padded_vocab_size", "vocab_size", default=0) or 0)
    dense = c.get("intermediate_size", "ffn_hidden_size", "ffn_dim", "d_ff", "decoder_ffn_dim", "n_inner",
                  default=4 * hidden) or 4 * hidden
    dense = max(dense) if isinstance(dense, list) else int(dense)  # Gemma-3n: one size per layer
    top_k = int(c.get("num_experts_per_tok", "experts_per_token", "top_k_experts", "moe_top_k", default=0) or 0)
    moe = int(c.get("moe_intermediate_size", default=0) or 0)
    return Widths(hidden, vocab, max(dense, top_k * moe), top_k, (moe or dense) if top_k else 0)
