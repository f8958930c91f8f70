"""`kvplan check`: YAML in, pass/fail out (issue #6). Exit codes, every problem with its line, the figures are
`kvplan fit --json`'s, JUnit and GitHub output read back and checked."""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import hubserver
import pytest

from conftest import ROOT, llama_like, run_cli
from kvplan import check, engines

EXAMPLE = ROOT / "examples" / "kvplan.yaml"
fake_hub = hubserver.fake_hub  # the fixture (isolated HF_HOME), under its name in this module

ALL_PASS = """\
defaults: {engine: vllm, gpu_memory_utilization: 0.9}
deployments:
  - name: chat-small
    model: llama-3.2-1b
    gpu: L4
    ctx: 8192
    min_batch: 16
  - name: chat-3b
    model: llama-3.2-3b
    gpu: L4
    ctx: 4k
    batch: 8
"""


def write(tmp_path: Path, text: str, name: str = "kvplan.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def line_of(path: str | Path, needle: str) -> int:
    """1-based line of the first line containing `needle`."""
    return next(i for i, line in enumerate(Path(path).read_text().splitlines(), 1) if needle in line)


def check_json(*args: str) -> tuple[int, dict]:
    r = run_cli("check", *args, "--format", "json")
    return r.code, r.json()


def problems(err: str) -> list[tuple[str, int, int, str]]:
    """`FILE:LINE:COL: message` lines of stderr."""
    out = []
    for line in err.splitlines():
        m = re.match(r"^(.*?):(\d+):(\d+): (.*)$", line)
        if m:
            out.append((m[1], int(m[2]), int(m[3]), m[4]))
    return out


# ---------------------------------------------------------------------------------------------- verdicts, exit codes
def test_all_pass_exits_0(tmp_path):
    path = write(tmp_path, ALL_PASS)
    r = run_cli("check", path)
    assert r.code == 0, r.err
    assert "chat-small" in r.out and "chat-3b" in r.out and "2 passed, 0 failed" in r.out
    code, d = check_json(path)
    assert code == 0 and d["passed"] is True and d["schema"] == 1
    assert [x["name"] for x in d["deployments"]] == ["chat-small", "chat-3b"]
    assert all(x["passed"] for x in d["deployments"])
    assert d["deployments"][1]["requirement"] == {"kind": "min_batch", "value": 8}  # batch: N is min_batch


def test_example_exits_1_naming_chat_8b_with_its_shortfall():
    r = run_cli("check", str(EXAMPLE))
    assert r.code == 1
    assert "chat-8b" in r.out and "short by 13 requests" in r.out
    assert r.err.strip().splitlines()[-1] == "kvplan: error: 1 of 3 deployments failed: chat-8b"
    code, d = check_json(str(EXAMPLE))
    assert code == 1 and d["passed"] is False
    by = {x["name"]: x for x in d["deployments"]}
    assert [x["name"] for x in d["deployments"]] == ["chat-small", "chat-8b", "long-context"]
    assert by["chat-small"]["passed"] and by["long-context"]["passed"]
    bad = by["chat-8b"]
    assert bad["passed"] is False
    assert bad["requirement"] == {"kind": "min_batch", "value": 16}
    assert bad["margin"] == {"value": bad["figures"]["max_batch"] - 16, "unit": "requests"}
    assert bad["figures"]["max_batch"] == 3 and bad["margin"]["value"] == -13
    assert bad["reason"].startswith("min_batch 16 not met") and "short by 13 requests" in bad["reason"]
    assert bad["inputs"]["ctx"] == 8192 and bad["inputs"]["gpu_memory_utilization"] == 0.9  # resolved, merged
    for key in ("name", "passed", "reason", "inputs", "figures", "requirement", "margin"):  # CONTRACTS.md keys
        assert key in bad
    # the verdicts the example's comments state
    text = EXAMPLE.read_text()
    for name, x in by.items():
        comment = next(line for line in text.splitlines() if f"name: {name}" in line)
        assert f"expected: {'PASS' if x['passed'] else 'FAIL'}" in comment


def test_headroom_holds_back_a_share_of_the_budget():
    code, d = check_json(str(EXAMPLE), "--only", "long-context")
    x = d["deployments"][0]
    fit = run_cli("fit", "--gpu", "2xA10G", "--model", "qwen2.5-7b", "--tp", "2", "--ctx", "32k", "--batch", "4",
                  "--kv-dtype", "fp8", "--gpu-memory-utilization", "0.9", "--json").json()["results"][0]  # the median
    low = fit["kv_budget_range_bytes"][0]  # check gates on the low end of the likely range (estimate: low)
    assert x["inputs"]["headroom"] == 0.1
    assert x["figures"]["kv_budget_bytes"] == int(low * 0.9)
    assert x["figures"]["max_batch"] < fit["max_batch"]
    assert any("headroom" in a for a in x["figures"]["assumptions"])
    assert x["figures"]["budget"][0]["parts"][-1]["bytes"] == x["figures"]["kv_budget_bytes"] - low
    assert x["figures"]["budget"][0]["parts"][-2]["key"] == "range_low"


def test_several_files_exit_precedence(tmp_path):
    good = write(tmp_path, ALL_PASS, "good.yaml")
    bad = write(tmp_path, "deployments:\n  - name: x\n    model: llama-3.2-1b\n    gpu: L4\n    ctx: 4k\n    colour: red\n",
                "bad.yaml")
    assert run_cli("check", good).code == 0
    assert run_cli("check", good, str(EXAMPLE)).code == 1
    r = run_cli("check", good, str(EXAMPLE), bad)
    assert r.code == 2
    assert f"{bad}:6:5: unknown key 'colour'" in r.err
    code, d = check_json(good, str(EXAMPLE), bad)
    assert code == 2 and d["passed"] is False
    assert [f["valid"] for f in d["files"]] == [True, True, False]
    assert len(d["deployments"]) == 5  # the valid files are still checked and reported
    assert d["problems"][0]["file"] == bad and d["problems"][0]["line"] == 6


def test_only_and_output(tmp_path):
    r = run_cli("check", str(EXAMPLE), "--only", "chat-small")
    assert r.code == 0 and "chat-small" in r.out and "chat-8b" not in r.out
    r = run_cli("check", str(EXAMPLE), "--only", "chat-small", "--only", "chat-8b", "--json")
    assert r.code == 1 and [x["name"] for x in r.json()["deployments"]] == ["chat-small", "chat-8b"]
    r = run_cli("check", str(EXAMPLE), "--only", "chat-9b")
    assert r.code == 2 and "no deployment named 'chat-9b'" in r.err and "chat-8b" in r.err
    out = tmp_path / "report.xml"
    r = run_cli("check", str(EXAMPLE), "--format", "junit", "--output", str(out))
    assert r.code == 1 and "chat-8b" in r.out  # the console still gets the table
    assert ET.parse(out).getroot().tag == "testsuites"
    table = tmp_path / "report.txt"
    assert run_cli("check", str(EXAMPLE), "--output", str(table)).code == 1
    assert "chat-8b" in table.read_text() and "\x1b[" not in table.read_text()
    r = run_cli("check", str(EXAMPLE), "--format", "xml")
    assert r.code == 2 and "accepted: table, json, junit, github" in r.err


# ---------------------------------------------------------------------------------------------- one code path with fit
FIT_CASES = [
    # (deployment YAML body, the same inputs as fit flags)
    ("model: llama-3.2-1b\n    gpu: L4\n    ctx: 8192\n    min_batch: 16\n    gpu_memory_utilization: 0.9\n    kv_dtype: auto",
     ["--model", "llama-3.2-1b", "--gpu", "L4", "--ctx", "8192", "--batch", "16", "--gpu-memory-utilization", "0.9",
      "--kv-dtype", "auto"]),
    ("model: llama-3.1-8b\n    gpu: L4\n    ctx: 8k\n    min_batch: 16\n    engine: vllm\n    gpu_memory_utilization: 90%",
     ["--model", "llama-3.1-8b", "--gpu", "L4", "--ctx", "8k", "--batch", "16", "--engine", "vllm",
      "--gpu-memory-utilization", "0.9"]),
    ("model: qwen2.5-7b\n    gpu: 2xA10G\n    tp: 2\n    ctx: 32k\n    kv_dtype: fp8\n    min_batch: 4",
     ["--model", "qwen2.5-7b", "--gpu", "2xA10G", "--tp", "2", "--ctx", "32k", "--kv-dtype", "fp8", "--batch", "4"]),
    ("model: llama-3.2-1b\n    gpu: L4\n    engine: sglang@0.5\n    ctx: 4k\n    mem_fraction_static: 80%\n"
     "    page_size: 16\n    kv_budget: 8GiB\n    max_running_requests: 48",
     ["--model", "llama-3.2-1b", "--gpu", "L4", "--engine", "sglang@0.5", "--ctx", "4k", "--mem-fraction-static", "0.8",
      "--page-size", "16", "--kv-budget", "8GiB", "--max-running-requests", "48"]),
    ("model: gemma-2-9b\n    gpu: 24GB\n    engine: llamacpp\n    ctx: 16k\n    min_ctx: 32k\n    ubatch: 256\n"
     "    swa_full: true\n    reserve: 1GiB",
     ["--model", "gemma-2-9b", "--gpu", "24GB", "--engine", "llamacpp", "--ctx", "16k", "--ubatch", "256", "--swa-full",
      "--reserve", "1GiB"]),
    ("model: deepseek-v2-lite\n    gpu: 4xL4\n    tp: 2\n    pp: 2\n    ctx: 1024\n    min_kv_tokens: 100k\n"
     "    engine: vllm@0.9.2\n    max_model_len: 1024\n    weight_dtype: bf16",
     ["--model", "deepseek-v2-lite", "--gpu", "4xL4", "--tp", "2", "--pp", "2", "--ctx", "1024", "--engine", "vllm@0.9.2",
      "--max-model-len", "1024", "--weight-dtype", "bf16"]),
    ("model: llama-3.1-8b\n    gpu: H100\n    engine: trtllm\n    ctx: 8k\n    tokens_per_block: 64\n"
     "    free_gpu_memory_fraction: 0.85\n    max_batch_size: 64",
     ["--model", "llama-3.1-8b", "--gpu", "H100", "--engine", "trtllm", "--ctx", "8k", "--tokens-per-block", "64",
      "--free-gpu-memory-fraction", "0.85", "--max-batch-size", "64"]),
]


@pytest.mark.parametrize("body,flags", FIT_CASES, ids=[c[1][1] + "-" + c[1][3] for c in FIT_CASES])
def test_figures_equal_fit_json(tmp_path, body, flags):
    path = write(tmp_path, f"deployments:\n  - name: d\n    {body}\n")
    code, d = check_json(path)
    assert code in (0, 1), d
    fit = run_cli("fit", *flags, "--estimate", "low", "--json")  # check gates on the low end by default
    assert fit.code == 0, fit.err
    f = fit.json()
    x = d["deployments"][0]
    assert x["figures"] == f["results"][0]  # the whole result entry, frontier included
    assert (x["gpu"], x["engine"], x["tp"], x["pp"]) == (f["gpu"], f["engine"], f["tp"], f["pp"])


# ---------------------------------------------------------------------------------------------- requirements
def test_requirements_and_fail_reasons(tmp_path):
    text = """\
defaults:
  gpu: L4
deployments:
  - name: too-long
    model: qwen2.5-7b
    ctx: 64k
  - name: huge
    model: llama-3.1-70b
    ctx: 4k
  - name: start
    model: llama-3.1-8b
    ctx: 8k
    require_start: true
  - name: multi
    model: llama-3.2-1b
    ctx: 8k
    min_batch: 8
    min_ctx: 128k
    min_kv_tokens: 1M
  - name: ctx-only
    model: llama-3.2-1b
    min_ctx: 64k
  - name: nothing-stated
    model: llama-3.2-1b
    ctx: 4k
"""
    code, d = check_json(write(tmp_path, text))
    assert code == 1
    by = {x["name"]: x for x in d["deployments"]}
    assert by["too-long"]["reason"] == "ctx exceeds model maximum"
    assert by["too-long"]["requirement"] == {"kind": "ctx", "value": 65536}
    assert by["too-long"]["margin"] == {"value": 32768 - 65536, "unit": "tokens"}
    assert by["huge"]["reason"] == "weights do not fit" and not by["huge"]["figures"]["weights_fit"]
    assert by["start"]["reason"] == "engine would not start" and not by["start"]["figures"]["engine_would_start"]
    m = by["multi"]
    assert not m["passed"] and [q["kind"] for q in m["requirements"]] == ["min_batch", "min_ctx", "min_kv_tokens"]
    assert [q["passed"] for q in m["requirements"]] == [True, False, False]
    rel = {q["kind"]: q["margin"]["value"] / q["value"] for q in m["requirements"]}
    assert m["requirement"]["kind"] == min(rel, key=rel.get)  # the binding one: smallest relative margin
    assert m["requirements"][1]["achievable"] == m["figures"]["max_ctx"] and m["figures"]["batch"] == 8
    assert m["requirements"][2]["achievable"] == m["figures"]["kv_capacity_tokens"]
    c = by["ctx-only"]
    assert c["passed"] and c["inputs"]["ctx"] == 65536 and c["requirement"] == {"kind": "min_ctx", "value": 65536}
    n = by["nothing-stated"]
    assert n["passed"] and n["requirement"] == {"kind": "min_batch", "value": 1} and n["requirements"][0]["implicit"]


def test_engine_start_is_a_warning_unless_required():
    code, d = check_json(str(EXAMPLE), "--only", "chat-8b")
    x = d["deployments"][0]
    assert not x["figures"]["engine_would_start"]
    assert x["warnings"] and "max_model_len" in x["warnings"][0]


# ---------------------------------------------------------------------------------------------- invalid files
INVALID = [
    ("bad YAML", "deployments:\n  - name: x\n    model: [llama\n", 4, "invalid YAML"),
    ("unknown key", "deployments:\n  - name: x\n    model: llama-3.2-1b\n    gpu: L4\n    ctx: 4k\n    min_bacth: 4\n",
     6, "unknown key 'min_bacth' in a deployment (did you mean min_batch?)"),
    ("duplicate key", "deployments:\n  - name: x\n    model: llama-3.2-1b\n    gpu: L4\n    ctx: 4k\n    gpu: L40S\n",
     6, "duplicate key 'gpu' (first at line 4)"),
    ("wrong type", "deployments:\n  - name: x\n    model: llama-3.2-1b\n    gpu: L4\n    ctx: [4096]\n",
     5, "ctx: expected a token count"),
    ("float ctx", "deployments:\n  - name: x\n    model: llama-3.2-1b\n    gpu: L4\n    ctx: 4096.5\n", 5, "whole number"),
    ("no read as false", "deployments:\n  - name: no\n    model: llama-3.2-1b\n    gpu: L4\n    ctx: 4k\n",
     2, "no is read by YAML as the boolean false"),
    ("octal", "deployments:\n  - name: x\n    model: llama-3.2-1b\n    gpu: L4\n    ctx: 4k\n    min_batch: 016\n",
     6, "octal number 14"),
    ("numeric name", "deployments:\n  - name: 7\n    model: llama-3.2-1b\n    gpu: L4\n    ctx: 4k\n", 2, "not a string"),
    ("unknown GPU", "deployments:\n  - name: x\n    model: llama-3.2-1b\n    gpu: L5\n    ctx: 4k\n", 4, "unknown GPU 'L5'"),
    ("unknown model", "deployments:\n  - name: x\n    model: llama-9000\n    gpu: L4\n    ctx: 4k\n",
     3, "unknown model 'llama-9000'"),
    ("duplicate name", "deployments:\n  - name: x\n    model: llama-3.2-1b\n    gpu: L4\n    ctx: 4k\n"
     "  - name: x\n    model: llama-3.2-1b\n    gpu: L4\n    ctx: 8k\n", 6, "duplicate deployment name 'x' (first at line 2)"),
    ("knob of another engine", "deployments:\n  - name: x\n    model: llama-3.2-1b\n    gpu: L4\n    ctx: 4k\n"
     "    page_size: 16\n", 6, "page_size does not apply to engine vllm (it applies to sglang)"),
    ("missing keys", "deployments:\n  - name: x\n    model: llama-3.2-1b\n", 2, "missing gpu, ctx"),
    ("unknown engine", "deployments:\n  - name: x\n    model: llama-3.2-1b\n    gpu: L4\n    ctx: 4k\n    engine: vllx\n",
     6, "unknown engine 'vllx'"),
    ("bool spelled yes", "deployments:\n  - name: x\n    model: llama-3.2-1b\n    gpu: L4\n    ctx: 4k\n"
     "    require_start: yes\n", 6, "write true or false"),
    ("empty file", "", 1, "the file is empty"),
    ("no deployments", "defaults: {gpu: L4}\n", 1, "no `deployments:` list"),
]


@pytest.mark.parametrize("case,text,line,needle", INVALID, ids=[c[0] for c in INVALID])
def test_invalid_file_exits_2_with_the_line(tmp_path, case, text, line, needle):
    path = write(tmp_path, text)
    r = run_cli("check", path)
    assert r.code == 2, (r.out, r.err)
    found = problems(r.err)
    assert any(f == path and ln == line and needle in msg for f, ln, _, msg in found), r.err
    assert "Traceback" not in r.err
    assert r.err.strip().splitlines()[-1].startswith("kvplan: error: ")


def test_every_problem_reported_at_once(tmp_path):
    text = """\
defaults:
  engine: vllm
  gpu_memory_utilisation: 0.9
deployments:
  - name: a
    model: llama-3.2-1b
    gpu: L4
    ctx: 4k
    min_batch: 4
    min_batch: 5
  - name: b
    model: llama-9000
    gpu: H100
    ctx: 4k
  - name: c
    model: llama-3.2-1b
    gpu: L5
    ctx: 8192.0
  - name: a
    model: llama-3.2-1b
    gpu: L4
    ctx: 4k
"""
    path = write(tmp_path, text)
    r = run_cli("check", path)
    assert r.code == 2
    got = [(ln, msg) for _, ln, _, msg in problems(r.err)]
    lines = [ln for ln, _ in got]
    assert lines == [3, 10, 12, 17, 18, 19], r.err  # sorted by line, every one
    assert "did you mean gpu_memory_utilization?" in got[0][1]
    assert "12 problems" not in r.err and r.err.strip().splitlines()[-1].startswith("kvplan: error: 6 problems in ")
    assert "nothing checked" in r.out
    code, d = check_json(path)
    assert code == 2 and d["deployments"] == [] and [p["line"] for p in d["problems"]] == lines


def test_defaults_are_merged_and_a_default_knob_must_apply(tmp_path):
    text = """\
defaults: {gpu: L4, ctx: 4k, gpu_memory_utilization: 0.8}
deployments:
  - {name: a, model: llama-3.2-1b}
  - {name: b, model: llama-3.2-1b, engine: sglang}
"""
    path = write(tmp_path, text)
    r = run_cli("check", path)
    assert r.code == 2
    assert (path, 1, text.index("0.8") + 1, "gpu_memory_utilization does not apply to engine sglang (it applies to vllm) "
            "(inherited from defaults by deployment 'b')") in problems(r.err)
    ok = write(tmp_path, text.replace("engine: sglang", "gpu_memory_utilization: 0.7"), "ok.yaml")
    code, d = check_json(ok)
    assert code == 0
    assert [x["inputs"]["gpu_memory_utilization"] for x in d["deployments"]] == [0.8, 0.7]
    assert all(x["inputs"]["gpu"] == "L4" and x["inputs"]["ctx"] == 4096 for x in d["deployments"])


def test_anchors_merge_keys_and_quoted_values(tmp_path):
    text = """\
x-l4: &l4 {gpu: L4, ctx: '016'}
deployments:
  - <<: *l4
    name: "no"
    model: llama-3.2-1b
    min_batch: "8"
"""
    code, d = check_json(write(tmp_path, text))
    assert code == 0, d
    x = d["deployments"][0]
    assert x["name"] == "no" and x["inputs"]["ctx"] == 16 and x["inputs"]["min_batch"] == 8


# ---------------------------------------------------------------------------------------------- JUnit, GitHub
def test_junit_structure(tmp_path):
    good = write(tmp_path, ALL_PASS, "good.yaml")
    r = run_cli("check", str(EXAMPLE), good, "--format", "junit")
    assert r.code == 1
    root = ET.fromstring(r.out)
    assert root.tag == "testsuites"
    assert (root.get("tests"), root.get("failures"), root.get("errors")) == ("5", "1", "0")
    suites = root.findall("testsuite")
    assert [s.get("name") for s in suites] == [str(EXAMPLE), good]
    ex, ok = suites
    assert (ex.get("tests"), ex.get("failures")) == ("3", "1")
    assert (ok.get("tests"), ok.get("failures")) == ("2", "0")
    cases = ex.findall("testcase")
    assert [c.get("name") for c in cases] == ["chat-small", "chat-8b", "long-context"]
    failures = {c.get("name"): c.findall("failure") for c in cases}
    assert not failures["chat-small"] and not failures["long-context"]
    (f,) = failures["chat-8b"]
    code, d = check_json(str(EXAMPLE))
    reason = next(x["reason"] for x in d["deployments"] if x["name"] == "chat-8b")
    assert f.get("message") == reason and "short by 13 requests" in reason
    assert cases[1].get("line") == str(line_of(EXAMPLE, "name: chat-8b"))
    assert [c.get("name") for c in ok.findall("testcase")] == ["chat-small", "chat-3b"]
    assert not ok.findall(".//failure")


def test_junit_invalid_file_is_an_error_case(tmp_path):
    bad = write(tmp_path, "deployments:\n  - name: x\n    model: llama-3.2-1b\n    gpu: L5\n    ctx: 4k\n")
    r = run_cli("check", bad, "--format", "junit")
    assert r.code == 2
    suite = ET.fromstring(r.out).find("testsuite")
    assert (suite.get("name"), suite.get("tests"), suite.get("errors"), suite.get("failures")) == (bad, "1", "1", "0")
    err = suite.find("testcase/error")
    assert f"{bad}:4:10: gpu: unknown GPU 'L5'" in err.text


def test_github_annotations(tmp_path):
    r = run_cli("check", str(EXAMPLE), "--format", "github")
    assert r.code == 1
    errors = [line for line in r.out.splitlines() if line.startswith("::error ")]
    assert len(errors) == 1  # one per failing deployment
    m = re.fullmatch(r"::error file=(.+?),line=(\d+)::(.*)", errors[0])
    assert m and m[1] == str(EXAMPLE) and int(m[2]) == line_of(EXAMPLE, "name: chat-8b")
    assert m[3].startswith("chat-8b: min_batch 16 not met") and "short by 13 requests" in m[3]
    # two failures in one file: two annotations, each on its own deployment's line
    text = ALL_PASS.replace("min_batch: 16", "min_batch: 1000").replace("batch: 8", "batch: 5000")
    path = write(tmp_path, text)
    r = run_cli("check", path, "--format", "github")
    got = [re.fullmatch(r"::error file=(.+?),line=(\d+)::(\S+): .*", line) for line in r.out.splitlines()
           if line.startswith("::error ")]
    assert [(g[1], int(g[2]), g[3]) for g in got] == [(path, line_of(path, "name: chat-small"), "chat-small"),
                                                     (path, line_of(path, "name: chat-3b"), "chat-3b")]
    # an invalid file: one annotation per problem, with line and column
    bad = write(tmp_path, "deployments:\n  - name: x\n    model: llama-3.2-1b\n    gpu: L5\n    ctx: 4k\n", "bad.yaml")
    r = run_cli("check", bad, "--format", "github")
    assert r.code == 2 and f"::error file={bad},line=4,col=10::gpu: unknown GPU 'L5'" in r.out


# ---------------------------------------------------------------------------------------------- offline
def test_offline_cached_model_and_missing_model(fake_hub, tmp_path):
    from kvplan import hub

    fake_hub.add_repo("acme/tiny-llama", {"config.json": llama_like(4, 8, 2, 64)})
    hub.fetch_config("acme/tiny-llama", endpoint=fake_hub.url)  # cached, as `kvplan pull` leaves it
    fake_hub.stop()
    text = ("deployments:\n  - name: cached\n    model: acme/tiny-llama\n    gpu: L4\n    ctx: 4k\n"
            "  - name: bundled\n    model: llama-3.2-1b\n    gpu: L4\n    ctx: 4k\n")
    path = write(tmp_path, text)
    code, d = check_json(path, "--offline")
    assert code == 0, d
    assert d["deployments"][0]["figures"]["model"]["source"] == "cache"
    missing = write(tmp_path, text.replace("acme/tiny-llama", "acme/not-pulled"), "missing.yaml")
    r = run_cli("check", missing, "--offline")
    assert r.code == 2
    ((f, line, _, msg),) = problems(r.err)
    assert (f, line) == (missing, 3) and msg.startswith("model: ") and "offline" in msg


# ---------------------------------------------------------------------------------------------- schema sanity
def test_knob_keys_are_fit_flags_and_engine_knobs():
    import typer

    from kvplan.cli import app

    fit_cmd = typer.main.get_command(app).commands["fit"]
    fit_opts = {o.lstrip("-").replace("-", "_") for p in fit_cmd.params for o in p.opts}
    owned = set().union(*(m.KNOBS for m in engines.MODULES.values()))
    for key in check.KNOB_KEYS:
        assert key in fit_opts and key in owned, key
    for key in ("tp", "pp", "ctx", "batch", "kv_dtype", "k_dtype", "v_dtype", "state_dtype", "weight_dtype",
                "kv_budget", "reserve", "revision", "engine", "gpu", "model"):
        assert key in fit_opts and key in check.KEYS, key


def test_json_is_parseable_with_json_flag():
    r = run_cli("check", str(EXAMPLE), "--json")
    assert r.code == 1 and json.loads(r.out)["summary"] == {"deployments": 3, "passed": 2, "failed": 1,
                                                            "invalid_files": 0}


HOSTILE_NAME = """\
deployments:
  - name: "ok\\n::add-mask::secret\\u0007"
    model: llama-3.2-1b
    gpu: L4
    ctx: 8192
"""


def test_github_output_never_lets_a_name_start_a_workflow_command(tmp_path):
    """A deployment name with a newline must not inject `::add-mask::` (or anything) as a line of its own."""
    r = run_cli("check", write(tmp_path, HOSTILE_NAME), "--format", "github")
    assert r.code == 0, r.err
    assert not any(line.startswith("::add-mask") for line in r.out.splitlines())
    assert "%0A::add-mask::secret" in r.out


def test_junit_stays_well_formed_with_control_characters(tmp_path):
    out = tmp_path / "report.xml"
    r = run_cli("check", write(tmp_path, HOSTILE_NAME), "--format", "junit", "--output", str(out))
    assert r.code == 0, r.err
    root = ET.parse(out).getroot()  # raises on a control character XML 1.0 forbids
    assert root.get("tests") == "1"


def test_traffic_keys_with_an_engine_plan_cannot_replay_name_the_engines_that_can(tmp_path):
    """Which engines take traffic keys comes from the engine listings (Listing.replays), not a list in check."""
    text = ("deployments:\n  - name: t\n    model: llama-3.2-1b\n    gpu: H100\n    engine: sglang\n"
            "    prompt: 500-3000\n    output: 100-800\n")
    path = write(tmp_path, text)
    r = run_cli("check", path)
    assert r.code == 2
    assert problems(r.err) == [(path, 5, 13, "traffic keys (output, prompt) are replayed through vLLM's scheduler or "
                                "llama-server's slots; engine sglang is not modelled yet (accepted: vllm, llamacpp)")]
    replaying = [n for n, row in engines.LISTINGS.items() if row.replays]
    assert replaying == ["vllm", "llamacpp"]


def test_every_key_kind_has_a_converter_and_a_description():
    """A kind in the schema without a reader would fail only when a file first used that key."""
    from kvplan.check.schema import EXPECTED

    kinds = set(check.KEYS.values())
    assert kinds <= set(check.CONVERTERS) and kinds <= set(EXPECTED), kinds - set(check.CONVERTERS)
    assert set(check.CONVERTERS) == set(EXPECTED)
