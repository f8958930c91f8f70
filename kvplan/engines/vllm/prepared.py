"""vLLM's KV layout for one model, TP/PP and options (Prepared): the stages' groups fixed at start-up, and the plan
of `batch` requests of `ctx` tokens as the tensors each group's layer slots hold."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan.engines import layout
from kvplan.engines.base import CachePlan, KVDtypes, Note, PlanGroup, Request, note_texts, tensor
from kvplan.engines.versions import Selected
from kvplan.engines.vllm.groups import StageLayout
from kvplan.engines.vllm.rules import ENGINE, Rules
from kvplan.spec import LayerCache


@dataclass(frozen=True)
class Prepared:
    """vLLM's KV layout for a model, TP/PP and options: fixed structure, per-request costs as functions of ctx."""

    selected: Selected[Rules]
    stages: tuple[StageLayout, ...]
    kvd: KVDtypes
    inflight: int
    max_num_batched_tokens: int
    async_on: bool
    notes: tuple[Note, ...]
    tp: int
    pp: int
    v2_runner: bool = False  # the V2 model runner runs the model (v2_model_runner)

    def blocks_per_request(self, ctx: int, stage: int) -> int:
        return self.stages[stage].blocks_per_request(ctx, self.inflight)

    def request_bytes(self, ctx: int, stage: int) -> int:
        s = self.stages[stage]
        return s.blocks_per_request(ctx, self.inflight) * s.bytes_per_block

    def concurrency_blocks(self, ctx: int, stage: int) -> int:
        return self.stages[stage].concurrency_blocks(ctx, self.inflight)

    def check_bytes(self, ctx: int) -> int:
        """What the start-up check (_check_enough_kv_cache_memory) says one request of ctx needs, on the worst stage."""
        return max(s.check_bytes(ctx, self.inflight) for s in self.stages)

    def limiting_stage(self, ctx: int) -> int:
        return layout.limiting([self.request_bytes(ctx, i) for i in range(len(self.stages))])

    def plan(self, ctx: int, batch: int, stage: int | None = None) -> CachePlan:
        stage = self.limiting_stage(ctx) if stage is None else stage
        s = self.stages[stage]
        groups = _plan_groups(s, ctx, batch, self.inflight, self.kvd, self.tp)
        all_gpus = sum(self.request_bytes(ctx, i) for i in range(len(self.stages))) * batch * self.tp
        details = {
            "block_size": s.block_size,
            "bytes_per_block": s.bytes_per_block,
            "blocks_per_request": s.blocks_per_request(ctx, self.inflight),
            "blocks": batch * s.blocks_per_request(ctx, self.inflight),
            "max_num_batched_tokens": self.max_num_batched_tokens,
            "inflight_tokens": self.inflight,
            "kv_groups": len(s.groups),
        }
        said = self.notes + s.notes
        return CachePlan(self.selected.label, Request(ctx, batch, self.tp, self.pp), tuple(groups), all_gpus,
                         note_texts(said), stage, details, tuple(n.id for n in said))

    @property
    def assumptions(self) -> tuple[str, ...]:
        return note_texts(self.notes)


def _plan_groups(s: StageLayout, ctx: int, batch: int, inflight: int, kvd: KVDtypes, tp: int) -> list[PlanGroup]:
    """Per distinct layer cache: its share of the pool for `batch` requests. Each layer slot of a vLLM group
    holds blocks x page bytes; a group's padding slots count toward the cache of its first layer."""
    spec_of = dict(s.specs)
    order: dict[LayerCache, dict[str, Any]] = {}
    for e, (layer, c) in enumerate(s.caches):
        b = order.setdefault(c, {"layers": [], "entries": [], "tensors": []})
        b["layers"].append(layer)
        b["entries"].append(e)
    if s.uniform_type:
        blocks = s.blocks_per_request(ctx, inflight) * batch
        for e, page in s.layer_pages:
            order[s.caches[e][1]]["tensors"].append(
                tensor(f"layer {s.caches[e][0]} paged KV: {blocks} blocks x {page:,} B", (blocks * page,), "int8"))
    elif s.packed:
        page_of = dict(s.layer_pages)
        for g in s.groups:
            blocks = g.spec.blocks(ctx, inflight) * batch
            for e in g.layers:
                order[s.caches[e][1]]["tensors"].append(tensor(
                    f"layer {s.caches[e][0]} packed KV: {blocks} blocks x {page_of[e]:,} B", (blocks * page_of[e],), "int8"))
            slack = s.bytes_per_block - sum(page_of[e] for e in g.layers)
            if slack:  # every group's block is as wide as the widest group's
                order[s.caches[g.layers[0]][1]]["tensors"].append(tensor(
                    f"unused block space of a narrower group: {blocks} blocks x {slack:,} B", (blocks * slack,), "int8"))
    else:
        for g in s.groups:
            blocks = g.spec.blocks(ctx, inflight) * batch
            slots: dict[LayerCache, int] = {}
            for e in g.layers:
                slots[s.caches[e][1]] = slots.get(s.caches[e][1], 0) + 1
            owner = s.caches[g.layers[0]][1]
            slots[owner] += g.slots - len(g.layers)
            for c, n in slots.items():
                order[c]["tensors"].append(tensor(
                    f"paged KV: {n} layer slot(s) x {blocks} blocks x {g.spec.page:,} B", (blocks * g.spec.page,), "int8", n))
    out = []
    for c, b in order.items():
        spec = spec_of.get(b["entries"][0])
        if spec is None:
            out.append(layout.no_cache_group(c, b["layers"]))
            continue
        rate = (spec.page, spec.block_size) if spec.is_state else (spec.token_bytes, spec.per_state)
        per_token = rate[0] * len(b["layers"]) // rate[1] if spec.grows(ctx, inflight) else 0
        out.append(PlanGroup(
            kind=c.kind, layer_ids=tuple(b["layers"]), tokens=spec.held_tokens(ctx, inflight), dtype=spec.dtype_label(kvd),
            bytes=sum(t.total_bytes for t in b["tensors"]), bytes_per_token=per_token, tensors=tuple(b["tensors"]),
            description=c.describe(), **layout.geometry(c, tp, ENGINE.heads_per_gpu),
        ))
    return out


# vLLM 0.32's model_executor/models/registry.py _PREVIOUSLY_SUPPORTED_MODELS, as data: an architecture (config.json
