"""`kvplan verify MODEL --run vllm`: the installed vLLM itself starts on the model's real config (dummy weights) and
its start-up figures must equal kvplan's; a wrong rule must make it fail (exit 1). The engine tests run vLLM's CPU
build (CI installs it; KVPLAN_VLLM_PYTHON points at its virtual environment); the input errors need no engine."""

from __future__ import annotations

import pytest

from conftest import run_cli


def test_run_names_the_engines_it_can_start():
    r = run_cli("verify", "gpt2", "--run", "tensorflow")
    assert r.code == 2 and r.err.count("\n") == 1 and "accepted: vllm, llamacpp" in r.err


def test_run_llamacpp_needs_a_gguf_file():
    r = run_cli("verify", "gpt2", "--run", "llamacpp")
    assert r.code == 2 and r.err.count("\n") == 1 and "needs a local .gguf file" in r.err


def test_kv_budget_belongs_to_run():
    r = run_cli("verify", "gpt2", "--kv-budget", "1GiB")
    assert r.code == 2 and "--kv-budget applies to verify --run" in r.err


def test_run_without_vllm_is_one_line(monkeypatch, tmp_path):
    """An interpreter without vLLM: one line that says how to get it, exit 2."""
    import sys

    fake = tmp_path / "python"
    fake.write_text(f"#!/bin/sh\nexec {sys.executable} -I -S \"$@\"\n")
    fake.chmod(0o755)
    monkeypatch.setenv("KVPLAN_VLLM_PYTHON", str(fake))
    r = run_cli("verify", "gpt2", "--run", "vllm", "--device", "cpu")
    assert r.code == 2 and r.err.count("\n") == 1
    assert "vLLM is not installed" in r.err


@pytest.mark.engine
def test_run_vllm_on_a_real_config_agrees_and_a_wrong_rule_fails(monkeypatch):
    """GPT-2 (124M, real config, dummy weights) on vLLM's CPU build with a 1 GiB KV budget: tokens, blocks and
    concurrency equal kvplan's. Then one layer more in kvplan's vLLM plan: the same run must exit 1."""
    from kvplan.engines import vllm

    r = run_cli("verify", "gpt2", "--run", "vllm", "--device", "cpu", "--ctx", "1024", "--json")
    assert r.code == 0, r.err
    d = r.json()
    assert d["passed"] and d["run"].startswith("vllm ") and d["settings"]["budget_bytes"] == 1 << 30
    judged = {row["what"]: row for row in d["rows"] if row["judged"]}
    assert judged["KV cache tokens"]["engine"] == judged["KV cache tokens"]["kvplan"] > 0

    build_stage = vllm.build_stage

    def one_layer_more(caches, *args, **kwargs):
        caches = tuple(caches)
        return build_stage(caches + ((caches[-1][0] + 1, caches[-1][1]),), *args, **kwargs)

    monkeypatch.setattr(vllm, "build_stage", one_layer_more)
    wrong = run_cli("verify", "gpt2", "--run", "vllm", "--device", "cpu", "--ctx", "1024")
    assert wrong.code == 1
    assert "kvplan disagrees with the engine" in wrong.err and "KV cache tokens" in wrong.err


@pytest.mark.engine
def test_run_llamacpp_on_a_gguf_agrees_and_a_wrong_rule_fails(tmp_path, monkeypatch):
    """A GGUF with sliding-window layers (gemma-3 layout, scaled) on the installed llama.cpp, two sequences: every
    size line equals kvplan's; one layer more in kvplan's llama.cpp plan and the same run exits 1."""
    import oracle_llamacpp as oracle
    from kvplan.engines import layout

    gguf = oracle.write_model("gemma3", tmp_path)
    args = ("verify", str(gguf), "--run", "llamacpp", "--ctx", "3000", "--batch", "2", "--json")
    r = run_cli(*args)
    assert r.code == 0, r.err
    d = r.json()
    assert d["passed"] and d["run"].startswith("llama.cpp b")
    assert {row["what"].split()[0] for row in d["rows"]} == {"base", "swa", "n_ctx"}
    kept = layout.kept

    def one_layer_more(engine, rules, caches):
        out = kept(engine, rules, caches)
        return out + ((out[-1][0] + 1, out[-1][1]),)

    monkeypatch.setattr(layout, "kept", one_layer_more)
    wrong = run_cli(*args[:-1])
    assert wrong.code == 1 and "kvplan disagrees with the engine" in wrong.err


@pytest.mark.cuda
@pytest.mark.engine
def test_run_vllm_on_cuda():
    """On a CUDA machine vLLM profiles the device for its budget; the same figures must agree."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    r = run_cli("verify", "gpt2", "--run", "vllm", "--device", "cuda", "--ctx", "1024", "--json")
    assert r.code == 0, r.err
    assert r.json()["passed"]
