"""Totals of `kvplan explain` over every log in tests/data, as tests/test_explain.py runs it (the same model and
dtype hints), for docs/explain.md and closing notes:

    .venv-dev/bin/python bench/explain_logs.py [--by-case]
"""

from __future__ import annotations

import os
import sys
import tempfile
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]
os.environ["HF_HUB_OFFLINE"] = "1"

import test_explain as t  # noqa: E402  (the test's own mapping: one source of truth)


def main() -> None:
    totals: Counter = Counter()
    engines: Counter = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        for case_id, entry in sorted(t.ENTRIES.items()):
            x = t.run(entry, Path(tmp))
            counts = Counter(f.verdict for f in x.findings)
            totals.update(counts)
            engines[x.facts.engine] += 1
            if "--by-case" in sys.argv:
                print(f"{case_id:70} {dict(counts)}")
    print(f"logs: {len(t.ENTRIES)} ({', '.join(f'{e} {n}' for e, n in engines.most_common())})")
    print("figures: " + ", ".join(f"{v} {totals[v]}" for v in ("reproduced", "differs", "estimated", "not reproduced")))


if __name__ == "__main__":
    main()
