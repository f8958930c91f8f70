"""The engine's pool as `kvplan plan` replays it: a block pool under vLLM's scheduler (Pool) or llama-server's
cells under its slots (ServerPool), with what a request holds and what the replay does with each group."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from kvplan.schedule_sim import SchedulerSettings
from kvplan.workload import Workload

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


CACHE_RAM_BYTES = 8192 << 20  # llama-server --cache-ram default (MiB): the RAM prompt cache's size limit


def server_warnings(a: dict[str, int], pool: ServerPool, n: int) -> list[str]:
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


def computed_prompt(prompt: int, workload: Workload, pool) -> int:
    """Prompt tokens a request computes: with prefix caching, the shared prefix's cached part is not recomputed."""
    return max(1, prompt - pool.cached_prefix(workload.shared_prefix))


def computed_mean(workload: Workload, pool: Pool) -> float:
    return sum(computed_prompt(r.prompt, workload, pool) for r in workload.requests) / len(workload.requests)


def computed_max(workload: Workload, pool: Pool) -> int:
    return max(computed_prompt(r.prompt, workload, pool) for r in workload.requests)


def mean_request_blocks(pool: Pool, workload: Workload) -> float:
    """Blocks a request holds on average over its decode: its prompt plus half its output, per request."""
    total = 0
    for r in workload.requests:
        total += pool.request_blocks(r.prompt + r.output // 2)
    return total / len(workload.requests)


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
