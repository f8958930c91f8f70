"""DeepSeek-V4-Flash under vLLM 0.23 and 0.22 (Rules.dsv4_uniform_groups), against logs nobody here wrote:

- five vLLM 0.23.0 start-up logs of one series (tests/data/wild-logs.yaml, uv-xiao/pto-cu: 2x H200 NVL, TP 2, fp8,
  gpu_memory_utilization 0.78, max_model_len 4,096 to 262,144): from the printed "Available KV cache memory" (+-0.005
  GiB) kvplan's token count and concurrency bracket the printed ones, and one block count per log gives the log to the
  token;
- a vLLM 0.22 start-up refusal (vllm-project/vllm#44376: LLM(), max_model_len 30,000, "6.66 GiB KV cache is needed
  ... available 5.44 GiB ... estimated maximum model length is 13528").

0.23's arithmetic (v1/core/kv_cache_utils.py): 5 groups as in 0.32 but compressor-state pages padded to 37,440 B;
a block costs 22 x 37,440 + 20 x 1,728 + 21 x 8,640 = 1,039,680 B; the concurrency divides by cdiv(sum_g pages_g x
page sum_g, 1,002,240); window and state layers reserve window - 1 + max_num_batched_tokens (no async doubling).
"""

from __future__ import annotations

import math

import pytest
import yaml

from conftest import DATA, kvjson
from test_engine_logs import interval, printed

GiB = 1 << 30
SERIES = [f"vllm-deepseek-v4-flash-2xh200nvl-tp2-len{n}-fp8kv-gmu0.78-eager{tail}"
          for n, tail in ((4096, "-serve"), (4096, "-offline-llm"), (65536, ""), (131072, ""), (262144, ""))]
# the one block count of each log that gives its token count (all print as the logged GiB)
BLOCKS = dict(zip(SERIES, (33_134, 30_019, 33_134, 33_136, 33_134)))
BYTES_PER_BLOCK_023 = 22 * 37_440 + 20 * 1_728 + 21 * 8_640


@pytest.fixture(scope="module")
def wild() -> dict:
    return {c["id"]: c for c in yaml.safe_load((DATA / "wild-logs.yaml").read_text())}


def _fit(case: dict, budget: int, engine: str = "vllm@0.23") -> dict:
    mml = str(case["max_model_len"])
    args = ["deepseek-v4-flash", "--gpu", "2xH200", "--tp", "2", "--engine", engine, "--kv-dtype", "fp8",
            "--kv-budget", f"{budget}B", "--ctx", mml, "--max-model-len", mml]
    if case["id"].endswith("-offline-llm"):  # LLM() takes 16,384 batched tokens on >= 70 GiB GPUs (serve: 8,192)
        args += ["--max-num-batched-tokens", "16384"]
    return kvjson("fit", *args)["results"][0]


@pytest.mark.parametrize("cid", SERIES)
def test_tokens_and_concurrency_within_the_printed_budget(wild, cid):
    case = wild[cid]
    log = case["log"]
    lo, hi = interval(printed(log, r"Available KV cache memory: ([\d.]+) GiB"), GiB)
    ends = [_fit(case, b) for b in (math.ceil(lo), math.ceil(hi) - 1)]
    tokens = int(printed(log, r"GPU KV cache size: ([\d,]+) tokens"))
    assert ends[0]["kv_capacity_tokens"] <= tokens <= ends[1]["kv_capacity_tokens"], [e["kv_capacity_tokens"] for e in ends]
    assert ends[1]["kv_capacity_tokens"] - ends[0]["kv_capacity_tokens"] < 0.0005 * tokens
    if "Maximum concurrency" in log:
        conc = float(printed(log, r"Maximum concurrency for [\d,]+ tokens per request: ([\d.]+)x"))
        assert ends[0]["concurrency"] <= conc <= ends[1]["concurrency"]
    assert ends[0]["engine_details"]["bytes_per_block"] == BYTES_PER_BLOCK_023
    assert ends[0]["engine_would_start"] is True


@pytest.mark.parametrize("cid", SERIES)
def test_one_block_count_gives_the_log_to_the_token(wild, cid):
    case = wild[cid]
    r = _fit(case, BLOCKS[cid] * BYTES_PER_BLOCK_023)
    assert r["engine_details"]["num_gpu_blocks"] == BLOCKS[cid]
    assert r["kv_capacity_tokens"] == int(printed(case["log"], r"GPU KV cache size: ([\d,]+) tokens"))


def test_concurrency_blocks_are_page_weighted(wild):
    """At 65,536 tokens (serve, 8,192 batched tokens): the pool hands a request 256 latent + 2 x 131 window + 2,051
    + 1,041 state blocks, but 0.23 prints its concurrency over cdiv(256 x 1,002,240 + 131 x 1,609,920 + 2,051 x
    967,680 + 1,041 x 748,800, 1,002,240) = 3,225."""
    d = _fit(wild[SERIES[2]], BLOCKS[SERIES[2]] * BYTES_PER_BLOCK_023)["engine_details"]
    assert d["blocks_per_request"] == 256 + 2 * 131 + 2_051 + 1_041
    assert d["concurrency_blocks_per_request"] == 3_225


def test_vllm_022_refusal(wild):
    """0.22: a block costs 22 x (37,440 + 1,728 + 8,640) = 1,051,776 B, both in the pool and in the start-up
    check; at 30,000 tokens (LLM(): 16,384 batched tokens, block size 256 given) a request needs 6,800 of them."""
    case = wild["vllm-deepseek-v4-flash-2xgh200-tp2-ep-len30000-fp8kv"]
    log = case["log"]
    lo, hi = interval(printed(log, r"larger than the available KV cache memory \(([\d.]+) GiB\)"), GiB)
    args = ["deepseek-v4-flash", "--gpu", "2xGH200-96GB", "--tp", "2", "--engine", "vllm@0.22", "--kv-dtype", "fp8",
            "--block-size", "256", "--max-num-batched-tokens", "16384", "--ctx", "30000", "--max-model-len", "30000"]
    ends = [kvjson("fit", *args, "--kv-budget", f"{b}B")["results"][0] for b in (math.ceil(lo), math.ceil(hi) - 1)]
    suggested = int(printed(log, r"estimated maximum model length is (\d+)"))
    assert all(e["engine_would_start"] is False for e in ends)
    assert ends[0]["suggested_max_model_len"] <= suggested <= ends[1]["suggested_max_model_len"]
    assert ends[0]["engine_details"]["bytes_per_block"] == 22 * (37_440 + 1_728 + 8_640)
    assert ends[0]["engine_details"]["blocks_per_request"] == 6_800
    need = printed(log, r"\(([\d.]+) GiB KV cache is needed")
    assert all(f"one request needs {need} GiB" in e["engine_start_message"] for e in ends)
