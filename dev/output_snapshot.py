"""Every output of size / fit / plan / check / explain (and the listings, help and error lines) over the bundled
catalog x every engine version, recorded so that a restructuring can be shown to change none of them.

    python dev/output_snapshot.py write DIR [--jobs 2] [--only size,fit]   # run every case, write DIR/*.json
    python dev/output_snapshot.py diff OLD NEW [--added KEY]              # case by case; exit 1 on any difference

To compare two trees, write a snapshot from each (a git worktree of the old commit comes first on PYTHONPATH):

    git worktree add /tmp/kv-old <commit>
    PYTHONPATH=/tmp/kv-old python /tmp/kv-old/dev/output_snapshot.py write /tmp/snap-old   # or this file, copied
    python dev/output_snapshot.py write /tmp/snap-new && python dev/output_snapshot.py diff /tmp/snap-old /tmp/snap-new

A case is the argument list of one `kvplan` call, run in-process through kvplan.cli.main (as the tests do), with
the Hub offline and no saved calibrations; its record is the exit code, stdout (parsed when it is JSON) and stderr.
The case list is built from the bundled aliases (model_configs/aliases.yaml or .json, read here) and each engine's
ENGINE.versions, so both trees run the same cases when neither changes those.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

ROOT = Path(os.environ.get("KVPLAN_SNAPSHOT_ROOT") or Path(__file__).resolve().parents[1])
WORK = Path(tempfile.gettempdir()) / "kvplan-snapshot-work"  # one fixed path: outputs that name files stay equal

GROUPS = ("size", "fit", "catalog", "text", "plan", "check", "explain", "errors")


def _env() -> None:
    os.environ["HF_HUB_OFFLINE"] = "1"
    os.environ["KVPLAN_CALIBRATIONS"] = str(WORK / "no-calibrations.yaml")
    os.environ["COLUMNS"] = "100"
    os.environ["NO_COLOR"] = "1"
    os.environ.pop("KVPLAN_DEBUG", None)
    WORK.mkdir(parents=True, exist_ok=True)


def models() -> list[str]:
    base = ROOT / "model_configs"
    if (base / "aliases.json").exists():
        data = json.loads((base / "aliases.json").read_text())
    else:
        import yaml

        data = yaml.safe_load((base / "aliases.yaml").read_text())
    return [entry["aliases"][0] for _, entry in sorted(data["models"].items())]


def engine_labels() -> list[tuple[str, list[str]]]:
    from kvplan import engines

    return [(n, [label for label, _ in engines.REGISTRY[n].ENGINE.versions]) for n in engines.names()]


def run(args: list[str]) -> dict:
    from kvplan.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with redirect_stdout(out), redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as e:
            code = int(e.code or 0) if not isinstance(e.code, str) else 2
    text = out.getvalue()
    try:
        parsed = json.loads(text) if "--json" in args or "json" in args else text
    except ValueError:
        parsed = text
    return {"code": code, "out": parsed, "err": err.getvalue()}


# ---------------------------------------------------------------------------------------------- the cases
def cases(group: str) -> list[tuple[str, list[str]]]:
    ms = models()
    labels = engine_labels()
    newest = [(n, vs[-1]) for n, vs in labels]
    out: list[tuple[str, list[str]]] = []
    if group == "size":
        for m in ms:
            for n, vs in labels:
                for v in vs:
                    out.append((f"size {m} {n}@{v}", ["size", m, "--engine", f"{n}@{v}", "--ctx", "4096", "--json"]))
            for n, v in newest:
                e = f"{n}@{v}"
                for extra in (["--ctx", "32k", "--batch", "4"], ["--tp", "2"], ["--pp", "2"], ["--kv-dtype", "fp8"],
                              []):
                    out.append((f"size {m} {e} {' '.join(extra)}", ["size", m, "--engine", e, *extra, "--json"]))
    elif group == "fit":
        for m in ms:
            for n, vs in labels:
                for v in vs:
                    out.append((f"fit {m} {n}@{v}", ["fit", m, "--gpu", "H100", "--engine", f"{n}@{v}", "--ctx", "8k",
                                                      "--json"]))
            for n, v in newest:
                e = f"{n}@{v}"
                for extra in (["--gpu", "L4"], ["--gpu", "2xH100"], ["--gpu", "B200", "--ctx", "32k"],
                              ["--gpu", "24GB", "--kv-budget", "10GiB"], ["--gpu", "A100-80GB", "--pp", "2"],
                              ["--gpu", "4xL40S", "--reserve", "3GiB", "--batch", "8"]):
                    out.append((f"fit {m} {e} {' '.join(extra)}", ["fit", m, "--engine", e, *extra, "--json"]))
    elif group == "catalog":
        for n, v in newest:
            for extra in (["--gpu", "24GB"], ["--gpu", "H100", "--ctx", "32k"]):
                out.append((f"fit catalog {n} {' '.join(extra)}", ["fit", "--engine", n, *extra, "--json"]))
    elif group == "text":
        for m in ms:
            out.append((f"text size {m}", ["size", m, "--ctx", "8k"]))
            out.append((f"text fit {m}", ["fit", m, "--gpu", "H100", "--ctx", "8k"]))
        for n, _ in newest:
            out.append((f"text fit catalog {n}", ["fit", "--gpu", "24GB", "--engine", n]))
        for cmd in (["models"], ["models", "--json"], ["gpus"], ["gpus", "--json"], ["models", "--search", "qwen3"],
                    ["--help"], *[[c, "--help"] for c in ("size", "fit", "plan", "explain", "check", "models", "pull",
                                                           "gpus", "verify")]):
            out.append((f"text {' '.join(cmd)}", cmd))
    elif group == "plan":
        work = ["--prompt", "500-3000", "--output", "100-800", "-n", "150"]
        for m in ("llama-3.1-8b", "llama-3.2-1b", "qwen3-8b", "gemma-3-4b-it", "gpt-oss-20b", "mistral-7b",
                  "qwen3-next-80b-a3b", "deepseek-v2-lite", "llama-4-scout"):
            for e in ("vllm", "vllm@0.19", "llamacpp"):
                out.append((f"plan {m} {e}", ["plan", m, "--gpu", "H100", "--engine", e, *work, "--users", "300",
                                             "--tpot", "40ms", "--json"]))
        out.append(("plan rate", ["plan", "llama-3.1-8b", "--gpu", "L4", *work, "--rate", "2", "--json"]))
        out.append(("plan burst prefix", ["plan", "llama-3.2-1b", "--gpu", "L4", *work, "--burst", "--shared-prefix",
                                          "400", "--json"]))
        out.append(("plan tp", ["plan", "llama-3.1-70b", "--gpu", "4xH100", *work, "--users", "200", "--tpot",
                                "50ms", "--ttft", "2s", "--interconnect", "450", "--json"]))
        out.append(("plan text", ["plan", "llama-3.1-8b", "--gpu", "H100", *work, "--users", "300", "--tpot", "30ms"]))
        out.append(("plan text llamacpp", ["plan", "llama-3.2-1b", "--gpu", "L4", "--engine", "llamacpp", *work]))
    elif group == "check":
        for name, text in CHECK_FILES.items():
            path = WORK / f"{name}.yaml"
            path.write_text(text)
            for fmt in ("json", "table", "junit", "github"):
                out.append((f"check {name} {fmt}", ["check", str(path), "--format", fmt]))
        out.append(("check example json", ["check", str(ROOT / "examples" / "kvplan.yaml"), "--json"]))
    elif group == "errors":
        for args in ERROR_CASES:
            out.append((f"error {' '.join(args)}", list(args)))
    return out


CHECK_FILES = {
    "engines": """\
defaults: {gpu: H100, ctx: 8k}
deployments:
  - {name: v, model: llama-3.1-8b, engine: vllm, min_batch: 8, gpu_memory_utilization: 0.85, max_num_seqs: 64}
  - {name: v10, model: qwen3-8b, engine: vllm@0.10, min_ctx: 64k, block_size: 32}
  - {name: s, model: qwen3-8b, engine: sglang, min_kv_tokens: 100k, mem_fraction_static: 0.8, page_size: 16}
  - {name: s-hybrid, model: qwen3-next-80b-a3b, gpu: 4xH100, tp: 4, engine: sglang, min_batch: 4, mamba_full_memory_ratio: 0.5}
  - {name: l, model: llama-3.2-1b, engine: llamacpp, gpu: L4, min_batch: 4, ubatch: 256, parallel: 4}
  - {name: t, model: mistral-7b, engine: trtllm, min_batch: 16, free_gpu_memory_fraction: 0.8, tokens_per_block: 64}
  - {name: h, model: gpt2, engine: hf, ctx: 1024, min_batch: 2}
  - {name: fail, model: llama-3.1-70b, gpu: L4, min_batch: 1}
  - {name: budget, model: llama-3.1-8b, kv_budget: 20GiB, headroom: 10%, min_batch: 4, kv_dtype: fp8}
  - {name: reserve, model: gemma-3-4b-it, reserve: 2GiB, min_batch: 4, require_start: true}
""",
    "traffic": """\
defaults: {gpu: H100, engine: vllm}
deployments:
  - {name: chat, model: llama-3.1-8b, prompt: 500-3000, output: 100-800, requests: 150, users: 300, tpot: 40ms, max_gpus: 4}
  - {name: running, model: llama-3.2-1b, gpu: L4, prompt: 1000, output: 200, requests: 100, min_running: 8}
  - {name: local, model: llama-3.2-1b, gpu: L4, engine: llamacpp, prompt: 300-900, output: 100, requests: 60, min_running: 2}
""",
    "invalid": """\
defaults: {gpu: H100}
deployments:
  - {name: a, model: llama-3.1-8b, ctx: 8k, min_batch: lots}
  - {name: b, model: llama-3.1-8b, tp: 3, min_batch: 1}
  - {name: c, model: nope-model, min_batch: 1}
  - {name: d, model: llama-3.1-8b, page_size: 16, min_batch: 1}
""",
}

ERROR_CASES = (
    ("size", "no-such-model"), ("size", "llama-3.1-8b", "--ctx", "4.5k"), ("size", "llama-3.1-8b", "--tp", "3"),
    ("size", "llama-3.1-8b", "--engine", "vllm@x"), ("size", "llama-3.1-8b", "--engine", "tgi"),
    ("size", "llama-3.1-8b", "--page-size", "16"), ("size", "llama-3.1-8b", "--kv-dtype", "int3"),
    ("size", "llama-3.1-8b", "--engine", "llamacpp", "--kv-dtype", "fp8"), ("size", "t5-large", "--engine", "vllm"),
    ("size", "deepseek-v4-flash", "--engine", "vllm@0.19"), ("size", "llama-3.1-8b", "--batch", "0"),
    ("size", "llama-3.1-8b", "--engine", "vllm@", "--ctx", "1k"), ("size", "llama-3.1-8b", "--pp", "-1"),
    ("size", "deepseek-v3", "--engine", "vllm", "--kv-dtype", "fp16", "--decode-context-parallel-size", "3"),
    ("fit", "--gpu", "H9000"), ("fit", "--gpu", "GH200"), ("fit", "llama-3.1-8b", "--gpu", "H100", "--kv-budget", "12"),
    ("fit", "llama-3.1-8b", "--gpu", "H100", "--gpu-memory-utilization", "1.5"),
    ("fit", "llama-3.1-8b", "--gpu", "H100", "--engine", "sglang", "--block-size", "32"),
    ("fit", "llama-3.1-8b", "--gpu", "H100", "--headroom", "120%"), ("fit", "llama-3.1-8b", "--gpu", "1 k"),
    ("fit", "llama-3.1-8b", "--gpu", "1 k", "--engine", "sglang"), ("fit", "a", "--gpu", "H100", "--model", "b"),
    ("plan", "llama-3.1-8b", "--gpu", "H100"), ("plan", "llama-3.1-8b", "--gpu", "H100", "--prompt", "5-1",
                                                 "--output", "10"),
    ("plan", "llama-3.1-8b", "--gpu", "H100", "--engine", "sglang", "--prompt", "100", "--output", "10"),
    ("explain", "/nonexistent.log"), ("check", "/nonexistent.yaml"), ("models", "--hub"),
)


def explain_records() -> dict[str, dict]:
    """Every log of tests/data through explain, as tests/test_explain.py runs it; the CLI's text view of a few."""
    sys.path.insert(0, str(ROOT / "tests"))
    import test_explain as t

    from kvplan import render

    records: dict[str, dict] = {}
    tmp = WORK / "explain"
    tmp.mkdir(exist_ok=True)
    for i, (case_id, entry) in enumerate(sorted(t.ENTRIES.items())):
        try:
            x = t.run(entry, tmp)
            rec = {"code": x.exit_code, "out": x.to_json(), "err": ""}
            if i % 12 == 0:
                buf = io.StringIO()
                console = render.console()
                with redirect_stdout(buf):
                    console.print(render.explain_view(x))
                rec["text"] = buf.getvalue()
        except Exception as e:  # noqa: BLE001  (the message is the record)
            rec = {"code": "raised", "out": None, "err": f"{type(e).__name__}: {e}"}
        records[f"explain {case_id}"] = rec
    return records


def write(directory: Path, only: list[str], jobs: int) -> None:
    _env()
    directory.mkdir(parents=True, exist_ok=True)
    for group in only:
        if group == "explain":
            records = explain_records()
        else:
            todo = cases(group)
            if jobs > 1 and len(todo) > 50:
                records = _parallel(todo, jobs)
            else:
                records = {cid: run(args) for cid, args in todo}
        text = json.dumps(records, indent=1, sort_keys=True, default=str).replace(str(ROOT), "<repo>")
        (directory / f"{group}.json").write_text(text + "\n")  # the checkout's path is no output difference
        codes: dict = {}
        for r in records.values():
            codes[r["code"]] = codes.get(r["code"], 0) + 1
        print(f"{group}: {len(records)} cases, exit codes {dict(sorted(codes.items(), key=str))}", flush=True)


def _work(chunk: list[tuple[str, list[str]]]) -> dict[str, dict]:
    _env()
    return {cid: run(args) for cid, args in chunk}


def _parallel(todo, jobs: int) -> dict[str, dict]:
    import multiprocessing as mp

    chunks = [todo[i::jobs] for i in range(jobs)]
    with mp.get_context("fork").Pool(jobs) as pool:
        parts = pool.map(_work, chunks)
    records: dict[str, dict] = {}
    for p in parts:
        records.update(p)
    return records


def _without(value, field: str):
    """A record with every dict key `field` removed (a key an addition brought, compared as if absent)."""
    if isinstance(value, dict):
        return {k: _without(v, field) for k, v in value.items() if k != field}
    if isinstance(value, list):
        return [_without(v, field) for v in value]
    return value


def diff(old: Path, new: Path, show: int = 12, added: tuple[str, ...] = ()) -> int:
    import difflib

    bad = 0
    for path in sorted(old.glob("*.json")):
        a = json.loads(path.read_text())
        other = new / path.name
        if not other.exists():
            print(f"{path.name}: missing in {new}")
            bad += 1
            continue
        b = json.loads(other.read_text())
        for field in added:
            b = _without(b, field)
        missing, extra = sorted(set(a) - set(b)), sorted(set(b) - set(a))
        changed = [k for k in a if k in b and a[k] != b[k]]
        same = len(a) - len(missing) - len(changed)
        print(f"{path.name}: {same} of {len(a)} identical, {len(changed)} differ, {len(missing)} missing, "
              f"{len(extra)} new")
        for k in missing[:show]:
            print(f"  missing: {k}")
        for k in extra[:show]:
            print(f"  new: {k}")
        for k in changed[:show]:
            lines = difflib.unified_diff(json.dumps(a[k], indent=1, sort_keys=True).splitlines(),
                                         json.dumps(b[k], indent=1, sort_keys=True).splitlines(), lineterm="", n=1)
            print(f"  differs: {k}")
            for line in list(lines)[2:40]:
                print(f"    {line}")
        bad += len(missing) + len(changed)
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "write":
        only = list(GROUPS)
        jobs = 1
        rest = argv[2:]
        while rest:
            flag = rest.pop(0)
            if flag == "--only":
                only = rest.pop(0).split(",")
            elif flag == "--jobs":
                jobs = int(rest.pop(0))
        write(Path(argv[1]), only, jobs)
        return 0
    if len(argv) >= 3 and argv[0] == "diff":  # diff OLD NEW [--added KEY ...]: keys the new side may add
        return diff(Path(argv[1]), Path(argv[2]), added=tuple(argv[4::2]) if "--added" in argv else ())
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
