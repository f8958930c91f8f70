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
    blocks are shared through prefix caching (full and latent attention; windows and state are not)."""

    block_size: int
    blocks_for: Callable[[int], int]
    caches_prefix: bool = True
    tokens_per_block: int = 0  # > 0: blocks_for(n) is ceil(n / tokens_per_block) (the replay's fast path)


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
        self.hash_of: list[object | None] = [None] * num_blocks
        self.cached: dict[object, int] = {}

    def num_free(self) -> int:
        return len(self.free)

    def take(self, n: int) -> list[int]:
        out = []
        for _ in range(n):
            b, _ = self.free.popitem(last=False)
            h = self.hash_of[b]
            if h is not None:  # evict
                if self.cached.get(h) == b:
                    del self.cached[h]
                self.hash_of[b] = None
            self.ref[b] = 1
            out.append(b)
        return out

    def touch(self, blocks: Sequence[int]) -> None:
        for b in blocks:
            if self.ref[b] == 0:
                del self.free[b]
            self.ref[b] += 1

    def release(self, ordered: Sequence[int]) -> None:
        """free_blocks: uncached blocks go to the front (reused first), cached ones to the back (LRU)."""
        first, last = [], []
        for b in ordered:
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
    blocks: list[list[int]] = field(default_factory=list)  # per group
    cached_blocks: list[int] = field(default_factory=list)  # per group: how many of its blocks are hashed

    def key(self, j: int, block_size: int) -> object:
        """The hash of the request's j-th full block: shared while it lies inside the common prefix."""
        if (j + 1) * block_size <= min(self.spec.shared_prefix, self.spec.prompt):
            return ("prefix", j)
        return (self.index, j)


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
    single = len(groups) == 1 and linear[0] > 0
    per0 = linear[0]
    bs0 = groups[0].block_size

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
                if pool.hash_of[b] is None:
                    h = r.key(j, grp.block_size)
                    pool.hash_of[b] = h
                    pool.cached.setdefault(h, b)
            r.cached_blocks[g] = max(r.cached_blocks[g], full)

    def free(r: _Req) -> None:
        for g in range(len(groups)):
            pool.release(list(reversed(r.blocks[g])))
        r.blocks = [[] for _ in groups]
        r.cached_blocks = [0] * len(groups)

    def hit(r: _Req) -> tuple[int, list[list[int]]]:
        """find_longest_cache_hit: whole cached blocks from the start, at most num_tokens - 1 tokens."""
        if not prefix_on:
            return 0, [[] for _ in groups]
        per_group, tokens = [], None
        for grp in groups:
            found = []
            for j in range((r.num_tokens - 1) // grp.block_size):
                b = pool.cached.get(r.key(j, grp.block_size))
                if b is None:
                    break
                found.append(b)
            per_group.append(found)
            t = len(found) * grp.block_size
            tokens = t if tokens is None else min(tokens, t)
        tokens = tokens or 0
        return tokens, [f[: tokens // grp.block_size] for f, grp in zip(per_group, groups)]

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
            if n > settings.max_model_len - r.computed - 1:
                n = settings.max_model_len - r.computed - 1
            if n <= 0:
                i += 1
                continue
            end = r.computed + n
            if single:  # one full-attention group (the common case): the same rule, inlined
                need = -(-end // per0) - len(r.blocks[0])
                wants = [need if need > 0 else 0]
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
            if prefix_on and (not single or end // bs0 > r.cached_blocks[0]):
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
                evictable = sum(1 for bl in hit_blocks for b in bl if pool.ref[b] == 0)
                full = min(r.num_tokens, settings.max_model_len)
                if sum(max(grp.blocks_for(full) - len(hb), 0) for grp, hb in zip(groups, hit_blocks)) + evictable \
                        > pool.num_free():
                    break
                if sum(max(grp.blocks_for(hit_tokens + n) - len(hb), 0) for grp, hb in zip(groups, hit_blocks)) \
                        + evictable > pool.num_free():
                    break
                waiting.popleft()
                for g, hb in enumerate(hit_blocks):
                    pool.touch(hb)
                    r.blocks[g] = list(hb)
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
                if prefix_on and (not single or r.computed // bs0 > r.cached_blocks[0]):
                    cache(r, r.computed)
                if r.generated >= r.spec.output:
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
