"""The CUDA branch of `kvplan verify` without a GPU: torch.cuda's measurement functions and torch.empty on a
"cuda" device are replaced by a fake device, so the real code path (allocator rounding, refusal, OOM bisection,
memory-fraction restore) runs in CI. The fake gives every tensor its own cudaMalloc segment, sized by the rules
of engines.md section 6; tests use plans of equal-sized tensors, where that is what the caching allocator does.
Tests that need a real GPU are marked `cuda` and skip without one.

The allocator model (kvplan.verify.measure.AllocatorModel) is checked separately against hand-computed cases
from c10/cuda/CUDACachingAllocator.cpp.
"""

from __future__ import annotations

import copy
import weakref
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

from conftest import kvjson, run_cli  # noqa: E402
from kvplan.sizing import EngineOptions, ModelOptions, size  # noqa: E402
from kvplan.verify import measure  # noqa: E402
from kvplan.verify.measure import AllocatorModel, expected_allocator  # noqa: E402

MiB, GiB = 1 << 20, 1 << 30
H100_TOTAL = 85027979264  # catalog H100-SXM-80GB CUDA total (81089 MiB)


# ---------------------------------------------------------------------------------------------- allocator model
def test_requests_round_to_512_bytes():
    m = AllocatorModel()
    assert m.malloc(1) == 512 and m.malloc(512) == 512 and m.malloc(513) == 1024 and m.malloc(0) == 0
    assert m.reserved == 2 * MiB and m.segments == 1  # all from one small-pool segment


def test_small_requests_share_2mib_segments():
    m = AllocatorModel()
    for _ in range(4):
        m.malloc(MiB // 2)  # 4 x 512 KiB = one 2 MiB segment
    assert (m.allocated, m.reserved, m.segments) == (2 * MiB, 2 * MiB, 1)
    m.malloc(MiB)  # exactly kSmallSize: still the small pool, a new 2 MiB segment
    assert (m.reserved, m.segments) == (4 * MiB, 2)


def test_mid_sized_requests_split_a_20mib_segment():
    m = AllocatorModel()
    m.malloc(3 * MiB)
    m.malloc(3 * MiB)
    assert (m.allocated, m.reserved, m.segments) == (6 * MiB, 20 * MiB, 1)
    m.malloc(MiB + 1)  # large pool (> 1 MiB): rounded to 512 B, served from the same segment's remainder
    assert m.allocated == 6 * MiB + MiB + 512 and m.segments == 1


def test_large_requests_round_segments_to_2mib_and_keep_small_remainders():
    m = AllocatorModel()
    assert m.malloc(11 * MiB) == 12 * MiB  # 1 MiB remainder is not > kSmallSize: the whole block is allocated
    m2 = AllocatorModel()
    assert m2.malloc(10 * MiB + 512) == 10 * MiB + 512  # remainder 2 MiB - 512 > 1 MiB: split off
    assert m2.reserved == 12 * MiB and m2.free_large == [2 * MiB - 512]
    # reuses that remainder (best fit, no new segment); what is left (< 1 MiB) is not split, so the request
    # is charged the whole 2 MiB - 512 block
    assert m2.malloc(MiB + 1024) == 2 * MiB - 512
    assert m2.segments == 1 and m2.free_large == []


def test_best_fit_reuses_a_remainder_for_a_later_large_request():
    m = AllocatorModel()
    m.malloc(3 * MiB)  # 20 MiB segment, 17 MiB free
    m.malloc(12 * MiB)  # >= 10 MiB but fits the 17 MiB remainder: no new segment
    assert (m.segments, m.reserved, m.allocated) == (1, 20 * MiB, 15 * MiB)


def test_expandable_segments_and_max_split_size_settings():
    model, notes = measure.allocator_config({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert model.expandable_segments and model.malloc(11 * MiB) == 11 * MiB and notes
    alloc, reserved, _ = expected_allocator([11 * MiB], {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"})
    assert alloc == 11 * MiB and reserved is None
    model, _ = measure.allocator_config({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:64"})
    assert model.max_split_size == 64 * MiB
    assert model.malloc(100 * MiB + 4 * MiB) == 104 * MiB  # at or above max_split_size: never split
    model2, _ = measure.allocator_config({})
    assert model2.max_split_size is None and not model2.expandable_segments


# ---------------------------------------------------------------------------------------------- fake device
class FakeCuda:
    """One fake CUDA device: free memory, the caching allocator's allocated/reserved counters, the memory
    fraction cap, and out-of-memory on demand."""

    def __init__(self, monkeypatch, total=H100_TOTAL, free=None, name="NVIDIA H100 80GB HBM3", count=1):
        self.total, self.name, self.count = total, name, count
        self.context = 500 * MiB  # what the CUDA context and other processes hold
        self.free0 = free if free is not None else total - self.context
        self.allocated = self.reserved = 0
        self.fraction = 1.0
        self.fraction_calls: list[float] = []
        self.allocations = 0
        self.fail_next: Exception | None = None
        self.fail_at: int | None = None  # out of memory at this allocation number (0-based)
        self.settled: list[int] = []  # memory_allocated each time the allocator cache is emptied
        self.leak = 0
        self._real_empty = torch.empty
        mp = monkeypatch
        mp.setattr(torch, "empty", self.empty)
        mp.setattr(torch.cuda, "is_available", lambda: True)
        mp.setattr(torch.cuda, "device_count", lambda: self.count)
        mp.setattr(torch.cuda, "get_device_properties",
                   lambda i: SimpleNamespace(name=self.name, total_memory=self.total, major=9, minor=0))
        mp.setattr(torch.cuda, "memory_allocated", lambda device=None: self.allocated)
        mp.setattr(torch.cuda, "memory_reserved", lambda device=None: self.reserved)
        mp.setattr(torch.cuda, "mem_get_info", lambda device=None: (self.free0 - self.reserved, self.total))
        mp.setattr(torch.cuda, "set_per_process_memory_fraction", self.set_fraction)
        mp.setattr(torch.cuda, "get_per_process_memory_fraction", lambda device=None: self.fraction)
        mp.setattr(torch.cuda, "empty_cache", lambda: self.settled.append(self.allocated))
        mp.setattr(torch.cuda, "synchronize", lambda device=None: None)

    def set_fraction(self, fraction, device=None):
        assert 0 < fraction <= 1
        self.fraction = fraction
        self.fraction_calls.append(fraction)

    @staticmethod
    def block(n: int) -> tuple[int, int]:
        """(allocated block, segment) for a tensor alone in its own segment (engines.md section 6)."""
        if n == 0:
            return 0, 0
        r = max(512, -(-n // 512) * 512)
        seg = 2 * MiB if r <= MiB else 20 * MiB if r < 10 * MiB else -(-r // (2 * MiB)) * 2 * MiB
        remainder = seg - r
        split = remainder >= 512 if r <= MiB else remainder > MiB
        return (r if split else seg), seg

    def empty(self, *shape, dtype=None, device=None, **kw):
        if device is None or not str(device).startswith("cuda"):
            return self._real_empty(*shape, dtype=dtype, device=device, **kw)
        t = self._real_empty(*shape, dtype=dtype, device="meta")
        if self.fail_next is not None:
            e, self.fail_next = self.fail_next, None
            raise e
        if self.fail_at is not None and self.allocations == self.fail_at:
            raise torch.OutOfMemoryError("CUDA out of memory (fake, at a set allocation)")
        return self._allocate(t, t.numel() * t.element_size())

    def _allocate(self, t, n: int):
        """One tensor alone in its own segment."""
        blk, seg = self.block(n)
        if self.reserved + seg > self.fraction * self.total or self.reserved + seg > self.free0:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n} bytes (fake)")
        blk += self.leak
        self.allocated += blk
        self.reserved += seg
        self.allocations += 1
        weakref.finalize(t, self._free, blk, seg)
        return t

    def _free(self, blk, seg):
        self.allocated -= blk
        self.reserved -= seg


@pytest.fixture
def fake(monkeypatch):
    return FakeCuda(monkeypatch)


class AllocatorCuda(FakeCuda):
    """The fake device with the caching allocator's rules instead of one segment per tensor: blocks come from
    cached segments by best fit and remainders split as c10's CUDACachingAllocator splits them (kvplan's
    AllocatorModel, held to the C++ constants by the tests above), and the fraction cap is checked against reserved
    segments, as set_per_process_memory_fraction does. Freed blocks stay reserved until empty_cache, which releases
    every segment no live tensor holds (replayed from the live tensors, oldest first)."""

    def __init__(self, monkeypatch, **kw):
        super().__init__(monkeypatch, **kw)
        self.live: dict[int, int] = {}  # allocation number -> bytes
        self.model = AllocatorModel()
        monkeypatch.setattr(torch.cuda, "empty_cache", self.empty_cache)

    def empty_cache(self):
        self.model = AllocatorModel()
        for n in self.live.values():
            self.model.malloc(n)
        self.allocated, self.reserved = self.model.allocated, self.model.reserved
        self.settled.append(self.allocated)

    def _allocate(self, t, n: int):
        trial = copy.deepcopy(self.model)
        block = trial.malloc(n)
        if trial.reserved > self.fraction * self.total or trial.reserved > self.free0:
            raise torch.OutOfMemoryError(f"CUDA out of memory. Tried to allocate {n} bytes (allocator model)")
        self.model = trial
        self.allocated, self.reserved = self.allocated + block, trial.reserved
        key = self.allocations
        self.allocations += 1
        self.live[key] = n
        weakref.finalize(t, self._release, key, block)
        return t

    def _release(self, key, block):
        del self.live[key]
        self.allocated -= block


def test_vllm_pools_allocate_exactly_on_cuda(fake):
    d = kvjson("verify", "llama-3.1-8b", "--ctx", "8k", "--batch", "4")  # --device auto picks the (fake) GPU
    assert d["device"]["kind"] == "cuda" and d["device"]["name"] == "NVIDIA H100 80GB HBM3"
    assert d["device"]["total_bytes"] == H100_TOTAL
    plan = size(ModelOptions("llama-3.1-8b"), EngineOptions("vllm"), 8192, 4).plan
    assert d["predicted_bytes"] == plan.kv_bytes == 32 * 128 * MiB
    assert d["measured_bytes"] == d["expected_measured_bytes"] == plan.kv_bytes  # 128 MiB tensors: no rounding
    assert d["measured_reserved_bytes"] == d["expected_reserved_bytes"] == plan.kv_bytes
    assert d["measured_device_bytes"] == plan.kv_bytes  # mem_get_info free fell by the segments
    assert d["allocator_rounding_bytes"] == 0
    assert d["passed"] and d["rss_delta_bytes"] is None and d["rss"] is None
    assert fake.allocated == fake.reserved == 0  # everything freed
    assert fake.allocations == 32


def test_rounding_counts_unsplit_remainders(fake, tmp_path):
    """hf tensors of 11 MiB: the allocator hands each a 12 MiB segment whose 1 MiB remainder is not split, so
    memory_allocated grows by 12 MiB per tensor; the plan's 11 MiB is right and the check passes."""
    from conftest import llama_like, write_config

    cfg = write_config(tmp_path, "m", llama_like(2, 8, 8, 128, torch_dtype="float16"))
    ctx = 11 * MiB // (8 * 128 * 2)  # one tensor [1, 8, ctx, 128] fp16 = 11 MiB
    d = kvjson("verify", cfg, "--ctx", str(ctx), "--engine", "hf", "--device", "cuda:0")
    assert d["predicted_bytes"] == 4 * 11 * MiB
    assert d["expected_measured_bytes"] == d["measured_bytes"] == 4 * 12 * MiB
    assert d["passed"]
    assert any("unsplit" in n for n in d["notes"])


def test_sglang_mid_sized_buffers_reserved_differs_but_allocated_passes(fake):
    """SGLang's 2L buffers of ~8 MiB: the real allocator packs two per 20 MiB segment (the model says so), the
    fake gives each its own; memory_reserved then disagrees with the model -- reported, not a failure."""
    d = kvjson("verify", "llama-3.1-8b", "--ctx", "4096", "--engine", "sglang", "--device", "cuda")
    n = 64
    per = (4096 + 1) * 8 * 128 * 2
    assert d["predicted_bytes"] == d["measured_bytes"] == n * per
    assert d["expected_reserved_bytes"] == n // 2 * 20 * MiB
    assert d["measured_reserved_bytes"] == n * 20 * MiB
    assert d["passed"] and any("memory_reserved grew" in x for x in d["notes"])


def test_an_allocator_surprise_fails_with_exit_1(fake):
    fake.leak = 512  # every block 512 B larger than the documented rounding
    r = run_cli("verify", "llama-3.1-8b", "--ctx", "8k", "--batch", "4", "--json")
    assert r.code == 1 and r.json()["passed"] is False
    assert r.json()["measured_bytes"] == r.json()["expected_measured_bytes"] + 32 * 512
    assert "memory_allocated growth" in r.err and r.err.count("\n") == 1


def test_refuses_a_plan_larger_than_free_memory(fake):
    fake.free0 = 2 * GiB
    r = run_cli("verify", "llama-3.1-8b", "--ctx", "8k", "--batch", "4")
    assert r.code == 2 and "nothing was allocated" in r.err and fake.allocations == 0


def test_out_of_memory_during_the_check_is_one_line(fake):
    fake.fail_next = torch.OutOfMemoryError("CUDA out of memory (fake, on demand)")
    r = run_cli("verify", "llama-3.2-1b", "--ctx", "1k")
    assert r.code == 2 and "ran out of memory" in r.err and r.err.count("\n") == 1
    assert fake.allocated == fake.reserved == 0


def test_out_of_memory_in_a_later_group_frees_the_earlier_ones(fake):
    """Gemma-2-9B under vLLM has two groups (sliding, full); running out of memory in the middle must not keep the
    tensors already allocated alive through the exception: the allocator is settled with nothing held."""
    fake.fail_at = 30
    r = run_cli("verify", "gemma-2-9b", "--ctx", "8k", "--no-rss")
    assert r.code == 2 and "ran out of memory" in r.err
    assert fake.allocations == 30 and fake.settled[-1] == 0


def test_free_memory_is_compared_in_segments(fake):
    """Many 1.5 MiB tensors each take a 20 MiB segment's share: the refusal counts reserved segments. The plan's
    bytes fit in free memory, its segments do not: refused before anything is allocated."""
    from kvplan.engines.base import CachePlan, PlanGroup, Request, TensorAlloc
    from kvplan.verify import allocate, measure

    t = TensorAlloc("k", (1536 * 1024 - 600,), "uint8", count=40)
    group = PlanGroup("full", (0,), 1, 1, 1, None, 1, "fp16", t.total_bytes, 0, (t,), "test")
    plan = CachePlan("test", Request(1, 1), (group,), t.total_bytes, (), 0, {})
    _, reserved, _ = measure.expected_allocator([t.nbytes] * t.count)
    fake.free0 = (t.total_bytes + reserved) // 2
    assert t.total_bytes < fake.free0 < reserved
    backend = measure.open_backend("cuda")
    with pytest.raises(Exception, match="counted in allocator segments"):
        allocate.check_cuda(backend, plan)
    assert fake.allocations == 0


def test_device_index_out_of_range(fake):
    r = run_cli("verify", "gpt2", "--ctx", "64", "--device", "cuda:1")
    assert r.code == 2 and "out of range" in r.err and "cuda:0..cuda:0" in r.err


# ---------------------------------------------------------------------------------------------- --fit on CUDA
def test_fit_with_memory_limit_bisects_under_the_fraction_and_restores_it(fake):
    fake.fraction = 0.75  # whatever was in force before must come back
    d = kvjson("verify", "llama-3.1-8b", "--ctx", "8k", "--fit", "--memory-limit", "24GiB", "--device", "cuda")
    f = d["fit"]
    w = f["weight_bytes"]
    assert f["kv_budget_bytes"] == 24 * GiB - w
    held = FakeCuda.block(w)[1]  # the weights buffer's segment
    assert f["memory_fraction"] == pytest.approx((held + 24 * GiB - w) / H100_TOTAL)
    # one cap per trial (budget + the allocator rounding of that trial's tensors: none for 2 MiB-multiple pools),
    # then the fraction in force before
    assert set(fake.fraction_calls[:-1]) == {f["memory_fraction"]} and len(fake.fraction_calls) > 2
    assert fake.fraction_calls[-1] == 0.75 and fake.fraction == 0.75
    assert f["memory_fraction_restored"] and f["memory_fraction_restored_to"] == 0.75
    per_request = 32 * 512 * 64 * 1024  # 512 blocks x 64 KiB per layer at 8k
    budget = 24 * GiB - w
    assert d["predicted_max_batch"] == budget // per_request
    assert abs(d["difference"]) <= 1 and d["passed"]
    assert any(not t["ok"] for t in f["trials"]) and fake.allocated == fake.reserved == 0
    assert f["allocator_rounding_bytes"] == 0  # 2 MiB-multiple pools


@pytest.mark.parametrize("limit, args", [
    ("6GiB", ("gemma-3-1b", "--engine", "hf", "--ctx", "200")),  # short context: small tensors share segments
    ("31GiB", ("deepseek-v2-lite", "--engine", "hf", "--ctx", "300")),  # MLA latents, short context
    ("6GiB", ("gemma-3-1b", "--engine", "vllm", "--ctx", "64")),  # sliding + full groups, short context
])
@pytest.mark.slow
def test_fit_under_the_allocators_rules_finds_the_predicted_batch(monkeypatch, limit, args):
    """Under the allocator's own rules, allocating the plan tensor by tensor reserves more than the plan's bytes;
    the engine allocates its pool in one piece and pays none of that. So the cap of each trial is the budget plus
    that trial's modelled rounding, and a correct prediction is found again (it used to be missed by several
    requests, the cap counting the rounding against the budget)."""
    AllocatorCuda(monkeypatch)
    model, *rest = args
    d = kvjson("verify", model, *rest, "--fit", "--memory-limit", limit, "--device", "cuda")
    f = d["fit"]
    assert d["predicted_max_batch"] > 4
    assert any(t.get("rounding_bytes") for t in f["trials"]), "these plans round: the case must exercise it"
    assert abs(d["difference"]) <= 1 and d["passed"], (d["predicted_max_batch"], d["measured_max_batch"])


def test_fit_restores_the_fraction_when_the_device_fails(fake, monkeypatch):
    fake.fraction = 0.5
    calls = {"n": 0}
    original = fake.empty

    def flaky(*a, **k):
        calls["n"] += 1
        if calls["n"] == 3:  # the weights buffer, then one KV tensor, then a device error
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        return original(*a, **k)

    monkeypatch.setattr(torch, "empty", flaky)
    r = run_cli("verify", "llama-3.1-8b", "--ctx", "8k", "--fit", "--memory-limit", "24GiB")
    assert r.code == 2 and "illegal memory access" in r.err
    assert fake.fraction == 0.5 and fake.fraction_calls[-1] == 0.5
    assert fake.allocated == fake.reserved == 0


def test_fit_from_the_planner_on_the_local_gpu(fake):
    """Without --memory-limit the budget is kvplan fit's for the local GPU (matched in the catalog)."""
    planner = pytest.importorskip("kvplan.planner")
    from kvplan.gpus import resolve_gpu

    d = kvjson("verify", "llama-3.1-8b", "--ctx", "32k", "--fit")
    f = d["fit"]
    fit = planner.fit_model(ModelOptions("llama-3.1-8b"), EngineOptions(), resolve_gpu("H100"), 32768, 1)
    assert f["budget_source"] == "kvplan fit"
    assert f["weight_bytes"] == fit.weight_bytes and f["kv_budget_bytes"] == fit.kv_budget_bytes
    assert f["predicted_by_kvplan_fit"] == d["predicted_max_batch"]
    assert abs(d["difference"]) <= 1 and d["passed"]
    assert f["fit"]["max_batch"] == fit.max_batch


# ---------------------------------------------------------------------------------------------- gpus --local
def test_gpus_local_prints_the_catalog_form(fake, monkeypatch):
    from kvplan.verify import local_gpu

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(local_gpu, "_nvml_totals", lambda: {"#0": {"nvml_bytes": 85520809984, "source": "nvidia-smi"}})
    d = kvjson("gpus", "--local")
    (dev,) = d["devices"]
    assert dev["match"] == "H100-SXM-80GB" and dev["cuda_total_bytes"] == H100_TOTAL
    assert dev["nvml_bytes"] == 85520809984 and dev["nvml_source"] == "nvidia-smi"
    e = dev["catalog_entry"]
    assert {"name", "display", "vendor", "aliases", "nvml_bytes", "cuda_total_bytes", "cuda_total_source"} <= set(e)
    assert e["display"] == "NVIDIA H100 80GB HBM3" and e["cuda_total_bytes"] == H100_TOTAL
    r = run_cli("gpus", "--local")
    assert r.code == 0 and "H100-SXM-80GB" in r.out and "\"cuda_total_bytes\": 85027979264" in r.out


def test_gpus_local_unknown_board_suggests_an_entry(fake, monkeypatch):
    from kvplan.verify import local_gpu

    fake.name, fake.total = "NVIDIA Future GPU 200GB", 200 * GiB
    monkeypatch.setattr(local_gpu, "_nvml_totals", lambda: {})
    d = kvjson("gpus", "--local")
    (dev,) = d["devices"]
    assert dev["match"] is None and dev["nvml_bytes"] is None
    assert dev["catalog_entry"]["name"] == "Future-GPU-200GB"
    r = run_cli("gpus", "--local")
    assert "none matches" in r.out


# ---------------------------------------------------------------------------------------------- real GPU
def _has_cuda() -> bool:
    try:
        return torch.cuda.is_available()
    except Exception:
        return False


@pytest.mark.cuda
@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA device")
@pytest.mark.parametrize("engine", ["vllm", "sglang", "hf", "llamacpp", "trtllm"])
def test_real_gpu_allocation_matches(engine):
    d = kvjson("verify", "llama-3.2-1b", "--ctx", "3000", "--batch", "3", "--engine", engine, "--device", "cuda")
    assert d["measured_bytes"] == d["expected_measured_bytes"], d["notes"]
    assert d["passed"]


@pytest.mark.cuda
@pytest.mark.skipif(not _has_cuda(), reason="needs a CUDA device")
def test_real_gpu_fit_with_memory_limit():
    d = kvjson("verify", "llama-3.2-1b", "--ctx", "4k", "--fit", "--memory-limit", "6GiB", "--device", "cuda")
    assert abs(d["difference"]) <= 1 and d["fit"]["memory_fraction_restored"]


def test_backend_measures_through_torch_cuda(fake):
    backend = measure.open_backend("cuda")
    x = backend.new((3, 1000), "float16")
    snap = backend.snapshot()
    assert snap.allocated == 6144 and snap.reserved == 2 * MiB and snap.free == fake.free0 - 2 * MiB
    del x
    assert backend.snapshot().allocated == 0


def test_allocator_settings_are_read_as_torch_reads_them():
    """torch >= 2.8 (c10/core/AllocatorConfig.h): PYTORCH_ALLOC_CONF is primary for the device-generic settings,
    PYTORCH_CUDA_ALLOC_CONF the legacy, lower-priority name; max_non_split_rounding_mb is read; a list value with
    commas inside brackets is one setting; keys the model does not reproduce are named."""
    both = {"PYTORCH_ALLOC_CONF": "max_split_size_mb:64", "PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256"}
    model, _ = measure.allocator_config(both)
    assert model.max_split_size == 64 * MiB
    model, _ = measure.allocator_config({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:256"})
    assert model.max_split_size == 256 * MiB
    model, notes = measure.allocator_config(
        {"PYTORCH_ALLOC_CONF": "max_split_size_mb:64,max_non_split_rounding_mb:40,"
                               "roundup_power2_divisions:[256:4,>:1],pinned_use_background_threads:true"})
    assert model.max_split_size == 64 * MiB and model.max_non_split_rounding == 40 * MiB
    assert notes == ["allocator setting roundup_power2_divisions is not modelled"]


def test_max_non_split_rounding_decides_whether_an_oversized_block_is_reused():
    """With max_split_size 64 MiB, a cached 100 MiB block serves a 70 MiB request only when the 30 MiB it would
    waste is within max_non_split_rounding (20 MiB, the default: no, a new segment; 40 MiB: yes)."""
    for rounding, new_segments in ((20 * MiB, 1), (40 * MiB, 0)):
        model = measure.AllocatorModel(max_split_size=64 * MiB, max_non_split_rounding=rounding)
        model.free_large.append(100 * MiB)
        model.malloc(70 * MiB)
        assert model.segments == new_segments, rounding
