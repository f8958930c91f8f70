"""Only `verify` may import torch: `kvplan size` in a fresh interpreter must not load it (nor transformers); and a
run imports only the engine module it uses (engines/listing.py answers the rest)."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import io, sys, contextlib
from kvplan.cli import main
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    try:
        main(sys.argv[1:])
    except SystemExit as e:
        assert not e.code, e.code
heavy = [m for m in ("torch", "transformers", "huggingface_hub", "numpy") if m in sys.modules]
print(",".join(heavy) or "none")
print(",".join(sorted(m.rsplit(".", 1)[1] for m in sys.modules
                      if m.startswith("kvplan.engines.") and m.rsplit(".", 1)[1] in ENGINES)))
"""
ENGINES = ("vllm", "sglang", "llamacpp", "trtllm", "hf")


def _run(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, "-c", f"ENGINES = {ENGINES!r}" + SCRIPT, *args], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout.splitlines()


def test_size_never_imports_torch():
    assert _run("size", "llama-2-7b", "--ctx", "4096", "--json")[0] == "none"


@pytest.mark.parametrize("engine, module", [(None, "vllm"), ("llama.cpp", "llamacpp"), ("transformers", "hf"),
                                            ("sglang", "sglang"), ("trtllm", "trtllm")])
def test_a_run_imports_only_its_engine(engine, module):
    args = ["size", "llama-2-7b", "--ctx", "4096", "--json"] + (["--engine", engine] if engine else [])
    assert _run(*args)[1] == module


def test_import_kvplan_is_light():
    out = subprocess.run([sys.executable, "-c", "import sys, kvplan, kvplan.cli; print('torch' in sys.modules)"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
