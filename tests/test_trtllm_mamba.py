"""TensorRT-LLM's Mamba hybrids on the V1 KV cache manager (kvplan/engines/trtllm.py StateBuffers): the conv and SSM
buffers are allocated for max_batch_size slots before the KV pool is sized (_torch/pyexecutor/mamba_cache_manager.py
MambaCacheManager.__init__, called first by MambaHybridCacheManager), so KvCacheCreator's profile counts them as used
memory, before free_gpu_memory_fraction; the pool's tokens are attention-only (get_num_attention_layers, PR #5371) and
a request is charged no state. Read in the source only (no TensorRT-LLM here, no such log found): the figures below
are written out from the bundled Nemotron-3-Nano config.
"""

from __future__ import annotations

import json
import math

import pytest

from conftest import ROOT, kvjson, run_cli

CONFIG = json.loads((ROOT / "model_configs" / "nvidia--NVIDIA-Nemotron-3-Nano-30B-A3B-BF16" / "config.json").read_text())


def slot_bytes(tp: int = 1, dtype_bytes: int = 2) -> int:
    """One slot of every Mamba-2 layer: conv (d_inner + 2 x groups x d_state) / tp x (kernel - 1) and SSM
    heads / tp x head_dim x d_state, both in the model dtype (mamba_ssm_cache_dtype 'auto')."""
    c = CONFIG
    conv = (c["mamba_num_heads"] * c["mamba_head_dim"] + 2 * c["n_groups"] * c["ssm_state_size"]) // tp
    ssm = c["mamba_num_heads"] // tp * c["mamba_head_dim"] * c["ssm_state_size"]
    layers = c["hybrid_override_pattern"].count("M")
    return layers * (conv * (c["conv_kernel"] - 1) + ssm) * dtype_bytes


def attention_bytes_per_token(tp: int = 1) -> int:
    c = CONFIG
    return 2 * c["hybrid_override_pattern"].count("*") * max(1, c["num_key_value_heads"] // tp) * c["head_dim"] * 2


def fit(*extra: str) -> dict:
    return kvjson("fit", "nemotron-3-nano", "--gpu", "H200", "--engine", "trtllm@1.2", "--ctx", "8192",
                  *extra)["results"][0]


def test_state_slots_come_off_the_free_memory_before_the_fraction():
    a, b = fit("--max-batch-size", "64"), fit("--max-batch-size", "128")
    assert slot_bytes() == 24_965_120
    assert abs((a["kv_budget_bytes"] - b["kv_budget_bytes"]) - 0.9 * 64 * slot_bytes()) <= 1
    parts = {p["what"]: p["bytes"] for p in a["budget"][0]["parts"]}
    assert parts["Mamba state buffers: 64 slots (max_batch_size) x 24,965,120 B"] == -64 * slot_bytes()


@pytest.mark.parametrize("budget", [10 << 30, 33_333_333_333])
def test_tokens_are_attention_only_and_requests_pay_no_state(budget):
    r = fit("--kv-budget", f"{budget}B")
    tokens = math.ceil(budget // attention_bytes_per_token() / 32) * 32  # blocks rounded up (trtllm rules)
    assert r["kv_capacity_tokens"] == tokens
    assert r["max_batch"] == min(tokens // 32 // (8192 // 32), 2048)


def test_pre_releases_with_the_state_in_the_pool_are_refused():
    ok = run_cli("fit", "nemotron-3-nano", "--gpu", "H200", "--engine", "trtllm@1.3.0rc12")
    assert ok.code == 0, ok.err
    for version in ("1.3.0rc13", "1.3.0rc22"):
        r = run_cli("fit", "nemotron-3-nano", "--gpu", "H200", "--engine", f"trtllm@{version}")
        assert r.code == 2 and len(r.err.strip().splitlines()) == 1 and "#12185" in r.err, r.err
