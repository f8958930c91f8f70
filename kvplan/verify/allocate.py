"""Allocate a CachePlan with torch, exactly as `size` reports it, and measure what it took.

Every TensorAlloc becomes `count` tensors of its shape and torch dtype (fp8 as torch's float8 dtypes, GGUF block
types and raw paged pools as uint8/int8 byte buffers). CPU: the bytes are the tensors' storages
(untyped_storage().nbytes()); a fresh subprocess touches the large ones and reports RSS growth. CUDA: the
caching allocator's memory_allocated / memory_reserved growth and mem_get_info before/after.
"""

from __future__ import annotations

import json
import os
import subprocess
import traceback
from dataclasses import dataclass, field
from typing import Any

from kvplan.engines.base import CachePlan, TensorAlloc
from kvplan.errors import EnvironmentProblem
from kvplan.units import MiB, fmt_bytes
from kvplan.verify.measure import Backend, expected_allocator, python_executable, round_request

RSS_MIN_TENSOR = 1 * MiB  # tensors at least this large are touched and counted in the RSS check
RSS_SLACK_PER_TENSOR = 2 * MiB  # page / huge-page rounding a touched tensor may add
RSS_SLACK_SHARE = 0.01


@dataclass
class GroupMeasure:
    kind: str
    layers: int
    predicted_bytes: int
    measured_bytes: int = 0
    expected_bytes: int = 0  # what the measurement should read: the prediction after allocator rounding
    tensors: int = 0

    @property
    def passed(self) -> bool:
        return self.measured_bytes == self.expected_bytes

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "layers": self.layers, "predicted_bytes": self.predicted_bytes,
                "measured_bytes": self.measured_bytes, "expected_measured_bytes": self.expected_bytes,
                "tensors": self.tensors, "passed": self.passed}


@dataclass
class AllocationCheck:
    device: str
    predicted_bytes: int
    measured_bytes: int
    expected_bytes: int
    groups: list[GroupMeasure]
    tensors: int
    measured_reserved_bytes: int | None = None
    expected_reserved_bytes: int | None = None
    measured_device_bytes: int | None = None
    released: bool = True
    snapshots: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.measured_bytes == self.expected_bytes and all(g.passed for g in self.groups) and self.released

    @property
    def rounding_bytes(self) -> int | None:
        """What the allocator adds on top of the plan: reserved growth minus the plan's bytes (CUDA)."""
        if self.measured_reserved_bytes is None:
            return None
        return self.measured_reserved_bytes - self.predicted_bytes


def plan_tensors(plan: CachePlan) -> list[tuple[int, TensorAlloc]]:
    return [(i, t) for i, g in enumerate(plan.groups) for t in g.tensors]


def tensor_sizes(plan: CachePlan) -> list[int]:
    """Bytes of every single tensor, in allocation order."""
    return [t.nbytes for _, t in plan_tensors(plan) for _ in range(t.count)]


def allocate_plan(backend: Backend, plan: CachePlan) -> list[list[Any]]:
    """Allocate every tensor of the plan; the tensors per group (caller frees by dropping the lists)."""
    out: list[list[Any]] = [[] for _ in plan.groups]
    for gi, t in plan_tensors(plan):
        for _ in range(t.count):
            out[gi].append(backend.new(t.shape, t.dtype))
    return out


def storage_bytes(tensors: list[Any]) -> int:
    """Bytes of the distinct storages behind `tensors`."""
    seen: dict[int, int] = {}
    for x in tensors:
        st = x.untyped_storage()
        key = st.data_ptr() if st.nbytes() else id(st)
        seen[key] = st.nbytes()
    return sum(seen.values())


def refuse_if_too_large(needed: int, available: int | None, where: str) -> None:
    if available is not None and needed > available:
        raise EnvironmentProblem(
            f"the plan needs {needed:,} B ({fmt_bytes(needed)}) but {where} has {available:,} B "
            f"({fmt_bytes(available)}) available; nothing was allocated (use a smaller --ctx or --batch)")


def check_cpu(backend: Backend, plan: CachePlan) -> AllocationCheck:
    refuse_if_too_large(plan.kv_bytes, backend.available(), "this machine (MemAvailable)")
    groups = [GroupMeasure(g.kind, len(g.layer_ids), g.bytes, expected_bytes=g.bytes) for g in plan.groups]
    try:
        tensors = allocate_plan(backend, plan)
    except (RuntimeError, MemoryError) as e:  # an address-space limit (ulimit -v) below MemAvailable, for one
        traceback.clear_frames(e.__traceback__)
        backend.settle()
        first = (str(e).splitlines() or [type(e).__name__])[0]
        raise EnvironmentProblem(f"cpu: allocating the plan's {plan.kv_bytes:,} B failed although MemAvailable "
                                 f"allowed it (a memory limit?): {first[:200]}") from None
    try:
        for i, gm in enumerate(groups):
            gm.measured_bytes = storage_bytes(tensors[i])
            gm.tensors = len(tensors[i])
        measured = storage_bytes([x for group in tensors for x in group])
    finally:
        del tensors
        backend.settle()
    n = sum(g.tensors for g in groups)
    return AllocationCheck("cpu", plan.kv_bytes, measured, plan.kv_bytes, groups, n,
                           notes=["CPU: measured = the tensors' storage bytes (untyped_storage().nbytes())"])


def _allocate_measuring(backend: Any, plan: CachePlan, groups: list[GroupMeasure], out: list[list[Any]],
                        start: int) -> None:
    """Allocate group by group into `out`, reading memory_allocated after each group (no tensor stays referenced
    from this frame, so the caller's `del` frees everything)."""
    last = start
    for gm, g in zip(groups, plan.groups):
        out.append([backend.new(t.shape, t.dtype) for t in g.tensors for _ in range(t.count)])
        now = int(backend.torch.cuda.memory_allocated(backend.info.device))
        gm.measured_bytes, gm.tensors, last = now - last, len(out[-1]), now


def check_cuda(backend: Any, plan: CachePlan) -> AllocationCheck:
    """Allocate on CUDA from a settled allocator; pass when memory_allocated grows by exactly the allocator
    model's figure (512 B rounding, whole unsplit blocks), per group and in total, and falls back afterwards."""
    sizes = tensor_sizes(plan)
    exp_alloc, exp_reserved, notes = expected_allocator(sizes)
    backend.settle()
    before = backend.snapshot()
    available = before.free + max(0, before.reserved - before.allocated)
    # what the device must supply is whole segments (memory_reserved growth), not the allocated bytes
    needed = max(exp_reserved if exp_reserved is not None else exp_alloc, exp_alloc, plan.kv_bytes)
    refuse_if_too_large(needed, available, f"{backend.info.device} (free memory, counted in allocator segments)")
    groups = [GroupMeasure(g.kind, len(g.layer_ids), g.bytes) for g in plan.groups]
    # expected per group: the same model, run over the groups in order
    from kvplan.verify.measure import allocator_config

    model, _ = allocator_config()
    for gm, g in zip(groups, plan.groups):
        start = model.allocated
        for t in g.tensors:
            for _ in range(t.count):
                model.malloc(t.nbytes)
        gm.expected_bytes = model.allocated - start
    tensors: list[list[Any]] = []
    try:
        _allocate_measuring(backend, plan, groups, tensors, before.allocated)
        backend.torch.cuda.synchronize(backend.info.device)
        during = backend.snapshot()
    except backend.oom_errors as e:
        traceback.clear_frames(e.__traceback__)  # the failed group's partial list lives in those frames
        raise EnvironmentProblem(f"{backend.info.device} ran out of memory while allocating the plan although "
                                 f"{available:,} B were free before (another process?): "
                                 f"{str(e).splitlines()[0][:160]}") from None
    except RuntimeError as e:
        traceback.clear_frames(e.__traceback__)
        raise EnvironmentProblem(f"{backend.info.device}: allocation failed: {str(e).splitlines()[0][:200]}") from None
    finally:
        tensors.clear()  # the list is also referenced from the failed call's frame while an error propagates
        del tensors
        backend.settle()
    after = backend.snapshot()
    naive = sum(round_request(n) for n in sizes)
    if naive != exp_alloc:
        notes.append(f"{exp_alloc - naive:,} B of unsplit block remainders counted as allocated "
                     "(large-pool remainders of 1 MiB or less are not split)")
    check = AllocationCheck(
        backend.info.device, plan.kv_bytes, during.allocated - before.allocated, exp_alloc, groups, len(sizes),
        measured_reserved_bytes=during.reserved - before.reserved, expected_reserved_bytes=exp_reserved,
        measured_device_bytes=before.free - during.free, released=after.allocated == before.allocated,
        snapshots={"before": before.__dict__, "during": during.__dict__, "after": after.__dict__},
        notes=notes,
    )
    if not check.released:
        check.notes.append(f"memory_allocated did not return to its baseline after freeing "
                           f"({after.allocated - before.allocated:+,} B)")
    if exp_reserved is not None and check.measured_reserved_bytes != exp_reserved:
        check.notes.append(f"memory_reserved grew {check.measured_reserved_bytes:,} B; the allocator model from an "
                           f"empty cache says {exp_reserved:,} B (cached blocks from earlier use change this)")
    return check


# ---------------------------------------------------------------------------------------------- RSS child
RSS_CHILD = r"""
import json, os, resource, sys
import torch

def rss():
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return r if sys.platform == "darwin" else r * 1024

spec = json.load(sys.stdin)
torch.set_num_threads(1)
warm = torch.empty(4096, dtype=torch.uint8); warm.fill_(1); del warm
before = rss()
held = []
for t in spec["tensors"]:
    for _ in range(t["count"]):
        x = torch.empty(t["shape"], dtype=getattr(torch, t["dtype"]))
        x.view(-1).view(torch.uint8).fill_(1)
        held.append(x)
after = rss()
print(json.dumps({"before": before, "after": after, "tensors": len(held),
                  "bytes": sum(x.untyped_storage().nbytes() for x in held)}))
"""


@dataclass
class RssCheck:
    expected_bytes: int
    measured_bytes: int | None
    tensors: int
    tolerance_bytes: int
    error: str | None = None

    @property
    def passed(self) -> bool:
        if self.error is not None:
            return False
        if self.measured_bytes is None:
            return True  # nothing of >= 1 MiB to touch
        return abs(self.measured_bytes - self.expected_bytes) <= self.tolerance_bytes

    def to_json(self) -> dict[str, Any]:
        return {"expected_bytes": self.expected_bytes, "rss_delta_bytes": self.measured_bytes,
                "tensors": self.tensors, "tolerance_bytes": self.tolerance_bytes,
                "difference_bytes": None if self.measured_bytes is None else self.measured_bytes - self.expected_bytes,
                "passed": self.passed, "error": self.error}


def rss_tolerance(expected: int, tensors: int) -> int:
    """max(1 %, 2 MiB per touched tensor)."""
    return max(int(expected * RSS_SLACK_SHARE), RSS_SLACK_PER_TENSOR * tensors)


def rss_check(plan: CachePlan, timeout: float = 600) -> RssCheck:
    """Touch every tensor of >= 1 MiB of the plan in a fresh interpreter and read its RSS growth."""
    big = [t for _, t in plan_tensors(plan) if t.nbytes >= RSS_MIN_TENSOR]
    expected = sum(t.total_bytes for t in big)
    count = sum(t.count for t in big)
    check = RssCheck(expected, None, count, rss_tolerance(expected, count))
    if not big:
        return check
    spec = {"tensors": [{"shape": list(t.shape), "dtype": t.dtype, "count": t.count} for t in big]}
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_MMAP_THRESHOLD_="65536")
    try:
        out = subprocess.run([python_executable(), "-c", RSS_CHILD], input=json.dumps(spec), capture_output=True,
                             text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        check.error = f"the RSS child did not finish within {timeout:.0f} s"
        return check
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["no output"])[-1]
        check.error = f"the RSS child failed: {last}"
        return check
    data = json.loads(out.stdout.strip().splitlines()[-1])
    check.measured_bytes = data["after"] - data["before"]
    return check
