"""llama.cpp KV cells (engines.md §3): per layer one K tensor [n_embd_k_gqa, cells, streams] of type_k and one
V tensor of type_v; MLA GGUFs store the latent (kv_lora_rank + rope) as K and, in current builds, no V.

Serving B requests of C tokens means `-np B -c B*C`: n_ctx is the total over slots, padded to 256; with
--no-kv-unified (the default when -np is given) each slot gets its own stream of PAD(n_ctx / B, 256) cells.
Sliding-window (and Llama-4 chunked) layers get PAD(min(cells, n_swa * (unified ? B : 1) + n_ubatch), 256)
cells unless --swa-full. Recurrent layers keep r (conv) and s (SSM) rows in f32 for max(1, B) sequences.
Cross-attention K/V is recomputed from the stored encoder output, not cached.

Build numbers of the two rule changes are estimates from the release cadence (b5331 = May 2025,
b5912 = mid-July 2025): fixed 256-cell padding and per-slot streams (PR 17046, Nov 2025) ~b7000;
V-less MLA cache (PR 19067, merged 2026-01-24) ~b7800.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan import dtypes
from kvplan.engines import base
from kvplan.engines.base import CachePlan, Knob, KVDtypes, PlanGroup, Request, pad_to, tensor
from kvplan.engines.versions import Selected, select
from kvplan.errors import InputError
from kvplan.spec import LayerCache, ModelSpec


@dataclass(frozen=True)
class Rules:
    fixed_pad: bool  # n_ctx padded to 256 always (else 256 with flash attention, 32 without)
    streams: bool  # per-slot streams when not kv_unified
    mla_v: bool  # MLA stores V (kv_lora_rank) beside the K latent


VERSIONS = [
    ("b5000", Rules(False, False, True)),
    ("b7000", Rules(True, True, True)),
    ("b7800", Rules(True, True, False)),
]
KV_DTYPES = ("fp32", "fp16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")  # cache dtypes this engine can store
KNOBS = {
    "parallel": Knob("parallel", int, "-np: sequences (slots); fit reads it as the batch"),
    "ubatch": Knob("ubatch", int, "-ub: physical batch (SWA cells = window + ubatch)"),
    "kv_unified": Knob("kv_unified", bool, "--kv-unified: one cell stream shared by all slots"),
    "swa_full": Knob("swa_full", bool, "--swa-full: sliding-window layers get full-size cache"),
    "flash_attn": Knob("flash_attn", bool, "-fa (older builds pad n_ctx to 256 with it, 32 without)"),
}
F32 = dtypes.KV_DTYPES["fp32"]


def select_version(requested: str | None) -> Selected[Rules]:
    return select("llamacpp", requested, VERSIONS)


@dataclass(frozen=True)
class Cells:
    base: int  # cells per stream for full layers
    swa: int  # cells per stream for SWA/chunked layers
    streams: int
    n_ctx: int  # what llama.cpp reports as n_ctx


def cells(ctx: int, batch: int, rules: Rules, unified: bool, ubatch: int, swa_full: bool, n_swa: int, flash_attn: bool) -> Cells:
    n_ctx = batch * ctx
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


@dataclass(frozen=True)
class Prepared:
    selected: Selected[Rules]
    spec: ModelSpec
    stages: tuple[tuple[tuple[int, LayerCache], ...], ...]
    kvd: KVDtypes
    unified: bool
    ubatch: int
    swa_full: bool
    flash_attn: bool
    pp: int
    assumptions: tuple[str, ...]

    def n_swa(self) -> int:
        ws = [getattr(c, "window", 0) or getattr(c, "chunk", 0) for _, c in self.spec.caches if c.kind in ("sliding", "chunked")]
        return max(ws) if ws else 0

    def cells(self, ctx: int, batch: int) -> Cells:
        return cells(ctx, batch, self.selected.rules, self.unified, self.ubatch, self.swa_full, self.n_swa(), self.flash_attn)

    def _layer(self, c: LayerCache, cl: Cells, batch: int) -> tuple[list, int]:
        """Tensors of one layer and the bytes one more cell adds to it."""
        if c.kind in ("full", "sliding", "chunked"):
            n = cl.swa if c.kind in ("sliding", "chunked") else cl.base
            k_row, v_row = self.kvd.k.nbytes(c.kv_heads * c.head_dim_k), self.kvd.v.nbytes(c.kv_heads * c.head_dim_v)
            return [tensor("K", (cl.streams * n, c.kv_heads * c.head_dim_k), self.kvd.k),
                    tensor("V", (cl.streams * n, c.kv_heads * c.head_dim_v), self.kvd.v)], k_row + v_row
        if c.kind == "mla":
            out = [tensor("K (latent)", (cl.streams * cl.base, c.latent_dim), self.kvd.k)]
            row = self.kvd.k.nbytes(c.latent_dim)
            if self.selected.rules.mla_v:
                out.append(tensor("V", (cl.streams * cl.base, c.kv_lora_rank), self.kvd.v))
                row += self.kvd.v.nbytes(c.kv_lora_rank)
            return out, row
        if c.kind in ("mamba_state", "linear_state"):
            mem = max(1, batch)
            r = (c.conv_kernel - 1) * c.conv_dim
            s = 1
            for d in c.ssm_shape:
                s *= d
            st = self.kvd.state or F32
            return [tensor("r (conv state)", (mem, r), st), tensor("s (ssm state)", (mem, s), st)], 0
        return [], 0

    def _groups(self, ctx: int, batch: int, stage: int) -> list[PlanGroup]:
        from kvplan.engines.vllm import geometry

        cl = self.cells(ctx, batch)
        grow_swa = self.cells(ctx + 1, 1).swa > self.cells(ctx, 1).swa if not self.swa_full else True
        merged: dict[LayerCache, list[int]] = {}
        for i, c in self.stages[stage]:
            merged.setdefault(c, []).append(i)
        out = []
        for c, layers in merged.items():
            per_layer, row = self._layer(c, cl, batch)
            if not per_layer:
                out.append(PlanGroup(c.kind, tuple(layers), None, None, None, None, 0, "-", 0, 0, (), c.describe()))
                continue
            tensors = tuple(t.__class__(t.name, t.shape, t.dtype, len(layers), t.elem_bytes) for t in per_layer)
            if c.kind in ("mamba_state", "linear_state"):
                tokens, grows, dtype = 0, False, (self.kvd.state or F32).name
            elif c.kind in ("sliding", "chunked"):
                tokens, grows, dtype = cl.swa, grow_swa, self.kvd.label
            else:
                tokens, grows, dtype = cl.base, True, self.kvd.label
            out.append(PlanGroup(
                kind=c.kind, layer_ids=tuple(layers), tokens=tokens, dtype=dtype,
                bytes=sum(t.total_bytes for t in tensors), bytes_per_token=row * len(layers) if grows else 0,
                tensors=tensors, description=c.describe(), **geometry(c, 1, split_heads=lambda h, tp: h),
            ))
        return out

    def stage_bytes(self, ctx: int, batch: int, stage: int) -> int:
        return sum(g.bytes for g in self._groups(ctx, batch, stage))

    def limiting_stage(self, ctx: int) -> int:
        per = [self.stage_bytes(ctx, 1, s) for s in range(len(self.stages))]
        return per.index(max(per))

    def plan(self, ctx: int, batch: int, stage: int | None = None) -> CachePlan:
        stage = self.limiting_stage(ctx) if stage is None else stage
        cl = self.cells(ctx, batch)
        groups = self._groups(ctx, batch, stage)
        all_gpus = sum(self.stage_bytes(ctx, batch, s) for s in range(len(self.stages)))
        details = {"n_ctx": cl.n_ctx, "cells": cl.base, "swa_cells": cl.swa, "streams": cl.streams,
                   "n_seq_max": batch, "flags": f"-np {batch} -c {batch * ctx}"}
        return CachePlan(self.selected.label, Request(ctx, batch, 1, self.pp), tuple(groups), all_gpus,
                         self.assumptions, stage, details)


def prepare(spec: ModelSpec, tp: int, pp: int, kvd: KVDtypes, selected: Selected[Rules], opts: dict[str, Any],
            **_: Any) -> Prepared:
    if tp > 1:
        raise InputError("llama.cpp splits a model by layers across GPUs, not by tensor parallelism; use --pp N "
                         "for a layer split over N GPUs")
    rules = selected.rules
    unified = bool(opts.get("kv_unified") or False)
    ubatch = int(opts.get("ubatch") or 512)
    swa_full = bool(opts.get("swa_full") or False)
    flash_attn = opts.get("flash_attn")
    flash_attn = True if flash_attn is None else bool(flash_attn)
    notes = ["serving B requests of C tokens = -np B -c B*C; n_ctx padded to 256"
             + ("" if rules.fixed_pad else " with flash attention (32 without)")]
    if rules.streams:
        notes.append("one cell stream per slot (--no-kv-unified, the default with -np)" if not unified
                     else "one unified cell stream shared by all slots (--kv-unified)")
    if any(c.kind in ("sliding", "chunked") for _, c in spec.caches):
        notes.append("SWA layers get full cells (--swa-full)" if swa_full
                     else f"SWA/chunked layers: PAD(window + ubatch {ubatch}, 256) cells (--swa-full off, server default)")
    if any(c.kind == "mla" for _, c in spec.caches):
        notes.append("MLA: K = latent (kv_lora_rank + rope)" + (", V = kv_lora_rank stored beside it" if rules.mla_v
                                                               else ", no V tensor (V-less cache)"))
    if any(c.kind == "cross" for _, c in spec.caches):
        notes.append("cross-attention K/V are recomputed from the stored encoder output (not in the KV cache)")
    if any(c.kind in ("mamba_state", "linear_state") for _, c in spec.caches):
        notes.append(f"recurrent state r/s in {(kvd.state or F32).name} for max(1, n_seq) sequences")
    if pp > 1:
        notes.append(f"layers split over {pp} GPUs as evenly as vLLM's pipeline split (llama.cpp -sm layer; -ts "
                     "proportions change it)")
    if selected.note:
        notes.append(selected.note)
    caches = tuple(tuple((i, c) for i, c in st if c.kind != "cross") for st in base.stage_caches(spec, pp))
    return Prepared(selected, spec, caches, kvd, unified, ubatch, swa_full, flash_attn, pp, tuple(notes))


# ---------------------------------------------------------------------------------------------- budget, capacity
LLAMA_MAX_SEQ = 256  # llama.cpp's sequence limit (-np)


def budget(prepared: Prepared, spec: ModelSpec, gpu: base.GpuContext, stage: int, weights: int,
           opts: dict[str, Any], reserve: int | None, dtype_bytes: int) -> base.Budget:
    """Device total minus weights, the compute buffer estimate and the 1 GiB margin llama.cpp's --fit keeps."""
    from kvplan.engines import overhead

    if reserve is not None:
        parts = [("reserve (--reserve)", -reserve)]
    else:
        parts = [("compute buffer at ubatch (estimate)", -overhead.llamacpp_compute(spec, prepared.ubatch)),
                 ("CUDA context (estimate)", -overhead.CUDA_CONTEXT_BYTES),
                 ("margin (common_fit_params: 1 GiB)", -overhead.LLAMACPP_MARGIN_BYTES)]
    parts = [("total", gpu.cuda_total), ("weights", -weights), *parts]
    return base.Budget(sum(v for _, v in parts), tuple(parts))


def fits(prepared: Prepared, ctx: int, batch: int, budgets: list[int]) -> bool:
    return all(prepared.stage_bytes(ctx, batch, s) <= budgets[s] for s in range(len(prepared.stages)))


def max_batch(prepared: Prepared, ctx: int, budgets: list[int]) -> int:
    return max(0, base.largest(1, 1 << 20, lambda b: fits(prepared, ctx, b, budgets)))


def capacity(prepared: Prepared, spec: ModelSpec, ctx: int, budgets: list[int], opts: dict[str, Any],
             gpu: base.GpuContext, max_model_len: int | None) -> base.Capacity:
    limit = max(max_model_len or 0, ctx) * 4
    tokens = max(0, base.largest(1, limit, lambda c: fits(prepared, c, 1, budgets)))
    b = max_batch(prepared, ctx, budgets)
    start = fits(prepared, ctx, 1, budgets)
    return base.Capacity(b, tokens, float(b), LLAMA_MAX_SEQ, start,
                         None if start else "llama.cpp cannot allocate the KV cache for one sequence of this context",
                         None, {"flags": f"-np {max(b, 1)} -c {max(b, 1) * ctx}"})
