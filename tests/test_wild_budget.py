"""The budget model (`fit` with no --kv-budget) against public start-up logs nobody here wrote
(tests/data/wild-logs.yaml). Two things are held here:

- the budget model ALONE (no evidence file, so no shift by the public logs' median): every case within 3% of the
  logged KV tokens or within the bound KNOWN_MISSES states with its cause, so docs/accuracy.md cannot drift from the
  code. Its leave-one-source-out score, with the evidence shift and the likely range, is `bench/budget_loso.py`'s
  (docs/accuracy.md); tests assert behaviour, not that score;
- kvplan/data/budget_evidence.json: what `bench/budget_eval.py --evidence` writes from the code of today.

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

# Cases of the budget model alone beyond 3%, with what their logs show (docs/accuracy.md).
KNOWN_MISSES = {
    "vllm-minimax-m2.5-fp8-4xrtxpro6000-tp4-default": (0.20, "vLLM version not stated (newest rules); 8.10 GiB of "
                                                             "non-KV memory on 4 PCIe Blackwell GPUs against 3.80 "
                                                             "estimated, not itemised in the log (NCCL's NVLS buffers "
                                                             "are not charged on PCIe boards)"),
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
    "vllm-qwen3-30b-a3b-4xa10-tp4-len8192": (0.05, "the log's budget line and gpu_memory_utilization were not "
                                                   "retrieved (0.9 assumed)"),
    # stop 45: collected for issue 38 and scored blind (leave-one-source-out) before any change
    "vllm-llama-3.1-8b-instruct-1xl40s-tp1-len32768-pr17122": (
        0.28, "vLLM ~0.8.4 (a PR against main, April 2025): 5.8 GiB besides weights and KV against 1.6 estimated, "
              "not itemised in the log"),
    "vllm-qwen3.5-35b-a3b-4xa10-4nodes-ray-tp4-len160000": (
        3.5, "vLLM version not stated (newest rules applied) on four nodes over Ray: the budget is 12% off (2.34 GiB "
             "against 2.09) but the Qwen3.5 hybrid's tokens per GiB are a quarter of the newest layout's: the layout "
             "of the unstated version"),
    "vllm-qwen2.5-72b-instruct-4xl40s-tp4-len8192-v0.19.0": (
        0.05, "4 PCIe L40S at 0.19: 5.33 GiB of KV against 5.11 (1.07 GiB besides weights and KV logged, 0.97 "
              "estimated)"),
    "vllm-qwen3-vl-30b-a3b-instruct-4xrtx3090-tp4-len65536-v0.11.0": (
        1.6, "Qwen3-VL on 4 PCIe RTX 3090 at vLLM 0.11: 4.24 GiB besides weights and KV against 0.97 estimated: the "
             "multimodal profile run (the largest images) and tensor parallelism over PCIe, not modelled"),
    "vllm-qwen3-vl-30b-a3b-instruct-2xh100-80gb-tp2-len65536": (
        0.10, "Qwen3-VL on 2 H100 at vLLM 0.12: 3.81 GiB besides weights and KV against 0.56 estimated; the text-only "
              "sibling of the same repository (Qwen3-30B-A3B) is within 2%: the multimodal profile run, not modelled"),
    "sglang-v0.5.8.post1-rocm-glm-5-fp8-8xmi355x-tp8-fp8e4m3kv-page1-triton": (
        0.08, "SGLang 0.5.8 on ROCm (8 MI355X): 186.77 GiB of KV against 172.09; the free memory after init on ROCm "
              "is estimated from CUDA's context and NCCL figures, not investigated"),
}


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


@pytest.fixture(scope="module")
def model_alone():
    """`fit` with no evidence file: the budget model's own figures (no shift, no range)."""
    from kvplan import evidence

    patch = pytest.MonkeyPatch()
    patch.setenv(evidence.PATH_VARIABLE, str(ROOT / "tests" / "data" / "no-such-evidence.json"))
    yield
    patch.undo()


def _error(cid: str) -> float:
    entry = ENTRIES[cid]
    args, info = budget_eval.build_args(entry)
    logged = budget_eval.logged(entry, info.get("engine", "vllm"))["tokens"]
    r = run_cli(*args)
    assert r.code == 0, (cid, r.err)
    result = r.json()["results"][0]
    assert all(p["key"] != "evidence" for p in result["budget"][0]["parts"]), "the evidence file was read"
    return (result["kv_capacity_tokens"] - logged) / logged


@pytest.fixture(scope="module")
def errors(model_alone) -> dict[str, float]:
    return {cid: _error(cid) for cid in EVALUABLE}


def test_enough_logs_are_scored():
    assert len(EVALUABLE) >= 60


@pytest.mark.parametrize("cid", EVALUABLE)
def test_each_case_within_its_reported_error(errors, cid):
    bound, _cause = KNOWN_MISSES.get(cid, (0.03, ""))
    assert abs(errors[cid]) <= bound, (cid, round(100 * errors[cid], 2))


def test_known_misses_are_still_misses(errors):
    """A bound that no longer binds (the case is within 3% now) is dropped, so the page's list stays true."""
    stale = [cid for cid in KNOWN_MISSES if cid in errors and abs(errors[cid]) <= 0.03]
    assert stale == [], stale


def _in_process(args: list[str]) -> tuple[int, str, str]:
    r = run_cli(*args)
    return r.code, r.out, r.err


def test_the_budget_evidence_file_is_what_the_code_gives_today(model_alone):
    """kvplan/data/budget_evidence.json (the shift and the likely range `fit` applies to an estimated budget) holds,
    per log, kvplan's raw estimate minus the printed budget, with its source and setup; a change to the budget model
    must rewrite it (`python bench/budget_eval.py --evidence`)."""
    rows = [budget_eval.run(entry, sys.executable, call=_in_process) for entry in ENTRIES.values()]
    from kvplan import evidence

    stored = json.loads(evidence.EVIDENCE_PATH.read_text())
    assert stored == json.loads(json.dumps(budget_eval.evidence(rows)))


# Weights-as-loaded the logs print that kvplan does not reproduce within WEIGHTS_AS_LOADED_GIB, with the cause.
WEIGHT_MISSES = {
    **{f"vllm-deepseek-v4-flash-2xh200nvl-tp2-len{n}-fp8kv-gmu0.78-eager{tail}":
       "DeepSeek-V4-Flash FP8/FP4 checkpoint: 74.08 GiB logged (74.35 offline) against kvplan's 73.31; not investigated"
       for n, tail in ((4096, "-serve"), (4096, "-offline-llm"), (65536, ""), (131072, ""), (262144, ""))},
    "vllm-gpt-oss-20b-h100-80gb-tp2-len8192": "MXFP4 experts repacked for the kernel vLLM picked (7.01 GiB logged, "
                                              "6.44 by the checkpoint's format)",
    **{f"vllm-qwen3-vl-30b-a3b-instruct-{gpus}-len65536{tail}": "Qwen3-VL-30B-A3B: 0.2-0.3 GiB more loaded than "
       "kvplan counts (the vision tower's share over tp); not investigated"
       for gpus, tail in (("4xrtx3090-tp4", "-v0.11.0"), ("2xh100-80gb-tp2", ""))},
    "sglang-v0.5.8.post1-rocm-glm-5-fp8-8xmi355x-tp8-fp8e4m3kv-page1-triton": "GLM-5 FP8 on ROCm: 89.58 GiB logged "
                                                                              "against 88.72; not investigated",
    "vllm-glm-5.1-fp8-8xh200-tp8-eager-len202752-v0.19.1rc1-bisect": "GLM-5.1 FP8 over tp 8: 89.34 GiB logged "
                                                                     "against 88.70 (as SGLang's GLM-5 FP8 on ROCm: a "
                                                                     "GLM-5 part kvplan does not count); not "
                                                                     "investigated",
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
