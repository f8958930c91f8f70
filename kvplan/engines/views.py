"""What an engine shows `kvplan plan`'s replay of its scheduler: the pool as the scheduler sees it, in terms that
name no engine class (serving/ builds the replay from these and imports no engine module).

A block pool (vLLM): blocks of the limiting stage and, per KV cache group, how a request's blocks grow. Slots
(llama-server): -np slots over llama.cpp's cells, as `fit` would deploy them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# how the replay treats a group: "full" grows a block per block_size tokens, "sliding" also frees the blocks behind
# its window; the others hold their per-request reservation ("state" one block from admission to the end, as
# MambaManager in mode 'none'; "state-align" its 'align' reservation; "state-all" a block per block_size tokens, kept;
# "chunked" / "cross" their reservation for their length)
GROUP_KINDS = ("full", "sliding", "state", "state-align", "state-all", "chunked", "cross")


@dataclass(frozen=True)
class GroupView:
    """One KV cache group: its kind, block size, and how many blocks a request of n tokens holds where the replay
    does not page it itself (`reserve`; None for paged full attention and a simple sliding window)."""

    kind: str
    block_size: int
    reserve: Callable[[int], int] | None = None
    shards: int = 1  # decode context parallel: a request's tokens spread over this many ranks
    window: int = 0  # a simple sliding window the replay frees behind
    caches_prefix: bool = False  # a reserved group whose blocks prefix caching still shares (one uniform group)

    def __post_init__(self) -> None:
        assert self.kind in GROUP_KINDS, self.kind


@dataclass(frozen=True)
class BlockPoolView:
    """The block pool of the limiting stage, as the engine's scheduler admits requests into it."""

    num_blocks: int  # block 0 (the null block) included
    bytes_per_block: int
    max_num_batched_tokens: int
    inflight: int  # tokens a window reserves beyond itself
    groups: tuple[GroupView, ...]
    windows_share_prefix: bool  # prefix caching is replayed for windows beside these groups
    default_max_num_seqs: int  # the engine's running-request limit on this GPU when no flag gives it


@dataclass(frozen=True)
class SlotView:
    """llama-server's slots over llama.cpp's cells for a workload whose longest request is `longest` tokens."""

    parallel: int  # -np
    ctx_size: int  # -c, all slots together
    chosen: bool  # kvplan picked -np / -c (neither flag given)
    flags: str
    stage: int  # the limiting pipeline stage
    need: tuple[int, ...]  # the cache's bytes per GPU, per stage
    n_ctx: int  # cells llama.cpp allocates (after its padding)
    cells_per_stream: int
    streams: int
    unified: bool
    bytes_per_cell: int  # one cell of every layer whose cache grows with the context
    reuse_prefix: bool  # the slots reuse a cached prefix (no sliding-window / recurrent cache)
    kv_groups: int
