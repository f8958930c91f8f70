"""Tables never cut a name or a number (issue 14): at 60, 80 and 120 columns and into a pipe, every command's
table output holds each figure and name whole (no ellipsis), folding into stacked records when a table cannot
fit the width. Each case runs the real CLI in a subprocess; the figures checked come from the same command's --json.
"""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PLAN = ["plan", "llama-3.1-8b", "--gpu", "H100", "--prompt", "500-3000", "--output", "100-800", "-n", "200",
        "--users", "1000", "--tpot", "30ms"]


def run(args: list[str], columns: int | None) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    out = subprocess.run([sys.executable, "-m", "kvplan", *args], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=120)
    assert out.returncode in (0, 1), out.stderr
    return out.stdout


def words(text: str) -> set[str]:
    return set(re.findall(r"[^\s│┃║|]+", text))


def figures(args: list[str]) -> set[str]:
    """Names and numbers the table must show whole: from the --json of the same command."""
    return _figures(tuple(args))


@functools.lru_cache(maxsize=None)
def _figures(args: tuple[str, ...]) -> set[str]:
    data = json.loads(run([*args, "--json"], None))
    if args[0] == "fit" and "--model" not in args:
        return ({r["model"]["requested"] for r in data["results"]}
                | {f"{r['max_batch']:,}" for r in data["results"]}
                | {f"{r['kv_capacity_tokens']:,}" for r in data["results"] if r["kv_capacity_tokens"]}
                | {f"{r['max_ctx']:,}" for r in data["results"]})
    if args[0] == "fit":
        r = data["results"][0]
        return {f"{r['max_batch']:,}", f"{r['kv_budget_bytes']:,}"} | {f"{f['max_batch']:,}" for f in r["frontier"]}
    if args[0] == "size":
        return {f"{data['kv_bytes']:,}", f"{data['params']:,}", f"{data['weight_bytes']:,}"} | {
            f"{g['tokens']:,}" for g in data["groups"]}
    if args[0] == "gpus":
        return {g["name"] for g in data["gpus"]} | {a for g in data["gpus"] for a in g["aliases"] if " " not in a}
    if args[0] == "plan":
        return {f"{data['run']['p50_running']:,}", f"{data['fleet']['gpus']:,}"} | {
            f"{r['batch']:,}" for r in data["speed"]["by_batch"]}
    if args[0] == "models":
        return {m["alias"] for m in data["models"]} | {m["id"] for m in data["models"]}
    raise AssertionError(args)


CASES = {
    "fit-catalog": ["fit", "--gpu", "24GB"],
    "fit-one": ["fit", "--gpu", "L4", "--model", "llama-3.1-8b"],
    "size-llama4": ["size", "llama-4-scout", "--ctx", "1M"],
    "gpus": ["gpus"],
    "models": ["models"],
    "plan": PLAN,
}


@pytest.mark.parametrize("columns", [60, 80, 120, None], ids=["60", "80", "120", "pipe"])
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "plan" else n for n in sorted(CASES)])
def test_nothing_is_cut(name, columns):
    args = CASES[name]
    text = run(args, columns)
    assert "…" not in text
    missing = sorted(f for f in figures(args) if f not in words(text) and f not in text)
    assert not missing, f"{name} at {columns or 'pipe'} columns: {missing[:8]}"
    if columns is not None:
        widest = max(len(line) for line in text.splitlines())
        assert widest <= columns, f"{name}: a line of {widest} characters at {columns} columns"


@pytest.mark.parametrize("columns", [60, 80, 120, 160])
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "plan" else n for n in sorted(CASES)])
def test_preset_column_widths_are_richs_own_layout(name, columns, monkeypatch):
    """render.width._preset_natural_widths only spares rich from measuring every cell: the text equals what rich
    lays out when it measures them itself."""
    from conftest import run_cli
    from kvplan.render import width

    monkeypatch.setenv("COLUMNS", str(columns))
    fast = run_cli(*CASES[name])
    monkeypatch.setattr(width, "_preset_natural_widths", lambda table, width: None)
    measured = run_cli(*CASES[name])
    assert fast.code == measured.code and fast.out == measured.out
    assert fast.out.strip()
