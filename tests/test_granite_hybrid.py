"""Granite-4.0-H (granitemoehybrid) and Bamba: Mamba-2 + attention hybrids.

No genuine config.json is bundled (none found with provenance): the configs here are built from transformers'
own config classes (GraniteMoeHybridConfig, BambaConfig) at a small width with the real models' state geometry.
Oracles: transformers' model code (parameters on meta, the cache of a real forward) here, and vLLM 0.32's CPU build
for a scaled Granite-4.0-H (tests/oracle_vllm.py "granite-4.0-h", tests/test_engine_vllm.py). The per-layer state
figures below are vLLM's mamba2_state_shape arithmetic written out (model_executor/layers/mamba/mamba_utils.py).
"""

from __future__ import annotations

import pytest

from conftest import kvjson, run_cli, write_config

oracle = pytest.importorskip("oracle_hf")
pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from kvplan.sizing import EngineOptions, ModelOptions, size  # noqa: E402

TINY_PATTERN = ["mamba"] * 3 + ["attention"] + ["mamba"] * 3 + ["attention"]


def granite(**overrides) -> dict:
    """GraniteMoeHybridConfig at width 256 with Granite-4.0-H's state geometry scaled (8 Mamba heads x 64, state
    128, 1 group, conv 4), GQA 4/2 x 64, NoPE, 4 experts + the shared MLP, tied embeddings; the Hub files' legacy
    layer_types names (mamba / attention) are written back over the class's remapped ones."""
    kw = dict(vocab_size=256, hidden_size=256, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=64, shared_intermediate_size=96, num_local_experts=4, num_experts_per_tok=2,
              mamba_n_heads=8, mamba_d_head=64, mamba_n_groups=1, mamba_d_state=128, mamba_d_conv=4,
              position_embedding_type="nope", tie_word_embeddings=True, pad_token_id=0, bos_token_id=0,
              eos_token_id=0, layer_types=TINY_PATTERN)
    kw.update(overrides)
    c = transformers.GraniteMoeHybridConfig(**kw).to_dict()
    c["layer_types"] = kw["layer_types"]
    return {**c, "architectures": ["GraniteMoeHybridForCausalLM"], "torch_dtype": "bfloat16"}


def bamba(**overrides) -> dict:
    kw = dict(vocab_size=256, hidden_size=256, num_hidden_layers=8, num_attention_heads=4, num_key_value_heads=2,
              intermediate_size=64, mamba_n_heads=8, mamba_d_head=64, mamba_n_groups=2, mamba_d_state=128,
              attn_layer_indices=[2, 6], pad_token_id=0)
    kw.update(overrides)
    c = transformers.BambaConfig(**kw).to_dict()
    return {**c, "architectures": ["BambaForCausalLM"], "torch_dtype": "bfloat16"}


CONFIGS = {
    "granite-4.0-h-moe-nope-tied": lambda: granite(),
    # Granite-4.0 dense (micro): every layer attention, no experts, only the shared MLP, rope, untied head
    "granite-4.0-dense-rope": lambda: granite(num_hidden_layers=4, layer_types=["attention"] * 4, num_local_experts=0,
                                              position_embedding_type="rope", tie_word_embeddings=False),
    # mamba_d_head 'auto' = 2 x 256 / 8; transformers' own layer_types names
    "granite-biases-groups-auto-head": lambda: granite(
        attention_bias=True, mamba_proj_bias=True, mamba_conv_bias=False, mamba_n_groups=2, shared_intermediate_size=0,
        mamba_d_head="auto", layer_types=["linear_attention", "full_attention"] * 4),
    "bamba": lambda: bamba(),
    # null KV heads: BambaConfig makes them num_attention_heads (16 x 16 here, not the default 8)
    "bamba-mlp-bias-kv-null": lambda: {**bamba(mlp_bias=True, num_attention_heads=16), "num_key_value_heads": None},
    # no KV-heads key: BambaConfig's default 8 (of 16 heads x 16)
    "bamba-kv-absent": lambda: {k: v for k, v in bamba(num_attention_heads=16).items() if k != "num_key_value_heads"},
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_params_and_cache_equal_transformers(name, tmp_path):
    """Parameters = the meta-device count of the architectures[0] class; hf cache bytes = every tensor of the cache a
    real forward of [2, ctx] returns (ctx 16 and 300)."""
    config = CONFIGS[name]()
    path = write_config(tmp_path, name, config)
    truth = oracle.hf_param_counts(config)
    r = size(ModelOptions(path), EngineOptions(engine="hf", kv_dtype="fp16"), 16, batch=2)
    assert r.setup.spec.params == truth["params"]
    for ctx in (16, 300):
        t = oracle.hf_cache_bytes(config, batch=2, ctx=ctx, dtype="float16")["total"]
        got = size(ModelOptions(path), EngineOptions(engine="hf", kv_dtype="fp16"), ctx, batch=2).plan.kv_bytes
        assert got == t, f"ctx {ctx}: kvplan {got:,} vs transformers {t:,}"


def test_vllm_state_page_is_mamba2_state_shape(tmp_path):
    """vLLM (models/granitemoehybrid.py get_mamba_state_shape_from_config -> mamba2_state_shape): conv
    (d_conv - 1) x (expand x hidden + 2 x groups x d_state) and SSM heads x head_dim x d_state, both bf16 by default:
    3 x (512 + 256) x 2 + 8 x 64 x 128 x 2 = 4,608 + 131,072 = 135,680 B per Mamba layer; attention 2 KV heads x 64
    x K,V x 2 B = 512 B per token per layer (2 layers: 1,024 B)."""
    d = kvjson("size", write_config(tmp_path, "g", granite()), "--engine", "vllm@0.32", "--ctx", "1024")
    assert d["kv_bytes_per_token"] == 2 * 2 * 64 * 2 * 2
    assert any("135,680 B" in a for a in d["assumptions"]), d["assumptions"]


def test_sglang_state_is_its_mamba2_cache_params(tmp_path):
    """SGLang 0.5.10 (configs/granitemoehybrid.py mamba2_cache_params -> Mamba2StateShape of the 'mamba' layers):
    conv (d_conv - 1) x conv_dim in bf16 + SSM heads x head_dim x d_state in fp32 (--mamba-ssm-dtype default):
    4,608 + 8 x 64 x 128 x 4 = 266,752 B per request and Mamba layer, 6 layers."""
    d = kvjson("size", write_config(tmp_path, "g", granite()), "--engine", "sglang", "--ctx", "1024")
    assert {g["kind"]: g["bytes"] for g in d["groups"]}["mamba_state"] == 6 * (3 * (512 + 256) * 2 + 8 * 64 * 128 * 4)


def test_layer_types_and_head_dim_refusals_are_one_line(tmp_path):
    bad = granite()
    bad["layer_types"] = TINY_PATTERN[:-1] + ["moe"]
    r = run_cli("size", write_config(tmp_path, "a", bad), "--ctx", "1024")
    assert r.code == 2 and "layer_types" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    short = granite()
    short["layer_types"] = TINY_PATTERN[:-1]
    r = run_cli("size", write_config(tmp_path, "b", short), "--ctx", "1024")
    assert r.code == 2 and "7 entries" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    r = run_cli("size", write_config(tmp_path, "c", {**granite(), "head_dim": 128}), "--ctx", "1024")
    assert r.code == 2 and "head_dim 128" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    r = run_cli("size", write_config(tmp_path, "d", {**granite(), "mamba_d_head": 32}), "--ctx", "1024")
    assert r.code == 2 and "mamba_d_head 32" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    r = run_cli("size", write_config(tmp_path, "e", {**bamba(), "attn_layer_indices": [2, 8]}), "--ctx", "1024")
    assert r.code == 2 and "attn_layer_indices" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    # no layer_types: transformers / vLLM make every layer Mamba-2, SGLang's own config class every 6th attention
    r = run_cli("size", write_config(tmp_path, "f", {k: v for k, v in granite().items() if k != "layer_types"}),
                "--ctx", "1024")
    assert r.code == 2 and "needs layer_types" in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_rope_table_only_for_rope_granite(tmp_path):
    """vLLM's GraniteMoeHybridAttention calls get_rope only when position_embedding_type is 'rope'."""
    from kvplan import architectures

    assert architectures.normalize(granite()).rope_tables == ()
    rope = architectures.normalize(granite(position_embedding_type="rope"))
    assert len(rope.rope_tables) == 1 and rope.rope_tables[0].dim == 64


@pytest.mark.parametrize("engine, family, says", [
    # vLLM 0.32's registry.py _PREVIOUSLY_SUPPORTED_MODELS: BambaForCausalLM "supported in vLLM until v0.23.0"
    ("vllm@0.32", "bamba", "supported until v0.23.0"),
    ("vllm@0.24", "bamba", "supported until v0.23.0"),
    ("sglang", "bamba", "no BambaForCausalLM"),
    ("trtllm", "bamba", "TensorRT-LLM has no Bamba model"),
    ("trtllm", "granite", "TensorRT-LLM has no Granite-4.0-H model"),
])
def test_engines_without_the_family_refuse_in_one_line(tmp_path, engine, family, says):
    path = write_config(tmp_path, family, bamba() if family == "bamba" else granite())
    r = run_cli("size", path, "--engine", engine, "--ctx", "1024")
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_engines_that_run_them_size_them(tmp_path):
    for engine in ("vllm@0.22", "vllm@0.23", "hf", "llamacpp"):
        assert kvjson("size", write_config(tmp_path, "b", bamba()), "--engine", engine, "--ctx", "1024")["kv_bytes"] > 0
    for engine in ("vllm", "sglang", "hf", "llamacpp"):
        assert kvjson("size", write_config(tmp_path, "g", granite()), "--engine", engine, "--ctx", "1024")["kv_bytes"] > 0
