"""TensorRT-LLM versions. 1.0 and 1.2 (the newest release, the default) run every model on the V1 manager with the
same KvCacheConfig defaults; a model is sized only for a release that can load it (DeepSeek-V3.2, MiniMax-M2,
Qwen3-Next, Qwen3-VL came out after 1.0 or during its release candidates; Qwen3.5, GLM-5 and Kimi Linear after 1.2). From the 1.3
pre-releases after 1.3.0rc22 (July 2026) the manager is chosen per model (KVCacheManagerV2 for most families), which
kvplan has not laid out, so those versions are refused in one line that names the V1 way out; earlier 1.3 candidates
run V1 for every model and size like 1.2."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from conftest import kvjson, run_cli

REGISTRY = yaml.safe_load((Path(__file__).parent / "data/trtllm-architectures.yaml").read_text())


@pytest.mark.parametrize("version, rules", [(None, "1.2"), ("1.2", "1.2"), ("1.2.1", "1.2"), ("1.1", "1.0"),
                                            ("1.0", "1.0")])
def test_v1_releases_share_the_32_token_blocks(version, rules):
    engine = "trtllm" + (f"@{version}" if version else "")
    d = kvjson("size", "llama-3.1-8b", "--ctx", "4090", "--engine", engine)
    assert d["engine"] == f"trtllm@{rules}"
    # 4090 tokens = 128 blocks of 32 x 8 KV heads x 128 x 2 (K, V) x 2 B x 32 layers
    assert d["kv_bytes"] == 128 * 32 * 8 * 128 * 2 * 2 * 32


@pytest.mark.parametrize("version", ["1.3", "1.3.0rc23", "1.3.0rc27", "1.4", "1.4.0rc1", "2.0"])
@pytest.mark.parametrize("command", [("size", "llama-3.1-8b", "--ctx", "4096"),
                                     ("fit", "gpt-oss-20b", "--gpu", "H100", "--ctx", "8192")])
def test_per_model_manager_versions_are_refused_in_one_line(command, version):
    r = run_cli(*command, "--engine", f"trtllm@{version}")
    assert r.code == 2 and "KVCacheManagerV2" in r.err and "trtllm@1.2" in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1, r.err


def test_a_patch_release_of_a_rule_set_is_that_rule_set():
    d = kvjson("size", "llama-3.1-8b", "--ctx", "4096", "--engine", "trtllm@1.0.0")
    assert d["engine"] == "trtllm@1.0" and not any("newer than" in a for a in d["assumptions"])


@pytest.mark.parametrize("model, sized_from, refused_for", [
    ("gpt-oss-20b", "1.0", []),  # NVIDIA's quick-start recipe ran GPT-OSS on 1.0.0rc6, though 1.1's notes "add" it
    ("qwen3-next-80b-a3b", "1.1", ["1.0"]),
    ("qwen3-vl-8b", "1.1", ["1.0", "0.10"]),
    ("deepseek-v3.2", "1.1", ["1.0"]),
    ("minimax-m2.5", "1.1", ["1.0"]),
    ("qwen3.5-27b", "1.3.0rc8", ["1.3.0rc7", "1.2", "1.0"]),
    ("glm-5", "1.3.0rc8", ["1.3.0rc7", "1.2"]),
    ("nemotron-3-nano", "1.1", ["1.0"]),  # NemotronH with MoE layers: PR #9261, opened 2025-11-18
    ("nemotron-h-56b", "1.0", []),  # the same architecture without MoE layers ran before
])
def test_a_model_is_sized_only_for_releases_that_load_it(model, sized_from, refused_for):
    for version in refused_for:
        r = run_cli("size", model, "--ctx", "4096", "--engine", f"trtllm@{version}")
        assert r.code == 2 and f"TensorRT-LLM {version} has no " in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert kvjson("size", model, "--ctx", "4096", "--engine", f"trtllm@{sized_from}")["kv_bytes"] > 0
    default = run_cli("size", model, "--ctx", "4096", "--engine", "trtllm")
    assert default.code == (0 if "rc" not in sized_from else 2), default.err


@pytest.mark.parametrize("version", ["1.3.0rc0", "1.3.0rc7", "1.3.0rc22", "1.3.0rc5.post2"])
def test_pre_releases_before_per_model_v2_defaults_run_v1(version):
    """Up to 1.3.0rc22 (2026-07-22) only DeepSeek-V4 opted in to KVCacheManagerV2 (PR #15823); GPT-OSS's opt-in
    (#16942) was opened on 2026-07-28. Those pre-releases size like 1.2, and say so."""
    d = kvjson("size", "gpt-oss-20b", "--ctx", "4096", "--engine", f"trtllm@{version}")
    assert d["engine"] == "trtllm@1.2"
    assert any(a.startswith(f"trtllm@{version}: a pre-release up to 1.3.0rc22") for a in d["assumptions"])


def test_kimi_linear_arrives_after_the_v1_pre_releases():
    kimi = Path(__file__).parent / "data/wild-configs/moonshotai--Kimi-Linear-48B-A3B-Instruct"
    r = run_cli("size", str(kimi), "--ctx", "4096", "--engine", "trtllm@1.3.0rc22")
    assert r.code == 2 and "after 1.3.0rc22" in r.err and "not modelled" in r.err, r.err


def test_a_version_tensorrt_llm_never_had_is_bad_input():
    r = run_cli("size", "llama-3.1-8b", "--engine", "trtllm@one")
    assert r.code == 2 and "not a TensorRT-LLM version" in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_every_gated_architecture_is_one_tensorrt_llm_lists():
    """The gates name real TensorRT-LLM architectures (its PyTorch registry on main), so a typo cannot leave a model
    ungated."""
    from kvplan.engines import trtllm

    assert set(trtllm.FIRST_RELEASE) <= set(REGISTRY["pytorch"])
