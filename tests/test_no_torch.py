"""Only `verify` may import torch: `kvplan size` in a fresh interpreter must not load it (nor transformers)."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import io, sys, contextlib
from kvplan.cli import main
buf = io.StringIO()
with contextlib.redirect_stdout(buf):
    try:
        main(["size", "llama-2-7b", "--ctx", "4096", "--json"])
    except SystemExit as e:
        assert not e.code, e.code
heavy = [m for m in ("torch", "transformers", "huggingface_hub", "numpy") if m in sys.modules]
print(",".join(heavy) or "none")
"""


def test_size_never_imports_torch():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "none"


def test_import_kvplan_is_light():
    out = subprocess.run([sys.executable, "-c", "import sys, kvplan, kvplan.cli; print('torch' in sys.modules)"],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "False", out.stderr
