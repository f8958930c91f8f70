"""vLLM decode context parallel (--decode-context-parallel-size): each request's KV tokens spread over DCP of the TP
ranks, so a GPU holds 1/DCP of them (v1/kv_cache_interface.py AttentionSpec.dcp_sharded, max_num_blocks_per_req;
config/parallel.py and config/model.py for what vLLM refuses).

Oracle, not written here: a matrix of vLLM start-ups of GLM-5.1 on 8x RTX PRO 6000 at DCP 1, 2, 4 and 8
(local-inference-lab/rtx6kpro, tests/data/wild-logs.yaml): from each printed 'Available KV cache memory', kvplan
must give the printed token count and concurrency.
"""

from __future__ import annotations

import math

import pytest
import yaml

from conftest import DATA, kvjson, run_cli
from test_engine_logs import interval, printed

GiB = 1 << 30
GLM_DCP = "vllm-glm-5.1-nvfp4-8xrtxpro6000-tp8-dcp{}-nomtp-len202752"


@pytest.fixture(scope="module")
def wild() -> dict:
    return {c["id"]: c for c in yaml.safe_load((DATA / "wild-logs.yaml").read_text())}


@pytest.mark.parametrize("dcp", [1, 2, 4, 8])
def test_glm51_capacity_at_each_dcp(wild, dcp):
    case = wild[GLM_DCP.format(dcp)]
    assert int(case.get("decode_context_parallel_size", 1)) == dcp
    log, mml = case["log"], str(case["max_model_len"])
    lo, hi = interval(printed(log, r"Available KV cache memory: ([\d.]+) GiB"), GiB)
    args = ["--model", "glm-5", "--gpu", "8xH100", "--tp", "8", "--kv-dtype", "fp8", "--engine", "vllm@0.20.2",
            "--ctx", mml, "--max-model-len", mml, "--decode-context-parallel-size", str(dcp)]
    ends = [kvjson("fit", *args, "--kv-budget", f"{b}B")["results"][0] for b in (math.ceil(lo), math.ceil(hi) - 1)]
    tokens = int(printed(log, r"GPU KV cache size: ([\d,]+) tokens"))
    concurrency = float(printed(log, r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"))
    assert ends[0]["kv_capacity_tokens"] <= tokens <= ends[1]["kv_capacity_tokens"]
    assert ends[0]["concurrency"] <= concurrency <= ends[1]["concurrency"]
    assert ends[0]["engine_details"]["blocks_per_request"] == math.ceil(int(mml) / (64 * dcp))


def test_a_gpu_holds_its_share_of_the_tokens():
    """size: the per-GPU cache of one 64k request under DCP 8 is the DCP 1 cache's blocks divided by 8."""
    base = ["size", "deepseek-v3", "--tp", "8", "--ctx", "65536"]
    one, eight = kvjson(*base), kvjson(*base, "--decode-context-parallel-size", "8")
    block = one["engine_details"]["block_size"]
    assert one["engine_details"]["blocks_per_request"] == math.ceil(65536 / block)
    assert eight["engine_details"]["blocks_per_request"] == math.ceil(65536 / (block * 8))
    assert eight["kv_bytes"] * 8 == one["kv_bytes"]
    assert any("decode context parallel 8" in a for a in eight["assumptions"])


def test_gqa_needs_more_tp_ranks_than_kv_heads():
    """config/model.py: DCP for GQA/MQA needs tp > KV heads and DCP <= tp // KV heads (Llama-3.1-70B: 8 KV heads)."""
    ok = kvjson("size", "llama-3.1-70b", "--tp", "16", "--decode-context-parallel-size", "2", "--ctx", "8192")
    plain = kvjson("size", "llama-3.1-70b", "--tp", "16", "--ctx", "8192")
    assert ok["kv_bytes"] * 2 == plain["kv_bytes"]
    for tp, dcp in (("8", "2"), ("16", "4")):
        r = run_cli("size", "llama-3.1-70b", "--tp", tp, "--decode-context-parallel-size", dcp, "--ctx", "8192")
        assert r.code == 2 and "KV heads" in r.err and len(r.err.strip().splitlines()) == 1, r.err


@pytest.mark.parametrize("args, says", [
    (["deepseek-v3", "--tp", "8", "--decode-context-parallel-size", "3"], "divisible"),
    (["gemma-2-9b", "--tp", "16", "--decode-context-parallel-size", "2"], "not modelled"),
    (["qwen3-next-80b-a3b", "--tp", "8", "--decode-context-parallel-size", "2"], "not modelled"),
    (["deepseek-v3", "--tp", "8", "--decode-context-parallel-size", "8", "--engine", "sglang"], "vllm"),
])
def test_what_is_refused_is_one_line(args, says):
    r = run_cli("size", *args, "--ctx", "4096")
    assert r.code == 2 and says in r.err and len(r.err.strip().splitlines()) == 1, r.err
