"""SGLang calibrations and explain's exact token count (kvplan/explain/sglang_log.py, engines/sglang.py).

SGLang sizes its pool as `post - pre x (1 - mem_fraction_static)` GiB over the bytes per token, pre and post the free
memory it measured before and after the weights load, and its logs print both ('Load weight begin. avail mem=',
'Load weight end. ... avail mem='). The oracle is the engine's own token count in public logs nobody here wrote
(tests/data/wild-logs.yaml): from the two printed figures kvplan must land on it, and a calibration saved from
them must predict it again in `fit`; at another fraction the prediction must follow SGLang's formula on the same
printed figures (written out here from engines.md section 2.2, not through kvplan).
"""

from __future__ import annotations

import re

import yaml

from conftest import DATA, run_cli

ENTRIES = {e["id"]: e for e in yaml.safe_load((DATA / "wild-logs.yaml").read_text())}
CASE = "sglang-llama-3.1-8b-instruct-h100-80gb-tp1-msf0.88-v0.4.3"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
LLAMA_8B_BYTES_PER_TOKEN = 2 * 32 * 8 * 128 * 2  # K and V, 32 layers, 8 KV heads x 128, bf16


def log_file(tmp_path, case_id: str = CASE):
    p = tmp_path / f"{case_id}.log"
    p.write_text(ENTRIES[case_id]["log"])
    return p


def printed(case_id: str, pattern: str) -> str:
    return re.search(pattern, ENTRIES[case_id]["log"]).group(1)


def test_explain_reproduces_the_pool_from_the_free_memory_the_log_printed(tmp_path):
    r = run_cli("explain", str(log_file(tmp_path)), "--model", MODEL, "--gpu", "H100", "--offline", "--json")
    assert r.code == 0, r.err
    rows = {x["what"]: x for x in r.json()["findings"]}
    assert rows["kv_tokens"]["verdict"] == "reproduced", rows["kv_tokens"]
    assert rows["kv_tokens"]["printed"].replace(",", "") == printed(CASE, r"max_total_num_tokens=(\d+)")
    assert {rows["free_before_load"]["verdict"], rows["free_after_load"]["verdict"]} == {"estimated"}


def test_a_saved_calibration_predicts_the_engines_tokens_at_any_fraction(tmp_path):
    cal = tmp_path / "cal.yaml"
    r = run_cli("explain", str(log_file(tmp_path)), "--model", MODEL, "--gpu", "H100", "--engine", "sglang@0.4.3",
                "--offline", "--json", "--save-calibration", "--calibrations", str(cal))
    assert r.code == 0, r.err
    saved = r.json()["calibration_saved"]["entry"]
    assert saved["key"]["engine"] == "sglang" and saved["free_at_start_bytes"]
    pre = float(printed(CASE, r"Load weight begin\. avail mem=([\d.]+) GB"))
    post = float(printed(CASE, r"Load weight end\..*?avail mem=([\d.]+) GB"))
    for fraction in ("0.88", "0.8", "0.7"):
        fit = run_cli("fit", MODEL, "--gpu", "H100", "--engine", "sglang@0.4.3", "--mem-fraction-static", fraction,
                      "--calibrations", str(cal), "--offline", "--json")
        assert fit.code == 0, fit.err
        res = fit.json()["results"][0]
        assert res["kv_budget_source"] == "calibrated"
        engine_rule = int((post - pre * (1 - float(fraction))) * (1 << 30)) // LLAMA_8B_BYTES_PER_TOKEN
        lo, hi = res["kv_capacity_tokens_range"]
        assert lo <= engine_rule <= hi, (fraction, engine_rule, lo, hi)
        if fraction == "0.88":  # the log's own setting: the engine's printed count
            assert lo <= int(printed(CASE, r"max_total_num_tokens=(\d+)")) <= hi


def test_a_log_without_the_free_memory_lines_is_refused_in_one_line(tmp_path):
    p = tmp_path / "pool-only.log"
    p.write_text("[2025-02-14 11:00:37 TP0] KV Cache is allocated. #tokens: 444372, K size: 27.12 GB, V size: 27.12 GB\n")
    r = run_cli("explain", str(p), "--model", MODEL, "--gpu", "H100", "--engine", "sglang@0.4.3", "--offline",
                "--save-calibration", "--calibrations", str(tmp_path / "cal.yaml"))
    assert r.code == 2
    assert "free memory before and after the weights load" in r.err and len(r.err.strip().splitlines()) == 1
