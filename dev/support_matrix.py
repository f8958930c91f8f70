"""Write docs/support.md: the model family x engine matrix, one word a cell.

    python dev/support_matrix.py            # rewrite docs/support.md
    python dev/support_matrix.py --check    # exit 1 when docs/support.md is not what it would write

Two sources, combined and checked against each other:

- kvplan itself decides which cells are refused or not modelled: every probe model of a family (docs/support-
  grades.json) is sized at 4,096 tokens under every engine's default rule set, in-process (kvplan.sizing.size, the
  library call behind `kvplan size`). A one-line refusal (UnsupportedKind) is "not modelled" when its text says
  kvplan does not model it (layout.NotModelled's "kvplan does not model ...", a family table's "not modelled: ..."),
  else "refused" (layout.Unsupported, a family the engine has no model for, a rule set too old for it).
- docs/support-grades.json holds the evidence grade of every cell kvplan sizes (exact, logs, source), which no
  run can compute.

It fails, naming the cell, when the grades file grades a cell kvplan refuses, leaves out a cell kvplan sizes, or
lists probes of one family that kvplan treats differently under one engine (split the family), and when a cell
graded at another rule set ({grade, engine}) is sized by the engine's default too (the version is then not needed).
"""

from __future__ import annotations

import argparse
import importlib
import json
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GRADES = ROOT / "docs" / "support-grades.json"
OUT = ROOT / "docs" / "support.md"
CTX = 4096

sys.path.insert(0, str(ROOT))

ENGINE_NAMES = {"vllm": "vLLM", "sglang": "SGLang", "llamacpp": "llama.cpp", "trtllm": "TensorRT-LLM",
                "hf": "transformers"}
GRADE_WORDS = ("exact", "logs", "source")
NOT_MODELLED = re.compile(r"not modelled|does not model", re.IGNORECASE)

LEGEND = """\
| word | what the figure rests on |
|---|---|
| **exact** | the engine's own layout rule, read in its source, and the engine's own code run here agrees figure for figure (vLLM 0.32's CPU build and llama.cpp b11434 under `pytest -m engine`, transformers' model code, SGLang's own pool configurators run from its wheel) |
| **logs** | read in the engine's source, and public start-up logs of the engine reproduce (no run here) |
| **source** | read in the engine's source; no engine run or log checks it here |
| **refused** | the engine cannot run this family; kvplan says so in one line (exit 2) |
| **not modelled** | the engine runs it, but kvplan does not lay out its cache for that engine; it refuses in one line (exit 2) rather than borrow another engine's rule |
"""


class MatrixError(Exception):
    """The grades file and kvplan disagree (or a probe cannot be sized at all)."""


@dataclass(frozen=True)
class Cell:
    word: str  # exact | logs | source | refused | not modelled
    engine: str  # the rule set the word holds at (the engine's default unless the grades file names one)
    note: str | None = None  # a refusal's text, or why the default rule set differs


def _probe_path(probe: str, tmp: Path, n: int) -> str:
    """A probe as `kvplan size` takes it: an alias, a path (under the repository), or a config dict written out."""
    if ":" in probe:
        module, expr = probe.split(":", 1)
        tests = str(ROOT / "tests")
        if tests not in sys.path:
            sys.path.insert(0, tests)
        config = eval(expr, vars(importlib.import_module(module)))  # noqa: S307  (the repository's own test data)
        d = tmp / f"probe{n}"
        d.mkdir()
        (d / "config.json").write_text(json.dumps(config))
        return str(d / "config.json")
    if "/" in probe and (ROOT / probe).exists():
        return str(ROOT / probe)
    return probe


def _size(model: str, engine: str) -> tuple[str | None, str]:
    """(refusal text or None when sized, the resolved rule set label)."""
    from kvplan.engines.layout import UnsupportedKind
    from kvplan.sizing import EngineOptions, ModelOptions, size

    try:
        r = size(ModelOptions(model, offline=True), EngineOptions(engine=engine), CTX)
    except UnsupportedKind as e:
        return str(e), engine
    return None, r.setup.prepared.selected.label


def _refusal_word(text: str) -> str:
    return "not modelled" if NOT_MODELLED.search(text) else "refused"


def _clean(text: str, tmp: Path) -> str:
    return " ".join(text.replace(str(tmp) + "/", "").replace(str(ROOT) + "/", "").split())


def build(grades: dict) -> tuple[list[dict], dict[str, str]]:
    """Every family's cells, checked; and the default rule set of each engine."""
    engines: list[str] = grades["engines"]
    defaults: dict[str, str] = {}
    rows = []
    problems: list[str] = []
    with tempfile.TemporaryDirectory() as t:
        tmp = Path(t)
        n = 0
        for fam in grades["families"]:
            paths = []
            for probe in fam["probes"]:
                n += 1
                paths.append((probe, _probe_path(probe, tmp, n)))
            cells: dict[str, Cell] = {}
            for engine in engines:
                given = fam["cells"].get(engine)
                grade, at = (given["grade"], given["engine"]) if isinstance(given, dict) else (given, engine)
                if grade is not None and grade not in GRADE_WORDS:
                    problems.append(f"{fam['family']} / {engine}: grade {grade!r} is none of {GRADE_WORDS}")
                    continue
                outcomes = {}
                for probe, path in paths:
                    why, label = _size(path, engine)
                    if why is None:
                        defaults.setdefault(engine, label)
                    outcomes[probe] = why
                sized = {p for p, why in outcomes.items() if why is None}
                if sized and len(sized) != len(outcomes):
                    problems.append(f"{fam['family']} / {engine}: kvplan sizes {sorted(sized)} but refuses "
                                    f"{sorted(set(outcomes) - sized)}: split the family")
                    continue
                if at != engine:  # graded at another rule set: the default must refuse, that rule set must size
                    if sized:
                        problems.append(f"{fam['family']} / {engine}: graded at {at}, but the default rule set "
                                        "sizes it too: grade the default")
                        continue
                    at_why = [w for _, path in paths if (w := _size(path, at)[0]) is not None]
                    if at_why:
                        problems.append(f"{fam['family']} / {at}: graded {grade!r}, but kvplan refuses it: "
                                        f"{_clean(at_why[0], tmp)}")
                        continue
                    cells[engine] = Cell(grade, at, _clean(next(iter(outcomes.values())), tmp))
                elif sized:
                    if grade is None:
                        problems.append(f"{fam['family']} / {engine}: kvplan sizes it "
                                        f"({', '.join(sorted(sized))}), but docs/support-grades.json gives no grade")
                        continue
                    cells[engine] = Cell(grade, engine)
                else:
                    why = _clean(next(iter(outcomes.values())), tmp)
                    if grade is not None:
                        problems.append(f"{fam['family']} / {engine}: graded {grade!r}, but kvplan refuses it: {why}")
                        continue
                    cells[engine] = Cell(_refusal_word(why), engine, why)
            rows.append({**fam, "cells": cells})
    if problems:
        raise MatrixError("docs/support-grades.json and kvplan disagree:\n  " + "\n  ".join(problems))
    return rows, defaults


def render(rows: list[dict], defaults: dict[str, str], engines: list[str]) -> str:
    head = " | ".join(f"{e} ({defaults.get(e, e).split('@')[-1]})" for e in engines)
    out = [
        "# Support matrix: model families and engines",
        "",
        "<!-- Generated by dev/support_matrix.py from docs/support-grades.json and kvplan itself; do not edit by "
        "hand. tests/test_docs.py fails when it is out of date. -->",
        "",
        f"What each engine's figure rests on, per model family, at each engine's default rule set (the version in "
        f"the header; `kvplan size MODEL --engine NAME`). The evidence behind every cell, and the test that holds "
        f"it, is in [evidence.md](evidence.md) (the family name links to its section); what changes between "
        f"rule sets is in [engines.md](engines.md).",
        "",
        LEGEND,
        f"| family (bundled example or probe) | {head} |",
        "|---|" + "---|" * len(engines),
    ]
    footnotes: list[str] = []
    for row in rows:
        words = []
        for e in engines:
            c = row["cells"][e]
            if c.engine != e:
                footnotes.append(f"{row['family']}, {ENGINE_NAMES[e]}: {c.word} at `{c.engine}` and the rule sets "
                                 f"[engines.md](engines.md) lists with it; the default `{defaults.get(e, e)}` "
                                 f"refuses it: {c.note}")
                words.append(f"{c.word} †{len(footnotes)}")
            else:
                words.append(c.word)
        out.append(f"| [{row['family']}](evidence.md#{row['anchor']}) ({row['examples']}) | " + " | ".join(words) + " |")
    out.append("")
    if footnotes:
        out += [f"†{i}. {f}" for i, f in enumerate(footnotes, 1)] + [""]
    out += [
        "A `model_type` kvplan does not know gets a llama-style answer from its standard fields, with a warning in "
        "every output, unless its config carries latent, linear-attention, state, sparse-index, per-layer "
        "attention-kind, shared-KV, cross-attention or mixture-of-experts fields: then it is refused in one line "
        "naming them (tests/test_genuine_configs.py, tests/test_unknown_family.py).",
        "",
        "## Refusals, as kvplan prints them",
        "",
        f"Every refused and not-modelled cell above, with the line `kvplan size` prints (exit 2) at {CTX:,} tokens "
        "under the engine's default rule set.",
        "",
    ]
    for row in rows:
        lines = [f"  - {ENGINE_NAMES[e]} ({c.word}): {c.note}" for e in engines
                 if (c := row["cells"][e]).word not in GRADE_WORDS]
        if lines:
            out += [f"- **{row['family']}**", *lines]
    return "\n".join(out) + "\n"


def generate() -> str:
    grades = json.loads(GRADES.read_text(encoding="utf-8"))
    rows, defaults = build(grades)
    return render(rows, defaults, grades["engines"])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/support.md is out of date")
    opts = ap.parse_args()
    try:
        text = generate()
    except MatrixError as e:
        print(e, file=sys.stderr)
        return 1
    if opts.check:
        if OUT.read_text(encoding="utf-8") != text:
            print("docs/support.md is out of date: run python dev/support_matrix.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text, encoding="utf-8")
    print(f"wrote {OUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
