"""kvplan's own KV-token prediction (no --kv-budget) against public engine start-up logs.

    python bench/budget_eval.py [--ids ID ...] [--jobs 4] > budget_eval.md   # the full report
    python bench/budget_eval.py --docs [--check]                               # writes docs/accuracy.md
    python bench/budget_eval.py --evidence                                     # writes kvplan/data/budget_evidence.json

For every entry of tests/data/wild-logs.yaml whose `model` kvplan can size offline (a bundled alias / Hub id, or
a genuine config.json under tests/data/wild-configs/<org>--<name>/), run `kvplan fit MODEL --json --offline` with
the log's GPU, tp/pp, engine@version, gpu_memory_utilization / mem_fraction_static, max_model_len (= --ctx),
KV dtype and every other knob the entry states that kvplan accepts; read the printed figures out of the log text by
regex (never typed in) and print a markdown table of logged vs predicted tokens, KV GiB and weight GiB, followed by
the entries that could not be evaluated and why. Nothing is asserted; this script only reports.
"""

from __future__ import annotations

import argparse
import json
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
SPLIT = ROOT / "tests" / "data" / "wild-split.yaml"
GiB = 1 << 30

sys.path.insert(0, str(ROOT))
from kvplan import catalog, gpus  # noqa: E402  (read-only look-ups: alias table and GPU catalog)
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
            return gpu.name, count, ""
    return None, None, f"unknown GPU '{name}'"


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
def build_args(entry: dict) -> tuple[list[str] | None, dict]:
    info: dict = {"id": entry["id"], "model": entry.get("model")}
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
    info["gpu"], info["tp"] = f"{tp * pp}x{gpu}", tp
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


def run(entry: dict, python: str) -> dict:
    args, info = build_args(entry)
    info.update(logged(entry, info.get("engine", entry.get("engine", "vllm"))))
    if args is None:
        return info
    info["flags"] = " ".join(args[2:])
    proc = subprocess.run([python, "-m", "kvplan", *args, "--no-calibration"], capture_output=True, text=True, cwd=ROOT, timeout=300)
    if proc.returncode != 0:
        msg = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        info["skip"] = f"kvplan exit {proc.returncode}: {msg.removeprefix('kvplan: error: ')}"
        return info
    data = json.loads(proc.stdout)
    if data.get("errors"):
        info["skip"] = f"kvplan: {data['errors'][0]}"
        return info
    r = data["results"][0]
    info["pred_tokens"] = r.get("kv_capacity_tokens")
    info["pred_kv_gib"] = r["kv_budget_bytes"] / GiB if r.get("kv_budget_bytes") is not None else None
    info["pred_kv_bytes"] = r.get("kv_budget_bytes")
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
    split = yaml.safe_load(SPLIT.read_text()) if SPLIT.is_file() else {}
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
        "| id | split | model | GPU | engine (resolved) | logged tokens | predicted tokens | err % | KV GiB log / pred | weights GiB log / pred | notes |",
        "|---|---|---|---|---|---:|---:|---:|---|---|---|",
    ]
    errors = []
    for r in done:
        e = err(r["pred_tokens"], r["tokens"])
        errors.append(e)
        notes = "; ".join(x for x in (r.get("engine_note"), r.get("note_gpu"), r.get("note_dp"), r.get("tokens_note"),
                                      "" if r.get("would_start", True) else "kvplan: engine would not start") if x)
        lines.append(
            f"| {r['id']} | {split.get(r['id'], '-')} | {r['model']} | {r['gpu']} | {r['engine']} ({r.get('resolved_engine')}) | {r['tokens']:,} "
            f"| {r['pred_tokens']:,} | {e:+.1f} | {fmt(r.get('kv_gib'))} / {fmt(r.get('pred_kv_gib'))} "
            f"| {fmt(r.get('weights_gib'))} / {fmt(r.get('pred_weights_gib'))} | {notes} |"
        )
    if errors:
        lines += ["", f"Token error over all {len(errors)} entries: {_stats(errors)}."]
        for side in ("calibrate", "holdout"):
            part = [err(r["pred_tokens"], r["tokens"]) for r in done if split.get(r["id"]) == side]
            if part:
                lines.append(f"- {side} ({len(part)}, tests/data/wild-split.yaml): {_stats(part)}.")
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


def split_tables(rows: list[dict]) -> str:
    """docs/accuracy.md's two tables (calibration part, held-out part): id, GPU, engine, logged and predicted tokens."""
    split = yaml.safe_load(SPLIT.read_text())
    done = [r for r in rows if "skip" not in r and r.get("tokens") is not None and r.get("pred_tokens") is not None]
    out = []
    for side, title in (("calibrate", "Calibration part (fixed the constants)"), ("holdout", "Held-out part")):
        part = [r for r in done if split.get(r["id"]) == side]
        errors = [err(r["pred_tokens"], r["tokens"]) for r in part]
        out += [f"{title}: {len(part)} logs; {_stats(errors)}.", "",
                "| log (tests/data/wild-logs.yaml) | GPU | engine | logged tokens | predicted | error |",
                "|---|---|---|---:|---:|---:|"]
        for r, e in sorted(zip(part, errors), key=lambda p: -abs(p[1])):
            out.append(f"| {r['id']} | {r['gpu']} | {r.get('resolved_engine')} | {r['tokens']:,} | {r['pred_tokens']:,} "
                       f"| {e:+.1f}% |")
        out.append("")
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------- docs/accuracy.md
DOCS = ROOT / "docs" / "accuracy.md"
ENGINE_LOGS = ROOT / "tests" / "data" / "engine-logs.yaml"
# held-out cases that led to rules read from vLLM's source (rotary tables, towers over tp, the fused-MoE scratch):
# no longer blind, so the page also counts the held-out part without them
NO_LONGER_BLIND = ("vllm-llama-4-scout-17b-16e-instruct-h100-80gb-tp4-len8192", "vllm-qwen3-30b-a3b-h100-80gb-tp1-len8192")


def engine_log_rows(python: str) -> list[dict]:
    """The engine-log cases of tests/test_budget_predictions.py (a log stating GPU and weights): kvplan's KV tokens
    with no --kv-budget against the tokens the log printed."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_budget_predictions import CASES  # noqa: E402  (the cases and flags the test holds to their bound)

    logs = {c["id"]: c["log"] for c in yaml.safe_load(ENGINE_LOGS.read_text())}
    out = []
    for cid, args, _bound in CASES:
        m = re.search(r"GPU KV cache size: ([\d,]+) tokens|#tokens: (\d+)", logs[cid])
        logged_tokens = int((m.group(1) or m.group(2)).replace(",", ""))
        proc = subprocess.run([python, "-m", "kvplan", "fit", *args, "--json", "--no-calibration"], capture_output=True,
                              text=True, cwd=ROOT, timeout=300, check=True)
        predicted = json.loads(proc.stdout)["results"][0]["kv_capacity_tokens"]
        out.append({"id": cid, "args": args, "logged": logged_tokens, "predicted": predicted})
    return out


def _held_out_count(rows: list[dict], drop: tuple[str, ...] = ()) -> tuple[int, int]:
    split = yaml.safe_load(SPLIT.read_text())
    held = [r for r in rows if "skip" not in r and r.get("tokens") is not None and r.get("pred_tokens") is not None
            and split.get(r["id"]) == "holdout" and r["id"] not in drop]
    return sum(abs(err(r["pred_tokens"], r["tokens"])) <= 3 for r in held), len(held)


def docs_page(rows: list[dict], python: str) -> str:
    """docs/accuracy.md: every figure on it comes from this run (the template's prose states the method)."""
    sys.path.insert(0, str(ROOT / "tests"))
    from test_wild_budget import KNOWN_MISSES  # noqa: E402  (the held-out misses and what their logs show)

    from kvplan import evidence as budget_evidence
    from kvplan.engines import overhead

    split = yaml.safe_load(SPLIT.read_text())
    done = [r for r in rows if "skip" not in r and r.get("tokens") is not None and r.get("pred_tokens") is not None]
    within, held = _held_out_count(rows)
    within_blind, held_blind = _held_out_count(rows, NO_LONGER_BLIND)
    target = "met" if within >= 0.8 * held else "not met"
    misses = sorted((r for r in done if split.get(r["id"]) == "holdout" and abs(err(r["pred_tokens"], r["tokens"])) > 3),
                    key=lambda r: -abs(err(r["pred_tokens"], r["tokens"])))
    by_id = {r["id"]: r for r in done}
    blind = "; ".join(f"{cid} {err(by_id[cid]['pred_tokens'], by_id[cid]['tokens']):+.1f}%" for cid in NO_LONGER_BLIND
                      if cid in by_id)
    lines = [
        "# Accuracy: capacity predictions against engine logs",
        "",
        "<!-- Generated by `python bench/budget_eval.py --docs` from tests/data; do not edit by hand. "
        "tests/test_docs.py fails when it is out of date. -->",
        "",
        "## What is predicted",
        "",
        "Given the KV memory an engine printed (`--kv-budget`), kvplan reproduces every printed token count, block "
        "count and concurrency of the engine logs in `tests/data/engine-logs.yaml` within print precision "
        "(`tests/test_fit_logs.py`). Without it, `kvplan fit` models the budget: vLLM `total x "
        "gpu_memory_utilization - weights - activation peak - non-torch - CUDA graphs (from 0.21)`; SGLang "
        "`mem_fraction_static x free-after-init - weights` (a Mamba hybrid's state pool then takes `r / (1 + r)` of "
        "it before the token pool); TensorRT-LLM `free_gpu_memory_fraction x (total - weights - activation - "
        "context)` (a Mamba hybrid's state buffers for `max_batch_size` slots counted with the weights); llama.cpp "
        "`total - weights - compute buffer - 1 GiB margin`; transformers `total - weights - context - prefill "
        "activations`. The estimates and their provenance are in `kvplan/engines/overhead.py`. This page scores "
        "that budget model against public logs.",
        "",
        "## Engine logs that state GPU and weights",
        "",
        "The cases of `tests/test_budget_predictions.py`, which holds each to its bound. Cases marked *informed* set "
        "constants of the budget model; the others are out of sample.",
        "",
        "| case (tests/data/engine-logs.yaml) | `kvplan fit` flags | predicted tokens | logged | error |",
        "|---|---|---:|---:|---:|",
    ]
    informed = {"vllm-qwen2-7b-a100-80gb-tp1-gmu0.25"}
    for r in engine_log_rows(python):
        name = r["id"] + (" (*informed*)" if r["id"] in informed else "")
        lines.append(f"| {name} | `{' '.join(r['args'])}` | {r['predicted']:,} | {r['logged']:,} "
                     f"| {err(r['predicted'], r['logged']):+.1f}% |")
    lines += [
        "| vllm-mistral-small-3.2-24b-h100-block128 (*informed*: states activation 2.12 GiB, non-torch 0.14 GiB) "
        "| no bundled config (vision tower weights unknown) | - | 184,832 | not scored |",
        "| vllm-v0-llama-3.1-8b-rtx3090 | the V0 engine profiles at max_model_len tokens; not modelled | - | 1,952 blocks "
        "| not scored |",
        "| trtllm-llama-3.1-8b-fp8-h100 | `--max-tokens 860308` binds (reproduced exactly: 860,320) | - | - "
        "| not a budget case |",
        "",
        "Misses, measured: gpt-oss-120b's weights per GPU are 15.21 GiB in the checkpoint's MXFP4 format, but vLLM "
        "logged 17.22 GiB on A100 (Marlin repacking), so kvplan overstates the budget there; SGLang's free memory "
        "after NCCL init with tp 4 is about 1.4 GiB lower than the estimate (`CUDA_CONTEXT_BYTES + NCCL_BYTES`), "
        "which is the whole of the SGLang case's error. Qwen2-7B is planned with the Qwen2.5-7B config (same layers, "
        "heads, widths and vocabulary).",
        "",
        "## From the GPU alone: the held-out evaluation",
        "",
        f"`tests/data/wild-logs.yaml` holds {len(rows)} public start-up logs of vLLM and SGLang (issue trackers, "
        "benchmark repositories, executed notebooks of the SGLang docs site; source, GPU, model, version and settings "
        f"of each). {len(done)} of them can be predicted here; the others name a model whose genuine config.json "
        "could not be found (`tests/data/wild-configs/SOURCES.yaml` lists what was found and where), no exact Hub id, "
        "a GPU the catalog lacks, or print no token count (`python bench/budget_eval.py` lists each with its reason). "
        "The logs are split by a hash of source and model (`tests/data/wild-split.yaml`); a new log takes its side by "
        "the same rule, whatever its result. One constant is fitted on the calibration part only: vLLM 0.19+'s "
        f"non-torch memory under tensor parallelism, {overhead.VLLM_TP_NON_TORCH_BYTES / GiB:.2f} GiB per GPU (the "
        "mean of its three tp >= 2 cases; `overhead.VLLM_TP_NON_TORCH_BYTES`). Bugs and engine rules the evaluation "
        "exposes are fixed as such, not fitted, and a held-out case that showed one is no longer blind.",
        "",
        f"**The target (80% of the held-out part within 3%) is {target}: {within} of {held} "
        f"({100 * within / held:.0f}%).** Two held-out cases are no longer blind: Llama-4-Scout on 4 H100 and "
        "Qwen3-30B-A3B on one H100 led to three rules read in vLLM's source (the rotary cos/sin tables vLLM builds "
        "with the model, `kvplan/architectures/rope.py`, which vLLM's CPU build confirms on every oracle model that "
        "starts, `tests/test_engine_vllm.py`; vision-tower linears split over tensor parallelism, vLLM's default "
        "`mm_encoder_tp_mode` \"weights\"; the fused-MoE scratch held in vLLM's persistent workspace through the "
        f"profile run from 0.13, `overhead.vllm_moe_workspace`). Their errors: {blind}; without them the count is "
        f"{within_blind} of {held_blind} ({100 * within_blind / held_blind:.0f}%). `tests/test_wild_budget.py` holds "
        "every case to its row and the held-out count to the target.",
        "",
        split_tables(rows).rstrip("\n"),
        "",
        "The held-out cases beyond 3%, with what their logs show (`tests/test_wild_budget.py` KNOWN_MISSES):",
        "",
    ]
    for r in misses:
        why = KNOWN_MISSES.get(r["id"], (None, "not explained"))[1]
        lines.append(f"- `{r['id']}` ({err(r['pred_tokens'], r['tokens']):+.1f}%): {why}.")
    lines += [
        "",
        "## The range `fit` prints beside an estimate",
        "",
        "Every budget `fit` prints says where it came from (`flag`, `calibrated`, `estimated`) and, unless it was "
        "given, the range the evidence supports (\"likely\"; `kv_budget_range_bytes` and `kv_capacity_tokens_range` "
        "in JSON): for a calibration its printed precision, for an estimate the 10th to 90th percentile of how far "
        "the engine's printed budget fell from kvplan's estimate over the public logs kvplan predicts "
        "(`kvplan/data/budget_evidence.json`, written by `python bench/budget_eval.py --evidence` and held to the "
        "code by `tests/test_wild_budget.py`). Today:",
        "",
    ]
    for engine in ("vllm", "sglang"):
        ev = budget_evidence.for_engine(engine)
        if ev is not None:
            lines.append(f"- {engine}: {ev.basis()}.")
    lines += [
        "",
        "`fit` also says where the evidence is thin or off for the GPU asked about, from each log's GPU and tp in "
        "the same file: no public log of the engine on that GPU (\"... unchecked on this GPU\"), logs on it outside "
        "the likely range (named, with their error; \"expect fewer tokens than estimated\" when all of them fell "
        "short), or none there with tensor parallelism.",
        "",
    ]
    return "\n".join(lines)


def evidence(rows: list[dict]) -> dict:
    """Per engine, kvplan's estimated KV budget minus the printed one (bytes) for every log that prints a budget
    and that kvplan predicted: kvplan/data/budget_evidence.json (kvplan/evidence.py reads it)."""
    engines: dict[str, dict] = {}
    for r in sorted(rows, key=lambda r: r["id"]):
        if r.get("skip") or r.get("pred_kv_bytes") is None or r.get("kv_gib") is None:
            continue
        engine = str(r.get("resolved_engine") or r.get("engine") or "").split("@")[0]
        row = engines.setdefault(engine, {"errors_bytes": {}, "setups": {}})
        row["errors_bytes"][r["id"]] = int(r["pred_kv_bytes"]) - round(r["kv_gib"] * GiB)
        row["setups"][r["id"]] = setup_of(r)
    return {"engines": engines}


def setup_of(r: dict) -> dict:
    """The catalog GPU and tensor parallelism of an evaluated row (what fit's per-GPU caution matches on)."""
    count, gpu = r["gpu"].split("x", 1)
    return {"gpu": gpu, "tp": int(r.get("tp") or 1)}


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
    ap.add_argument("--tables", action="store_true", help="print the calibration and held-out tables only")
    ap.add_argument("--docs", action="store_true", help="write docs/accuracy.md (every figure on it from this run)")
    ap.add_argument("--check", action="store_true", help="with --docs: exit 1 when docs/accuracy.md is out of date")
    ap.add_argument("--evidence", action="store_true", help="write kvplan/data/budget_evidence.json (the interval fit "
                    "prints beside an estimated budget)")
    opts = ap.parse_args()
    entries = yaml.safe_load(LOGS.read_text())
    if opts.ids:
        entries = [e for e in entries if e["id"] in set(opts.ids)]
    with ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
        rows = list(pool.map(lambda e: run(e, opts.python), entries))
    if opts.tables:
        print(split_tables(rows), end="")
        return
    if opts.docs:
        text = docs_page(rows, opts.python)
        if opts.check:
            if DOCS.read_text(encoding="utf-8") != text:
                sys.exit("docs/accuracy.md is out of date: run python bench/budget_eval.py --docs")
            return
        DOCS.write_text(text, encoding="utf-8")
        print(f"wrote {DOCS.relative_to(ROOT)}")
        return
    if opts.evidence:
        print(f"wrote {write_evidence(rows)}")
        return
    print(json.dumps(rows, indent=1, default=str) if opts.json else report(rows), end="")


if __name__ == "__main__":
    main()
