"""The oracle nobody here wrote: transformers' own model code.

For every bundled config transformers builds natively, kvplan's `params` must equal the meta-device parameter
count of the architectures[0] class, and `kvplan size --engine hf --kv-dtype fp16`'s `kv_bytes` must equal the
bytes of every tensor in the cache a real forward (use_cache=True) returns — at a short context and at one beyond
every sliding window / chunk. The two remote-code families are checked against published module shapes instead.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

oracle = pytest.importorskip("oracle_hf")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from conftest import declined  # noqa: E402
from kvplan import catalog  # noqa: E402
from kvplan.sizing import EngineOptions, ModelOptions, size  # noqa: E402

pytestmark = pytest.mark.slow  # real transformers forwards and meta builds of every family (the slow tier)

BUNDLED = {m.config_path.parent.name: m for m in catalog.bundled_models()}
NATIVE = sorted(d for d in BUNDLED if oracle.buildable(d))
SHORT_CTX = 16
WILD = Path(__file__).with_name("data") / "wild-configs"


def long_ctx(config: dict, spec) -> int:
    """Beyond every window/chunk (8,200 > 8,192) unless the decoder's position table stops earlier; state-space
    layers scan token by token on meta, so models with them use a short long-context (no window to pass)."""
    if any(c.kind in ("mamba_state", "linear_state") for _, c in spec.caches):
        return 300
    return oracle.default_ctx_long(config)


def assert_params_and_cache_equal(config: dict, tmp_path, ctxs) -> None:
    """The family checks below: kvplan's parameters = transformers' meta count, and `size --engine hf` = the bytes
    of every tensor in the cache one forward of [2, ctx] returns, at each ctx."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    assert size(ModelOptions(str(path)), EngineOptions(engine="hf", kv_dtype="fp16"), SHORT_CTX).setup.spec.params == \
        oracle.hf_param_counts(config)["params"]
    for ctx in ctxs:
        truth = oracle.hf_cache_bytes(config, batch=2, ctx=ctx, dtype="float16")
        r = size(ModelOptions(str(path)), EngineOptions(engine="hf", kv_dtype="fp16"), ctx, batch=2)
        assert r.plan.kv_bytes == truth["total"], f"ctx {ctx}: kvplan {r.plan.kv_bytes:,} vs transformers {truth['total']:,}"


def test_every_bundled_config_is_covered():
    assert len(NATIVE) == len(BUNDLED) - 2
    assert set(BUNDLED) - set(NATIVE) == set(oracle.SKIP_REMOTE_CODE)


@pytest.mark.parametrize("dirname", NATIVE)
def test_params_equal_the_meta_device_count(dirname):
    m = BUNDLED[dirname]
    config = json.loads(m.config_path.read_text())
    engine = "vllm" if declined(m.repo_id, "hf") else "hf"  # parameters do not depend on the engine
    r = size(ModelOptions(m.repo_id), EngineOptions(engine=engine, kv_dtype=None if engine == "vllm" else "fp16"),
             SHORT_CTX)
    truth = oracle.hf_param_counts(config)
    # transformers 5.x builds T5 tied (T5Config forces tie_word_embeddings); from_pretrained of an untied checkpoint
    # (Flan-T5, mT5) keeps its own lm_head, vocab x d_model more (tests/test_encdec_families.py loads one back)
    own_head = (config["vocab_size"] * config["d_model"]
                if config.get("model_type") in ("t5", "mt5") and config.get("tie_word_embeddings") is False else 0)
    assert r.setup.spec.params == truth["params"] + own_head
    if truth.get("vision_params"):
        assert r.setup.spec.params_of("vision") == truth["vision_params"]
    if truth.get("encoder_params"):
        assert r.setup.spec.params_of("encoder") == truth["encoder_params"]


@pytest.mark.parametrize("dirname", [d for d in NATIVE if not declined(BUNDLED[d].repo_id, "hf")])
def test_hf_cache_bytes_equal_a_real_forward(dirname):
    m = BUNDLED[dirname]
    config = json.loads(m.config_path.read_text())
    short = size(ModelOptions(m.repo_id), EngineOptions(engine="hf", kv_dtype="fp16"), SHORT_CTX)
    ctxs = [SHORT_CTX, long_ctx(config, short.setup.spec)]
    for ctx in ctxs:
        r = size(ModelOptions(m.repo_id), EngineOptions(engine="hf", kv_dtype="fp16"), ctx, batch=2)
        truth = oracle.hf_cache_bytes(config, batch=2, ctx=ctx, dtype="float16", encoder_len=r.setup.spec.encoder_len)
        assert r.plan.kv_bytes == truth["total"], f"ctx {ctx}: kvplan {r.plan.kv_bytes:,} vs transformers {truth['total']:,}"


def test_remote_code_families_follow_published_shapes():
    """ChatGLM3-6B and Qwen-7B (v1) are remote code: their published sizes are 6,243,584,000 and 7,721,324,544
    parameters (model cards: '6.24B', '7.7B'); the KV geometry is the engines.md arithmetic."""
    glm = size(ModelOptions("chatglm3-6b"), EngineOptions(engine="hf", kv_dtype="fp16"), 8192)
    # multi_query_group_num 2 KV heads x kv_channels 128 x 28 layers x K,V x 2 B = 28,672 B/token
    assert glm.plan.kv_bytes_per_token == 2 * 28 * 2 * 128 * 2
    assert glm.plan.kv_bytes == 8192 * 28672
    qwen = size(ModelOptions("qwen-7b"), EngineOptions(engine="hf", kv_dtype="fp16"), 8192)
    assert qwen.plan.kv_bytes_per_token == 2 * 32 * 32 * 128 * 2
    assert glm.setup.spec.params == 6_243_584_000 and qwen.setup.spec.params == 7_721_324_544


def test_gemma3n_kv_shared_layers_and_params(tmp_path):
    """Gemma-3n (no bundled config): transformers' own Gemma3nTextConfig defaults, written as a config.json.
    The last num_kv_shared_layers layers reuse earlier KV: no cache of their own in any engine."""
    from transformers import Gemma3nTextConfig

    config = {**Gemma3nTextConfig().to_dict(), "architectures": ["Gemma3nForCausalLM"], "torch_dtype": "bfloat16"}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    r = size(ModelOptions(str(path)), EngineOptions(engine="hf", kv_dtype="fp16"), 1000, batch=2)
    assert r.setup.spec.params == oracle.hf_param_counts(config)["params"]
    for ctx in (16, 1000):
        truth = oracle.hf_cache_bytes(config, batch=2, ctx=ctx)
        assert size(ModelOptions(str(path)), EngineOptions(engine="hf", kv_dtype="fp16"), ctx, 2).plan.kv_bytes == truth["total"]
    shared = [g for g in r.plan.groups if g.kind == "shared"]
    assert sum(len(g.layer_ids) for g in shared) == config["num_kv_shared_layers"] and all(g.bytes == 0 for g in shared)
    for engine in ("vllm", "llamacpp"):  # no spec for a shared layer (vLLM); n_layer_kv_from_start 20 (llama.cpp)
        plan = size(ModelOptions(str(path)), EngineOptions(engine=engine), 4096).plan
        assert all(g.bytes == 0 for g in plan.groups if g.kind == "shared")
        assert sum(len(g.layer_ids) for g in plan.groups if g.bytes) == 20
    # SGLang's token pool has K/V buffers for all 35 layers (tests/test_gemma3n.py); TensorRT-LLM has no Gemma-3n
    plan = size(ModelOptions(str(path)), EngineOptions(engine="sglang"), 4096).plan
    assert sum(len(g.layer_ids) for g in plan.groups if g.bytes) == 35


# ---------------------------------------------------------------------------------------------- Kimi Linear
def _k3_as_kimi_linear() -> dict:
    """Kimi-K3's text_config scaled down to what transformers' KimiLinear class can build: every field that shapes
    the cache kept (93 layers with K3's 1-based full_attn_layers / kda_layers, 96 KDA heads x 128, conv kernel 4,
    kv_lora_rank 512 + rope 64, q_lora_rank 1536), widths and experts shrunk (the vocabulary kept: pad_token_id
    163839 must index it), 'situ' -> 'silu' (ACT2FN has no
    'situ'), and the K3-only fields the class ignores dropped (full-rank gate, MLA output gate, latent MoE,
    attention residuals, the MXFP4 quantization_config)."""
    from test_kimi_linear import k3_text

    t = k3_text()
    for key in ("attn_res_block_size", "routed_expert_hidden_size", "latent_moe_use_norm", "mla_use_output_gate",
                "quantization_config", "auto_map"):
        t.pop(key, None)
    t["linear_attn_config"] = {k: v for k, v in t["linear_attn_config"].items() if k != "use_full_rank_gate"}
    t.update(hidden_act="silu", hidden_size=256, intermediate_size=256, moe_intermediate_size=64, num_experts=8,
             num_experts_per_token=2)
    return t


def _kimi_configs():
    from test_kimi_linear import KL48

    # and the genuine Kimi-Linear-48B-A3B-Instruct config.json, every key as shipped (tests/data/wild-configs, grade B)
    genuine = json.loads((WILD / "moonshotai--Kimi-Linear-48B-A3B-Instruct" / "config.json").read_text())
    return [pytest.param(KL48, id="kimi-linear-48b"), pytest.param(_k3_as_kimi_linear(), id="kimi-k3-text-scaled"),
            pytest.param(genuine, id="kimi-linear-48b-genuine")]


@pytest.mark.parametrize("config", _kimi_configs())
def test_kimi_linear_hf_cache_equals_a_real_forward(config, tmp_path):
    """KimiLinearForCausalLM on meta, one forward of [2, ctx]: the DynamicCache's LinearAttentionLayer conv
    [2, 3 x heads x head_dim, kernel] fp16 + recurrent [2, heads, head_dim, head_dim] fp32 on the KDA layers, the
    latent [2, 1, ctx, 512] + [2, 1, ctx, 64] fp16 on the MLA layers; kvplan's hf plan must hold the same bytes."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    for ctx in (SHORT_CTX, 300):
        truth = oracle.hf_cache_bytes(config, batch=2, ctx=ctx, dtype="float16")
        r = size(ModelOptions(str(path)), EngineOptions(engine="hf", kv_dtype="fp16"), ctx, batch=2)
        assert r.plan.kv_bytes == truth["total"], f"ctx {ctx}: kvplan {r.plan.kv_bytes:,} vs transformers {truth['total']:,}"


@pytest.mark.parametrize("config", _kimi_configs())
def test_kimi_linear_params_are_the_checkpoint_tensors(config, tmp_path):
    """kvplan counts what the checkpoint holds: transformers' parameters plus its persistent buffers (the MoE
    routers' e_score_correction_bias, saved in state_dict; 256 x 26 = 6,656 values for the 48B model, whose
    parameters then total the checkpoint listing's 49,122,681,728)."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    truth = oracle.hf_param_counts(config)
    ours = size(ModelOptions(str(path)), EngineOptions(engine="hf", kv_dtype="fp16"), SHORT_CTX).setup.spec.params
    assert ours == truth["params"] + truth["persistent_buffers_numel"]


def _lfm2_configs():
    """The vLLM oracle's two scaled LFM2 configs, and one with the other MLP / bias / tying branches."""
    import oracle_vllm

    a, b = (oracle_vllm.MODELS[m].raw for m in ("lfm2", "lfm2-wide"))
    c = {**a, "conv_bias": True, "tie_embedding": False, "block_auto_adjust_ff_dim": False, "block_ff_dim": 640}
    return [pytest.param(a, id="lfm2"), pytest.param(b, id="lfm2-wide"), pytest.param(c, id="lfm2-untied-bias")]


def _lfm2_moe_configs():
    import oracle_vllm

    m = oracle_vllm.MODELS["lfm2-moe"].raw
    return [pytest.param(m, id="lfm2-moe"), pytest.param({**m, "use_expert_bias": False, "num_dense_layers": 0,
                                                          "tie_embedding": False}, id="lfm2-moe-nobias-untied")]


@pytest.mark.parametrize("config", _lfm2_moe_configs())
def test_lfm2_moe_params_and_cache_equal_transformers(config, tmp_path):
    """Lfm2MoeForCausalLM on meta: parameters plus its persistent fp32 expert_bias buffers (in the checkpoint), and
    the DynamicCache of one forward of [2, ctx] as kvplan's hf plan."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    truth = oracle.hf_param_counts(config)
    ours = size(ModelOptions(str(path)), EngineOptions(engine="hf", kv_dtype="fp16"), SHORT_CTX).setup.spec.params
    assert ours == truth["params"] + truth["persistent_buffers_numel"]
    for ctx in (SHORT_CTX, 300):
        cache = oracle.hf_cache_bytes(config, batch=2, ctx=ctx, dtype="float16")
        r = size(ModelOptions(str(path)), EngineOptions(engine="hf", kv_dtype="fp16"), ctx, batch=2)
        assert r.plan.kv_bytes == cache["total"], f"ctx {ctx}: kvplan {r.plan.kv_bytes:,} vs transformers {cache['total']:,}"


@pytest.mark.parametrize("config", _lfm2_configs())
def test_lfm2_params_and_cache_equal_transformers(config, tmp_path):
    """Lfm2ForCausalLM on meta: its parameters, and after one forward of [2, ctx] its DynamicCache -- K/V on the
    attention layers, conv_states [2, hidden, conv_L_cache] fp16 on the conv layers -- as kvplan's hf plan."""
    assert_params_and_cache_equal(config, tmp_path, (SHORT_CTX, 300))


def _falcon_h1_configs():
    import oracle_vllm

    m = oracle_vllm.MODELS["falcon-h1"].raw
    return [pytest.param(m, id="falcon-h1"),
            pytest.param({**m, "mamba_rms_norm": False, "mamba_conv_bias": False, "tie_word_embeddings": True,
                          "mamba_d_head": "auto", "mamba_n_groups": 2}, id="falcon-h1-groups2-tied")]


@pytest.mark.parametrize("config", _falcon_h1_configs())
def test_falcon_h1_params_and_cache_equal_transformers(config, tmp_path):
    """FalconH1ForCausalLM on meta: its parameters (mup_vector is a non-persistent buffer), and after one forward of
    [2, ctx] every layer's LinearAttentionAndFullAttentionLayer -- K/V fp16, conv [2, d_ssm + 2GS, d_conv] fp16,
    SSM [2, heads, d_head, d_state] fp32 -- as kvplan's hf plan."""
    assert_params_and_cache_equal(config, tmp_path, (SHORT_CTX, 300))


def _zamba2_configs():
    import oracle_vllm

    m, long = oracle_vllm.MODELS["zamba2"].raw, oracle_vllm.MODELS["zamba2-long"].raw
    pattern = {k: v for k, v in m.items() if k != "layers_block_type"}
    return [pytest.param(m, id="zamba2"), pytest.param(long, id="zamba2-long"),
            # three shared blocks over five hybrid layers, biases, 4 x hidden MLP (intermediate_size null), the
            # legacy name layer_types, a config restating the widths transformers derives
            pytest.param({**{k: v for k, v in m.items() if k != "layers_block_type"}, "num_hidden_layers": 9,
                          "layer_types": ["hybrid", "mamba", "hybrid", "hybrid", "mamba", "hybrid", "mamba", "mamba",
                                          "hybrid"], "num_mem_blocks": 3, "add_bias_linear": True,
                          "intermediate_size": None, "mamba_ngroups": 4, "attention_head_dim": 128,
                          "attention_hidden_size": 512, "mamba_headdim": 64,
                          "hybrid_layer_ids": [0, 2, 3, 5, 8]}, id="zamba2-3blocks-bias"),
            # no layers_block_type: Zamba2Config's 54-layer default pattern (9 hybrid layers)
            pytest.param({**pattern, "num_hidden_layers": 54, "hidden_size": 64, "n_mamba_heads": 2,
                          "mamba_d_state": 16}, id="zamba2-default-pattern")]


@pytest.mark.parametrize("config", _zamba2_configs())
def test_zamba2_params_and_cache_equal_transformers(config, tmp_path):
    """Zamba2ForCausalLM on meta: its parameters (the shared blocks counted once, as transformers ties them, every
    position's adapters and linear), and after one forward of [2, ctx] every layer's cache -- a Mamba-2 state
    (conv [2, inner + 2GS, d_conv] fp16, SSM [2, heads, head_dim, d_state] fp32) and on the hybrid layers K/V
    [2, heads, ctx, 2 x hidden / heads] fp16 -- as kvplan's hf plan."""
    assert_params_and_cache_equal(config, tmp_path, (SHORT_CTX, 300))


def _cohere2_smollm3_configs():
    """The vLLM oracle's scaled Cohere2 and SmolLM3 configs (SmolLM3 cut from its genuine config.json), and the
    other branches: Cohere2 untied, its class-default pattern (no sliding_window_pattern key); SmolLM3 untied with
    biases, MHA by num_key_value_heads null."""
    import oracle_vllm

    c2, odd, smol, swa = (oracle_vllm.MODELS[m].raw for m in ("cohere2", "cohere2-odd", "smollm3", "smollm3-swa"))
    c2_default = {k: v for k, v in c2.items() if k != "sliding_window_pattern"}
    return [pytest.param(c2, 8200, id="cohere2"), pytest.param(odd, 1100, id="cohere2-odd"),
            pytest.param({**c2_default, "tie_word_embeddings": False, "sliding_window": 48, "num_hidden_layers": 6},
                         100, id="cohere2-untied-defaults"),
            pytest.param(smol, 300, id="smollm3"), pytest.param(swa, 1100, id="smollm3-swa"),
            pytest.param({**swa, "tie_word_embeddings": False, "attention_bias": True, "mlp_bias": True,
                          "num_key_value_heads": None, "no_rope_layers": None, "no_rope_layer_interval": 3,
                          "sliding_window": 40}, 100, id="smollm3-mha-bias-interval3")]


@pytest.mark.parametrize("config, long", _cohere2_smollm3_configs())
def test_cohere2_and_smollm3_params_and_cache_equal_transformers(config, long, tmp_path):
    """Cohere2ForCausalLM / SmolLM3ForCausalLM on meta: their parameters, and after one forward of [2, ctx] the
    DynamicCache (DynamicSlidingWindowLayer on the sliding layers, DynamicLayer on the full ones) as kvplan's hf plan,
    at a short context and one beyond the window."""
    assert_params_and_cache_equal(config, tmp_path, (SHORT_CTX, long))


# ---------------------------------------------------------------------------------------------- Llama-3.2-Vision
def _mllama_configs():
    from transformers import MllamaConfig

    from test_mllama import MLLAMA_TINY

    # transformers' own MllamaConfig (its docstring's checkpoint meta-llama/Llama-3.2-11B-Vision: 40 text layers,
    # 8 of them cross attention, 32 + 8 tower layers) with the release's 560-pixel tiles
    default_11b = {**MllamaConfig(vision_config={"image_size": 560}).to_dict(),
                   "architectures": ["MllamaForConditionalGeneration"]}
    tiles2 = {**MLLAMA_TINY, "tie_word_embeddings": True,
              "text_config": {**MLLAMA_TINY["text_config"], "num_key_value_heads": 4, "cross_attention_layers": [0, 5]},
              "vision_config": {**MLLAMA_TINY["vision_config"], "max_num_tiles": 2,
                                "supported_aspect_ratios": [[1, 1], [1, 2], [2, 1]]}}
    return [pytest.param(default_11b, (SHORT_CTX,), id="mllama-11b-defaults"),
            pytest.param(MLLAMA_TINY, (SHORT_CTX, 300), id="mllama-tiny"),
            pytest.param(tiles2, (SHORT_CTX, 300), id="mllama-tiny-2tiles-mha-tied")]


@pytest.mark.parametrize("config, ctxs", _mllama_configs())
def test_mllama_params_and_cache_equal_transformers(config, ctxs, tmp_path):
    """MllamaForConditionalGeneration on meta: its parameters (tower and projector as `vision`), and after one
    forward of [2, ctx] text tokens with 1 and 2 images of max_num_tiles tiles (pixel_values), every layer of the
    returned cache (self-attention K/V of ctx tokens, cross-attention K/V of images x tiles x patches) as kvplan's hf
    plan with the default (one image) and with --encoder-len."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    spec = size(ModelOptions(str(path)), EngineOptions(engine="hf", kv_dtype="fp16"), SHORT_CTX).setup.spec
    truth = oracle.hf_param_counts(config)
    assert (spec.params, spec.params_of("vision")) == (truth["params"], truth["vision_params"])
    per_image = spec.encoder_len
    for images in (1, 2):
        for ctx in ctxs:
            got = oracle.mllama_cache_bytes(config, batch=2, ctx=ctx, images=images)
            mo = ModelOptions(str(path), encoder_len=None if images == 1 else images * per_image)
            r = size(mo, EngineOptions(engine="hf", kv_dtype="fp16"), ctx, batch=2)
            assert r.plan.kv_bytes == got["total"], (f"ctx {ctx}, {images} image(s): kvplan {r.plan.kv_bytes:,} vs "
                                                     f"transformers {got['total']:,}")


def test_mllama_11b_parameters_match_the_published_count():
    """The transformers-default geometry with 560-pixel tiles counts 10,670,220,835 parameters, the figure a public
    parameter table lists for meta-llama/llama-3.2-11b-vision-instruct (code-search index id 12439498600)."""
    from transformers import MllamaConfig

    from kvplan.architectures import normalize

    config = {**MllamaConfig(vision_config={"image_size": 560}).to_dict(),
              "architectures": ["MllamaForConditionalGeneration"]}
    assert normalize(config).params == 10_670_220_835


def _encdec_configs():
    """Scaled copies of the genuine Flan-T5 / mT5 / BART configs (tests/data/wild-configs; tests/test_encdec_families.py
    ENCDEC_SCALED): the cache geometry kept (heads, d_kv / head_dim, the encoder and decoder layer counts of each
    kind), widths and vocabulary small; plus an mBART (its final layer_norms) with unequal encoder/decoder heads."""
    from test_encdec_families import ENCDEC_SCALED

    return [pytest.param(c, id=name) for name, c in ENCDEC_SCALED.items()]


@pytest.mark.parametrize("config", _encdec_configs())
def test_encoder_decoder_cache_equals_a_real_forward(config, tmp_path):
    """T5ForConditionalGeneration / MT5ForConditionalGeneration / BartForConditionalGeneration /
    MBartForConditionalGeneration on meta, one forward of [2, ctx] decoder tokens over [2, encoder_len] encoder tokens:
    the EncoderDecoderCache's self-attention layers [2, heads, ctx, head_dim] and cross-attention layers
    [2, heads, encoder_len, head_dim] bf16 are kvplan's hf plan, at the default encoder length and a shorter one.
    The forward runs on the CPU with random weights (the configs are small): BART's decoder builds an all-ones
    attention mask and the mask code reads it (masking_utils.py _ignore_causal_mask_sdpa), which meta tensors
    cannot answer."""
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    for ctx, enc in ((SHORT_CTX, None), (100, 40)):
        r = size(ModelOptions(str(path), encoder_len=enc), EngineOptions(engine="hf", kv_dtype="bf16"), ctx, batch=2)
        truth = oracle.hf_cache_bytes(config, batch=2, ctx=ctx, dtype="bfloat16", encoder_len=r.setup.spec.encoder_len,
                                      device="cpu")
        assert truth["encoder_len"] == (enc or r.setup.spec.encoder_len)
        assert r.plan.kv_bytes == truth["total"], f"ctx {ctx}: kvplan {r.plan.kv_bytes:,} vs transformers {truth['total']:,}"


@pytest.mark.parametrize("config", _encdec_configs())
def test_encoder_decoder_params_equal_transformers(config, tmp_path):
    """BART / mBART: transformers' parameters on meta plus the persistent final_logits_bias buffer (in the
    checkpoint); the encoder's share (embed_positions, layernorm_embedding, layers, mBART's layer_norm) apart.
    T5 / mT5 with tie_word_embeddings false: the meta count ties lm_head (T5Config forces the flag), so the oracle is
    what from_pretrained builds from a checkpoint holding its own lm_head (tests/test_encdec_families.py)."""
    from test_encdec_families import loaded_param_count

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    spec = size(ModelOptions(str(path)), EngineOptions(engine="hf", kv_dtype="fp16"), SHORT_CTX).setup.spec
    truth = oracle.hf_param_counts(config)
    assert spec.params_of("encoder") == truth["encoder_params"]
    if config["model_type"] in ("t5", "mt5"):
        assert spec.params == loaded_param_count(config, tmp_path)
    else:
        assert spec.params == truth["params"] + truth["persistent_buffers_numel"]


# ---------------------------------------------------------------------------------------------- MiniMax-01
def _minimax01_configs():
    """Scaled copies of the genuine MiniMax-M1 config (tests/test_minimax01.py): its first 8 layers (7 lightning,
    then softmax), and a second shape (16 heads x 32, one KV head, 12 layers with softmax every 4th, bf16 file) in the
    native form transformers builds (model_type minimax, layer_types)."""
    from test_minimax01 import as_native, scaled

    wide = scaled(num_hidden_layers=12, attn_type_list=[0, 0, 0, 1] * 3, num_attention_heads=16, num_key_value_heads=1,
                  head_dim=32, hidden_size=128, torch_dtype="bfloat16")
    return [pytest.param(as_native(scaled()), id="m1-scaled"), pytest.param(as_native(wide), id="m1-wide-kv1")]


@pytest.mark.parametrize("config", _minimax01_configs())
def test_minimax01_params_and_cache_equal_transformers(config, tmp_path):
    """MiniMaxForCausalLM on meta: its parameters (the decay buffers are not parameters), and after one forward of
    [2, ctx] its MiniMaxCache -- linear_cache [2, heads, head_dim, head_dim] fp16 per lightning layer, K/V on the
    softmax layers -- as kvplan's hf plan, for the native config and for the same model as the remote-code config
    (attn_type_list, model_type minimax_m1) that transformers cannot build itself."""
    from test_minimax01 import M1

    remote = {k: v for k, v in config.items() if k != "layer_types"}
    remote.update(model_type="minimax_m1", architectures=["MiniMaxM1ForCausalLM"], auto_map=M1["auto_map"],
                  attn_type_list=[0 if t == "linear_attention" else 1 for t in config["layer_types"]])
    paths = []
    for name, cfg in (("native", config), ("remote", remote)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(cfg))
    truth = oracle.hf_param_counts(config)["params"]
    for path in paths:
        assert size(ModelOptions(str(path)), EngineOptions(engine="hf", kv_dtype="fp16"), SHORT_CTX).setup.spec.params == truth
    for ctx in (SHORT_CTX, 300):
        cache = oracle.hf_cache_bytes(config, batch=2, ctx=ctx, dtype="float16")["total"]
        for path in paths:
            r = size(ModelOptions(str(path)), EngineOptions(engine="hf", kv_dtype="fp16"), ctx, batch=2)
            assert r.plan.kv_bytes == cache, f"{path.name} ctx {ctx}: kvplan {r.plan.kv_bytes:,} vs transformers {cache:,}"


def _tensor_rows(truth: dict) -> Counter:
    """Every tensor the returned cache holds, as (name, shape, dtype), counted over the layers."""
    return Counter((name, shape, dtype) for layer in truth["layers"] for name, shape, dtype, _ in layer["tensors"])


def _plan_rows(plan) -> Counter:
    rows: Counter = Counter()
    for g in plan.groups:
        for t in g.tensors:
            rows[(t.name, tuple(t.shape), t.dtype)] += t.count
    return rows


# ---------------------------------------------------------------------------------------------- DeepSeek-V4
def _dsv4_scaled(dirname: str, layers: int = 5) -> dict:
    """A bundled DeepSeek-V4 config with every field that shapes transformers' cache kept (head_dim 512 with its
    64-wide rope part, the 128-token sliding_window, index_head_dim 128, the config's own compress_ratios for its
    first `layers` layers plus the MTP entry, which transformers drops) and widths, heads, experts, ranks and the
    vocabulary shrunk so a CPU forward takes seconds."""
    c = oracle.load_config(dirname)
    c.update(hidden_size=64, num_attention_heads=4, n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32,
             q_lora_rank=32, o_groups=2, o_lora_rank=16, index_n_heads=2, index_topk=8, vocab_size=1000,
             num_hidden_layers=layers, compress_ratios=c["compress_ratios"][:layers] + [0], num_hash_layers=1)
    return c


@pytest.mark.parametrize("dirname, dtype, ctxs", [
    # ratios 0, 0, 4, 128, 4: two window-only layers; 3 < one ratio-4 window; 18 inside the window, no ratio-128
    # entry yet (all 18 tokens buffered); 517 beyond the window, 129 ratio-4 entries + 1 buffered, 4 ratio-128
    # entries + 5 buffered
    ("deepseek-ai--DeepSeek-V4-Flash", "fp16", (3, 18, 517)),
    ("deepseek-ai--DeepSeek-V4-Pro", "bf16", (18, 517)),  # ratios 128, 128, 4, 128, 4
])
def test_deepseek_v4_hf_cache_equals_a_real_cpu_forward(dirname, dtype, ctxs, tmp_path):
    """DeepseekV4ForCausalLM, a real CPU forward of [2, ctx] of a scaled bundled config: kvplan's hf plan holds the
    returned cache's bytes, and tensor by tensor the same names, shapes and dtypes (window K and V on window-only
    layers, the K=V window once on compressed ones, compressed_kv / buffer_kv / buffer_gate / overlap_kv for the
    compressor and the indexer, overlap_gate in fp32); parameters equal the class's count."""
    config = _dsv4_scaled(dirname)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    torch_dtype = {"fp16": "float16", "bf16": "bfloat16"}[dtype]
    opts = EngineOptions(engine="hf", kv_dtype=dtype)
    assert size(ModelOptions(str(path)), opts, 16).setup.spec.params == oracle.hf_param_counts(config)["params"]
    for ctx in ctxs:
        truth = oracle.hf_cache_bytes(config, batch=2, ctx=ctx, dtype=torch_dtype, device="cpu")
        r = size(ModelOptions(str(path)), opts, ctx, batch=2)
        assert r.plan.kv_bytes == truth["total"], f"ctx {ctx}: kvplan {r.plan.kv_bytes:,} vs transformers {truth['total']:,}"
        assert _plan_rows(r.plan) == _tensor_rows(truth), f"ctx {ctx}"


def test_deepseek_v4_hf_cache_shrinks_when_a_window_closes(tmp_path):
    """The buffered tokens of a ratio-128 window become one entry at the 128th token: transformers' cache after 128
    tokens (and after 129) is smaller than after 127 (meta forwards of the scaled Flash config), and kvplan's hf plan
    follows."""
    config = _dsv4_scaled("deepseek-ai--DeepSeek-V4-Flash")
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    got = {}
    for ctx in (127, 128, 129):
        truth = oracle.hf_cache_bytes(config, batch=1, ctx=ctx)
        got[ctx] = size(ModelOptions(str(path)), EngineOptions(engine="hf", kv_dtype="fp16"), ctx).plan.kv_bytes
        assert got[ctx] == truth["total"], ctx
    assert got[128] < got[129] < got[127]


# ---------------------------------------------------------------------------------------------- MiniMax-M3
def _m3_as_vl_text(scaled: bool) -> dict:
    """aiconfigurator's MiniMax-M3 text config (model_type minimax_m3, which transformers does not register) as the
    minimax_m3_vl_text model transformers builds (MiniMaxM3VLTextConfig reads the same fields: sparse_attention_config,
    moe_layer_freq); scaled: 4 layers (dense, then MoE; sparse attention on layers 1 and 3), widths, experts and the
    vocabulary shrunk, head_dim 128 and the 128-wide index key kept."""
    c = json.loads((Path(__file__).parent / "data" / "aic-configs" / "MiniMaxAI--MiniMax-M3_config.json").read_text())
    c.update(model_type="minimax_m3_vl_text", architectures=["MiniMaxM3VLForCausalLM"])
    if scaled:
        c.update(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                 num_experts_per_tok=2, intermediate_size=32, moe_intermediate_size=32, shared_intermediate_size=32,
                 dense_intermediate_size=48, vocab_size=1000, num_hidden_layers=4, moe_layer_freq=[0, 1, 1, 1])
        c["sparse_attention_config"].update(sparse_attention_freq=[0, 1, 0, 1], sparse_disable_index_value=[1] * 4,
                                            sparse_num_index_heads=2)
    return c


@pytest.mark.parametrize("scaled, device, ctxs", [(True, "cpu", (16, 300)), (False, "meta", (16, 300))],
                         ids=["scaled-cpu", "full-meta"])
def test_minimax_m3_hf_cache_equals_transformers(scaled, device, ctxs, tmp_path):
    """MiniMaxM3VLForCausalLM, one forward of [2, ctx] (a real CPU forward of the scaled copy; the full config on
    meta): K/V on every layer and idx_keys [2, 1, ctx, 128] on the sparse layers (MiniMaxM3VLSparseCacheLayer), as
    kvplan's hf plan, tensor by tensor; parameters = the class's count + the persistent e_score_correction_bias
    buffers (one per MoE layer), which the checkpoint holds."""
    config = _m3_as_vl_text(scaled)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    truth = oracle.hf_param_counts(config)
    ours = size(ModelOptions(str(path)), EngineOptions(engine="hf", kv_dtype="fp16"), 16).setup.spec.params
    assert ours == truth["params"] + truth["persistent_buffers_numel"]
    for ctx in ctxs:
        cache = oracle.hf_cache_bytes(config, batch=2, ctx=ctx, dtype="float16", device=device)
        r = size(ModelOptions(str(path)), EngineOptions(engine="hf", kv_dtype="fp16"), ctx, batch=2)
        assert r.plan.kv_bytes == cache["total"], f"ctx {ctx}: kvplan {r.plan.kv_bytes:,} vs transformers {cache['total']:,}"
        assert _plan_rows(r.plan) == _tensor_rows(cache), f"ctx {ctx}"
