"""SGLang token pools (engines.md §2): per layer K [(N + page), H_kv, D_k] and V [(N + page), H_kv, D_v]
(MLA: one [(N + page), 1, kv_lora_rank + rope] buffer), N = tokens in the pool rounded to the page size.

Only Llama-4 and GPT-OSS are hybrid-SWA models in SGLang (is_hybrid_swa_model); Gemma-2/3 sliding layers
get full-length cache. Mamba hybrids keep one state slot per running request (conv window kernel-1 in the model
dtype, SSM state in fp32: --mamba-ssm-dtype default).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan import dtypes
from kvplan.engines import base
from kvplan.engines.base import CachePlan, Knob, KVDtypes, PlanGroup, Request, tensor
from kvplan.engines.versions import Selected, select
from kvplan.spec import LayerCache, ModelSpec


@dataclass(frozen=True)
class Rules:
    fraction_tiers: bool  # mem_fraction_static from GPU-size tiers (0.5) vs the TP table (<= 0.4)


VERSIONS = [("0.4", Rules(False)), ("0.5", Rules(True))]
KV_DTYPES = ("fp16", "bf16", "fp32", "fp8_e4m3", "fp8_e5m2")  # cache dtypes this engine can store
KNOBS = {
    "page_size": Knob("page_size", int, "tokens per page (SGLang default 1; some attention backends force 64/128)"),
    "mem_fraction_static": Knob("mem_fraction_static", float, "fraction of free memory for weights + KV pool"),
    "max_total_tokens": Knob("max_total_tokens", int, "cap on the token pool"),
    "max_running_requests": Knob("max_running_requests", int, "running-request limit"),
    "chunked_prefill_size": Knob("chunked_prefill_size", int, "chunked prefill size"),
    "context_length": Knob("context_length", int, "the engine's context length"),
}
HYBRID_SWA_FAMILIES = ("llama4", "gpt-oss")


def select_version(requested: str | None) -> Selected[Rules]:
    return select("sglang", requested, VERSIONS)


def _tokens(c: LayerCache, ctx: int, hybrid_swa: bool) -> int:
    if c.kind in ("sliding", "chunked") and hybrid_swa:
        return min(ctx, getattr(c, "window", 0) or c.chunk)
    if c.kind == "cross":
        return c.encoder_len
    if c.kind in ("full", "sliding", "chunked", "mla"):
        return ctx
    return 0


@dataclass(frozen=True)
class Prepared:
    selected: Selected[Rules]
    spec: ModelSpec
    caches: tuple[tuple[tuple[int, LayerCache], ...], ...]
    kvd: KVDtypes
    page: int
    tp: int
    pp: int
    hybrid_swa: bool
    state: tuple[dtypes.DType, dtypes.DType]
    assumptions: tuple[str, ...]
    max_total_tokens: int | None = None

    def _token_bytes(self, c: LayerCache) -> int:
        if c.kind == "mla":
            return self.kvd.k.nbytes(c.latent_dim)
        h = base.kv_heads_per_gpu(c.kv_heads, self.tp)
        return self.kvd.k.nbytes(h * c.head_dim_k) + self.kvd.v.nbytes(h * c.head_dim_v)

    def _state_bytes(self, c: LayerCache) -> tuple[tuple[int, ...], tuple[int, ...]]:
        conv = (c.conv_kernel - 1, c.conv_dim // self.tp)
        shape = c.ssm_shape
        return conv, (shape[0] // self.tp, *shape[1:])

    def stage_bytes(self, ctx: int, batch: int, stage: int) -> int:
        return sum(g.bytes for g in self._groups(ctx, batch, stage))

    def _groups(self, ctx: int, batch: int, stage: int) -> list[PlanGroup]:
        from kvplan.engines.vllm import geometry

        merged: dict[LayerCache, list[int]] = {}
        for i, c in self.caches[stage]:
            merged.setdefault(c, []).append(i)
        out = []
        for c, layers in merged.items():
            n = len(layers)
            if c.kind in ("none", "shared"):
                out.append(PlanGroup(c.kind, tuple(layers), None, None, None, None, 0, "-", 0, 0, (), c.describe()))
                continue
            if c.kind in ("mamba_state", "linear_state"):
                conv_shape, ssm_shape = self._state_bytes(c)
                tensors = (tensor("conv_state", (batch, *conv_shape), self.state[0], n),
                           tensor("ssm_state", (batch, *ssm_shape), self.state[1], n))
                out.append(PlanGroup(c.kind, tuple(layers), None, None, None, None, 0, "state",
                                     sum(t.total_bytes for t in tensors), 0, tensors, c.describe()))
                continue
            held = base.pad_to(_tokens(c, ctx, self.hybrid_swa), self.page)
            rows = batch * held + self.page  # pools allocate size + page_size rows
            if c.kind == "mla":
                tensors = (tensor("kv_buffer (latent)", (rows, 1, c.latent_dim), self.kvd.k, n),)
            else:
                h = base.kv_heads_per_gpu(c.kv_heads, self.tp)
                tensors = (tensor("k_buffer", (rows, h, c.head_dim_k), self.kvd.k, n),
                           tensor("v_buffer", (rows, h, c.head_dim_v), self.kvd.v, n))
            grows = _tokens(c, ctx + 1, self.hybrid_swa) > _tokens(c, ctx, self.hybrid_swa)
            out.append(PlanGroup(
                kind=c.kind, layer_ids=tuple(layers), tokens=held, dtype=self.kvd.k.name if c.kind == "mla" else self.kvd.label,
                bytes=sum(t.total_bytes for t in tensors), bytes_per_token=self._token_bytes(c) * n if grows else 0,
                tensors=tensors, description=c.describe(), **geometry(c, self.tp),
            ))
        return out

    def limiting_stage(self, ctx: int) -> int:
        per = [self.stage_bytes(ctx, 1, s) for s in range(len(self.caches))]
        return per.index(max(per))

    def plan(self, ctx: int, batch: int, stage: int | None = None) -> CachePlan:
        stage = self.limiting_stage(ctx) if stage is None else stage
        groups = self._groups(ctx, batch, stage)
        all_gpus = sum(self.stage_bytes(ctx, batch, s) for s in range(len(self.caches))) * self.tp
        cell = sum(self._token_bytes(c) for _, c in self.caches[stage] if c.kind in ("full", "sliding", "chunked", "mla", "cross"))
        return CachePlan(self.selected.label, Request(ctx, batch, self.tp, self.pp), tuple(groups), all_gpus,
                         self.assumptions, stage, {"page_size": self.page, "cell_size": cell})


def prepare(spec: ModelSpec, tp: int, pp: int, kvd: KVDtypes, selected: Selected[Rules], opts: dict[str, Any],
            **_: Any) -> Prepared:
    base.check_tp_heads(spec, tp)
    page = int(opts.get("page_size") or 1)
    hybrid_swa = spec.family in HYBRID_SWA_FAMILIES
    notes = [f"page size {page} token(s){' (SGLang default)' if not opts.get('page_size') else ''}; each pool "
             "allocates one extra page of padding rows"]
    if selected.note:
        notes.append(selected.note)
    if any(c.kind in ("sliding", "chunked") for _, c in spec.caches):
        notes.append("sliding/chunked layers hold min(ctx, window) tokens (SGLang hybrid-SWA pool)" if hybrid_swa
                     else "SGLang gives this model's sliding-window layers full-length cache (not a hybrid-SWA model)")
    model_dt = base.serving_dtype(spec)
    state = (kvd.state or model_dt, kvd.state or dtypes.KV_DTYPES["fp32"])
    if any(c.kind in ("mamba_state", "linear_state") for _, c in spec.caches):
        notes.append(f"Mamba state per request: conv kernel-1 in {state[0].name}, SSM in {state[1].name}")
    cap = opts.get("max_total_tokens")
    return Prepared(selected, spec, tuple(base.stage_caches(spec, pp)), kvd, page, tp, pp, hybrid_swa, state, tuple(notes),
                    int(cap) if cap else None)


def default_mem_fraction(gpu_mib: int | None, tp: int, pp: int, rules: Rules, mla: bool) -> float:
    """ServerArgs._handle_gpu_memory_settings (0.5): reserved MiB from GPU-size tiers; <= 0.4: a TP table."""
    if not rules.fraction_tiers:
        return 0.79 if tp >= 16 else 0.81 if tp >= 8 else 0.85 if tp >= 4 else 0.87 if tp >= 2 else 0.88
    if gpu_mib is None:
        return 0.88
    gib = gpu_mib / 1024
    if gib < 20:
        chunk, graph_bs = 2048, 8
    elif gib < 35:
        chunk, graph_bs = 2048, 24 if tp < 4 else 80
    elif gib < 60:
        chunk, graph_bs = 4096, 32 if tp < 4 else 160
    elif gib < 160:
        chunk, graph_bs = 8192, 256 if tp < 4 else 512
    else:
        chunk, graph_bs = 16384, 512
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp * pp / 8 * 1024
    reserved += 58 * 8 + (1536 if mla else 0)  # piecewise CUDA graphs (on by default): 58 token sizes x 8 MiB
    if gib > 60:
        reserved = max(reserved, 10240)
    return round((gpu_mib - reserved) / gpu_mib, 3)



# ---------------------------------------------------------------------------------------------- budget, capacity
def budget(prepared: Prepared, spec: ModelSpec, gpu: base.GpuContext, stage: int, weights: int,
           opts: dict[str, Any], reserve: int | None, dtype_bytes: int) -> base.Budget:
    """profile_max_num_token: pre = free memory after NCCL init, post = pre - weights;
    rest = post - pre x (1 - mem_fraction_static), i.e. KV = mem_fraction_static x pre - weights."""
    from kvplan.engines import overhead

    mla = any(c.kind == "mla" for _, c in spec.caches)
    nvml_mib = (gpu.nvml_total or gpu.cuda_total) >> 20
    f = opts.get("mem_fraction_static")
    f = float(f) if f else default_mem_fraction(nvml_mib, prepared.tp, prepared.pp, prepared.selected.rules, mla)
    pre = gpu.cuda_total - overhead.CUDA_CONTEXT_BYTES - (overhead.NCCL_BYTES if prepared.tp * prepared.pp > 1 else 0)
    if reserve is not None:
        pre = gpu.cuda_total - reserve
    parts = (("free after NCCL init (estimate)", pre), ("x mem_fraction_static", int(pre * f) - pre), ("weights", -weights))
    notes = (f"mem_fraction_static {f}" + ("" if opts.get("mem_fraction_static") else " (SGLang default for this GPU)"),)
    return base.Budget(int(pre * f) - weights, parts, notes)


def _token_pool(prepared: Prepared, budgets: list[int]) -> int:
    """max_total_num_tokens: int(rest) // cell, min over stages, --max-total-tokens cap, floored to the page."""
    counts = []
    for s, caches in enumerate(prepared.caches):
        cell = sum(prepared._token_bytes(c) for _, c in caches if c.kind in ("full", "sliding", "chunked", "mla", "cross"))
        if cell:
            counts.append(max(0, budgets[s]) // cell)
    n = min(counts) if counts else 0
    if prepared.max_total_tokens:
        n = min(n, prepared.max_total_tokens)
    return n // prepared.page * prepared.page


def max_batch(prepared: Prepared, ctx: int, budgets: list[int]) -> int:
    if prepared.hybrid_swa:
        return _hybrid_swa_batch(prepared, ctx, _token_pool(prepared, budgets))
    if any(c.kind in ("cross", "mamba_state", "linear_state") for st in prepared.caches for _, c in st):
        # fixed-size per-request state (Mamba slots, cross K/V): charge whole requests against the budget
        return base.max_batch_by_bytes(prepared.stage_bytes, budgets, ctx)
    per = base.pad_to(ctx, prepared.page)
    return _token_pool(prepared, budgets) // per if per else 0


SWA_FULL_TOKENS_RATIO = 0.8  # --swa-full-tokens-ratio default


def _hybrid_swa_batch(prepared: Prepared, ctx: int, cap: int) -> int:
    """_resolve_hybrid_swa_tokens: the pool of cap tokens (cell = F x n_full + S x n_swa) split into a full pool
    and an SWA pool of ratio r; a request needs ctx full tokens and min(ctx, window) SWA tokens."""
    caches = prepared.caches[0]
    full = sum(prepared._token_bytes(c) for _, c in caches if c.kind in ("full", "mla"))
    swa = sum(prepared._token_bytes(c) for _, c in caches if c.kind in ("sliding", "chunked"))
    r = SWA_FULL_TOKENS_RATIO
    full_tokens = int(cap * (full + swa) / (full + r * swa)) // prepared.page * prepared.page if full + swa else 0
    swa_tokens = int(full_tokens * r) // prepared.page * prepared.page
    windows = [getattr(c, "window", 0) or c.chunk for _, c in caches if c.kind in ("sliding", "chunked")]
    need_full = base.pad_to(ctx, prepared.page)
    need_swa = base.pad_to(min(ctx, max(windows)), prepared.page) if windows else 0
    b = full_tokens // need_full
    return min(b, swa_tokens // need_swa) if need_swa else b


def fits(prepared: Prepared, ctx: int, batch: int, budgets: list[int]) -> bool:
    if not prepared.hybrid_swa and any(c.kind in ("cross", "mamba_state", "linear_state") for st in prepared.caches for _, c in st):
        return all(prepared.stage_bytes(ctx, batch, s) <= budgets[s] for s in range(len(prepared.caches)))
    return batch <= max_batch(prepared, ctx, budgets)


def capacity(prepared: Prepared, spec: ModelSpec, ctx: int, budgets: list[int], opts: dict[str, Any],
             gpu: base.GpuContext, max_model_len: int | None) -> base.Capacity:
    n = _token_pool(prepared, budgets)
    context_len = int(opts.get("context_length") or max_model_len or ctx)
    est = min(max(int(n / context_len * 512), 2048), 4096) if context_len else 2048
    user = opts.get("max_running_requests")
    cap = min(int(user), est) if user else min(est, n // 2)  # _resolve_max_num_reqs
    start = n > 0
    message = None if start else "Not enough memory. Please try to increase --mem-fraction-static. (SGLang refuses to start)"
    return base.Capacity(max_batch(prepared, ctx, budgets), n, round(n / ctx, 2) if ctx else None, cap, start, message,
                         None, {"max_total_num_tokens": n, "page_size": prepared.page, "context_len": context_len})
