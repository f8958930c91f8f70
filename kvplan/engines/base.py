"""What every engine layout shares: the request, the options, the CachePlan it produces, parallel splits.

A CachePlan is the exact list of tensors (shape, dtype, count) an engine allocates for `batch` requests of
`ctx` tokens on the limiting GPU. size sums it, fit solves with the same per-request costs, verify allocates it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Protocol, Sequence

from kvplan import dtypes
from kvplan.dtypes import DType
from kvplan.engines.listing import KNOB_KINDS, Knob, knob_table  # noqa: F401  (re-exported)
from kvplan.errors import InputError
from kvplan.parallel import cdiv, heads_floor, pad_to, pp_partition  # noqa: F401  (re-exported for engines)
from kvplan.spec import LayerCache, ModelSpec

@dataclass(frozen=True)
class Request:
    """The workload a plan is made for: context per request, requests at once, and the parallel layout."""
    ctx: int
    batch: int = 1
    tp: int = 1
    pp: int = 1


@dataclass(frozen=True)
class KVDtypes:
    """The cache element types in force (K, V, state) and where they came from, for the output's labels."""
    k: DType
    v: DType
    state: DType | None  # conv/recurrent state override (--state-dtype)
    source: str  # flag | config | engine default | quantization_config

    @property
    def label(self) -> str:
        return self.k.name if self.k == self.v else f"{self.k.name}/{self.v.name}"


@dataclass(frozen=True)
class Note:
    """An assumption a layout rests on: `id` for code and tests to ask about, `text` for people (outputs print it)."""

    id: str
    text: str


def note_texts(notes) -> tuple[str, ...]:
    return tuple(n.text for n in notes)


@dataclass(frozen=True)
class TensorAlloc:
    """`count` identical tensors of `shape` in `dtype` (a torch dtype name; packed formats are uint8 bytes)."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    count: int = 1
    elem_bytes: int = 1

    @property
    def nbytes(self) -> int:
        n = self.elem_bytes
        for d in self.shape:
            n *= d
        return n

    @property
    def total_bytes(self) -> int:
        return self.nbytes * self.count

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "count": self.count, "bytes": self.total_bytes}


def tensor(name: str, shape: tuple[int, ...], dtype: DType | str, count: int = 1) -> TensorAlloc:
    """A tensor of a float dtype, or a byte buffer for packed formats (GGUF blocks, raw paged pools)."""
    if isinstance(dtype, str):  # raw uint8 / int8 byte buffers
        return TensorAlloc(name, shape, dtype, count, 1)
    if dtype.is_block:
        *lead, row = shape
        n = 1
        for d in lead:
            n *= d
        return TensorAlloc(name, (n * dtype.nbytes(row),), "uint8", count, 1)
    return TensorAlloc(name, shape, dtype.torch_name, count, dtype.block_bytes)


@dataclass(frozen=True)
class PlanGroup:
    """One kind of layer cache on the limiting GPU: how many layers, their geometry, tokens held, bytes."""

    kind: str
    layer_ids: tuple[int, ...]
    kv_heads: int | None
    head_dim_k: int | None
    head_dim_v: int | None
    window: int | None
    tokens: int  # tokens held per sequence (after engine rounding) -- 0 for fixed-size state
    dtype: str
    bytes: int
    bytes_per_token: int  # what one more token of one sequence adds to this group at this ctx
    tensors: tuple[TensorAlloc, ...]
    description: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "layers": len(self.layer_ids),
            "layer_ids": list(self.layer_ids),
            "kv_heads": self.kv_heads,
            "head_dim_k": self.head_dim_k,
            "head_dim_v": self.head_dim_v,
            "window": self.window,
            "tokens": self.tokens,
            "dtype": self.dtype,
            "bytes": self.bytes,
            "tensors": [t.to_json() for t in self.tensors],
        }


@dataclass(frozen=True)
class CachePlan:
    """An engine's cache for one request shape: its groups, bytes over all GPUs, and what it assumed."""
    engine: str
    request: Request
    groups: tuple[PlanGroup, ...]
    kv_bytes_all_gpus: int
    assumptions: tuple[str, ...]
    limiting_stage: int = 0
    details: dict[str, Any] = field(default_factory=dict)  # engine figures (block size, cells, pages...)
    note_ids: tuple[str, ...] = ()  # the ids of the assumptions that carry one (Note), in their order

    @property
    def kv_bytes(self) -> int:
        return sum(g.bytes for g in self.groups)

    @property
    def kv_bytes_per_token(self) -> int:
        return sum(g.bytes_per_token for g in self.groups)

    @property
    def tensors(self) -> tuple[TensorAlloc, ...]:
        return tuple(t for g in self.groups for t in g.tensors)


# ---------------------------------------------------------------------------------------------- parallelism
kv_heads_per_gpu = heads_floor


def check_tp_heads(spec: ModelSpec, tp: int, query_heads: int | None = None) -> None:
    """vLLM's constraints: KV heads divide by tp, or tp is a multiple of the KV heads (replication)."""
    if tp == 1:
        return
    seen = set()
    for _, c in spec.caches:
        h = getattr(c, "kv_heads", None)
        if not h or h in seen:
            continue
        seen.add(h)
        if (h >= tp and h % tp) or (h < tp and tp % h):
            raise InputError(
                f"--tp {tp} does not fit the model's {h} KV heads: tp must divide them, or be a multiple of them "
                f"(accepted here: {', '.join(str(t) for t in _valid_tps(h))})"
            )


def _valid_tps(h: int) -> list[int]:
    return [t for t in (1, 2, 4, 8, 16, 32, 64) if (h >= t and h % t == 0) or (h < t and t % h == 0)]


def resolve_kv_dtypes(
    spec: ModelSpec, engine_default: DType, kv: str | None, k: str | None, v: str | None, state: str | None,
    *, honours_checkpoint: bool = True,
) -> KVDtypes:
    """Flags win; `auto` takes the checkpoint's KV quantization where the engine honours it, else the engine's
    default for this model."""
    state_dtype = dtypes.kv_dtype(state) if state and state != "auto" else None
    if kv and kv != "auto":
        d = dtypes.kv_dtype(kv)
        kd = dtypes.kv_dtype(k) if k and k != "auto" else d
        vd = dtypes.kv_dtype(v) if v and v != "auto" else d
        return KVDtypes(kd, vd, state_dtype, "flag")
    hint = spec.quantization.kv_dtype_hint if spec.quantization else None
    base, source = engine_default, "engine default"
    if hint and honours_checkpoint and hint in dtypes.KV_DTYPES:
        base, source = dtypes.KV_DTYPES[hint], "quantization_config"
    kd = dtypes.kv_dtype(k) if k and k != "auto" else base
    vd = dtypes.kv_dtype(v) if v and v != "auto" else base
    if (k and k != "auto") or (v and v != "auto"):
        source = "flag"
    return KVDtypes(kd, vd, state_dtype, source)


def serving_dtype(spec: ModelSpec) -> DType:
    """vLLM/SGLang/TRT-LLM `auto`: the model dtype, with fp32 or a missing dtype served as bf16."""
    name = spec.dtype if spec.dtype in ("fp16", "bf16") else "bf16"
    return dtypes.KV_DTYPES[name]


def serving_kv_dtype(spec: ModelSpec) -> DType:
    """vLLM's and SGLang's `auto` cache dtype: the model dtype, except for DeepSeek-V4's caches, which both store
    only in fp8 (vLLM's fp8_ds_mla; SGLang's arg_groups/overrides.py _deepseek_v4_kv_cache_dtype)."""
    from kvplan.spec import SlidingLatent

    if any(isinstance(c, SlidingLatent) for _, c in spec.caches):
        return dtypes.KV_DTYPES["fp8_e4m3"]
    return serving_dtype(spec)


def gpu_arch(gpu_name: str | None) -> str:
    """hopper (SM90) | blackwell (SM100 data-centre) | sm120 (RTX 50xx / RTX PRO Blackwell) | other."""
    n = (gpu_name or "").lower()
    if any(k in n for k in ("h100", "h200", "gh200", "h800", "h20")):
        return "hopper"
    if any(k in n for k in ("b200", "gb200", "b100", "b300")):
        return "blackwell"
    if any(k in n for k in ("5090", "5080", "5070", "rtx pro 6000", "rtx-pro-6000", "pro 6000 blackwell")):
        return "sm120"
    return "other"


# ---------------------------------------------------------------------------------------------- budgets
@dataclass(frozen=True)
class GpuContext:
    """The device a budget is computed for (one GPU of the selection)."""

    name: str | None
    cuda_total: int
    nvml_total: int | None
    count: int = 1
    interconnect: str = "unknown"  # gpus.json: nvswitch | nvlink | pcie | xgmi | unknown
    nccl_nvls: bool = False  # gpus.json: NCCL's NVLink SHARP buffers exist on this board

    @property
    def gib(self) -> float:
        return self.cuda_total / (1 << 30)


@dataclass(frozen=True)
class BudgetPart:
    """One term of a budget: `key` for code (explain, calibration, tests), `label` for people (outputs print it)."""

    key: str
    label: str
    bytes: int


@dataclass(frozen=True)
class Budget:
    """KV memory one GPU of one pipeline stage can give the cache, and how it was reached (bytes)."""

    kv_bytes: int
    parts: tuple[BudgetPart, ...]
    notes: tuple[str, ...] = ()

    def part(self, key: str) -> BudgetPart | None:
        return next((p for p in self.parts if p.key == key), None)


def summed(parts, notes: tuple[str, ...] = ()) -> Budget:
    """A budget whose KV bytes are the sum of its parts."""
    return Budget(sum(p.bytes for p in parts), tuple(parts), tuple(notes))


@dataclass(frozen=True)
class Capacity:
    """What the engine would report and admit for requests of ctx tokens with these budgets."""

    max_batch: int  # requests of ctx tokens that fit (usable memory only), before the engine's request cap
    kv_capacity_tokens: int | None
    concurrency: float | None
    engine_batch_cap: int | None
    engine_would_start: bool
    start_message: str | None = None
    suggested_max_ctx: int | None = None
    details: dict[str, Any] = field(default_factory=dict)


def largest(lo: int, hi: int, ok) -> int:
    """The largest n in [lo, hi] with ok(n) (ok monotone: true then false); lo - 1 when none."""
    if hi < lo or not ok(lo):
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def max_batch_by_bytes(plan_bytes, budgets: list[int], ctx: int, limit: int = 1 << 20) -> int:
    """Largest batch whose per-stage plan bytes fit every stage's budget (engines without a block pool)."""
    def ok(b: int) -> bool:
        return all(plan_bytes(ctx, b, s) <= budgets[s] for s in range(len(budgets)))
    return max(0, largest(1, limit, ok))


# ---------------------------------------------------------------------------------------------- the engine contract
@dataclass(frozen=True)
class EngineInfo:
    """What an engine module declares about itself (its ENGINE); the registry, sizing, check and the CLI read
    these fields instead of asking for an engine's name."""

    name: str
    aliases: tuple[str, ...]
    summary: str  # one line for --engine help
    versions: Sequence[tuple[str, Any]]  # ascending (version label, rules) rows
    kv_dtypes: tuple[str, ...]  # cache dtypes this engine can store
    knobs: Mapping[str, Knob]
    default_kv_dtype: Callable[[ModelSpec], DType]  # what `auto` means before any checkpoint hint
    honours_checkpoint_kv: bool  # `auto` takes quantization_config's KV dtype
    uses_vllm_max_ctx: bool  # the model maximum by vLLM's rules (rope scaling...) rather than the config field
    weight_float_dtype: Callable[[ModelSpec], DType]  # dtype unquantized weights are loaded in
    heads_per_gpu: Callable[[int, int], int]  # KV heads one GPU holds for (heads, tp)
    gguf_native: bool = False  # serves GGUF files itself (its token_embd stays in host memory)


class PreparedLayout(Protocol):
    """An engine's cache layout for one model, dtypes, TP/PP and knobs: what size, fit and verify plan with."""

    tp: int
    pp: int

    def plan(self, ctx: int, batch: int, stage: int | None = None) -> CachePlan: ...

    def limiting_stage(self, ctx: int) -> int: ...


class EngineModule(Protocol):
    """What every module in kvplan/engines/ provides (the registry in engines/__init__.py holds them). The
    capabilities its listing row declares add to it: `calibrates` -> CalibratingEngine, `replay_pool` "blocks" ->
    BlockReplayEngine, "slots" -> SlotReplayEngine (tests/test_structure.py holds rows and modules together)."""

    ENGINE: EngineInfo
    KIND_RULES: Mapping[type[LayerCache], Any]

    def select_version(self, requested: str | None) -> Any: ...

    def prepare(self, spec: ModelSpec, tp: int, pp: int, kvd: KVDtypes, selected: Any, opts: dict[str, Any],
                gpu: GpuContext | None) -> PreparedLayout: ...

    def budget(self, prepared: Any, spec: ModelSpec, gpu: GpuContext, stage: int, weights: int,
               opts: dict[str, Any], reserve: int | None, dtype_bytes: int) -> Budget: ...

    def capacity(self, prepared: Any, spec: ModelSpec, ctx: int, budgets: list[int], opts: dict[str, Any],
                 gpu: GpuContext, max_model_len: int | None) -> Capacity: ...

    def fits(self, prepared: Any, ctx: int, batch: int, budgets: list[int]) -> bool: ...

    def max_batch(self, prepared: Any, ctx: int, budgets: list[int]) -> int: ...


class CalibratingEngine(EngineModule, Protocol):
    """The budget from the non-KV memory an engine log measured (calibration.py) in place of the estimate."""

    def calibrated_budget(self, prepared: Any, spec: ModelSpec, gpu: GpuContext, stage: int, opts: dict[str, Any],
                          dtype_bytes: int, cal: Any) -> Budget: ...


class BlockReplayEngine(EngineModule, Protocol):
    """A block pool its scheduler admits requests into (views.BlockPoolView), for `kvplan plan`."""

    def replay_view(self, prepared: Any, ctx: int, budgets: list[int], gpu: GpuContext) -> Any: ...


class SlotReplayEngine(EngineModule, Protocol):
    """Server slots over the engine's cells (views.SlotView), for `kvplan plan`."""

    def check_parallel(self, n: int | None) -> int | None: ...

    def slot_view(self, prepared: Any, longest: int, budgets: list[int], parallel: int | None, ctx_size: int | None,
                  weights_left: str | None) -> Any: ...


CAPABILITY_PROTOCOLS = {"calibrates": CalibratingEngine, "blocks": BlockReplayEngine, "slots": SlotReplayEngine}
