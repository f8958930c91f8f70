"""DeepSeek-V4 in SGLang 0.5.23: DSV4PoolConfigurator (model_executor/pool_configurator.py) and
DeepSeekV4TokenToKVPool (mem_cache/deepseek_v4_memory_pool.py), read in the 0.5.23 wheel, for the launch SGLang
makes of a DeepseekV4ForCausalLM (model_type deepseek_v4) on an NVIDIA GPU with every switch at its default.

What that launch resolves (arg_groups/): model_overrides/deepseek_v4.py sets page_size 256 and
swa_full_tokens_ratio 0.1 (model_type deepseek_v4 only); kv_cache_hook.py handle_cache_compatibility, which runs after
the model overrides, records that ratio as explicitly set, so DSV4PoolConfigurator._resolve_swa_cap_tokens returns
None (ratio mode; the request-cap SWA mode and --swa-prefix-tails are DeepSeek-V4.1's); deepseek_v4_hook.py picks
the flashmla backend for deepseek_v4 (flashmla_mega is V4.1's, trtllm must be asked for) and max_running_requests
256; overrides.py _deepseek_v4_kv_cache_dtype makes auto fp8_e4m3. Environment defaults (environ.py):
SGLANG_DSV4_KV_LAYOUT v4, SGLANG_DSV4_COMPRESS_STATE_DTYPE float32, SGLANG_OPT_USE_ONLINE_COMPRESS off; the unified
KV pool is HIP only (unified_kv_gate.py); --enable-deepseek-v4-fp4-indexer defaults off.

Bytes (kernels/ops/attention/dsv4/kv_layout.py KVLayout.V4): a token is 584 B (448 fp8 nope + 64 bf16 rope + 7
ue8m0 scales + 1 pad; DeepSeekV4SingleKVPool.create_buffer asserts it) and a page of n tokens is padded to a
multiple of 576 B (page_bytes). The SWA pool pages 256 tokens, the c4 / c128 pools 256 // ratio entries; every pool
allocates ceil((size + 256) / its page) pages (_num_dsv4_physical_kv_pages: one logical page of padding). The c4
indexer keys are fp8 + one fp32 scale per 128 (132 B for 128 dims, get_dsv4_indexer_bytes_per_token) in pages of
64, sized c4_logical_size = c128 x 32. Compressor states (CompressStatePool, fp32): c4 rings of 8 rows per SWA page,
2 x 2 x dim wide (attention and indexer), c128 rings of 128 rows per request slot, 2 x dim wide; each allocates
size + ring + 1 rows, padded to the ratio.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from kvplan import dtypes
from kvplan.engines.base import PlanGroup, tensor
from kvplan.errors import InputError
from kvplan.parallel import pad_to
from kvplan.spec import CompressedIndexerKeys, CompressedLatent, CompressorState, LayerCache, SlidingLatent

PAGE = 256  # model_overrides/deepseek_v4.py: page_size = 256 (_build_dsv4_kv_pool asserts it off NPU)
SWA_RATIO = 0.1  # model_overrides/deepseek_v4.py: swa_full_tokens_ratio 0.1 (DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO too)
MAX_RUNNING_REQUESTS = 256  # deepseek_v4_hook.py apply_deepseek_v4_defaults
V4_TOKEN_BYTES = 584  # KVLayout.V4 data_bytes 576 + scale_bytes 8
V4_PAGE_ALIGN = 576  # KVLayout.V4 page_align
V4_NOPE, V4_ROPE = 448, 64  # the only geometry the V4 record holds (create_buffer asserts 448 + 64 x 2 + 8)
RING = {4: 8, 128: 128}  # deepseek_v4_memory_pool.py get_compress_state_ring_size, no speculative decoding
STATE_BYTES = 4  # SGLANG_DSV4_COMPRESS_STATE_DTYPE float32
INDEX_PAGE = 64  # the c4 indexer pool's page: page_size // 4


def v4_page_bytes(tokens: int) -> int:
    """KVLayout.page_bytes: a page of `tokens` V4 records, padded to a multiple of 576 B."""
    return -(-tokens * V4_TOKEN_BYTES // V4_PAGE_ALIGN) * V4_PAGE_ALIGN


def paged_kv_bytes_per_token(ratio: int = 0) -> float:
    """DSV4PoolConfigurator._get_paged_kv_bytes_per_token: page bytes / page tokens (585.0 for 256, 864.0 for 2)."""
    page = PAGE // ratio if ratio else PAGE
    return v4_page_bytes(page) / page


def indexer_bytes(index_dim: int) -> int:
    """get_dsv4_indexer_bytes_per_token, fp8: the key and one fp32 scale per 128 values."""
    return index_dim + index_dim // 128 * 4


@dataclass(frozen=True)
class Dsv4Stage:
    """One pipeline stage as DSV4PoolConfigurator sees it: its layers, and those of ratio 4 and 128."""
    layers: int
    c4: int
    c128: int
    head_dim: int  # attn_head_dim = qk_nope + qk_rope
    index_dim: int

    def bytes_per_swa_token(self) -> float:
        """_get_bytes_per_swa_token: the SWA record on every layer, plus the c4 compress state (attention and
        indexer, 2 x 2 x dim fp32 each) of the ring rows one SWA slot brings (ring 8 per 256-token page)."""
        c4_state_bytes = 2 * 2 * self.head_dim * STATE_BYTES
        c4_indexer_state_bytes = 2 * 2 * self.index_dim * STATE_BYTES
        c4_state_ratio = (RING[4] if self.c4 else 0) / PAGE
        return paged_kv_bytes_per_token() * self.layers + (
            c4_state_ratio * (c4_state_bytes + c4_indexer_state_bytes) * self.c4)

    def compressed_bytes_per_full_token(self, ratio: int) -> float:
        """_compressed_bytes_per_full_token (c4_shrink_factor 1: no HiSparse)."""
        if ratio == 4:
            return 1 / 4 * paged_kv_bytes_per_token(4) + 1 / 4 * indexer_bytes(self.index_dim)
        return 1 / 128 * paged_kv_bytes_per_token(128)

    def bytes_per_full_token(self) -> float:
        """_get_bytes_per_full_token in ratio mode, summed in stage_owner_layers' order (4, then 128)."""
        owners = [(r, n) for r, n in ((4, self.c4), (128, self.c128)) if n]
        return SWA_RATIO * self.bytes_per_swa_token() + sum(
            self.compressed_bytes_per_full_token(r) * n for r, n in owners)

    def c128_state_fixed_bytes(self, max_running_requests: int) -> int:
        """_get_c128_state_fixed_bytes: a 128-row ring per request slot (max_running_requests + 1), plus ring + 1
        rows, rounded up to 128, x 2 x dim fp32, on every c128 layer."""
        if not self.c128:
            return 0
        rows = -(-((max_running_requests + 1) * RING[128] + RING[128] + 1) // 128) * 128
        return rows * 2 * self.head_dim * STATE_BYTES * self.c128


def full_tokens(stage: Dsv4Stage, available: int, max_running_requests: int) -> int:
    """DSV4PoolConfigurator.calculate_pool_sizes: the budget less the c128 state rings, divided by
    bytes_per_full_token, floored to the page (the reserved-page loop only touches ratios 1 and 2, V4.1's; it is
    kept for the float rounding it guards)."""
    bpft = stage.bytes_per_full_token()
    rest = max(available - stage.c128_state_fixed_bytes(max_running_requests), 0)
    full = int(rest / bpft) // PAGE * PAGE
    while full > 0 and full * bpft > rest:
        full -= PAGE
    return full


@dataclass(frozen=True)
class PoolSizes:
    """MemoryPoolConfig of a DeepSeek-V4 launch (_compute_dsv4_sizes, finalize_with_max_running_requests)."""
    full: int
    swa: int
    c4: int
    c128: int
    c4_state: int
    c128_state: int
    max_running_requests: int

    @classmethod
    def of(cls, full: int, max_running_requests: int, stage: Dsv4Stage) -> "PoolSizes":
        """The ring sizes come from the stage's own ratios (ring_sizes.get(ratio, 0)): a pipeline stage without c4
        (c128) layers reports a c4 (c128) state pool of 0."""
        full = full // PAGE * PAGE
        swa = int(full * SWA_RATIO) // PAGE * PAGE
        return cls(full, swa, full // 4, full // 128, swa // PAGE * (RING[4] if stage.c4 else 0),
                   (max_running_requests + 1) * (RING[128] if stage.c128 else 0), max_running_requests)

    def to_json(self) -> dict[str, int]:
        return {"full_max_total_num_tokens": self.full, "swa_max_total_num_tokens": self.swa,
                "c4_max_total_num_tokens": self.c4, "c128_max_total_num_tokens": self.c128,
                "c4_state_pool_size": self.c4_state, "c128_state_pool_size": self.c128_state}


def pool_sizes(stages: tuple[Dsv4Stage, ...], budgets: list[int], requested: int,
               max_total_tokens: int | None) -> PoolSizes:
    """kv_cache_configurator.py config_from_budget + _apply_token_constraints (--max-total-tokens, the PP MIN
    all-reduce) + resolve_max_num_reqs (min(requested per worker, tokens // 2)); the state pool sizes are the first
    stage's (the rank-0 log line)."""
    full = min(full_tokens(st, max(0, b), requested) for st, b in zip(stages, budgets))
    if max_total_tokens:
        full = min(full, max_total_tokens)
    full = full // PAGE * PAGE
    return PoolSizes.of(full, min(requested, full // 2), stages[0])


def swa_floor_message(sizes: PoolSizes, window: int) -> str | None:
    """MemoryPoolConfigurator.validate_swa_pool_size (ratio mode), and MemoryPoolConfig's empty-pool error."""
    if sizes.full <= 0:
        return "Not enough memory. Please try to increase --mem-fraction-static. (SGLang refuses to start)"
    if window + PAGE >= sizes.swa:
        return (f"SWA pool ({sizes.swa} tokens) cannot hold even one request: the prefill admission floor is "
                f"sliding_window_size ({window}) + page_size ({PAGE}) (SGLang refuses to start)")
    return None


def request_sizes(ctx: int, batch: int, window: int) -> PoolSizes:
    """The pools `size` shows: just large enough for `batch` requests of ctx tokens (full = batch x ctx rounded
    to the page, SWA = batch x min(ctx, window) rounded to the page), derived as _compute_dsv4_sizes derives the
    compressed pools and states from them; request slots batch + 1 (ReqToTokenPool keeps slot 0 spare)."""
    full = batch * pad_to(ctx, PAGE)
    swa = batch * pad_to(min(ctx, window), PAGE)
    return PoolSizes(full, swa, full // 4, full // 128, swa // PAGE * RING[4], (batch + 1) * RING[128], batch)


def padding_bytes(stage: Dsv4Stage, ctx: int, batch: int, window: int) -> int:
    """What the pools of `size` allocate beyond their slots at page-average bytes (the coefficient
    DSV4PoolConfigurator prices): each pool's padding page (_num_dsv4_physical_kv_pages) and rounding."""
    s = request_sizes(ctx, batch, window)
    out = Fraction(0)
    for layers, size, page, row in ((stage.layers, s.swa, PAGE, None), (stage.c4, s.c4, PAGE // 4, None),
                                    (stage.c128, s.c128, PAGE // 128, None),
                                    (stage.c4, s.c128 * 32, INDEX_PAGE, INDEX_PAGE * indexer_bytes(stage.index_dim))):
        page_bytes = row if row is not None else v4_page_bytes(page)
        out += layers * (_pages(size, page) * page_bytes - Fraction(size * page_bytes, page))
    return math.ceil(out)


def _pages(size: int, page: int) -> int:
    """_num_dsv4_physical_kv_pages: one logical (256-token) page of padding rows."""
    return -(-(size + PAGE) // page)


def _state_rows(size: int, ratio: int) -> int:
    """CompressStatePool: size + ring + 1 rows, padded to the ratio."""
    return -(-(size + RING[ratio] + 1) // ratio) * ratio


@dataclass(frozen=True)
class Dsv4Rule:
    """One DeepSeek-V4 cache kind in DeepSeekV4TokenToKVPool; `p` is the SGLang Prepared (p.page, p.dsv4_window)."""

    def group(self, c: LayerCache, layers: list[int], ctx: int, batch: int, p: Any) -> PlanGroup:
        s = request_sizes(ctx, batch, p.dsv4_window)
        n = len(layers)
        if isinstance(c, CompressedLatent):
            page = PAGE // c.ratio
            t = tensor(f"c{c.ratio} kv_buffer (V4 records, {v4_page_bytes(page):,}-B pages of {page})",
                       (_pages(s.c4 if c.ratio == 4 else s.c128, page), v4_page_bytes(page)), "uint8", n)
            per = Fraction(v4_page_bytes(page), page * c.ratio) * n
            return PlanGroup(c.kind, tuple(layers), 1, c.dim, 0, None, s.full // c.ratio, "fp8 V4 record",
                             t.total_bytes, int(per), (t,), c.describe())
        if isinstance(c, SlidingLatent):
            t = tensor(f"swa kv_buffer (V4 records, {v4_page_bytes(PAGE):,}-B pages of {PAGE})",
                       (_pages(s.swa, PAGE), v4_page_bytes(PAGE)), "uint8", n)
            grows = min(ctx + 1, c.window) > min(ctx, c.window)
            per = Fraction(v4_page_bytes(PAGE), PAGE) * n if grows else 0
            return PlanGroup(c.kind, tuple(layers), 1, c.dim, 0, c.window, s.swa // batch, "fp8 V4 record",
                             t.total_bytes, int(per), (t,), c.describe())
        if isinstance(c, CompressedIndexerKeys):
            per_token = indexer_bytes(c.head_dim)
            t = tensor("c4 index_k_with_scale_buffer", (_pages(s.c128 * 32, INDEX_PAGE), INDEX_PAGE * per_token),
                       "uint8", n)
            return PlanGroup(c.kind, tuple(layers), 1, c.head_dim, 0, None, s.full // 4, "fp8+scales",
                             t.total_bytes, int(Fraction(per_token, 4) * n), (t,), c.describe())
        if isinstance(c, CompressorState):
            if c.ratio == 4:
                rows = _state_rows(s.c4_state, 4)  # per SWA page, 8 rows (c4_state_pool_size)
            else:  # request-scoped: max(c128_state_pool_size, num_req_slots x ring)
                rows = _state_rows(max(s.c128_state, (batch + 1) * RING[128]), 128)
            t = tensor(f"c{c.ratio} compress state (kv + score)", (rows, c.width), dtypes.KV_DTYPES["fp32"], n)
            return PlanGroup(c.kind, tuple(layers), None, None, None, RING[c.ratio], 0, "fp32 state",
                             t.total_bytes, 0, (t,), c.describe())
        raise InputError(f"SGLang 0.5.23 keeps no DeepSeek-V4 pool for {c.kind}")


DSV4_RULE = Dsv4Rule()


def stage_of(caches) -> Dsv4Stage:
    """A stage's counts from its DeepSeek-V4 caches (one SlidingLatent per layer)."""
    windows = [c for _, c in caches if type(c) is SlidingLatent]
    comp = [c for _, c in caches if isinstance(c, CompressedLatent)]
    index = [c for _, c in caches if isinstance(c, CompressedIndexerKeys)]
    w = windows[0] if windows else None
    return Dsv4Stage(len(windows), sum(c.ratio == 4 for c in comp), sum(c.ratio == 128 for c in comp),
                     w.dim if w else 0, index[0].head_dim if index else 0)


def check_geometry(caches) -> None:
    """The V4 record holds 448 fp8 nope + 64 bf16 rope values only (DeepSeekV4SingleKVPool.create_buffer)."""
    for _, c in caches:
        if isinstance(c, SlidingLatent) and (c.dim - c.rope_dim, c.rope_dim) != (V4_NOPE, V4_ROPE):
            raise InputError(f"SGLang 0.5.23 cannot run this DeepSeek-V4: its V4 KV record holds 448 nope + 64 RoPE "
                             f"dims (DeepSeekV4SingleKVPool.create_buffer asserts 584 B), not "
                             f"{c.dim - c.rope_dim} + {c.rope_dim}")
