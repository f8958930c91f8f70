"""The full budget model (no --kv-budget) against the engine logs that state GPU and weights: the errors the
docs/accuracy.md's engine-log table reports (bench/budget_eval.py --docs writes it from these cases), held here."""

from __future__ import annotations

import re

import pytest

from conftest import kvjson

CASES = [
    # case id, kvplan fit args, error bound (fraction)
    ("vllm-qwen2-7b-a100-80gb-tp1-gmu0.25", ["--gpu", "A100-80GB", "--model", "qwen2.5-7b", "--engine", "vllm@0.10.1.1",
                                             "--gpu-memory-utilization", "0.25", "--ctx", "16384", "--max-model-len", "16384"], 0.01),
    ("vllm-qwen2-7b-2xa100-80gb-tp2-gmu0.25", ["--gpu", "2xA100-80GB", "--model", "qwen2.5-7b", "--engine", "vllm@0.10.1.1",
                                               "--gpu-memory-utilization", "0.25", "--ctx", "16384", "--max-model-len", "16384"], 0.02),
    ("vllm-gpt-oss-120b-4xa100-80gb-tp4-gmu0.8", ["--gpu", "4xA100-80GB", "--model", "gpt-oss-120b", "--engine",
                                                  "vllm@0.10.1.1", "--gpu-memory-utilization", "0.8", "--ctx", "16384",
                                                  "--max-model-len", "16384"], 0.05),
    ("vllm-deepseek-v2-lite-tp2-pp2-4xl4-mla", ["--gpu", "4xL4", "--model", "deepseek-v2-lite", "--tp", "2", "--pp", "2",
                                                "--engine", "vllm@0.9.2", "--ctx", "1024", "--max-model-len", "1024"], 0.03),
    ("sglang-qwen3-235b-a22b-fp8-4xh100-tp4", ["--gpu", "4xH100", "--model", "qwen3-235b-a22b", "--engine", "sglang",
                                               "--mem-fraction-static", "0.93", "--weight-dtype", "fp8"], 0.08),
]


@pytest.mark.parametrize("case_id,args,bound", CASES)
def test_predicted_capacity_error(engine_logs, case_id, args, bound):
    log = engine_logs[case_id]["log"]
    logged = int(re.search(r"GPU KV cache size: ([\d,]+) tokens|#tokens: (\d+)", log).group(1 if "vllm" in case_id else 2)
                 .replace(",", ""))
    predicted = kvjson("fit", *args)["results"][0]["kv_capacity_tokens"]
    assert abs(predicted - logged) / logged <= bound, (predicted, logged)
