"""Llama-3.2-Vision (model_type `mllama`, MllamaForConditionalGeneration): a Llama-3.1 text model whose
`cross_attention_layers` (counted in num_hidden_layers) attend to the vision tower's output instead of the text.

transformers 5.24 models/mllama/modeling_mllama.py:
- MllamaTextModel builds MllamaCrossAttentionDecoderLayer at every index in cross_attention_layers and
  MllamaSelfAttentionDecoderLayer elsewhere; head_dim = hidden_size // num_attention_heads in both (the config class
  has no head_dim field).
- A self-attention layer caches K/V of the text tokens; a cross-attention layer caches K/V of the projected vision
  states (MllamaTextCrossAttention: k_proj / v_proj of cross_attention_states, cache.update at its own layer index),
  computed once at prefill and not growing with the text.
- The vision states of a request: MllamaVisionModel returns [images, max_num_tiles, num_patches, dim] with
  num_patches = (image_size // patch_size)^2 + 1 (the class token; the pad-to-8 rows are cut off again), the
  processor pads every image to max_num_tiles tiles (pack_images), and MllamaModel flattens them, so the cross K/V
  length is images x max_num_tiles x num_patches -- the length MllamaForConditionalGeneration._prepare_static_cache
  allocates, with one image when no pixel_values are given. kvplan assumes that one image (6,404 positions for
  the 11B/90B's 4 tiles of 560 / 14); --encoder-len gives another length in positions.

The vision tower and projector are counted as the `vision` part (vision.mllama_vision); embed_tokens has
vocab_size + 8 rows and lm_head is never tied (the class's _tied_weights_keys is commented out).
"""

from __future__ import annotations

from kvplan.architectures import base, vision
from kvplan.architectures.base import AttnDims, Cfg
from kvplan.errors import ConfigError
from kvplan.spec import CrossAttention, FullAttention, WeightPart

# MllamaTextConfig.__post_init__ default
DEFAULT_CROSS_LAYERS = (3, 8, 13, 18, 23, 28, 33, 38)
TOWER = "mllama_vision_model"


def vision_config(top: Cfg) -> Cfg:
    return top.sub("vision_config", vision.TOWER_DEFAULTS[TOWER])


def positions_per_image(v: Cfg) -> tuple[int, int]:
    """(max_num_tiles, patches per tile incl. the class token) of one image's vision states."""
    image, patch = v.need_int("image_size"), v.need_int("patch_size")
    if not patch or image < patch:
        raise ConfigError(f"{v.where}: image_size {image} must be at least patch_size {patch}")
    tiles = v.need_int("max_num_tiles")
    if not tiles:
        raise ConfigError(f"{v.where}: max_num_tiles must be positive")
    return tiles, (image // patch) ** 2 + 1


def cross_layers(c: Cfg, n: int) -> list[int]:
    """The layer indices transformers builds as cross-attention layers (`layer_idx in cross_attention_layers`:
    entries outside 0..n-1 select nothing)."""
    raw = c.get("cross_attention_layers")
    layers = DEFAULT_CROSS_LAYERS if raw is None else raw
    if not isinstance(layers, (list, tuple)):
        raise ConfigError(f"{c.where}.cross_attention_layers must be a list of layer indices")
    return sorted({int(i) for i in layers if 0 <= int(i) < n})


def build(top: Cfg, c: Cfg, encoder_len: int | None):
    c.need_all("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "vocab_size",
               "intermediate_size")
    n, hidden, vocab = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("vocab_size")
    heads, kv = c.need_int("num_attention_heads"), c.need_int("num_key_value_heads")
    inter = c.need_int("intermediate_size")
    if not heads or not kv or heads % kv:
        raise ConfigError(f"{c.where}: num_attention_heads {heads} must be a positive multiple of "
                          f"num_key_value_heads {kv}")
    head_dim = hidden // heads
    if c.raw.get("head_dim") is not None and c.raw["head_dim"] != head_dim:
        raise ConfigError(f"{c.where}: head_dim {c.raw['head_dim']} is not hidden_size / num_attention_heads "
                          f"({head_dim}), which Mllama's attention always uses (transformers ignores head_dim; SGLang "
                          "would size its pool with it)")
    v = vision_config(top)
    tiles, patches = positions_per_image(v)
    enc_len = encoder_len or tiles * patches
    cross = set(cross_layers(c, n))
    dims = AttnDims(heads, kv, head_dim, head_dim)

    self_cache = FullAttention(kv, head_dim, head_dim)
    cross_cache = CrossAttention(kv, head_dim, head_dim, encoder_len=enc_len)
    caches = [(i, cross_cache if i in cross else self_cache) for i in range(n)]

    weights = [base.embedding(vocab + 8, hidden)]  # MllamaTextModel: vocab_size + 8 rows
    for i in range(n):
        prefix = "cross_attn" if i in cross else "self_attn"
        weights += base.attention_block(i, hidden, dims, prefix=prefix)
        if i in cross:
            weights += base.norm("cross_attn.q_norm", head_dim, layer=i)
            weights += base.norm("cross_attn.k_norm", head_dim, layer=i)
            weights += [WeightPart("cross_attn_attn_gate", (1,), "other", "text", "replicated", i),
                        WeightPart("cross_attn_mlp_gate", (1,), "other", "text", "replicated", i)]
        weights += base.gated_mlp(i, hidden, inter)
        weights += base.decoder_layer_norms(i, hidden, 2)
    weights += base.norm("norm", hidden)
    weights += base.lm_head(vocab, hidden, False)
    weights += vision.mllama_vision(v) + vision.mllama_projector(v, hidden, top)
    return caches, weights, False, n, enc_len, dims


def encoder_note(top: Cfg, enc_len: int) -> str:
    tiles, patches = positions_per_image(vision_config(top))
    per_image = tiles * patches
    n = enc_len / per_image
    images = f"{n:.0f} image{'s' if n != 1 else ''}" if enc_len % per_image == 0 else f"{n:.2f} images' worth"
    return (f"cross-attention layers hold {enc_len:,} vision positions per sequence ({images} x {tiles} tiles x "
            f"{patches:,} patches incl. the class token; every image is padded to {tiles} tiles); --encoder-len N "
            f"sets the positions ({per_image:,} per image)")
