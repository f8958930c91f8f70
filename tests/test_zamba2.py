"""Zamba2 (model_type zamba2): Mamba-2 on every layer, a shared transformer block (2 x hidden wide) on the hybrid ones.

Oracles, none written here: transformers' model code (tests/test_oracle_hf.py: parameters on meta and the cache of a
real forward, four scaled configs) and vLLM 0.32's CPU build (tests/oracle_vllm.py models zamba2 and zamba2-long,
six cases, and the rotary table vLLM allocates). No genuine config.json is bundled (no byte-exact copy of a Zyphra
config.json was found in a public repository; the Hub is unreachable here). What is left: figures from the engines'
formulas, the Zamba2Config defaults, and one-line refusals.
"""

from __future__ import annotations

import pytest

from conftest import kvjson, run_cli, write_config

# a scaled Zamba2 (tests/oracle_vllm.py's "zamba2"): 7 layers, hybrid at 1, 3, 5; hidden 256, 4 heads; Mamba-2
# 8 heads x 64 (expand 2), state 64, 1 group, conv 4; two shared blocks with q/k/v adapters of rank 8
Z = {
    "architectures": ["Zamba2ForCausalLM"], "model_type": "zamba2", "vocab_size": 256, "hidden_size": 256,
    "num_hidden_layers": 7, "layers_block_type": ["mamba", "hybrid", "mamba", "hybrid", "mamba", "hybrid", "mamba"],
    "num_attention_heads": 4, "num_key_value_heads": 4, "intermediate_size": 64, "mamba_d_state": 64,
    "mamba_d_conv": 4, "mamba_expand": 2, "mamba_ngroups": 1, "n_mamba_heads": 8, "num_mem_blocks": 2,
    "adapter_rank": 8, "use_shared_attention_adapter": True, "use_mem_rope": True, "max_position_embeddings": 4096,
    "torch_dtype": "bfloat16",
}


def hf(tmp_path, config, *extra):
    return kvjson("size", write_config(tmp_path, "m", config), "--engine", "hf", "--kv-dtype", "fp16", *extra)


def test_every_layer_keeps_a_mamba2_state_and_the_hybrid_ones_their_own_kv(tmp_path):
    """transformers: hybrid layers K/V [B, 4, ctx, 2 x 256 / 4 = 128] fp16 each (weights shared, cache not); every
    layer conv [B, 512 + 2 x 1 x 64, 4] fp16 and SSM [B, 8, 64, 64] fp32."""
    d = hf(tmp_path, Z, "--ctx", "1000")
    assert {g["kind"]: g["layers"] for g in d["groups"]} == {"full": 3, "mamba_state": 7}
    assert d["kv_bytes_per_token"] == 3 * 2 * 4 * 128 * 2
    assert d["kv_bytes"] == 1000 * 3 * 2 * 4 * 128 * 2 + 7 * (640 * 4 * 2 + 8 * 64 * 64 * 4)


def test_a_shared_block_is_counted_once_and_its_adapters_per_position(tmp_path):
    """One shared block more (num_mem_blocks 2 -> 3 over five hybrid layers) adds the block's own weights only:
    norms 2h + h, q/k/v 2h x 2h, o 2h x h, gate_up h x 2I, down I x h; the adapters stay one set per position."""
    five = {**Z, "num_hidden_layers": 9, "layers_block_type": ["hybrid", "mamba"] * 4 + ["hybrid"]}
    two, three = (hf(tmp_path, {**five, "num_mem_blocks": m}, "--ctx", "16")["params"] for m in (2, 3))
    h, i = 256, 64
    assert three - two == 2 * h + h + 3 * (2 * h) ** 2 + 2 * h * h + h * 2 * i + i * h
    no_attn_adapters = hf(tmp_path, {**five, "use_shared_attention_adapter": False}, "--ctx", "16")["params"]
    assert two - no_attn_adapters == 5 * 3 * (2 * h * 8 + 8 * 2 * h)  # q, k, v: 2h -> rank 8 -> 2h per position


def test_zamba2_config_defaults(tmp_path):
    """Zamba2Config: no layers_block_type is the 54-layer pattern (hybrid at 6, 12, .., 42, 47, 51), 4096 positions
    (16384 with use_long_context), n_mamba_heads 8, mamba_d_state 64, intermediate_size 4 x hidden."""
    bare = {"model_type": "zamba2", "hidden_size": 64, "num_attention_heads": 4}
    d = hf(tmp_path, bare, "--ctx", "10")
    assert {g["kind"]: g["layers"] for g in d["groups"]} == {"full": 9, "mamba_state": 54}
    assert d["model_max_ctx"] == 4096
    inner, heads = 2 * 64, 8
    assert d["kv_bytes"] == 10 * 9 * 2 * 4 * 32 * 2 + 54 * ((inner + 2 * 64) * 4 * 2 + heads * (inner // heads) * 64 * 4)
    long = hf(tmp_path, {**bare, "use_long_context": True}, "--ctx", "10")
    assert long["model_max_ctx"] == 16384 and "use_long_context" in long["model_max_ctx_source"]


def test_no_longer_refused_as_a_foreign_mamba_config(tmp_path):
    r = run_cli("size", write_config(tmp_path, "m", Z), "--ctx", "1000", "--engine", "vllm")
    assert r.code == 0, r.err


@pytest.mark.parametrize("change, says", [
    ({"num_key_value_heads": 2}, "num_key_value_heads 2 differs"),
    ({"tie_word_embeddings": False}, "tie_word_embeddings false"),
    ({"use_conv_bias": False}, "use_conv_bias false"),
    ({"num_mem_blocks": 4}, "exceeds the 3 hybrid layers"),
    ({"num_attention_heads": 3, "num_key_value_heads": 3}, "does not divide"),
    ({"n_mamba_heads": 3}, "does not divide"),
    ({"attention_head_dim": 64}, "attention_head_dim 64 differs"),
    ({"mamba_headdim": 32}, "mamba_headdim 32 differs"),
    ({"hybrid_layer_ids": [1, 3]}, "hybrid_layer_ids [1, 3] differs"),
    ({"num_hidden_layers": 8}, "differs from layers_block_type"),
    ({"layers_block_type": ["m", "g", "m", "g", "m", "g", "m"]}, "'m' / 'g'"),
    ({"layers_block_type": None}, "default 54-layer pattern"),
    ({"num_mem_blocks": 0}, "num_mem_blocks"),
])
def test_configs_the_engines_build_differently_are_refused_in_one_line(tmp_path, change, says):
    r = run_cli("size", write_config(tmp_path, "m", {**Z, **change}), "--ctx", "1000")
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err


@pytest.mark.parametrize("engine, says", [
    ("sglang", "no Zamba2ForCausalLM"), ("trtllm", "no Zamba2 model"), ("llamacpp", "no zamba2 architecture"),
])
def test_engines_without_zamba2_refuse_in_one_line(tmp_path, engine, says):
    r = run_cli("size", write_config(tmp_path, "m", Z), "--ctx", "1000", "--engine", engine)
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_vllm_refuses_pipeline_parallelism(tmp_path):
    """models/zamba2.py Zamba2ForCausalLM is not SupportsPP: vLLM refuses --pipeline-parallel-size 2."""
    r = run_cli("size", write_config(tmp_path, "m", Z), "--ctx", "1000", "--engine", "vllm", "--pp", "2")
    assert r.code == 2 and "SupportsPP" in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_vllm_tp_must_divide_the_attention_heads(tmp_path):
    """Zamba2Attention asserts num_attention_heads % tp == 0: tp 8 over 4 heads is refused (no KV replication),
    tp 2 splits K/V and the Mamba-2 state in two."""
    r = run_cli("size", write_config(tmp_path, "m", Z), "--ctx", "1000", "--engine", "vllm", "--tp", "8")
    assert r.code == 2 and "Zamba2Attention" in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert run_cli("size", write_config(tmp_path, "m", Z), "--ctx", "1000", "--engine", "vllm", "--tp", "2").code == 0


def test_vllm_rotary_table_only_with_mem_rope(tmp_path):
    """vLLM's Zamba2Attention calls get_rope only with use_mem_rope, over attention_head_dim (2 x 256 / 4) and
    max_position_embeddings: one [4096, 128] table (the CPU oracle records the same buffer)."""
    from kvplan.architectures import normalize

    assert [(t.rows, t.dim) for t in normalize(Z).rope_tables] == [(4096, 128)]
    assert normalize({**Z, "use_mem_rope": False}).rope_tables == ()
    assert [(t.rows, t.dim) for t in normalize({**Z, "use_long_context": True}).rope_tables] == [(16384, 128)]
