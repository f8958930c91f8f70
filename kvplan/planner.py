"""`kvplan fit`: the largest batch for a context, the largest context for a batch, the batch x context frontier.

Budgets come from the engine's own rule (engines/<engine>.py `budget`), or from `--kv-budget` (the KV memory
an engine reported). Solving uses the same prepared layout (and so the same CachePlan) as `size`, in integers.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvplan import JSON_SCHEMA, catalog
from kvplan.engines.base import Budget, BudgetPart, Capacity, GpuContext, largest
from kvplan.engines.listing import LISTINGS
from kvplan.errors import InputError, KvplanError
from kvplan.gpus import GpuSelection
from kvplan.sizing import EngineOptions, ModelOptions, Setup, setup as make_setup

DEFAULT_CATALOG_CTX = 4096
ESTIMATES = ("median", "low")  # which budget fit_model solves with: the point estimate or its likely low end
UNBOUNDED_MAX_CTX = 1 << 20  # search limit for models without a position limit (state-space models)


@dataclass(frozen=True)
class FitResult:
    """One model on one GPU selection: its KV budget per stage and the batch x context it can serve."""
    setup: Setup
    gpu: GpuSelection
    ctx: int
    requested_ctx: int
    batch: int
    weight_bytes: int
    budgets: tuple[Budget, ...]
    capacity: Capacity
    max_batch: int
    max_ctx: int
    fits: bool
    frontier: tuple[tuple[int, int], ...] | None
    warnings: tuple[str, ...]
    assumptions: tuple[str, ...]
    replicas: int = 1
    kv_bytes_per_token: int = 0  # of the plan at (ctx, 1) the result was solved with
    # flag (--kv-budget / kv_budget) | calibrated (non-KV memory an engine log measured, calibration.py) |
    # estimated (the budget model)
    kv_budget_source: str = "estimated"
    # the KV budget per GPU (limiting stage) and token capacity the evidence supports: a calibration's printed
    # precision, or the central 80% of public logs against the budget model (evidence.py); None for a given budget
    kv_budget_range: tuple[int, int] | None = None
    kv_capacity_tokens_range: tuple[int, int] | None = None
    kv_budget_range_basis: str = ""

    @property
    def kv_budget_bytes(self) -> int:
        return min(b.kv_bytes for b in self.budgets)

    @property
    def weights_fit(self) -> bool:
        return self.kv_budget_bytes > 0

    def to_json(self) -> dict[str, Any]:
        c = self.capacity
        out = {
            "model": self.setup.ref.to_json(),
            "ctx": self.ctx,
            "ctx_clamped": self.ctx != self.requested_ctx,
            "batch": self.batch,
            "model_max_ctx": self.setup.max_ctx,
            "weight_bytes": self.weight_bytes,
            "weights_fit": self.weights_fit,
            "kv_budget_bytes": self.kv_budget_bytes,
            "kv_budget_source": self.kv_budget_source,
            "kv_budget_range_bytes": list(self.kv_budget_range) if self.kv_budget_range else None,
            "kv_capacity_tokens_range": list(self.kv_capacity_tokens_range) if self.kv_capacity_tokens_range else None,
            "kv_budget_range_basis": self.kv_budget_range_basis or None,
            "model_kind": self.setup.spec.kind,
            "kv_capacity_tokens": c.kv_capacity_tokens,
            "max_batch": self.max_batch,
            "engine_batch_cap": c.engine_batch_cap,
            "concurrency": c.concurrency,
            "max_ctx": self.max_ctx,
            "fits": self.fits,
            "engine_would_start": c.engine_would_start,
            "engine_start_message": c.start_message,
            "suggested_max_model_len": c.suggested_max_ctx,
            "kv_bytes_per_token": self.kv_bytes_per_token,
            "kv_dtype": self.setup.kvd.label,
            "weight_dtype": self.setup.weight_format.name,
            "replicas": self.replicas,
            "budget": [{"stage": i, "kv_bytes": b.kv_bytes, "parts": [{"what": p.label, "key": p.key, "bytes": p.bytes} for p in b.parts]}
                       for i, b in enumerate(self.budgets)],
            "engine_details": c.details,
            "assumptions": list(self.assumptions),
            "warnings": list(self.warnings),
        }
        if self.frontier is not None:
            out["frontier"] = [{"ctx": x, "max_batch": b} for x, b in self.frontier]
        return out


def gpu_context(gpu: GpuSelection) -> GpuContext:
    g = gpu.gpu
    return GpuContext(g.name if g.vendor != "generic" else None, g.cuda_total_bytes, g.nvml_bytes, gpu.count,
                      g.interconnect, g.nccl_nvls)


def parallelism(gpu: GpuSelection, tp: int | None, pp: int | None) -> tuple[int, int, int]:
    """NxGPU: tensor parallel defaults to N unless --tp/--pp say otherwise; spare GPUs run replicas."""
    if tp is None and pp is None:
        tp, pp = gpu.count, 1
    tp, pp = tp or 1, pp or 1
    if tp * pp > gpu.count:
        raise InputError(f"{{tp}} {tp} x {{pp}} {pp} needs {tp * pp} GPUs; {gpu.requested} has {gpu.count}",
                         fields=("tp", "pp"))
    return tp, pp, gpu.count // (tp * pp)


def _frontier_points(max_ctx: int | None) -> list[int]:
    top = max_ctx or UNBOUNDED_MAX_CTX
    points, c = [], 1024
    while c < top:
        points.append(c)
        c *= 2
    points.append(top)
    return points


def fit_model(mo: ModelOptions, eo: EngineOptions, gpu: GpuSelection, ctx: int | None, batch: int = 1, *,
              kv_budget: int | tuple[int, ...] | None = None, reserve: int | None = None, frontier: bool = False,
              tp: int | None = None, pp: int | None = None, loaded=None, headroom: float = 0.0,
              calibrations: tuple = (), estimate: str = "median") -> FitResult:
    """headroom: the share of every stage's KV budget held back before solving (`kvplan check` key headroom).
    calibrations: saved measurements (calibration.py); one whose key matches replaces the non-KV estimate.
    estimate: 'median' solves with the point estimate of the budget, 'low' with the low end of its likely range
    (`kvplan check`'s default: a gate should not pass a deployment a likely engine start would fail)."""
    if estimate not in ESTIMATES:
        raise InputError(f"{{estimate}} {estimate!r}: accepted: {', '.join(ESTIMATES)}", fields=("estimate",))
    tp, pp, replicas = parallelism(gpu, tp, pp)
    eo = replace(eo, tp=tp, pp=pp)
    dev = gpu_context(gpu)
    s = make_setup(mo, eo, gpu=dev, loaded=loaded)
    module = s.engine.module
    opts = {k: v for k, v in eo.knobs.items() if v is not None}
    warnings: list[str] = [*s.ref.notes, *s.spec.warnings]
    assumptions: list[str] = []
    model_max = s.max_ctx
    requested = ctx if ctx is not None else (min(DEFAULT_CATALOG_CTX, model_max) if model_max else DEFAULT_CATALOG_CTX)
    ctx = requested
    if model_max is not None and ctx > model_max:
        ctx = model_max
        warnings.append(f"ctx {requested:,} clamped to the model maximum {model_max:,} ({s.max_ctx_source})")
    dtype_bytes = s.kvd.k.block_bytes if not s.kvd.k.is_block else 2
    weight_per_stage = [s.weight_bytes(stage) for stage in range(pp)]
    source = "flag" if kv_budget is not None else "estimated"
    cal = None
    if kv_budget is not None:
        per_stage = kv_budget if isinstance(kv_budget, tuple) else (kv_budget,) * pp
        if len(per_stage) != pp:
            raise InputError(f"{len(per_stage)} KV budgets for {pp} pipeline stages")
        budgets = tuple(Budget(b, (BudgetPart("kv_budget", "KV budget (--kv-budget)", b),)) for b in per_stage)
        shown = f"{kv_budget:,} B" if not isinstance(kv_budget, tuple) else " / ".join(f"{b:,}" for b in per_stage) + " B by stage"
        assumptions.append(f"KV budget {shown} per GPU given (--kv-budget): the budget model is skipped")
    else:
        cal = _calibration(s, gpu, calibrations, warnings) if reserve is None else None
        if cal is not None:
            source = "calibrated"
            budgets = tuple(module.calibrated_budget(s.prepared, s.spec, dev, stage, opts, dtype_bytes, cal)
                            for stage in range(pp))
        else:
            budgets = tuple(module.budget(s.prepared, s.spec, dev, stage, weight_per_stage[stage], opts, reserve,
                                          dtype_bytes) for stage in range(pp))
        for b in budgets[:1]:
            assumptions.extend(b.notes)
    shift, basis, est = _uncertainty(source, s, gpu, cal, reserve, tp, pp)
    if est is not None and est.shift:
        what = "median" if est.shift == est.median else "range edge"
        label = f"{what} of public logs ({est.logs} logs, {est.sources} sources)"
        budgets = tuple(_moved(b, -est.shift, "evidence", label) for b in budgets)
        assumptions.append(f"estimate shifted by the public logs ({est.described}): {-est.shift:+,} B per GPU; "
                           "--reserve or a calibration replaces it")
    if estimate == "low" and shift is not None and shift[0]:
        budgets = tuple(_moved(b, shift[0], "range_low", "low end of the likely range") for b in budgets)
        shift = (0, shift[1] - shift[0])
        assumptions.append(f"solved at the low end of the likely range ({shift[1]:,} B per GPU below its high end); "
                           "estimate: median solves at the point estimate")
    if headroom:
        budgets = tuple(_hold_back(b, headroom) for b in budgets)
        assumptions.append(f"headroom: {headroom:.4g} of the KV budget held back before solving")
    kv = [b.kv_bytes for b in budgets]
    cap = module.capacity(s.prepared, s.spec, ctx, kv, opts, dev, model_max)
    if est is not None and gpu.gpu.vendor != "generic":
        caution = _evidence_caution(s, gpu.gpu.name, tp, est)
        if caution:
            warnings.append(caution)
    budget_range = tokens_range = None
    if shift is not None and min(kv) > 0:
        ends = [[max(0, b + d) for b in kv] for d in shift]
        budget_range = (min(ends[0]), min(ends[1]))
        tokens_range = tuple(module.capacity(s.prepared, s.spec, ctx, e, opts, dev, model_max).kv_capacity_tokens
                             for e in ends)
    engine_cap = cap.engine_batch_cap
    max_b = min(cap.max_batch, engine_cap) if engine_cap else cap.max_batch
    limit = model_max or UNBOUNDED_MAX_CTX
    max_ctx = max(0, largest(1, limit, lambda c: module.fits(s.prepared, c, batch, kv))) if min(kv) > 0 else 0
    front = None
    if frontier:
        front = []
        for point in _frontier_points(model_max):
            b = module.max_batch(s.prepared, point, kv) if min(kv) > 0 else 0
            front.append((point, min(b, engine_cap) if engine_cap else b))
        front = tuple(front)
    plan = s.prepared.plan(ctx, 1)
    assumptions.extend(plan.assumptions)
    assumptions.append(f"weights: {s.weight_format.description}")
    if replicas > 1:
        assumptions.append(f"{gpu.count} GPUs with tp {tp} x pp {pp}: figures are per engine instance ({replicas} replicas fit)")
    if not cap.engine_would_start and cap.start_message:
        warnings.append(cap.start_message)
    fits = min(kv) > 0 and max_b >= 1
    stage = plan.limiting_stage
    return FitResult(s, gpu, ctx, requested, batch, weight_per_stage[stage], budgets, cap, max_b, max_ctx, fits, front,
                     tuple(warnings), tuple(assumptions), replicas, plan.kv_bytes_per_token, source, budget_range,
                     tokens_range, basis)


def _calibration(s: Setup, gpu: GpuSelection, calibrations: tuple, warnings: list[str]):
    """The saved measurement for this engine rules row, GPU, model shape, weights and parallelism, if any."""
    if not calibrations or not LISTINGS[s.engine.name].calibrates or gpu.gpu.vendor == "generic":
        return None
    from kvplan import calibration

    cal, why_not = calibration.find(calibrations, calibration.key_for(s, gpu.gpu.name))
    if why_not:
        warnings.append(why_not)
    return cal


def _uncertainty(source: str, s: Setup, gpu: GpuSelection, cal, reserve: int | None, tp: int,
                 pp: int) -> tuple[tuple[int, int] | None, str, Any]:
    """(low, high) shifts of the KV budget the evidence supports around the point estimate, what it is, and the
    evidence class behind an estimated budget (evidence.Estimate; None otherwise)."""
    if source == "calibrated":
        hw = cal.half_width_bytes
        return (-hw, hw), f"the calibration's printed precision (± {hw:,} B per GPU)", None
    if source == "estimated" and reserve is None:
        from kvplan import evidence

        ev = evidence.for_engine(s.engine.name)
        g = gpu.gpu
        named = g.vendor != "generic"
        query = evidence.Query(s.engine.name, s.engine.selected.requested, g.tier if named else "unknown", g.interconnect if named else "unknown", tp, pp,
                               s.spec.kind)
        est = ev.estimate(query) if ev is not None else None
        if est is not None:
            return (est.shift - est.high, est.shift - est.low), est.basis(), est
    return None, "", None


def _moved(b: Budget, by: int, key: str, label: str) -> Budget:
    """The budget moved by `by` bytes as one more part, never below 0 (a budget already <= 0 stays as it is)."""
    if b.kv_bytes <= 0:
        return b
    kept = max(0, b.kv_bytes + by)
    return Budget(kept, (*b.parts, BudgetPart(key, label, kept - b.kv_bytes)), b.notes)


def _evidence_caution(s: Setup, gpu_name: str, tp: int, est) -> str | None:
    """What the public logs say about this GPU in particular (evidence.py): none there, or some far off."""
    from kvplan import evidence

    ev = evidence.for_engine(s.engine.name)
    return ev.caution(gpu_name, tp, est) if ev is not None and ev.cases else None


def _hold_back(b: Budget, headroom: float) -> Budget:
    """The budget with `headroom` of its KV bytes held back (a budget already <= 0 stays as it is)."""
    if b.kv_bytes <= 0:
        return b
    kept = int(b.kv_bytes * (1 - headroom))
    return Budget(kept, (*b.parts, BudgetPart("headroom", f"headroom {headroom:.4g} held back", kept - b.kv_bytes)),
                  b.notes)


@dataclass(frozen=True)
class FitReport:
    """`kvplan fit` over several models: one result per model, and the models that could not be sized."""
    gpu: GpuSelection
    engine: str
    tp: int
    pp: int
    results: tuple[FitResult, ...]
    errors: tuple[tuple[str, str], ...]

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": JSON_SCHEMA,
            "gpu": self.gpu.to_json(),
            "engine": self.engine,
            "tp": self.tp,
            "pp": self.pp,
            "results": [r.to_json() for r in self.results],
            "errors": [{"model": m, "error": e} for m, e in self.errors],
        }


def fit(models: list[str] | None, eo: EngineOptions, gpu: GpuSelection, ctx: int | None, batch: int = 1, *,
        mo_template: ModelOptions | None = None, kv_budget: int | None = None, reserve: int | None = None,
        tp: int | None = None, pp: int | None = None, headroom: float = 0.0, calibrations: tuple = (),
        estimate: str = "median") -> FitReport:
    """One model (with its frontier) or, without models, the whole bundled catalog at ctx (default 4096)."""
    template = mo_template or ModelOptions("")
    results, errors = [], []
    one = models is not None and len(models) == 1
    refs = models if models else [m.aliases[0] if m.aliases else m.repo_id for m in catalog.bundled_models()]
    for ref in refs:
        try:
            results.append(fit_model(replace(template, model=ref), eo, gpu, ctx, batch, kv_budget=kv_budget,
                                     reserve=reserve, frontier=one, tp=tp, pp=pp, headroom=headroom,
                                     calibrations=calibrations, estimate=estimate))
        except KvplanError as e:
            if one:
                raise
            errors.append((ref, str(e)))
    if not one:
        results.sort(key=lambda r: (not r.fits, -(r.max_batch or 0), -(r.capacity.kv_capacity_tokens or 0), r.setup.ref.requested))
    ptp, ppp, _ = parallelism(gpu, tp, pp)
    engine = results[0].setup.engine.label if results else (eo.engine or "vllm")
    return FitReport(gpu, engine, ptp, ppp, tuple(results), tuple(errors))
