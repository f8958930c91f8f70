"""Falcon-H1 (model_type falcon_h1): attention and a Mamba-2 mixer side by side in every layer.

Oracles, none written here: transformers' model code (tests/test_oracle_hf.py: parameters on meta and the cache of a
real forward, two scaled configs) and vLLM 0.32's CPU build (tests/oracle_vllm.py model falcon-h1, three cases). No
genuine config.json is bundled (the Hub is unreachable here). What is left: figures from the engines' formulas, the
FalconH1Config defaults, and one-line refusals.
"""

from __future__ import annotations

import pytest

from conftest import kvjson, run_cli, write_config

# a scaled Falcon-H1 (the same as tests/oracle_vllm.py's)
FH1 = {
    "architectures": ["FalconH1ForCausalLM"], "model_type": "falcon_h1", "vocab_size": 256, "hidden_size": 256,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64,
    "intermediate_size": 512, "mamba_d_ssm": 512, "mamba_n_heads": 8, "mamba_d_head": 64, "mamba_d_state": 64,
    "mamba_n_groups": 1, "mamba_d_conv": 4, "mamba_rms_norm": True, "max_position_embeddings": 16384,
    "torch_dtype": "bfloat16",
}


def test_every_layer_holds_kv_and_a_mamba2_state(tmp_path):
    """transformers LinearAttentionAndFullAttentionLayer per layer: K/V [B, 2, ctx, 64] fp16, conv [B, 512 + 2 x 64,
    4] fp16, SSM [B, 8, 64, 64] fp32."""
    d = kvjson("size", write_config(tmp_path, "m", FH1), "--ctx", "1000", "--engine", "hf", "--kv-dtype", "fp16")
    assert {g["kind"]: g["layers"] for g in d["groups"]} == {"full": 4, "mamba_state": 4}
    assert d["kv_bytes_per_token"] == 4 * 2 * 2 * 64 * 2
    assert d["kv_bytes"] == 1000 * 4 * 2 * 2 * 64 * 2 + 4 * (640 * 4 * 2 + 8 * 64 * 64 * 4)


def test_config_class_defaults(tmp_path):
    """FalconH1Config: mamba_d_ssm 1024 when absent, mamba_expand x hidden_size when null; mamba_d_head 'auto' is
    d_ssm / mamba_n_heads (128 by default), so conv width d_ssm + 2 x 1 x 256 (mamba_d_state default)."""
    base = {k: v for k, v in FH1.items() if not k.startswith("mamba_")}
    absent = kvjson("size", write_config(tmp_path, "a", base), "--ctx", "16", "--engine", "hf", "--kv-dtype", "fp16")
    null = kvjson("size", write_config(tmp_path, "b", {**base, "mamba_d_ssm": None, "mamba_n_heads": 8}),
                  "--ctx", "16", "--engine", "hf", "--kv-dtype", "fp16")
    per_token = 16 * 4 * 2 * 2 * 64 * 2
    assert absent["kv_bytes"] - per_token == 4 * ((1024 + 512) * 4 * 2 + 128 * 8 * 256 * 4)
    assert null["kv_bytes"] - per_token == 4 * ((512 + 512) * 4 * 2 + 8 * 64 * 256 * 4)


@pytest.mark.parametrize("change, says", [
    ({"attention_bias": True}, "attention_bias true"),
    ({"mlp_bias": True}, "mlp_bias true"),
    ({"projectors_bias": True}, "projectors_bias differs"),
    ({"mamba_d_head": 32}, "is not mamba_d_ssm 512"),
])
def test_configs_the_engines_build_differently_are_refused_in_one_line(tmp_path, change, says):
    r = run_cli("size", write_config(tmp_path, "m", {**FH1, **change}), "--ctx", "1000")
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err


@pytest.mark.parametrize("engine", ["trtllm"])
def test_engines_kvplan_has_not_read_refuse_in_one_line(tmp_path, engine):
    r = run_cli("size", write_config(tmp_path, "m", FH1), "--ctx", "1000", "--engine", engine)
    assert r.code == 2 and "Falcon-H1" in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_sglang_pools_attention_and_state_on_every_layer(tmp_path):
    """SGLang 0.5.10 configs/falcon_h1.py: full_attention_layer_ids and linear_layer_ids are both every layer, so the
    KV pool holds 4 layers of K/V and MambaPool 4 layers of (conv, temporal) per request."""
    d = kvjson("size", write_config(tmp_path, "m", FH1), "--ctx", "1000", "--engine", "sglang")
    assert {g["kind"]: g["layers"] for g in d["groups"]} == {"full": 4, "mamba_state": 4}


def test_tp_replicates_the_groups_it_does_not_divide(tmp_path):
    """SGLang Mamba2StateShape.create (as vLLM's mamba2_state_shape): 1 group at tp 2 becomes 2
    (extra_groups_for_head_shards = tp - n_groups), so the conv window is (512 + 2 x 2 x 64) / 2 = 384 channels x
    (4 - 1), not (512 + 2 x 64) / 2 = 320; the temporal state (8 / 2, 64, 64)."""
    d = kvjson("size", write_config(tmp_path, "m", FH1), "--ctx", "1000", "--engine", "sglang", "--tp", "2")
    state = [g for g in d["groups"] if g["kind"] == "mamba_state"][0]
    shapes = {t["name"]: t["shape"] for t in state["tensors"]}
    assert shapes["conv_state"][1:] == [3, 384] and shapes["ssm_state"][1:] == [4, 64, 64], shapes
