"""SmolLM3 (model_type smollm3): llama's GQA decoder with NoPE on every fourth layer (no_rope_layers).

Oracles, none written here: transformers' model code (tests/test_oracle_hf.py: parameters on meta and the cache of a
real forward, three scaled configs) and vLLM 0.32's CPU build, which runs SmolLM3 through its Transformers backend
(tests/oracle_vllm.py models smollm3 and smollm3-swa). The genuine config.json of HuggingFaceTB/SmolLM3-3B is
tests/data/wild-configs/HuggingFaceTB--SmolLM3-3B (provenance in SOURCES.yaml). What is left here: the layer pattern,
figures from the formulas written out, and one-line refusals.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import kvjson, run_cli, write_config

GENUINE = Path(__file__).parent / "data" / "wild-configs" / "HuggingFaceTB--SmolLM3-3B" / "config.json"
CONFIG = json.loads(GENUINE.read_text())


def test_genuine_config_params_and_kv_per_token(tmp_path):
    per_layer = (2048 * 2048 * 2 + 2048 * 512 * 2  # q, o (16 heads x 128); k, v (4 KV heads x 128)
                 + 3 * 2048 * 11008 + 2 * 2048)  # gate, up, down; input and post-attention RMSNorm
    params = 128256 * 2048 + 36 * per_layer + 2048  # tied embedding, 36 layers, final norm
    assert params == 3_075_098_624
    d = kvjson("size", str(GENUINE), "--ctx", "65536", "--engine", "hf", "--kv-dtype", "bf16")
    assert d["family"] == "smollm3" and d["warnings"] == []
    assert d["params"] == params
    assert d["kv_bytes_per_token"] == 36 * 2 * 4 * 128 * 2
    assert d["kv_bytes"] == 65536 * 36 * 2 * 4 * 128 * 2


def test_use_sliding_window_slides_the_nope_layers(tmp_path):
    """SmolLM3Config.__post_init__: without layer_types, a layer slides iff use_sliding_window, sliding_window and
    no_rope_layers[i] == 0 (layers 3, 7, ..., 35 in the 3B file)."""
    cfg = {**{k: v for k, v in CONFIG.items() if k != "layer_types"}, "use_sliding_window": True, "sliding_window": 4096}
    d = kvjson("size", write_config(tmp_path, "m", cfg), "--ctx", "8192", "--engine", "hf", "--kv-dtype", "bf16")
    groups = {g["kind"]: g["layer_ids"] for g in d["groups"]}
    assert groups["sliding"] == list(range(3, 36, 4))
    off = kvjson("size", write_config(tmp_path, "off", {**cfg, "use_sliding_window": False}), "--ctx", "8192",
                 "--engine", "hf")
    assert [g["kind"] for g in off["groups"]] == ["full"]


def test_vllm_and_sglang_build_no_rotary_table():
    """vLLM 0.32 (registry.py: SmolLM3ForCausalLM -> TransformersForCausalLM) and SGLang 0.5.10 (no native class)
    run transformers' module, whose rotary embedding keeps inv_freq only."""
    from kvplan.architectures import normalize

    assert normalize(CONFIG).rope_tables == ()


def test_llamacpp_sizes_every_layer_full(tmp_path):
    d = kvjson("size", str(GENUINE), "--ctx", "8192", "--engine", "llamacpp", "--kv-dtype", "fp16")
    assert [(g["kind"], g["layers"], g["tokens"]) for g in d["groups"]] == [("full", 36, 8192)]


@pytest.mark.parametrize("engine, change, says", [
    ("trtllm", {}, "TensorRT-LLM has no SmolLM3 model"),
    ("sglang@0.4", {}, "not modelled"),
    ("llamacpp", {"layer_types": None, "use_sliding_window": True, "sliding_window": 4096}, "no sliding window"),
])
def test_engines_that_cannot_run_it_as_configured_refuse_in_one_line(tmp_path, engine, change, says):
    cfg = {k: v for k, v in {**CONFIG, **change}.items() if v is not None}
    r = run_cli("size", write_config(tmp_path, "m", cfg), "--ctx", "1000", "--engine", engine)
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err


@pytest.mark.parametrize("change, says", [
    ({"layer_types": None, "no_rope_layers": [1, 0]}, "no_rope_layers must list one flag per layer (36)"),
    ({"layer_types": None, "no_rope_layers": None, "no_rope_layer_interval": 0}, "no_rope_layer_interval"),
])
def test_bad_nope_fields_are_refused_in_one_line(tmp_path, change, says):
    cfg = {k: v for k, v in {**CONFIG, **change, "use_sliding_window": True, "sliding_window": 64}.items()
           if v is not None}
    r = run_cli("size", write_config(tmp_path, "m", cfg), "--ctx", "1000")
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err
