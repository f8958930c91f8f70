"""vLLM's KV budget (Worker.determine_available_memory), and what the pool of blocks it buys holds: the capacity the
engine prints, the start-up check, and the largest batch (get_kv_cache_configs, _check_enough_kv_cache_memory)."""

from __future__ import annotations

import math
from typing import Any

from kvplan.engines import base, overhead
from kvplan.engines.base import BudgetPart as Part
from kvplan.engines.versions import version_key
from kvplan.engines.vllm.prepared import Prepared
from kvplan.engines.vllm.rules import V1_SINCE, Rules, default_max_num_seqs_for
from kvplan.errors import InputError
from kvplan.spec import ModelSpec


def format_gib(value_bytes: int, rules: Rules) -> str:
    x = value_bytes / (1 << 30)
    return str(round(x, 2)) if rules.gib_round else f"{x:.2f}"


def budget(prepared: Prepared, spec: ModelSpec, gpu: base.GpuContext, stage: int, weights: int,
           opts: dict[str, Any], reserve: int | None, dtype_bytes: int) -> base.Budget:
    """Worker.determine_available_memory: requested = total x gpu_memory_utilization (ceil since ~0.15), minus
    weights, the rotary tables built with the model (counted in vLLM's "Model loading took"), the profile run's
    activation peak, non-torch memory and (>= 0.20, V1 runner or >= 0.29) CUDA-graph memory."""
    rules = prepared.selected.rules
    if reserve is None:
        _refuse_v0(prepared)
    requested, util_note = _requested(prepared, gpu, opts)
    parts = [Part("requested", "requested (total x gpu_memory_utilization)", requested),
             Part("weights", "weights", -weights)]
    notes = [util_note]
    mml = int(opts.get("max_model_len") or spec.vllm_max_ctx or 0) or None
    rope = sum(t.nbytes(dtype_bytes, mml) for t in spec.rope_tables)
    if rope and reserve is None:
        parts.append(Part("rotary", "rotary cos/sin tables (built with the model)", -rope))
    if reserve is not None:
        parts.append(Part("reserve", "reserve (--reserve)", -reserve))
    else:
        batched, seqs = profile(prepared, gpu, opts)
        act = overhead.vllm_activation(spec, batched, seqs, prepared.tp, dtype_bytes, rules.moe_workspace_held)
        parts.append(Part("activation", "activation peak (estimate)", -act))
        nvls = gpu.nccl_nvls or gpu.name is None  # a plain size: the larger charge
        non_torch = overhead.vllm_non_torch(prepared.tp, prepared.pp, rules.tp_non_torch_measured, nvls)
        parts.append(Part("non_torch", "non-torch memory (estimate)", -non_torch))
        if rules.cudagraph_charged and not (prepared.v2_runner and not rules.v2_profiles_cudagraphs):
            parts.append(Part("cuda_graphs", "CUDA graphs (estimate)", -overhead.VLLM_CUDAGRAPH_BYTES))
        elif rules.cudagraph_charged:
            notes.append("CUDA graphs not charged: the V2 model runner's profile_cudagraph_memory returns 0 before "
                         "vLLM 0.29 (v1/worker/gpu/model_runner.py)")
        notes.append("non-KV memory estimated (engines/overhead.py); --reserve BYTES replaces the estimate")
    return base.summed(parts, tuple(notes))


def calibrated_budget(prepared: Prepared, spec: ModelSpec, gpu: base.GpuContext, stage: int, opts: dict[str, Any],
                      dtype_bytes: int, cal) -> base.Budget:
    """The budget with the non-KV memory vLLM measured (calibration.py) in place of the estimate. vLLM's non-KV
    memory does not depend on gpu_memory_utilization or max_model_len; only the profile's activation peak moves
    with max_num_batched_tokens / max_num_seqs, by kvplan's estimate of the difference."""
    _refuse_v0(prepared)
    requested, util_note = _requested(prepared, gpu, opts)
    parts = [Part("requested", "requested (total x gpu_memory_utilization)", requested),
             Part("non_kv", f"non-KV memory (calibrated: {cal.log})", -cal.non_kv_bytes[stage])]
    notes = [util_note, f"non-KV memory measured by {cal.describe()} (kvplan explain --save-calibration); "
             f"± {cal.half_width_bytes:,} B as printed"]
    batched, seqs = profile(prepared, gpu, opts)
    held = prepared.selected.rules.moe_workspace_held
    now = overhead.vllm_activation(spec, batched, seqs, prepared.tp, dtype_bytes, held)
    then = overhead.vllm_activation(spec, cal.max_num_batched_tokens, cal.max_num_seqs, prepared.tp, dtype_bytes, held)
    if now != then:
        parts.append(Part("activation_change", "activation peak change since calibration (estimate)", then - now))
        notes.append(f"profile differs from the calibration's (max_num_batched_tokens {batched} "
                     f"vs {cal.max_num_batched_tokens}, max_num_seqs {seqs} vs {cal.max_num_seqs}): the activation "
                     "peak moves by kvplan's estimate")
    return base.summed(parts, tuple(notes))


def _refuse_v0(prepared: Prepared) -> None:
    requested = prepared.selected.requested
    if requested and version_key(requested) < V1_SINCE:
        raise InputError(f"vllm@{requested} is the V0 engine, which profiles a forward of max_model_len tokens; kvplan "
                         "does not model that budget (it would overstate the cache). Give --kv-budget (the KV memory "
                         "its log reports: '# GPU blocks: N' x bytes per block) or --reserve, or plan with vllm@0.8+")


def _requested(prepared: Prepared, gpu: base.GpuContext, opts: dict[str, Any]) -> tuple[int, str]:
    """total x gpu_memory_utilization (ceil since ~0.15), and the note saying where the fraction came from."""
    rules = prepared.selected.rules
    util = float(opts.get("gpu_memory_utilization") or rules.gpu_memory_utilization)
    requested = math.ceil(gpu.cuda_total * util) if rules.gib_round else int(gpu.cuda_total * util)
    note = f"gpu_memory_utilization {util}" + ("" if opts.get("gpu_memory_utilization") else
                                               f" (vLLM {prepared.selected.version} default)")
    return requested, note


def profile(prepared: Prepared, gpu: base.GpuContext, opts: dict[str, Any]) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs): the shape of the profile run whose peak vLLM measures."""
    return prepared.max_num_batched_tokens, int(opts.get("max_num_seqs") or default_max_num_seqs_for(gpu))


def pool_blocks(prepared: Prepared, budgets: list[int]) -> int:
    """The blocks in the pool (block 0, the null block, included): across workers vLLM takes the minimum block
    count (get_kv_cache_configs). Public for the scheduler replay (replay.py)."""
    counts = []
    for s, st in enumerate(prepared.stages):
        if st.bytes_per_block <= 0:
            continue
        counts.append(max(0, budgets[s]) // st.bytes_per_block)
    return min(counts) if counts else 0


def fits(prepared: Prepared, ctx: int, batch: int, budgets: list[int]) -> bool:
    usable = pool_blocks(prepared, budgets) - 1  # block 0 is the null block
    return all(batch * prepared.blocks_per_request(ctx, s) <= usable for s in range(len(prepared.stages)))


def max_batch(prepared: Prepared, ctx: int, budgets: list[int]) -> int:
    usable = pool_blocks(prepared, budgets) - 1
    per = max(prepared.blocks_per_request(ctx, s) for s in range(len(prepared.stages)))
    return max(0, usable // per) if per else 0


def capacity(prepared: Prepared, spec: ModelSpec, ctx: int, budgets: list[int], opts: dict[str, Any],
             gpu: base.GpuContext, max_model_len: int | None) -> base.Capacity:
    rules = prepared.selected.rules
    num_blocks = pool_blocks(prepared, budgets)
    # the engine prints its capacity for its max_model_len (vllm serve: the model maximum unless --max-model-len)
    mml = int(opts.get("max_model_len") or max_model_len or ctx)
    stage = prepared.limiting_stage(mml)
    st = prepared.stages[stage]
    bpr = prepared.blocks_per_request(mml, stage)
    per_request = prepared.concurrency_blocks(mml, stage)
    concurrency = num_blocks / per_request if per_request else None  # printed with the null block included
    if rules.tokens_from_concurrency:
        tokens = int(concurrency * mml) if concurrency is not None else 0
    else:  # (num_blocks // kv groups) x block size (_report_kv_cache_config, <= 0.19), the block's tokens over all
        # DCP ranks (its block size x decode_context_parallel_size)
        shards = max((g.spec.shards for g in st.groups), default=1)
        tokens = (num_blocks // max(1, len(st.groups))) * st.block_size * shards
    cap = int(opts.get("max_num_seqs") or default_max_num_seqs_for(gpu))
    # start-up check (_check_enough_kv_cache_memory) at the same max_model_len
    avail = min(budgets)
    needed = prepared.check_bytes(mml)
    if rules.null_block_before_fit:
        avail -= st.bytes_per_block
    start, message, suggested = True, None, None
    if min(budgets) <= 0:
        start, message = False, "No available memory for the cache blocks (vLLM refuses to start)"
    elif needed > avail:
        suggested = base.largest(1, mml, lambda m: prepared.check_bytes(m) <= avail)
        start = False
        message = (f"vLLM refuses to start with max_model_len {mml:,}: one request needs {needed / (1 << 30):.2f} GiB of KV "
                   f"cache, {avail / (1 << 30):.2f} GiB available; estimated maximum model length {suggested:,}")
    details = {"num_gpu_blocks": num_blocks, "usable_blocks": max(0, num_blocks - 1), "blocks_per_request": bpr,
               "block_size": st.block_size, "bytes_per_block": st.bytes_per_block, "max_model_len": mml,
               "available_kv_printed": f"{format_gib(min(budgets), rules)} GiB"}
    if per_request != bpr:  # vLLM 0.22/0.23 DeepSeek-V4: the concurrency's own blocks per request
        details["concurrency_blocks_per_request"] = per_request
    return base.Capacity(max_batch(prepared, ctx, budgets), tokens, round(concurrency, 2) if concurrency is not None else None,
                         cap, start, message, suggested, details)
