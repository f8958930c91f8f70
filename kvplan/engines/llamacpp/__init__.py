"""llama.cpp KV cells (engines.md §3): per layer one K tensor [n_embd_k_gqa, cells, streams] of type_k and one
V tensor of type_v; MLA GGUFs store the latent (kv_lora_rank + rope) as K and, in current builds, no V.

Serving B requests of C tokens means `-np B -c B*C`: n_ctx is the total over slots, padded to 256; with
--no-kv-unified (the default when -np is given) each slot gets its own stream of PAD(n_ctx / B, 256) cells.
Sliding-window (and Llama-4 chunked) layers get PAD(min(cells, n_swa * (unified ? B : 1) + n_ubatch), 256)
cells unless --swa-full. Recurrent layers keep r (conv) and s (SSM) rows in f32 for max(1, B) sequences.
Cross-attention K/V is recomputed from the stored encoder output, not cached. T5 (arch t5: T5, Flan-T5, mT5):
the cache has one K/V layer per ENCODER block (block_count; src/llama-kv-cache.cpp loops over hparams.n_layer_all,
src/models/t5.cpp reads the decoder's count into dec_n_layer), a decoder deeper than the encoder fails to create
the context, and more than one sequence needs --kv-unified (per-slot streams abort building T5's graph).

Build numbers of the two rule changes are estimates from the release cadence (b5331 = May 2025,
b5912 = mid-July 2025): fixed 256-cell padding and per-slot streams (PR 17046, Nov 2025) ~b7000;
V-less MLA cache (PR 19067, merged 2026-01-24) ~b7800.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod
from typing import Any, Callable

from kvplan import dtypes
from kvplan.engines import base, layout
from kvplan.engines.base import EngineInfo, KVDtypes, PlanGroup, pad_to, tensor
from kvplan.engines.listing import LISTINGS
from kvplan.engines.llamacpp import models
from kvplan.engines.versions import Selected, select
from kvplan.engines.views import SlotView
from kvplan.errors import InputError
from kvplan.parallel import heads_unsplit
from kvplan.spec import (MsaIndexerKeys, ChunkedLocal, CrossAttention, FullAttention, IndexerKeys, LatentAttention, KimiDeltaState,
                         LightningState,
                         LinearAttentionState, MambaState, ModelSpec, NoCache, RecurrentState, SharedKV,
                         ShortConvState, SlidingWindow, SparseLatentAttention, WindowBeyondContext)


@dataclass(frozen=True)


class Rules:
    fixed_pad: bool  # n_ctx padded to 256 always (else 256 with flash attention, 32 without)
    streams: bool  # per-slot streams when not kv_unified
    mla_v: bool  # MLA stores V (kv_lora_rank) beside the K latent


VERSIONS = [
    ("b5000", Rules(False, False, True)),
    ("b7000", Rules(True, True, True)),
    ("b7800", Rules(True, True, False)),
    ("b11434", Rules(True, True, False)),  # the build the engine oracle runs (tests/test_engine_llamacpp.py): b7800's rules hold
]
KV_DTYPES = ("fp32", "fp16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")  # cache dtypes this engine can store
LISTED = LISTINGS["llamacpp"]
KNOBS = LISTED.knobs
F32 = dtypes.KV_DTYPES["fp32"]
ENGINE = EngineInfo(
    name=LISTED.name, aliases=LISTED.aliases, summary=LISTED.summary, versions=VERSIONS, kv_dtypes=KV_DTYPES,
    knobs=KNOBS, default_kv_dtype=lambda spec: dtypes.KV_DTYPES["fp16"], honours_checkpoint_kv=False,
    uses_vllm_max_ctx=False, weight_float_dtype=base.serving_dtype, heads_per_gpu=heads_unsplit, gguf_native=True,
)


def select_version(requested: str | None) -> Selected[Rules]:
    return select(ENGINE.name, requested, VERSIONS)


@dataclass(frozen=True)


class Cells:
    base: int  # cells per stream for full layers
    swa: int  # cells per stream for SWA/chunked layers
    streams: int
    n_ctx: int  # what llama.cpp reports as n_ctx


N_BATCH = 2048  # -b, llama.cpp's logical batch default (common/common.h)


def effective_ubatch(ubatch: int, requested_ctx: int) -> int:
    """llama_context ctor: n_batch = min(n_ctx, -b) for causal models, n_ubatch = min(n_batch, -ub), with n_ctx the
    requested -c (before padding)."""
    return min(ubatch, N_BATCH, requested_ctx)


def cells(ctx: int, batch: int, rules: Rules, unified: bool, ubatch: int, swa_full: bool, n_swa: int, flash_attn: bool,
          total: int | None = None) -> Cells:
    """total: -c as given (default batch x ctx, kvplan's `-np B -c B*C`)."""
    n_ctx = batch * ctx if total is None else total
    ubatch = effective_ubatch(ubatch, n_ctx)
    pad = 256 if (rules.fixed_pad or flash_attn) else 32
    n_ctx = pad_to(n_ctx, pad)
    if rules.streams and not unified:
        per_seq = pad_to(n_ctx // batch, 256)
        streams, base_cells, n_ctx = batch, per_seq, per_seq * batch
    else:
        streams, base_cells = 1, n_ctx
    if n_swa and not swa_full:
        seqs = batch if (unified or not rules.streams) else 1
        swa = pad_to(min(base_cells, n_swa * seqs + ubatch), pad)
        swa = min(swa, base_cells) if swa > base_cells else swa
    else:
        swa = base_cells
    return Cells(base_cells, swa, streams, n_ctx)


# ---------------------------------------------------------------------------------------------- kind rules
@dataclass(frozen=True)


class KVCells:
    """llama_kv_cache: per layer K [n_embd_k_gqa, cells, streams] of type_k and V likewise of type_v. swa: the
    layer lives in the SWA cache (llama_kv_cache_iswa), whose cells cover the window."""

    swa: bool = False

    def layer(self, c: FullAttention, cl: Cells, batch: int, p: "Prepared") -> tuple[list, int]:
        """Tensors of one layer and the bytes one more cell adds to it."""
        n = cl.swa if self.swa else cl.base
        k, v = c.token_elems(c.kv_heads)
        v = p.v_row or v
        return [tensor("K", (cl.streams * n, k), p.kvd.k), tensor("V", (cl.streams * n, v), p.kvd.v)], \
            p.kvd.k.nbytes(k) + p.kvd.v.nbytes(v)

    def tokens(self, cl: Cells) -> int:
        return cl.swa if self.swa else cl.base

    def grows(self, p: "Prepared", ctx: int) -> bool:
        if not self.swa or p.swa_full:
            return True
        return p.cells(ctx + 1, 1).swa > p.cells(ctx, 1).swa

    def dtype_label(self, p: "Prepared") -> str:
        return p.kvd.label


@dataclass(frozen=True)


class LatentCells(KVCells):
    """MLA GGUFs: K = the latent (kv_lora_rank + rope); older builds store V (kv_lora_rank) beside it."""

    def layer(self, c: LatentAttention, cl: Cells, batch: int, p: "Prepared") -> tuple[list, int]:
        out = [tensor("K (latent)", (cl.streams * cl.base, c.latent_dim), p.kvd.k)]
        row = p.kvd.k.nbytes(c.latent_dim)
        if p.selected.rules.mla_v:
            out.append(tensor("V", (cl.streams * cl.base, c.kv_lora_rank), p.kvd.v))
            row += p.kvd.v.nbytes(c.kv_lora_rank)
        return out, row


@dataclass(frozen=True)


class IndexerCells(KVCells):
    """DSA (deepseek32, glm-dsa): llama_kv_cache_dsa keeps a second llama_kv_cache for the lightning indexer's keys,
    one head of indexer.key_length per cell in type_k and no V (src/llama-kv-cache-dsa.cpp), on the layers whose
    indexer is full (is_indexer_full)."""

    def layer(self, c: IndexerKeys, cl: Cells, batch: int, p: "Prepared") -> tuple[list, int]:
        return [tensor("K (indexer)", (cl.streams * cl.base, c.head_dim), p.kvd.k)], p.kvd.k.nbytes(c.head_dim)

    def dtype_label(self, p: "Prepared") -> str:
        return p.kvd.k.name


@dataclass(frozen=True)


class MsaIndexerCells(KVCells):
    """MiniMax-M3 (minimax-m3): llama_kv_cache_msa keeps a second llama_kv_cache for the index keys on the sparse
    layers (src/llama-kv-cache-msa.cpp: hparams copied with n_head_kv 1 and n_embd_head_k = indexer.key_length).
    Unlike DSA's, the model is not MLA, so that cache also allocates a V tensor per layer: one head of the model's
    value length (n_embd_v_gqa = n_embd_head_v x 1; with -fa off n_embd_v_gqa_max() of those same hparams, the
    same width), in type_v. Create_memory puts the index keys where il >= n_layer_dense_lead (llama-model.cpp)."""

    def layer(self, c: MsaIndexerKeys, cl: Cells, batch: int, p: "Prepared") -> tuple[list, int]:
        v = p.value_head_dim()
        return [tensor("K (indexer)", (cl.streams * cl.base, c.head_dim), p.kvd.k),
                tensor("V (indexer)", (cl.streams * cl.base, v), p.kvd.v)], p.kvd.k.nbytes(c.head_dim) + p.kvd.v.nbytes(v)


@dataclass(frozen=True)


class ZeroHeadCells(KVCells):
    """An attention layer without KV heads: in the cache with a zero-width K; with -fa off (V stored transposed) it
    still gets a V row of the widest layer's width (src/llama-kv-cache.cpp: n_embd_v_gqa_max() when v_trans)."""

    def layer(self, c: NoCache, cl: Cells, batch: int, p: "Prepared") -> tuple[list, int]:
        if not (c.zero_kv_heads and p.v_row):
            return [], 0
        return [tensor("V", (cl.streams * cl.base, p.v_row), p.kvd.v)], p.kvd.v.nbytes(p.v_row)


@dataclass(frozen=True)


class RecurrentRows:
    """llama_memory_recurrent: r (conv) and s (SSM) rows in f32 for max(1, n_seq) sequences. r is (kernel - 1) x
    conv_dim and s the recurrent matrix: for Kimi Delta Attention (kimi-linear, kimi-k3) that is llama_hparams
    n_embd_r() = 3 x (ssm_d_conv - 1) x n_head x n_embd_head_kda and n_embd_s() = n_embd_head_kda^2 x n_head
    (src/llama-hparams.cpp), which KimiDeltaState's conv_dim and (heads, head_dim, head_dim) give."""

    def layer(self, c: RecurrentState, cl: Cells, batch: int, p: "Prepared") -> tuple[list, int]:
        mem, st = max(1, batch), p.kvd.state or F32
        return [tensor("r (conv state)", (mem, (c.conv_kernel - 1) * c.conv_dim), st),
                tensor("s (ssm state)", (mem, prod(c.ssm_shape)), st)], 0

    def tokens(self, cl: Cells) -> int:
        return 0

    def grows(self, p: "Prepared", ctx: int) -> bool:
        return False

    def dtype_label(self, p: "Prepared") -> str:
        return (p.kvd.state or F32).name


@dataclass(frozen=True)


class ShortConvRows(RecurrentRows):
    """LFM2 / LFM2-MoE (lfm2, lfm2moe): the short-convolution layers live in llama_memory_hybrid's
    llama_memory_recurrent with r rows of n_embd_r() = n_embd x (shortconv.l_cache - 1) and s rows of n_embd_s() =
    ssm_d_state x ssm_d_inner = 0 (src/llama-hparams.cpp), f32, for max(1, n_seq) sequences; the attention layers
    (head_count_kv > 0) are a plain llama_kv_cache beside it (llama-model.cpp create_memory: hybrid, no filter)."""

    def layer(self, c: ShortConvState, cl: Cells, batch: int, p: "Prepared") -> tuple[list, int]:
        mem, st = max(1, batch), p.kvd.state or F32
        return [tensor("r (conv state)", (mem, (c.conv_kernel - 1) * c.conv_dim), st)], 0


class LightningRows(RecurrentRows):
    """MiniMax-01 lightning layers (src/models/minimax-01.cpp: hparams.n_embd_head_la = the head size): no conv row
    (n_embd_r() = 0, no ssm_d_conv) and an s row of n_embd_s() = n_embd_head_la^2 x n_head() (src/llama-hparams.cpp)
    per sequence, f32 unless -ctk / --state-dtype says otherwise, for max(1, n_seq) sequences."""

    def layer(self, c: RecurrentState, cl: Cells, batch: int, p: "Prepared") -> tuple[list, int]:
        return [tensor("s (ssm state)", (max(1, batch), prod(c.ssm_shape)), p.kvd.state or F32)], 0


KIND_RULES: dict[type, Any] = {
    FullAttention: KVCells(),
    WindowBeyondContext: KVCells(),  # a window beyond the context is full attention here
    SlidingWindow: KVCells(swa=True),
    ChunkedLocal: KVCells(swa=True),
    CrossAttention: layout.Omitted("cross-attention K/V are recomputed from the stored encoder output"),
    LatentAttention: LatentCells(),
    SparseLatentAttention: LatentCells(),  # llama_kv_cache_dsa's main cache: the MLA latent as deepseek2's
    IndexerKeys: IndexerCells(),
    MsaIndexerKeys: MsaIndexerCells(),
    MambaState: RecurrentRows(),
    LinearAttentionState: RecurrentRows(),
    ShortConvState: ShortConvRows(),  # n_embd_r = n_embd x (L_cache - 1), n_embd_s = 0
    LightningState: LightningRows(),
    KimiDeltaState: RecurrentRows(),  # n_embd_r = 3 x (d_conv - 1) x n_head x head_dim, n_embd_s = head_dim^2 x n_head
    SharedKV: layout.NO_CACHE,
    NoCache: ZeroHeadCells(),
    **layout.DEEPSEEK_V4_NOT_MODELLED,
}


T5_MODEL_TYPES = ("t5", "mt5")  # config model types and the GGUF architecture llama.cpp lays out as T5
# b11434, one T5 GGUF with -np 2 (llama-completion / llama-batched-bench, per-slot streams): GGML_ASSERT(ggml_can_repeat(b, a))
# in build_attn_mha while sched_reserve builds the graph (the relative-position bias does not broadcast over streams)
T5_ONE_STREAM = ("llama.cpp b11434 aborts building a T5 graph for more than one sequence in per-slot streams "
                 "(ggml.c GGML_ASSERT(ggml_can_repeat) in build_attn_mha during sched_reserve): use --batch 1 or "
                 "--kv-unified")


def t5_caches(spec: ModelSpec) -> tuple[tuple[tuple[int, Any], ...], int]:
    """A T5 config's caches (and layer count) as llama.cpp holds them: the converter writes block_count = num_layers (the encoder) and
    decoder_block_count = num_decoder_layers (conversion/t5.py); llama_kv_cache allocates n_layer_all = block_count
    layers of self-attention K/V (src/llama-kv-cache.cpp), so an encoder deeper than the decoder gets cache layers
    no decoder layer writes; a deeper decoder fails to create the context (b11434: vector::_M_range_check)."""
    selfs = [(i, c) for i, c in spec.caches if isinstance(c, FullAttention) and not isinstance(c, CrossAttention)]
    if not spec.is_encoder_decoder or not selfs:  # a t5 GGUF: its caches are block_count layers already
        return spec.caches, spec.num_layers
    enc = spec.encoder_layers
    if len(selfs) > enc:
        raise InputError(f"llama.cpp cannot run this T5 model: its decoder has {len(selfs)} layers, its encoder {enc}, "
                         "and llama.cpp's KV cache has one layer per encoder block (b11434 fails to create the "
                         "context: vector::_M_range_check)")
    cross = [(i, c) for i, c in spec.caches if isinstance(c, CrossAttention)]
    return tuple((i, selfs[0][1]) for i in range(enc)) + tuple(cross), enc


# ---------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Prepared(layout.StagedLayout):
    selected: Selected[Rules]
    spec: ModelSpec
    stages: tuple[layout.Caches, ...]
    kvd: KVDtypes
    unified: bool
    ubatch: int
    swa_full: bool
    flash_attn: bool
    pp: int
    assumptions: tuple[str, ...]
    tp: int = 1
    one_sequence: str | None = None  # why more than one sequence cannot run (T5 in per-slot streams)
    n_ctx_total: int | None = None  # -c as given (plan's --ctx-size); None: batch x ctx

    @property
    def label(self) -> str:
        return self.selected.label

    @property
    def gpus_per_stage(self) -> int:
        return 1

    def n_swa(self) -> int:
        """llama.cpp's one n_swa for the SWA cache: the largest window among the windowed layers."""
        ws = [c.span for _, c in self.spec.caches if getattr(KIND_RULES.get(type(c)), "swa", False)]
        return max(ws) if ws else 0

    @property
    def v_row(self) -> int | None:
        """With flash attention off llama.cpp stores V transposed and gives every layer of the cache a V row of
        n_embd_v_gqa_max(), the widest over all layers (src/llama-kv-cache.cpp); None when each keeps its own."""
        if self.flash_attn:
            return None
        widths = [c.token_elems(c.kv_heads)[1] for _, c in self.spec.caches
                  if isinstance(c, FullAttention) and not isinstance(c, CrossAttention)]
        zero_heads = any(isinstance(c, NoCache) and c.zero_kv_heads for _, c in self.spec.caches)
        if not widths or (len(set(widths)) == 1 and not zero_heads):
            return None
        return max(widths)

    def value_head_dim(self) -> int:
        """n_embd_head_v of the model's attention layers (the widest, should they differ)."""
        return max((c.head_dim_v for _, c in self.spec.caches if isinstance(c, FullAttention)), default=0)

    def cells(self, ctx: int, batch: int) -> Cells:
        return cells(ctx, batch, self.selected.rules, self.unified, self.ubatch, self.swa_full, self.n_swa(), self.flash_attn,
                     self.n_ctx_total)

    def groups_of(self, ctx: int, batch: int, stage: int) -> list[PlanGroup]:
        if batch > 1 and self.one_sequence:
            raise InputError(self.one_sequence)
        cl = self.cells(ctx, batch)
        out = []
        for c, layers, rule in layout.groups(ENGINE.name, KIND_RULES, self.stages[stage]):
            if isinstance(rule, layout.NoCacheRule):
                out.append(layout.no_cache_group(c, layers))
                continue
            per_layer, row = rule.layer(c, cl, batch, self)
            if not per_layer and isinstance(rule, ZeroHeadCells):
                out.append(layout.no_cache_group(c, layers))
                continue
            tensors = tuple(replace(t, count=len(layers)) for t in per_layer)
            out.append(PlanGroup(
                kind=c.kind, layer_ids=tuple(layers), tokens=rule.tokens(cl), dtype=rule.dtype_label(self),
                bytes=sum(t.total_bytes for t in tensors), bytes_per_token=row * len(layers) if rule.grows(self, ctx) else 0,
                tensors=tensors, description=c.describe(), **layout.geometry(c, 1, ENGINE.heads_per_gpu),
            ))
        return out

    def details(self, ctx: int, batch: int, stage: int) -> dict[str, Any]:
        cl = self.cells(ctx, batch)
        c = batch * ctx if self.n_ctx_total is None else self.n_ctx_total
        return {"n_ctx": cl.n_ctx, "cells": cl.base, "swa_cells": cl.swa, "streams": cl.streams,
                "n_seq_max": batch, "flags": f"-np {batch} -c {c}"}




def prepare(spec: ModelSpec, tp: int, pp: int, kvd: KVDtypes, selected: Selected[Rules], opts: dict[str, Any],
            gpu: base.GpuContext | None = None) -> Prepared:
    layout.refuse_model(ENGINE.name, models.REFUSED, spec)
    as_converted = layout.model_row(models.FROM_CONFIG, spec)
    if spec.stored_format is None and as_converted is not None:
        spec = as_converted(spec)
    if tp > 1:
        raise InputError("llama.cpp splits a model by layers across GPUs, not by tensor parallelism; use --pp N "
                         "for a layer split over N GPUs")
    layout.check_rules(ENGINE.name, KIND_RULES, spec.caches)
    swa_check = layout.model_row(models.SWA_FROM_CONVERSION, spec)
    if swa_check is not None:
        swa_check(spec, {i for i, c in spec.caches if isinstance(c, SlidingWindow)})
    rules = selected.rules
    unified = bool(opts.get("kv_unified") or False)
    t5 = spec.model_type in T5_MODEL_TYPES
    if t5:
        caches, n_layers = t5_caches(spec)
        spec = replace(spec, caches=caches, num_layers=n_layers)
    ubatch = int(opts.get("ubatch") or 512)
    swa_full = bool(opts.get("swa_full") or False)
    flash_attn = opts.get("flash_attn")
    flash_attn = True if flash_attn is None else bool(flash_attn)
    kinds = {type(c) for _, c in spec.caches}
    if spec.model_type in models.GEMMA3N_MODEL_TYPES:
        kept = sum(not isinstance(c, SharedKV) for _, c in spec.caches)
        notes_g3n = [f"Gemma-3n: llama.cpp keeps K/V on the first {kept} layers (n_layer_kv_from_start = "
                     f"{models.GEMMA3N_KV_LAYERS}, fixed in src/models/gemma3n.cpp, not num_kv_shared_layers)"]
    else:
        notes_g3n = []
    notes = notes_g3n + ["serving B requests of C tokens = -np B -c B*C; n_ctx padded to 256"
             + ("" if rules.fixed_pad else " with flash attention (32 without)")]
    if rules.streams:
        notes.append("one cell stream per slot (--no-kv-unified, the default with -np)" if not unified
                     else "one unified cell stream shared by all slots (--kv-unified)")
    if kinds & {SlidingWindow, ChunkedLocal}:
        notes.append("SWA layers get full cells (--swa-full)" if swa_full
                     else f"SWA/chunked layers: PAD(window + n_ubatch, 256) cells, n_ubatch = min(-ub {ubatch}, -b {N_BATCH}, -c) "
                          "(--swa-full off, server default)")
    if IndexerKeys in kinds:
        notes.append("DeepSeek sparse attention: a second cache of indexer keys (K only, type_k) beside the latent")
    if MsaIndexerKeys in kinds:
        notes.append("MiniMax-M3 sparse attention (llama_kv_cache_msa): a second cache of index keys (type_k) with "
                     "a one-head V row (type_v) on the sparse layers, beside the K/V cache")
    if kinds & {LatentAttention, SparseLatentAttention}:
        notes.append("MLA: K = latent (kv_lora_rank + rope)" + (", V = kv_lora_rank stored beside it" if rules.mla_v
                                                               else ", no V tensor (V-less cache)"))
    if CrossAttention in kinds:
        notes.append("cross-attention K/V are recomputed from the stored encoder output (not in the KV cache)")
    if t5:
        notes.append("T5: one self-attention K/V layer per encoder block (llama_kv_cache over block_count)"
                     + ("" if unified else "; one sequence only without --kv-unified"))
    if any(issubclass(k, RecurrentState) for k in kinds):
        rows = "r (conv) rows, no s rows," if {k for k in kinds if issubclass(k, RecurrentState)} == {ShortConvState} else "r/s"
        notes.append(f"recurrent state {rows} in {(kvd.state or F32).name} for max(1, n_seq) sequences")
    if pp > 1:
        notes.append(f"layers split over {pp} GPUs as evenly as vLLM's pipeline split (llama.cpp -sm layer; -ts "
                     "proportions change it)")
    if selected.note:
        notes.append(selected.note)
    stages = tuple(layout.kept(ENGINE.name, KIND_RULES, st) for st in layout.stages(spec, pp))
    return Prepared(selected, spec, stages, kvd, unified, ubatch, swa_full, flash_attn, pp, tuple(notes),
                    one_sequence=T5_ONE_STREAM if t5 and not unified and rules.streams else None)


# ---------------------------------------------------------------------------------------------- budget, capacity
LLAMA_MAX_SEQ = 256  # llama.cpp's sequence limit (-np)


def check_parallel(n: int | None) -> int | None:
    """-np as llama_context takes it: at most LLAMA_MAX_SEQ sequences (src/llama-context.cpp)."""
    if n is not None and int(n) > LLAMA_MAX_SEQ:
        raise InputError(f"--parallel {int(n):,}: llama.cpp runs at most {LLAMA_MAX_SEQ} sequences (LLAMA_MAX_SEQ)")
    return None if n is None else int(n)


def slot_view(prepared: Prepared, longest: int, budgets: list[int], parallel: int | None, ctx_size: int | None,
              weights_left: str | None) -> SlotView:
    """llama-server's -np slots over -c cells for requests up to `longest` tokens: -np / -c as given; without them
    what `fit` suggests, C = the longest request, -np the most slots whose `-np B -c B*C` cache fits the budget (at
    most LLAMA_MAX_SEQ), -c = -np x C; with -c alone, -np = -c // C. weights_left: the refusal when the weights leave
    no KV memory (raised after the rule-set check, as plan has always ordered them)."""
    if not prepared.selected.rules.streams:
        raise InputError(f"plan replays llama-server b11434's slots; {prepared.label} (before per-slot cell streams) "
                         "is not modelled")
    if weights_left:
        raise InputError(weights_left)
    chosen = parallel is None and ctx_size is None
    if parallel is None:
        if ctx_size is not None:
            parallel = max(1, min(LLAMA_MAX_SEQ, ctx_size // longest))
        else:
            parallel = min(LLAMA_MAX_SEQ, max_batch(prepared, longest, budgets))
            if parallel < 1:
                raise InputError(f"not one llama.cpp slot of the longest request ({longest:,} tokens) fits the KV "
                                 f"budget ({min(budgets):,} B per GPU); kvplan fit shows it")
    c = ctx_size if ctx_size is not None else parallel * longest
    deployed = replace(prepared, n_ctx_total=c)
    stage = deployed.limiting_stage(longest)
    need = tuple(deployed.stage_bytes(longest, parallel, st) for st in range(len(deployed.stages)))
    flags = f"-np {parallel} -c {c}" + (" --kv-unified" if prepared.unified else "")
    over = [st for st, (n, b) in enumerate(zip(need, budgets)) if n > b]
    if over:
        st = over[0]
        raise InputError(f"llama-server {flags}: llama.cpp's KV cache takes {need[st]:,} B per GPU, the KV budget is "
                         f"{budgets[st]:,} B (kvplan fit shows it); lower -np or -c")
    cl = deployed.cells(longest, parallel)
    per_cell = max(1, prepared.plan(longest, 1, stage).kv_bytes_per_token)
    windowed = bool(prepared.n_swa()) and not prepared.swa_full
    recurrent = any(isinstance(c_, RecurrentState) for _, c_ in prepared.spec.caches)
    groups = [g for g in deployed.plan(longest, parallel, stage).groups if g.bytes]
    return SlotView(parallel, c, chosen, flags, stage, need, cl.n_ctx, cl.base, cl.streams, prepared.unified, per_cell,
                    not (windowed or recurrent), len(groups))


def budget(prepared: Prepared, spec: ModelSpec, gpu: base.GpuContext, stage: int, weights: int,
           opts: dict[str, Any], reserve: int | None, dtype_bytes: int) -> base.Budget:
    """Device total minus weights, the compute buffer estimate and the 1 GiB margin llama.cpp's --fit keeps."""
    from kvplan.engines import overhead

    if reserve is not None:
        parts = [base.BudgetPart("reserve", "reserve (--reserve)", -reserve)]
    else:
        parts = [base.BudgetPart("compute_buffer", "compute buffer at ubatch (estimate)",
                                 -overhead.llamacpp_compute(spec, prepared.ubatch)),
                 base.BudgetPart("cuda_context", "CUDA context (estimate)", -overhead.CUDA_CONTEXT_BYTES),
                 base.BudgetPart("margin", "margin (common_fit_params: 1 GiB)", -overhead.LLAMACPP_MARGIN_BYTES)]
    parts = [base.BudgetPart("total", "total", gpu.cuda_total), base.BudgetPart("weights", "weights", -weights), *parts]
    return base.summed(parts)


def fits(prepared: Prepared, ctx: int, batch: int, budgets: list[int]) -> bool:
    if batch > 1 and prepared.one_sequence:
        return False
    return all(prepared.stage_bytes(ctx, batch, s) <= budgets[s] for s in range(len(prepared.stages)))


def max_batch(prepared: Prepared, ctx: int, budgets: list[int]) -> int:
    return max(0, base.largest(1, 1 << 20, lambda b: fits(prepared, ctx, b, budgets)))


def capacity(prepared: Prepared, spec: ModelSpec, ctx: int, budgets: list[int], opts: dict[str, Any],
             gpu: base.GpuContext, max_model_len: int | None) -> base.Capacity:
    if opts.get("ctx_size") is not None:
        raise InputError("--ctx-size (llama-server -c, the context of all slots together) is read by kvplan plan; fit "
                         "solves it: -np B -c B x --ctx")
    limit = max(max_model_len or 0, ctx) * 4
    tokens = max(0, base.largest(1, limit, lambda c: fits(prepared, c, 1, budgets)))
    b = max_batch(prepared, ctx, budgets)
    start = fits(prepared, ctx, 1, budgets)
    cap = check_parallel(opts.get("parallel")) or LLAMA_MAX_SEQ  # -np: the slots
    return base.Capacity(b, tokens, float(b), cap, start,
                         None if start else "llama.cpp cannot allocate the KV cache for one sequence of this context",
                         None, {"flags": f"-np {max(b, 1)} -c {max(b, 1) * ctx}"})
