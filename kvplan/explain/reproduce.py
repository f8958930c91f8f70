"""From a read log to kvplan's own runs: the model, the GPU and the engine options the log states (or the user
gives), and `fit` at the printed KV budget's bounds. Each engine's module turns the runs into Findings."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import PurePosixPath
from typing import Any

from kvplan import catalog, gpus
from kvplan.errors import KvplanError
from kvplan.explain.common import GiB, LogFacts, Printed

GENERIC_TOTAL = 80 * GiB  # the device exact figures are computed on when the log names none (budgets are given)


@dataclass(frozen=True)
class Overrides:
    """What the user says that the log does not (or says wrongly): flags of `kvplan explain`."""

    model: str | None = None
    gpu: str | None = None
    engine: str | None = None
    kv_dtype: str | None = None
    ctx: int | None = None  # the context a log sized for, where it prints none (llama.cpp -c)
    tp: int | None = None
    offline: bool | None = None
    timeout: float | None = None


@dataclass
class Context:
    facts: LogFacts
    model: str | None  # the reference kvplan loads
    model_why: str  # where it came from, or why there is none
    gpu: gpus.GpuSelection
    gpu_known: bool
    gpu_why: str
    engine: str  # name@version as kvplan's --engine takes it
    offline: bool | None = None
    timeout: float | None = None
    notes: list[str] = field(default_factory=list)
    loaded: Any = None  # (ResolvedModel, ModelSpec): read once, or built from facts the log printed
    work: dict[str, Any] = field(default_factory=dict)  # an engine module's runs on this log, made once (vllm_log)
    ctx: int | None = None

    def model_options(self):
        from kvplan.sizing import ModelOptions

        return ModelOptions(self.model or "", offline=self.offline, timeout=self.timeout)

    def engine_options(self, **knobs: Any):
        from kvplan.sizing import EngineOptions

        f = self.facts
        merged = {**f.knobs, **knobs}
        merged = {k: v for k, v in merged.items() if k in _known_knobs(self.engine)}
        return EngineOptions(self.engine, f.kv_dtype if not (f.k_dtype or f.v_dtype) else None, f.k_dtype, f.v_dtype,
                             None, f.weight_dtype, f.tp, f.pp, _parsed(merged))

    def require_calibration_key(self, engine_name: str) -> None:
        """Refuse (one line) a calibration this log cannot file: no loadable model, no catalog GPU, no version."""
        from kvplan.errors import InputError

        if self.model is None:
            raise InputError(f"cannot save a calibration: {self.model_why}")
        if not self.gpu_known or self.gpu.gpu.vendor == "generic":
            raise InputError("cannot save a calibration: the log names no GPU in kvplan's catalog (give --gpu; kvplan "
                             "gpus lists them)")
        if "@" not in self.engine:
            tag = self.engine.split("@")[0]
            raise InputError(f"cannot save a calibration: the log states no {engine_name} version; give --engine "
                             f"{tag}@X.Y so it is filed under that version's budget rules")

    def load(self):
        """The model's config and spec, read once for every figure of the log (not once per figure)."""
        if self.loaded is None:
            from kvplan.sizing import load_spec

            self.loaded = load_spec(self.model_options())
        return self.loaded

    def fit(self, *, kv_budget: int | tuple[int, ...] | None, ctx: int | None = None, **knobs: Any):
        from kvplan import planner

        return planner.fit_model(self.model_options(), self.engine_options(**knobs), self.gpu, ctx,
                                 kv_budget=kv_budget, tp=self.facts.tp, pp=self.facts.pp, loaded=self.load())

    def size(self, ctx: int, **knobs: Any):
        from kvplan import sizing
        from kvplan.planner import gpu_context

        eo = self.engine_options(**knobs)
        # the GPU where the log or --gpu names one: some layouts depend on it (SGLang's DSA page on ROCm)
        gpu = gpu_context(self.gpu) if self.gpu_known else None
        s = sizing.setup(self.model_options(), eo, loaded=self.load(), gpu=gpu)
        return s, s.prepared.plan(ctx, 1)

    def command(self) -> str:
        """The `kvplan fit` command this explanation runs, for the user to rerun or change."""
        f = self.facts
        gpu = self.gpu.requested if self.gpu_known else "GPU"
        if f.engine == "llamacpp":  # a context per run, no budget: `size` is the command that sizes it
            parts = ["kvplan size", self.model or "MODEL", "--engine", self.engine]
            if f.runs and f.runs[0].ctx:
                parts += ["--ctx", str(f.runs[0].ctx)]
        else:
            parts = ["kvplan fit", self.model or "MODEL", "--gpu", gpu, "--engine", self.engine]
        if f.tp > 1:
            parts += ["--tp", str(f.tp)]
        if f.pp > 1:
            parts += ["--pp", str(f.pp)]
        for flag, value in (("--kv-dtype", f.kv_dtype), ("--k-dtype", f.k_dtype), ("--v-dtype", f.v_dtype),
                            ("--weight-dtype", f.weight_dtype)):
            if value:
                parts += [flag, str(value)]
        for k, v in f.knobs.items():
            if k not in _known_knobs(self.engine):
                continue
            flag = "--" + k.replace("_", "-")
            if v is True:
                parts.append(flag)
            elif v is False:
                parts.append("--no-" + k.replace("_", "-"))
            else:
                parts += [flag, str(v)]
        return " ".join(parts)


def _known_knobs(engine: str) -> set[str]:
    from kvplan.engines.listing import LISTINGS

    name = engine.split("@")[0]
    row = LISTINGS.get(name)
    return set(row.knobs) if row else set()


def _parsed(knobs: dict[str, Any]) -> dict[str, Any]:
    from kvplan import engines

    table = engines.all_knobs()
    return {k: table[k].parse(v) for k, v in knobs.items()}


def context(facts: LogFacts, o: Overrides) -> Context:
    if o.kv_dtype:
        facts.kv_dtype, facts.k_dtype, facts.v_dtype = o.kv_dtype, None, None
        facts.stated["kv_dtype"] = "--kv-dtype"
    if o.tp:
        facts.tp = o.tp
        facts.stated["tp"] = "--tp"
    elif "tp" not in facts.stated:
        ranks = [int(p.worker.split()[1]) for p in facts.printed if p.worker and p.worker.startswith("tp ")]
        if ranks and max(ranks) > 0:
            facts.tp = max(ranks) + 1
            facts.stated["tp"] = f"the TP ranks that printed (TP0..TP{max(ranks)})"
    model, why = _model(facts, o)
    gpu, known, gpu_why = _gpu(facts, o)
    engine = o.engine or (f"{facts.engine}@{facts.version}" if facts.version else facts.engine)
    if "kv_dtype" not in facts.stated and "k_dtype" not in facts.stated and facts.engine in ("vllm", "sglang", "trtllm"):
        facts.notes.append("the log states no KV-cache dtype: the engine's default for the model is assumed "
                           "(--kv-dtype sets it)")
    return Context(facts, model, why, gpu, known, gpu_why, engine, o.offline, o.timeout, ctx=o.ctx)


def _model(facts: LogFacts, o: Overrides) -> tuple[str | None, str]:
    if o.model:
        return o.model, "--model"
    if not facts.model:
        return None, "the log names no model: give --model (an alias, a Hub id or a config.json)"
    ref = facts.model
    where = facts.stated.get("model", "the log")
    if catalog.lookup(ref) is not None:
        return ref, where
    name = PurePosixPath(ref.rstrip("/")).name
    if ref.startswith(("/", "~", ".")) or ref.count("/") != 1:
        for m in catalog.bundled_models():
            if m.repo_id.split("/")[-1].lower() == name.lower():
                return m.repo_id, f"{where}: the path {ref} read as the bundled {m.repo_id} (its directory name)"
    return ref, where


def _gpu(facts: LogFacts, o: Overrides) -> tuple[gpus.GpuSelection, bool, str]:
    count = max(1, facts.tp * facts.pp)
    if o.gpu:
        sel = gpus.resolve_gpu(o.gpu)
        if sel.count == 1 and count > 1:
            sel = gpus.resolve_gpu(f"{count}x{o.gpu}")
        return sel, True, "--gpu"
    total = facts.gpu_total
    if facts.gpu_name:
        gpu = _named(facts.gpu_name, total)
        if gpu is not None:
            return _selection(gpu, count), True, f"{facts.gpu_name} ({facts.stated.get('gpu_name', 'the log')})"
    if total is not None:
        lo, hi = total.bounds()
        for g in gpus.load_catalog():
            if lo <= g.cuda_total_bytes < hi and g.vendor != "generic":
                return _selection(g, count), True, f"the CUDA total the log printed ({total.shown}) is the catalog's {g.name}"
        size = int((lo + hi) / 2)
        return _selection(gpus.sized_gpu(size), count), True, f"a device of the CUDA total the log printed ({total.shown})"
    return (_selection(gpus.sized_gpu(GENERIC_TOTAL), count), False,
            "the log names no GPU: exact figures use a generic 80 GiB device, estimates need --gpu")


def _named(name: str, total: Printed | None) -> gpus.Gpu | None:
    if total is not None:
        lo, hi = total.bounds()
        hit = gpus.match_local(name, int((lo + hi) / 2))
        if hit is not None:
            return hit
    words = name.split()
    for n in range(len(words), 0, -1):
        for start in range(0, len(words) - n + 1):
            try:
                sel = gpus.resolve_gpu(" ".join(words[start:start + n]))
            except KvplanError:
                continue
            if sel.gpu.vendor != "generic":
                return sel.gpu
    return None


def _selection(gpu: gpus.Gpu, count: int) -> gpus.GpuSelection:
    requested = gpu.name if count == 1 else f"{count}x{gpu.name}"
    if gpu.vendor == "generic":
        requested = f"{gpu.cuda_total_bytes}B" if count == 1 else f"{count}x{gpu.cuda_total_bytes}B"
    return gpus.GpuSelection(gpu=gpu, count=count, requested=requested)


# ---------------------------------------------------------------------------------------------- numbers
def budget_bounds(p: Printed) -> tuple[int, int]:
    """The integer byte budgets at the two ends of a printed GiB figure."""
    lo, hi = p.bounds()
    return math.ceil(lo), math.ceil(hi) - 1


def within(value: float | int | None, lo: float | int | None, hi: float | int | None) -> bool:
    if value is None or lo is None or hi is None:
        return False
    return min(lo, hi) <= value <= max(lo, hi)


def rel_error(kvplan: float, printed: float) -> float | None:
    return (kvplan - printed) / printed if printed else None


def gib(b: int | float | Decimal) -> str:
    return f"{float(b) / GiB:.2f} GiB"


__all__ = ["Overrides", "Context", "context", "budget_bounds", "within", "rel_error", "gib"]
