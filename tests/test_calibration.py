"""Calibrations (kvplan/calibration.py): the non-KV memory a vLLM start-up log measured, saved by `kvplan explain
--save-calibration` and used by later `fit` / `check` / `plan` runs.

The oracle is other logs nobody here wrote (tests/data/wild-logs.yaml, the llm-d vLLM 0.19.0 sweep on one H100):
a calibration saved from one log must predict the token count ANOTHER log of the same model, GPU and parallelism
printed under different settings (another KV dtype, another max_model_len), within the interval the saved
figure's printed precision allows. The budget model alone misses some of these by whole GiB.
"""

from __future__ import annotations

import json

import pytest
import yaml

from conftest import DATA, run_cli

ENTRIES = {e["id"]: e for e in yaml.safe_load((DATA / "wild-logs.yaml").read_text())}
SWEEP = "vllm-llama-3.1-8b-instruct-h100-80gb-{}"


def log_file(tmp_path, case_id: str):
    p = tmp_path / f"{case_id}.log"
    p.write_text(ENTRIES[case_id]["log"])
    return p


def printed_tokens(case_id: str) -> int:
    import re

    return int(re.search(r"GPU KV cache size: ([\d,]+) tokens", ENTRIES[case_id]["log"]).group(1).replace(",", ""))


def save(tmp_path, case_id: str, cal, *extra: str):
    r = run_cli("explain", str(log_file(tmp_path, case_id)), "--save-calibration", "--calibrations", str(cal),
                "--offline", "--json", *extra)
    assert r.code == 0, r.err
    return r.json()["calibration_saved"]


def fit(cal, *args: str) -> dict:
    given = ("--calibrations", str(cal)) if cal else ()
    r = run_cli("fit", "llama-3.1-8b", "--engine", "vllm@0.19.0", "--gpu-memory-utilization", "0.95",
                "--offline", "--json", *given, *args)
    assert r.code == 0, r.err
    return r.json()["results"][0]


@pytest.mark.parametrize("source, target, args", [
    # another KV dtype: the cache halves per token, the non-KV memory does not move
    ("tp1-len8192", "tp1-len8192-dtbf16-kvfp8", ("--gpu", "H100", "--kv-dtype", "fp8", "--max-model-len", "8192")),
    # another max_model_len: vLLM V1 profiles max_num_batched_tokens, not the model length
    ("tp1-len8192", "tp1-len32768", ("--gpu", "H100", "--max-model-len", "32768")),
    # two pipeline stages, each with its own measured non-KV memory
    ("tp1-pp2-len8192", "tp1-pp2-len8192", ("--gpu", "2xH100", "--tp", "1", "--pp", "2", "--max-model-len", "8192")),
    ("tp2-len8192", "tp2-len8192", ("--gpu", "2xH100", "--max-model-len", "8192")),
])
def test_a_saved_calibration_predicts_the_engines_tokens(tmp_path, source, target, args):
    cal = tmp_path / "cal.yaml"
    save(tmp_path, SWEEP.format(source), cal)
    r = fit(cal, *args)
    assert r["kv_budget_source"] == "calibrated"
    lo, hi = r["kv_capacity_tokens_range"]
    assert lo <= printed_tokens(SWEEP.format(target)) <= hi, (lo, hi, printed_tokens(SWEEP.format(target)))
    assert hi - lo < 0.001 * r["kv_capacity_tokens"]  # the printed 0.01 GiB, not a wide band


def test_the_budget_model_alone_is_further_off_than_the_calibration_on_two_stages(tmp_path):
    """The pp 2 log is where the estimate is weakest (1.14 GiB of non-KV memory too few per stage)."""
    cal = tmp_path / "cal.yaml"
    save(tmp_path, SWEEP.format("tp1-pp2-len8192"), cal)
    args = ("--gpu", "2xH100", "--tp", "1", "--pp", "2", "--max-model-len", "8192")
    logged = printed_tokens(SWEEP.format("tp1-pp2-len8192"))
    calibrated = fit(cal, *args)["kv_capacity_tokens"]
    estimated = fit(None, *args, "--no-calibration")
    assert estimated["kv_budget_source"] == "estimated"
    assert abs(calibrated - logged) * 20 < abs(estimated["kv_capacity_tokens"] - logged)


def test_the_entry_holds_what_the_log_printed(tmp_path):
    cal = tmp_path / "cal.yaml"
    saved = save(tmp_path, SWEEP.format("tp1-len8192"), cal)
    e = saved["entry"]
    assert e["key"]["engine"] == "vllm" and e["key"]["rules"] == "0.19" and e["key"]["gpu"] == "H100-SXM-80GB"
    assert (e["key"]["tp"], e["key"]["pp"], e["max_num_batched_tokens"], e["max_num_seqs"]) == (1, 1, 8192, 1024)
    # requested = ceil(0.95 x the H100's CUDA total); the log: "Available KV cache memory: 58.11 GiB"
    from kvplan import gpus
    import math

    total = gpus.resolve_gpu("H100-SXM-80GB").gpu.cuda_total_bytes
    assert abs(e["non_kv_bytes"][0] - (math.ceil(total * 0.95) - 58.11 * 2**30)) <= 1
    assert e["half_width_bytes"] == round(0.005 * 2**30)


def test_saving_again_replaces_the_entry_of_the_same_key(tmp_path):
    cal = tmp_path / "cal.yaml"
    assert save(tmp_path, SWEEP.format("tp1-len8192"), cal)["replaced"] is False
    assert save(tmp_path, SWEEP.format("tp1-len4096"), cal)["replaced"] is True
    assert save(tmp_path, SWEEP.format("tp2-len8192"), cal)["replaced"] is False
    assert len(yaml.safe_load(cal.read_text())["calibrations"]) == 2


def test_a_calibration_for_other_parallelism_or_rules_is_not_used_and_says_why(tmp_path):
    cal = tmp_path / "cal.yaml"
    save(tmp_path, SWEEP.format("tp1-len8192"), cal)
    r = fit(cal, "--gpu", "2xH100")
    assert r["kv_budget_source"] == "estimated"
    assert any("tp 1 x pp 1, this run is tp 2 x pp 1: not used" in w for w in r["warnings"])
    r = run_cli("fit", "llama-3.1-8b", "--gpu", "H100", "--engine", "vllm@0.33", "--json", "--calibrations", str(cal))
    res = r.json()["results"][0]
    assert res["kv_budget_source"] == "estimated"
    assert any("rules 0.19, this run uses 0.33" in w for w in res["warnings"])


def test_a_different_profile_moves_only_the_activation_term(tmp_path):
    cal = tmp_path / "cal.yaml"
    save(tmp_path, SWEEP.format("tp1-len8192"), cal)
    same = fit(cal, "--gpu", "H100", "--max-model-len", "8192")
    smaller = fit(cal, "--gpu", "H100", "--max-model-len", "8192", "--max-num-seqs", "256")  # the sampler's peak
    parts = {p["what"]: p["bytes"] for p in smaller["budget"][0]["parts"]}
    moved = parts["activation peak change since calibration (estimate)"]
    assert moved > 0  # a smaller profile leaves more for the cache
    assert smaller["kv_budget_bytes"] - same["kv_budget_bytes"] == moved


def test_check_and_plan_use_the_calibration_file_they_are_given(tmp_path):
    cal = tmp_path / "cal.yaml"
    save(tmp_path, SWEEP.format("tp1-len8192"), cal)
    deploy = tmp_path / "kvplan.yaml"
    deploy.write_text("deployments:\n  - name: chat\n    model: llama-3.1-8b\n    gpu: H100\n    engine: vllm@0.19.0\n"
                      "    gpu_memory_utilization: 0.95\n    ctx: 8192\n    min_batch: 8\n")
    r = run_cli("check", str(deploy), "--json", "--offline", "--calibrations", str(cal))
    assert r.code == 0, r.err
    figures = r.json()["deployments"][0]["figures"]
    assert figures["kv_budget_source"] == "calibrated"
    r = run_cli("check", str(deploy), "--json", "--offline", "--calibrations", str(cal), "--no-calibration")
    assert r.code == 2 and "contradict" in r.err
    r = run_cli("plan", "llama-3.1-8b", "--gpu", "H100", "--engine", "vllm@0.19.0", "--gpu-memory-utilization", "0.95",
                "--prompt", "1000", "--output", "200", "--requests", "50", "--json", "--offline", "--calibrations", str(cal))
    assert r.code == 0, r.err
    assert r.json()["pool"]["kv_budget_source"] == "calibrated"


@pytest.mark.parametrize("case_id, needle", [
    ("sglang-qwen3-235b-a22b-fp8-4xh100-tp4", "names no GPU in kvplan's catalog"),
    ("trtllm-llama-3.1-8b-fp8-h100-fp8kv", "vLLM and SGLang logs only"),
])
def test_logs_it_cannot_calibrate_from_are_refused_in_one_line(tmp_path, case_id, needle):
    curated = {e["id"]: e for e in yaml.safe_load((DATA / "engine-logs.yaml").read_text())}
    p = tmp_path / "x.log"
    p.write_text(curated[case_id]["log"])
    r = run_cli("explain", str(p), "--save-calibration", "--calibrations", str(tmp_path / "c.yaml"), "--offline")
    assert r.code == 2 and needle in r.err and len(r.err.strip().splitlines()) == 1, r.err
    assert not (tmp_path / "c.yaml").exists()


def test_a_log_without_a_version_is_refused(tmp_path):
    import re

    text = "\n".join(ln for ln in ENTRIES[SWEEP.format("tp1-len8192")]["log"].splitlines()
                     if not re.search(r"version", ln))
    p = tmp_path / "x.log"
    p.write_text(text)
    r = run_cli("explain", str(p), "--save-calibration", "--calibrations", str(tmp_path / "c.yaml"), "--offline")
    assert r.code == 2 and "states no vLLM version" in r.err, r.err
    r = run_cli("explain", str(p), "--save-calibration", "--calibrations", str(tmp_path / "c.yaml"), "--offline",
                "--engine", "vllm@0.19.0")
    assert r.code == 0, r.err


@pytest.mark.parametrize("content, needle", [
    ("calibrations: [ {key: {engine: vllm}} ]\n", "malformed"),
    ("just: text\n", "not a calibration file"),
    ("calibrations: [\n", "not a readable calibration file"),
])
def test_a_broken_calibration_file_is_one_line_and_exit_2(tmp_path, content, needle):
    cal = tmp_path / "cal.yaml"
    cal.write_text(content)
    r = run_cli("fit", "llama-3.1-8b", "--gpu", "H100", "--calibrations", str(cal))
    assert r.code == 2 and needle in r.err and len(r.err.strip().splitlines()) == 1, r.err


def test_a_named_calibration_file_must_exist_and_the_default_may_not(tmp_path, monkeypatch):
    r = run_cli("fit", "llama-3.1-8b", "--gpu", "H100", "--calibrations", str(tmp_path / "none.yaml"))
    assert r.code == 2 and "no such calibration file" in r.err
    monkeypatch.setenv("KVPLAN_CALIBRATIONS", str(tmp_path / "absent.yaml"))
    r = run_cli("fit", "llama-3.1-8b", "--gpu", "H100", "--json")
    assert r.code == 0 and r.json()["results"][0]["kv_budget_source"] == "estimated"


def test_the_default_file_is_used_without_a_flag(tmp_path, monkeypatch):
    cal = tmp_path / "default.yaml"
    monkeypatch.setenv("KVPLAN_CALIBRATIONS", str(cal))
    r = run_cli("explain", str(log_file(tmp_path, SWEEP.format("tp1-len8192"))), "--save-calibration", "--offline")
    assert r.code == 0 and cal.exists(), r.err
    r = run_cli("fit", "llama-3.1-8b", "--gpu", "H100", "--engine", "vllm@0.19.0", "--json", "--offline")
    assert json.loads(r.out)["results"][0]["kv_budget_source"] == "calibrated"
