"""TensorRT-LLM versions: 1.1 / 1.2 run every model on the V1 manager (sized with the 1.0 rules, said in a note);
from the 1.3 pre-releases the manager is chosen per model (KVCacheManagerV2 for most families), which kvplan has not
laid out, so those versions are refused in one line that names the V1 way out."""

from __future__ import annotations

import pytest

from conftest import kvjson, run_cli


@pytest.mark.parametrize("version", ["1.1", "1.2", "1.2.1"])
def test_v1_releases_after_1_0_use_its_rules_and_say_so(version):
    d = kvjson("size", "llama-3.1-8b", "--ctx", "4096", "--engine", f"trtllm@{version}")
    assert d["engine"] == "trtllm@1.0"
    assert any(a.startswith(f"trtllm@{version}: the V1 manager") for a in d["assumptions"]), d["assumptions"]
    # 32 tokens per block: 4096 tokens = 128 blocks of 32 x 8 KV heads x 128 x 2 (K, V) x 2 B x 32 layers
    assert d["kv_bytes"] == 128 * 32 * 8 * 128 * 2 * 2 * 32


@pytest.mark.parametrize("version", ["1.3", "1.3.0rc27", "1.4", "1.4.0rc1", "2.0"])
@pytest.mark.parametrize("command", [("size", "llama-3.1-8b", "--ctx", "4096"),
                                     ("fit", "gpt-oss-20b", "--gpu", "H100", "--ctx", "8192")])
def test_per_model_manager_versions_are_refused_in_one_line(command, version):
    r = run_cli(*command, "--engine", f"trtllm@{version}")
    assert r.code == 2 and "KVCacheManagerV2" in r.err and "trtllm@1.2" in r.err, r.err
    assert len(r.err.strip().splitlines()) == 1, r.err


def test_a_patch_release_of_the_newest_rule_set_is_that_rule_set():
    d = kvjson("size", "llama-3.1-8b", "--ctx", "4096", "--engine", "trtllm@1.0.0")
    assert d["engine"] == "trtllm@1.0" and not any("newer than" in a for a in d["assumptions"])
