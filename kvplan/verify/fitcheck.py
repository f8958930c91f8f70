"""`kvplan verify --fit`: find the real largest batch (or context) that allocates under the engine's budget, and
set it beside the prediction.

Predicted: the weights per GPU and the KV budget come from `kvplan fit` (kvplan.planner) for the local device,
or, with --memory-limit, from the limit itself: KV budget = memory limit - predicted weights. The predicted
largest batch is then the largest batch whose CachePlan fits the budget (the planner's own figure is shown
beside it when the planner ran).

Measured:
* CUDA: a buffer of the predicted weights is held, the caching allocator is capped with
  set_per_process_memory_fraction((torch reserved after the weights + KV budget) / CUDA total) -- i.e.
  (weights + KV budget) / total up to the weights buffer's 2 MiB rounding -- and the largest batch whose plan
  allocates is bisected, catching torch.OutOfMemoryError. The fraction in force before is restored afterwards.
  The allocator's segment rounding (reserved minus plan bytes) is reported: it is why a plan that fits the
  budget byte-for-byte can still fail.
* CPU: the weights are charged to --memory-limit, not allocated. A child interpreter imports torch once; each
  candidate plan is allocated in a process forked from it (a clean heap per trial), which first caps its own
  address space with RLIMIT_AS at (its size at the fork + KV budget). glibc is told to serve every allocation
  of >= 64 KiB by mmap, so tensors take fresh address space. The out-of-memory is the operating system's
  refusal, not kvplan's bookkeeping. Address space comes in whole pages per tensor: reported as the OS overhead.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass, field
from typing import Any, Callable

from kvplan.engines.base import CachePlan
from kvplan.errors import EnvironmentProblem, InputError
from kvplan.units import fmt_bytes
from kvplan.verify.measure import allocator_config, expected_allocator, python_executable

UNBOUNDED_CTX = 1 << 20  # search limit for the context of models whose cache stops growing
MAX_TRIALS = 64


# ---------------------------------------------------------------------------------------------- search
def largest_ok(ok: Callable[[int], bool], hint: int, lo: int = 1, cap: int = 1 << 40) -> int:
    """The largest n in [lo, cap] with ok(n), for ok monotone (true then false); lo - 1 when none.

    Starts at `hint` (the prediction), so a correct prediction costs two trials: hint and hint + 1."""
    hint = min(max(hint, lo), cap)
    if ok(hint):
        good, step = hint, 1
        while True:  # gallop up
            probe = min(good + step, cap)
            if probe == good:
                return good
            if not ok(probe):
                bad = probe
                break
            good, step = probe, step * 2
    else:
        bad, step = hint, 1
        while True:  # gallop down
            probe = max(bad - step, lo)
            if probe == bad:
                return lo - 1
            if ok(probe):
                good = probe
                break
            if probe == lo:
                return lo - 1
            bad, step = probe, step * 2
    while bad - good > 1:
        mid = (good + bad) // 2
        if ok(mid):
            good = mid
        else:
            bad = mid
    return good


# ---------------------------------------------------------------------------------------------- prediction
@dataclass
class PredictedFit:
    """The small protocol --fit works against: weights and KV budget per GPU, and the limits they imply."""

    weight_bytes: int
    kv_budget_bytes: int
    source: str  # "memory limit" | "kvplan fit"
    max_batch: int | None = None  # from the plan and the budget
    max_ctx: int | None = None
    planner_max_batch: int | None = None  # what kvplan fit says, when it ran
    planner_max_ctx: int | None = None
    planner_json: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    setup: Any = None  # the planner's Setup (built for the local GPU), when it ran
    prepared: Any = None


def local_gpu_selection(name: str, total: int, count: int) -> Any:
    from kvplan import gpus

    gpu = gpus.match_local(name, total) or gpus.sized_gpu(total)
    return gpus.GpuSelection(gpu=gpu, count=count, requested=name)


def predicted_fit(setup: Any, mo: Any, eo: Any, ctx: int | None, batch: int, *, memory_limit: int | None,
                   device_name: str | None = None, device_total: int | None = None) -> PredictedFit:
    """Weights and KV budget per GPU. With --memory-limit: budget = limit - predicted weights (no planner needed).
    Otherwise kvplan fit's figures for the local GPU (matched in the catalog, or a generic device of its CUDA
    total)."""
    stage = setup.prepared.plan(ctx or 1, 1).limiting_stage
    weights = setup.weight_bytes(stage)
    if memory_limit is not None:
        return PredictedFit(weights, memory_limit - weights, "memory limit",
                            notes=[f"KV budget = --memory-limit {memory_limit:,} B - predicted weights {weights:,} B"])
    from kvplan import planner

    if device_total is None:
        raise EnvironmentProblem("--fit without --memory-limit needs a GPU whose memory kvplan fit can budget; "
                                 "pass --memory-limit SIZE")
    gpu = local_gpu_selection(device_name or "local GPU", device_total, setup.tp * setup.pp)
    fit = planner.fit_model(mo, eo, gpu, ctx, batch, tp=setup.tp, pp=setup.pp)
    out = PredictedFit(int(fit.weight_bytes), int(fit.kv_budget_bytes), "kvplan fit",
                       planner_max_batch=int(fit.capacity.max_batch),
                       planner_max_ctx=int(fit.max_ctx) if fit.max_ctx is not None else None)
    out.setup = fit.setup
    out.prepared = fit.setup.prepared
    out.planner_json = fit.to_json()
    out.notes.append(f"weights and KV budget from kvplan fit for {gpu.gpu.name} ({fmt_bytes(gpu.total_bytes)})")
    return out


def plan_limits(prepared: Any, mode: str, ctx: int, batch: int, budget: int, max_ctx: int | None) -> tuple[int, int]:
    """(largest n whose plan fits `budget`, the search cap). mode 'batch': n = batch at ctx; 'ctx': n = ctx at batch."""
    if budget <= 0:
        return 0, 1
    if mode == "batch":
        one = prepared.plan(ctx, 1).kv_bytes
        cap = max(4, 2 * (budget // max(one, 1)) + 16)
        return max(0, largest_ok(lambda b: prepared.plan(ctx, b).kv_bytes <= budget, 1, 1, cap)), cap
    cap = max_ctx or UNBOUNDED_CTX
    return max(0, largest_ok(lambda c: prepared.plan(c, batch).kv_bytes <= budget, min(4096, cap), 1, cap)), cap


def within_one_step(prepared: Any, mode: str, ctx: int, batch: int, a: int, b: int) -> bool:
    """True when a and b are at most one request (batch) or one allocation step of context apart: the plan at
    the larger holds no more bytes than the first plan that outgrows the smaller's."""
    lo, hi = min(a, b), max(a, b)
    if hi - lo <= 1:
        return True
    if mode == "batch":
        return False

    def nbytes(c: int) -> int:
        return prepared.plan(c, batch).kv_bytes

    base = nbytes(max(lo, 1))
    top = nbytes(hi)
    if top <= base:
        return True
    left, right = max(lo, 1) + 1, hi  # the first ctx whose plan outgrows `base`
    while left < right:
        mid = (left + right) // 2
        if nbytes(mid) > base:
            right = mid
        else:
            left = mid + 1
    return top <= nbytes(left)


@dataclass
class FitCheck:
    mode: str  # batch | ctx
    device: str
    ctx: int
    batch: int
    weight_bytes: int
    kv_budget_bytes: int
    predicted: int
    measured: int
    cap: int
    within_one: bool
    source: str
    plan_predicted: int
    planner_predicted: int | None = None
    trials: list[dict[str, Any]] = field(default_factory=list)
    fraction: float | None = None
    restored_fraction: float | None = None
    fraction_restored: bool = True
    allocator_rounding_bytes: int | None = None
    os_overhead_bytes: int | None = None
    notes: list[str] = field(default_factory=list)
    planner_json: dict[str, Any] | None = None

    @property
    def difference(self) -> int:
        return self.measured - self.predicted

    @property
    def passed(self) -> bool:
        return self.within_one and self.fraction_restored

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "mode": "max_batch" if self.mode == "batch" else "max_ctx",
            "ctx": self.ctx if self.mode == "batch" else None,
            "batch": self.batch if self.mode == "ctx" else None,
            "weight_bytes": self.weight_bytes,
            "kv_budget_bytes": self.kv_budget_bytes,
            "budget_source": self.source,
            "memory_limit_bytes": self.weight_bytes + self.kv_budget_bytes if self.source == "memory limit" else None,
            "predicted": self.predicted,
            "predicted_from_plan": self.plan_predicted,
            "predicted_by_kvplan_fit": self.planner_predicted,
            "measured": self.measured,
            "difference": self.difference,
            "search_cap": self.cap,
            "within_one_step": self.within_one,
            "trials": self.trials,
            "allocator_rounding_bytes": self.allocator_rounding_bytes,
            "os_overhead_bytes": self.os_overhead_bytes,
            "passed": self.passed,
            "notes": self.notes,
        }
        if self.fraction is not None:
            out["memory_fraction"] = self.fraction
            out["memory_fraction_restored_to"] = self.restored_fraction
            out["memory_fraction_restored"] = self.fraction_restored
        if self.planner_json is not None:
            out["fit"] = self.planner_json
        return out


def _mode_plan(prepared: Any, mode: str, ctx: int, batch: int) -> Callable[[int], CachePlan]:
    return (lambda n: prepared.plan(ctx, n)) if mode == "batch" else (lambda n: prepared.plan(n, batch))


def _start(prepared: Any, mode: str, ctx: int, batch: int, pred: PredictedFit, max_ctx: int | None) -> FitCheck:
    plan_pred, cap = plan_limits(prepared, mode, ctx, batch, pred.kv_budget_bytes, max_ctx)
    planner_pred = pred.planner_max_batch if mode == "batch" else pred.planner_max_ctx
    predicted = planner_pred if planner_pred is not None else plan_pred
    fc = FitCheck(mode, "", ctx, batch, pred.weight_bytes, pred.kv_budget_bytes, predicted, 0, cap, False,
                  pred.source, plan_pred, planner_pred, notes=list(pred.notes), planner_json=pred.planner_json)
    if planner_pred is not None and planner_pred != plan_pred:
        fc.notes.append(f"kvplan fit says {planner_pred:,}, the plan under the same budget {plan_pred:,} "
                        "(engine rules such as the null block or a running-request cap)")
    return fc


def _finish(fc: FitCheck, prepared: Any) -> FitCheck:
    fc.within_one = within_one_step(prepared, fc.mode, fc.ctx, fc.batch, fc.predicted, fc.measured)
    if fc.measured >= fc.cap:
        fc.notes.append(f"every plan up to the search cap {fc.cap:,} allocated (the cache stops growing)")
    return fc


# ---------------------------------------------------------------------------------------------- CUDA
def cuda_fit(backend: Any, prepared: Any, mode: str, ctx: int, batch: int, pred: PredictedFit,
             max_ctx: int | None) -> FitCheck:
    fc = _start(prepared, mode, ctx, batch, pred, max_ctx)
    fc.device = backend.info.device
    plan_of = _mode_plan(prepared, mode, ctx, batch)
    if fc.predicted >= 1:
        sizes = [t.nbytes for t in plan_of(fc.predicted).tensors for _ in range(t.count)]
        _, reserved, _ = expected_allocator(sizes)
        if reserved is not None:
            fc.allocator_rounding_bytes = reserved - plan_of(fc.predicted).kv_bytes
    if pred.kv_budget_bytes <= 0:
        fc.notes.append("the predicted weights leave no KV budget: nothing allocated")
        return _finish(fc, prepared)
    backend.settle()
    start = backend.snapshot()
    available = start.free + max(0, start.reserved - start.allocated)
    if pred.weight_bytes + pred.kv_budget_bytes > available:
        raise EnvironmentProblem(
            f"--fit: weights {pred.weight_bytes:,} B + KV budget {pred.kv_budget_bytes:,} B exceed what "
            f"{backend.info.device} has free ({available:,} B, {fmt_bytes(available)}); nothing was allocated "
            "(another process holds memory, or pass a smaller --memory-limit)")
    torch = backend.torch
    oom = backend.oom_errors
    old = backend.get_fraction()
    try:
        weights = backend.new((pred.weight_bytes,), "uint8") if pred.weight_bytes > 0 else None
    except RuntimeError as e:  # torch.OutOfMemoryError included
        raise EnvironmentProblem(f"--fit: {backend.info.device} cannot hold the predicted weights "
                                 f"({pred.weight_bytes:,} B): {str(e).splitlines()[0][:160]}") from None
    fraction_set = False
    try:
        held = backend.snapshot()
        total = held.total or backend.info.total_bytes
        fc.fraction = min(1.0, (held.reserved + pred.kv_budget_bytes) / total)
        backend.set_fraction(fc.fraction)
        fraction_set = True

        def ok(n: int) -> bool:
            """Does plan n allocate when the device may reserve the KV budget plus the segment rounding that
            allocating the plan tensor by tensor adds (the allocator model's figure for exactly these tensors,
            after the weights)? The engine allocates its pool in one piece, so that rounding is verify's own,
            not the engine's; the cap must not count it against the budget. An allocator that rounds more than
            the model fails here."""
            if len(fc.trials) >= MAX_TRIALS:
                raise EnvironmentProblem(f"--fit: no answer after {MAX_TRIALS} allocations")
            plan = plan_of(n)
            rounding = _rounding_after(pred.weight_bytes, plan)
            fraction = min(1.0, (held.reserved + pred.kv_budget_bytes + rounding) / total)
            backend.set_fraction(fraction)
            fc.fraction = fraction
            tensors = []
            try:
                for t in plan.tensors:
                    for _ in range(t.count):
                        tensors.append(backend.new(t.shape, t.dtype))
                snap = backend.snapshot()
                fc.trials.append({"n": n, "ok": True, "plan_bytes": plan.kv_bytes, "rounding_bytes": rounding,
                                  "reserved_bytes": snap.reserved - held.reserved})
                return True
            except oom:
                fc.trials.append({"n": n, "ok": False, "plan_bytes": plan.kv_bytes, "rounding_bytes": rounding})
                return False
            except RuntimeError as e:  # anything but an out-of-memory is a broken device, not an answer
                raise EnvironmentProblem(f"--fit: {backend.info.device} failed while allocating: "
                                         f"{str(e).splitlines()[0][:200]}") from None
            finally:
                del tensors
                torch.cuda.empty_cache()

        fc.measured = max(0, largest_ok(ok, max(fc.predicted, 1), 1, fc.cap))
    finally:
        if fraction_set:
            backend.set_fraction(old)
            fc.restored_fraction = old
            fc.fraction_restored = abs(backend.get_fraction() - old) < 1e-12
        del weights
        backend.settle()
    return _finish(fc, prepared)


def _rounding_after(weight_bytes: int, plan: CachePlan) -> int:
    """Segment bytes the caching allocator reserves beyond the plan's bytes when the plan's tensors are allocated
    one by one after the weights buffer (the allocator model, configured from the environment); 0 where it does
    not model reserved memory (expandable segments)."""
    model, _ = allocator_config()
    if weight_bytes > 0:
        model.malloc(weight_bytes)
    start = model.reserved
    for t in plan.tensors:
        for _ in range(t.count):
            model.malloc(t.nbytes)
    if model.expandable_segments:
        return 0
    return max(0, model.reserved - start - plan.kv_bytes)


# ---------------------------------------------------------------------------------------------- CPU
FIT_CHILD = r"""
import json, os, resource, sys
import torch

def vm():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise SystemExit("no VmSize in /proc/self/status")

torch.set_num_threads(1)
warm = torch.empty(1 << 20, dtype=torch.uint8); del warm
budget = int(sys.stdin.readline())
print(json.dumps({"vm": vm(), "budget": budget}), flush=True)
for line in sys.stdin:
    spec = json.loads(line)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        # the trial: a copy of this process whose address space may grow by `budget` and no more
        os.close(r)
        held = []
        base = vm()
        resource.setrlimit(resource.RLIMIT_AS, (base + budget, resource.RLIM_INFINITY))
        try:
            for shape, dtype, count in spec:
                dt = getattr(torch, dtype)
                for _ in range(count):
                    held.append(torch.empty(shape, dtype=dt))
            result = {"ok": True, "vm_delta": vm() - base}
        except (RuntimeError, MemoryError) as e:
            held = None
            result = {"ok": False, "error": str(e).splitlines()[0][:200]}
        os.write(w, json.dumps(result).encode())
        os._exit(0)
    os.close(w)
    data = b""
    while True:
        chunk = os.read(r, 65536)
        if not chunk:
            break
        data += chunk
    os.close(r)
    _, status = os.waitpid(pid, 0)
    if not data:
        data = json.dumps({"ok": False, "error": f"trial process ended with status {status}"}).encode()
    print(data.decode(), flush=True)
"""


class _FitChild:
    def __init__(self, budget: int, timeout: float):
        env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536", MALLOC_ARENA_MAX="1")
        self.timeout = timeout
        self.proc = subprocess.Popen([python_executable(), "-c", FIT_CHILD], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        self.header = self._ask(str(budget))

    def _ask(self, line: str) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write(line + "\n")
            self.proc.stdin.flush()
            reply = self.proc.stdout.readline()
        except BrokenPipeError:
            reply = ""
        if not reply:
            err = (self.proc.stderr.read() if self.proc.stderr else "").strip().splitlines()
            raise EnvironmentProblem(f"--fit: the RLIMIT_AS child failed: {err[-1] if err else 'no output'}")
        return json.loads(reply)

    def trial(self, plan: CachePlan) -> dict[str, Any]:
        spec = [[list(t.shape), t.dtype, t.count] for t in plan.tensors]
        return self._ask(json.dumps(spec, separators=(",", ":")))

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                if self.proc.stdin:
                    self.proc.stdin.close()
                self.proc.wait(timeout=10)
            except (subprocess.TimeoutExpired, OSError):
                self.proc.kill()
                self.proc.wait()


def cpu_fit(prepared: Any, mode: str, ctx: int, batch: int, pred: PredictedFit, max_ctx: int | None,
            timeout: float = 600) -> FitCheck:
    import resource
    import sys

    if not sys.platform.startswith("linux"):
        raise EnvironmentProblem("--fit on CPU caps a child's address space with RLIMIT_AS and reads "
                                 "/proc/self/status: Linux only")
    if not hasattr(resource, "RLIMIT_AS"):  # pragma: no cover
        raise EnvironmentProblem("--fit on CPU needs RLIMIT_AS, which this system lacks")
    fc = _start(prepared, mode, ctx, batch, pred, max_ctx)
    fc.device = "cpu"
    fc.notes.append("weights charged to --memory-limit, not allocated; each candidate plan is allocated by a "
                    "process whose address space is capped with RLIMIT_AS at its size + the KV budget")
    if pred.kv_budget_bytes <= 0:
        fc.notes.append("the predicted weights exceed --memory-limit: no KV budget, nothing allocated")
        return _finish(fc, prepared)
    plan_of = _mode_plan(prepared, mode, ctx, batch)
    child = _FitChild(pred.kv_budget_bytes, timeout)
    vm_at: dict[int, int] = {}
    try:
        def ok(n: int) -> bool:
            if len(fc.trials) >= MAX_TRIALS:
                raise EnvironmentProblem(f"--fit: no answer after {MAX_TRIALS} allocations")
            plan = plan_of(n)
            r = child.trial(plan)
            fc.trials.append({"n": n, "ok": r["ok"], "plan_bytes": plan.kv_bytes, **(
                {"address_space_bytes": r["vm_delta"]} if r.get("ok") else {"error": r.get("error")})})
            if r.get("ok"):
                vm_at[n] = int(r["vm_delta"])
            return bool(r["ok"])

        fc.measured = max(0, largest_ok(ok, max(fc.predicted, 1), 1, fc.cap))
    finally:
        child.close()
    if fc.measured in vm_at:
        fc.os_overhead_bytes = vm_at[fc.measured] - plan_of(fc.measured).kv_bytes
    return _finish(fc, prepared)


def check_fit_args(device_kind: str, memory_limit: int | None) -> None:
    if device_kind == "cpu" and memory_limit is None:
        raise InputError("--fit on CPU needs --memory-limit SIZE (e.g. 8GiB): the weights are charged to it and "
                         "the KV budget is the rest")
