"""kvplan's own KV-token prediction (no --kv-budget) against public engine start-up logs.

    python bench/budget_eval.py [--ids ID ...] [--jobs 4] > budget_eval.md   # the full report
    python bench/accuracy_page.py [--check]                                    # writes docs/accuracy.md
    python bench/budget_eval.py --evidence                                     # writes kvplan/data/budget_evidence.json

For every entry of tests/data/wild-logs.yaml whose `model` kvplan can size offline (a bundled alias / Hub id, or
a genuine config.json under tests/data/wild-configs/<org>--<name>/ or tests/data/aic-configs/), run `kvplan fit MODEL --json --offline` with
the log's GPU, tp/pp, engine@version, gpu_memory_utilization / mem_fraction_static, max_model_len (= --ctx),
KV dtype and every other knob the entry states that kvplan accepts; read the printed figures out of the log text by
regex (never typed in) and print a markdown table of logged vs predicted tokens, KV GiB and weight GiB, followed by
the entries that could not be evaluated and why. Nothing is asserted; this script only reports.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
LOGS = ROOT / "tests" / "data" / "wild-logs.yaml"
CONFIGS = ROOT / "tests" / "data" / "wild-configs"
GiB = 1 << 30

sys.path.insert(0, str(ROOT))
from kvplan import catalog, gpus  # noqa: E402  (read-only look-ups: alias table and GPU catalog)
from kvplan.evidence import PATH_VARIABLE as EVIDENCE_VARIABLE  # noqa: E402  (where fit reads its evidence)
from kvplan.explain.common import literal_dict  # noqa: E402  (the log reader's own dict parser)

HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


# ---------------------------------------------------------------------------------------------- entry fields
def first_number(value) -> float | None:
    """0.95 / '0.8 (recipe default; failed) and 0.85' -> the first number; 'not stated' / None -> None."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    m = NUMBER.search(str(value))
    return float(m.group()) if m else None


def first_int(value) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    m = re.match(r"\s*(\d[\d,_]*)", str(value))
    return int(re.sub(r"[,_]", "", m.group(1))) if m else None


def engine_spec(entry: dict) -> tuple[str, str]:
    """('vllm@0.19.0', note) from `engine` + `engine_version`; a bare name where no version is readable."""
    name = "sglang" if str(entry.get("engine", "")).lower().startswith("sglang") else "vllm"
    text = str(entry.get("engine_version") or "")
    m = re.search(r"(?<![\w.])v?(\d+\.\d+(?:\.\d+)?)", text)
    if not m:
        return name, "version not stated: newest rules"
    guessed = bool(re.search(r"not (stated|visible|in)|~|->|match|presumabl|inferred", text))
    return f"{name}@{m.group(1)}", "version inferred by the collector" if guessed else ""


def non_default_args(entry: dict) -> dict:
    """The entry's `non_default_args` dict (or the log's 'non-default args:' line), where it parses as a literal."""
    texts = [entry.get("non_default_args")]
    m = re.search(r"non-default args: (\{.*\})", entry.get("log") or "")
    if m:
        texts.append(m.group(1))
    for text in texts:
        if not text:
            continue
        value = literal_dict(str(text))  # elided dicts ('..., x: 1, ...') read pair by pair
        if value:
            return value
    return {}


KV_DTYPES = {"fp8": "fp8", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "bfloat16": "bf16", "bf16": "bf16",
             "float16": "fp16", "fp16": "fp16", "half": "fp16", "float32": "fp32", "fp32": "fp32"}


def kv_dtype(entry: dict, nda: dict) -> str | None:
    text = nda.get("kv_cache_dtype") or entry.get("kv_cache_dtype")
    if text is None:
        return None
    token = re.split(r"[\s(;,]", str(text).strip(), maxsplit=1)[0].lower()
    return KV_DTYPES.get(token)


def knob_flags(entry: dict, nda: dict, engine: str) -> list[str]:
    """Engine knobs the entry states (non-default args dict, other_settings prose) that kvplan accepts."""
    prose = " ".join(str(entry.get(k) or "") for k in ("other_settings",))
    flags: list[str] = []

    def stated(key: str, pattern: str, cast=int):
        if key in nda and nda[key] is not None:
            return nda[key]
        m = re.search(pattern, prose)
        return cast(m.group(1)) if m else None

    if engine.startswith("vllm"):
        seqs = stated("max_num_seqs", r"max[-_ ]num[-_ ]seqs\W{0,3}(\d+)")
        mnbt = stated("max_num_batched_tokens", r"max[-_ ]num[-_ ]batched[-_ ]tokens\W{0,3}(\d+)")
        block = stated("block_size", r"block[-_ ]size\W{0,3}(\d+)")
        pc = stated("enable_prefix_caching", r"enable[-_]prefix[-_]caching\s*=\s*(True|False)", cast=lambda s: s == "True")
        mamba = stated("mamba_ssm_cache_dtype", r"mamba[-_]ssm[-_]cache[-_]dtype\W{0,3}(\w+)", cast=str)
        if seqs:
            flags += ["--max-num-seqs", str(seqs)]
        if mnbt:
            flags += ["--max-num-batched-tokens", str(mnbt)]
        if block:
            flags += ["--block-size", str(block)]
        if pc is False:
            flags += ["--no-enable-prefix-caching"]
        if mamba:
            flags += ["--mamba-ssm-cache-dtype", str(mamba)]
        if nda.get("disable_hybrid_kv_cache_manager"):
            flags += ["--disable-hybrid-kv-cache-manager"]
        runner = re.search(r"VLLM_USE_V2_MODEL_RUNNER=([01])\b",
                           " ".join(str(entry.get(k) or "") for k in ("launch_command", "other_settings", "log")))
        if runner:
            flags += ["--use-v2-model-runner" if runner.group(1) == "1" else "--no-use-v2-model-runner"]
        dcp = first_int(nda.get("decode_context_parallel_size", entry.get("decode_context_parallel_size")))
        single_dcp = re.fullmatch(r"\s*\d+\s*", str(entry.get("decode_context_parallel_size", "")))
        if dcp and dcp > 1 and (single_dcp or "decode_context_parallel_size" in nda):
            flags += ["--decode-context-parallel-size", str(dcp)]
    else:
        running = stated("max_running_requests", r"max[-_ ]running[-_ ]requests\W{0,3}(\d+)")
        total = stated("max_total_tokens", r"max[-_ ]total[-_ ]tokens\W{0,3}(\d+)")
        page = stated("page_size", r"page[-_ ]size\W{0,3}(\d+)")
        if running:
            flags += ["--max-running-requests", str(running)]
        if total:
            flags += ["--max-total-tokens", str(total)]
        if page:
            flags += ["--page-size", str(page)]
    return flags


def weight_flags(entry: dict, nda: dict, kv: str | None) -> tuple[list[str], str | None]:
    """--weight-dtype for online fp8 (`quantization: fp8` on a bf16 checkpoint) and an explicit fp32/fp16 dtype.

    The checkpoint's own quantization (compressed-tensors, gptq, mxfp4, modelopt...) is read from its config.json
    and never overridden. Returns (flags, kv dtype implied by dtype when the KV dtype is auto)."""
    quant = str(nda.get("quantization") or entry.get("quantization") or "").strip().lower()
    dtype = str(nda.get("dtype") or entry.get("dtype") or "").lower()
    if quant in ("fp8",):
        return ["--weight-dtype", "fp8"], None
    if quant in ("", "none", "null") and re.match(r"(torch\.)?(float32|float16)\b", dtype):
        d = "fp32" if "32" in dtype.split()[0] else "fp16"
        return ["--weight-dtype", d], (d if kv is None else None)
    return [], None


# ---------------------------------------------------------------------------------------------- GPU
VENDOR = {"nvidia", "geforce", "tesla", "amd", "instinct"}


def resolve_gpu(entry: dict) -> tuple[str | None, int | None, str]:
    """('H100-SXM-80GB', count, '') or (None, None, why) from the entry's free-text `gpus`."""
    text = str(entry.get("gpus") or "")
    head = text.split("(")[0].split(",")[0].strip()
    if "+" in head:
        return None, None, f"mixed GPUs ({head})"
    m = re.match(r"(\d+)\s*x\s*(.+)", head)
    if not m:
        return None, None, f"GPU type not stated ({head or text[:40]})"
    count, name = int(m.group(1)), m.group(2).strip()
    words = name.replace("-", " ").split()
    plain = [w for w in words if w.lower() not in VENDOR]
    tried = []
    for seq in (words, plain):
        for n in range(len(seq), 0, -1):
            cand = " ".join(seq[:n])
            if cand in tried or NUMBER.fullmatch(cand) or re.fullmatch(r"[\d.]+\s*[GT]i?B", cand, re.I):
                continue
            tried.append(cand)
            try:
                gpu = gpus.resolve_gpu(cand).gpu
            except Exception:  # noqa: BLE001 - any refusal means "not this candidate"
                continue
            if gpu.vendor == "generic":
                continue
            size = re.search(r"(\d+)\s*G", name)
            if size and gpu.nvml_bytes and abs(gpu.nvml_bytes / GiB - int(size.group(1))) > 0.15 * int(size.group(1)):
                continue  # the name matched a board of another memory size
            sizes = [g.name for g in gpus.load_catalog() if _stem(g.name) == _stem(gpu.name)]
            if not size and len(sizes) > 1:
                return None, None, f"memory size not stated ({name}: the catalog has {', '.join(sizes)})"
            return gpu.name, count, ""
    return None, None, f"unknown GPU '{name}'"


def _stem(board: str) -> str:
    """'H20-141GB' -> 'H20': boards that differ only in memory size."""
    return re.sub(r"-\d+GB$", "", board)


# ---------------------------------------------------------------------------------------------- model
def model_ref(entry: dict) -> tuple[str | None, str]:
    model = str(entry.get("model") or "").strip()
    if not HUB_ID.fullmatch(model):
        return None, "no exact Hub id in the entry"
    if catalog.lookup(model):
        return model, "bundled"
    path = CONFIGS / model.replace("/", "--") / "config.json"
    if path.is_file():
        return str(path.relative_to(ROOT)), "wild-configs"
    aic = ROOT / "tests" / "data" / "aic-configs" / f"{model.replace('/', '--')}_config.json"
    if aic.is_file():  # aiconfigurator's copies of Hub configs (tests/data/aic-configs/SOURCES.md)
        return str(aic.relative_to(ROOT)), "aic-configs"
    for d in CONFIGS.glob("*"):  # Hub ids are case-insensitive (redhatai/ vs RedHatAI/)
        if d.name.lower() == model.replace("/", "--").lower() and (d / "config.json").is_file():
            return str((d / "config.json").relative_to(ROOT)), "wild-configs"
    return None, "no config.json (not bundled, not in tests/data/wild-configs)"


# ---------------------------------------------------------------------------------------------- log figures
def logged(entry: dict, engine: str) -> dict:
    log = entry.get("log") or ""
    out: dict = {}
    if engine.startswith("sglang"):
        toks = re.findall(r"max_total_num_tokens\s*=\s*([\d,]+)", log) or re.findall(r"#tokens:\s*([\d,]+)", log)
        k = re.findall(r"\bK size:\s*([\d.]+)\s*GB", log)
        v = re.findall(r"\bV size:\s*([\d.]+)\s*GB", log)
        kv = re.findall(r"\bKV size:\s*([\d.]+)\s*GB", log)
        if k and v:
            out["kv_gib"] = float(k[0]) + float(v[0])
        elif kv:
            out["kv_gib"] = float(kv[0])
        w = re.findall(r"Load weight end\..*?mem usage=([\d.]+)\s*GB", log)
        if w:
            out["weights_gib"] = float(w[0])
    else:
        toks = re.findall(r"GPU KV cache size:\**\s*([\d,]+)\s*tokens", log)
        avail = re.findall(r"Available KV cache memory:\**\s*(-?[\d.]+)\s*GiB", log)
        if not avail:  # a refused start-up states its budget in the error instead
            avail = re.findall(r"available KV cache memory \((-?[\d.]+) GiB\)", log)
        if avail:
            out["kv_gib"] = float(avail[0])
        mml = re.findall(r"estimated maximum model length is (\d+)", log)
        if mml:
            out["log_max_len"] = int(mml[0])
        w = re.findall(r"(?:Model loading took|Loading model weights took)\s*([\d.]+)\s*(?:GiB|GB)", log)
        if w:
            out["weights_gib"] = float(w[0])
        for key, pattern in (("act_gib", r"torch peak memory increase:\s*([\d.]+)\s*GiB"),
                             ("nontorch_gib", r"non-torch forward increase memory:\s*([\d.]+)\s*GiB"),
                             ("graphs_gib", r"CUDA graph pool memory:\s*([\d.]+)\s*GiB \(actual\)"),
                             ("graphs_gib", r"Graph capturing finished in [\d.]+ secs?, took\s*([\d.]+)\s*GiB")):
            m = re.search(pattern, log)
            if m and key not in out:
                out[key] = float(m.group(1))
    out["log_refused"] = bool(re.search(r"ValueError|EngineCore failed to start|RuntimeError", log))
    values = [int(t.replace(",", "")) for t in toks]
    if values:
        out["tokens"] = values[0]
        if len(set(values)) > 1:
            out["tokens_note"] = f"{len(set(values))} different token lines; first used"
    return out


# ---------------------------------------------------------------------------------------------- run one
def source_of(entry: dict) -> str:
    """The independent source a log belongs to, for leave-one-source-out: an issue or PR thread, else the
    repository (a sweep committed to one repository is one source), else the search index's file id."""
    src = entry.get("source") or {}
    if src.get("kind") in ("issue", "pull request") and src.get("url"):
        return str(src["url"]).split("#")[0]
    repo = str(src.get("repo") or "")
    if repo and not repo.startswith("not resolved"):
        return repo
    m = re.search(r"id (\d+)", repo)
    return f"index file {m.group(1)}" if m else str(src.get("url") or repo or entry["id"])


def build_args(entry: dict) -> tuple[list[str] | None, dict]:
    info: dict = {"id": entry["id"], "model": entry.get("model"), "source": source_of(entry)}
    ref, how = model_ref(entry)
    if ref is None:
        info["skip"] = how
        return None, info
    info["config"] = how
    engine, engine_note = engine_spec(entry)
    info["engine"], info["engine_note"] = engine, engine_note
    gpu, count, why = resolve_gpu(entry)
    if gpu is None:
        info["skip"] = why
        return None, info
    tp = first_int(entry.get("tp")) or 1
    pp = first_int(entry.get("pp")) or 1
    dp = first_int(entry.get("dp")) or 1
    if count != tp * pp * dp:
        info["note_gpu"] = f"log names {count} GPUs, tp*pp*dp = {tp * pp * dp}"
    info["gpu"], info["tp"], info["pp"] = f"{tp * pp}x{gpu}", tp, pp
    nda = non_default_args(entry)
    args = ["fit", ref, "--gpu", info["gpu"], "--tp", str(tp), "--pp", str(pp), "--engine", engine, "--offline", "--json"]
    if engine.startswith("vllm"):
        gmu = first_number(nda.get("gpu_memory_utilization", entry.get("gpu_memory_utilization")))
        length = first_int(nda.get("max_model_len", entry.get("max_model_len")))
        if gmu:
            args += ["--gpu-memory-utilization", str(gmu)]
        if length:
            args += ["--max-model-len", str(length), "--ctx", str(length)]
    else:
        msf = first_number(nda.get("mem_fraction_static", entry.get("mem_fraction_static")))
        length = first_int(nda.get("context_length", entry.get("context_length")))
        if msf is not None and 0 < msf < 1 and re.match(r"\s*[\d.]+", str(entry.get("mem_fraction_static", msf))):
            args += ["--mem-fraction-static", str(msf)]
        if length:
            args += ["--context-length", str(length), "--ctx", str(length)]
    kv = kv_dtype(entry, nda)
    wflags, implied_kv = weight_flags(entry, nda, kv)
    kv = kv or implied_kv
    if kv:
        args += ["--kv-dtype", kv]
    args += wflags + knob_flags(entry, nda, engine)
    if dp > 1:
        info["note_dp"] = f"dp={dp}: one replica of tp*pp GPUs predicted"
    return args, info


def kvplan_process(python: str, evidence_path: str | None = None):
    """A runner of `kvplan ARGS` in a child interpreter: (exit code, stdout, stderr). evidence_path: the budget
    evidence kvplan reads (a file with one source left out, for leave-one-source-out), else the committed one."""
    env = dict(os.environ)
    if evidence_path:
        env[EVIDENCE_VARIABLE] = evidence_path

    def call(args: list[str]) -> tuple[int, str, str]:
        proc = subprocess.run([python, "-m", "kvplan", *args], capture_output=True, text=True, cwd=ROOT, timeout=300,
                              env=env)
        return proc.returncode, proc.stdout, proc.stderr
    return call


def run(entry: dict, python: str, evidence_path: str | None = None, call=None) -> dict:
    """One log through `kvplan fit` (call: a runner as kvplan_process returns; by default a child interpreter)."""
    args, info = build_args(entry)
    info.update(logged(entry, info.get("engine", entry.get("engine", "vllm"))))
    if args is None:
        return info
    info["flags"] = " ".join(args[2:])
    code, out, errors = (call or kvplan_process(python, evidence_path))([*args, "--no-calibration"])
    if code != 0:
        msg = (errors.strip().splitlines() or ["(no message)"])[-1]
        info["skip"] = f"kvplan exit {code}: {msg.removeprefix('kvplan: error: ')}"
        return info
    data = json.loads(out)
    if data.get("errors"):
        info["skip"] = f"kvplan: {data['errors'][0]}"
        return info
    r = data["results"][0]
    info["pred_tokens"] = r.get("kv_capacity_tokens")
    info["pred_kv_gib"] = r["kv_budget_bytes"] / GiB if r.get("kv_budget_bytes") is not None else None
    info["pred_kv_bytes"] = r.get("kv_budget_bytes")
    info["pred_tokens_range"] = r.get("kv_capacity_tokens_range")
    info["model_kind"] = r.get("model_kind")
    # the budget model's own figure: the printed budget less the shift the evidence applied
    info["raw_kv_bytes"] = min(b["kv_bytes"] - sum(p["bytes"] for p in b["parts"] if p.get("key") == "evidence")
                               for b in r["budget"]) if r.get("budget") else None
    info["would_start"] = r.get("engine_would_start")
    info["start_msg"] = r.get("engine_start_message")
    info["resolved_engine"] = data.get("engine")
    parts = dict((p["what"], p["bytes"]) for p in (r.get("budget") or [{}])[0].get("parts", []))
    info["pred_requested_gib"] = next((v for k, v in parts.items() if k.startswith("requested")), 0) / GiB or None
    info["pred_act_gib"] = -parts.get("activation peak (estimate)", 0) / GiB
    info["pred_nontorch_gib"] = -parts.get("non-torch memory (estimate)", 0) / GiB
    info["pred_graphs_gib"] = -parts.get("CUDA graphs (estimate)", 0) / GiB
    # vLLM's "Model loading took" counts the rotary tables built with the model: compared with weights + tables
    rope = -sum(v for k, v in parts.items() if k.startswith("rotary"))
    info["pred_weights_gib"] = (r["weight_bytes"] + rope) / GiB if r.get("weight_bytes") is not None else None
    info["pred_other_gib"] = sum(-v for k, v in parts.items()
                                 if not k.startswith(("requested", "weights", "rotary"))) / GiB
    if info.get("kv_gib") is not None and info.get("weights_gib") is not None and info["pred_requested_gib"]:
        # what the engine spent besides weights and KV, inferred from the two figures it printed
        info["log_other_gib"] = info["pred_requested_gib"] - info["weights_gib"] - info["kv_gib"]
    return info


# ---------------------------------------------------------------------------------------------- report
def fmt(x, spec=".2f") -> str:
    return "-" if x is None else format(x, spec)


def err(pred, log) -> float | None:
    if pred is None or log in (None, 0):
        return None
    return (pred - log) / log * 100


def _cause(r: dict) -> str:
    """The largest of the budget terms kvplan got wrong (GiB, predicted - logged; + means kvplan charged more)."""
    deltas = {}
    if r.get("weights_gib") is not None and r.get("pred_weights_gib") is not None:
        deltas["weights"] = r["pred_weights_gib"] - r["weights_gib"]
    if r.get("act_gib") is not None:
        deltas["activation peak"] = r["pred_act_gib"] - r["act_gib"]
    if r.get("nontorch_gib") is not None:
        deltas["non-torch"] = r["pred_nontorch_gib"] - r["nontorch_gib"]
    if "activation peak" not in deltas and r.get("log_other_gib") is not None:
        deltas["activation+non-torch+graphs (not itemised in log)"] = r["pred_other_gib"] - r["log_other_gib"]
    if not deltas:
        return "no budget figures in the log"
    key = max(deltas, key=lambda k: abs(deltas[k]))
    return f"{key} {deltas[key]:+.2f} GiB"


def _breakdown(done: list[dict]) -> list[str]:
    rows = [r for r in done if abs(err(r["pred_tokens"], r["tokens"])) > 1]
    if not rows:
        return []
    out = [
        "",
        "### Budget breakdown where |err| > 1 % (GiB per GPU, log / kvplan)",
        "",
        "Logged activation and non-torch terms are vLLM's DEBUG 'torch peak memory increase' and 'non-torch forward "
        "increase memory'; 'other' = requested - weights - available KV (log) vs kvplan's non-weight parts. "
        "CUDA graphs are charged to the KV budget only from vLLM 0.21 on (kvplan charges them there too).",
        "",
        "| id | err % | weights | activation peak | non-torch | CUDA graphs | other (sum) | largest miss (kvplan - log) |",
        "|---|---:|---|---|---|---|---|---|",
    ]
    for r in sorted(rows, key=lambda r: -abs(err(r["pred_tokens"], r["tokens"]))):
        out.append(
            f"| {r['id']} | {err(r['pred_tokens'], r['tokens']):+.1f} | {fmt(r.get('weights_gib'))} / {fmt(r.get('pred_weights_gib'))} "
            f"| {fmt(r.get('act_gib'))} / {fmt(r.get('pred_act_gib'))} | {fmt(r.get('nontorch_gib'))} / {fmt(r.get('pred_nontorch_gib'))} "
            f"| {fmt(r.get('graphs_gib'))} / {fmt(r.get('pred_graphs_gib'))} | {fmt(r.get('log_other_gib'))} / {fmt(r.get('pred_other_gib'))} "
            f"| {_cause(r)} |"
        )
    return out


def _stats(errors: list[float]) -> str:
    absolute = sorted(abs(x) for x in errors)
    return (f"median |err| {statistics.median(absolute):.1f} %, mean signed {statistics.mean(errors):+.1f} %, "
            f"within 1 %: {sum(a <= 1 for a in absolute)}, within 3 %: {sum(a <= 3 for a in absolute)}, "
            f"within 10 %: {sum(a <= 10 for a in absolute)}, worst {max(errors, key=abs):+.1f} %")


def report(rows: list[dict]) -> str:
    done = [r for r in rows if "skip" not in r and r.get("tokens") is not None and r.get("pred_tokens") is not None]
    ran_no_tokens = [r for r in rows if "skip" not in r and r not in done]
    skipped = [r for r in rows if "skip" in r]
    lines = [
        "# kvplan KV-token prediction vs public engine logs (tests/data/wild-logs.yaml)",
        "",
        "Prediction: `kvplan fit ... --json --offline` with no `--kv-budget`; error = (predicted - logged) / logged.",
        "KV GiB: vLLM 'Available KV cache memory' / SGLang K+V size, vs kvplan `kv_budget_bytes` (per GPU).",
        "Weights GiB: vLLM 'Model loading took' / SGLang 'Load weight end ... mem usage', vs kvplan `weight_bytes` (per GPU; "
        "for vLLM plus the rotary cos/sin tables it builds with the model, which its figure includes).",
        "",
        f"## Evaluated ({len(done)} of {len(rows)} entries)",
        "",
        "| id | source | model | GPU | engine (resolved) | logged tokens | predicted tokens | err % | KV GiB log / pred | weights GiB log / pred | notes |",
        "|---|---|---|---|---|---:|---:|---:|---|---|---|",
    ]
    errors = []
    for r in done:
        e = err(r["pred_tokens"], r["tokens"])
        errors.append(e)
        notes = "; ".join(x for x in (r.get("engine_note"), r.get("note_gpu"), r.get("note_dp"), r.get("tokens_note"),
                                      "" if r.get("would_start", True) else "kvplan: engine would not start") if x)
        lines.append(
            f"| {r['id']} | {r['source'][:40]} | {r['model']} | {r['gpu']} | {r['engine']} ({r.get('resolved_engine')}) | {r['tokens']:,} "
            f"| {r['pred_tokens']:,} | {e:+.1f} | {fmt(r.get('kv_gib'))} / {fmt(r.get('pred_kv_gib'))} "
            f"| {fmt(r.get('weights_gib'))} / {fmt(r.get('pred_weights_gib'))} | {notes} |"
        )
    if errors:
        lines += ["", f"Token error over all {len(errors)} entries (with the committed evidence, which holds them: "
                  f"bench/budget_loso.py scores each with its own source left out): {_stats(errors)}."]
    lines += _breakdown(done)
    lines += ["", "Flags passed (per evaluated entry):", ""]
    lines += [f"- `{r['id']}`: `kvplan fit {r['flags']}`" for r in done + ran_no_tokens]
    if ran_no_tokens:
        lines += [
            "",
            f"## kvplan ran, but the log prints no KV token count ({len(ran_no_tokens)})",
            "",
            "| id | model | GPU | engine | KV GiB log / pred | weights GiB log / pred | predicted tokens | engine started (log) | kvplan: would start |",
            "|---|---|---|---|---|---|---:|---|---|",
        ]
        for r in ran_no_tokens:
            start = "yes" if r.get("would_start") else f"no ({(r.get('start_msg') or '')[:120]})"
            lines.append(
                f"| {r['id']} | {r['model']} | {r['gpu']} | {r['engine']} | {fmt(r.get('kv_gib'))} / "
                f"{fmt(r.get('pred_kv_gib'))} | {fmt(r.get('weights_gib'))} / {fmt(r.get('pred_weights_gib'))} "
                f"| {fmt(r.get('pred_tokens'), ',')} | {'no (refused)' if r.get('log_refused') else '?'}"
                f"{'; engine: max len ' + format(r['log_max_len'], ',') if r.get('log_max_len') else ''} | {start} |"
            )
    lines += ["", f"## Why skipped ({len(skipped)})", ""]
    for r in skipped:
        lines.append(f"- `{r['id']}` ({str(r['model'])[:70]}): {r['skip']}")
    return "\n".join(lines) + "\n"


def evidence(rows: list[dict], leave_out: str | None = None) -> dict:
    """Per engine, kvplan's raw KV budget estimate minus the printed one (bytes) for every log that prints a budget
    and that kvplan predicted, with what classes it: kvplan/data/budget_evidence.json (kvplan/evidence.py reads it).
    leave_out: a source whose logs are left out (the leave-one-source-out evaluation)."""
    engines: dict[str, dict] = {}
    for r in sorted(rows, key=lambda r: r["id"]):
        if r.get("skip") or r.get("raw_kv_bytes") is None or r.get("kv_gib") is None or r["source"] == leave_out:
            continue
        engine, _, version = str(r.get("resolved_engine") or r.get("engine") or "").partition("@")
        asked = str(r.get("engine") or "").partition("@")[2]
        gpu = gpus.resolve_gpu(r["gpu"].split("x", 1)[1]).gpu
        row = engines.setdefault(engine, {"cases": {}})
        # a weight miss is the model's (tests/test_wild_budget.py WEIGHT_MISSES), not its class's: where the log
        # prints the weights as loaded, the error kept is that of the memory besides weights and KV
        weights_miss = (round((r["pred_weights_gib"] - r["weights_gib"]) * GiB)
                        if r.get("weights_gib") is not None and r.get("pred_weights_gib") is not None else 0)
        row["cases"][r["id"]] = {"error_bytes": int(r["raw_kv_bytes"]) - round(r["kv_gib"] * GiB) + weights_miss,
                                 "source": r["source"], "version": asked, "gpu": gpu.name, "tier": gpu.tier,
                                 "interconnect": gpu.interconnect, "tp": int(r.get("tp") or 1),
                                 "pp": int(r.get("pp") or 1), "kind": r.get("model_kind") or "dense"}
    return {"engines": engines}


def write_evidence(rows: list[dict]) -> Path:
    """kvplan/data/budget_evidence.json, indented as committed (its fields: kvplan/data/README.md)."""
    from kvplan import evidence as evidence_file

    path = evidence_file.EVIDENCE_PATH
    path.write_text(json.dumps(evidence(rows), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ids", nargs="*", help="only these entry ids")
    ap.add_argument("--jobs", type=int, default=4, help="kvplan processes at once (default 4)")
    ap.add_argument("--python", default=sys.executable, help="interpreter that runs kvplan")
    ap.add_argument("--json", action="store_true", help="print the raw rows as JSON instead of markdown")
    ap.add_argument("--evidence", action="store_true", help="write kvplan/data/budget_evidence.json (the interval fit "
                    "prints beside an estimated budget)")
    opts = ap.parse_args()
    entries = yaml.safe_load(LOGS.read_text())
    if opts.ids:
        entries = [e for e in entries if e["id"] in set(opts.ids)]
    with ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
        rows = list(pool.map(lambda e: run(e, opts.python), entries))
    if opts.evidence:
        print(f"wrote {write_evidence(rows)}")
        return
    print(json.dumps(rows, indent=1, default=str) if opts.json else report(rows), end="")


if __name__ == "__main__":
    main()
