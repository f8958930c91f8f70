"""Encoder-decoder models: the decoder caches its own tokens (self-attention) plus, per layer, K/V over the
encoder output (cross-attention, a fixed length per sequence). Encoder weights are `encoder` params.

T5 (T5ForConditionalGeneration): encoder length defaults to n_positions (512); Whisper: max_source_positions
(1500 frames after the conv stem) and the decoder is limited to max_target_positions (448).
"""

from __future__ import annotations

from kvplan.architectures import base
from kvplan.architectures.base import AttnDims, Cfg
from kvplan.spec import CrossAttention, FullAttention, WeightPart


def t5(top: Cfg, c: Cfg, encoder_len: int | None):
    c.need_all("d_model", "d_kv", "num_heads", "num_layers", "d_ff", "vocab_size")
    d, d_kv, heads = c.need_int("d_model"), c.need_int("d_kv"), c.need_int("num_heads")
    enc_layers = c.need_int("num_layers")
    dec_layers = int(c.get("num_decoder_layers", default=enc_layers))
    d_ff, vocab = c.need_int("d_ff"), c.need_int("vocab_size")
    buckets = int(c.get("relative_attention_num_buckets", default=32))
    gated = str(c.get("feed_forward_proj", default="relu")).startswith("gated")
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
    # transformers 5.x T5Config always ties lm_head to the shared embedding (configuration_t5.py)
    self_cache = FullAttention(heads, d_kv, d_kv)
    cross = CrossAttention(heads, d_kv, d_kv, encoder_len=enc_len)
    caches = [(i, self_cache) for i in range(dec_layers)] + [(i, cross) for i in range(dec_layers)]
    return caches, weights, True, dec_layers, enc_len, dims


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
