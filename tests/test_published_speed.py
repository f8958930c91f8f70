"""The decode-speed bound of `kvplan plan` against published measurements (tests/data/published-decode.yaml: each
case with its source, the quoted row, model, GPU, engine, concurrency and lengths). A step cannot read its bytes
faster than the GPU's bandwidth, so every measurement must come out at or below the bound; the ratio
measured / bound is what docs/plan.md prints. Weights and cache are kvplan's own figures for the bundled config of the
same architecture, except for GGUF Q4_K_M files, whose size the source states.

    python tests/test_published_speed.py     # the table of ratios
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kvplan import gpus, serving  # noqa: E402
from kvplan.sizing import EngineOptions, ModelOptions, setup as make_setup  # noqa: E402
from kvplan.planner import gpu_context  # noqa: E402

CASES = yaml.safe_load((Path(__file__).with_name("data") / "published-decode.yaml").read_text())["cases"]
SCORED = [c for c in CASES if not c["kvplan"].get("skip")]


def measured_per_user(case: dict) -> float:
    """Output tokens per second of ONE request, from whatever the source states."""
    m, c = case["measured"], case["concurrency"]
    if "per_user_tokens_per_s" in m:
        return m["per_user_tokens_per_s"]
    if "tpot_ms" in m or "itl_ms" in m:
        return 1000.0 / m.get("tpot_ms", m.get("itl_ms"))
    if "output_tokens_per_s_per_gpu" in m:
        return m["output_tokens_per_s_per_gpu"] * case["tp"] / c
    if "output_tokens_per_s_total" in m:
        return m["output_tokens_per_s_total"] / c
    if "e2e_latency_ms" in m:  # the whole batch: prefill and every output token
        return case["output_tokens"] / (m["e2e_latency_ms"] / 1000.0)
    raise AssertionError(f"{case['id']}: no measurement kvplan reads")


def bound(case: dict) -> serving.SpeedRow:
    k = case["kvplan"]
    sel = gpus.resolve_gpu(f"{case['tp']}x{case['gpu']}" if case["tp"] > 1 else case["gpu"])
    eo = EngineOptions(k.get("engine", "vllm"), k.get("kv_dtype"), None, None, None, k.get("weight_dtype"),
                       case["tp"], 1, {})
    s = make_setup(ModelOptions(k["model"]), eo, gpu=gpu_context(sel))
    context = case["input_tokens"] + case["output_tokens"] // 2  # the mean context while decoding
    bw = round(sel.gpu.bandwidth_gbps * 1e9)
    return serving.decode_bound(s, case["concurrency"], context, bw, weight_bytes=k.get("weight_bytes_stated"))


def ratio(case: dict) -> float:
    return measured_per_user(case) * bound(case).step_seconds


@pytest.mark.parametrize("case", SCORED, ids=[c["id"] for c in SCORED])
def test_published_decode_speed_is_within_the_bandwidth_bound(case):
    r = ratio(case)
    assert 0 < r <= 1.0, f"{case['id']}: measured {measured_per_user(case):.2f} tok/s per request is {r:.3f} x the bound"


def test_batch_one_weight_bound_cases_are_tight():
    """At batch 1 the weights dominate what a step reads; llama.cpp reaches most of the bandwidth there, so a bound
    far above the measurements would be a wrong byte count, not slack."""
    tg = [c for c in SCORED if c["concurrency"] == 1 and c["input_tokens"] == 0]
    assert len(tg) >= 4
    for c in tg:
        assert ratio(c) > 0.5, c["id"]


def table() -> list[str]:
    rows = ["| case | measured tok/s per request | bound | ratio |", "|---|---:|---:|---:|"]
    for c in CASES:
        if c["kvplan"].get("skip"):
            rows.append(f"| [{c['id']}]({c['source']}) | {measured_per_user(c):,.2f} | — | not scored: {c['kvplan']['skip']} |")
            continue
        b = bound(c)
        rows.append(f"| [{c['id']}]({c['source']}) | {measured_per_user(c):,.2f} | {1 / b.step_seconds:,.2f} | "
                    f"{ratio(c):.2f} |")
    return rows


if __name__ == "__main__":
    print("\n".join(table()))
