"""vLLM 0.33 against 0.32, from the two wheels' sources (the CPU build that serves as the oracle is 0.32): what a
0.33 launch refuses that 0.32 ran. The Gated DeltaNet checkpoint page is in tests/test_qwen3_5.py."""

from __future__ import annotations

import pytest

from conftest import kvjson, run_cli


@pytest.mark.parametrize("flag", ["fp16", "float16"])
def test_0_33_refuses_a_float_cache_dtype_other_than_the_models(flag):
    """config/vllm.py _reject_mismatched_float_kv_cache (0.33): Llama-3.1-8B is bf16, so --kv-cache-dtype float16
    stops the start-up; 0.32 has no such check and stores the cache in fp16."""
    r = run_cli("size", "llama-3.1-8b", "--ctx", "4096", "--engine", "vllm@0.33", "--kv-dtype", flag)
    assert r.code == 2 and len(r.err.strip().splitlines()) == 1
    assert "_reject_mismatched_float_kv_cache" in r.err and "bf16" in r.err
    older = kvjson("size", "llama-3.1-8b", "--ctx", "4096", "--engine", "vllm@0.32", "--kv-dtype", flag)
    assert older["kv_dtype"] == "fp16" and older["kv_bytes"] == 4096 * 32 * 2 * 8 * 128 * 2


@pytest.mark.parametrize("args", [("--kv-dtype", "bf16"), ("--kv-dtype", "auto"), ("--kv-dtype", "fp8")])
def test_0_33_takes_the_models_dtype_auto_and_fp8(args):
    d = kvjson("size", "llama-3.1-8b", "--ctx", "4096", "--engine", "vllm@0.33", *args)
    assert d["kv_bytes"] == 4096 * 32 * 2 * 8 * 128 * (1 if args[1] == "fp8" else 2)
