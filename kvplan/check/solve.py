"""Solving and judging `kvplan check` deployments: each GPU and model resolved once for all files, problems that
need them (a GPU name, a model, tp, weight and KV dtypes) with their lines, then fit (and the traffic replay) and
every requirement judged against the figures. run() is the whole command."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvplan.check.parse import parse_file
from kvplan.check.report import (
    NO_FLEET, CheckReport, Deployment, DeploymentResult, Field, FileReport, Problem, Requirement,
)
from kvplan.check.schema import DTYPE_KEYS, KEYS, KNOB_KEYS, REQUIREMENT_KEYS
from kvplan.errors import InputError, KvplanError
from kvplan.units import fmt_bytes


class _Resolver:
    """GPU selections and loaded models, each resolved once for all deployments of all files."""

    def __init__(self, offline: bool, timeout: float | None = None, calibrations: tuple = ()):
        self.offline = offline
        self.timeout = timeout
        self.calibrations = calibrations  # saved measurements (calibration.py) every deployment's fit may use
        self.gpus: dict[str, Any] = {}
        self.models: dict[tuple[str, str | None], Any] = {}

    def gpu(self, text: str) -> Any:
        from kvplan.gpus import resolve_gpu

        if text not in self.gpus:
            try:
                self.gpus[text] = resolve_gpu(text)
            except KvplanError as e:
                self.gpus[text] = e
        return self.gpus[text]

    def model_options(self, model: str, revision: str | None) -> Any:
        from kvplan.sizing import ModelOptions

        return ModelOptions(model, revision, True if self.offline else None, timeout=self.timeout)

    def model(self, model: str, revision: str | None) -> Any:
        from kvplan.sizing import load_spec

        key = (model, revision)
        if key not in self.models:
            try:
                self.models[key] = load_spec(self.model_options(model, revision))
            except KvplanError as e:
                self.models[key] = e
        return self.models[key]


def _solve(dep: Deployment, res: _Resolver, report: FileReport) -> DeploymentResult | None:
    """Phase 2: resolve GPU and model (problems with their lines), then fit and judge. None when not solvable."""
    from kvplan import engines, planner, weights
    from kvplan.sizing import EngineOptions, float_dtype_for

    def fail(f: Field | None, message: str) -> None:
        line, col = (f.line, f.column) if f is not None else (dep.line, dep.column)
        suffix = f" (inherited from defaults by deployment {dep.name!r})" if f is not None and f.inherited else ""
        report.problems.append(Problem(dep.file, line, col, message + suffix))
        dep.broken = True

    sel = loaded = None
    gf, mf = dep.fields.get("gpu"), dep.fields.get("model")
    if gf is not None:
        sel = res.gpu(gf.value)
        if isinstance(sel, KvplanError):
            fail(gf, f"gpu: {sel}")
            sel = None
    if mf is not None:
        loaded = res.model(mf.value, dep.get("revision"))
        if isinstance(loaded, KvplanError):
            fail(mf, f"model: {loaded}")
            loaded = None
    if sel is not None and (dep.get("tp") or dep.get("pp")):
        try:
            planner.parallelism(sel, dep.get("tp"), dep.get("pp"))
        except InputError as e:
            fail(dep.fields.get("tp") or dep.fields.get("pp"), e.spelled(str))
    if loaded is not None and not dep.broken:
        engine = engines.choose(dep.get("engine"))
        spec = loaded[1]
        wf = dep.fields.get("weight_dtype")
        if wf is not None:
            try:
                weights.weight_format(spec, wf.value, float_dtype_for(engine, spec))
            except InputError as e:
                fail(wf, f"weight_dtype: {e.spelled(str)}")
        given = [dep.fields[k] for k in DTYPE_KEYS if k in dep.fields]
        try:
            engines.kv_dtypes(engine, spec, *(dep.get(k) for k in DTYPE_KEYS))
        except InputError as e:
            fail(given[0] if given else None, str(e))
    if dep.broken or sel is None or loaded is None:
        return None

    min_batch, min_ctx, min_kv = (dep.get(k) for k in REQUIREMENT_KEYS)
    knobs = {k: dep.get(k) for k in KNOB_KEYS if k in dep.fields}
    eo = EngineOptions(dep.get("engine"), dep.get("kv_dtype"), dep.get("k_dtype"), dep.get("v_dtype"),
                       dep.get("state_dtype"), dep.get("weight_dtype"), 1, 1, knobs)
    traffic = None
    if dep.get("prompt") is not None:
        from kvplan import serving, workload

        try:
            work = workload.sampled(dep.get("requests") or 1000, workload.parse_lengths(dep.get("prompt"), "prompt"),
                                    workload.parse_lengths(dep.get("output"), "output"), dep.get("shared_prefix") or 0)
            traffic = serving.plan(res.model_options(dep.get("model"), dep.get("revision")), eo, sel, work,
                                   users=dep.get("users"), tpot=dep.get("tpot"), kv_budget=dep.get("kv_budget"),
                                   reserve=dep.get("reserve"), tp=dep.get("tp"), pp=dep.get("pp"),
                                   calibrations=res.calibrations)
        except KvplanError as e:
            fail(None, f"deployment {dep.name!r}: {e}")
            return None
    ctx = dep.get("ctx") or min_ctx or (traffic.workload.longest if traffic is not None else None)
    batch = min_batch or 1
    if traffic is not None and "ctx_size" in knobs:  # llama-server -c: the replay's; fit solves its own
        eo = replace(eo, knobs={k: v for k, v in knobs.items() if k != "ctx_size"})
    try:
        r = planner.fit_model(res.model_options(dep.get("model"), dep.get("revision")), eo, sel, ctx, batch,
                              kv_budget=dep.get("kv_budget"), reserve=dep.get("reserve"), frontier=True,
                              tp=dep.get("tp"), pp=dep.get("pp"), loaded=loaded, headroom=dep.get("headroom") or 0.0,
                              calibrations=res.calibrations, estimate=dep.get("estimate") or "low")
    except KvplanError as e:
        fail(None, f"deployment {dep.name!r}: {e}")
        return None
    tp, pp, _ = planner.parallelism(sel, dep.get("tp"), dep.get("pp"))
    return _judge(dep, r, sel, tp, pp, ctx, batch, traffic)


def _traffic_requirements(dep: Deployment, traffic: Any) -> list[Requirement]:
    out = []
    if dep.get("min_running") is not None:
        out.append(Requirement("min_running", dep.get("min_running"), traffic.run.p50_running, "requests"))
    if dep.get("max_gpus") is not None:
        gpus = (traffic.fleet or {}).get("gpus")
        out.append(Requirement("max_gpus", dep.get("max_gpus"), gpus if gpus is not None else NO_FLEET, "GPUs",
                               upper=True))
    return out


def _judge(dep: Deployment, r: Any, sel: Any, tp: int, pp: int, ctx: int, batch: int,
           traffic: Any = None) -> DeploymentResult:
    figures = r.to_json()
    if traffic is not None:
        plan_json = traffic.to_json()
        figures["plan"] = {k: plan_json[k] for k in ("workload", "mode", "users", "pool", "run", "speed", "fleet")}
    model_max = r.setup.max_ctx
    min_batch, min_ctx, min_kv = (dep.get(k) for k in REQUIREMENT_KEYS)
    reqs: list[Requirement] = []
    warnings: list[str] = []
    detail: list[str] = []
    if model_max is not None and ctx > model_max:
        over = Requirement("ctx", ctx, model_max, "tokens")
        reqs = [over]
        reason = "ctx exceeds model maximum"
        detail.append(f"ctx {ctx:,} exceeds the model maximum {model_max:,} ({r.setup.max_ctx_source})")
        binding = over
    else:
        if min_batch is not None:
            reqs.append(Requirement("min_batch", min_batch, r.max_batch, "requests", at=r.ctx))
        if min_ctx is not None:
            reqs.append(Requirement("min_ctx", min_ctx, r.max_ctx, "tokens", at=batch))
        if min_kv is not None:
            reqs.append(Requirement("min_kv_tokens", min_kv, r.capacity.kv_capacity_tokens or 0, "tokens"))
        if traffic is not None:
            reqs.extend(_traffic_requirements(dep, traffic))
        if not reqs:
            reqs.append(Requirement("min_batch", 1, r.max_batch, "requests", at=r.ctx, implicit=True))
        binding = min(reqs, key=lambda q: q.relative)  # the smallest relative margin (first on ties)
        failing = [q for q in reqs if not q.passed]
        if not r.weights_fit and r.budgets[0].part("range_low") is not None:
            reason = "no KV memory at the low end of the likely budget range"
            detail.append(f"the estimated budget's likely range reaches 0 on {sel.gpu.name} (estimate: median gates "
                          "on the point estimate)")
        elif not r.weights_fit:
            reason = "weights do not fit"
            detail.append(f"weights {fmt_bytes(r.weight_bytes)} per GPU leave no KV budget "
                          f"({fmt_bytes(r.kv_budget_bytes)}) on {sel.gpu.name}")
        elif failing:
            reason = "; ".join(q.sentence() for q in sorted(failing, key=lambda q: q.relative))
        else:
            reason = "; ".join(q.sentence() for q in reqs)
        detail.extend(q.sentence() for q in reqs)
    low = r.budgets[0].part("range_low")
    if low is not None:
        detail.append(f"gated on the low end of the estimated budget's likely range ({fmt_bytes(r.kv_budget_bytes)} "
                      f"per GPU, {fmt_bytes(-low.bytes)} below the point estimate; estimate: median gates on the point "
                      "estimate)")
    would_start = r.capacity.engine_would_start
    start_failed = False
    if not would_start and r.weights_fit:
        message = r.capacity.start_message or "the engine's start-up checks fail"
        if dep.get("require_start"):
            start_failed = True
            detail.append(f"engine would not start: {message}")
        else:
            hint = "set max_model_len to the context you serve; " if "max_model_len" in message else ""
            warnings.append(f"engine would not start as configured: {message} ({hint}require_start: true fails on this)")
    passed = all(q.passed for q in reqs) and r.weights_fit and not start_failed
    if start_failed and all(q.passed for q in reqs) and r.weights_fit:
        reason = "engine would not start"
    inputs = {k: f.value for k, f in sorted(dep.fields.items(), key=lambda kv: list(KEYS).index(kv[0]))}
    inputs.setdefault("ctx", ctx)
    return DeploymentResult(dep, passed, reason, "; ".join(detail), inputs, r.setup.engine.label, sel.to_json(), tp, pp,
                            figures, binding, tuple(reqs), tuple(warnings))


def run(paths: list[str], *, only: list[str] | None = None, offline: bool = False,
        timeout: float | None = None, calibrations: tuple = ()) -> CheckReport:
    """Check every deployment of every file (or only those named); problems of every file are collected."""
    files = [parse_file(p) for p in paths]
    wanted = set(only or ())
    if wanted:
        known = {d.get("name") for f in files for d in f.deployments}
        unknown = sorted(wanted - known)
        if unknown and all(f.valid for f in files):
            have = ", ".join(sorted(n for n in known if n)) or "none"
            raise InputError(f"--only: no deployment named {', '.join(map(repr, unknown))} (deployments: {have})")
    res = _Resolver(offline, timeout, calibrations)
    for f in files:
        for dep in f.deployments:
            if wanted and dep.get("name") not in wanted:
                continue
            result = _solve(dep, res, f)
            if result is not None:
                f.results.append(result)
        f.problems = sorted(set(f.problems), key=lambda p: (p.line or 0, p.column or 0, p.message))
        if f.problems:
            f.results = []  # an invalid file is reported by its problems only
    return CheckReport(files)
