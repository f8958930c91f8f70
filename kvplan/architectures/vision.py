"""Vision (and audio) towers and multimodal projectors: parameters only (they hold no KV cache).

One function per vision_config.model_type, one per wrapper architecture's projector; shapes follow the
transformers modules named in each docstring. An audio tower kvplan models (Gemma 4's) is counted as the `encoder`
part (JSON `encoder_params`): like an encoder-decoder's encoder it runs once per input on the first pipeline stage.
"""

from __future__ import annotations

from kvplan.architectures import base
from kvplan.architectures.base import Cfg
from kvplan.errors import ConfigError
from kvplan.spec import WeightPart

V = "vision"


def _lin(name: str, d_in: int, d_out: int, bias: bool = True, split: str = "column") -> list[WeightPart]:
    """A tower linear, split over tensor parallelism as vLLM's and SGLang's tower code does by default
    (mm_encoder_tp_mode "weights": Column/Row/QKVParallelLinear); `split="row"` for the output projections (whose
    bias stays whole), "replicated" for towers an engine runs unsplit."""
    return base.linear(name, d_in, d_out, bias=bias, part=V, split=split)


def _row(name: str, d_in: int, d_out: int, bias: bool = True) -> list[WeightPart]:
    return _lin(name, d_in, d_out, bias, split="row")


def _whole(name: str, d_in: int, d_out: int) -> list[WeightPart]:
    """A bias-free linear that stays unsplit under tensor parallelism."""
    return _lin(name, d_in, d_out, False, split="replicated")


def _ln(name: str, dim: int, bias: bool = True) -> list[WeightPart]:
    return base.norm(name, dim, bias=bias, part=V)


def siglip(v: Cfg) -> list[WeightPart]:
    """SiglipVisionModel (Gemma-3): conv patch embed, learned positions, pre-LN encoder, post LN, optional head."""
    v.need_all("hidden_size", "intermediate_size", "num_hidden_layers", "image_size", "patch_size")
    h, inter = v.need_int("hidden_size"), v.need_int("intermediate_size")
    patch, image, ch = v.need_int("patch_size"), v.need_int("image_size"), int(v.get("num_channels", default=3))
    parts = [WeightPart("patch_embedding", (h, ch, patch, patch), "other", V), WeightPart("patch_embedding.bias", (h,), "bias", V)]
    parts.append(WeightPart("position_embedding", ((image // patch) ** 2, h), "other", V))
    for _ in range(v.need_int("num_hidden_layers")):
        parts += _ln("layer_norm1", h) + _ln("layer_norm2", h)
        parts += _lin("q_proj", h, h) + _lin("k_proj", h, h) + _lin("v_proj", h, h) + _row("out_proj", h, h)
        parts += _lin("mlp.fc1", h, inter) + _row("mlp.fc2", inter, h)
    parts += _ln("post_layernorm", h)
    if v.get("vision_use_head", default=True):  # the pooling head: probe + multihead attention + LN + MLP (vLLM:
        # torch's nn.MultiheadAttention, unsplit)
        parts.append(WeightPart("head.probe", (1, 1, h), "other", V))
        parts += _lin("head.attention.in_proj", h, 3 * h, split="replicated")
        parts += _lin("head.attention.out_proj", h, h, split="replicated")
        parts += _ln("head.layernorm", h) + _lin("head.mlp.fc1", h, inter) + _row("head.mlp.fc2", inter, h)
    return parts


def qwen3_vl(v: Cfg) -> list[WeightPart]:
    """Qwen3VLVisionModel: Conv3d patch embed, learned positions, blocks, a merger and the deepstack mergers."""
    v.need_all("hidden_size", "intermediate_size", "depth", "out_hidden_size", "patch_size", "num_position_embeddings")
    h, inter, out = v.need_int("hidden_size"), v.need_int("intermediate_size"), v.need_int("out_hidden_size")
    patch, t = v.need_int("patch_size"), int(v.get("temporal_patch_size", default=2))
    ch, merge = int(v.get("in_channels", default=3)), int(v.get("spatial_merge_size", default=2))
    merged = h * merge * merge
    parts = [WeightPart("patch_embed.proj", (h, ch, t, patch, patch), "other", V), WeightPart("patch_embed.proj.bias", (h,), "bias", V)]
    parts.append(WeightPart("pos_embed", (v.need_int("num_position_embeddings"), h), "other", V))
    for _ in range(v.need_int("depth")):
        parts += _ln("norm1", h) + _ln("norm2", h)
        parts += _lin("attn.qkv", h, 3 * h) + _row("attn.proj", h, h)
        parts += _lin("mlp.linear_fc1", h, inter) + _row("mlp.linear_fc2", inter, h)

    def merger(postshuffle: bool) -> list[WeightPart]:
        return _ln("merger.norm", merged if postshuffle else h) + _lin("merger.linear_fc1", merged, merged) + _row(
            "merger.linear_fc2", merged, out
        )

    parts += merger(False)
    for _ in v.get("deepstack_visual_indexes", default=[]) or []:
        parts += merger(True)
    return parts


def llama4_vision(v: Cfg) -> list[WeightPart]:
    """Llama4VisionModel: unfold+linear patch embed, class token, positions, LN pre/post, encoder, pixel-shuffle MLP."""
    v.need_all("hidden_size", "intermediate_size", "num_hidden_layers", "image_size", "patch_size",
               "projector_input_dim", "projector_output_dim")
    h, inter = v.need_int("hidden_size"), v.need_int("intermediate_size")
    patch, image, ch = v.need_int("patch_size"), v.need_int("image_size"), int(v.get("num_channels", default=3))
    parts = [
        WeightPart("class_embedding", (h,), "other", V),
        WeightPart("positional_embedding_vlm", ((image // patch) ** 2 + 1, h), "other", V),
        *_lin("patch_embedding.linear", ch * patch * patch, h, bias=False),
        *_ln("layernorm_pre", h), *_ln("layernorm_post", h),
    ]
    for _ in range(v.need_int("num_hidden_layers")):
        parts += _lin("q_proj", h, h) + _lin("k_proj", h, h) + _lin("v_proj", h, h) + _row("o_proj", h, h)
        parts += _lin("mlp.fc1", h, inter) + _row("mlp.fc2", inter, h)
        parts += _ln("input_layernorm", h) + _ln("post_attention_layernorm", h)
    pin, pout = v.need_int("projector_input_dim"), v.need_int("projector_output_dim")
    parts += _lin("vision_adapter.mlp.fc1", inter, pin, bias=False)
    parts += _row("vision_adapter.mlp.fc2", pin, pout, bias=False)
    return parts


def gemma4_vision(v: Cfg) -> list[WeightPart]:
    """Gemma4VisionModel (transformers 5.24 modeling_gemma4.py): a bias-free linear patch embedder with a 2 x
    position_embedding_size x hidden position table, encoder layers like the text model's (q/k RMSNorm over head_dim,
    v_norm without weight, gated MLP, 4 norms), a pooler without weights. std_bias / std_scale (standardize) and the
    clipping bounds (use_clipped_linears) are buffers, not parameters. vLLM builds this tower with transformers'
    AutoModel and its projection as a ReplicatedLinear: unsplit under tensor parallelism."""
    v.need_all("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "head_dim",
               "patch_size", "position_embedding_size")
    h, inter, heads = v.need_int("hidden_size"), v.need_int("intermediate_size"), v.need_int("num_attention_heads")
    kv, hd, patch = int(v.get("num_key_value_heads", default=heads)), v.need_int("head_dim"), v.need_int("patch_size")
    parts = _whole("patch_embedder.input_proj", 3 * patch * patch, h)
    parts.append(WeightPart("patch_embedder.position_embedding_table", (2, v.need_int("position_embedding_size"), h),
                            "other", V))
    for _ in range(v.need_int("num_hidden_layers")):
        parts += _whole("self_attn.q_proj", h, heads * hd) + _whole("self_attn.k_proj", h, kv * hd)
        parts += _whole("self_attn.v_proj", h, kv * hd) + _whole("self_attn.o_proj", heads * hd, h)
        parts += _ln("self_attn.q_norm", hd, False) + _ln("self_attn.k_norm", hd, False)
        parts += _whole("mlp.gate_proj", h, inter) + _whole("mlp.up_proj", h, inter) + _whole("mlp.down_proj", inter, h)
        for name in ("input_layernorm", "post_attention_layernorm", "pre_feedforward_layernorm",
                     "post_feedforward_layernorm"):
            parts += _ln(name, h, False)
    return parts


def step3p7_vision(v: Cfg) -> list[WeightPart]:
    """Step3p7VisionModel (transformers 5.24 modeling_step3p7.py): a bias-free conv patch embed, learned positions
    ((image_size // patch_size)^2), a LayerNorm before the encoder, pre-LN layers (q/k/v/out with biases, fc1/fc2 of
    int(hidden_size x mlp_ratio), two LayerNorms, two layer-scale vectors), then two stride-2 3x3 convolutions that
    double the channels twice. Step3p7VisionConfig reads the release's width / layers / heads as hidden_size /
    num_hidden_layers / num_attention_heads and always recomputes intermediate_size from mlp_ratio."""
    h = int(v.get("width", "hidden_size"))
    inter = int(h * float(v.get("mlp_ratio")))
    patch, image, ch = v.need_int("patch_size"), v.need_int("image_size"), int(v.get("num_channels", default=3))
    parts = [WeightPart("embeddings.patch_embedding", (h, ch, patch, patch), "other", V),
             WeightPart("embeddings.position_embedding", ((image // patch) ** 2, h), "other", V)]
    parts += _ln("pre_layernorm", h)
    for _ in range(int(v.get("layers", "num_hidden_layers"))):
        parts += _lin("self_attn.q_proj", h, h) + _lin("self_attn.k_proj", h, h) + _lin("self_attn.v_proj", h, h)
        parts += _row("self_attn.out_proj", h, h) + _lin("mlp.fc1", h, inter) + _row("mlp.fc2", inter, h)
        parts += _ln("layernorm_before", h) + _ln("layernorm_after", h)
        parts += [WeightPart("lambda_1", (h,), "other", V), WeightPart("lambda_2", (h,), "other", V)]
    for name, d_in, d_out in (("downsampler1", h, 2 * h), ("downsampler2", 2 * h, 4 * h)):
        parts += [WeightPart(name, (d_out, d_in, 3, 3), "other", V), WeightPart(f"{name}.bias", (d_out,), "bias", V)]
    return parts


def mllama_vision(v: Cfg) -> list[WeightPart]:
    """MllamaVisionModel (transformers 5.24 modeling_mllama.py): a bias-free conv patch embed, a class embedding,
    a gated position embedding (num_patches = (image_size // patch_size)^2 + 1 rows, a gate, and a tile embedding
    of (max_aspect_ratio_id + 1) x max_num_tiles x num_patches x hidden), gated pre- and post-tile aspect-ratio
    embeddings ((max_aspect_ratio_id + 1) x max_num_tiles x hidden each), LayerNorms before and after, then
    num_hidden_layers encoder layers and num_global_layers gated ones (gate_attn, gate_ffn): bias-free q/k/v/o of
    heads x (hidden // heads), fc1/fc2 with biases, two LayerNorms. max_aspect_ratio_id = len(supported_aspect_ratios).
    Splits follow SGLang's tower (ColumnParallelConv2dPatch, VisionAttention, Column/RowParallel MLP)."""
    h, inter = v.need_int("hidden_size"), v.need_int("intermediate_size")
    heads = v.need_int("attention_heads", "num_attention_heads")
    patch, image, ch = v.need_int("patch_size"), v.need_int("image_size"), v.need_int("num_channels")
    tiles = v.need_int("max_num_tiles")
    if not heads or not patch:
        raise ConfigError(f"{v.where}: attention_heads and patch_size must be positive")
    ratios = v.raw.get("supported_aspect_ratios")
    if ratios is None:
        if tiles != 4:  # MllamaVisionConfig.validate_architecture
            raise ConfigError(f"{v.where}: max_num_tiles {tiles} needs supported_aspect_ratios (transformers' default "
                              "list is for 4 tiles and its config class refuses another count without one)")
        ratios = MLLAMA_ASPECT_RATIOS
    if (not isinstance(ratios, list) or not ratios
            or not all(isinstance(r, list) and len(r) == 2 for r in ratios)):
        raise ConfigError(f"{v.where}.supported_aspect_ratios must be a list of [width, height] tile counts, found "
                          f"{base.brief(ratios)}")
    ids = len(ratios) + 1
    patches = (image // patch) ** 2 + 1
    qk = heads * (h // heads)
    parts = [*_lin("patch_embedding._linear", ch * patch * patch, h, bias=False),
             WeightPart("class_embedding", (h,), "other", V),
             WeightPart("gated_positional_embedding.embedding", (patches, h), "other", V),
             WeightPart("gated_positional_embedding.gate", (1,), "other", V),
             WeightPart("gated_positional_embedding.tile_embedding", (ids, tiles * patches * h), "other", V)]
    for name in ("pre_tile_positional_embedding", "post_tile_positional_embedding"):
        parts += [WeightPart(f"{name}.embedding", (ids, tiles * h), "other", V),
                  WeightPart(f"{name}.gate", (1,), "other", V)]
    parts += _ln("layernorm_pre", h) + _ln("layernorm_post", h)
    for gated in [False] * v.need_int("num_hidden_layers") + [True] * v.need_int("num_global_layers"):
        parts += _lin("self_attn.q_proj", h, qk, bias=False) + _lin("self_attn.k_proj", h, qk, bias=False)
        parts += _lin("self_attn.v_proj", h, qk, bias=False) + _row("self_attn.o_proj", qk, h, bias=False)
        parts += _lin("mlp.fc1", h, inter) + _row("mlp.fc2", inter, h)
        parts += _ln("input_layernorm", h) + _ln("post_attention_layernorm", h)
        if gated:
            parts += [WeightPart("gate_attn", (1,), "other", V), WeightPart("gate_ffn", (1,), "other", V)]
    return parts


def mllama_projector(v: Cfg, text_hidden: int, top: Cfg) -> list[WeightPart]:
    """MllamaModel.multi_modal_projector: Linear(vision_output_dim, text hidden, bias=True); SGLang builds it as a
    plain nn.Linear (whole on every GPU)."""
    return _lin("multi_modal_projector", v.need_int("vision_output_dim"), text_hidden, split="replicated")


# MllamaVisionConfig.__post_init__'s supported_aspect_ratios for max_num_tiles 4
MLLAMA_ASPECT_RATIOS = [[1, 1], [1, 2], [1, 3], [1, 4], [2, 1], [2, 2], [3, 1], [4, 1]]


VISION_TOWERS = {
    "siglip_vision_model": siglip,
    "qwen3_vl": qwen3_vl,
    "qwen3_5": qwen3_vl,  # Qwen3_5VisionModel: Qwen3-VL's tower (its deepstack_visual_indexes are empty)
    "qwen3_5_moe": qwen3_vl,
    "qwen3_5_vision": qwen3_vl,  # the same tower under transformers 5.7's names (Qwen3.6 configs)
    "qwen3_5_moe_vision": qwen3_vl,
    "qwen3_vl_moe": qwen3_vl,  # Qwen3-VL-MoE (30B-A3B, 235B-A22B): the same tower
    "llama4_vision_model": llama4_vision,
    "gemma4_vision": gemma4_vision,
    "mllama_vision_model": mllama_vision,
}
# transformers config-class defaults of the towers whose configs may be sparse (Gemma4VisionConfig)
TOWER_DEFAULTS: dict[str, dict[str, object]] = {
    # MllamaVisionConfig (transformers 5.24); num_attention_heads is its attribute_map name for attention_heads
    "mllama_vision_model": {"hidden_size": 1280, "num_hidden_layers": 32, "num_global_layers": 8,
                            "attention_heads": 16, "num_channels": 3, "intermediate_size": 5120,
                            "vision_output_dim": 7680, "image_size": 448, "patch_size": 14, "max_num_tiles": 4},
    "gemma4_vision": {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 16,
                      "num_attention_heads": 12, "num_key_value_heads": 12, "head_dim": 64, "patch_size": 16,
                      "position_embedding_size": 10_240},
    "gemma4_audio": {"hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 8,
                     "subsampling_conv_channels": [128, 32], "conv_kernel_size": 5, "output_proj_dims": 1536},
    # Step3p7VisionConfig (its model_type step3p5_vision; the release writes perception_encoder)
    "step3p7": {"hidden_size": 1536, "num_hidden_layers": 47, "num_attention_heads": 16, "num_channels": 3,
                "image_size": 728, "patch_size": 14, "mlp_ratio": 8960 / 1536},
}
# Wrappers whose config class builds one tower whatever vision_config.model_type says (Step3p7Config drops it and
# builds Step3p7VisionConfig, at its defaults when vision_config is absent): tower, TOWER_DEFAULTS key
ARCH_TOWERS = {"Step3p7ForConditionalGeneration": (step3p7_vision, "step3p7")}

E = "encoder"


def gemma4_audio(a: Cfg, text_hidden: int) -> list[WeightPart]:
    """Gemma4AudioModel (a USM conformer) and its embed_audio projection (transformers 5.24 modeling_gemma4.py):
    two bias-free 3x3 conv + LayerNorm(no bias) subsampling layers and a linear to hidden_size; per layer two
    feed-forward blocks (hidden -> 4 x hidden -> hidden, 2 RMSNorms each), chunked attention (q, k, v, post,
    relative_k_proj, per_dim_scale), a light conv block (linear_start to 2 x hidden, depthwise conv1d, linear_end,
    2 RMSNorms) and 3 RMSNorms; output_proj (with bias) to output_proj_dims; embed_audio: output_proj_dims -> the
    text width (its pre-projection norm has no weight)."""
    h, heads, k = a.need_int("hidden_size"), a.need_int("num_attention_heads"), a.need_int("conv_kernel_size")
    out = a.need_int("output_proj_dims")
    channels = a.get("subsampling_conv_channels")
    if (not isinstance(channels, list) or len(channels) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in channels)):
        raise ConfigError(f"{a.where}.subsampling_conv_channels must be two positive integers, found {base.brief(channels)}")
    c0, c1 = channels
    hd = h // heads

    def lin(name: str, d_in: int, d_out: int, bias: bool = False) -> list[WeightPart]:
        return base.linear(name, d_in, d_out, bias=bias, part=E, split="replicated")

    def rms(name: str, dim: int) -> list[WeightPart]:
        return base.norm(name, dim, part=E)

    parts = [WeightPart("subsample_conv_projection.layer0.conv", (c0, 1, 3, 3), "other", E), *rms("subsample_conv_projection.layer0.norm", c0),
             WeightPart("subsample_conv_projection.layer1.conv", (c1, c0, 3, 3), "other", E), *rms("subsample_conv_projection.layer1.norm", c1),
             *lin("subsample_conv_projection.input_proj_linear", (c0 // 4) * c1, h)]
    for _ in range(a.need_int("num_hidden_layers")):
        for ff in ("feed_forward1", "feed_forward2"):
            parts += lin(f"{ff}.ffw_layer_1", h, 4 * h) + lin(f"{ff}.ffw_layer_2", 4 * h, h)
            parts += rms(f"{ff}.pre_layer_norm", h) + rms(f"{ff}.post_layer_norm", h)
        for name in ("q_proj", "k_proj", "v_proj", "relative_k_proj"):
            parts += lin(f"self_attn.{name}", h, heads * hd)
        parts += lin("self_attn.post", h, h) + [WeightPart("self_attn.per_dim_scale", (hd,), "other", E)]
        parts += lin("lconv1d.linear_start", h, 2 * h) + lin("lconv1d.linear_end", h, h)
        parts.append(WeightPart("lconv1d.depthwise_conv1d", (h, 1, k), "other", E))
        parts += rms("lconv1d.pre_layer_norm", h) + rms("lconv1d.conv_norm", h)
        for name in ("norm_pre_attn", "norm_post_attn", "norm_out"):
            parts += rms(name, h)
    parts += lin("output_proj", h, out, bias=True)
    parts += lin("embed_audio.embedding_projection", out, text_hidden)
    return parts


AUDIO_TOWERS = {"gemma4_audio": gemma4_audio}


def gemma3_projector(v: Cfg, text_hidden: int) -> list[WeightPart]:
    h = v.need_int("hidden_size")
    return [WeightPart("mm_input_projection_weight", (h, text_hidden), "other", V), *_ln("mm_soft_emb_norm", h, False)]


def llama4_projector(v: Cfg, text_hidden: int, top: Cfg) -> list[WeightPart]:
    bias = bool(v.get("multi_modal_projector_bias", default=False))
    return _lin("multi_modal_projector.linear_1", v.need_int("vision_output_dim"), text_hidden, bias=bias)


PROJECTORS = {
    # Gemma4MultimodalEmbedder embed_vision: a bias-free linear to the text width (its pre-projection norm has no weight)
    "Gemma4ForConditionalGeneration": lambda v, th, top: _whole("embed_vision.embedding_projection",
                                                                v.need_int("hidden_size"), th),
    "Gemma3ForConditionalGeneration": lambda v, th, top: gemma3_projector(v, th),
    "Llama4ForConditionalGeneration": llama4_projector,
    "MllamaForConditionalGeneration": mllama_projector,
    "Qwen3VLForConditionalGeneration": lambda v, th, top: [],  # the merger is part of the tower
    "Qwen3_5ForConditionalGeneration": lambda v, th, top: [],
    "Qwen3_5MoeForConditionalGeneration": lambda v, th, top: [],
    # Step3p7Model.multi_modal_projector: the 4 x width downsampler output to the text width
    "Step3p7ForConditionalGeneration": lambda v, th, top: _lin(
        "multi_modal_projector", 4 * int(v.get("width", "hidden_size")), th,
        bias=bool(top.get("projector_bias", default=False))),
}


def vision_weights(top: Cfg, text_hidden: int) -> tuple[list[WeightPart], list[str]]:
    """Vision tower + projector for a multimodal wrapper ([] for text-only configs), and notes for towers kvplan
    does not model (their parameters are then missing from params and weights, and the notes say so)."""
    notes = []
    audio: list[WeightPart] = []
    for key in ("audio_config", "speech_config"):
        if isinstance(top.raw.get(key), dict):
            mt = str(top.raw[key].get("model_type") or key)
            if mt in AUDIO_TOWERS:
                audio += AUDIO_TOWERS[mt](top.sub(key, TOWER_DEFAULTS.get(mt)), text_hidden)
            else:
                notes.append(f"the {mt} audio tower is not modelled: params and weights cover the other parts only")
    arch = (top.get("architectures") or [""])[0]
    if arch in ARCH_TOWERS:
        tower, key = ARCH_TOWERS[arch]
        v = top.sub("vision_config", TOWER_DEFAULTS[key])
        return tower(v) + PROJECTORS[arch](v, text_hidden, top) + audio, notes
    if not isinstance(top.raw.get("vision_config"), dict):
        return audio, notes
    mt = str(top.raw["vision_config"].get("model_type") or "")
    v = top.sub("vision_config", TOWER_DEFAULTS.get(mt))
    tower = VISION_TOWERS.get(mt)
    if tower is None:
        notes.append(f"the {mt or 'unnamed'} vision tower is not modelled (known: {', '.join(VISION_TOWERS)}): params "
                     "and weights cover the other parts only; the KV cache is unaffected")
        return audio, notes
    projector = PROJECTORS.get(arch, lambda v, th, top: [])
    return tower(v) + projector(v, text_hidden, top) + audio, notes
