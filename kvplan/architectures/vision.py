"""Vision towers and multimodal projectors: parameters only (they hold no KV cache).

One function per vision_config.model_type, one per wrapper architecture's projector; shapes follow the
transformers modules named in each docstring.
"""

from __future__ import annotations

from kvplan.architectures import base
from kvplan.architectures.base import Cfg
from kvplan.spec import WeightPart

V = "vision"


def _lin(name: str, d_in: int, d_out: int, bias: bool = True) -> list[WeightPart]:
    return base.linear(name, d_in, d_out, bias=bias, part=V, split="replicated")


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
        for p in ("q_proj", "k_proj", "v_proj", "out_proj"):
            parts += _lin(p, h, h)
        parts += _lin("mlp.fc1", h, inter) + _lin("mlp.fc2", inter, h)
    parts += _ln("post_layernorm", h)
    if v.get("vision_use_head", default=True):  # the pooling head: probe + multihead attention + LN + MLP
        parts.append(WeightPart("head.probe", (1, 1, h), "other", V))
        parts += _lin("head.attention.in_proj", h, 3 * h) + _lin("head.attention.out_proj", h, h)
        parts += _ln("head.layernorm", h) + _lin("head.mlp.fc1", h, inter) + _lin("head.mlp.fc2", inter, h)
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
        parts += _lin("attn.qkv", h, 3 * h) + _lin("attn.proj", h, h)
        parts += _lin("mlp.linear_fc1", h, inter) + _lin("mlp.linear_fc2", inter, h)

    def merger(postshuffle: bool) -> list[WeightPart]:
        return _ln("merger.norm", merged if postshuffle else h) + _lin("merger.linear_fc1", merged, merged) + _lin(
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
        for p in ("q_proj", "k_proj", "v_proj", "o_proj"):
            parts += _lin(p, h, h)
        parts += _lin("mlp.fc1", h, inter) + _lin("mlp.fc2", inter, h)
        parts += _ln("input_layernorm", h) + _ln("post_attention_layernorm", h)
    pin, pout = v.need_int("projector_input_dim"), v.need_int("projector_output_dim")
    parts += _lin("vision_adapter.mlp.fc1", inter, pin, bias=False)
    parts += _lin("vision_adapter.mlp.fc2", pin, pout, bias=False)
    return parts


VISION_TOWERS = {
    "siglip_vision_model": siglip,
    "qwen3_vl": qwen3_vl,
    "qwen3_5": qwen3_vl,  # Qwen3_5VisionModel: Qwen3-VL's tower (its deepstack_visual_indexes are empty)
    "qwen3_5_moe": qwen3_vl,
    "qwen3_5_vision": qwen3_vl,  # the same tower under transformers 5.7's names (Qwen3.6 configs)
    "qwen3_5_moe_vision": qwen3_vl,
    "qwen3_vl_moe": qwen3_vl,  # Qwen3-VL-MoE (30B-A3B, 235B-A22B): the same tower
    "llama4_vision_model": llama4_vision,
}


def gemma3_projector(v: Cfg, text_hidden: int) -> list[WeightPart]:
    h = v.need_int("hidden_size")
    return [WeightPart("mm_input_projection_weight", (h, text_hidden), "other", V), *_ln("mm_soft_emb_norm", h, False)]


def llama4_projector(v: Cfg, text_hidden: int, top: Cfg) -> list[WeightPart]:
    bias = bool(v.get("multi_modal_projector_bias", default=False))
    return _lin("multi_modal_projector.linear_1", v.need_int("vision_output_dim"), text_hidden, bias=bias)


PROJECTORS = {
    "Gemma3ForConditionalGeneration": lambda v, th, top: gemma3_projector(v, th),
    "Llama4ForConditionalGeneration": llama4_projector,
    "Qwen3VLForConditionalGeneration": lambda v, th, top: [],  # the merger is part of the tower
    "Qwen3_5ForConditionalGeneration": lambda v, th, top: [],
    "Qwen3_5MoeForConditionalGeneration": lambda v, th, top: [],
}


def vision_weights(top: Cfg, text_hidden: int) -> tuple[list[WeightPart], list[str]]:
    """Vision tower + projector for a multimodal wrapper ([] for text-only configs), and notes for towers kvplan
    does not model (their parameters are then missing from params and weights, and the notes say so)."""
    notes = []
    for key in ("audio_config", "speech_config"):
        if isinstance(top.raw.get(key), dict):
            mt = top.sub(key).get("model_type", default=key)
            notes.append(f"the {mt} audio tower is not modelled: params and weights cover the other parts only")
    if not isinstance(top.raw.get("vision_config"), dict):
        return [], notes
    v = top.sub("vision_config")
    mt = str(v.get("model_type", default=""))
    tower = VISION_TOWERS.get(mt)
    if tower is None:
        notes.append(f"the {mt or 'unnamed'} vision tower is not modelled (known: {', '.join(VISION_TOWERS)}): params "
                     "and weights cover the other parts only; the KV cache is unaffected")
        return [], notes
    arch = (top.get("architectures") or [""])[0]
    projector = PROJECTORS.get(arch, lambda v, th, top: [])
    return tower(v) + projector(v, text_hidden, top), notes
