"""Capacity lines of real engine logs: given the KV memory the engine printed (--kv-budget), the log's integers
(tokens, blocks, concurrency) must lie in the interval kvplan computes for the printed precision, e.g.
"Available KV cache memory: 5.01 GiB" means [5.005, 5.015) GiB. No other tolerance.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal

import pytest

from conftest import kvjson, llama_like, write_config
from test_engine_logs import AVAIL, interval, printed

GiB = 1 << 30


def fit_at(budget: int, *args: str) -> dict:
    d = kvjson("fit", *args, "--kv-budget", f"{budget}B")
    return d["results"][0]


def bracket(value: Decimal, unit: int, *args: str) -> tuple[dict, dict]:
    lo, hi = interval(value, unit)
    return fit_at(math.ceil(lo), *args), fit_at(math.ceil(hi) - 1, *args)


def assert_within(lo: dict, hi: dict, key: str, logged) -> None:
    a, b = lo[key], hi[key]
    assert a <= logged <= b, f"{key}: log {logged} not in kvplan's [{a}, {b}]"


VLLM_CASES = [
    # case id, model (None: from config_facts), extra args
    ("vllm-qwen2-7b-a100-80gb-tp1-gmu0.25", None, ["--gpu", "A100-80GB"]),
    ("vllm-qwen2-7b-2xa100-80gb-tp2-gmu0.25", None, ["--gpu", "2xA100-80GB"]),
    ("vllm-gpt-oss-120b-4xa100-80gb-tp4-gmu0.8", "gpt-oss-120b", ["--gpu", "4xA100-80GB"]),
    ("vllm-qwen3-14b-1gpu", None, ["--gpu", "H100"]),
    ("vllm-mistral-small-3.2-24b-h100-block128", None, ["--gpu", "H100", "--block-size", "128"]),
    ("vllm-deepseek-v2-lite-tp2-pp2-4xl4-mla", "deepseek-v2-lite", ["--gpu", "4xL4", "--tp", "2", "--pp", "2"]),
]


@pytest.mark.parametrize("case_id,model,extra", VLLM_CASES)
def test_vllm_capacity_from_printed_budget(engine_logs, tmp_path, case_id, model, extra):
    case = engine_logs[case_id]
    log = case["log"]
    if model is None:
        f = case["config_facts"]
        model = write_config(tmp_path, "m", llama_like(f["num_hidden_layers"], f.get("num_attention_heads", 32),
                                                      f["num_key_value_heads"], f["head_dim"]))
    mml = str(case["max_model_len"])
    args = ["--model", model, "--ctx", mml, "--max-model-len", mml, "--engine", "vllm@0.10.1.1", *extra]
    budgets = re.findall(AVAIL, log)
    value = Decimal(max(budgets, key=Decimal))  # with PP, the stage holding more layers printed the larger budget
    lo, hi = bracket(value, GiB, *args)
    tokens = int(printed(log, r"GPU KV cache size:\**\s*([\d,]+) tokens"))
    assert_within(lo, hi, "kv_capacity_tokens", tokens)
    concurrency = printed(log, r"Maximum concurrency for [\d,]+ tokens per request:\**\s*([\d.]+)x")
    assert_within(lo, hi, "concurrency", float(concurrency))
    blocks = re.search(r"num_gpu_blocks is: (\d+)|\(([\d,]+) blocks x", log)
    if blocks:
        logged = int((blocks.group(1) or blocks.group(2)).replace(",", ""))
        assert_within({"b": lo["engine_details"]["num_gpu_blocks"]}, {"b": hi["engine_details"]["num_gpu_blocks"]}, "b", logged)


def test_vllm_v0_rtx3090_blocks_and_concurrency(engine_logs):
    case = engine_logs["vllm-v0-llama-3.1-8b-rtx3090-len20000"]
    log = case["log"]
    mml = str(case["max_model_len"])
    args = ["--model", "llama-3.1-8b", "--gpu", "RTX3090", "--ctx", mml, "--max-model-len", mml, "--engine", "vllm@0.10"]
    lo, hi = bracket(printed(log, r"kv_cache_size=([\d.]+)GiB"), GiB, *args)
    assert_within({"b": lo["engine_details"]["num_gpu_blocks"]}, {"b": hi["engine_details"]["num_gpu_blocks"]}, "b",
                  int(printed(log, r"GPU blocks: (\d+)")))
    assert_within(lo, hi, "concurrency", float(printed(log, r"per request: ([\d.]+)x")))


def test_trtllm_max_tokens_rounds_up_to_whole_blocks(engine_logs):
    """'Both free_gpu_memory_fraction and max_tokens are set ... The smaller value will be used': 860,308 tokens
    requested become 26,885 blocks x 32 = 860,320."""
    case = engine_logs["trtllm-llama-3.1-8b-fp8-h100-fp8kv"]
    log = case["log"]
    frac, requested = re.search(r"set \(to ([\d.]+) and (\d+), respectively\)", log).groups()
    d = kvjson("fit", "--gpu", "H100", "--model", "llama-3.1-8b", "--engine", "trtllm", "--kv-dtype", "fp8",
               "--weight-dtype", "fp8", "--max-tokens", requested, "--free-gpu-memory-fraction", str(round(float(frac), 2)),
               "--ctx", str(case["max_seq_len"]))["results"][0]
    assert d["kv_capacity_tokens"] == int(printed(log, r"paged KV cache \((\d+)\)"))
    assert d["engine_details"]["tokens_per_block"] == int(printed(log, r"tokens per block: (\d+)"))


def test_sglang_token_pool_from_printed_kv_size(engine_logs):
    """SGLang allocates (#tokens + page) rows: K + V bytes printed ('GB' = GiB) pin the pool size."""
    case = engine_logs["sglang-qwen3-235b-a22b-fp8-4xh100-tp4"]
    log = case["log"]
    k, v = printed(log, r"K size: ([\d.]+) GB"), printed(log, r"V size: ([\d.]+) GB")
    args = ["--model", "qwen3-235b-a22b", "--gpu", "4xH100", "--engine", "sglang", "--ctx", "4096"]
    (klo, khi), (vlo, vhi) = interval(k, GiB), interval(v, GiB)
    # the pool also holds one padding page: budget = K + V - one row of K and V
    cell = kvjson("size", "qwen3-235b-a22b", "--engine", "sglang", "--tp", "4", "--ctx", "1")["engine_details"]["cell_size"]
    lo = fit_at(math.ceil(klo + vlo) - cell, *args)
    hi = fit_at(math.ceil(khi + vhi) - 1 - cell, *args)
    assert_within(lo, hi, "kv_capacity_tokens", int(printed(log, r"#tokens: (\d+)")))
