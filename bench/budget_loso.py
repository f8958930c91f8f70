"""Leave-one-source-out scoring of `kvplan fit`'s estimated budget against public engine start-up logs.

    python bench/budget_loso.py [--jobs 2] [--logs FILE ...] [--json]

Every log of tests/data/wild-logs.yaml (or the --logs files) that kvplan can predict is run through `kvplan fit`
twice: once to read the budget model's raw estimate (bench/budget_eval.py), then with the budget evidence rebuilt
from every OTHER source (a repository, an issue thread: bench/budget_eval.py source_of), so that the shift and the
likely range a log is scored with never saw that log, nor any log of its source. Printed: per engine, GPU tier and
parallelism, how many logs land within 3% and 5% of the logged KV tokens, the median |error|, the signed mean, and
how often the logged figure lay inside the printed likely range; then every log beyond 5%. Nothing is asserted.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import budget_eval  # noqa: E402  (the log reader, the fit runner and the evidence writer)
from budget_eval import err  # noqa: E402

from kvplan import evidence as ev, gpus  # noqa: E402


def scored(rows: list[dict]) -> list[dict]:
    return [r for r in rows if "skip" not in r and r.get("tokens") and r.get("pred_tokens") is not None]


def leave_one_source_out(entries: list[dict], python: str, jobs: int) -> list[dict]:
    """Rows of budget_eval.run, each predicted with the evidence of the other sources only."""
    with tempfile.TemporaryDirectory() as tmp:  # the budget model alone: no evidence file
        none = str(Path(tmp) / "none.json")
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            first = list(pool.map(lambda e: budget_eval.run(e, python, none), entries))
    by_id = {e["id"]: e for e in entries}
    sources = sorted({r["source"] for r in first if "skip" not in r})
    out = {r["id"]: r for r in first}
    with tempfile.TemporaryDirectory() as tmp:
        jobs_list = []
        for i, source in enumerate(sources):
            path = Path(tmp) / f"evidence-{i}.json"
            path.write_text(json.dumps(budget_eval.evidence(first, leave_out=source)), encoding="utf-8")
            jobs_list += [(by_id[r["id"]], str(path), r) for r in first if r.get("source") == source and "skip" not in r]
        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            again = list(pool.map(lambda job: budget_eval.run(job[0], python, job[1]), jobs_list))
    for (_, _, model_only), row in zip(jobs_list, again):
        row["model_tokens"] = model_only.get("pred_tokens")
        out[row["id"]] = row
    return [out[e["id"]] for e in entries]


def classes(r: dict) -> dict[str, str]:
    gpu = gpus.resolve_gpu(r["gpu"].split("x", 1)[1]).gpu
    return {"engine": str(r.get("resolved_engine") or r["engine"]).split("@")[0], "GPU tier": gpu.tier,
            "parallelism": ev.parallel(int(r.get("tp") or 1), int(r.get("pp") or 1), gpu.interconnect)}


def held(r: dict) -> bool | None:
    lo_hi = r.get("pred_tokens_range")
    if not lo_hi:
        return None
    return lo_hi[0] <= r["tokens"] <= lo_hi[1]


def stats(rows: list[dict], key: str = "pred_tokens") -> dict:
    errors = [err(r[key], r["tokens"]) for r in rows if r.get(key) is not None]
    ranges = [h for h in (held(r) for r in rows) if h is not None]
    return {"logs": len(rows), "sources": len({r["source"] for r in rows}),
            "within_3": sum(abs(e) <= 3 for e in errors), "within_5": sum(abs(e) <= 5 for e in errors),
            "median_abs": statistics.median(abs(e) for e in errors) if errors else None,
            "signed_mean": statistics.fmean(errors) if errors else None,
            "range_held": sum(ranges), "ranged": len(ranges)}


def _pct(n: int, d: int) -> str:
    return f"{n}/{d} ({100 * n / d:.0f}%)" if d else "-"


def table(rows: list[dict], key: str | None) -> list[str]:
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(classes(r)[key] if key else "all", []).append(r)
    out = [f"| {key or 'all'} | logs | sources | within 3% | within 5% | median abs err | signed mean | 80% range held "
           "| model alone: within 3% | within 5% | median abs err | signed mean |",
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for name in sorted(groups, key=lambda g: -len(groups[g])):
        s, m = stats(groups[name]), stats(groups[name], "model_tokens")
        out.append(f"| {name} | {s['logs']} | {s['sources']} | {_pct(s['within_3'], s['logs'])} "
                   f"| {_pct(s['within_5'], s['logs'])} | {s['median_abs']:.1f}% | {s['signed_mean']:+.1f}% "
                   f"| {_pct(s['range_held'], s['ranged'])} | {_pct(m['within_3'], m['logs'])} "
                   f"| {_pct(m['within_5'], m['logs'])} | {m['median_abs']:.1f}% | {m['signed_mean']:+.1f}% |")
    return out


def report(rows: list[dict]) -> str:
    done = scored(rows)
    lines = ["# Leave-one-source-out: kvplan fit's estimated KV capacity against public start-up logs", "",
             f"{len(done)} logs from {len({r['source'] for r in done})} sources scored ({len(rows) - len(done)} not "
             "predictable: `python bench/budget_eval.py` says why). Error = (kvplan - logged) / logged KV tokens; "
             "every log predicted with the evidence of the other sources only.", ""]
    for key in (None, "engine", "GPU tier", "parallelism"):
        lines += table(done, key) + [""]
    far = sorted((r for r in done if abs(err(r["pred_tokens"], r["tokens"])) > 5),
                 key=lambda r: -abs(err(r["pred_tokens"], r["tokens"])))
    lines += [f"## Beyond 5% ({len(far)})", "", "| log | source | GPU | engine | logged | kvplan | likely | error |",
              "|---|---|---|---|---:|---:|---|---:|"]
    for r in far:
        lo_hi = r.get("pred_tokens_range")
        rng = f"{lo_hi[0]:,} .. {lo_hi[1]:,}" if lo_hi else "-"
        lines.append(f"| {r['id']} | {r['source'][:48]} | {r['gpu']} tp {r.get('tp')} | {r.get('resolved_engine')} "
                     f"| {r['tokens']:,} | {r['pred_tokens']:,} | {rng} | {err(r['pred_tokens'], r['tokens']):+.1f}% |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--logs", nargs="*", type=Path, default=[budget_eval.LOGS], help="log files (YAML lists)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--json", action="store_true", help="the rows as JSON")
    opts = ap.parse_args()
    entries = [e for f in opts.logs for e in yaml.safe_load(f.read_text())]
    rows = leave_one_source_out(entries, opts.python, opts.jobs)
    print(json.dumps(rows, indent=1, default=str) if opts.json else report(rows), end="")


if __name__ == "__main__":
    main()
