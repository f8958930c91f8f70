"""`kvplan verify`: allocate the CachePlan that `size` reports, measure it, and (optionally) find the real limit
(--fit) and run the real model code (--with-model). torch is imported here lazily, never at module import.

Pass criteria (each check can fail on its own; the command exits 1 when any does):
* allocation, CPU: the tensors' storage bytes equal the plan, per group and in total.
* allocation, CUDA: memory_allocated grows by the plan after the caching allocator's rounding (measure.py),
  per group and in total, and returns to its baseline when the tensors are freed.
* RSS (CPU, not with --fit): a fresh interpreter touching every tensor of >= 1 MiB grows by their bytes within
  max(1 %, 2 MiB per tensor).
* --fit: the largest batch (or context) that really allocates is within one request (one allocation step of
  context) of the prediction.
* --with-model: transformers' cache after a forward holds the hf layout's bytes, per group and in total.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kvplan.errors import InputError
from kvplan.units import fmt_bytes


@dataclass(frozen=True)
class VerifyOptions:
    device: str | None = None  # auto | cpu | cuda | cuda:N
    fit: bool = False
    memory_limit: int | None = None
    with_model: bool = False
    rss: bool = True


@dataclass
class Check:
    name: str
    passed: bool
    detail: str

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "passed": self.passed, "detail": self.detail}


@dataclass
class VerifyResult:
    setup: Any
    plan: Any
    ctx: int
    batch: int
    device: Any  # measure.DeviceInfo
    alloc: Any  # allocate.AllocationCheck
    rss: Any = None  # allocate.RssCheck
    fit: Any = None  # fitcheck.FitCheck
    model: Any = None  # model_check.ModelCheck
    warnings: list[str] = field(default_factory=list)
    assumptions: list[str] = field(default_factory=list)

    @property
    def checks(self) -> list[Check]:
        a = self.alloc
        what = "storage bytes" if a.device == "cpu" else "memory_allocated growth"
        out = [Check("allocation", a.passed,
                     f"{what} {a.measured_bytes:,} B, expected {a.expected_bytes:,} B (plan {a.predicted_bytes:,} B)"
                     + ("" if a.released else "; memory not released"))]
        for g in a.groups:
            if not g.passed:
                out.append(Check(f"allocation: {g.kind}", False,
                                 f"{g.measured_bytes:,} B measured, {g.expected_bytes:,} B expected"))
        if self.rss is not None:
            r = self.rss
            detail = r.error or (f"RSS grew {r.measured_bytes:,} B for {r.expected_bytes:,} B touched in {r.tensors} "
                                 f"tensor(s) (tolerance {r.tolerance_bytes:,} B)" if r.measured_bytes is not None
                                 else "no tensor of 1 MiB or more to touch")
            out.append(Check("rss", r.passed, detail))
        if self.fit is not None:
            f = self.fit
            unit = "batch" if f.mode == "batch" else "ctx"
            out.append(Check("fit", f.passed, f"largest {unit} that allocates {f.measured:,}, predicted {f.predicted:,} "
                                              f"(difference {f.difference:+,})"
                             + ("" if f.fraction_restored else "; memory fraction not restored")))
        if self.model is not None:
            for run in self.model.runs:
                if run.status != "ran":
                    out.append(Check(f"model ({run.device})", True, f"skipped: {run.reason}"))
                    continue
                out.append(Check(f"model ({run.device})", run.passed,
                                 f"{run.model_class} cache {run.measured_bytes:,} B, plan {self.model.predicted_bytes:,} B"))
        return out

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)

    def failure_line(self) -> str:
        bad = [f"{c.name}: {c.detail}" for c in self.checks if not c.passed]
        return "verify failed: " + "; ".join(bad)

    def to_json(self) -> dict[str, Any]:
        s, p, a = self.setup, self.plan, self.alloc
        out: dict[str, Any] = {
            **s.json_header(p.engine, self.ctx, self.batch),
            "device": self.device.to_json(),
            "predicted_bytes": a.predicted_bytes,
            "measured_bytes": a.measured_bytes,
            "expected_measured_bytes": a.expected_bytes,
            "measured_reserved_bytes": a.measured_reserved_bytes,
            "expected_reserved_bytes": a.expected_reserved_bytes,
            "allocator_rounding_bytes": a.rounding_bytes,
            "measured_device_bytes": a.measured_device_bytes,
            "rss_delta_bytes": self.rss.measured_bytes if self.rss is not None else None,
            "tensors": a.tensors,
            "groups": [g.to_json() for g in a.groups],
            "plan": [g.to_json() for g in p.groups],
            "memory": a.snapshots or None,
            "rss": self.rss.to_json() if self.rss is not None else None,
            "checks": [c.to_json() for c in self.checks],
            "passed": self.passed,
            "notes": list(a.notes),
            "assumptions": list(self.assumptions),
            "warnings": list(self.warnings),
        }
        if self.fit is not None:
            f = self.fit
            batch_mode = f.mode == "batch"
            out.update({
                "predicted_max_batch": f.predicted if batch_mode else None,
                "measured_max_batch": f.measured if batch_mode else None,
                "predicted_max_ctx": None if batch_mode else f.predicted,
                "measured_max_ctx": None if batch_mode else f.measured,
                "difference": f.difference,
                "fit": f.to_json(),
            })
        if self.model is not None:
            out["model_check"] = self.model.to_json()
        return out


def _with_model_engine(eo: Any) -> Any:
    """--with-model measures transformers' own cache: the hf layout of the installed transformers version."""
    from kvplan.engines import split_engine
    from kvplan.verify.model_check import require_transformers

    transformers = require_transformers()
    if eo.engine is None:
        return replace(eo, engine=f"hf@{transformers.__version__}")
    name, _ = split_engine(eo.engine)
    if name != "hf":
        raise InputError(f"--with-model measures the cache transformers builds, i.e. the hf layout; drop --engine "
                         f"{eo.engine} (or use --engine hf) with --with-model")
    return eo


def run(mo: Any, eo: Any, ctx: int | None, batch: int = 1, opts: VerifyOptions = VerifyOptions()) -> VerifyResult:
    """Run every check that `opts` asks for; raise KvplanError (exit 2) for bad input/environment."""
    from kvplan import sizing
    from kvplan.verify import allocate, fitcheck, measure

    if batch < 1:
        raise InputError("--batch must be a positive integer")
    switched = opts.with_model and eo.engine is None
    if opts.with_model:
        eo = _with_model_engine(eo)
    backend = measure.open_backend(opts.device)
    if opts.fit:
        fitcheck.check_fit_args(backend.kind, opts.memory_limit)

    fit = None
    if opts.fit:
        s = sizing.setup(mo, eo)
        mode = "batch" if ctx is not None else "ctx"
        pred = fitcheck.predicted_fit(s, mo, eo, ctx, batch, memory_limit=opts.memory_limit,
                                       device_name=backend.info.name, device_total=backend.info.total_bytes)
        if pred.kv_budget_bytes <= 0:
            where = "--memory-limit" if pred.source == "memory limit" else "this device's engine budget"
            raise InputError(f"--fit: the predicted weights ({fmt_bytes(pred.weight_bytes)}) leave no KV budget in "
                             f"{where} ({fmt_bytes(pred.kv_budget_bytes)} left): there is nothing to bisect; give "
                             "more memory or a smaller model")
        prepared = pred.prepared or s.prepared
        run_ctx = ctx if ctx is not None else 1
        if backend.kind == "cuda":
            fit = fitcheck.cuda_fit(backend, prepared, mode, run_ctx, batch, pred, s.max_ctx)
        else:
            fit = fitcheck.cpu_fit(prepared, mode, run_ctx, batch, pred, s.max_ctx)
        n = max(1, fit.measured)
        ctx, batch = (run_ctx, n) if mode == "batch" else (min(n, fit.cap), batch)
        s = pred.setup or s
        plan = prepared.plan(ctx, batch)
        warnings = list(s.ref.notes)
        assumptions = list(plan.assumptions)
        assumptions.append(f"the allocation check runs at the {'batch' if mode == 'batch' else 'ctx'} that "
                           f"really allocated ({n:,})")
    else:
        r = sizing.size(mo, eo, ctx, batch)
        s, plan, ctx = r.setup, r.plan, r.ctx
        warnings, assumptions = list(r.warnings), list(r.assumptions)

    if backend.kind == "cuda":
        alloc = allocate.check_cuda(backend, plan)
    else:
        alloc = allocate.check_cpu(backend, plan)
    rss = allocate.rss_check(plan) if backend.kind == "cpu" and opts.rss and not opts.fit else None
    model = None
    if opts.with_model:
        from kvplan.verify.model_check import check_model

        explicit = opts.device not in (None, "", "auto")
        model = check_model(s, plan, ctx, batch, backend.info.device if explicit else None)
    if s.tp > 1 or s.pp > 1:
        assumptions.append(f"one GPU's share is allocated: the limiting rank of tp {s.tp} x pp {s.pp}")
    assumptions.insert(0, f"scope: the allocation check allocates kvplan's own {plan.engine} plan and measures what "
                          "the allocator adds; it does not check the plan against the engine (--with-model checks "
                          "transformers' cache; the engine tier, pytest -m engine, checks vLLM and llama.cpp)")
    if switched:
        warnings.append(f"--with-model without --engine: the {plan.engine} (transformers) layout is sized and "
                        "checked, not vllm's")
    return VerifyResult(s, plan, ctx, batch, backend.info, alloc, rss, fit, model, warnings, assumptions)


def summary(r: VerifyResult) -> str:
    a = r.alloc
    return (f"{r.plan.engine}: predicted {fmt_bytes(a.predicted_bytes)}, measured {fmt_bytes(a.measured_bytes)} "
            f"on {r.device.device} -> {'pass' if r.passed else 'FAIL'}")
