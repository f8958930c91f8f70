"""Measurement backends for `kvplan verify`: one small interface, a CUDA and a CPU implementation.

A backend knows its device (name, totals, free memory), makes tensors there, and takes snapshots of what the
allocator holds. Every torch call goes through `torch.<name>` looked up at call time, so tests can replace
torch.cuda.memory_allocated, memory_reserved, mem_get_info, set_per_process_memory_fraction and torch.empty
with a fake device (tests/test_verify_cuda.py) and run the real CUDA code path without a GPU.

The CUDA caching allocator (c10/cuda/CUDACachingAllocator.cpp, engines.md section 6) is modelled in
`AllocatorModel`: requests rounded up to 512 B; <= 1 MiB from 2 MiB small-pool segments; 1-10 MiB from 20 MiB
segments; >= 10 MiB from a segment rounded up to 2 MiB; best fit among free blocks of the pool; a block is split
only when the remainder is >= 512 B (small pool) or > 1 MiB (large pool), and `memory_allocated` counts the whole
block, so an unsplit remainder counts as allocated.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from typing import Any

from kvplan.errors import EnvironmentProblem, InputError
from kvplan.units import MiB

K_MIN_BLOCK = 512
K_SMALL_SIZE = 1 * MiB
K_SMALL_BUFFER = 2 * MiB
K_LARGE_BUFFER = 20 * MiB
K_MIN_LARGE_ALLOC = 10 * MiB
K_ROUND_LARGE = 2 * MiB

TORCH_MISSING = 'kvplan verify needs torch, which is not installed: pip install "kvplan[verify]"'


def require_torch() -> Any:
    """Import torch (only verify does); a missing torch is one line and exit 2."""
    try:
        import torch
    except ImportError:
        raise EnvironmentProblem(TORCH_MISSING) from None
    return torch


def torch_dtype(torch: Any, name: str) -> Any:
    """A CachePlan dtype name ("float16", "float8_e4m3fn", "uint8", ...) -> the torch dtype."""
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype):
        raise EnvironmentProblem(f"this torch ({torch.__version__}) has no dtype {name!r}; a newer torch is needed "
                                 "to allocate this plan")
    return dt


# ---------------------------------------------------------------------------------------------- allocator model
def round_request(n: int) -> int:
    """CUDACachingAllocator round_size: 0 stays 0 (no block), else up to a multiple of 512 B (at least 512)."""
    if n <= 0:
        return 0
    return max(K_MIN_BLOCK, -(-n // K_MIN_BLOCK) * K_MIN_BLOCK)


def segment_size(rounded: int) -> int:
    """get_allocation_size: the cudaMalloc segment for a request that no cached block serves."""
    if rounded <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if rounded < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return -(-rounded // K_ROUND_LARGE) * K_ROUND_LARGE


@dataclass
class AllocatorModel:
    """The native caching allocator, from an empty cache, for allocations that are never freed.

    expandable_segments: remainders are split from 512 B in both pools (no whole-block rounding; reserved is
    then grown in pages and not modelled). max_split_size: blocks at or above it are never split, and oversized
    cached blocks are not handed to smaller requests (PYTORCH_CUDA_ALLOC_CONF max_split_size_mb).
    """

    expandable_segments: bool = False
    max_split_size: int | None = None
    max_non_split_rounding: int = K_LARGE_BUFFER  # an oversized cached block is used within this much (20 MiB)
    allocated: int = 0
    reserved: int = 0
    segments: int = 0
    free_small: list[int] = field(default_factory=list)
    free_large: list[int] = field(default_factory=list)

    def malloc(self, nbytes: int) -> int:
        """Allocate one tensor of `nbytes`; returns the block size memory_allocated grows by."""
        size = round_request(nbytes)
        if size == 0:
            return 0
        small = size <= K_SMALL_SIZE
        pool = self.free_small if small else self.free_large
        block = self._best_fit(pool, size)
        if block is None:
            block = segment_size(size)
            self.reserved += block
            self.segments += 1
        remaining = block - size
        if self._should_split(small, size, remaining):
            pool.append(remaining)
            block = size
        self.allocated += block
        return block

    def _best_fit(self, pool: list[int], size: int) -> int | None:
        fits = [b for b in pool if b >= size]
        if not fits:
            return None
        best = min(fits)
        mss = self.max_split_size
        if mss is not None:
            if size < mss <= best:
                return None
            if size >= mss and best >= size + self.max_non_split_rounding:
                return None
        pool.remove(best)
        return best

    def _should_split(self, small: bool, size: int, remaining: int) -> bool:
        if small or self.expandable_segments:
            return remaining >= K_MIN_BLOCK
        if self.max_split_size is not None and size >= self.max_split_size:
            return False
        return remaining > K_SMALL_SIZE


_NOT_MODELLED = ("roundup_power2_divisions", "garbage_collection_threshold", "release_lock_on_cudamalloc",
                 "graph_capture_record_stream_reuse", "per_process_memory_fraction")


def allocator_config(env: dict[str, str] | None = None) -> tuple[AllocatorModel, list[str]]:
    """An empty AllocatorModel configured as torch >= 2.8 reads the environment, and notes on what the model does
    not reproduce. The device-generic settings modelled here (max_split_size_mb, max_non_split_rounding_mb,
    expandable_segments) come from c10's AcceleratorAllocatorConfig, for which PYTORCH_ALLOC_CONF is primary and
    PYTORCH_CUDA_ALLOC_CONF the lower-priority legacy name (c10/core/AllocatorConfig.h)."""
    env = os.environ if env is None else env
    text = env.get("PYTORCH_ALLOC_CONF") or env.get("PYTORCH_CUDA_ALLOC_CONF") or ""
    model, notes = AllocatorModel(), []
    for part in _settings(text):
        key, _, value = part.partition(":")
        key, value = key.strip(), value.strip()
        if key == "expandable_segments":
            model.expandable_segments = value.lower() == "true"
        elif key in ("max_split_size_mb", "max_non_split_rounding_mb"):
            try:
                mib = int(float(value) * MiB)
            except ValueError:
                notes.append(f"allocator setting {part!r} not understood")
                continue
            if key == "max_split_size_mb":
                model.max_split_size = mib
            else:
                model.max_non_split_rounding = mib
        elif key == "backend":
            if value != "native":
                notes.append(f"allocator backend {value}: the native caching allocator's rounding is not modelled")
        elif key.startswith("pinned_"):
            continue  # the host (pinned) allocator: no device memory
        elif key in _NOT_MODELLED or key:
            notes.append(f"allocator setting {key} is not modelled")
    if model.expandable_segments:
        notes.append("expandable_segments: blocks split from 512 B; reserved grows in pages (reserved not modelled)")
    return model, notes


def _settings(text: str) -> list[str]:
    """`a:1,b:[x:1,y:2],c:true` -> ['a:1', 'b:[x:1,y:2]', 'c:true'] (commas inside brackets stay)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += (ch == "[") - (ch == "]")
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return [p for p in out if p]


def expected_allocator(sizes: list[int], env: dict[str, str] | None = None) -> tuple[int, int | None, list[str]]:
    """(memory_allocated growth, memory_reserved growth or None, notes) for tensors of `sizes` bytes allocated in
    order from an empty cache."""
    model, notes = allocator_config(env)
    for n in sizes:
        model.malloc(n)
    return model.allocated, (None if model.expandable_segments else model.reserved), notes


# ---------------------------------------------------------------------------------------------- backends
@dataclass(frozen=True)
class Snapshot:
    allocated: int | None = None  # torch.cuda.memory_allocated
    reserved: int | None = None  # torch.cuda.memory_reserved
    free: int | None = None  # mem_get_info free (CUDA) / MemAvailable (CPU)
    total: int | None = None


@dataclass(frozen=True)
class DeviceInfo:
    kind: str  # cuda | cpu
    device: str  # "cuda:0" | "cpu"
    index: int | None
    name: str
    total_bytes: int | None
    torch_version: str

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "device": self.device, "index": self.index, "name": self.name,
                "total_bytes": self.total_bytes, "torch": self.torch_version}


class Backend:
    """What verify needs from a device."""

    kind = "?"

    def __init__(self, torch: Any, info: DeviceInfo):
        self.torch = torch
        self.info = info

    def new(self, shape: tuple[int, ...], dtype: str) -> Any:
        return self.torch.empty(tuple(shape), dtype=torch_dtype(self.torch, dtype), device=self.info.device)

    def snapshot(self) -> Snapshot:
        raise NotImplementedError

    def available(self) -> int | None:
        """Bytes a new allocation can still get on this device."""
        raise NotImplementedError

    def settle(self) -> None:
        """Wait for the device and hand cached memory back (before a baseline and after freeing)."""


class CudaBackend(Backend):
    kind = "cuda"

    def snapshot(self) -> Snapshot:
        cuda, dev = self.torch.cuda, self.info.device
        free, total = cuda.mem_get_info(dev)
        return Snapshot(int(cuda.memory_allocated(dev)), int(cuda.memory_reserved(dev)), int(free), int(total))

    def available(self) -> int:
        s = self.snapshot()
        return s.free + max(0, s.reserved - s.allocated)

    def settle(self) -> None:
        import gc

        gc.collect()
        self.torch.cuda.synchronize(self.info.device)
        self.torch.cuda.empty_cache()

    def get_fraction(self) -> float:
        getter = getattr(self.torch.cuda, "get_per_process_memory_fraction", None)
        return float(getter(self.info.device)) if getter else 1.0

    def set_fraction(self, fraction: float) -> None:
        self.torch.cuda.set_per_process_memory_fraction(fraction, self.info.device)

    @property
    def oom_errors(self) -> tuple[type, ...]:
        return tuple({getattr(self.torch, "OutOfMemoryError", RuntimeError),
                      getattr(self.torch.cuda, "OutOfMemoryError", RuntimeError)})


class CpuBackend(Backend):
    kind = "cpu"

    def snapshot(self) -> Snapshot:
        return Snapshot(free=mem_available(), total=mem_total())

    def available(self) -> int | None:
        return mem_available()

    def settle(self) -> None:
        """Tensors are freed by reference counting; a young-generation pass collects the cycles a check leaves
        (a full collection per allocation check cost about a fifth of the test suite's time)."""
        import gc

        gc.collect(0)


def _meminfo(key: str) -> int | None:
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def mem_available() -> int | None:
    """Linux MemAvailable; elsewhere free physical pages (sysconf), or None when neither is known."""
    value = _meminfo("MemAvailable")
    if value is not None:
        return value
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def mem_total() -> int | None:
    value = _meminfo("MemTotal")
    if value is not None:
        return value
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "cpu"


def open_backend(device: str | None) -> Backend:
    """`--device` (auto | cpu | cuda | cuda:N) -> a backend. auto is CUDA when torch sees a device, else CPU."""
    torch = require_torch()
    text = (device or "auto").strip().lower()
    if text in ("auto", ""):
        text = "cuda" if _cuda_available(torch) else "cpu"
    if text == "cpu":
        return CpuBackend(torch, DeviceInfo("cpu", "cpu", None, cpu_name(), mem_total(), torch.__version__))
    if text == "cuda" or text.startswith("cuda:"):
        index_text = text.partition(":")[2] or "0"
        if not index_text.isdigit():
            raise InputError(f"--device {device!r}: expected cuda:N with N a device index, e.g. cuda:0")
        index = int(index_text)
        if not _cuda_available(torch):
            built = getattr(torch.version, "cuda", None)
            why = f"torch {torch.__version__} was built without CUDA" if not built else \
                "torch sees no CUDA device (driver missing, or CUDA_VISIBLE_DEVICES hides them)"
            raise EnvironmentProblem(f"--device {text}: {why}; use --device cpu")
        count = int(torch.cuda.device_count())
        if index >= count:
            raise EnvironmentProblem(f"--device {text}: device index out of range; this machine has {count} CUDA "
                                     f"device(s): cuda:0..cuda:{count - 1}")
        dev = f"cuda:{index}"
        props = torch.cuda.get_device_properties(index)
        return CudaBackend(torch, DeviceInfo("cuda", dev, index, str(props.name), int(props.total_memory),
                                             torch.__version__))
    raise InputError(f"--device {device!r}: accepted auto, cpu, cuda, cuda:N")


def _cuda_available(torch: Any) -> bool:
    try:
        return bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover - broken driver installs raise here
        return False


def python_executable() -> str:
    return sys.executable
