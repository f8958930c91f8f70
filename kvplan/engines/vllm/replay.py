"""vLLM's block pool as its scheduler sees it (views.BlockPoolView): what `kvplan plan` replays, built from the
classes of this package so that the replay itself names none of them."""

from __future__ import annotations

from typing import Any

from kvplan.engines import base
from kvplan.engines.views import BlockPoolView, GroupView
from kvplan.engines.vllm.budget import pool_blocks
from kvplan.engines.vllm.groups import StageLayout
from kvplan.engines.vllm.prepared import Prepared
from kvplan.engines.vllm.rules import default_max_num_seqs_for
from kvplan.engines.vllm.specs import ChunkedSpec, FullSpec, MambaSpec, MLASpec, SlidingSpec, VSpec
from kvplan.errors import InputError


def replay_view(prepared: Prepared, ctx: int, budgets: list[int], gpu: base.GpuContext) -> BlockPoolView:
    """The limiting stage's pool for requests up to ctx tokens, with the budgets' block count."""
    stage = prepared.stages[prepared.limiting_stage(ctx)]
    inflight = prepared.inflight
    if stage.packed:
        raise InputError("plan's replay of vLLM's scheduler does not model DeepSeek-V4's packed window and "
                         "compressor-state groups yet (vLLM frees their blocks as the window moves); `kvplan fit` "
                         "gives its capacity")
    if stage.uniform_type:
        groups: tuple[GroupView, ...] = (GroupView("full", stage.block_size,
                                                   lambda n: stage.blocks_per_request(n, inflight), caches_prefix=True),)
    else:
        groups = tuple(_group(g.spec, inflight) for g in stage.groups)
    return BlockPoolView(pool_blocks(prepared, budgets), stage.bytes_per_block, prepared.max_num_batched_tokens,
                         inflight, groups, _windows_share_prefix(stage), default_max_num_seqs_for(gpu))


def _windows_share_prefix(stage: StageLayout) -> bool:
    """Prefix caching is replayed for sliding windows only beside full/latent attention of one block size (the
    hybrid hit rule checked against vLLM); other mixes keep it off for the whole pool."""
    specs = [g.spec for g in stage.groups]
    return (all(type(sp) in (FullSpec, MLASpec, SlidingSpec) and sp.shards == 1 for sp in specs)
            and len({sp.block_size for sp in specs}) == 1)


def _group(spec: VSpec, inflight: int) -> GroupView:
    """One KV cache group: full/latent attention paged, a plain sliding window paged and freed behind it, anything
    else (state, chunked local, cross attention, a compressed window) held at its per-request reservation
    (MambaManager in mode 'none': one block from admission to the end; in mode 'all' a block per block_size tokens,
    kept)."""
    if type(spec) in (FullSpec, MLASpec):
        return GroupView("full", spec.block_size, shards=spec.shards)
    if type(spec) is SlidingSpec and spec.per_state == 1 and not spec.align:
        return GroupView("sliding", spec.block_size, window=spec.window)
    reserve: Any = lambda n, sp=spec: sp.blocks(n, inflight)  # noqa: E731
    if type(spec) is SlidingSpec:
        kind = "sliding"
    elif type(spec) is MambaSpec:
        kind = "state-all" if spec.per_block else "state-align" if spec.state_blocks > 1 else "state"
    else:
        kind = "chunked" if type(spec) is ChunkedSpec else "cross"
    return GroupView(kind, spec.block_size, reserve)
