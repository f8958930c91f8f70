"""vLLM (V1 engine): paged KV cache laid out as vLLM's kv_cache_interface / kv_cache_utils do (engines.md §1).

Per layer a spec (full, sliding window, chunked local, MLA, cross, Mamba) with a page = one block of one layer
(specs.py); layers with identical specs form one group; hybrid models share one block pool across groups of
`group_size` layers (groups.py, get_kv_cache_groups). A request needs sum over groups of cdiv(max_memory_usage,
page) blocks; block 0 is the null block (prepared.py). Rules that changed between versions are rows of VERSIONS
(rules.py); facts about particular model classes are tables (models.py); the budget is budget.py.

`prepare` below is the order vLLM itself decides things in: refusals, scheduling defaults, block sizes, state
dtypes, mamba_cache_mode, then the stages' groups.
"""

from __future__ import annotations

from typing import Any

from kvplan.engines import base, layout
from kvplan.engines.base import KVDtypes, Note
from kvplan.engines.versions import Selected
from kvplan.engines.vllm import models, notes, policy
from kvplan.engines.vllm.budget import (budget, calibrated_budget, capacity, fits, format_gib, max_batch,  # noqa: F401
                                        pool_blocks, profile)
from kvplan.engines.vllm.groups import GDN_CHECKPOINT_ALIGNMENT, StageLayout, VGroup, build_stage  # noqa: F401
from kvplan.engines.vllm.models import MAMBA1_CHUNK
from kvplan.engines.vllm.prepared import Prepared
from kvplan.engines.vllm.replay import replay_view  # noqa: F401
from kvplan.engines.vllm.rules import (COVERAGE, ENGINE, KNOBS, KV_DTYPES, VERSIONS, Rules,  # noqa: F401
                                       default_kv_dtype, default_max_num_batched_tokens, default_max_num_seqs_for,
                                       select_version)
from kvplan.engines.vllm.specs import (KIND_RULES, MSA_BLOCK, SPARSE_BLOCK, ChunkedSpec, CrossSpec,  # noqa: F401
                                       FullSpec, MambaSpec, MLASpec, SlidingSpec, VSpec, sparse_mla_record)
from kvplan.spec import (ChunkedLocal, FullAttention, KimiDeltaState, LatentAttention, LightningState,
                         ModelSpec, MsaIndexerKeys, RecurrentState, SlidingLatent, SlidingWindow,
                         SparseLatentAttention, WindowBeyondContext)

gpu_arch = base.gpu_arch


def prepare(spec: ModelSpec, tp: int, pp: int, kvd: KVDtypes, selected: Selected[Rules], opts: dict[str, Any],
            gpu: base.GpuContext | None = None) -> Prepared:
    rules = selected.rules
    models.refuse(spec, selected, tp, pp)
    layout.check_rules(ENGINE.name, KIND_RULES, spec.caches)
    models.refuse_class(spec, selected, tp, pp)
    dcp_note = policy.check_dcp(spec, tp, int(opts.get("decode_context_parallel_size") or 1))
    base.check_tp_heads(spec, tp)
    if rules.float_kv_matches_model:
        policy.check_float_kv_dtype(spec, kvd, selected.asked)
    layout.check_coverage(COVERAGE, spec.caches, selected.version)

    said: list[Note] = [notes.version(selected.note)] if selected.note else []
    sched = policy.scheduling(spec, selected, opts, gpu, pp)
    if sched.default_batched:
        said.append(notes.batched_tokens(sched.max_num_batched_tokens, sched.default_batched))
    kinds = {type(c) for _, c in spec.caches}
    if kinds & {SlidingWindow, ChunkedLocal, WindowBeyondContext}:
        said.append(notes.window_reserve(sched.inflight, sched.inflight_why))
    arch = gpu_arch(gpu.name) if gpu is not None and gpu.name else "hopper"
    opts, block_notes = _block_size(spec, kvd, selected, opts, arch, gpu is not None and bool(gpu.name), sched)
    said += block_notes
    states = policy.state_dtypes(spec, kvd, opts, selected, arch)
    said += _state_notes(spec, selected, states)
    hybrid_state = any(issubclass(k, RecurrentState) for k in kinds) and any(
        issubclass(k, (FullAttention, LatentAttention)) for k in kinds)
    mamba_mode, mode_note = policy.mamba_cache_mode(spec, selected, opts, hybrid_state)
    if mode_note:
        said.append(mode_note)
    gdn_checkpoint = rules.gdn_flashinfer_checkpoint and policy.gdn_prefill_on_flashinfer(spec, arch)
    if SlidingWindow in kinds and rules.cohere2_window_plus_one and spec.architecture in models.WINDOW_PLUS_ONE:
        said.append(Note("vllm.window_plus_one", models.WINDOW_PLUS_ONE[spec.architecture]))
    stages = tuple(build_stage(models.window_plus_one(spec, rules, cs), tp, kvd, rules, opts,
                               (states.conv, states.ssm), arch, mamba_mode, sched.max_num_batched_tokens,
                               states.flashkda, gdn_checkpoint, spec.mamba_chunk_size or MAMBA1_CHUNK)
                   for cs in layout.stages(spec, pp))
    said.append(notes.null_block())
    if dcp_note:
        said.append(dcp_note)
    if sched.v2:
        said.append(notes.v2_runner(selected.asked, opts.get("use_v2_model_runner") is not None))
    return Prepared(selected, stages, kvd, sched.inflight, sched.max_num_batched_tokens, sched.async_on, tuple(said),
                    tp, pp, sched.v2)


def _block_size(spec: ModelSpec, kvd: KVDtypes, selected: Selected[Rules], opts: dict[str, Any], arch: str,
                gpu_known: bool, sched: policy.Scheduling) -> tuple[dict[str, Any], list[Note]]:
    """The block size the attention backends force (MiniMax-M3's 128, DSA's 64, MLA's by GPU) or vLLM's 16, and
    the note saying which; options with MiniMax-M3's block filled in."""
    caches = spec.caches
    kinds = {type(c) for _, c in caches}
    where = arch if gpu_known else "Hopper (size assumes a Hopper GPU)"
    said = []
    if MsaIndexerKeys in kinds:
        opts = models.minimax_m3_block(opts, MSA_BLOCK)
        keys = next(c for _, c in caches if isinstance(c, MsaIndexerKeys))
        said.append(notes.minimax_m3(kvd.label, sum(isinstance(c, MsaIndexerKeys) for _, c in caches), keys.head_dim,
                                     opts["block_size"]))
    if SparseLatentAttention in kinds:
        size, label = sparse_mla_record(next(c for _, c in caches if isinstance(c, SparseLatentAttention)), kvd, arch)
        said.append(notes.sparse_attention(where, size, label, None if opts.get("block_size") else SPARSE_BLOCK))
    elif SlidingLatent in kinds:
        said += notes.deepseek_v4(sched.inflight, sched.inflight_why)
    elif LatentAttention in kinds and not opts.get("block_size"):
        said.append(notes.mla_block(dict(selected.rules.mla_block).get(arch, 16), selected.version, where))
    elif not opts.get("block_size") and MsaIndexerKeys not in kinds:
        said.append(notes.default_block())
    return opts, said


def _state_notes(spec: ModelSpec, selected: Selected[Rules], states: policy.StateDtypes) -> list[Note]:
    """What the recurrent layers' states are stored in (and MiniMax-01's refusals by version)."""
    kinds = {type(c) for _, c in spec.caches}
    kda = next((c for _, c in spec.caches if isinstance(c, KimiDeltaState)), None)
    if kda is not None:
        return [notes.kda_state(states.conv.name, states.ssm.name, kda.full_rank_gate,
                                states.flashkda and kda.full_rank_gate and kda.key_head_dim == 128
                                and kda.gate_lower_bound is not None)]
    if LightningState in kinds:
        models.check_minimax01(selected, states.conv)
        return list(notes.lightning(states.conv.name))
    if any(issubclass(k, RecurrentState) for k in kinds):
        return [notes.mamba_state(states.conv.name, states.ssm.name)]
    return []
