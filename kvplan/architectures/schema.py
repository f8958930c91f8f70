"""The schema step between `json.loads` and the family builders: every config field kvplan reads, checked once.

Why one table: the family modules read fields with `int()` and truthiness, so a string, a NaN, a negative or a
fractional value used to become a number (`head_dim: -128` gave negative KV bytes, `tie_word_embeddings: "false"`
read as true, `sliding_window: 1.5` a window of 1). Here each field name has one rule (type, sign, integrality,
a plausible range), applied wherever the name appears in the config (text_config, vision_config, block_configs
entries ...), so a family builder only ever sees values of the right type. Integral floats (`4096.0`) are taken
as integers, as Python's config classes take them; booleans are never numbers and numbers never booleans.

Fields kvplan does not read are not checked: a genuine config carries many (initializer names, token ids).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvplan.errors import ConfigError, shown
from kvplan.spec import QUANT_SOURCE_KEY

MAX_LAYERS = 4096        # real models have fewer than 200; beyond this the per-layer plan is no longer cheap
MAX_HEADS = 1 << 16
MAX_DIM = 1 << 24        # widths, head dims, state sizes
MAX_VOCAB = 1 << 24
MAX_POSITIONS = 1 << 40  # the same bound as --ctx
MAX_EXPERTS = 1 << 16
MAX_FACTOR = 1 << 20
MAX_TEXT = 1 << 16       # characters of a string field (a hybrid pattern has one per layer)
MAX_DEPTH = 32           # nesting of the config's objects and arrays
MAX_LIST = 1 << 20       # entries of a list of names (an fp8 checkpoint's modules_to_not_convert can be long)


@dataclass(frozen=True)
class Rule:
    """What one field accepts. kind: int | number (positive) | signed | bool | str | str_list | int_list | object |
    object_list | str_or_object | index_list (a list of integers or one comma-separated string of them) | pair_list
    (a list of [integer, integer] pairs)."""

    kind: str
    low: int = 0
    high: int = MAX_DIM
    per_layer: bool = False  # an int field that may also be one value per layer (Gemma-3n intermediate_size)
    words: tuple[str, ...] = ()  # strings accepted besides the integers or flags ("auto" for Mamba's dt rank)

    def accepted(self) -> str:
        if self.kind == "bool":
            return "true or false" + "".join(f" or {w!r}" for w in self.words)
        if self.kind == "str":
            return "a string"
        if self.kind == "str_list":
            return "a list of strings"
        if self.kind == "object":
            return "an object ({...})"
        if self.kind == "str_or_object":
            return "a string or an object ({...})"
        if self.kind == "object_list":
            return f"a list of up to {MAX_LAYERS:,} objects"
        span = f"{self.low:,}..{self.high:,}"
        if self.kind == "number":
            return f"a number in {span}" if self.low else f"a positive number up to {self.high:,}"
        if self.kind == "signed":
            return f"a number from {-self.high:,} to {self.high:,}"
        if self.kind == "int_list":
            return f"a list of integers in {span}"
        if self.kind == "index_list":
            return f"a list of integers in {span} or a string of them separated by commas"
        if self.kind == "pair_list":
            return f"a list of [integer, integer] pairs in {span}"
        return (f"an integer in {span}" + (" (or one per layer)" if self.per_layer else "")
                + "".join(f" or {w!r}" for w in self.words))


def _fields(rule: Rule, *names: str) -> dict[str, Rule]:
    return dict.fromkeys(names, rule)


_LAYERS = Rule("int", 1, MAX_LAYERS)
_LAYER_COUNT = Rule("int", 0, MAX_LAYERS)
_HEADS = Rule("int", 1, MAX_HEADS)
_HEADS_OR_NONE = Rule("int", 0, MAX_HEADS)
_DIM = Rule("int", 1, MAX_DIM)
_WIDTH = Rule("int", 0, MAX_DIM, per_layer=True)
_POSITIONS = Rule("int", 1, MAX_POSITIONS)
_SPAN = Rule("int", 0, MAX_POSITIONS)  # windows and chunks: 0 means none in several configs
_EXPERTS = Rule("int", 0, MAX_EXPERTS)
_FLAG = Rule("bool")
_TEXT = Rule("str")

FIELDS: dict[str, Rule] = {
    **_fields(_LAYERS, "num_hidden_layers", "num_layers", "n_layer", "n_layers", "decoder_layers",
              "encoder_layers", "num_decoder_layers", "depth"),
    **_fields(_LAYER_COUNT, "num_nextn_predict_layers", "mtp_num_hidden_layers", "num_kv_shared_layers",
              "first_k_dense_replace", "attn_layer_offset", "attn_layer_period", "expert_layer_offset", "expert_layer_period",
              "max_window_layers", "decoder_sparse_step", "interleave_moe_layer_step",
              "full_attention_interval", "sliding_window_pattern", "_sliding_window_pattern",
              "no_rope_layer_interval", "num_ln_in_parallel_attn", "altup_num_inputs"),
    **_fields(_HEADS, "num_attention_heads", "n_head", "n_heads", "num_heads", "decoder_attention_heads",
              "encoder_attention_heads", "num_key_value_heads", "n_head_kv", "num_kv_heads", "kv_n_heads",
              "multi_query_group_num", "linear_num_key_heads", "linear_num_value_heads", "mamba_num_heads",
              "n_groups"),
    **_fields(_HEADS_OR_NONE, "n_heads_in_group"),
    **_fields(_DIM, "hidden_size", "n_embd", "n_embed", "d_model", "head_dim", "kv_channels", "attention_head_dim",
              "d_kv", "v_head_dim", "qk_rope_head_dim", "kv_lora_rank", "q_lora_rank", "linear_key_head_dim",
              "linear_value_head_dim", "mamba_head_dim", "mamba_d_state", "ssm_state_size", "state_size",
              "mamba_d_conv", "conv_kernel", "linear_conv_kernel_dim", "mamba_expand", "expand",
              "expansion_ratio", "word_embed_proj_dim", "out_hidden_size",
              "projector_input_dim", "projector_output_dim", "vision_output_dim", "image_size", "patch_size",
              "in_channels", "num_channels", "spatial_merge_size", "temporal_patch_size", "num_mel_bins",
              "num_position_embeddings", "relative_attention_num_buckets", "laurel_rank"),
    **_fields(Rule("int", 0, MAX_DIM), "qk_nope_head_dim"),
    # the Mamba-2 SSD chunk (vLLM aligns 'all'-mode prefix-caching blocks to it)
    **_fields(_DIM, "mamba_chunk_size", "chunk_size"),
    # MiniMax-M3, MiMo-V2-Flash: moe_layer_freq as one 0/1 per layer (DeepSeek's is an interval)
    **_fields(Rule("int", 0, MAX_LAYERS, per_layer=True), "moe_layer_freq"),
    # MiMo-V2-Flash: the sliding layers' own heads and window, attention sinks, the full/sliding pattern
    **_fields(_SPAN, "sliding_window_size"),
    **_fields(_HEADS, "swa_num_attention_heads", "swa_num_key_value_heads"),
    **_fields(_DIM, "swa_head_dim", "swa_v_head_dim"),
    **_fields(_FLAG, "add_swa_attention_sink_bias", "add_full_attention_sink_bias"),
    **_fields(Rule("int_list", 0, 1), "hybrid_layer_pattern"),
    # Gemma 4: 0 = no per-layer input embeddings
    **_fields(Rule("int", 0, MAX_DIM), "hidden_size_per_layer_input"),
    # Gemma 4: full-attention layers' own head_dim / KV heads, K = V, MoE beside the dense MLP; per_layer_config is a
    # re-saved config's per-layer overrides ({"05": {"head_dim": 512}}); use_bidirectional_attention is a flag in
    # Gemma-3 and "vision" / "all" in Gemma 4; the towers' sizes (Parakeet writes subsampling_conv_channels as one int)
    **_fields(_DIM, "global_head_dim", "position_embedding_size", "output_proj_dims", "conv_kernel_size"),
    **_fields(Rule("int", 1, MAX_DIM, per_layer=True), "subsampling_conv_channels"),
    **_fields(Rule("bool", words=("vision", "all")), "use_bidirectional_attention"),
    **_fields(_HEADS, "num_global_key_value_heads"),
    **_fields(_FLAG, "attention_k_eq_v", "enable_moe_block", "use_double_wide_mlp"),
    **_fields(_EXPERTS, "top_k_experts"),
    **_fields(Rule("object"), "per_layer_config"),
    # DeepSeek sparse attention (DSA): the lightning indexer and which layers run their own
    **_fields(_DIM, "index_head_dim"),
    **_fields(_HEADS, "index_n_heads"),
    **_fields(Rule("int", 1, MAX_POSITIONS), "index_topk"),
    **_fields(Rule("int", 1, MAX_LAYERS), "index_topk_freq"),
    **_fields(Rule("int", 0, MAX_LAYERS), "index_skip_topk_offset"),
    **_fields(_TEXT, "index_topk_pattern"),
    **_fields(Rule("str_list"), "indexer_types"),
    # DeepSeek-V4: per-layer compression (0, 4 or 128; one entry more for the MTP layer), hyper-connection streams,
    # grouped low-rank output projection, MXFP4 experts
    **_fields(Rule("int_list", 0, 128), "compress_ratios"),
    **_fields(Rule("int", 1, 64), "hc_mult"),
    **_fields(_HEADS, "o_groups"),
    **_fields(_DIM, "o_lora_rank"),
    **_fields(_TEXT, "expert_dtype"),
    **_fields(Rule("int", 1, MAX_DIM, words=("auto",)), "time_step_rank", "mamba_dt_rank"),
    # Granite-4.0-H (granitemoehybrid) and Bamba: their Mamba-2 fields ('auto' head dim = expand x hidden / heads),
    # the shared MLP's width (0: none), rope or NoPE attention, Bamba's attention layers
    **_fields(_HEADS, "mamba_n_heads", "mamba_n_groups"),
    **_fields(Rule("int", 1, MAX_DIM, words=("auto",)), "mamba_d_head"),
    **_fields(Rule("int", 0, MAX_DIM), "shared_intermediate_size"),
    **_fields(_TEXT, "position_embedding_type"),
    **_fields(Rule("int_list", 0, MAX_LAYERS), "attn_layer_indices"),
    # LFM2 (transformers Lfm2Config): conv window taps, the conv width vLLM reads, the MLP width and its sizing
    **_fields(Rule("int", 2, 1 << 10), "conv_L_cache"),
    **_fields(_DIM, "conv_dim", "block_dim", "block_multiple_of"),
    **_fields(_WIDTH, "block_ff_dim"),
    **_fields(Rule("number", 0, 1 << 10), "block_ffn_dim_multiplier"),
    **_fields(_FLAG, "conv_bias", "block_auto_adjust_ff_dim", "tie_embedding"),
    **_fields(Rule("int_list", 0, MAX_LAYERS), "full_attn_idxs"),
    **_fields(Rule("int", 0, MAX_LAYERS), "num_dense_layers"),
    **_fields(_FLAG, "use_expert_bias"),
    # Falcon-H1 (FalconH1Config): the Mamba-2 mixer beside attention in every layer (mamba_n_heads, mamba_n_groups
    # and mamba_d_head as Granite's above)
    **_fields(_DIM, "mamba_d_ssm"),
    **_fields(_FLAG, "mamba_rms_norm", "projectors_bias"),
    # Zamba2 (Zamba2Config): Mamba-2 heads / groups / head dim, the shared blocks, their per-position adapters, the
    # hybrid layers (hybrid_layer_ids restates layers_block_type), the shared attention's width
    **_fields(_HEADS, "n_mamba_heads", "mamba_ngroups"),
    **_fields(_DIM, "mamba_headdim", "adapter_rank", "attention_hidden_size"),
    **_fields(Rule("int", 1, MAX_LAYERS), "num_mem_blocks"),
    **_fields(_FLAG, "use_shared_attention_adapter", "use_shared_mlp_adapter", "use_mem_rope", "use_long_context"),
    **_fields(Rule("int_list", 0, MAX_LAYERS), "hybrid_layer_ids"),
    **_fields(_DIM, "moe_latent_size"),  # Nemotron-3 Super / Ultra: the experts' width
    **_fields(_WIDTH, "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size",
              "moe_shared_expert_intermediate_size",
              "ffn_hidden_size", "ffn_dim", "d_ff", "decoder_ffn_dim", "encoder_ffn_dim", "n_inner",
              "intermediate_size_mlp"),
    **_fields(Rule("int", 1, MAX_VOCAB), "vocab_size", "padded_vocab_size", "vocab_size_per_layer_input"),
    **_fields(_POSITIONS, "max_position_embeddings", "max_target_positions", "max_source_positions", "n_positions",
              "seq_length", "max_seq_len", "max_seq_length", "max_sequence_length", "seq_len", "model_max_length",
              "original_max_position_embeddings"),
    **_fields(_SPAN, "sliding_window", "attention_chunk_size"),
    **_fields(_EXPERTS, "num_experts", "num_local_experts", "n_routed_experts", "n_shared_experts",
              "num_experts_per_tok", "experts_per_token", "moe_num_experts"),
    **_fields(_FLAG, "tie_word_embeddings", "attention_bias", "mlp_bias", "use_bias", "add_bias_linear",
              "add_qkv_bias", "mamba_conv_bias", "mamba_proj_bias", "use_conv_bias", "multi_query",
              "multi_query_attention", "parallel_attn", "new_decoder_architecture", "no_bias", "rmsnorm",
              "do_layer_norm_before", "_remove_final_layer_norm", "post_layer_norm", "vision_use_head",
              "multi_modal_projector_bias", "use_sliding_window", "enable_bias", "is_encoder_decoder", "no_op",
              "replace_with_linear", "is_gated_act"),
    **_fields(_TEXT, "model_type", "torch_dtype", "dtype", "quant_method", "feed_forward_proj",
              "hybrid_override_pattern", "rope_type", "kv_cache_quant_algo", "mamba_ssm_dtype",
              "mamba_ssm_cache_dtype"),
    **_fields(Rule("str_list"), "architectures", "layer_types", "layers_block_type", "modules_to_not_convert",
              "ignore", "exclude_modules"),
    # NVFP4 exports: compressed-tensors / newer ModelOpt config_groups {group: {weights: {num_bits, type,
    # group_size}}} and the compressed-tensors `format` (nvfp4-pack-quantized)
    **_fields(Rule("object"), "config_groups", "weights"),
    # ModelOpt MIXED_PRECISION: {module path: {quant_algo, group_size}} (architectures/modelopt_mixed.py)
    **_fields(Rule("object"), "quantized_layers"),
    **_fields(_TEXT, "format"),
    **_fields(_FLAG, "bias"),
    **_fields(Rule("int", 1, 64), "bits", "num_bits"),
    **_fields(Rule("int", -1, MAX_DIM), "group_size"),  # GPTQ: -1 = one group per row
    **_fields(_TEXT, "fmt"),
    **_fields(Rule("object"), "text_config", "llm_config", "language_config", "vision_config", "audio_config",
              "quantization_config", "attn_config", "ffn_config", "rope_scaling",
              "rope_parameters"),
    **_fields(Rule("object_list"), "block_configs"),
    # compressed-tensors writes an object ({type, num_bits}); ModelOpt exports a string ("FP8")
    **_fields(Rule("str_or_object"), "kv_cache_scheme"),
    **_fields(_TEXT, "quant_algo"),
    **_fields(Rule("int_list", 0, MAX_POSITIONS), "mlp_only_layers", "no_rope_layers", "deepstack_visual_indexes",
              "moe_layers"),
    # Step-3.7 (step3p7 / its step3p5 text_config): the Hub release's vendor spellings (moe_layers_enum "3,4,...",
    # attention_other_setting {attention_type, num_attention_heads, num_attention_groups, head_dim}, moe_top_k,
    # num_attention_groups) and transformers' own (mlp_layer_types, num_sliding_attention_heads, gating, the MTP
    # layers' mtp_layer_types / mtp_mlp_layer_types); the shared expert's width; the tower projector's bias
    **_fields(Rule("index_list", 0, MAX_LAYERS), "moe_layers_enum"),
    **_fields(Rule("str_list"), "mlp_layer_types", "mtp_layer_types", "mtp_mlp_layer_types"),
    **_fields(Rule("object"), "attention_other_setting", "sparse_attention_config"),
    **_fields(_TEXT, "attention_type"),
    **_fields(_HEADS, "num_attention_groups", "num_sliding_attention_heads"),
    **_fields(Rule("int", 0, MAX_DIM), "share_expert_dim"),
    **_fields(_EXPERTS, "moe_top_k"),
    **_fields(Rule("bool", words=("per-head",)), "gating"),
    **_fields(_FLAG, "projector_bias"),
    **_fields(Rule("int_list", 1, MAX_DIM), "weight_block_size"),
    # the rotary tables engines build with the model (rope.py): rotated share of a head, bases, ALiBi instead
    **_fields(_DIM, "rotary_dim"),
    **_fields(Rule("number", 0, 1), "partial_rotary_factor", "rotary_pct"),
    **_fields(Rule("number", 0, 1 << 50), "rope_theta", "swa_rope_theta", "rope_local_base_freq"),
    **_fields(_FLAG, "alibi"),
    # Kimi Linear / Kimi-K3: the KDA layers' settings (linear_attn_config, scoped below), MLA's output gate, latent
    # MoE (routed_expert_hidden_size, its norm), shared experts, Kimi-K3's Attention Residuals
    **_fields(Rule("object"), "linear_attn_config"),
    **_fields(_FLAG, "mla_use_output_gate", "latent_moe_use_norm"),
    **_fields(_DIM, "routed_expert_hidden_size"),
    **_fields(_EXPERTS, "num_shared_experts"),
    **_fields(_LAYERS, "attn_res_block_size"),
    # Llama-3.2-Vision (mllama): the cross-attention layer indices, the vision tower's global layers, heads, tiles and
    # the encoder layers whose outputs it concatenates, the [width, height] tile arrangements it embeds
    **_fields(Rule("int_list", 0, MAX_LAYERS), "cross_attention_layers", "intermediate_layers_indices"),
    **_fields(Rule("pair_list", 1, 1 << 10), "supported_aspect_ratios"),
    **_fields(_LAYER_COUNT, "num_global_layers"),
    **_fields(_HEADS, "attention_heads"),
    **_fields(Rule("int", 1, 1 << 10), "max_num_tiles"),
    # MiniMax-M3: the dense layers' MLP width, MTP modules, the MoE's routing bias (sparse_attention_config scoped)
    **_fields(_WIDTH, "dense_intermediate_size"),
    **_fields(_LAYER_COUNT, "num_mtp_modules"),
    **_fields(_FLAG, "use_routing_bias"),
    # MiniMax-01 (MiniMax-Text-01 / M1 remote code, vLLM): 0 = lightning attention, 1 = softmax attention, per layer
    **_fields(Rule("int_list", 0, 1), "attn_type_list", "decoder_attention_types"),
}
# Fields whose names mean something else elsewhere, checked only inside their container.
_ROPE = {"factor": Rule("number", 0, MAX_FACTOR), "type": _TEXT}
SCOPED: dict[str, dict[str, Rule]] = {
    "linear_attn_config": {**_fields(Rule("int_list", 1, MAX_LAYERS), "kda_layers", "full_attn_layers"),
                           "short_conv_kernel_size": _DIM, "use_full_rank_gate": _FLAG,
                           "gate_lower_bound": Rule("signed", 0, 1 << 20)},
    # MiniMax-M3: which layers run sparse attention (one 0/1 per layer), the indexer's key width and query heads, and
    # whether a sparse layer has index value/output projections
    "sparse_attention_config": {**_fields(Rule("int_list", 0, 1), "sparse_attention_freq", "sparse_disable_index_value"),
                                "sparse_index_dim": _DIM, "sparse_num_index_heads": _HEADS},
    "rope_scaling": _ROPE,
    "rope_parameters": _ROPE,
    "block_configs": {"attention": Rule("object"), "ffn": Rule("object"), "ffn_mult": Rule("number", 0, 1 << 10)},
    # Step-3.7's vision_config in the release's spelling (Step3p7VisionConfig pops width / layers / heads into
    # hidden_size / num_hidden_layers / num_attention_heads; intermediate_size = int(hidden_size x mlp_ratio))
    "vision_config": {"width": _DIM, "layers": _LAYERS, "heads": _HEADS, "mlp_ratio": Rule("number", 0, 1 << 10)},
}
CONTAINERS = ("object", "object_list", "str_or_object")


def validate(config: dict[str, Any], where: str = "config") -> dict[str, Any]:
    """The config with every field kvplan reads checked (ConfigError naming field, value and what is accepted),
    integral floats turned into ints. The input is not modified."""
    return _object(config, where, FIELDS, 0)


def _object(obj: dict[str, Any], where: str, fields: dict[str, Rule], depth: int) -> dict[str, Any]:
    if depth > MAX_DEPTH:
        raise ConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels; a model config is a few levels deep")
    out: dict[str, Any] = {}
    for key, value in obj.items():
        path = f"{where}.{key}"
        if key == "quantization_config" and isinstance(value, dict) and isinstance(value.get(QUANT_SOURCE_KEY), str):
            path = f"{value[QUANT_SOURCE_KEY]}:quantization"  # read from the export's hf_quant_config.json
        rule = fields.get(key)
        if value is None:
            out[key] = None
        elif rule is not None and rule.kind not in CONTAINERS:
            out[key] = _check(value, rule, path)
        else:
            if rule is not None:
                _check(value, rule, path)
            inner = {**fields, **SCOPED[key]} if key in SCOPED else fields
            out[key] = _nested(value, path, inner, depth + 1)
    return out


def _nested(value: Any, where: str, fields: dict[str, Rule], depth: int) -> Any:
    if isinstance(value, dict):
        return _object(value, where, fields, depth)
    if isinstance(value, list):
        if depth > MAX_DEPTH:
            raise ConfigError(f"{where}: nested deeper than {MAX_DEPTH} levels; a model config is a few levels deep")
        return [_nested(v, f"{where}[{i}]", fields, depth + 1) for i, v in enumerate(value)]
    return value


def _check(value: Any, rule: Rule, where: str) -> Any:
    if rule.kind == "bool":
        if isinstance(value, bool) or (isinstance(value, str) and value in rule.words):
            return value
    elif rule.kind == "str":
        if isinstance(value, str) and len(value) <= MAX_TEXT:
            return value
    elif rule.kind == "str_list":
        if isinstance(value, list) and len(value) <= MAX_LIST and all(isinstance(v, str) for v in value):
            return value
    elif rule.kind == "object":
        if isinstance(value, dict):
            return value
    elif rule.kind == "str_or_object":
        if isinstance(value, dict) or (isinstance(value, str) and len(value) <= MAX_TEXT):
            return value
    elif rule.kind == "object_list":
        if isinstance(value, list) and len(value) <= MAX_LAYERS and all(isinstance(v, dict) for v in value):
            return value
    elif rule.kind == "int_list":
        if isinstance(value, list) and len(value) <= MAX_LAYERS:
            items = [_integer(v, rule) for v in value]
            if all(i is not None for i in items):
                return items
    elif rule.kind == "pair_list":
        if isinstance(value, list) and 0 < len(value) <= MAX_LAYERS and all(isinstance(p, list) and len(p) == 2
                                                                           for p in value):
            items = [[_integer(v, rule) for v in p] for p in value]
            if all(i is not None for p in items for i in p):
                return items
    elif rule.kind == "index_list":
        if isinstance(value, list) and len(value) <= MAX_LAYERS:
            items = [_integer(v, rule) for v in value]
            if all(i is not None for i in items):
                return items
        if isinstance(value, str) and len(value) <= MAX_TEXT:
            parts = [p.strip() for p in value.split(",") if p.strip()]
            if all(p.isdigit() and rule.low <= int(p) <= rule.high for p in parts):
                return value
    elif rule.kind == "number":
        if _is_number(value) and 0 < value <= rule.high:
            return value
    elif rule.kind == "signed":
        if _is_number(value) and -rule.high <= value <= rule.high:
            return value
    else:
        number = _integer(value, rule)
        if number is not None:
            return number
        if value in rule.words:
            return value
        if rule.per_layer and isinstance(value, list) and 0 < len(value) <= MAX_LAYERS:
            items = [_integer(v, rule) for v in value]
            if all(i is not None for i in items):
                return items
    raise ConfigError(f"{where} must be {rule.accepted()}, found {shown(value)}")


def _is_number(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    return isinstance(value, int) or isinstance(value, float) and math.isfinite(value)  # a 1,000-digit int is no float


def _integer(value: Any, rule: Rule) -> int | None:
    if not _is_number(value) or value != int(value):
        return None
    number = int(value)
    return number if rule.low <= number <= rule.high else None

