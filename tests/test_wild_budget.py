"""The budget model (`fit` with no --kv-budget) against public start-up logs nobody here wrote
(tests/data/wild-logs.yaml), split once into a calibration part and a held-out part (tests/data/wild-split.yaml,
drawn by a hash of source and model before any constant was fitted). The only constant fitted on them
(overhead.VLLM_TP_NON_TORCH_BYTES) used the calibration part; this test holds the held-out part to issue 13's
target and pins every case to the error docs/accuracy.md reports, so neither can drift from the code.

The arguments of each case come from the log entry (bench/budget_eval.py build_args: GPU, tp/pp, engine@version,
gpu_memory_utilization, max_model_len, dtypes and knobs it states) and the logged KV tokens are read from the log
text by regex.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import budget_eval  # noqa: E402

from conftest import run_cli  # noqa: E402

ENTRIES = {e["id"]: e for e in yaml.safe_load(budget_eval.LOGS.read_text())}
SPLIT = yaml.safe_load(budget_eval.SPLIT.read_text())

# Held-out cases beyond 3%, with what their logs show (docs/accuracy.md, "From the GPU alone").
KNOWN_MISSES = {
    "vllm-minimax-m2.5-fp8-4xrtxpro6000-tp4-default": (0.12, "vLLM version not stated (newest rules); 8.10 GiB of "
                                                             "non-KV memory on 4 PCIe Blackwell GPUs against 5.50 "
                                                             "estimated, not itemised in the log"),
    "vllm-qwen2-7b-2xa100-40gb-tp2-gmu0.5-two-nodes-ray": (0.07, "two nodes over Ray: 0.7 GiB more non-KV memory"),
    # added in stop 26 (scored blind, before any change they could inform)
    "vllm-qwen3-8b-a100-sxm4-40gb-tp1-defaults-v0.9.2": (0.06, "1.0 GiB more non-KV memory than estimated, not "
                                                               "itemised (FlashInfer absent: PyTorch's sampler)"),
    "vllm-qwen3-8b-rtxa5000-tp1-len16384-gmu0.9764-lmcache": (0.05, "an LMCache connector attached; vLLM's CUDA-graph "
                                                                    "estimate 0.52 GiB against 0.36"),
    # vLLM 0.23 DeepSeek-V4 (scored since Rules.dsv4_uniform_groups; its four serve logs are -2.4%)
    "vllm-deepseek-v4-flash-2xh200nvl-tp2-len4096-fp8kv-gmu0.78-eager-offline-llm": (
        0.08, "offline LLM(): 29.07 GiB of KV where the serve runs of the same series print 32.08 (DeepGEMM/TileLang "
              "warm-up inside init; not itemised in the excerpt)"),
    "vllm-qwen3-30b-a3b-4xa10-tp4-len8192": (0.05, "calibration part; the log's budget line and gpu_memory_utilization "
                                                   "were not retrieved (0.9 assumed)"),
}

# Issue 13's target is 80% of the held-out part within 3%: 29 of 34 (85%) since the five vLLM 0.23 DeepSeek-V4 logs
# are scored (4 of them within 3%); 25 of 29 (86%) before, since stop 27. Two cases are no longer
# blind: Llama-4-Scout (+8.9%) and Qwen3-30B-A3B (+3.2%) led to three rules read from vLLM's source (the rotary
# tables built with the model, checked on 33 models by the vLLM oracle; towers split over tp; the fused-MoE scratch
# held through the profile); without them the count is 23 of 27 (85%).
HELD_OUT_WITHIN_3PCT = 29


# Logs kvplan refuses to predict (exit 2, one line saying why): not scored; listed so each refusal stays deliberate.
# (The five vLLM 0.23 DeepSeek-V4 logs were here until vLLM 0.22/0.23's DeepSeek-V4 layout was modelled.)
REFUSED: dict[str, str] = {}


def _evaluable() -> list[str]:
    out = []
    for cid, entry in ENTRIES.items():
        args, info = budget_eval.build_args(entry)
        if args is not None and budget_eval.logged(entry, info.get("engine", "vllm")).get("tokens") is not None:
            out.append(cid)
    return [c for c in out if c not in REFUSED]


def test_refused_logs_are_still_refused():
    for cid, why in REFUSED.items():
        args, _ = budget_eval.build_args(ENTRIES[cid])
        r = run_cli(*args)
        assert r.code == 2 and "DeepSeek-V4" in r.err, (cid, why)


EVALUABLE = _evaluable()


def _error(cid: str) -> float:
    entry = ENTRIES[cid]
    args, info = budget_eval.build_args(entry)
    logged = budget_eval.logged(entry, info.get("engine", "vllm"))["tokens"]
    r = run_cli(*args)
    assert r.code == 0, (cid, r.err)
    predicted = r.json()["results"][0]["kv_capacity_tokens"]
    return (predicted - logged) / logged


@pytest.fixture(scope="module")
def errors() -> dict[str, float]:
    return {cid: _error(cid) for cid in EVALUABLE}


def test_the_split_covers_every_log_and_both_parts_are_scored():
    assert set(SPLIT) == set(ENTRIES)
    assert {SPLIT[c] for c in EVALUABLE} == {"calibrate", "holdout"}
    assert len(EVALUABLE) >= 52


def test_held_out_part(errors):
    """Issue 13: capacity within 3% for at least 80% of the held-out vLLM and SGLang cases (29 of 34, 85%)."""
    held = [abs(e) for cid, e in errors.items() if SPLIT[cid] == "holdout"]
    assert len(held) >= 29
    assert sum(e <= 0.03 for e in held) >= HELD_OUT_WITHIN_3PCT, sorted(held)
    assert HELD_OUT_WITHIN_3PCT >= 0.8 * len(held)


@pytest.mark.parametrize("cid", EVALUABLE)
def test_each_case_within_its_reported_error(errors, cid):
    bound, _cause = KNOWN_MISSES.get(cid, (0.03, ""))
    assert abs(errors[cid]) <= bound, (cid, round(100 * errors[cid], 2))


def test_the_budget_evidence_file_is_what_the_code_gives_today():
    """kvplan/data/budget_evidence.json (the 'likely' interval `fit` prints beside an estimated budget) holds, per
    log, kvplan's estimated KV budget minus the printed one; a change to the budget model must rewrite it
    (`python bench/budget_eval.py --evidence`)."""
    from kvplan import evidence

    computed: dict[str, dict[str, int]] = {}
    setups: dict[str, dict[str, dict]] = {}
    for cid, entry in ENTRIES.items():
        args, info = budget_eval.build_args(entry)
        if args is None:
            continue
        logged = budget_eval.logged(entry, info.get("engine", "vllm"))
        if logged.get("kv_gib") is None:
            continue
        r = run_cli(*args)
        if r.code != 0 or r.json().get("errors"):
            continue
        data = r.json()
        engine = data["engine"].split("@")[0]
        computed.setdefault(engine, {})[cid] = data["results"][0]["kv_budget_bytes"] - round(logged["kv_gib"] * budget_eval.GiB)
        setups.setdefault(engine, {})[cid] = budget_eval.setup_of(info)
    stored = json.loads(evidence.EVIDENCE_PATH.read_text())["engines"]
    assert {e: row["errors_bytes"] for e, row in stored.items()} == computed
    assert {e: row["setups"] for e, row in stored.items()} == setups
    assert evidence.for_engine("vllm").logs == len(computed["vllm"])


# Weights-as-loaded the logs print that kvplan does not reproduce within WEIGHTS_AS_LOADED_GIB, with the cause.
WEIGHT_MISSES = {
    **{f"vllm-deepseek-v4-flash-2xh200nvl-tp2-len{n}-fp8kv-gmu0.78-eager{tail}":
       "DeepSeek-V4-Flash FP8/FP4 checkpoint: 74.08 GiB logged (74.35 offline) against kvplan's 73.31; not investigated"
       for n, tail in ((4096, "-serve"), (4096, "-offline-llm"), (65536, ""), (131072, ""), (262144, ""))},
    "vllm-gpt-oss-20b-h100-80gb-tp2-len8192": "MXFP4 experts repacked for the kernel vLLM picked (7.01 GiB logged, "
                                              "6.44 by the checkpoint's format)",
}
WEIGHTS_AS_LOADED_GIB = 0.12


def test_weights_as_loaded_match_the_logs():
    """What the load took per GPU as the log prints it (vLLM "Model loading took", SGLang "Load weight end ... mem
    usage") against kvplan's weights plus the rotary tables the engine builds with the model. Llama-4-Scout on 4
    H100 (53.12 GiB logged) and Gemma-3-4B (8.58) were 1.31 and 0.57 GiB off before the rotary-table and tower-split
    rules; every other log was already within 0.12 GiB."""
    checked = 0
    for cid in EVALUABLE:
        entry = ENTRIES[cid]
        args, info = budget_eval.build_args(entry)
        engine = info.get("engine", "vllm")
        logged = budget_eval.logged(entry, engine).get("weights_gib")
        if logged is None:
            continue
        r = run_cli(*args).json()["results"][0]
        parts = {p["what"]: p["bytes"] for p in r["budget"][0]["parts"]}
        loaded = (r["weight_bytes"] - sum(v for k, v in parts.items() if k.startswith("rotary"))) / budget_eval.GiB
        if cid in WEIGHT_MISSES:
            assert abs(loaded - logged) > WEIGHTS_AS_LOADED_GIB, f"{cid} now matches: drop it from WEIGHT_MISSES"
            continue
        checked += 1
        assert abs(loaded - logged) <= WEIGHTS_AS_LOADED_GIB, (cid, logged, round(loaded, 3))
    assert checked >= 40


def test_moe_activation_peak_matches_the_logs():
    """vLLM 0.19's DEBUG line 'torch peak memory increase' against kvplan's activation peak for the mixture-of-experts
    logs that print it: the fused-MoE scratch vLLM (>= 0.13) keeps across the profile run's sampler
    (overhead.vllm_moe_workspace) puts each within 0.15 GiB, as close as the dense models' (+0.07..+0.11 GiB on
    Llama-3.1-8B, Qwen2.5-7B, Qwen3-8B). Without it: Mixtral tp 2 -0.72, Qwen3-30B-A3B -0.36, Llama-4-Scout -0.11."""
    moe = {"vllm-mixtral-8x7b-instruct-v0.1-h100-80gb-tp2-len8192", "vllm-qwen3-30b-a3b-h100-80gb-tp1-len8192",
           "vllm-llama-4-scout-17b-16e-instruct-h100-80gb-tp4-len8192"}
    for cid in sorted(moe):
        args, info = budget_eval.build_args(ENTRIES[cid])
        logged = budget_eval.logged(ENTRIES[cid], "vllm")["act_gib"]
        parts = {p["what"]: p["bytes"] for p in run_cli(*args).json()["results"][0]["budget"][0]["parts"]}
        predicted = -parts["activation peak (estimate)"] / budget_eval.GiB
        assert abs(predicted - logged) <= 0.15, (cid, logged, round(predicted, 3))
