"""A step-by-step replay of vLLM's V1 scheduler over block counts: which requests run at once, when the pool runs
out and a request is preempted, what each step reads.

The rules are vLLM 0.32's (vllm/v1/core/sched/scheduler.py `Scheduler.schedule`, kv_cache_manager.py
`allocate_slots`, block_pool.py), for synchronous scheduling and the FCFS policy:
- running requests first, in order: each asks for the blocks its next tokens need; when the pool cannot give
  them, the LAST running request is preempted (its blocks freed, its computed tokens dropped, put at the front
  of the waiting queue) and the ask is retried; a request that had to preempt itself stops the loop;
- then, only in a step without preemptions, waiting requests in order while the token budget
  (max_num_batched_tokens) lasts and fewer than max_num_seqs run: a request is admitted only if its whole
  current sequence fits in the free blocks (scheduler_reserve_full_isl, on by default) and its first chunk can
  be allocated; a prompt longer than the budget is chunked;
- prefix caching: full blocks are hashed as soon as they are allocated; a new or resumed request reuses the
  longest run of cached blocks, at most (its tokens - 1) worth; a cached block nobody holds is still free and
  is evicted least-recently-freed first (a finished request's tail blocks go first);
- a request samples one token in the step that computes its last known token; it ends after its output length.

Sliding-window groups (single_type_kv_cache_manager.py `SlidingWindowManager`, kv_cache_manager.py
`allocate_slots`):
- before a request asks for blocks, the blocks wholly before computed - window + 1 (`get_num_skipped_tokens`) are
  freed and their table slots become the null block (`remove_skipped_blocks`, newest first, stopping at a slot
  already null); this runs even when the ask then fails;
- new blocks are counted as for full attention, ceil(tokens / block_size) less the table's length (nulls count);
- admission (`scheduler_reserve_full_isl`) asks min(ceil(tokens / block_size), cap) blocks, cap =
  ceil(min(window - 1 + in-flight tokens, max_model_len) / block_size) + 1
  (`SlidingWindowSpec.max_admission_blocks_per_request`), less the skipped blocks of a prefix hit;
- prefix caching (`prefix_cache_retention_interval` 0, the default): a window block is hashed only when it is one
  of the ceil((window - 1) / block_size) blocks ending at the prompt's last block boundary (prompt - 1,
  `replay_boundaries`) or at a shared-prefix junction that full attention hit and the window did not
  (`reachable_block_mask`); a hit is full attention's run from the start cut to the last run of that many
  cached window blocks below it (`HybridKVCacheCoordinator.find_longest_cache_hit`). Checked with groups of one
  block size.

kvplan plans with it; tests/test_schedule_oracle.py replays mixes through vLLM's own scheduler on this machine and
compares every step. Pure Python integers; no engine code is imported.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from kvplan.parallel import cdiv


@dataclass(frozen=True)
class PoolGroup:
    """One KV cache group of the pool: how many blocks a request of n tokens holds in it, and whether its full
    blocks are shared through prefix caching (full and latent attention, sliding windows; state is not)."""

    block_size: int
    blocks_for: Callable[[int], int]
    caches_prefix: bool = True
    tokens_per_block: int = 0  # > 0: blocks_for(n) is ceil(n / tokens_per_block) (the replay's fast path)
    window: int = 0  # > 0: a sliding window of this many tokens (blocks behind it are freed as the request moves)
    inflight: int = 0  # sliding: the in-flight tokens its admission cap reserves (VllmConfig.max_in_flight_tokens)

    def admission_blocks(self, tokens: int, max_model_len: int) -> int:
        """Blocks the admission check asks of a request of `tokens` with nothing cached (a window's is capped)."""
        if not self.window:
            return self.blocks_for(tokens)
        return min(cdiv(tokens, self.block_size), self.admission_cap(max_model_len))

    def admission_cap(self, max_model_len: int) -> int:
        """SlidingWindowSpec.max_admission_blocks_per_request: the window less one plus the tokens in flight, and a
        block more for a window that starts inside a block."""
        return cdiv(min(self.window - 1 + self.inflight, max_model_len), self.block_size) + 1


@dataclass(frozen=True)
class SchedulerSettings:
    num_blocks: int  # the pool, null block included (vLLM's num_gpu_blocks)
    groups: tuple[PoolGroup, ...]
    max_num_seqs: int
    max_num_batched_tokens: int
    max_model_len: int
    prefix_caching: bool = True
    chunked_prefill: bool = True


@dataclass(frozen=True)
class SimRequest:
    prompt: int
    output: int
    shared_prefix: int = 0  # leading prompt tokens identical across the workload (a system prompt)
    arrival_step: int = 0  # the step before which it reaches the waiting queue


@dataclass(frozen=True)
class Step:
    running: int  # requests in the running queue after scheduling
    waiting: int
    free_blocks: int
    scheduled_tokens: int
    decoding: int  # running requests that sample a token this step
    held_blocks: int  # blocks held by running requests (shared prefix blocks once)


@dataclass
class Trace:
    steps: list[Step] = field(default_factory=list)
    clock: list[float] = field(default_factory=list)  # with a step-time model: each step's end, seconds
    arrived_at: dict[int, float] = field(default_factory=dict)  # with arrival times: request index -> seconds
    preemptions: list[tuple[int, int]] = field(default_factory=list)  # (step, request index)
    finished_at: dict[int, int] = field(default_factory=dict)  # request index -> step
    first_token_at: dict[int, int] = field(default_factory=dict)
    truncated: bool = False

    @property
    def peak_running(self) -> int:
        return max((s.running for s in self.steps), default=0)


# ---------------------------------------------------------------------------------------------- the block pool
class _Pool:
    """block_pool.py: a free queue (LRU order), reference counts, and a hash -> block map for full blocks."""

    def __init__(self, num_blocks: int) -> None:
        self.free: OrderedDict[int, None] = OrderedDict((b, None) for b in range(1, num_blocks))  # 0: null block
        self.ref = [0] * num_blocks
        self.ref[0] = 1  # the null block (a window's freed slots) is never free nor evictable
        self.hash_of: list[object | None] = [None] * num_blocks
        self.cached: dict[object, int] = {}  # hash -> the block a lookup finds (the earliest cached still there)
        self.copies: dict[object, list[int]] = {}  # hash -> later blocks with the same hash (BlockHashToBlockMap)

    def insert(self, h: object, b: int) -> None:
        """cache_full_blocks: blocks are not de-duplicated; a lookup finds the first one cached."""
        self.hash_of[b] = h
        if h in self.cached:
            self.copies.setdefault(h, []).append(b)
        else:
            self.cached[h] = b

    def _evict(self, b: int, h: object) -> None:
        """_maybe_evict_cached_block: the block leaves the hash map; a copy cached after it is found instead."""
        self.hash_of[b] = None
        later = self.copies.get(h)
        if self.cached.get(h) == b:
            if later:
                self.cached[h] = later.pop(0)
            else:
                del self.cached[h]
        elif later and b in later:
            later.remove(b)
        if later is not None and not later:
            del self.copies[h]

    def num_free(self) -> int:
        return len(self.free)

    def take(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            h = self.hash_of[b]
            if h is not None:
                self._evict(b, h)
            self.ref[b] = 1
            out.append(b)
        return out

    def touch(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            if b == 0:
                continue
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1

    def release(self, ordered: Sequence[int]) -> None:
        """free_blocks: uncached blocks go to the front (reused first), cached ones to the back (LRU)."""
        first, last = [], []
        for b in ordered:
            if b == 0:
                continue
            self.ref[b] -= 1
            if self.ref[b] == 0:
                (first if self.hash_of[b] is None else last).append(b)
        for b in reversed(first):
            self.free[b] = None
            self.free.move_to_end(b, last=False)
        for b in last:
            self.free[b] = None


@dataclass
class _Req:
    index: int
    spec: SimRequest
    num_tokens: int
    computed: int = 0
    generated: int = 0
    blocks: list[list[int]] = field(default_factory=list)  # per group; 0: the null block (a window's freed slot)
    cached_blocks: list[int] = field(default_factory=list)  # per group: how many of its blocks are hashed
    junction: int = 0  # shared_prefix_boundary: where full attention's hit ran past the windows' at its last lookup

    def key(self, j: int, block_size: int) -> object:
        """The hash of the request's j-th full block: shared while it lies inside the common prefix."""
        if (j + 1) * block_size <= min(self.spec.shared_prefix, self.spec.prompt):
            return ("prefix", j)
        return (self.index, j)


def _skipped_blocks(grp: PoolGroup, computed: int) -> int:
    """get_num_skipped_tokens // block_size: the blocks wholly before the window of the next token (0 without one)."""
    if not grp.window:
        return 0
    return max(0, computed - grp.window + 1) // grp.block_size


def _hit_blocks_needed(grp: PoolGroup) -> int:
    """SlidingWindowManager._contiguous_blocks_for_hit: cached blocks in a row that hold a window (no EAGLE)."""
    return cdiv(grp.window - 1, grp.block_size)


def _window_block_kept(grp: PoolGroup, r: _Req, j: int) -> bool:
    """reachable_block_mask under prefix_cache_retention_interval 0: a window block is hashed only inside the run
    a later hit would end on, at the prompt's last boundary (prompt - 1) or at the request's junction."""
    need = _hit_blocks_needed(grp)
    for boundary in (r.spec.prompt - 1, r.junction):
        end = boundary // grp.block_size
        if boundary and end - need <= j < end:
            return True
    return False


def _admission_need(grp: PoolGroup, tokens: int, hit_tokens: int, hit_blocks: list[int], ref: list[int],
                    capped: bool, max_model_len: int) -> int:
    """get_num_blocks_to_allocate for a request not yet running: the blocks past its hit (skipped ones count as
    held for a window) plus the cached hit blocks that must leave the free queue."""
    skipped = _skipped_blocks(grp, hit_tokens)
    if grp.window:
        want = grp.admission_blocks(tokens, max_model_len) if capped else cdiv(tokens, grp.block_size)
    elif grp.tokens_per_block:
        want = cdiv(tokens, grp.tokens_per_block)
    else:
        want = grp.blocks_for(tokens)
    evictable = sum(1 for b in hit_blocks[skipped:] if ref[b] == 0)
    return max(want - max(skipped, len(hit_blocks)), 0) + evictable


def simulate(settings: SchedulerSettings, requests: Sequence[SimRequest], *, users: int | None = None,
             arrivals: Sequence[float] | None = None,
             step_seconds: Callable[[int, int, int], float] | None = None, max_steps: int = 200_000) -> Trace:
    """Replay requests until all finish; `truncated` when max_steps ran out first.

    users None: each request arrives at its arrival_step (0: all at once, as a benchmark's burst). users N: a
    closed loop, N users each with one request in the system, sending the next (in list order) as soon as the
    last one finishes. arrivals: each request's arrival time in seconds (ascending), with step_seconds(scheduled
    tokens, decoding requests, held blocks) giving each step's duration; an idle engine waits for the next
    arrival. step_seconds alone times the other modes."""
    pool = _Pool(settings.num_blocks)
    groups = settings.groups
    prefix_on = settings.prefix_caching and all(g.caches_prefix for g in groups)
    order = range(len(requests)) if users is not None else sorted(range(len(requests)), key=lambda i: requests[i].arrival_step)
    pending = deque(order)
    waiting: deque[_Req] = deque()
    running: list[_Req] = []
    trace = Trace()
    step = 0
    now = 0.0

    linear = [g.tokens_per_block for g in groups]
    all_linear = all(linear)
    windows = [g for g, grp in enumerate(groups) if grp.window]
    single = len(groups) == 1 and linear[0] > 0 and not windows
    per0 = linear[0]
    bs0 = groups[0].block_size
    mml = settings.max_model_len
    multi = len(groups) > 1
    # one block size: every group's hashed count moves together, so group 0's says when caching has work
    lockstep = len({grp.block_size for grp in groups}) == 1
    full_ids = [g for g, grp in enumerate(groups) if not grp.window]
    # windows of one spec are one attention group: a block counts as cached only where all of them hold it
    window_sets: dict[tuple[int, int], list[int]] = {}
    for g in windows:
        window_sets.setdefault((groups[g].window, groups[g].block_size), []).append(g)

    def hkey(r: _Req, g: int, j: int) -> object:
        k = r.key(j, groups[g].block_size)
        return (g, k) if multi else k

    def needed(r: _Req, tokens: int, group: int) -> int:
        per = linear[group]
        want = -(-tokens // per) if per else groups[group].blocks_for(tokens)
        return max(want - len(r.blocks[group]), 0)

    def cache(r: _Req, tokens: int) -> None:
        if not prefix_on:
            return
        for g, grp in enumerate(groups):
            full = min(tokens // grp.block_size, len(r.blocks[g]))
            if full <= r.cached_blocks[g]:
                continue
            for j in range(r.cached_blocks[g], full):
                b = r.blocks[g][j]
                if b == 0 or (grp.window and not _window_block_kept(grp, r, j)):
                    continue
                if pool.hash_of[b] is None:
                    pool.insert(hkey(r, g, j), b)
            r.cached_blocks[g] = max(r.cached_blocks[g], full)

    def free(r: _Req) -> None:
        for g in range(len(groups)):
            pool.release(list(reversed(r.blocks[g])))
        r.blocks = [[] for _ in groups]
        r.cached_blocks = [0] * len(groups)

    win_info = [(g, groups[g].window - 1, groups[g].block_size) for g in windows]

    def remove_skipped(r: _Req) -> None:
        """remove_skipped_blocks: free a window's blocks behind the next token's window, newest first (the rule of
        _skipped_blocks, inlined: this runs for every running request at every step)."""
        c = r.computed
        for g, w1, bs in win_info:
            last = (c - w1) // bs - 1
            if last < 0:
                continue
            blocks = r.blocks[g]
            if last >= len(blocks):
                last = len(blocks) - 1
            if blocks[last] == 0:  # nothing new behind the window
                continue
            freed = []
            for j in range(last, -1, -1):
                if blocks[j] == 0:
                    break
                freed.append(blocks[j])
                blocks[j] = 0
            pool.release(freed)

    def full_run(r: _Req, g: int, limit: int) -> int:
        n = 0
        while n < limit and hkey(r, g, n) in pool.cached:
            n += 1
        return n

    def window_hit(r: _Req, ids: list[int], max_tokens: int) -> tuple[int, list[list[int]]]:
        """SlidingWindowManager.find_longest_cache_hit: the last run of enough cached blocks below max_tokens,
        nulls before it; without one, the run from the start."""
        grp = groups[ids[0]]
        need = _hit_blocks_needed(grp)
        nb = max_tokens // grp.block_size
        run = 0
        for i in range(nb - 1, -1, -1):
            if all(hkey(r, g, i) in pool.cached for g in ids):
                run += 1
                if run >= need:
                    return (i + run) * grp.block_size, [[0] * i + [pool.cached[hkey(r, g, k)] for k in range(i, i + run)]
                                                        for g in ids]
            else:
                run = 0
        return run * grp.block_size, [[pool.cached[hkey(r, g, k)] for k in range(run)] for g in ids]

    def hit(r: _Req) -> tuple[int, list[list[int]]]:
        """find_longest_cache_hit: whole cached blocks, at most num_tokens - 1 tokens; with windows, the hybrid
        coordinator's fixed point (full attention's run from the start, each window's last run below it)."""
        if not prefix_on:
            return 0, [[] for _ in groups]
        limit = r.num_tokens - 1
        if not windows:
            per_group, tokens = [], None
            for g, grp in enumerate(groups):
                found = []
                for j in range(limit // grp.block_size):
                    b = pool.cached.get(hkey(r, g, j))
                    if b is None:
                        break
                    found.append(b)
                per_group.append(found)
                t = len(found) * grp.block_size
                tokens = t if tokens is None else min(tokens, t)
            tokens = tokens or 0
            return tokens, [f[: tokens // grp.block_size] for f, grp in zip(per_group, groups)]
        full_tokens = min((full_run(r, g, limit // groups[g].block_size) * groups[g].block_size for g in full_ids),
                          default=limit)
        hit_tokens, longest = limit, 0
        found: dict[int, list[int]] = {}
        while True:
            curr = min(hit_tokens, full_tokens) if full_ids else hit_tokens
            longest = max(longest, curr) if full_ids else longest
            for ids in window_sets.values():
                curr, blocks = window_hit(r, ids, curr)
                found.update(zip(ids, blocks))
                longest = max(longest, curr)
            if curr >= hit_tokens:
                break
            hit_tokens = curr
            if len(full_ids) and len(window_sets) == 1:  # is_simple_hybrid: one pass
                break
        r.junction = longest if longest > hit_tokens else 0
        out = []
        for g, grp in enumerate(groups):
            if grp.window:
                out.append(found[g])
            else:
                n = hit_tokens // grp.block_size
                out.append([pool.cached[hkey(r, g, j)] for j in range(n)])
        return hit_tokens, out

    while (pending or waiting or running) and step < max_steps:
        if arrivals is not None and pending and not waiting and not running:
            now = max(now, arrivals[pending[0]])  # idle: the next request arrives
        while pending and (len(waiting) + len(running) < users if users is not None
                           else arrivals[pending[0]] <= now if arrivals is not None
                           else requests[pending[0]].arrival_step <= step):
            i = pending.popleft()
            if arrivals is not None:
                trace.arrived_at[i] = arrivals[i]
            elif step_seconds is not None:
                trace.arrived_at[i] = now
            waiting.append(_Req(i, requests[i], requests[i].prompt, blocks=[[] for _ in groups],
                                cached_blocks=[0] * len(groups)))
        budget = settings.max_num_batched_tokens
        scheduled: list[tuple[_Req, int]] = []
        preempted = False
        i = 0
        free_q = pool.free
        while i < len(running) and budget > 0:
            r = running[i]
            n = r.num_tokens - r.computed
            if n > budget:
                n = budget
            if n > mml - r.computed - 1:
                n = mml - r.computed - 1
            if n <= 0:
                i += 1
                continue
            end = r.computed + n
            if single:  # one full-attention group (the common case): the same rule, inlined
                need = -(-end // per0) - len(r.blocks[0])
                wants = [need if need > 0 else 0]
            else:
                if windows:
                    remove_skipped(r)
                if all_linear:
                    wants = [w if (w := -(-end // per) - len(bl)) > 0 else 0 for per, bl in zip(linear, r.blocks)]
                else:
                    wants = [needed(r, end, g) for g in range(len(groups))]
            ok = False
            while True:
                if sum(wants) <= len(free_q):
                    ok = True
                    break
                victim = running.pop()
                free(victim)
                free_q = pool.free
                victim.computed = 0
                waiting.appendleft(victim)
                trace.preemptions.append((step, victim.index))
                preempted = True
                if victim is r:
                    break
                if not single:
                    wants = [needed(r, end, g) for g in range(len(groups))]
            if not ok:
                break
            for g, w in enumerate(wants):
                if w:
                    r.blocks[g] += pool.take(w)
            if prefix_on and (not lockstep or end // bs0 > r.cached_blocks[0]):
                cache(r, end if end < r.num_tokens else r.num_tokens)
            scheduled.append((r, n))
            budget -= n
            i += 1
        if not preempted:
            while budget > 0 and waiting and len(running) < settings.max_num_seqs:
                r = waiting[0]
                hit_tokens, hit_blocks = hit(r)
                n = r.num_tokens - hit_tokens
                if not settings.chunked_prefill and n > budget:
                    break
                n = min(n, budget)
                full = min(r.num_tokens, mml)
                free_now = pool.num_free()
                if sum(_admission_need(grp, full, hit_tokens, hb, pool.ref, True, mml)
                       for grp, hb in zip(groups, hit_blocks)) > free_now:
                    break
                if sum(_admission_need(grp, min(hit_tokens + n, mml), hit_tokens, hb, pool.ref, False, mml)
                       for grp, hb in zip(groups, hit_blocks)) > free_now:
                    break
                waiting.popleft()
                for g, (grp, hb) in enumerate(zip(groups, hit_blocks)):
                    skipped = _skipped_blocks(grp, hit_tokens)
                    pool.touch(hb[skipped:])
                    r.blocks[g] = [0] * skipped + list(hb[skipped:])
                    r.cached_blocks[g] = len(hb)
                r.computed = hit_tokens
                for g in range(len(groups)):
                    r.blocks[g] += pool.take(needed(r, r.computed + n, g))
                cache(r, min(r.computed + n, r.num_tokens))
                running.append(r)
                scheduled.append((r, n))
                budget -= n
        held = settings.num_blocks - 1 - pool.num_free()  # blocks nobody references are in the free queue
        decoding = sum(1 for r, n in scheduled if r.computed + n >= r.num_tokens)
        tokens = sum(n for _, n in scheduled)
        trace.steps.append(Step(len(running), len(waiting) + (len(pending) if arrivals is None else 0), pool.num_free(),
                                tokens, decoding, held))
        if step_seconds is not None:
            now += step_seconds(tokens, decoding, held)
            trace.clock.append(now)
        # the forward pass: computed tokens advance; a request whose known tokens are all computed samples one
        done = []
        for r, n in scheduled:
            r.computed += n
            if r.computed >= r.num_tokens:
                r.num_tokens += 1
                r.generated += 1
                trace.first_token_at.setdefault(r.index, step)
                if prefix_on and (not lockstep or r.computed // bs0 > r.cached_blocks[0]):
                    cache(r, r.computed)
                if r.generated >= r.spec.output or r.num_tokens >= mml:  # check_stop: max_tokens or max_model_len
                    done.append(r)
        for r in done:
            running.remove(r)
            free(r)
            trace.finished_at[r.index] = step
        step += 1
    trace.truncated = bool(pending or waiting or running)
    return trace


def paged_group(block_size: int, shards: int = 1, caches_prefix: bool = True) -> PoolGroup:
    """A full-attention group: a request of n tokens holds ceil(n / (block_size x shards)) blocks (shards: decode
    context parallel ranks)."""
    per = block_size * shards
    return PoolGroup(block_size, lambda n: cdiv(n, per), caches_prefix, per)


def sliding_group(block_size: int, window: int, inflight: int, caches_prefix: bool = True) -> PoolGroup:
    """A sliding-window group: a request of n tokens holds ceil(n / block_size) blocks less those wholly behind
    the window of its next token (blocks_for: held while it decodes, n - 1 computed)."""
    return PoolGroup(block_size, lambda n: cdiv(n, block_size) - max(0, n - window) // block_size, caches_prefix,
                     block_size, window, inflight)
