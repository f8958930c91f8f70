"""How vLLM groups a stage's layer specs into KV cache groups sharing one block pool: a port of
v1/core/kv_cache_utils.py (get_kv_cache_groups, unify_kv_cache_spec_page_size, _get_packed_kv_cache_groups) and of
platforms/interface.py _align_hybrid_block_size for attention + Mamba hybrids."""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import lcm
from typing import Any

from kvplan.engines.base import KVDtypes, Note, cdiv
from kvplan.engines.vllm import notes as say
from kvplan.engines.vllm.rules import Rules
from kvplan.engines.vllm.specs import SPARSE_BLOCK, FullSpec, MLASpec, SlidingSpec, SpecEnv, VSpec, layer_spec
from kvplan.errors import InputError
from kvplan.spec import (ChunkedLocal, CrossAttention, FullAttention, LatentAttention, LayerCache, MambaState,
                         RecurrentState)

GDN_CHECKPOINT_ALIGNMENT = 64  # 0.33 v1/attention/backends/gdn_attn.py FLASHINFER_GDN_CHECKPOINT_ALIGNMENT


@dataclass(frozen=True)
class VGroup:
    """A vLLM KV cache group: one spec shared by its layers, and the tensors (slots) it spans."""
    spec: VSpec
    layers: tuple[int, ...]  # real layers (padding slots are not listed)
    slots: int  # tensors this group spans: group_size (hybrid) or its layer count


@dataclass(frozen=True)
class StageLayout:
    """A pipeline stage's KV layout: what is fixed before any request arrives."""

    groups: tuple[VGroup, ...]  # VGroup.layers are entry positions in `caches`
    bytes_per_block: int
    uniform_type: bool  # UniformTypeKVCacheSpecs: one group, per-layer pages
    layer_pages: tuple[tuple[int, int], ...]  # (entry, page) for the uniform-type case
    block_size: int
    caches: tuple[tuple[int, LayerCache], ...]
    specs: tuple[tuple[int, VSpec], ...]
    notes: tuple[Note, ...]

    packed: bool = False  # block-outermost packing (DeepSeek-V4): groups of mixed pages, layer_pages per entry
    # DeepSeek-V4 under vLLM 0.22/0.23 (Rules.dsv4_uniform_groups): each group's page sum, the divisor of the
    # page-weighted blocks the concurrency is printed from (the MLA group's page sum), the start-up check's bytes
    # per block; 0 = as bytes_per_block and blocks_per_request say
    group_page_sums: tuple[int, ...] = ()
    concurrency_divisor: int = 0
    check_bytes_per_block: int = 0
    # what vLLM logs about fitting a hybrid's pages: (Mamba page, the attention page it is padded to) when they
    # differ ("Padding mamba page size by %.2f%%", platforms/interface.py _align_hybrid_block_size), and per layer
    # type with a short last group (padding slots, layers of that type) ("Add %d padding layers, may waste at most
    # %.2f%%", kv_cache_utils.py get_kv_cache_groups)
    mamba_page_padding: tuple[int, int] | tuple[()] = ()
    padding_layers: tuple[tuple[int, int], ...] = ()

    @property
    def mamba_padding_pct(self) -> float | None:
        """vLLM's printed padding: 100 x (attention page - Mamba page) / Mamba page."""
        if not self.mamba_page_padding:
            return None
        page, padded = self.mamba_page_padding
        return 100 * (padded - page) / page

    def blocks_per_request(self, max_len: int, inflight: int) -> int:
        if self.uniform_type:
            return max(s.blocks(max_len, inflight) for _, s in self.specs)
        return sum(g.spec.blocks(max_len, inflight) for g in self.groups)

    def concurrency_blocks(self, max_len: int, inflight: int) -> int:
        """The blocks per request vLLM divides its block count by for "Maximum concurrency"."""
        if not self.concurrency_divisor:
            return self.blocks_per_request(max_len, inflight)
        return cdiv(sum(g.spec.blocks(max_len, inflight) * w for g, w in zip(self.groups, self.group_page_sums)),
                    self.concurrency_divisor)

    def check_bytes(self, max_len: int, inflight: int) -> int:
        """What vLLM's start-up check (_check_enough_kv_cache_memory) says one request of max_len needs."""
        return self.blocks_per_request(max_len, inflight) * (self.check_bytes_per_block or self.bytes_per_block)


def approximate_gcd(values: list[int], lower_bound: int) -> int:
    """kv_cache_utils.py _approximate_gcd: the chunk d >= lower_bound (up to max(values)) with the least total
    upward padding sum(ceil(x / d) d - x); ties go to the larger d."""
    best, best_pad = lower_bound, None
    for d in range(max(1, lower_bound), max(values) + 1):
        pad = sum((d - x % d) % d for x in values)
        if best_pad is None or pad <= best_pad:
            best, best_pad = d, pad
    return best


def _packed_stage(specs: list[tuple[int, VSpec]], caches, notes: list[Note], uniform_groups: str = "") -> StageLayout:
    """kv_cache_utils.py _get_packed_kv_cache_groups, for a block-outermost layout (DeepSeek-V4's indexer backend
    takes no other): layers are bucketed by uniform type (spec class, block size, window), in registration order;
    a bucket whose page sizes all have the same layer count is a repeating pattern, split into groups of
    `repeats` pattern copies (approximate_gcd over those buckets, at least the largest multi-page pattern); every
    group's block then costs the widest group's page sum (_get_kv_cache_bytes_per_block).
    uniform_groups: vLLM 0.22/0.23's _get_kv_cache_groups_uniform_groups instead (Rules.dsv4_uniform_groups)."""
    page = {e: sp.page for e, sp in specs}
    if uniform_groups:  # sliding pages padded up to the nearest MLA page at least as large (0.23 :1563-1573)
        mla_pages = sorted({sp.page for _, sp in specs if isinstance(sp, MLASpec)})
        for e, sp in specs:
            if isinstance(sp, SlidingSpec):
                if not mla_pages or sp.page > mla_pages[-1]:
                    raise InputError("vLLM 0.22/0.23 need every window page within the largest MLA page "
                                     "(kv_cache_utils.py _get_kv_cache_groups_uniform_groups asserts it)")
                page[e] = min(p for p in mla_pages if p >= sp.page)
    buckets: dict[tuple, list[tuple[int, VSpec]]] = {}
    for e, sp in specs:
        buckets.setdefault((type(sp), sp.block_size, getattr(sp, "window", 0)), []).append((e, sp))
    shaped = []
    for members in buckets.values():
        by_page: dict[int, list[tuple[int, VSpec]]] = {}
        for e, sp in members:
            by_page.setdefault(page[e], []).append((e, sp))
        counts = {len(v) for v in by_page.values()}
        whole = uniform_groups and isinstance(members[0][1], MLASpec)  # 0.22/0.23: the MLA group is never split
        shaped.append((members, by_page, len(counts) == 1 and not whole))
    if uniform_groups:  # num_layer_tuples: approximate_gcd of every bucket's tuples, at least the MLA group's (:1536)
        tuples = {id(m): max(len(v) for v in bp.values()) for m, bp, _ in shaped}
        mla = [tuples[id(m)] for m, _, _ in shaped if isinstance(m[0][1], MLASpec)]
        repeats = approximate_gcd(list(tuples.values()), mla[0]) if mla else None
    else:
        floor = max((max(len(v) for v in by_page.values()) for _, by_page, balanced in shaped
                     if balanced and len(by_page) > 1), default=0)
        repeats = approximate_gcd([max(len(v) for v in bp.values()) for _, bp, bal in shaped if bal], floor) if floor else None
    if repeats is None:
        raise InputError("vLLM's block-outermost packing without a repeating multi-page pattern is not modelled")
    groups, pages = [], []
    for members, by_page, balanced in shaped:
        k = cdiv(max(len(v) for v in by_page.values()), repeats) if balanced else 1
        if k == 1:
            parts = [members]
        else:
            pattern = list(zip(*by_page.values()))
            parts = [[m for rep in pattern[i::k] for m in rep] for i in range(k)]
        for part in parts:
            groups.append(VGroup(part[0][1], tuple(e for e, _ in part), len(part)))
            pages.append(sum(page[e] for e, _ in part))
    extra: dict[str, Any] = {}
    if uniform_groups:
        # per page size, the most layers of that size in one group (the tensors of a size, 0.23 :1196-1218)
        slots: dict[int, int] = {}
        for g in groups:
            for ps in {page[e] for e in g.layers}:
                slots[ps] = max(slots.get(ps, 0), sum(1 for e in g.layers if page[e] == ps))
        mla_group = next(i for i, g in enumerate(groups) if isinstance(g.spec, MLASpec))
        tuple_bytes = sum({page[e] for e in groups[mla_group].layers}) * max(slots.values())
        per_block = tuple_bytes if uniform_groups == "tuples" else sum(ps * n for ps, n in slots.items())
        extra = dict(group_page_sums=tuple(pages), concurrency_divisor=pages[mla_group],
                     check_bytes_per_block=tuple_bytes)
        padded = sorted({(sp.page, page[e]) for e, sp in specs if page[e] != sp.page})
        notes.append(say.dsv4_uniform_groups(f"DeepSeek-V4 in {len(groups)} KV groups of one pool (vLLM 0.22/0.23), each block {per_block:,} B "
                     f"({'the MLA page sizes x ' + str(max(slots.values())) + ' layer tuples' if uniform_groups == 'tuples' else 'per page size, its most layers in one group'}); "
                     + (f"window/state pages padded to the next MLA page ({', '.join(f'{a:,} -> {b:,}' for a, b in padded)} B); " if padded else "")
                     + f"concurrency printed from page-weighted blocks over the MLA group's {pages[mla_group]:,} B; "
                     f"the start-up check charges {tuple_bytes:,} B per block"))
    else:
        per_block = max(pages)
        unused = ', '.join(f'{per_block - p:,}' for p in pages if p != per_block) or 'nothing'
        notes.append(say.packed(len(groups), per_block, unused))
    return StageLayout(tuple(groups), per_block, False, tuple((e, page[e]) for e, _ in specs),
                       max(sp.block_size for _, sp in specs), tuple(caches), tuple(specs), tuple(notes), packed=True,
                       **extra)


def _align_hybrid(specs: list[tuple[int, VSpec]], block: int, alignment: int,
                  chunk: int = 0) -> tuple[list[tuple[int, VSpec]], int, list[Note], tuple[int, int] | tuple[()]]:
    """Attention + Mamba: raise the attention block so one page holds a Mamba state, pad Mamba pages to it. In
    mamba_cache_mode "all" (chunk: the model's SSD chunk) the block is a multiple of lcm(chunk, alignment)
    (_align_hybrid_block_size's "all" branch)."""
    attn = [s for _, s in specs if not s.is_state]
    state = [s for _, s in specs if s.is_state]
    if not attn or not state:
        return specs, block, [], ()
    per_token = max(s.token_bytes for s in attn)
    mamba_page = max(s.state_bytes for s in state)
    if chunk:
        step = lcm(chunk, alignment)
        needed = step * cdiv(cdiv(mamba_page, per_token), step)
        if block > needed:
            raise InputError(f"--block-size {block} above the {needed}-token block of vLLM's mamba_cache_mode 'all' "
                             "(attention and state blocks of different sizes) is not modelled; leave it unset")
    else:
        needed = alignment * cdiv(mamba_page, alignment * per_token)
    new_block = max(block, needed)
    padded = new_block * per_token
    notes = [say.block_raised(new_block, mamba_page, padded)] if new_block != block or padded != mamba_page else []
    out = []
    for i, s in specs:
        if s.is_state:
            out.append((i, replace(s, block_size=new_block, page_override=padded)))
        else:
            out.append((i, replace(s, block_size=new_block)))
    return out, new_block, notes, ((mamba_page, padded) if padded != mamba_page else ())


def _unify_pages(specs: list[tuple[int, VSpec]]) -> list[tuple[int, VSpec]]:
    """unify_kv_cache_spec_page_size: smaller pages get block_size x (max_page / page)."""
    max_page = max(s.page for _, s in specs)
    out = []
    for i, s in specs:
        if s.page != max_page:
            if s.is_state:
                s = replace(s, page_override=max_page)
            elif max_page % s.page:
                raise InputError("vLLM cannot unify this model's KV page sizes (they do not divide); it would refuse to start")
            else:
                s = replace(s, block_size=s.block_size * (max_page // s.page))
        out.append((i, s))
    return out


def _promotes_local(caches, disable: bool, rules: Rules) -> bool:
    """With the hybrid manager off, vLLM sizes sliding/chunked layers as full attention; since 0.32 only when the
    stage mixes them with other attention types (_promote_local_kv_cache_specs keeps uniform specs), and never
    for state layers, which it cannot promote (it refuses to start)."""
    if not disable:
        return False
    if not rules.promote_only_mixed:
        return True
    if any(isinstance(c, RecurrentState) for _, c in caches) and any(not isinstance(c, RecurrentState) for _, c in caches
                                                                        if isinstance(c, (FullAttention, LatentAttention))):
        raise InputError("vLLM cannot run Mamba/linear-attention hybrids with --disable-hybrid-kv-cache-manager "
                         "(v1/core/kv_cache_utils.py _promote_local_kv_cache_specs: 'Failed to promote local KV cache "
                         "specs to one unified type')")
    attention = {(type(c), c.span) for _, c in caches if isinstance(c, FullAttention) and not isinstance(c, CrossAttention)}
    return len(attention) > 1


def build_stage(caches, tp: int, kvd: KVDtypes, rules: Rules, opts: dict[str, Any], state_dtypes, arch: str,
                mamba_mode: str, batched_tokens: int, flashkda: bool = False, gdn_checkpoint: bool = False,
                mamba_chunk: int = 0) -> StageLayout:
    """mamba_mode: the state layers' mamba_cache_mode, "none", "align" or "all" (_mamba_cache_mode); mamba_chunk:
    the SSD chunk "all" aligns blocks to;
    flashkda: Kimi-K3's KDA prefill backend would be FlashKDA (SpecEnv.flashkda); gdn_checkpoint: Qwen GDN prefill
    on FlashInfer exports checkpoints (SpecEnv.gdn_checkpoint)."""
    user_block = opts.get("block_size")
    block = int(user_block or 16)
    disable = bool(opts.get("disable_hybrid_kv_cache_manager"))
    notes: list[Note] = []
    chunked = any(isinstance(c, ChunkedLocal) for _, c in caches)
    if (not disable and chunked and opts.get("disable_hybrid_kv_cache_manager") is None
            and not rules.chunked_keeps_hybrid):
        disable = True  # VllmConfig.__post_init__ (< 0.15 here): chunked local attention turns the hybrid manager off
        notes.append(say.chunked_disables_hybrid())
    state_align = mamba_mode == "align"
    env = SpecEnv(tp, kvd, block, int(user_block or dict(rules.mla_block).get(arch, 16)),
                  _promotes_local(caches, disable, rules), state_dtypes, state_align,
                  batched_tokens if rules.cross_reserves_batched_tokens else None, rules.window_beyond_context_slides,
                  arch, int(user_block or SPARSE_BLOCK), int(opts.get("decode_context_parallel_size") or 1), flashkda,
                  gdn_checkpoint and state_align, rules.mamba2_checkpoint_page, mamba_mode == "all")
    if state_align and any(isinstance(c, RecurrentState) for _, c in caches):
        mamba2 = any(isinstance(c, MambaState) and len(c.ssm_shape) == 3 for _, c in caches)
        threes = ["Mamba-2 mixers"] if mamba2 and rules.mamba2_checkpoint_page else []
        if env.gdn_checkpoint:
            threes.append("Gated DeltaNet layers: FlashInfer prefill checkpoints")
        notes.append(say.align_mode(threes))
    specs = []  # keyed by the entry's position in `caches` (a decoder layer may hold self + cross caches)
    for e, (_, c) in enumerate(caches):
        s = layer_spec(c, env)
        if s is not None:
            specs.append((e, s))
    if not specs:
        return StageLayout((), 0, False, (), block, tuple(caches), (), tuple(notes))
    if any(s.align for _, s in specs):
        return _packed_stage(specs, caches, notes, rules.dsv4_uniform_groups)
    has_mla = any(isinstance(s, MLASpec) for _, s in specs)
    alignment = rules.hybrid_mla_alignment if has_mla else 16
    if rules.hybrid_align_to_block:
        alignment = max(alignment, block)  # _align_hybrid_block_size: max(kernel block, cache_config.block_size)
    if env.gdn_checkpoint:
        alignment = lcm(alignment, GDN_CHECKPOINT_ALIGNMENT)  # 0.33: prefill checkpoints land on block boundaries
    specs, block, align_notes, mamba_padding = _align_hybrid(specs, block, alignment, mamba_chunk if env.state_all else 0)
    notes += align_notes
    return replace(_unified_stage(specs, caches, notes), mamba_page_padding=mamba_padding)


def _unified_stage(specs: list[tuple[int, VSpec]], caches, notes: list[Note]) -> StageLayout:
    """The stage's groups once the pages are aligned: one group, one uniform-type group, or groups of equal size."""
    distinct = {s for _, s in specs}
    kinds = {(type(s), s.block_size) for s in distinct}
    if len(distinct) == 1:
        s = next(iter(distinct))
        layers = tuple(e for e, _ in specs)
        groups = (VGroup(s, layers, len(layers)),)
        return StageLayout(groups, len(layers) * s.page, False, (), s.block_size, tuple(caches), tuple(specs), tuple(notes))
    if len({b for _, b in kinds}) == 1 and {t for t, _ in kinds} <= {FullSpec, MLASpec}:
        # UniformTypeKVCacheSpecs: same type, different page sizes (per-layer heads, MLA + indexer); MLAAttentionSpec
        # registers FullAttentionSpec as its uniform_type_base_spec (v1/core/single_type_kv_cache_manager.py
        # register_all_kvcache_specs), so full attention and MLA pages of one block size form one group (MiniMax-M3)
        s0 = specs[0][1]
        layers = tuple(i for i, _ in specs)
        pages = tuple((i, s.page) for i, s in specs)
        return StageLayout((VGroup(s0, layers, len(layers)),), sum(p for _, p in pages), True, pages, s0.block_size,
                           tuple(caches), tuple(specs), tuple(notes))
    specs = _unify_pages(specs)
    buckets: dict[VSpec, list[int]] = {}
    for i, s in specs:
        buckets.setdefault(s, []).append(i)
    sizes = [len(v) for v in buckets.values()]
    # get_kv_cache_groups: layers of each type go into groups of group_size; the larger type's count is used
    # when the counts are within 1.5x of each other, else the smaller (kv_cache_utils.py)
    group_size = max(sizes) if max(sizes) < 1.5 * min(sizes) else min(sizes)
    groups, paddings = [], []
    for s, layers in buckets.items():
        k = cdiv(len(layers), group_size)
        padding = k * group_size - len(layers)
        if padding:  # vLLM: "Add %d padding layers, may waste at most %.2f%% KV cache memory"
            paddings.append((padding, len(layers)))
            notes.append(say.padding_layers(padding, len(layers)))
        for j in range(k):
            groups.append(VGroup(s, tuple(layers[j::k]), group_size))
    page = specs[0][1].page
    return StageLayout(tuple(groups), group_size * page, False, (), max(s.block_size for _, s in specs), tuple(caches),
                       tuple(specs), tuple(notes), padding_layers=tuple(paddings))


