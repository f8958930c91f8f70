"""`kvplan plan`: for a workload on a GPU, how many requests run at once, how fast each decodes (a bound), and how
many GPUs N users need at a target time per output token.

Memory side: the engine's own pool (the same budget and block layout `fit` solves with) replayed request by
request through vLLM's scheduler (schedule_sim.py): admissions, block growth, preemptions, shared prefix blocks;
or, with --engine llamacpp, through llama-server's slots (slot_sim.py): -np slots over the cells of -c, deferral,
requests refused or cut by their slot's context, and a unified cache running out of cells.
Speed side: a memory-bandwidth bound per decode step, (weight bytes read + cache bytes read by every running
request) / the GPU's bandwidth; compute, communication and kernel efficiency are left out, so step times are lower
bounds and tokens/s upper bounds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

from kvplan import JSON_SCHEMA
from kvplan.errors import InputError
from kvplan.gpus import GpuSelection
from kvplan.schedule_sim import PoolGroup, SchedulerSettings, SimRequest, Trace, paged_group, simulate, sliding_group
from kvplan.sizing import EngineOptions, ModelOptions
from kvplan.workload import Workload

SATURATION_ROUNDS = 3  # requests per user in the saturated closed loop (the first round warms up, the last drains)


@dataclass(frozen=True)
class Pool:
    """The engine's KV pool for this model, GPU and settings, as its scheduler sees it."""

    settings: SchedulerSettings
    bytes_per_block: int
    kv_budget_bytes: int
    kv_budget_source: str
    kinds: tuple[str, ...] = ()  # per group: full, sliding, state, state-align, chunked, cross (what the replay does)

    @property
    def usable_blocks(self) -> int:
        return self.settings.num_blocks - 1

    @property
    def prefix_caching(self) -> bool:
        """Prefix caching on and replayed (full/latent attention groups only)."""
        return self.settings.prefix_caching and all(g.caches_prefix for g in self.settings.groups)

    def saturating_users(self, mean_blocks: float) -> int:
        """Users that fill the pool half again (capped by max_num_seqs): a closed loop of them shows what one
        instance holds at once; more users would only wait longer."""
        return min(self.settings.max_num_seqs, math.ceil(1.5 * self.usable_blocks / max(mean_blocks, 1e-9)) + 4)

    def request_blocks(self, tokens: int) -> int:
        """Blocks a request of `tokens` holds while it decodes (a window's: those inside it)."""
        return sum(g.blocks_for(tokens) for g in self.settings.groups)

    def cached_prefix(self, shared_prefix: int) -> int:
        """Prompt tokens of a shared prefix that come cached: its whole blocks, with prefix caching."""
        if not (shared_prefix and self.prefix_caching):
            return 0
        bs = self.settings.groups[0].block_size
        return (shared_prefix // bs) * bs

    def admission_blocks(self, tokens: int) -> int:
        """Blocks vLLM's admission check asks for a request of `tokens` (a window's capped by its reservation)."""
        return sum(g.admission_blocks(tokens, self.settings.max_model_len) for g in self.settings.groups)

    def to_json(self) -> dict[str, Any]:
        s = self.settings
        return {"num_blocks": s.num_blocks, "usable_blocks": self.usable_blocks,
                "block_size": max(g.block_size for g in s.groups), "bytes_per_block": self.bytes_per_block,
                "kv_groups": len(s.groups), "kv_budget_bytes": self.kv_budget_bytes,
                "kv_budget_source": self.kv_budget_source, "max_num_seqs": s.max_num_seqs,
                "max_num_batched_tokens": s.max_num_batched_tokens, "max_model_len": s.max_model_len,
                "prefix_caching": self.prefix_caching}


@dataclass(frozen=True)
class ServerPool:
    """llama-server's KV cells for this model, GPU and -np / -c, as its slots see them (a cell holds one token)."""

    settings: Any  # slot_sim.ServerSettings
    bytes_per_block: int  # one cell of every layer whose cache grows with the context
    kv_budget_bytes: int
    kv_budget_source: str
    kv_bytes: int  # the cache llama.cpp allocates for -np / -c (limiting stage, one GPU)
    streams: int
    kv_groups: int
    flags: str  # llama-server's command line for it
    kinds: tuple[str, ...] = ()

    @property
    def usable_blocks(self) -> int:
        return self.settings.n_ctx

    @property
    def prefix_caching(self) -> bool:
        return self.settings.cache_prompt and self.settings.reuse_prefix

    def saturating_users(self, mean_blocks: float) -> int:
        """Every slot busy: more users only wait in the deferred queue."""
        return self.settings.n_slots

    def request_blocks(self, tokens: int) -> int:
        return min(tokens, self.settings.n_ctx_slot)

    def admission_blocks(self, tokens: int) -> int:
        return self.request_blocks(tokens)

    def cached_prefix(self, shared_prefix: int) -> int:
        """A slot reuses the common prefix its last prompt left in the cache (cache_prompt)."""
        return shared_prefix if self.prefix_caching else 0

    def to_json(self) -> dict[str, Any]:
        st = self.settings
        return {"num_blocks": st.n_ctx, "usable_blocks": st.n_ctx, "block_size": 1,
                "bytes_per_block": self.bytes_per_block, "kv_groups": self.kv_groups,
                "kv_budget_bytes": self.kv_budget_bytes, "kv_budget_source": self.kv_budget_source,
                "max_num_seqs": st.n_slots, "max_num_batched_tokens": st.n_batch, "max_model_len": st.n_ctx_slot,
                "prefix_caching": self.prefix_caching, "slots": st.n_slots, "ctx_size": st.n_ctx,
                "ctx_per_slot": st.n_ctx_slot, "kv_unified": st.unified, "streams": self.streams,
                "kv_bytes": self.kv_bytes, "flags": self.flags}


@dataclass(frozen=True)
class RunStats:
    """One replay: what the scheduler did (steps are engine iterations)."""

    requests: int
    steps: int
    peak_running: int
    mean_running: float
    p10_running: int
    p50_running: int
    p90_running: int
    preemptions: int
    preempted_requests: int
    window: tuple[int, int]  # the steps the means are over
    truncated: bool
    answers: dict[str, int] | None = None  # llama-server: peak_deferred and the requests refused, cut and failed

    def to_json(self) -> dict[str, Any]:
        return {"requests": self.requests, "steps": self.steps, "peak_running": self.peak_running,
                "mean_running": round(self.mean_running, 2), "p10_running": self.p10_running,
                "p50_running": self.p50_running, "p90_running": self.p90_running, "preemptions": self.preemptions,
                "preempted_requests": self.preempted_requests, "window_steps": list(self.window),
                "truncated": self.truncated, **(self.answers or {})}


def run_stats(trace: Trace, requests: int, window: tuple[int, int] | None = None) -> RunStats:
    lo, hi = window or (0, len(trace.steps))
    hi = max(hi, lo + 1)
    running = sorted(s.running for s in trace.steps[lo:hi]) or [0]

    def pct(q: float) -> int:
        return running[min(len(running) - 1, int(q * len(running)))]

    inside = [p for p in trace.preemptions if lo <= p[0] < hi]
    answers = None
    if hasattr(trace, "outcomes"):  # llama-server (slot_sim.ServerTrace): over the whole replay
        answers = {"peak_deferred": trace.peak_deferred, "refused_requests": trace.count("rejected"),
                   "cut_requests": trace.count("cut"), "failed_requests": trace.count("failed"),
                   "kv_exhaustions": len(trace.failures)}
    return RunStats(requests, len(trace.steps), trace.peak_running, sum(running) / len(running), pct(0.1), pct(0.5),
                    pct(0.9), len(inside), len({i for _, i in inside}), (lo, hi), trace.truncated, answers)


# ---------------------------------------------------------------------------------------------- speed
@dataclass(frozen=True)
class SpeedModel:
    """Bytes one GPU reads per decode step, against its bandwidth."""

    bandwidth: int  # bytes/s of one GPU
    bandwidth_source: str
    weight_bytes: int  # on one GPU
    expert_bytes: tuple[tuple[int, int], ...]  # (experts in the tensor set, bytes on one GPU) of routed experts
    experts_per_token: int
    bytes_per_block: int
    # tensor parallelism: bytes one GPU moves per token through its all-reduces (ring), and its link's bytes/s
    allreduce_bytes_per_token: float = 0.0
    link: float = 0.0

    def comm_seconds(self, tokens: int) -> float:
        return tokens * self.allreduce_bytes_per_token / self.link if self.link else 0.0

    def weight_read(self, batch: int) -> float:
        """Weights read by a step of `batch` decoding requests: everything but the routed experts, and of those the
        share a batch touches, E x (1 - (1 - k/E)^batch) experts expected under uniform, independent routing."""
        total = float(self.weight_bytes)
        k = self.experts_per_token
        for experts, b in self.expert_bytes:
            if k and experts > k:
                total -= b * (1 - k / experts) ** batch
        return total

    def step_seconds(self, batch: int, cache_bytes: float) -> float:
        """The longer of the memory read and the step's all-reduces (they may overlap, so not their sum)."""
        return max((self.weight_read(batch) + cache_bytes) / self.bandwidth, self.comm_seconds(batch))

    def to_json(self) -> dict[str, Any]:
        return {"bandwidth_bytes_per_s": self.bandwidth, "bandwidth_source": self.bandwidth_source,
                "weight_bytes": self.weight_bytes, "routed_expert_bytes": sum(b for _, b in self.expert_bytes),
                "experts_per_token": self.experts_per_token,
                "interconnect_bytes_per_s": round(self.link) if self.link else None,
                "allreduce_bytes_per_token": round(self.allreduce_bytes_per_token) if self.link else None}


ACTIVATION_BYTES = 2  # bf16 / fp16 activations on the wire


def allreduce_bytes_per_token(setup, stage: int) -> float:
    """Megatron-style tensor parallelism: two all-reduces per decoder layer (after attention and after the MLP) of
    hidden x 2 B per token; a ring all-reduce moves 2 (tp - 1) / tp of that through each GPU's link."""
    from kvplan.parallel import pp_partition

    tp = setup.tp
    if tp <= 1:
        return 0.0
    layers = len(pp_partition(setup.spec.num_layers, setup.pp)[stage])
    return 2 * layers * setup.spec.widths.hidden * ACTIVATION_BYTES * 2 * (tp - 1) / tp


def speed_model(setup, stage: int, bandwidth: float, source: str, bytes_per_block: int,
                link: float | None = None) -> SpeedModel:
    from kvplan import weights

    spec = setup.spec
    k = spec.widths.experts_per_token
    total = setup.weight_bytes(stage)
    cfg_total = weights.per_gpu_bytes(spec, setup.weight_format, setup.float_dtype, setup.tp, setup.pp, stage,
                                      include_mtp=setup.include_mtp) or 1
    experts = []
    if k:
        for count in sorted({w.count for w in spec.weights if w.role == "expert" and w.split == "expert"}):
            b = weights.per_gpu_bytes(spec, setup.weight_format, setup.float_dtype, setup.tp, setup.pp, stage,
                                      include_mtp=setup.include_mtp,
                                      only=lambda w, c=count: w.role in ("expert", "bias") and w.split == "expert" and w.count == c)
            if b:
                experts.append((count, b * total // cfg_total))
    ar = allreduce_bytes_per_token(setup, stage) if link else 0.0
    return SpeedModel(bandwidth, source, total, tuple(experts), k, bytes_per_block, ar, float(link or 0) if ar else 0.0)


@dataclass(frozen=True)
class SpeedRow:
    batch: int
    weight_read: float
    cache_read: float
    step_seconds: float

    @property
    def tokens_per_s_per_request(self) -> float:
        return 1.0 / self.step_seconds

    def to_json(self) -> dict[str, Any]:
        return {"batch": self.batch, "weight_read_bytes": round(self.weight_read), "cache_read_bytes": round(self.cache_read),
                "step_seconds": self.step_seconds, "tokens_per_s_per_request": round(1.0 / self.step_seconds, 3),
                "tokens_per_s": round(self.batch / self.step_seconds, 3)}


def speed_rows(speed: SpeedModel, per_request_cache: float, top: int) -> list[SpeedRow]:
    batches, b = [], 1
    while b < top:
        batches.append(b)
        b *= 2
    batches.append(max(1, top))
    out = []
    for b in batches:
        cache = b * per_request_cache
        out.append(SpeedRow(b, speed.weight_read(b), cache, speed.step_seconds(b, cache)))
    return out


def crossover(speed: SpeedModel, per_request_cache: float, limit: int = 1 << 16) -> int | None:
    """The smallest batch whose cache reads exceed its weight reads (None: not below `limit`)."""
    if per_request_cache <= 0:
        return None
    b = max(1, math.ceil(speed.weight_bytes / per_request_cache))
    while b > 1 and (b - 1) * per_request_cache > speed.weight_read(b - 1):
        b -= 1
    while b <= limit and b * per_request_cache <= speed.weight_read(b):
        b += 1
    return b if b <= limit else None


@dataclass(frozen=True)
class PrefillModel:
    """A prompt's prefill cannot beat the GPU's dense tensor rate: 2 FLOPs per active linear parameter per prompt
    token (decoder-layer projections, MLPs and the routed experts a token uses; attention scores, embeddings and
    the LM head left out, so the FLOP count is a lower bound), nor read its weights faster than the bandwidth."""

    flops: float  # FLOP/s of one GPU
    dtype: str
    source: str
    active_params: float  # linear parameters one prompt token multiplies on one GPU

    def seconds(self, tokens: int, speed: SpeedModel) -> float:
        return max(2.0 * tokens * self.active_params / self.flops, speed.weight_read(tokens) / speed.bandwidth,
                   speed.comm_seconds(tokens))

    def to_json(self, mean_prompt_seconds: float, max_prompt_seconds: float) -> dict[str, Any]:
        return {"flops_per_s": self.flops, "flops_dtype": self.dtype, "flops_source": self.source,
                "active_params_per_token": round(self.active_params),
                "mean_prompt_seconds": mean_prompt_seconds, "max_prompt_seconds": max_prompt_seconds}


def prefill_model(setup, stage: int, gpu) -> PrefillModel | None:
    """None when the catalog has no dense TFLOPS for the GPU. 8-bit or narrower weights may run on the FP8 rate
    (the fastest the engine could use, so the time stays a bound); 16-bit weights on BF16 (FP16 where the chip has
    no BF16)."""
    from kvplan.parallel import pp_partition

    rates = dict(gpu.tflops)
    narrow = setup.weight_format.name not in ("bf16", "fp16", "fp32")
    dtype = "fp8" if narrow and "fp8" in rates else ("bf16" if "bf16" in rates else "fp16")
    if dtype not in rates:
        return None
    spec, tp = setup.spec, setup.tp
    k = spec.widths.experts_per_token
    layers = set(pp_partition(spec.num_layers, setup.pp)[stage])
    active = 0.0
    for w in spec.weights:
        if w.part != "text" or w.layer is None or w.layer not in layers or w.role not in ("linear", "expert"):
            continue
        n = float(w.params)
        if w.role == "expert" and w.split == "expert" and k and w.count > k:
            n *= k / w.count
        active += n if w.split == "replicated" else n / tp
    return PrefillModel(rates[dtype] * 1e12, dtype, f"{gpu.name} dense {dtype} {rates[dtype]:g} TFLOPS (sources: kvplan gpus --json, tflops_source)",
                        active)


# ---------------------------------------------------------------------------------------------- the plan
@dataclass(frozen=True)
class PlanReport:
    fit: Any  # planner.FitResult the pool comes from
    pool: Pool
    workload: Workload
    mode: str  # burst | users
    users: int | None
    run: RunStats
    mean_request_blocks: float
    speed: SpeedModel | None
    speed_table: tuple[SpeedRow, ...]
    step_bound: float | None  # the replay's median decode-step bound, seconds
    crossover_batch: int | None
    tpot_target: float | None
    fleet: dict[str, Any] | None
    assumptions: tuple[str, ...]
    warnings: tuple[str, ...]
    prefill: PrefillModel | None = None
    latency: dict[str, Any] | None = None
    rate: float | None = None

    @property
    def static(self) -> dict[str, Any] | None:
        if not isinstance(self.pool, Pool):  # llama.cpp: a slot's context is itself a static reservation
            return None
        return static_comparison(self.pool, self.workload, self.mean_request_blocks)

    @property
    def prefill_seconds(self) -> tuple[float, float] | None:
        """The prefill bound for the mean and the longest prompt a request computes (None without a bound)."""
        if self.prefill is None or self.speed is None:
            return None
        return (self.prefill.seconds(round(_computed_mean(self.workload, self.pool)), self.speed),
                self.prefill.seconds(_computed_max(self.workload, self.pool), self.speed))

    def to_json(self) -> dict[str, Any]:
        f = self.fit
        out = {
            "schema": JSON_SCHEMA, "model": f.setup.ref.to_json(), "engine": f.setup.engine.label,
            "gpu": f.gpu.to_json(), "tp": f.setup.tp, "pp": f.setup.pp, "kv_dtype": f.setup.kvd.label,
            "weight_bytes": f.weight_bytes, "workload": self.workload.to_json(), "mode": self.mode,
            "users": self.users, "pool": self.pool.to_json(), "run": self.run.to_json(),
            "mean_request_blocks": round(self.mean_request_blocks, 3),
            "static_comparison": self.static,
            "speed": None, "fleet": self.fleet, "rate": self.rate, "latency": self.latency,
            "assumptions": list(self.assumptions), "warnings": list(self.warnings),
        }
        if self.speed is not None:
            out["speed"] = {**self.speed.to_json(), "step_seconds_bound": self.step_bound,
                            "tokens_per_s_per_request_bound": round(1 / self.step_bound, 3) if self.step_bound else None,
                            "cache_over_weights_from_batch": self.crossover_batch,
                            "by_batch": [r.to_json() for r in self.speed_table],
                            "prefill": self.prefill.to_json(*self.prefill_seconds)
                            if self.prefill is not None else None}
        return out


def _windows_share_prefix(stage) -> bool:
    """Prefix caching is replayed for sliding windows only beside full/latent attention of one block size (the
    hybrid hit rule checked against vLLM); other mixes keep it off for the whole pool."""
    from kvplan.engines import vllm

    specs = [g.spec for g in stage.groups]
    return (all(type(sp) in (vllm.FullSpec, vllm.MLASpec, vllm.SlidingSpec) and sp.shards == 1 for sp in specs)
            and len({sp.block_size for sp in specs}) == 1)


def replay_notes(pool: Pool) -> list[str]:
    """What the replay does with each kind of group, and what it leaves to vLLM's reservation."""
    kinds, s = set(pool.kinds), pool.settings
    notes = []
    windows = [g for g in s.groups if g.window]
    if windows:
        w = windows[0]
        notes.append(f"sliding-window groups replayed as vLLM 0.32 runs them: the blocks wholly behind a request's "
                     f"window (window {', '.join(sorted({f'{g.window:,}' for g in windows}))} tokens) go back to the "
                     f"pool as it advances, and admission asks at most {w.admission_cap(s.max_model_len):,} blocks "
                     "(window - 1 + in-flight tokens); checked step by step against vLLM's CPU build (scaled "
                     "Gemma-2, full + sliding)")
        if s.prefix_caching and pool.prefix_caching:
            notes.append("prefix caching replayed for windows as vLLM's hybrid coordinator: a hit is full "
                         "attention's cached run cut back to the last run of cached window blocks; window blocks "
                         "are cached only at the prompt's end and at a shared-prefix junction "
                         "(prefix_cache_retention_interval 0)")
    if "state" in kinds:
        notes.append("state (Mamba / linear attention) groups: one block per request from admission to the end, as "
                     "vLLM's MambaManager in mamba_cache_mode 'none' (prefix caching off); checked step by step "
                     "against vLLM's CPU build (scaled Nemotron-H)")
    if "state-align" in kinds:
        notes.append("state groups in mamba_cache_mode 'align' (prefix caching on a hybrid) hold their per-request "
                     "reservation; vLLM's per-block state checkpoints are not replayed")
    if "state-all" in kinds:
        notes.append("state groups in mamba_cache_mode 'all' (vLLM 0.15-0.27, prefix caching on a Mamba-family "
                     "hybrid) take a block per block_size tokens as attention does and keep them; from vLLM's "
                     "source, not checked against the engine")
    if kinds & {"chunked", "cross"}:
        notes.append("chunked-local / cross-attention groups hold vLLM's per-request reservation for their length "
                     "(chunked local attention's freeing is not replayed)")
    if s.prefix_caching and not pool.prefix_caching:
        notes.append("prefix caching is not replayed for this mix of cache groups (it is for full, latent and "
                     "sliding-window attention of one block size): the replay runs with it off, so each request "
                     "holds its own copy of a shared prefix")
    return notes


def _replay_group(spec, inflight: int, windows_cache: bool) -> tuple[PoolGroup, str]:
    """One vLLM KV cache group as the replay sees it, and its kind for the output (Pool.kinds): full/latent
    attention grows a block per block_size tokens, a sliding window also frees the blocks behind it, anything else
    (state, chunked local, cross attention) holds its per-request reservation (MambaManager in mode 'none': one
    block from admission to the end; in mode 'all' a block per block_size tokens, kept, its prefix hits not
    replayed)."""
    from kvplan.engines import vllm

    if type(spec) in (vllm.FullSpec, vllm.MLASpec):
        return paged_group(spec.block_size, spec.shards, spec.shards == 1), "full"
    if type(spec) is vllm.SlidingSpec and spec.per_state == 1 and not spec.align:
        return sliding_group(spec.block_size, spec.window, inflight, windows_cache), "sliding"
    if type(spec) is vllm.SlidingSpec:
        kind = "sliding"
    elif type(spec) is vllm.MambaSpec:
        kind = "state-all" if spec.per_block else "state-align" if spec.state_blocks > 1 else "state"
    else:
        kind = "chunked" if type(spec) is vllm.ChunkedSpec else "cross"
    return PoolGroup(spec.block_size, lambda n, sp=spec: sp.blocks(n, inflight), False), kind


def _pool(fit) -> Pool:
    from kvplan.engines import vllm

    s = fit.setup
    prepared = s.prepared
    stage_i = prepared.limiting_stage(fit.ctx)
    stage = prepared.stages[stage_i]
    budgets = [b.kv_bytes for b in fit.budgets]
    num_blocks = vllm.pool_blocks(prepared, budgets)
    inflight = prepared.inflight
    if stage.packed:
        raise InputError("plan's replay of vLLM's scheduler does not model DeepSeek-V4's packed window and "
                         "compressor-state groups yet (vLLM frees their blocks as the window moves); `kvplan fit` "
                         "gives its capacity")
    if stage.uniform_type:
        groups = (PoolGroup(stage.block_size, lambda n: stage.blocks_per_request(n, inflight), True),)
        kinds = ("full",)
    else:
        share = _windows_share_prefix(stage)
        groups, kinds = zip(*(_replay_group(g.spec, inflight, share) for g in stage.groups))
    return Pool(SchedulerSettings(num_blocks, groups, 0, prepared.max_num_batched_tokens, 0), stage.bytes_per_block,
                min(budgets), fit.kv_budget_source, kinds)


CACHE_RAM_BYTES = 8192 << 20  # llama-server --cache-ram default (MiB): the RAM prompt cache's size limit


def _llamacpp_setup(mo: ModelOptions, eo: EngineOptions, gpu: GpuSelection, workload: Workload, kv_budget, reserve,
                    tp, pp, calibrations):
    """llama-server's cells and slots for the workload: (fit, pool, replay, running cap, assumptions, warnings).

    -np / -c as given; without them kvplan deploys what `fit` suggests: C = the longest request (prompt + output),
    -np the most slots whose `-np B -c B*C` cache fits the KV budget (at most LLAMA_MAX_SEQ), -c = -np x C; with -c
    alone, -np = -c // C."""
    from functools import partial

    from kvplan import planner, slot_sim
    from kvplan.engines import llamacpp
    from kvplan.spec import RecurrentState

    opts = {k: v for k, v in eo.knobs.items() if v is not None}
    parallel = llamacpp.check_parallel(opts.pop("parallel", None))
    ctx_size = opts.pop("ctx_size", None)
    longest = workload.longest
    fit = planner.fit_model(mo, replace(eo, knobs=opts), gpu, longest, 1, kv_budget=kv_budget, reserve=reserve, tp=tp,
                            pp=pp, calibrations=calibrations)
    s = fit.setup
    prepared = s.prepared
    if not prepared.selected.rules.streams:
        raise InputError(f"plan replays llama-server b11434's slots; {prepared.label} (before per-slot cell streams) "
                         "is not modelled")
    if not fit.weights_fit:
        raise InputError(f"{s.ref.requested}: the weights ({fit.weight_bytes:,} B per GPU) leave no KV memory on "
                         f"{gpu.requested}; nothing to plan (kvplan fit shows the budget)")
    budgets = [b.kv_bytes for b in fit.budgets]
    chosen = parallel is None and ctx_size is None
    if parallel is None:
        if ctx_size is not None:
            parallel = max(1, min(llamacpp.LLAMA_MAX_SEQ, ctx_size // longest))
        else:
            parallel = min(llamacpp.LLAMA_MAX_SEQ, llamacpp.max_batch(prepared, longest, budgets))
            if parallel < 1:
                raise InputError(f"not one llama.cpp slot of the longest request ({longest:,} tokens) fits the KV "
                                 f"budget ({min(budgets):,} B per GPU); kvplan fit shows it")
    c = ctx_size if ctx_size is not None else parallel * longest
    deployed = replace(prepared, n_ctx_total=c)
    stage = deployed.limiting_stage(longest)
    need = [deployed.stage_bytes(longest, parallel, st) for st in range(len(deployed.stages))]
    flags = f"-np {parallel} -c {c}" + (" --kv-unified" if prepared.unified else "")
    over = [st for st, (n, b) in enumerate(zip(need, budgets)) if n > b]
    if over:
        st = over[0]
        raise InputError(f"llama-server {flags}: llama.cpp's KV cache takes {need[st]:,} B per GPU, the KV budget is "
                         f"{budgets[st]:,} B (kvplan fit shows it); lower -np or -c")
    cl = deployed.cells(longest, parallel)
    n_ctx_slot = min(cl.base, s.max_ctx) if s.max_ctx else cl.base
    per_cell = max(1, prepared.plan(longest, 1, stage).kv_bytes_per_token)
    windowed = bool(prepared.n_swa()) and not prepared.swa_full
    recurrent = any(isinstance(c_, RecurrentState) for _, c_ in s.spec.caches)
    settings = slot_sim.ServerSettings(
        n_slots=parallel, n_ctx=cl.n_ctx, n_ctx_slot=n_ctx_slot, unified=prepared.unified,
        n_batch=min(c, slot_sim.N_BATCH), cache_ram_tokens=max(cl.n_ctx, CACHE_RAM_BYTES // per_cell),
        reuse_prefix=not (windowed or recurrent))
    groups = [g for g in deployed.plan(longest, parallel, stage).groups if g.bytes]
    pool = ServerPool(settings, per_cell, min(budgets), fit.kv_budget_source, need[stage], cl.streams, len(groups),
                      flags)
    layout = (f"one unified stream of {cl.n_ctx:,} cells shared by the slots" if prepared.unified
              else f"{cl.streams} streams of {cl.base:,} cells, one per slot")
    assumptions = [
        f"llama-server {flags}: {layout}, {per_cell:,} B per cell ({fit.kv_budget_source} KV budget "
        f"{min(budgets):,} B per GPU, the cache takes {need[stage]:,} B); a slot's context {n_ctx_slot:,} tokens"
        + (f" (capped at the training context {s.max_ctx:,})" if s.max_ctx and s.max_ctx < cl.base else "")
        + f", n_batch {settings.n_batch:,}",
        "requests replayed through llama-server b11434's slots (kvplan/slot_sim.py): a request holds one slot from "
        "start to end, the rest wait deferred in arrival order; one llama_decode per iteration of each generating "
        "slot's token plus prompt tokens up to n_batch; a prompt of the slot's context or more is refused, a request "
        "stops when its tokens reach it (no context shift, the default); prompt cache reuse of the common prefix a "
        "slot holds (--cache-ram, --cache-idle-slots defaults); checked iteration by iteration against llama-server "
        "b11434 on CPU",
    ]
    if chosen:
        assumptions.append(f"-np and -c chosen by kvplan as `fit` suggests them: slots of the longest request "
                           f"({longest:,} tokens) while their cache fits (llama-server's own default is -np 4 "
                           "--kv-unified with -c from the model; give --parallel / --ctx-size to plan yours)")
    if prepared.unified:
        assumptions.append("--kv-unified: every slot's tokens, idle slots' cached prompts included, share the cells; "
                           "idle slots are cleared when a task starts; when a one-token batch finds no cell, "
                           "llama-server fails every request in flight (\"Context size has been exceeded.\")")
    if not settings.reuse_prefix:
        assumptions.append("sliding-window / recurrent caches: llama-server reuses a cached prefix only through "
                           "context checkpoints, which the replay leaves out (prompts are recomputed: prefill work "
                           "an upper bound; requests at once unchanged)")
    if s.pp > 1:
        assumptions.append(f"layers split over {s.pp} GPUs (-sm layer): one llama_decode runs them in turn")
    warnings = list(fit.warnings)
    return fit, pool, partial(slot_sim.simulate, settings), parallel, assumptions, warnings


def _vllm_setup(mo: ModelOptions, eo: EngineOptions, gpu: GpuSelection, workload: Workload, kv_budget, reserve, tp, pp,
                calibrations):
    """vLLM's pool and scheduler settings for the workload: (fit, pool, replay, running cap, assumptions, warnings)."""
    from functools import partial

    from kvplan import planner
    from kvplan.engines import vllm

    longest = workload.longest
    fit = planner.fit_model(mo, eo, gpu, longest, 1, kv_budget=kv_budget, reserve=reserve, tp=tp, pp=pp,
                            calibrations=calibrations)
    s = fit.setup
    opts = {k: v for k, v in eo.knobs.items() if v is not None}
    model_max = s.max_ctx
    mml = int(opts.get("max_model_len") or model_max or longest)
    if longest > mml:
        raise InputError(f"the workload's longest request is {longest:,} tokens (prompt + output); the engine's "
                         f"max_model_len is {mml:,}" + ("" if opts.get("max_model_len") else f" (the model maximum, {s.max_ctx_source})"))
    if not fit.weights_fit:
        raise InputError(f"{s.ref.requested}: the weights ({fit.weight_bytes:,} B per GPU) leave no KV memory on "
                         f"{gpu.requested}; nothing to plan (kvplan fit shows the budget)")
    base_pool = _pool(fit)
    seqs = int(opts.get("max_num_seqs") or vllm.default_max_num_seqs_for(planner.gpu_context(gpu)))
    prefix = opts.get("enable_prefix_caching") is not False
    settings = replace(base_pool.settings, max_num_seqs=seqs, max_model_len=mml, prefix_caching=prefix)
    pool = replace(base_pool, settings=settings)
    if pool.usable_blocks < pool.admission_blocks(min(longest, mml)):
        raise InputError(f"the pool holds {pool.usable_blocks:,} blocks; the longest request needs "
                         f"{pool.admission_blocks(min(longest, mml)):,}: vLLM would not start with this max_model_len")
    assumptions = [
        f"KV pool: {settings.num_blocks:,} blocks of {pool.bytes_per_block:,} B ({fit.kv_budget_source} budget "
        f"{pool.kv_budget_bytes:,} B per GPU), max_num_seqs {seqs}, max_num_batched_tokens {settings.max_num_batched_tokens:,}, "
        f"max_model_len {mml:,}, prefix caching {'on' if pool.to_json()['prefix_caching'] else 'off'}",
        "requests replayed through vLLM 0.32's V1 scheduler (FCFS, synchronous scheduling, chunked prefill, full "
        "sequence must fit at admission, recompute preemption); checked step by step against vLLM's CPU build",
    ]
    warnings = list(fit.warnings)
    assumptions += replay_notes(pool)
    if s.prepared.async_on:
        assumptions.append("vLLM on GPUs schedules asynchronously (one token ahead); the replay is synchronous, "
                           "as vLLM's CPU build where it was checked")
    return fit, pool, partial(simulate, settings), seqs, assumptions, warnings


def plan(mo: ModelOptions, eo: EngineOptions, gpu: GpuSelection, workload: Workload, *, users: int | None = None,
         tpot: float | None = None, bandwidth: float | None = None, kv_budget: int | None = None,
         reserve: int | None = None, tp: int | None = None, pp: int | None = None, burst: bool = False,
         ttft: float | None = None, rate: float | None = None, interconnect: float | None = None,
         calibrations: tuple = ()) -> PlanReport:
    """burst: every workload request arrives at once (a benchmark run). Otherwise a closed loop: `users` users (or,
    without users, enough to saturate one instance) each keep one request in the system."""
    from kvplan import engines
    from kvplan.engines import llamacpp, vllm

    if rate is not None and (users is not None or burst):
        raise InputError("--rate, --users and --burst are three ways to state the load (an arrival rate, a closed "
                         "loop of users, everything at once); give one")
    engine = engines.choose(eo.engine)
    if engine.module is llamacpp:
        fit, pool, replay, seqs, assumptions, warnings = _llamacpp_setup(mo, eo, gpu, workload, kv_budget, reserve, tp,
                                                                          pp, calibrations)
    elif engine.module is vllm:
        fit, pool, replay, seqs, assumptions, warnings = _vllm_setup(mo, eo, gpu, workload, kv_budget, reserve, tp, pp,
                                                                      calibrations)
    else:
        raise InputError(f"plan replays vLLM's scheduler and llama-server's slots; --engine {eo.engine} is not "
                         "modelled yet (accepted: vllm, llamacpp)")
    s = fit.setup
    mean_blocks = _mean_blocks(pool, workload)
    speed, table, step_bound, cross = None, (), None, None
    bw, bw_source = (round(bandwidth), "--bandwidth") if bandwidth else (
        (round(gpu.gpu.bandwidth_gbps * 1e9), f"{gpu.gpu.name} vendor peak {gpu.gpu.bandwidth_gbps:g} GB/s")
        if gpu.gpu.bandwidth_gbps else (None, ""))
    stage = s.prepared.limiting_stage(fit.ctx)
    if bw:
        speed = speed_model(s, stage, bw, bw_source, pool.bytes_per_block, interconnect)
        if speed.link:
            assumptions.append(f"tensor parallel {s.tp}: two all-reduces per layer of hidden x {ACTIVATION_BYTES} B per "
                               f"token, a ring moving 2(tp-1)/tp of them over --interconnect {speed.link / 1e9:g} GB/s "
                               "per GPU; a step lasts the longest of its memory, compute and communication bounds "
                               "(they may overlap)")
        elif s.tp > 1:
            assumptions.append(f"tensor parallel {s.tp}: all-reduce time left out of every bound (--interconnect GB/s "
                               "adds it)")
    else:
        warnings.append(f"no memory bandwidth for {gpu.requested}: the speed side needs --bandwidth GB/s")
    prefill = prefill_model(s, stage, gpu.gpu) if speed is not None else None
    timing = step_timer(speed, prefill, pool.bytes_per_block) if speed is not None else None
    if rate is not None and timing is None:
        raise InputError(f"--rate needs step times, which need a memory bandwidth for {gpu.requested} (--bandwidth GB/s)")
    latency = None
    if rate is not None:
        reqs = list(workload.requests)
        trace = replay(reqs, arrivals=poisson_arrivals(len(reqs), rate), step_seconds=timing)
        run = run_stats(trace, len(reqs))
        latency = latency_stats(trace, reqs, rate)
        mode, loop_users = "rate", None
    elif burst:
        reqs = list(workload.requests)
        trace = replay(reqs, step_seconds=timing)
        run = run_stats(trace, len(reqs))
        latency = latency_stats(trace, reqs, None) if timing else None
        mode, loop_users = "burst", None
    else:
        saturating = pool.saturating_users(mean_blocks)
        loop_users = min(users, saturating) if users is not None else saturating
        reqs = _enough(workload, loop_users * SATURATION_ROUNDS)
        trace = replay(reqs, users=loop_users, step_seconds=timing)
        run = run_stats(trace, len(reqs), _steady_window(trace, loop_users, len(reqs)))
        latency = latency_stats(trace, reqs, None, run.window) if timing else None
        mode = "users"
    if run.answers:
        warnings += _server_warnings(run.answers, pool, run.requests)
    if speed is not None:
        per_req = mean_blocks * pool.bytes_per_block
        top = max(1, min(seqs, int(pool.usable_blocks / max(mean_blocks, 1e-9))))
        table = tuple(speed_rows(speed, per_req, top))
        cross = crossover(speed, per_req)
        bounds = sorted(speed.step_seconds(st.decoding, st.held_blocks * pool.bytes_per_block)
                        for st in trace.steps[run.window[0]:run.window[1]] if st.decoding)
        step_bound = bounds[len(bounds) // 2] if bounds else None
        assumptions.append("decode speed: a memory-bandwidth bound, (weights read + cache blocks held by running "
                           "requests) / bandwidth per step; compute, all-reduce and kernel efficiency left out, so "
                           "tokens/s are upper bounds" + (", routed experts touched by a batch under uniform "
                                                          "routing" if speed.expert_bytes else ""))
    if prefill is not None:
        assumptions.append(f"prefill: at least 2 FLOPs per active linear parameter per prompt token at the GPU's dense "
                           f"{prefill.dtype} rate (attention scores left out), and no faster than its weights read; "
                           "a lower bound on time to first token, queueing left out"
                           + (", cached shared-prefix blocks not recomputed" if workload.shared_prefix and pool.prefix_caching else ""))
    elif speed is not None:
        warnings.append(f"no dense TFLOPS for {gpu.gpu.name} in the catalog: no prefill bound")
    if latency is not None:
        assumptions.append("latencies and throughput: each engine step takes its bound (the longer of its bytes over "
                           "the bandwidth and its tokens' FLOPs over the dense rate), so they are the best the engine "
                           "could do: real ones are longer")
    if (tpot is not None or ttft is not None) and users is None:
        raise InputError("--tpot and --ttft need --users N (the users to serve at those targets)")
    if ttft is not None and prefill is None:
        raise InputError(f"--ttft needs the GPU's dense TFLOPS, which the catalog lacks for {gpu.requested}")
    fleet = None
    if users is not None and not burst:
        fleet = _fleet(users, tpot, run, speed, mean_blocks * pool.bytes_per_block, fit, seqs)
        if ttft is not None:
            longest_prefill = prefill.seconds(_computed_max(workload, pool), speed)
            fleet["ttft_seconds"] = ttft
            fleet["ttft_met"] = longest_prefill <= ttft
            if not fleet["ttft_met"]:
                fleet["users_per_instance"], fleet["instances"], fleet["gpus"] = 0, None, None
                warnings.append(f"the longest prompt's prefill alone takes at least {longest_prefill * 1e3:.1f} ms on "
                                f"one instance, above --ttft {ttft * 1e3:g} ms: no number of instances meets it "
                                "(more tensor parallelism or a faster GPU would)")
    if rate is not None:
        # what one instance sustains: the saturated closed loop's completions per second
        saturating = pool.saturating_users(mean_blocks)
        sat_reqs = _enough(workload, saturating * SATURATION_ROUNDS)
        sat = replay(sat_reqs, users=saturating, step_seconds=timing)
        sat_stats = latency_stats(sat, sat_reqs, None, run_stats(sat, len(sat_reqs),
                                                                   _steady_window(sat, saturating, len(sat_reqs))).window)
        per_instance = sat_stats["requests_per_s"]
        instances = math.ceil(rate / per_instance) if per_instance else None
        gpus_per_instance = s.tp * s.pp
        fleet = {"users": None, "tpot_seconds": tpot, "users_per_instance_memory": None, "users_per_instance_speed": None,
                 "users_per_instance": None, "gpus_per_instance": gpus_per_instance, "instances": instances,
                 "gpus": instances * gpus_per_instance if instances else None, "rate": rate,
                 "requests_per_s_per_instance": per_instance}
    return PlanReport(fit, pool, workload, mode, loop_users, run, mean_blocks, speed, table, step_bound, cross, tpot,
                      fleet, tuple(assumptions + list(fit.assumptions)), tuple(warnings), prefill, latency, rate)


def _server_warnings(a: dict[str, int], pool: ServerPool, n: int) -> list[str]:
    """What llama-server answers besides whole completions."""
    st, out = pool.settings, []
    if a["refused_requests"]:
        out.append(f"{a['refused_requests']:,} of {n:,} requests have prompts of {st.n_ctx_slot:,} tokens or more, a "
                   "slot's context: llama-server refuses them (exceed_context_size_error); raise -c or lower -np")
    if a["cut_requests"]:
        out.append(f"{a['cut_requests']:,} of {n:,} requests reach a slot's context ({st.n_ctx_slot:,} tokens) before "
                   "their output length: llama-server stops them there (truncated)")
    if a["failed_requests"]:
        out.append(f"the unified KV cache ({st.n_ctx:,} cells) ran out {a['kv_exhaustions']:,} times: llama-server "
                   f"then fails every request in flight ({a['failed_requests']:,} of {n:,} requests, \"Context size "
                   "has been exceeded.\"); raise -c, lower -np, or drop --kv-unified")
    return out


def _computed_prompt(prompt: int, workload: Workload, pool) -> int:
    """Prompt tokens a request computes: with prefix caching, the shared prefix's cached part is not recomputed."""
    return max(1, prompt - pool.cached_prefix(workload.shared_prefix))


def _computed_mean(workload: Workload, pool: Pool) -> float:
    return sum(_computed_prompt(r.prompt, workload, pool) for r in workload.requests) / len(workload.requests)


def _computed_max(workload: Workload, pool: Pool) -> int:
    return max(_computed_prompt(r.prompt, workload, pool) for r in workload.requests)


def step_timer(speed: SpeedModel, prefill: PrefillModel | None, bytes_per_block: int):
    """An engine step's duration bound: the weights its tokens touch plus the cache blocks held, over the
    bandwidth, or its tokens' FLOPs over the dense rate, whichever is longer."""
    def seconds(tokens: int, decoding: int, held_blocks: int) -> float:
        memory = (speed.weight_read(max(tokens, 1)) + held_blocks * bytes_per_block) / speed.bandwidth
        compute = 2.0 * tokens * prefill.active_params / prefill.flops if prefill is not None else 0.0
        return max(memory, compute, speed.comm_seconds(tokens))
    return seconds


def poisson_arrivals(n: int, rate: float, seed: int = 0) -> list[float]:
    """n arrival times of a Poisson process at `rate` requests per second (fixed seed: the same plan each run)."""
    import random

    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def latency_stats(trace: Trace, reqs: list[SimRequest], rate: float | None,
                  window: tuple[int, int] | None = None) -> dict[str, Any]:
    """Time to first token and time per output token per request (from the step clock), throughput, and whether
    an arrival process is kept up with (the queue does not grow: the last quarter's TTFT stays near the first's)."""
    clock = trace.clock
    idx = [i for i in trace.finished_at if window is None or window[0] <= trace.finished_at[i] < window[1]]
    ttft = [clock[trace.first_token_at[i]] - trace.arrived_at[i] for i in idx if i in trace.arrived_at]
    outcomes = getattr(trace, "outcomes", None)  # llama-server: a request cut at its slot's context made fewer
    made = {i: outcomes[i].generated if outcomes else reqs[i].output for i in idx}
    tpot = [(clock[trace.finished_at[i]] - clock[trace.first_token_at[i]]) / (made[i] - 1)
            for i in idx if made[i] > 1]
    lo = clock[window[0] - 1] if window and window[0] > 0 else 0.0
    hi = clock[window[1] - 1] if window else (clock[-1] if clock else 0.0)
    span = max(hi - lo, 1e-12)
    out_tokens = sum(made.values())
    stats: dict[str, Any] = {
        "ttft_p50_seconds": _pct(ttft, 0.5), "ttft_p90_seconds": _pct(ttft, 0.9), "ttft_p99_seconds": _pct(ttft, 0.99),
        "tpot_p50_seconds": _pct(tpot, 0.5), "tpot_p90_seconds": _pct(tpot, 0.9),
        "requests_per_s": len(idx) / span, "output_tokens_per_s": out_tokens / span, "seconds": span,
    }
    if rate is not None:
        order = sorted(trace.arrived_at, key=trace.arrived_at.get)
        q = max(1, len(order) // 4)
        first = [clock[trace.first_token_at[i]] - trace.arrived_at[i] for i in order[:q]]
        last = [clock[trace.first_token_at[i]] - trace.arrived_at[i] for i in order[-q:]]
        mean_first, mean_last = sum(first) / len(first), sum(last) / len(last)
        stats["kept_up"] = not (mean_last > 3 * mean_first and mean_last - mean_first > 1.0)
    return stats


def static_comparison(pool: Pool, workload: Workload, mean_blocks: float) -> dict[str, Any] | None:
    """Paged blocks against a static cache (transformers' StaticCache: every slot reserves the longest request):
    the share of reserved tokens a request does not use on average over its decode, and the requests each layout
    holds at once in the same pool. Full/latent attention pools only (a token per slot per block; no windows)."""
    groups = pool.settings.groups
    if not all(g.caches_prefix and g.tokens_per_block and not g.window for g in groups):
        return None
    per_block_tokens = groups[0].tokens_per_block
    mean_tokens = sum(r.prompt + r.output / 2 for r in workload.requests) / len(workload.requests)
    longest = workload.longest
    paged_tokens = mean_blocks / len(groups) * per_block_tokens
    pool_tokens = pool.usable_blocks // len(groups) * per_block_tokens
    return {"mean_tokens": round(mean_tokens, 2), "paged_reserved_tokens": round(paged_tokens, 2),
            "paged_waste": round(1 - mean_tokens / paged_tokens, 4), "static_reserved_tokens": longest,
            "static_waste": round(1 - mean_tokens / longest, 4),
            "static_requests_at_once": pool_tokens // longest,
            "paged_requests_at_once_mean_length": int(pool_tokens // paged_tokens)}


def _mean_blocks(pool: Pool, workload: Workload) -> float:
    """Blocks a request holds on average over its decode: its prompt plus half its output, per request."""
    total = 0
    for r in workload.requests:
        total += pool.request_blocks(r.prompt + r.output // 2)
    return total / len(workload.requests)


def _enough(workload: Workload, n: int) -> list[SimRequest]:
    reqs = list(workload.requests)
    while len(reqs) < n:
        reqs += workload.requests
    return reqs[:max(n, len(workload.requests))]


def _steady_window(trace: Trace, users: int, total: int) -> tuple[int, int]:
    """From the first request's end to the step the last request arrives (the loop is full in between)."""
    if not trace.finished_at:
        return 0, len(trace.steps)
    start = min(trace.finished_at.values())
    ends = sorted(trace.finished_at.values())
    k = total - users - 1
    stop = ends[k] if 0 <= k < len(ends) else len(trace.steps)
    return (start, stop) if stop > start else (0, len(trace.steps))


def _fleet(need: int, tpot: float | None, run: RunStats, speed: SpeedModel | None, per_request_cache: float,
           fit, seqs: int) -> dict[str, Any]:
    """Users one engine instance serves at once (memory: the saturated replay's median running requests; speed:
    the largest batch whose step bound meets the target), and instances and GPUs for `need` users."""
    by_memory = max(0, min(run.p50_running, seqs))
    by_speed = None
    if tpot is not None and speed is not None:
        by_speed = 0
        lo, hi = 1, max(1, seqs)
        if speed.step_seconds(1, per_request_cache) <= tpot:
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if speed.step_seconds(mid, mid * per_request_cache) <= tpot:
                    lo = mid
                else:
                    hi = mid - 1
            by_speed = lo
    per_instance = by_memory if by_speed is None else min(by_memory, by_speed)
    gpus_per_instance = fit.setup.tp * fit.setup.pp
    instances = math.ceil(need / per_instance) if per_instance else None
    return {"users": need, "tpot_seconds": tpot, "users_per_instance_memory": by_memory,
            "users_per_instance_speed": by_speed, "users_per_instance": per_instance,
            "gpus_per_instance": gpus_per_instance, "instances": instances,
            "gpus": instances * gpus_per_instance if instances else None}


def decode_bound(setup, batch: int, context: int, bandwidth: int, *, weight_bytes: int | None = None) -> SpeedRow:
    """The decode-step bound for `batch` requests each holding `context` tokens (no block rounding: the tokens
    attention reads), on one GPU of the limiting stage. weight_bytes: the weights as a source states them (a GGUF
    file) instead of kvplan's count."""
    stage = setup.prepared.limiting_stage(max(1, context))
    speed = speed_model(setup, stage, bandwidth, "", 0)
    if weight_bytes is not None:
        speed = replace(speed, weight_bytes=weight_bytes, expert_bytes=())
    per_token = setup.prepared.plan(max(1, context), 1, stage).kv_bytes_per_token
    cache = batch * per_token * context
    return SpeedRow(batch, speed.weight_read(batch), cache, speed.step_seconds(batch, cache))
