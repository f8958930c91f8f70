"""A step-by-step replay of llama-server's slot scheduling (llama.cpp b11434): which requests run at once, which
wait (deferred), which are refused or cut by their slot's context, and what happens when a unified KV cache runs
out of cells.

The rules are b11434's (tools/server/server-context.cpp, server-queue.cpp, server-task.cpp; src/llama-context.cpp,
src/llama-kv-cache.cpp), for completion requests with fixed lengths (n_predict, ignore_eos), no speculative
decoding, no context shift (`--context-shift` is off by default):
- `-np N` slots; a request runs in one slot from its launch to its end. `get_available_slot`: among idle slots that
  hold cached tokens, the one whose longest common prefix with the prompt is the largest share of the prompt
  (above --slot-prompt-similarity 0.1; ties: the lowest id); else the least recently used idle slot (ties: the
  highest id, `t_last_used <= t_last`). No idle slot: the task is deferred (server_queue::defer, FIFO); each slot
  release moves the oldest deferred task to the FRONT of the task queue (pop_deferred_task), so tasks freed in one
  iteration start in reverse order, ahead of new arrivals;
- one iteration (update_slots) = one llama_decode of a batch of at most n_batch tokens (min(-c, -b 2048)): first
  the sampled token of every generating slot, then prompt tokens slot by slot in id order until the batch is full
  (a prompt longer than what is left is chunked over iterations);
- a prompt of n_ctx_slot tokens or more is refused when its slot starts it ("exceeds the available context size",
  exceed_context_size_error); n_ctx_slot is n_ctx_seq (-c / N padded to 256, or all of -c with --kv-unified)
  capped at the model's training context. Generation stops when the slot's tokens + 1 reach n_ctx_slot
  (process_token: `truncated`), so a request gets min(n_predict, n_ctx_slot - prompt) tokens;
- prompt caching (cache_prompt, on by default): a slot keeps its last request's tokens in the KV cache after it
  ends; a new prompt reuses the longest common prefix with them (at least one token is always evaluated). With the
  RAM prompt cache (--cache-ram 8192 MiB by default) idle slots are saved to it when a task launches
  (--cache-idle-slots), and a slot picked by LRU, or by similarity keeping under half its tokens, is saved and
  then loads the oldest saved prompt that shares at least a quarter of its tokens with the new prompt and more of
  it than the slot holds (server_prompt_cache::load);
- separate cell streams (the default with -np): each slot has n_ctx_seq cells of its own and cannot run out;
- --kv-unified: every slot's tokens (idle slots' cached ones included) share n_ctx cells; idle slots are cleared
  at every task launch (--cache-idle-slots with unified KV). A batch that does not find free cells for its tokens
  (llama_kv_cache::prepare) fails; the server clears one idle slot holding tokens and retries, else halves the
  batch and retries; when a batch of one token fails, every processing slot gets "Context size has been
  exceeded." and is released with its cells cleared (server_context::decode).

kvplan plans with it; tests/test_llamacpp_sched_oracle.py starts llama-server b11434 on this machine and compares every
iteration and every request. Pure Python integers; no engine code is imported.
"""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

from kvplan.schedule_sim import SimRequest, Step, Trace

SIMILARITY = 0.1  # --slot-prompt-similarity default (common/common.h slot_prompt_similarity)


def _f32(x: float) -> float:
    """As a C float: the server compares prompt similarities in single precision."""
    return struct.unpack("f", struct.pack("f", x))[0]
N_BATCH = 2048  # -b default


@dataclass(frozen=True)
class ServerSettings:
    """One llama-server instance as its scheduler sees it."""

    n_slots: int  # -np
    n_ctx: int  # llama_n_ctx: the cells of all streams together, after padding
    n_ctx_slot: int  # a slot's context: n_ctx_seq (n_ctx with --kv-unified), capped at the training context
    unified: bool  # --kv-unified: one stream of n_ctx cells for every slot
    n_batch: int  # llama_n_batch: min(-c as given, -b)
    cache_prompt: bool = True
    cache_ram_tokens: int | None = 1 << 40  # the RAM prompt cache's token limit; None: --cache-ram 0 (off)
    cache_idle_slots: bool = True
    similarity: float = SIMILARITY
    reuse_prefix: bool = True  # False: prompts are recomputed (SWA / recurrent caches need checkpoints: not replayed)


@dataclass
class Outcome:
    """What the server answered one request."""

    kind: str = "waiting"  # done | cut (stopped by the slot's context) | rejected (prompt too long) | failed (cells ran out)
    slot: int = -1
    cached: int = 0  # prompt tokens reused from the slot's cache (n_prompt_cached)
    generated: int = 0


@dataclass
class ServerTrace(Trace):
    outcomes: dict[int, Outcome] = field(default_factory=dict)
    failures: list[int] = field(default_factory=list)  # steps where a one-token batch found no cell
    decodes: int = 0  # successful llama_decode calls (llamacpp:n_decode_total)
    attempts: list[list[tuple[int, int]]] = field(default_factory=list)  # per step: (off, n_batch) per llama_decode

    @property
    def peak_deferred(self) -> int:
        return max((s.waiting for s in self.steps), default=0)

    def count(self, kind: str) -> int:
        return sum(1 for o in self.outcomes.values() if o.kind == kind)


@dataclass
class _Slot:
    id: int
    state: str = "idle"  # idle | started | prompt | done_prompt | generating
    req: int = -1
    owner: int = -1  # whose tokens it holds (-1: none)
    tokens: int = 0  # slot.prompt.n_tokens()
    kv: int = 0  # cells its sequence holds
    n_gen: int = 0
    t_last_used: int = -1

    @property
    def processing(self) -> bool:
        return self.state != "idle"


def simulate(settings: ServerSettings, requests: Sequence[SimRequest], *, users: int | None = None,
             arrivals: Sequence[float] | None = None,
             step_seconds: Callable[[int, int, int], float] | None = None, max_steps: int = 400_000) -> ServerTrace:
    """Replay requests until all are answered; `truncated` when max_steps ran out first.

    users None: each request reaches the server before the iteration numbered its arrival_step (iterations that
    decode something are counted; an idle server takes the next arrival at once). users N: a closed loop, N users
    each with one request in the server, sending the next (in list order) when theirs is answered. arrivals:
    arrival times in seconds with step_seconds(tokens, sampled, cells held) timing each iteration."""
    st = settings
    slots = [_Slot(i) for i in range(st.n_slots)]
    order = list(range(len(requests))) if users is not None else sorted(range(len(requests)),
                                                                         key=lambda i: requests[i].arrival_step)
    pending = deque(order)
    queue: deque[int] = deque()  # server_queue::queue_tasks (completion tasks)
    deferred: deque[int] = deque()  # queue_tasks_deferred
    ram: list[tuple[int, int]] = []  # the RAM prompt cache: (owner, tokens), oldest first
    trace = ServerTrace()
    out = trace.outcomes
    in_system = 0
    clock = 0
    step = 0
    now = 0.0

    def lcp(owner: int, length: int, i: int) -> int:
        """Common prefix of a cached sequence and request i's prompt: its own tokens, else the shared prefix."""
        if owner < 0 or length == 0:
            return 0
        r = requests[i]
        if owner == i:
            return min(length, r.prompt)
        return min(requests[owner].shared_prefix, r.shared_prefix, length, r.prompt)

    def ram_save(s: _Slot) -> None:
        """server_slot::prompt_save -> server_prompt_cache::alloc + update."""
        if st.cache_ram_tokens is None or s.tokens == 0 or s.tokens > st.cache_ram_tokens:
            return
        for owner, n in ram:
            if _seq_lcp(requests, owner, n, s.owner, s.tokens) == s.tokens:
                return  # already held in full
        ram[:] = [(o, n) for o, n in ram if _seq_lcp(requests, o, n, s.owner, s.tokens) != n]
        ram.append((s.owner, s.tokens))
        while ram and sum(n for _, n in ram) > st.cache_ram_tokens:
            ram.pop(0)

    def ram_load(s: _Slot, i: int) -> None:
        """server_prompt_cache::load: a saved prompt keeping more of itself and of the new prompt than the slot."""
        r = requests[i]
        base = lcp(s.owner, s.tokens, i)
        keep_best = _f32(base / s.tokens) if s.tokens else -1.0
        sim_best = _f32(base / r.prompt)
        best = None
        for k, (o, n) in enumerate(ram):
            cur = lcp(o, n, i)
            keep, sim = _f32(cur / n), _f32(cur / r.prompt)
            if keep < 0.25:
                continue
            if keep_best < keep and sim_best < sim:
                keep_best, sim_best, best = keep, sim, k
        if best is not None:
            o, n = ram.pop(best)
            s.owner, s.tokens, s.kv = o, n, n

    def clear(s: _Slot) -> None:
        s.owner, s.tokens, s.kv = -1, 0, 0

    def release(s: _Slot) -> None:
        nonlocal clock, in_system
        s.state = "idle"
        clock += 1
        s.t_last_used = clock
        in_system -= 1
        if deferred:
            queue.appendleft(deferred.popleft())

    def answer(i: int, kind: str) -> None:
        out[i].kind = kind
        if kind in ("done", "cut"):
            trace.finished_at[i] = step

    def available(i: int) -> _Slot | None:
        """get_available_slot, and the prompt-cache update it makes."""
        ret, update = None, False
        r = requests[i]
        if st.similarity != 0.0:
            best, threshold = 0.0, _f32(st.similarity)
            for s in slots:
                if s.processing or s.tokens == 0:
                    continue
                sim = _f32(lcp(s.owner, s.tokens, i) / r.prompt)
                if sim > best and sim > threshold:
                    best, ret = sim, s
            if ret is not None and _f32(_f32(best * r.prompt) / ret.tokens) < 0.5:
                update = True
        if ret is None:
            t_last = None
            for s in slots:
                if s.processing:
                    continue
                if ret is None or s.t_last_used <= t_last:
                    t_last, ret = s.t_last_used, s
            update = ret is not None
        if ret is not None and update and st.cache_ram_tokens is not None:
            ram_save(ret)
            ram_load(ret, i)
        return ret

    def sampled(s: _Slot) -> bool:
        """post_decode for one slot: a token is sampled; True when the request ends."""
        s.n_gen += 1
        i = s.req
        trace.first_token_at.setdefault(i, step)
        out[i].generated = s.n_gen
        if s.tokens + 1 >= st.n_ctx_slot:  # process_token: no context shift
            answer(i, "cut" if s.n_gen < requests[i].output else "done")
            return True
        if s.n_gen >= requests[i].output:
            answer(i, "done")
            return True
        return False

    while (pending or queue or deferred or in_system) and step < max_steps:
        idle = not in_system  # nothing processing, queued or deferred: the next request arrives now
        if idle and pending and arrivals is not None:
            now = max(now, arrivals[pending[0]])
        horizon = max(step, requests[pending[0]].arrival_step) if idle and pending and users is None else step
        while pending and (in_system < users if users is not None
                           else arrivals[pending[0]] <= now if arrivals is not None
                           else requests[pending[0]].arrival_step <= horizon):
            i = pending.popleft()
            queue.append(i)
            in_system += 1
            out[i] = Outcome()
            trace.arrived_at[i] = arrivals[i] if arrivals is not None else now
        # process_new_tasks
        while queue:
            i = queue.popleft()
            s = available(i)
            if s is None:
                deferred.append(i)
                continue
            s.state, s.req, s.n_gen = "started", i, 0
            out[i].slot = s.id
            if st.cache_idle_slots and st.cache_ram_tokens is not None:
                for o in slots:
                    if not o.processing:
                        ram_save(o)
                        if st.unified:
                            clear(o)
        if not any(s.processing for s in slots):
            if not pending:
                break
            continue
        # pre_decode: the sampled token of every generating slot, then prompts in slot order
        batch: list[int] = []  # slot id per token
        last: dict[int, int] = {}  # slot id -> batch index of the token it samples from
        for s in slots:
            if s.state == "generating":
                last[s.id] = len(batch)
                batch.append(s.id)
                s.tokens += 1
        for s in slots:
            if len(batch) >= st.n_batch or s.state not in ("started", "prompt"):
                continue
            i = s.req
            r = requests[i]
            if s.state == "started":
                if r.prompt >= st.n_ctx_slot:
                    answer(i, "rejected")
                    release(s)
                    continue
                n_past = lcp(s.owner, s.tokens, i) if st.cache_prompt and st.reuse_prefix else 0
                if n_past == r.prompt and n_past > 0:
                    n_past -= 1
                out[i].cached = n_past
                s.owner, s.tokens, s.kv = i, n_past, n_past  # keep_first(n_past), seq_rm(n_past, -1)
                s.state = "prompt"
            while s.tokens < r.prompt and len(batch) < st.n_batch:
                batch.append(s.id)
                s.tokens += 1
            if s.tokens == r.prompt:
                s.state = "done_prompt"
                last[s.id] = len(batch) - 1
        if not batch:
            continue
        running = sum(1 for s in slots if s.processing)
        held = sum(s.kv for s in slots if s.processing) + len(batch)  # the cells attention reads in this decode
        trace.steps.append(Step(running, len(deferred), st.n_ctx - sum(s.kv for s in slots), len(batch),
                                len(last), held))
        if step_seconds is not None:
            now += step_seconds(len(batch), len(last), held)
            trace.clock.append(now)
        # decode, in views of n_batch tokens, retried smaller when the unified cache has no room
        off, nb = 0, st.n_batch
        tried = []
        trace.attempts.append(tried)
        while off < len(batch):
            tried.append((off, nb))
            n = min(nb, len(batch) - off)
            if st.unified and n > st.n_ctx - sum(s.kv for s in slots):
                if nb == 1:  # "Context size has been exceeded.": every processing slot fails
                    trace.failures.append(step)
                    for s in slots:
                        if s.processing:
                            answer(s.req, "failed")
                            release(s)
                            clear(s)
                    break
                idle = next((s for s in slots if not s.processing and s.tokens > 0), None)  # try_clear_idle_slots
                if idle is not None:
                    clear(idle)
                else:
                    nb //= 2
                continue
            trace.decodes += 1
            for sid in batch[off:off + n]:
                slots[sid].kv += 1
            for s in slots:  # post_decode over this view
                k = last.get(s.id)
                if k is None or not off <= k < off + n or s.state not in ("done_prompt", "generating"):
                    continue
                s.state = "generating"
                if sampled(s):
                    release(s)
            off += n
            nb = st.n_batch
        step += 1
    trace.truncated = bool(pending or queue or deferred or in_system)
    return trace


def _seq_lcp(requests: Sequence[SimRequest], a: int, na: int, b: int, nb: int) -> int:
    """Common prefix of two cached sequences (owner, tokens)."""
    if a < 0 or b < 0 or na == 0 or nb == 0:
        return 0
    if a == b:
        return min(na, nb)
    return min(requests[a].shared_prefix, requests[b].shared_prefix, na, nb)
