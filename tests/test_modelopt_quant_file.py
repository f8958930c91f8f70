"""ModelOpt exports up to 0.29 keep their quantization in hf_quant_config.json beside a config.json that has none.

vLLM (0.32 transformers_utils/config.py get_config: "ModelOpt 0.29.0 and before saves the quantization config in a
separate hf_quant_config.json") and SGLang (0.5.23 ModelConfig._parse_quant_hf_config) read that file when
config.json has no quantization_config, locally and from the Hub. kvplan does the same; before, such an export was
counted as a 16-bit checkpoint with a 16-bit cache and no warning.

The two exports are genuine NVIDIA files (tests/data/aic-configs/SOURCES.md: aiconfigurator-core 0.12.0's
model_configs, config.json and hf_quant_config.json of each repo, unchanged).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import hubserver
from conftest import run_cli
from hubserver import FakeHub

from kvplan import hub

fake_hub = hubserver.fake_hub
EXPORTS = Path(__file__).with_name("data") / "aic-configs" / "modelopt"
LLAMA_FP8 = EXPORTS / "nvidia--Llama-3.1-70B-Instruct-FP8"
NEMOTRON_NVFP4 = EXPORTS / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-NVFP4"
QWEN3_FP8 = Path(__file__).with_name("data") / "aic-configs" / "Qwen--Qwen3-32B-FP8-Static-PerTensor_config.json"


def size_json(*args: str) -> dict:
    r = run_cli("size", *args, "--ctx", "8k", "--json")
    assert r.code == 0, r.err
    return r.json()


def llama_70b_fp8_weight_bytes() -> int:
    """Written out from the config: every linear fp8 with an fp32 weight_scale and input_scale (quant_algo FP8,
    static W8A8), the fp8 cache's k_scale + v_scale per layer, embeddings / norms / lm_head (excluded) bf16."""
    layers, hidden, heads, kv, hd, inter, vocab = 80, 8192, 64, 8, 128, 28672, 128256
    linear = [hidden * heads * hd, hidden * kv * hd, hidden * kv * hd, heads * hd * hidden] + [hidden * inter] * 3
    per_layer = sum(linear) + 8 * len(linear) + 8 + 2 * (2 * hidden)
    return layers * per_layer + 2 * (2 * vocab * hidden) + 2 * hidden


def test_an_fp8_export_directory_reads_its_hf_quant_config():
    for ref in (str(LLAMA_FP8), str(LLAMA_FP8 / "config.json")):
        out = size_json(ref)
        assert out["weight_dtype"] == "fp8" and out["weight_bytes"] == llama_70b_fp8_weight_bytes()
        assert out["kv_dtype"] == "fp8_e4m3" and out["kv_dtype_source"] == "quantization_config"
        assert out["kv_bytes"] == 8192 * 2 * 80 * 8 * 128 * 1
        assert any("hf_quant_config.json" in a for a in out["assumptions"]), out["assumptions"]
        assert not out["warnings"]


def test_without_the_file_the_same_config_is_a_bf16_checkpoint(tmp_path: Path):
    shutil.copy(LLAMA_FP8 / "config.json", tmp_path / "config.json")
    out = size_json(str(tmp_path))
    assert out["weight_dtype"] == "bf16" and out["kv_dtype"] == "bf16"
    assert out["weight_bytes"] > 1.9 * llama_70b_fp8_weight_bytes()


def test_a_config_under_another_name_stands_alone(tmp_path: Path):
    """vLLM looks beside a model directory's config.json; a lone file named otherwise is no model directory."""
    shutil.copy(LLAMA_FP8 / "config.json", tmp_path / "llama_config.json")
    shutil.copy(LLAMA_FP8 / "hf_quant_config.json", tmp_path / "hf_quant_config.json")
    assert size_json(str(tmp_path / "llama_config.json"))["weight_dtype"] == "bf16"


def test_config_json_quantization_wins_over_the_file(tmp_path: Path):
    """Both engines read the file only when config.json has no quantization_config (ModelOpt 0.31+ writes it)."""
    shutil.copy(QWEN3_FP8, tmp_path / "config.json")
    (tmp_path / "hf_quant_config.json").write_text(json.dumps({"quantization": {"quant_algo": "NVFP4", "group_size": 16}}))
    out = size_json(str(tmp_path))
    assert out["weight_dtype"] == "fp8" and not any("hf_quant_config.json" in a for a in out["assumptions"])


def test_an_nvfp4_export_keeps_its_excluded_modules_16_bit():
    """Nemotron-3-Nano's NVFP4 export excludes lm_head, the six attention layers, five Mamba layers' projections
    and every conv1d: NVFP4 for the rest, an fp8 cache, no 'counted unquantized' warning."""
    out = size_json(str(NEMOTRON_NVFP4))
    bf16 = size_json(str(NEMOTRON_NVFP4), "--weight-dtype", "bf16")
    assert out["weight_dtype"] == "nvfp4" and out["kv_dtype"] == "fp8_e4m3" and not out["warnings"]
    assert bf16["weight_bytes"] / 3.4 < out["weight_bytes"] < bf16["weight_bytes"] / 3


def test_a_malformed_quant_file_is_one_line(tmp_path: Path):
    shutil.copy(LLAMA_FP8 / "config.json", tmp_path / "config.json")
    for text in ("[1, 2]", "{not json", json.dumps({"quantization": "FP8"}),
                 json.dumps({"quantization": {"quant_algo": "FP8", "exclude_modules": "lm_head"}})):
        (tmp_path / "hf_quant_config.json").write_text(text)
        r = run_cli("size", str(tmp_path), "--json")
        assert r.code == 2 and r.err.count("\n") == 1 and "hf_quant_config.json" in r.err, r.err


def _export_repo(fake: FakeHub) -> str:
    return fake.add_repo("nvidia/llama-fp8", {name: (LLAMA_FP8 / name).read_bytes()
                                              for name in ("config.json", "hf_quant_config.json")})


def test_the_hub_file_is_fetched_with_the_config_and_cached(fake_hub: FakeHub):
    commit = _export_repo(fake_hub)
    got = hub.fetch_config("nvidia/llama-fp8", endpoint=fake_hub.url)
    assert got.config["quantization_config"]["quant_algo"] == "FP8" and not got.ref.notes
    assert len(fake_hub.requests_for(f"/{commit}/hf_quant_config.json")) >= 1
    before = len(fake_hub.log)
    offline = hub.fetch_config("nvidia/llama-fp8", offline=True, endpoint=fake_hub.url)
    assert offline.config == got.config and offline.ref.source == "cache" and not offline.ref.notes
    assert len(fake_hub.log) == before
    r = run_cli("size", "nvidia/llama-fp8", "--offline", "--ctx", "8k", "--json")
    assert r.code == 0 and r.json()["weight_bytes"] == llama_70b_fp8_weight_bytes()


def test_a_hub_failure_on_the_file_is_said_not_hidden(fake_hub: FakeHub):
    _export_repo(fake_hub)
    fake_hub.fault_match, fake_hub.fail_status = "hf_quant_config.json", 500
    got = hub.fetch_config("nvidia/llama-fp8", endpoint=fake_hub.url, timeout=5)
    assert "quantization_config" not in got.config
    assert len(got.ref.notes) == 1 and "hf_quant_config.json not checked" in got.ref.notes[0]
    assert "HTTP 500" in got.ref.notes[0]


def test_a_cache_that_never_asked_says_so_offline(fake_hub: FakeHub):
    """A cache holding config.json alone (fetched by another tool) cannot tell offline whether the file exists."""
    commit = _export_repo(fake_hub)
    from huggingface_hub import hf_hub_download

    hf_hub_download("nvidia/llama-fp8", "config.json", cache_dir=hub.hub_cache_dir(), endpoint=fake_hub.url)
    got = hub.fetch_config("nvidia/llama-fp8", offline=True, endpoint=fake_hub.url)
    assert got.ref.commit == commit and "quantization_config" not in got.config
    assert len(got.ref.notes) == 1 and "does not say whether" in got.ref.notes[0]
    online = hub.fetch_config("nvidia/llama-fp8", endpoint=fake_hub.url)  # cached config, the file asked for
    assert online.ref.source == "cache" and online.config["quantization_config"]["quant_algo"] == "FP8"
