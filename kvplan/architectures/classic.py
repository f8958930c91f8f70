"""Older decoder families with their own field names and fused projections.

gpt2 / bloom / opt / gpt-neox (n_layer, n_head, n_embd, n_embed), falcon (multi_query,
new_decoder_architecture, num_kv_heads; RefinedWeb configs too), mpt / dbrx (attn_config.kv_n_heads),
chatglm (multi_query_group_num, kv_channels, num_layers) and qwen v1 (kv_channels).
Each function returns (caches, weights, tied); shapes follow the transformers (or remote-code) modules.
"""

from __future__ import annotations

from kvplan.architectures import base
from kvplan.architectures.base import AttnDims, Cfg
from kvplan.errors import ConfigError
from kvplan.spec import FullAttention, WeightPart


def _full(n: int, kv_heads: int, head_dim: int):
    cache = FullAttention(kv_heads, head_dim, head_dim)
    return [(i, cache) for i in range(n)]


def _ln(name: str, dim: int, layer: int | None = None, bias: bool = True):
    return base.norm(name, dim, bias=bias, layer=layer)


def gpt2(top: Cfg, c: Cfg):
    """GPT2LMHeadModel / GPTBigCode (multi_query): learned positions, fused c_attn, LayerNorms with bias."""
    c.need_all(("n_layer", "num_hidden_layers"), ("n_embd", "hidden_size"), ("n_head", "num_attention_heads"),
               "vocab_size", ("n_positions", "max_position_embeddings"))
    n, h = c.need_int("n_layer", "num_hidden_layers"), c.need_int("n_embd", "hidden_size")
    heads, vocab = c.need_int("n_head", "num_attention_heads"), c.need_int("vocab_size")
    inner = int(c.get("n_inner", default=4 * h) or 4 * h)
    head_dim = h // heads
    kv = 1 if c.get("multi_query", default=False) else heads
    weights = [base.embedding(vocab, h, "wte"), WeightPart("wpe", (c.need_int("n_positions", "max_position_embeddings"), h), "embedding")]
    for i in range(n):
        weights += _ln("ln_1", h, i) + _ln("ln_2", h, i)
        weights += base.linear("attn.c_attn", h, h + 2 * kv * head_dim, bias=True, layer=i)
        weights += base.linear("attn.c_proj", h, h, bias=True, split="row", layer=i)
        weights += base.plain_mlp(i, h, inner, names=("c_fc", "c_proj"))
    weights += _ln("ln_f", h)
    is_tied = base.tied(top, c, True)
    weights += base.lm_head(vocab, h, is_tied)
    return _full(n, kv, head_dim), weights, is_tied


def bloom(top: Cfg, c: Cfg):
    """BloomForCausalLM: ALiBi (no position table), an extra LayerNorm after the embedding."""
    c.need_all(("n_layer", "num_hidden_layers"), ("hidden_size", "n_embed"), ("n_head", "num_attention_heads"), "vocab_size")
    n, h = c.need_int("n_layer", "num_hidden_layers"), c.need_int("hidden_size", "n_embed")
    heads, vocab = c.need_int("n_head", "num_attention_heads"), c.need_int("vocab_size")
    weights = [base.embedding(vocab, h, "word_embeddings"), *_ln("word_embeddings_layernorm", h)]
    for i in range(n):
        weights += _ln("input_layernorm", h, i) + _ln("post_attention_layernorm", h, i)
        weights += base.linear("self_attention.query_key_value", h, 3 * h, bias=True, layer=i)
        weights += base.linear("self_attention.dense", h, h, bias=True, split="row", layer=i)
        weights += base.plain_mlp(i, h, 4 * h, names=("dense_h_to_4h", "dense_4h_to_h"))
    weights += _ln("ln_f", h)
    is_tied = base.tied(top, c, True)
    weights += base.lm_head(vocab, h, is_tied)
    return _full(n, heads, h // heads), weights, is_tied


def opt(top: Cfg, c: Cfg):
    """OPTForCausalLM: learned positions with an offset of 2, optional word_embed_proj_dim projections."""
    c.need_all("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "ffn_dim", "max_position_embeddings")
    n, h, heads = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("num_attention_heads")
    vocab, ffn = c.need_int("vocab_size"), c.need_int("ffn_dim")
    proj = int(c.get("word_embed_proj_dim", default=h))
    bias = bool(c.get("enable_bias", default=True))
    weights = [base.embedding(vocab, proj), WeightPart("embed_positions", (c.need_int("max_position_embeddings") + 2, h), "embedding")]
    if proj != h:
        weights += base.linear("project_in", proj, h, split="replicated") + base.linear("project_out", h, proj, split="replicated")
    if c.get("do_layer_norm_before", default=True) and not c.get("_remove_final_layer_norm", default=False):
        weights += _ln("final_layer_norm", h)
    dims = AttnDims(heads, heads, h // heads, h // heads)
    for i in range(n):
        weights += base.attention_block(i, h, dims, qkv_bias=bias, o_bias=bias)
        weights += _ln("self_attn_layer_norm", h, i) + _ln("final_layer_norm", h, i)
        weights += base.plain_mlp(i, h, ffn, bias=bias)
    is_tied = base.tied(top, c, True)
    weights += base.lm_head(vocab, proj, is_tied)
    return _full(n, heads, h // heads), weights, is_tied


def gpt_neox(top: Cfg, c: Cfg):
    """GPTNeoXForCausalLM: fused query_key_value with bias, two LayerNorms per layer, untied embed_out."""
    c.need_all("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "intermediate_size")
    n, h, heads = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("num_attention_heads")
    vocab, inter = c.need_int("vocab_size"), c.need_int("intermediate_size")
    bias = bool(c.get("attention_bias", default=True))
    weights = [base.embedding(vocab, h, "embed_in")]
    for i in range(n):
        weights += _ln("input_layernorm", h, i) + _ln("post_attention_layernorm", h, i)
        weights += base.linear("attention.query_key_value", h, 3 * h, bias=bias, layer=i)
        weights += base.linear("attention.dense", h, h, bias=bias, split="row", layer=i)
        weights += base.plain_mlp(i, h, inter, names=("dense_h_to_4h", "dense_4h_to_h"))
    weights += _ln("final_layer_norm", h)
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, h, is_tied)
    return _full(n, heads, h // heads), weights, is_tied


def falcon(top: Cfg, c: Cfg):
    """Falcon / RefinedWeb: KV heads from new_decoder_architecture (num_kv_heads) or multi_query (1)."""
    c.need_all(("num_hidden_layers", "n_layer"), "hidden_size", ("num_attention_heads", "n_head"), "vocab_size")
    n, h = c.need_int("num_hidden_layers", "n_layer"), c.need_int("hidden_size")
    heads, vocab = c.need_int("num_attention_heads", "n_head"), c.need_int("vocab_size")
    head_dim = h // heads
    new_arch = bool(c.get("new_decoder_architecture", default=False))
    if new_arch:
        kv = int(c.get("num_kv_heads", "n_head_kv", default=heads))
    else:
        kv = 1 if c.get("multi_query", default=True) else heads
    bias = bool(c.get("bias", default=False))
    ffn = int(c.get("ffn_hidden_size", default=4 * h) or 4 * h)
    weights = [base.embedding(vocab, h, "word_embeddings")]
    for i in range(n):
        weights += base.linear("self_attention.query_key_value", h, (heads + 2 * kv) * head_dim, bias=bias, layer=i)
        weights += base.linear("self_attention.dense", h, h, bias=bias, split="row", layer=i)
        weights += base.plain_mlp(i, h, ffn, bias=bias, names=("dense_h_to_4h", "dense_4h_to_h"))
        if new_arch and int(c.get("num_ln_in_parallel_attn", default=2)) == 2:
            weights += _ln("ln_attn", h, i) + _ln("ln_mlp", h, i)
        else:
            weights += _ln("input_layernorm", h, i)
            if not new_arch and not c.get("parallel_attn", default=True):
                weights += _ln("post_attention_layernorm", h, i)
    weights += _ln("ln_f", h)
    is_tied = base.tied(top, c, True)
    weights += base.lm_head(vocab, h, is_tied)
    return _full(n, kv, head_dim), weights, is_tied


def mpt(top: Cfg, c: Cfg):
    """MptForCausalLM: ALiBi, fused Wqkv, bias-free (no_bias) LayerNorms; attn_config.kv_n_heads for GQA."""
    c.need_all("n_layers", "d_model", "n_heads", "vocab_size")
    n, d, heads, vocab = c.need_int("n_layers"), c.need_int("d_model"), c.need_int("n_heads"), c.need_int("vocab_size")
    attn = c.sub("attn_config")
    kv = int(attn.get("kv_n_heads", default=heads))
    head_dim = d // heads
    bias = not c.get("no_bias", default=True)
    ratio = int(c.get("expansion_ratio", default=4))
    weights = [base.embedding(vocab, d, "wte")]
    for i in range(n):
        weights += _ln("norm_1", d, i, bias) + _ln("norm_2", d, i, bias)
        weights += base.linear("attn.Wqkv", d, d + 2 * kv * head_dim, bias=bias, layer=i)
        weights += base.linear("attn.out_proj", d, d, bias=bias, split="row", layer=i)
        weights += base.plain_mlp(i, d, ratio * d, bias=bias, names=("ffn.up_proj", "ffn.down_proj"))
    weights += _ln("norm_f", d, None, bias)
    is_tied = base.tied(top, c, True)
    weights += base.lm_head(vocab, d, is_tied)
    return _full(n, kv, head_dim), weights, is_tied


def dbrx(top: Cfg, c: Cfg):
    """DbrxForCausalLM: GQA via attn_config.kv_n_heads, fused Wqkv, MoE experts w1/v1/w2, bias-free LayerNorms."""
    c.need_all("n_layers", "d_model", "n_heads", "vocab_size")
    n, d, heads, vocab = c.need_int("n_layers"), c.need_int("d_model"), c.need_int("n_heads"), c.need_int("vocab_size")
    attn, ffn = c.sub("attn_config"), c.sub("ffn_config")
    kv = int(attn.get("kv_n_heads", default=heads))
    head_dim = d // heads
    experts, hidden_ffn = int(ffn.get("moe_num_experts", default=4)), int(ffn.get("ffn_hidden_size", default=3584))
    weights = [base.embedding(vocab, d, "wte")]
    for i in range(n):
        weights += _ln("norm_1", d, i, False) + _ln("norm_2", d, i, False)
        weights += base.linear("attn.Wqkv", d, d + 2 * kv * head_dim, layer=i)
        weights += base.linear("attn.out_proj", d, d, split="row", layer=i)
        weights += base.router(i, d, experts, name="ffn.router.layer")
        weights += [WeightPart(f"ffn.experts.mlp.{w}", (hidden_ffn, d), "expert", "text", "expert", i, experts) for w in ("w1", "v1", "w2")]
    weights += _ln("norm_f", d, None, False)
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, d, is_tied)
    return _full(n, kv, head_dim), weights, is_tied


def chatglm(top: Cfg, c: Cfg):
    """ChatGLM2/3 (remote code): multi_query_group_num KV heads of kv_channels; swiglu MLP; output_layer."""
    c.need_all("num_layers", "hidden_size", "num_attention_heads", ("padded_vocab_size", "vocab_size"), "ffn_hidden_size")
    n, h, heads = c.need_int("num_layers"), c.need_int("hidden_size"), c.need_int("num_attention_heads")
    vocab, ffn = c.need_int("padded_vocab_size", "vocab_size"), c.need_int("ffn_hidden_size")
    head_dim = int(c.get("kv_channels", default=h // heads))
    kv = int(c.get("multi_query_group_num", default=heads)) if c.get("multi_query_attention", default=False) else heads
    qkv_bias = bool(c.get("add_qkv_bias", default=False) or c.get("add_bias_linear", default=False))
    lin_bias = bool(c.get("add_bias_linear", default=False))
    norm_bias = not c.get("rmsnorm", default=True)
    weights = [base.embedding(vocab, h, "embedding.word_embeddings")]
    for i in range(n):
        weights += _ln("input_layernorm", h, i, norm_bias) + _ln("post_attention_layernorm", h, i, norm_bias)
        weights += base.linear("self_attention.query_key_value", h, heads * head_dim + 2 * kv * head_dim, bias=qkv_bias, layer=i)
        weights += base.linear("self_attention.dense", heads * head_dim, h, bias=lin_bias, split="row", layer=i)
        weights += base.linear("mlp.dense_h_to_4h", h, 2 * ffn, bias=lin_bias, layer=i)
        weights += base.linear("mlp.dense_4h_to_h", ffn, h, bias=lin_bias, split="row", layer=i)
    if c.get("post_layer_norm", default=True):
        weights += _ln("final_layernorm", h, None, norm_bias)
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, h, is_tied)
    return _full(n, kv, head_dim), weights, is_tied


def qwen_v1(top: Cfg, c: Cfg):
    """QWenLMHeadModel (remote code): MHA with kv_channels, fused c_attn with bias, w1/w2 halves of intermediate."""
    c.need_all("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size", "intermediate_size")
    n, h, heads = c.need_int("num_hidden_layers"), c.need_int("hidden_size"), c.need_int("num_attention_heads")
    vocab, inter = c.need_int("vocab_size"), c.need_int("intermediate_size")
    head_dim = int(c.get("kv_channels", default=h // heads))
    proj = heads * head_dim
    if inter % 2:
        raise ConfigError(f"{c.where}: intermediate_size {inter} must be even for QWen's w1/w2 halves")
    bias = not c.get("no_bias", default=True)
    weights = [base.embedding(vocab, h, "wte")]
    for i in range(n):
        weights += _ln("ln_1", h, i, False) + _ln("ln_2", h, i, False)
        weights += base.linear("attn.c_attn", h, 3 * proj, bias=True, layer=i)
        weights += base.linear("attn.c_proj", proj, h, bias=bias, split="row", layer=i)
        weights += base.linear("mlp.w1", h, inter // 2, bias=bias, layer=i) + base.linear("mlp.w2", h, inter // 2, bias=bias, layer=i)
        weights += base.linear("mlp.c_proj", inter // 2, h, bias=bias, split="row", layer=i)
    weights += _ln("ln_f", h, None, False)
    is_tied = base.tied(top, c, False)
    weights += base.lm_head(vocab, h, is_tied)
    return _full(n, heads, head_dim), weights, is_tied
