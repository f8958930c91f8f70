"""From an engine's view of its pool (engines/views.py) to the replay `kvplan plan` runs: a block pool through vLLM's
scheduler (schedule_sim.py) or llama-server's slots over llama.cpp's cells (slot_sim.py). Which an engine gets is
its listing's `replay`; the engine itself is reached only through its module's view function, never by name."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import partial
from typing import Any, Callable

from kvplan.engines.views import BlockPoolView, GroupView
from kvplan.errors import InputError
from kvplan.gpus import GpuSelection
from kvplan.schedule_sim import PoolGroup, SchedulerSettings, paged_group, simulate, sliding_group
from kvplan.serving.pools import CACHE_RAM_BYTES, Pool, ServerPool, replay_notes
from kvplan.sizing import EngineOptions, ModelOptions
from kvplan.workload import Workload


@dataclass(frozen=True)
class Setup:
    """What the replay needs: the fit it comes from, the pool, the replay itself, the running-request cap, and what
    it rests on."""

    fit: Any
    pool: Pool | ServerPool
    replay: Callable
    seqs: int
    assumptions: list[str]
    warnings: list[str]


def _replay_group(g: GroupView, inflight: int, windows_cache: bool) -> PoolGroup:
    """One KV cache group for schedule_sim: paged (full/latent attention), a window freed behind it, or held at
    its per-request reservation."""
    if g.kind == "full" and g.reserve is None:
        return paged_group(g.block_size, g.shards, g.shards == 1)
    if g.kind == "sliding" and g.reserve is None:
        return sliding_group(g.block_size, g.window, inflight, windows_cache)
    return PoolGroup(g.block_size, g.reserve, g.caches_prefix)


def block_pool(view: BlockPoolView, budgets: list[int], budget_source: str) -> Pool:
    share = view.windows_share_prefix
    groups = tuple(_replay_group(g, view.inflight, share) for g in view.groups)
    return Pool(SchedulerSettings(view.num_blocks, groups, 0, view.max_num_batched_tokens, 0), view.bytes_per_block,
                min(budgets), budget_source, tuple(g.kind for g in view.groups))


def _no_kv_memory(fit, s, gpu: GpuSelection) -> str | None:
    if fit.weights_fit:
        return None
    return (f"{s.ref.requested}: the weights ({fit.weight_bytes:,} B per GPU) leave no KV memory on "
            f"{gpu.requested}; nothing to plan (kvplan fit shows the budget)")


def scheduler_setup(module, mo: ModelOptions, eo: EngineOptions, gpu: GpuSelection, workload: Workload, kv_budget, reserve,
                    tp, pp, calibrations) -> Setup:
    """A block pool and its scheduler settings for the workload (vLLM)."""
    from kvplan import planner

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
    refusal = _no_kv_memory(fit, s, gpu)
    if refusal:
        raise InputError(refusal)
    budgets = [b.kv_bytes for b in fit.budgets]
    view = module.replay_view(s.prepared, fit.ctx, budgets, planner.gpu_context(gpu))
    base_pool = block_pool(view, budgets, fit.kv_budget_source)
    seqs = int(opts.get("max_num_seqs") or view.default_max_num_seqs)
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
    return Setup(fit, pool, partial(simulate, settings), seqs, assumptions, warnings)


def slots_setup(module, mo: ModelOptions, eo: EngineOptions, gpu: GpuSelection, workload: Workload, kv_budget, reserve,
                tp, pp, calibrations) -> Setup:
    """llama-server's cells and slots for the workload (llama.cpp): -np / -c as given, else as `fit` suggests
    them (the engine's slot_view)."""
    from kvplan import planner, slot_sim

    opts = {k: v for k, v in eo.knobs.items() if v is not None}
    parallel = module.check_parallel(opts.pop("parallel", None))
    ctx_size = opts.pop("ctx_size", None)
    longest = workload.longest
    fit = planner.fit_model(mo, replace(eo, knobs=opts), gpu, longest, 1, kv_budget=kv_budget, reserve=reserve, tp=tp,
                            pp=pp, calibrations=calibrations)
    s = fit.setup
    budgets = [b.kv_bytes for b in fit.budgets]
    v = module.slot_view(s.prepared, longest, budgets, parallel, ctx_size, _no_kv_memory(fit, s, gpu))
    n_ctx_slot = min(v.cells_per_stream, s.max_ctx) if s.max_ctx else v.cells_per_stream
    settings = slot_sim.ServerSettings(
        n_slots=v.parallel, n_ctx=v.n_ctx, n_ctx_slot=n_ctx_slot, unified=v.unified,
        n_batch=min(v.ctx_size, slot_sim.N_BATCH), cache_ram_tokens=max(v.n_ctx, CACHE_RAM_BYTES // v.bytes_per_cell),
        reuse_prefix=v.reuse_prefix)
    need = v.need[v.stage]
    pool = ServerPool(settings, v.bytes_per_cell, min(budgets), fit.kv_budget_source, need, v.streams, v.kv_groups,
                      v.flags)
    layout = (f"one unified stream of {v.n_ctx:,} cells shared by the slots" if v.unified
              else f"{v.streams} streams of {v.cells_per_stream:,} cells, one per slot")
    assumptions = [
        f"llama-server {v.flags}: {layout}, {v.bytes_per_cell:,} B per cell ({fit.kv_budget_source} KV budget "
        f"{min(budgets):,} B per GPU, the cache takes {need:,} B); a slot's context {n_ctx_slot:,} tokens"
        + (f" (capped at the training context {s.max_ctx:,})" if s.max_ctx and s.max_ctx < v.cells_per_stream else "")
        + f", n_batch {settings.n_batch:,}",
        "requests replayed through llama-server b11434's slots (kvplan/slot_sim.py): a request holds one slot from "
        "start to end, the rest wait deferred in arrival order; one llama_decode per iteration of each generating "
        "slot's token plus prompt tokens up to n_batch; a prompt of the slot's context or more is refused, a request "
        "stops when its tokens reach it (no context shift, the default); prompt cache reuse of the common prefix a "
        "slot holds (--cache-ram, --cache-idle-slots defaults); checked iteration by iteration against llama-server "
        "b11434 on CPU",
    ]
    if v.chosen:
        assumptions.append(f"-np and -c chosen by kvplan as `fit` suggests them: slots of the longest request "
                           f"({longest:,} tokens) while their cache fits (llama-server's own default is -np 4 "
                           "--kv-unified with -c from the model; give --parallel / --ctx-size to plan yours)")
    if v.unified:
        assumptions.append("--kv-unified: every slot's tokens, idle slots' cached prompts included, share the cells; "
                           "idle slots are cleared when a task starts; when a one-token batch finds no cell, "
                           "llama-server fails every request in flight (\"Context size has been exceeded.\")")
    if not settings.reuse_prefix:
        assumptions.append("sliding-window / recurrent caches: llama-server reuses a cached prefix only through "
                           "context checkpoints, which the replay leaves out (prompts are recomputed: prefill work "
                           "an upper bound; requests at once unchanged)")
    if s.pp > 1:
        assumptions.append(f"layers split over {s.pp} GPUs (-sm layer): one llama_decode runs them in turn")
    return Setup(fit, pool, partial(slot_sim.simulate, settings), v.parallel, assumptions, list(fit.warnings))


# Listing.replay_pool -> how its pool is replayed; each takes the engine's module (its view functions) first
SETUPS = {"blocks": scheduler_setup, "slots": slots_setup}
