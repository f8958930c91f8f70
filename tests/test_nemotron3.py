"""Nemotron-3 (nemotron_h with MoE layers): Nano's 'E' layers in hybrid_override_pattern, Super / Ultra's latent MoE
and Ultra's layers_block_type list (no num_hidden_layers key).

Oracles, none written here: transformers' model code (tests/test_oracle_hf.py: parameters on meta and the cache of a
real forward for both bundled configs) and llama.cpp (tests/oracle_llamacpp.py cases nemotron-h-moe*). vLLM's CPU
build refuses the non-gated MoE (tests/test_engine_vllm.py EXPECTED_REFUSALS). What is left here: the layer
reading both config forms share, and one-line refusals of malformed ones.
"""

from __future__ import annotations

import json

import pytest

from conftest import DATA, kvjson, run_cli, write_config

ROOT = DATA.parent.parent / "model_configs"
NANO, ULTRA = "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16", "nvidia--NVIDIA-Nemotron-3-Ultra-550B-A55B-BF16"


def bundled(dirname: str) -> dict:
    return json.loads((ROOT / dirname / "config.json").read_text())


def groups(d: dict) -> dict[str, int]:
    return {g["kind"]: g["layers"] for g in d["groups"]}


def test_nano_pattern_with_moe_layers():
    d = kvjson("size", "nemotron-3-nano", "--ctx", "8192")
    pattern = bundled(NANO)["hybrid_override_pattern"]
    assert groups(d) == {"mamba_state": pattern.count("M"), "none": pattern.count("E"), "full": pattern.count("*")}
    # 6 attention layers x 2 KV heads x 128 x (K, V) x bf16
    assert d["kv_bytes_per_token"] == 6 * 2 * 128 * 2 * 2


def test_ultra_reads_layers_block_type_and_its_length_is_the_layer_count():
    cfg = bundled(ULTRA)
    assert "num_hidden_layers" not in cfg
    d = kvjson("size", "nemotron-3-ultra", "--ctx", "8192")
    blocks = cfg["layers_block_type"]
    assert groups(d) == {"mamba_state": blocks.count("mamba"), "none": blocks.count("moe"),
                         "full": blocks.count("attention")}
    full = next(g for g in d["groups"] if g["kind"] == "full")
    assert full["layer_ids"] == [i for i, b in enumerate(blocks) if b == "attention"]


def test_the_pattern_string_and_the_list_are_the_same_model(tmp_path):
    """Ultra's list written as the older pattern string (M / E / *) sizes and counts the same."""
    cfg = bundled(ULTRA)
    letters = {"mamba": "M", "moe": "E", "attention": "*", "mlp": "-"}
    as_pattern = dict(cfg, hybrid_override_pattern="".join(letters[b] for b in cfg["layers_block_type"]),
                      num_hidden_layers=len(cfg["layers_block_type"]))
    del as_pattern["layers_block_type"]
    a = kvjson("size", "nemotron-3-ultra", "--ctx", "4096")
    b = kvjson("size", write_config(tmp_path, "p", as_pattern), "--ctx", "4096")
    assert (a["kv_bytes"], a["params"], a["weight_bytes"]) == (b["kv_bytes"], b["params"], b["weight_bytes"])


def test_latent_moe_experts_work_in_the_latent_width(tmp_path):
    """Without moe_latent_size the experts read the hidden width: more expert parameters, no latent projections."""
    cfg = bundled(ULTRA)
    plain = dict(cfg)
    del plain["moe_latent_size"]
    latent = kvjson("size", "nemotron-3-ultra", "--ctx", "1024")["params"]
    full = kvjson("size", write_config(tmp_path, "f", plain), "--ctx", "1024")["params"]
    moe_layers, experts = cfg["layers_block_type"].count("moe"), cfg["n_routed_experts"]
    h, w, inter = cfg["hidden_size"], cfg["moe_latent_size"], cfg["moe_intermediate_size"]
    assert full - latent == moe_layers * (experts * 2 * inter * (h - w) - 2 * h * w)


@pytest.mark.parametrize("edit, says", [
    ({"layers_block_type": ["mamba", "moe", "transformer"]}, "layers_block_type"),
    ({"layers_block_type": "mamba,moe"}, "layers_block_type"),
    ({"layers_block_type": []}, "layers_block_type"),
    ({"n_routed_experts": None}, "n_routed_experts"),
])
def test_malformed_ultra_configs_are_one_line(tmp_path, edit, says):
    cfg = bundled(ULTRA)
    for k, v in edit.items():
        if v is None:
            cfg.pop(k)
        else:
            cfg[k] = v
    r = run_cli("size", write_config(tmp_path, "bad", cfg), "--ctx", "1024")
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_a_pattern_with_an_unknown_letter_is_one_line(tmp_path):
    cfg = bundled(NANO)
    cfg["hybrid_override_pattern"] = cfg["hybrid_override_pattern"][:-1] + "X"
    r = run_cli("size", write_config(tmp_path, "x", cfg), "--ctx", "1024")
    assert r.code == 2 and "hybrid_override_pattern" in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_vllm_keeps_the_ssm_state_in_the_configs_float32():
    """models/config.py NemotronHForCausalLMConfig: mamba_ssm_cache_dtype from the config (float32 here)."""
    d = kvjson("size", "nemotron-3-nano", "--ctx", "1024")
    assert any("SSM/recurrent state in fp32" in a for a in d["assumptions"])
