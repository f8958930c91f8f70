"""CLI consistency (issue 14): shell completion of models and GPUs, MODEL positional in fit as in size/verify/plan,
vLLM's own flag names accepted as aliases."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import run_cli

ROOT = Path(__file__).resolve().parents[1]


def complete(words: str) -> list[str]:
    """What bash completion offers for the last word (typer/click's completion protocol)."""
    env = {**os.environ, "_KVPLAN_COMPLETE": "complete_bash", "COMP_WORDS": words,
           "COMP_CWORD": str(len(words.split()) - (0 if words.endswith(" ") else 1))}
    code = "import sys; from kvplan.cli import main; sys.argv = ['kvplan']; main()"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, cwd=ROOT, timeout=60)
    return out.stdout.split()


def test_completion_offers_catalog_gpus_and_bundled_models():
    gpus = complete("kvplan fit --gpu H2")
    assert {"H200", "H200-141GB", "H20", "H20-3e"} <= set(gpus) and all(g.lower().startswith("h2") for g in gpus)
    models = complete("kvplan size llama-3.1")
    assert {"llama-3.1-8b", "llama-3.1-70b"} <= set(models)
    assert "qwen3-8b" in complete("kvplan plan qwen3-8")
    assert "deepseek-v3" in complete("kvplan fit --gpu H100 --model deepseek-v")


def test_fit_takes_model_positionally_or_as_an_option():
    a = run_cli("fit", "llama-3.1-8b", "--gpu", "L4", "--json").json()
    b = run_cli("fit", "--gpu", "L4", "--model", "llama-3.1-8b", "--json").json()
    assert a["results"] == b["results"]
    clash = run_cli("fit", "llama-3.1-8b", "--model", "gpt2", "--gpu", "L4")
    assert clash.code == 2 and "given twice" in clash.err


def test_vllm_flag_names_are_aliases():
    ours = run_cli("size", "llama-3.1-8b", "--kv-dtype", "fp8", "--tp", "2", "--json").json()
    theirs = run_cli("size", "llama-3.1-8b", "--kv-cache-dtype", "fp8", "--tensor-parallel-size", "2", "--json").json()
    assert ours == theirs and theirs["tp"] == 2
    pp = run_cli("fit", "--gpu", "2xL4", "--model", "llama-3.1-8b", "--pipeline-parallel-size", "2", "--json").json()
    assert pp["pp"] == 2


def test_a_version_newer_than_the_rules_says_which_rules_it_got():
    out = run_cli("size", "llama-2-7b", "--engine", "vllm@99", "--json").json()
    assert out["engine"].startswith("vllm@") and any("newer than any version" in a for a in out["assumptions"])
    same = run_cli("size", "llama-2-7b", "--engine", "llamacpp@b11434", "--json").json()
    assert not any("newer than" in a for a in same["assumptions"])  # the oracle's own build is a rule set


def test_small_frame_items():
    ROOT_EXAMPLE = str(ROOT / "examples" / "kvplan.yaml")
    assert run_cli("check", ROOT_EXAMPLE, "--timeout", "5").code == 1  # the example has a failing deployment
    bad = run_cli("check", ROOT_EXAMPLE, "--timeout", "-1")
    assert bad.code == 2 and "--timeout" in bad.err
    tiny = run_cli("fit", "--gpu", "24GB", "--kv-budget", "5")
    assert tiny.code == 2 and "give a unit" in tiny.err
    none = run_cli("models", "--search", "zzzz")
    assert none.code == 0 and none.out.strip() == "no model matches 'zzzz' in the bundled catalog; --hub searches the Hub"
    t4 = run_cli("fit", "--gpu", "T4", "--model", "llama-3.1-8b")
    lines = [line for line in t4.out.splitlines() if "│" in line]
    assert "fits" in lines[3] and "weights alone" in lines[3]  # the verdict comes before the figures
    assert "frontier" not in t4.out


def test_help_is_grouped_has_examples_and_never_cuts():
    for command in ("size", "fit", "plan", "check", "models", "pull", "gpus", "verify"):
        env = {**os.environ, "COLUMNS": "60"}
        text = subprocess.run([sys.executable, "-m", "kvplan", command, "-h"], capture_output=True, text=True,
                              env=env, cwd=ROOT, timeout=60).stdout
        assert "Example" in text and "…" not in text and "<str>" not in text, command
    fit = run_cli("fit", "-h").out
    sections = [line for line in fit.splitlines() if line and not line.startswith(" ") and line.endswith(":")]
    assert sections[:2] == ["Arguments:", "Options:"] and {"Engine and layout:", "Budget:", "Output:", "Model:"} <= set(sections)
    assert "Workload (plan):" in run_cli("plan", "-h").out


def test_waiting_shows_a_spinner_on_a_terminal_and_nothing_in_a_pipe():
    import fcntl
    import pty
    import select
    import struct
    import termios
    import time

    args = ["plan", "llama-3.1-8b", "--gpu", "H100", "--prompt", "500-3000", "--output", "100-800", "--json"]
    piped = subprocess.run([sys.executable, "-m", "kvplan", *args], capture_output=True, text=True, cwd=ROOT,
                           timeout=120)
    assert piped.returncode == 0 and piped.stderr == ""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    proc = subprocess.Popen([sys.executable, "-m", "kvplan", *args], stdin=slave, stdout=subprocess.DEVNULL,
                            stderr=slave, cwd=ROOT, close_fds=True)
    os.close(slave)
    seen = b""
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and time.monotonic() < deadline:
            if select.select([master], [], [], 0.5)[0]:
                try:
                    seen += os.read(master, 4096)
                except OSError:
                    break
    finally:
        proc.kill()
        os.close(master)
    assert b"replaying 1,000 requests through vLLM's scheduler" in seen, seen[-300:]


def test_the_v0_engine_budget_is_refused_not_overstated():
    """vLLM < 0.8 profiles at max_model_len tokens (issue 13: +99% capacity before); with a budget it is planned."""
    r = run_cli("fit", "llama-3.1-8b", "--gpu", "A100-80GB", "--engine", "vllm@0.6")
    assert r.code == 2 and "V0 engine" in r.err and "--kv-budget" in r.err
    ok = run_cli("fit", "llama-3.1-8b", "--gpu", "A100-80GB", "--engine", "vllm@0.6", "--kv-budget", "40GiB", "--json")
    assert ok.code == 0 and ok.json()["results"][0]["kv_budget_source"] == "flag"
