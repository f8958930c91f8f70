"""TensorRT-LLM paged KV cache (engines.md §5): pools [num_blocks, num_layers, kv_factor, H_kv * tokens_per_block
* D], one primary pool per (window size, head count); kv_factor 2, or 1 for MLA (head = kv_lora_rank + rope).
KV heads per GPU = ceil(H / tp). A request needs cdiv(min(ctx, window), tokens_per_block) blocks per pool.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan import dtypes
from kvplan.engines import base
from kvplan.engines.base import CachePlan, Knob, KVDtypes, PlanGroup, Request, cdiv, tensor
from kvplan.engines.versions import Selected, select
from kvplan.spec import LayerCache, ModelSpec


@dataclass(frozen=True)
class Rules:
    tokens_per_block: int
    blocks_round_up: bool  # max_tokens -> blocks rounded up (the July 2025 PyTorch-backend log: 860,308 -> 860,320)


VERSIONS = [("0.10", Rules(64, True)), ("1.0", Rules(32, True))]
KV_DTYPES = ("fp16", "bf16", "fp32", "fp8_e4m3")  # cache dtypes this engine can store
KNOBS = {
    "tokens_per_block": Knob("tokens_per_block", int, "tokens per KV block (LLM API default 32; trtllm-build 64)"),
    "free_gpu_memory_fraction": Knob("free_gpu_memory_fraction", float, "fraction of free memory for the KV cache"),
    "max_tokens": Knob("max_tokens", int, "KvCacheConfig.max_tokens cap"),
    "max_batch_size": Knob("max_batch_size", int, "running-request limit"),
}


def select_version(requested: str | None) -> Selected[Rules]:
    return select("trtllm", requested, VERSIONS)


def heads_per_gpu(h: int, tp: int) -> int:
    return -(-h // tp)


@dataclass(frozen=True)
class Prepared:
    selected: Selected[Rules]
    stages: tuple[tuple[tuple[int, LayerCache], ...], ...]
    kvd: KVDtypes
    tpb: int
    tp: int
    pp: int
    state: dtypes.DType
    assumptions: tuple[str, ...]
    max_tokens: int | None = None

    def token_bytes(self, c: LayerCache) -> int:
        """get_cache_size_per_token for one layer: kv_factor x heads x head dim x element size."""
        if c.kind == "mla":
            return self.kvd.k.nbytes(c.latent_dim)
        h = heads_per_gpu(c.kv_heads, self.tp)
        return self.kvd.k.nbytes(h * c.head_dim_k) + self.kvd.v.nbytes(h * c.head_dim_v)

    def bytes_per_token(self, stage: int) -> int:
        return sum(self.token_bytes(c) for _, c in self.stages[stage] if c.kind in ("full", "sliding", "chunked", "mla"))

    def _tokens(self, c: LayerCache, ctx: int) -> int:
        if c.kind in ("sliding", "chunked"):
            return min(ctx, getattr(c, "window", 0) or c.chunk)
        if c.kind == "cross":
            return c.encoder_len
        return ctx

    def _groups(self, ctx: int, batch: int, stage: int) -> list[PlanGroup]:
        from kvplan.engines.vllm import geometry

        merged: dict[LayerCache, list[int]] = {}
        for i, c in self.stages[stage]:
            merged.setdefault(c, []).append(i)
        out = []
        for c, layers in merged.items():
            n = len(layers)
            if c.kind in ("none", "shared"):
                out.append(PlanGroup(c.kind, tuple(layers), None, None, None, None, 0, "-", 0, 0, (), c.describe()))
                continue
            if c.kind in ("mamba_state", "linear_state"):
                conv = (batch, c.conv_kernel - 1, c.conv_dim // self.tp)
                ssm = (batch, c.ssm_shape[0] // self.tp, *c.ssm_shape[1:])
                tensors = (tensor("conv_state", conv, self.state, n), tensor("ssm_state", ssm, self.state, n))
                out.append(PlanGroup(c.kind, tuple(layers), None, None, None, None, 0, self.state.name,
                                     sum(t.total_bytes for t in tensors), 0, tensors, c.describe()))
                continue
            blocks = cdiv(self._tokens(c, ctx), self.tpb) * batch
            per_block = self.token_bytes(c) * self.tpb
            t = tensor(f"pool [blocks, {n} layers, kv_factor, heads x {self.tpb} tokens x dim]", (blocks * n * per_block,), "uint8")
            grows = self._tokens(c, ctx + 1) > self._tokens(c, ctx)
            out.append(PlanGroup(
                kind=c.kind, layer_ids=tuple(layers), tokens=cdiv(self._tokens(c, ctx), self.tpb) * self.tpb,
                dtype=self.kvd.k.name if c.kind == "mla" else self.kvd.label, bytes=t.total_bytes,
                bytes_per_token=self.token_bytes(c) * n if grows else 0, tensors=(t,), description=c.describe(),
                **geometry(c, self.tp, split_heads=heads_per_gpu),
            ))
        return out

    def stage_bytes(self, ctx: int, batch: int, stage: int) -> int:
        return sum(g.bytes for g in self._groups(ctx, batch, stage))

    def limiting_stage(self, ctx: int) -> int:
        per = [self.stage_bytes(ctx, 1, s) for s in range(len(self.stages))]
        return per.index(max(per))

    def plan(self, ctx: int, batch: int, stage: int | None = None) -> CachePlan:
        stage = self.limiting_stage(ctx) if stage is None else stage
        groups = self._groups(ctx, batch, stage)
        all_gpus = sum(self.stage_bytes(ctx, batch, s) for s in range(len(self.stages))) * self.tp
        return CachePlan(self.selected.label, Request(ctx, batch, self.tp, self.pp), tuple(groups), all_gpus,
                         self.assumptions, stage, {"tokens_per_block": self.tpb, "bytes_per_token": self.bytes_per_token(stage)})


def prepare(spec: ModelSpec, tp: int, pp: int, kvd: KVDtypes, selected: Selected[Rules], opts: dict[str, Any],
            **_: Any) -> Prepared:
    tpb = int(opts.get("tokens_per_block") or selected.rules.tokens_per_block)
    notes = [f"{tpb} tokens per block" + ("" if opts.get("tokens_per_block") else f" (TensorRT-LLM {selected.version} default)"),
             "KV heads per GPU = ceil(heads / tp); MLA kv_factor 1 (latent only)"]
    if any(c.kind in ("sliding", "chunked") for _, c in spec.caches):
        notes.append("sliding/chunked layers: a pool per window holding min(ctx, window) tokens per request")
    if selected.note:
        notes.append(selected.note)
    state = kvd.state or base.serving_dtype(spec)
    cap = opts.get("max_tokens")
    return Prepared(selected, tuple(base.stage_caches(spec, pp)), kvd, tpb, tp, pp, state, tuple(notes), int(cap) if cap else None)


# ---------------------------------------------------------------------------------------------- budget, capacity
DEFAULT_MAX_BATCH_SIZE = 2048  # LLM API BuildConfig.max_batch_size default


def budget(prepared: Prepared, spec: ModelSpec, gpu: base.GpuContext, stage: int, weights: int,
           opts: dict[str, Any], reserve: int | None, dtype_bytes: int) -> base.Budget:
    """KvCacheCreator (PyTorch backend): free_gpu_memory_fraction x (memory free after weights and the
    profiling peak at max_num_tokens)."""
    from kvplan.engines import overhead

    frac = float(opts.get("free_gpu_memory_fraction") or 0.9)
    if reserve is not None:
        other = reserve
        parts = [("reserve (--reserve)", -reserve)]
    else:
        act = overhead.forward_activation(spec, overhead.TRTLLM_MAX_NUM_TOKENS, prepared.tp, dtype_bytes)
        ctxb = overhead.CUDA_CONTEXT_BYTES + (overhead.NCCL_BYTES if prepared.tp * prepared.pp > 1 else 0)
        other = act + ctxb
        parts = [("activation peak at max_num_tokens 8192 (estimate)", -act), ("CUDA context/NCCL (estimate)", -ctxb)]
    free = gpu.cuda_total - weights - other
    kv = int(free * frac)
    parts = [("total", gpu.cuda_total), ("weights", -weights), *parts, (f"x free_gpu_memory_fraction {frac}", kv - free)]
    return base.Budget(kv, tuple(parts), (f"free_gpu_memory_fraction {frac}" + ("" if opts.get("free_gpu_memory_fraction") else " (default)"),))


def _max_tokens(prepared: Prepared, budgets: list[int]) -> int:
    """max_tokens = kv // bytes_per_token (min over stages, min with --max-tokens), rounded UP to whole blocks
    as the July 2025 PyTorch-backend log shows (860,308 requested -> 860,320 = 26,885 x 32)."""
    counts = [max(0, budgets[s]) // prepared.bytes_per_token(s) for s in range(len(prepared.stages)) if prepared.bytes_per_token(s)]
    n = min(counts) if counts else 0
    if prepared.max_tokens:
        n = min(n, prepared.max_tokens)
    return cdiv(n, prepared.tpb) * prepared.tpb if prepared.selected.rules.blocks_round_up else n // prepared.tpb * prepared.tpb


def max_batch(prepared: Prepared, ctx: int, budgets: list[int]) -> int:
    tokens = _max_tokens(prepared, budgets)
    blocks = tokens // prepared.tpb
    per = cdiv(ctx, prepared.tpb)
    if any(c.kind in ("sliding", "chunked", "cross", "mamba_state", "linear_state") for st in prepared.stages for _, c in st):
        # window pools / state: charge a request's bytes against the budget
        return min(max(0, budgets[s]) // max(1, prepared.stage_bytes(ctx, 1, s)) for s in range(len(prepared.stages)))
    return blocks // per if per else 0


def fits(prepared: Prepared, ctx: int, batch: int, budgets: list[int]) -> bool:
    return batch <= max_batch(prepared, ctx, budgets)


def capacity(prepared: Prepared, spec: ModelSpec, ctx: int, budgets: list[int], opts: dict[str, Any],
             gpu: base.GpuContext, max_model_len: int | None) -> base.Capacity:
    tokens = _max_tokens(prepared, budgets)
    cap = int(opts.get("max_batch_size") or DEFAULT_MAX_BATCH_SIZE)
    return base.Capacity(max_batch(prepared, ctx, budgets), tokens, round(tokens / ctx, 2) if ctx else None, cap,
                         tokens > 0, None if tokens > 0 else "no memory left for the KV cache", None,
                         {"blocks": tokens // prepared.tpb, "tokens_per_block": prepared.tpb})
