"""Encoder-decoder models: the decoder caches its own tokens (self-attention) plus, per layer, K/V over the
encoder output (cross-attention, a fixed length per sequence). Encoder weights are `encoder` params.

T5 (T5ForConditionalGeneration, also Flan-T5 and mT5): encoder length defaults to n_positions (512); Whisper:
max_source_positions (1500 frames after the conv stem) and the decoder is limited to max_target_positions (448);
BART / mBART: learned positions on both sides, encoder length defaults to max_position_embeddings (1024).
"""

from __future__ import annotations

from kvplan.architectures import base
from kvplan.architectures.base import AttnDims, Cfg
from kvplan.errors import ConfigError
from kvplan.spec import CrossAttention, EncoderShape, FullAttention, WeightPart


def _t5_gated(c: Cfg) -> bool:
    """T5Config / MT5Config __post_init__: feed_forward_proj is "ACT" or "gated-ACT" (is_gated_act = the first part
    is "gated"); validate_architecture refuses anything else, so kvplan does too. A config that states
    is_gated_act itself (files saved by transformers >= 4.2x do) keeps it: the remaining keyword arguments are set
    after __post_init__ computed its own, and T5LayerFF builds the gated MLP on that attribute."""
    proj = str(c.get("feed_forward_proj", default="relu"))
    parts = proj.split("-")
    if len(parts) > 2 or (len(parts) == 2 and parts[0] != "gated") or not all(parts):
        raise ConfigError(f"{c.where}: feed_forward_proj {proj!r} is not 'ACT' or 'gated-ACT' (e.g. 'relu', "
                          "'gated-gelu'); transformers' T5Config refuses it")
    stated = c.raw.get("is_gated_act")
    return bool(stated) if stated is not None else len(parts) == 2


def t5(top: Cfg, c: Cfg, encoder_len: int | None):
    c.need_all("d_model", "d_kv", "num_heads", "num_layers", "d_ff", "vocab_size")
    d, d_kv, heads = c.need_int("d_model"), c.need_int("d_kv"), c.need_int("num_heads")
    enc_layers = c.need_int("num_layers")
    dec_layers = int(c.get("num_decoder_layers", default=enc_layers))
    d_ff, vocab = c.need_int("d_ff"), c.need_int("vocab_size")
    buckets = int(c.get("relative_attention_num_buckets", default=32))
    gated = _t5_gated(c)
    enc_len = encoder_len or int(c.get("n_positions", default=512))
    dims = AttnDims(heads, heads, d_kv, d_kv)

    def attn(prefix: str, layer: int, part: str):
        return [
            WeightPart(f"{prefix}.{p}", (heads * d_kv, d) if p != "o" else (d, heads * d_kv), "linear", part,
                       "row" if p == "o" else "column", layer)
            for p in ("q", "k", "v", "o")
        ]

    def ffn(layer: int, part: str):
        names = ("wi_0", "wi_1", "wo") if gated else ("wi", "wo")
        return [
            WeightPart(f"DenseReluDense.{p}", (d_ff, d) if p != "wo" else (d, d_ff), "linear", part,
                       "row" if p == "wo" else "column", layer)
            for p in names
        ]

    weights = [base.embedding(vocab, d, "shared")]
    for i in range(enc_layers):
        weights += attn("SelfAttention", i, "encoder") + ffn(i, "encoder")
        weights += base.in_part(base.norm("layer_norm", d) + base.norm("layer_norm_ff", d), "encoder")
    weights.append(WeightPart("encoder.relative_attention_bias", (buckets, heads), "other", "encoder"))
    weights += base.in_part(base.norm("encoder.final_layer_norm", d), "encoder")
    for i in range(dec_layers):
        weights += attn("SelfAttention", i, "text") + attn("EncDecAttention", i, "text") + ffn(i, "text")
        for name in ("layer_norm_self", "layer_norm_cross", "layer_norm_ff"):
            weights += base.norm(name, d, layer=i)
    weights.append(WeightPart("decoder.relative_attention_bias", (buckets, heads), "other", "text"))
    weights += base.norm("decoder.final_layer_norm", d)
    # tie_word_embeddings false (T5 v1.1, Flan-T5, mT5): the checkpoints hold an lm_head of their own. transformers
    # 5.x T5Config / MT5Config force tie_word_embeddings True (configuration_t5.py: the flag now only picks
    # scale_decoder_outputs), so the class built on meta shares lm_head with `shared`; but from_pretrained keeps
    # both when the checkpoint's differ ("both are present in the checkpoints with different values, so we will
    # NOT tie them"), and that is what memory holds (tests/test_encdec_families.py loads such a checkpoint).
    is_tied = base.tied(top, c, True)
    weights += base.lm_head(vocab, d, is_tied)
    self_cache = FullAttention(heads, d_kv, d_kv)
    cross = CrossAttention(heads, d_kv, d_kv, encoder_len=enc_len)
    caches = [(i, self_cache) for i in range(dec_layers)] + [(i, cross) for i in range(dec_layers)]
    return caches, weights, is_tied, dec_layers, enc_len, dims


def bart(top: Cfg, c: Cfg, encoder_len: int | None):
    """BartForConditionalGeneration / MBartForConditionalGeneration (transformers 5.24 modeling_bart.py,
    modeling_mbart.py): a shared embedding (the encoder's and decoder's embed_tokens are tied to it), learned
    positions of max_position_embeddings + 2 rows on each side (BartLearnedPositionalEmbedding's offset 2),
    LayerNorms with bias, q/k/v/out and fc1/fc2 with bias; mBART adds a final layer_norm to encoder and decoder.
    lm_head (and the encoder's and decoder's embed_tokens) are tied to `shared` unless tie_word_embeddings is false; final_logits_bias [1, vocab] is a persistent buffer,
    saved in the checkpoint, counted here. Heads: decoder self- and cross-attention both use
    decoder_attention_heads, head_dim = d_model / heads (BartAttention)."""
    c.need_all("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
               "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size", "max_position_embeddings")
    d, vocab = c.need_int("d_model"), c.need_int("vocab_size")
    enc_layers, dec_layers = c.need_int("encoder_layers"), c.need_int("decoder_layers")
    enc_heads, dec_heads = c.need_int("encoder_attention_heads"), c.need_int("decoder_attention_heads")
    for key, heads in (("encoder_attention_heads", enc_heads), ("decoder_attention_heads", dec_heads)):
        if d % heads:
            raise ConfigError(f"{c.where}: d_model {d} is not a multiple of {key} {heads} (BartAttention needs "
                              "embed_dim divisible by num_heads)")
    alias = c.raw.get("num_hidden_layers")  # BartConfig.attribute_map: num_hidden_layers IS encoder_layers
    if alias is not None and alias != enc_layers:
        raise ConfigError(f"{c.where}: num_hidden_layers {alias} and encoder_layers {enc_layers} disagree (BartConfig "
                          "maps num_hidden_layers onto encoder_layers; which one transformers keeps depends on key order)")
    positions = c.need_int("max_position_embeddings")
    enc_len = encoder_len or positions
    mbart = str(top.get("model_type", default="")) == "mbart"
    head_dim = d // dec_heads

    def attn(prefix: str, layer: int, part: str):
        parts = []
        for p in ("k_proj", "v_proj", "q_proj"):
            parts += base.linear(f"{prefix}.{p}", d, d, bias=True, layer=layer)
        parts += base.linear(f"{prefix}.out_proj", d, d, bias=True, split="row", layer=layer)
        return base.in_part(parts, part)

    def layer_body(layer: int, part: str, ffn: int, norms: tuple[str, ...]):
        parts = base.plain_mlp(layer, d, ffn, prefix="mlp")
        for n in norms:
            parts += base.norm(n, d, bias=True, layer=layer)
        return base.in_part(parts, part)

    def stack(side: str, part: str):
        parts = [WeightPart(f"{side}.embed_positions", (positions + 2, d), "embedding", part)]
        parts += base.in_part(base.norm(f"{side}.layernorm_embedding", d, bias=True), part)
        if mbart:
            parts += base.in_part(base.norm(f"{side}.layer_norm", d, bias=True), part)
        return parts

    weights = [base.embedding(vocab, d, "shared")] + stack("encoder", "encoder")
    for i in range(enc_layers):
        weights += attn("self_attn", i, "encoder")
        weights += layer_body(i, "encoder", c.need_int("encoder_ffn_dim"), ("self_attn_layer_norm", "final_layer_norm"))
    weights += stack("decoder", "text")
    for i in range(dec_layers):
        weights += attn("self_attn", i, "text") + attn("encoder_attn", i, "text")
        weights += layer_body(i, "text", c.need_int("decoder_ffn_dim"),
                              ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"))
    is_tied = base.tied(top, c, True)
    weights += base.lm_head(vocab, d, is_tied)
    if not is_tied:
        # transformers 5.x: tie_word_embeddings false drops every _tied_weights_keys entry, BartModel's
        # encoder/decoder embed_tokens -> shared included (modeling_utils get_expanded_tied_weights_keys): on meta
        # and from a checkpoint saved with the flag, four [vocab, d_model] matrices
        weights += [base.embedding(vocab, d, "encoder.embed_tokens", "encoder"), base.embedding(vocab, d, "decoder.embed_tokens")]
    weights.append(WeightPart("final_logits_bias", (1, vocab), "bias"))
    self_cache = FullAttention(dec_heads, head_dim, head_dim)
    cross = CrossAttention(dec_heads, head_dim, head_dim, encoder_len=enc_len)
    caches = [(i, self_cache) for i in range(dec_layers)] + [(i, cross) for i in range(dec_layers)]
    return caches, weights, is_tied, dec_layers, enc_len, AttnDims(dec_heads, dec_heads, head_dim, head_dim)


def whisper_encoder(c: Cfg) -> EncoderShape:
    """Whisper's encoder self-attention: encoder_layers x encoder_attention_heads of d_model // heads, over
    max_source_positions (the positions SGLang pads every request with, models/whisper.py pad_input_ids)."""
    heads = c.need_int("encoder_attention_heads")
    return EncoderShape(c.need_int("encoder_layers"), heads, c.need_int("d_model") // heads,
                        c.need_int("max_source_positions"))


def whisper(top: Cfg, c: Cfg, encoder_len: int | None):
    c.need_all("d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads", "decoder_attention_heads",
               "encoder_ffn_dim", "decoder_ffn_dim", "vocab_size", "num_mel_bins", "max_source_positions",
               "max_target_positions")
    d, vocab = c.need_int("d_model"), c.need_int("vocab_size")
    enc_layers, dec_layers = c.need_int("encoder_layers"), c.need_int("decoder_layers")
    dec_heads = c.need_int("decoder_attention_heads")
    enc_heads = c.need_int("encoder_attention_heads")
    src, tgt = c.need_int("max_source_positions"), c.need_int("max_target_positions")
    enc_len = encoder_len or src
    head_dim = d // dec_heads

    def attn(prefix: str, layer: int, part: str):
        # k_proj has no bias; q, v and out do (WhisperAttention)
        parts = base.linear(f"{prefix}.k_proj", d, d, layer=layer) + base.linear(f"{prefix}.v_proj", d, d, bias=True, layer=layer)
        parts += base.linear(f"{prefix}.q_proj", d, d, bias=True, layer=layer)
        parts += base.linear(f"{prefix}.out_proj", d, d, bias=True, split="row", layer=layer)
        return base.in_part(parts, part)

    def layer_body(layer: int, part: str, ffn: int, norms: tuple[str, ...]):
        parts = base.plain_mlp(layer, d, ffn)
        for n in norms:
            parts += base.norm(n, d, bias=True, layer=layer)
        return base.in_part(parts, part)

    mel = c.need_int("num_mel_bins")
    weights = base.in_part(
        [WeightPart("conv1", (d, mel, 3), "other"), WeightPart("conv1.bias", (d,), "bias"),
         WeightPart("conv2", (d, d, 3), "other"), WeightPart("conv2.bias", (d,), "bias"),
         WeightPart("encoder.embed_positions", (src, d), "embedding")], "encoder")
    for i in range(enc_layers):
        weights += attn("self_attn", i, "encoder")
        weights += layer_body(i, "encoder", c.need_int("encoder_ffn_dim"), ("self_attn_layer_norm", "final_layer_norm"))
    weights += base.in_part(base.norm("encoder.layer_norm", d, bias=True), "encoder")
    weights += [base.embedding(vocab, d), WeightPart("decoder.embed_positions", (tgt, d), "embedding")]
    for i in range(dec_layers):
        weights += attn("self_attn", i, "text") + attn("encoder_attn", i, "text")
        weights += layer_body(i, "text", c.need_int("decoder_ffn_dim"),
                              ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"))
    weights += base.norm("decoder.layer_norm", d, bias=True)
    is_tied = base.tied(top, c, True)
    weights += base.lm_head(vocab, d, is_tied)
    del enc_heads
    self_cache = FullAttention(dec_heads, head_dim, head_dim)
    cross = CrossAttention(dec_heads, head_dim, head_dim, encoder_len=enc_len)
    caches = [(i, self_cache) for i in range(dec_layers)] + [(i, cross) for i in range(dec_layers)]
    return caches, weights, is_tied, dec_layers, enc_len, AttnDims(dec_heads, dec_heads, head_dim, head_dim)
