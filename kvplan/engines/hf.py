"""transformers DynamicCache (engines.md §4): one K and one V tensor [batch, kv_heads, tokens, head_dim] per
layer in the compute dtype, no paging, no tensor parallelism.

Sliding layers keep the last window-1 tokens after an update (DynamicSlidingWindowLayer); chunked Llama-4 layers
use the same class with window = attention_chunk_size. MLA caches decompressed K/V up to 5.14 and the latent
from 5.15. Mamba/linear layers keep a conv window of the full kernel width in the compute dtype and the
recurrent/SSM state in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvplan import dtypes
from kvplan.engines.base import CachePlan, KVDtypes, PlanGroup, Request, tensor
from kvplan.engines.versions import Selected, select
from kvplan.errors import InputError
from kvplan.spec import LayerCache, ModelSpec


@dataclass(frozen=True)
class Rules:
    mla_latent: bool  # >= 5.15 caches the MLA latent (kv_nope 512 as "keys", k_rot 64 as "values")


VERSIONS = [("4.57", Rules(False)), ("5.15", Rules(True))]
KV_DTYPES = ("fp16", "bf16", "fp32")  # cache dtypes this engine can store
KNOBS: dict[str, Any] = {}


def select_version(requested: str | None) -> Selected[Rules]:
    return select("hf", requested, VERSIONS)


def load_dtype(spec: ModelSpec):
    """from_pretrained(dtype="auto"): the config's dtype. A config that names none leaves transformers to read
    the checkpoint's first floating-point tensor, which a config cannot show: bf16 is assumed (and stated)."""
    return dtypes.KV_DTYPES[spec.dtype or "bf16"]


def tokens_held(c: LayerCache, ctx: int) -> int:
    if c.kind == "sliding":
        return min(ctx, c.window - 1)
    if c.kind == "chunked":
        return min(ctx, c.chunk - 1)
    if c.kind == "cross":
        return c.encoder_len
    if c.kind in ("full", "mla"):
        return ctx
    return 0


def layer_tensors(c: LayerCache, ctx: int, batch: int, kvd: KVDtypes, rules: Rules, model_dt) -> list:
    s = tokens_held(c, ctx)
    if c.kind in ("full", "sliding", "chunked", "cross"):
        return [tensor("keys", (batch, c.kv_heads, s, c.head_dim_k), kvd.k),
                tensor("values", (batch, c.kv_heads, s, c.head_dim_v), kvd.v)]
    if c.kind == "mla":
        if rules.mla_latent:
            return [tensor("keys (kv latent)", (batch, 1, s, c.kv_lora_rank), kvd.k),
                    tensor("values (k_rot)", (batch, 1, s, c.rope_dim), kvd.v)]
        return [tensor("keys", (batch, c.num_heads, s, c.qk_nope_head_dim + c.rope_dim), kvd.k),
                tensor("values", (batch, c.num_heads, s, c.v_head_dim), kvd.v)]
    if c.kind in ("mamba_state", "linear_state"):
        conv = kvd.state or model_dt
        ssm = kvd.state or dtypes.KV_DTYPES["fp32"]
        return [tensor("conv_states", (batch, c.conv_dim, c.conv_kernel), conv),
                tensor("recurrent_states" if c.kind == "linear_state" else "ssm_states", (batch, *c.ssm_shape), ssm)]
    return []


@dataclass(frozen=True)
class Prepared:
    selected: Selected[Rules]
    spec: ModelSpec
    kvd: KVDtypes
    assumptions: tuple[str, ...]
    model_dt: Any

    def plan(self, ctx: int, batch: int, stage: int | None = None) -> CachePlan:
        from kvplan.engines.vllm import geometry

        groups = []
        for g in self.spec.groups:
            c = g.cache
            per_layer = layer_tensors(c, ctx, batch, self.kvd, self.selected.rules, self.model_dt)
            tensors = tuple(t.__class__(t.name, t.shape, t.dtype, t.count * len(g.layer_ids), t.elem_bytes) for t in per_layer)
            nbytes = sum(t.total_bytes for t in tensors)
            grows = tokens_held(c, ctx + 1) > tokens_held(c, ctx)
            one_token = sum(t.total_bytes for t in (layer_tensors(c, ctx + 1, 1, self.kvd, self.selected.rules, self.model_dt))) \
                - sum(t.total_bytes for t in layer_tensors(c, ctx, 1, self.kvd, self.selected.rules, self.model_dt))
            dtype = "state" if c.kind in ("mamba_state", "linear_state") else self.kvd.label
            groups.append(PlanGroup(
                kind=c.kind, layer_ids=g.layer_ids, tokens=tokens_held(c, ctx), dtype=dtype, bytes=nbytes,
                bytes_per_token=one_token * len(g.layer_ids) if grows else 0, tensors=tensors,
                description=c.describe(), **geometry(c, 1),
            ))
        total = sum(g.bytes for g in groups)
        return CachePlan(self.selected.label, Request(ctx, batch), tuple(groups), total, self.assumptions, 0,
                         {"layout": "DynamicCache"})


def prepare(spec: ModelSpec, tp: int, pp: int, kvd: KVDtypes, selected: Selected[Rules], opts: dict[str, Any],
            **_: Any) -> Prepared:
    if tp > 1 or pp > 1:
        raise InputError("the hf engine (transformers generate) runs the model on one device; --tp/--pp apply to "
                         "vllm, sglang, trtllm (and --pp to llamacpp)")
    model_dt = kvd.k
    notes = [f"{selected.label} DynamicCache after one forward of ctx tokens (no preallocation, no paging)"]
    if spec.dtype is None:
        notes.append("the config names no dtype: transformers would take the checkpoint's; bf16 assumed")
    if selected.note:
        notes.append(selected.note)
    if any(c.kind == "sliding" for _, c in spec.caches):
        notes.append("sliding layers keep window-1 tokens (DynamicSlidingWindowLayer)")
    if any(c.kind == "mla" for _, c in spec.caches):
        notes.append("MLA cached as the latent (512 + 64) since transformers 5.15" if selected.rules.mla_latent
                     else "MLA cached as decompressed K/V (transformers <= 5.14)")
    if any(c.kind in ("mamba_state", "linear_state") for _, c in spec.caches):
        notes.append(f"conv state at full kernel width in {model_dt.name}, SSM/recurrent state in "
                     f"{(kvd.state or dtypes.KV_DTYPES['fp32']).name}")
    return Prepared(selected, spec, kvd, tuple(notes), model_dt)


# ---------------------------------------------------------------------------------------------- budget, capacity
def budget(prepared: Prepared, spec: ModelSpec, gpu, stage: int, weights: int, opts: dict[str, Any],
           reserve: int | None, dtype_bytes: int):
    """transformers: weights + cache + activations in one process, no paging; activations depend on the batch,
    so the budget here excludes them and fits() charges them per request shape."""
    from kvplan.engines import base, overhead

    other = reserve if reserve is not None else overhead.CUDA_CONTEXT_BYTES
    parts = (("total", gpu.cuda_total), ("weights", -weights),
             ("reserve (--reserve)" if reserve is not None else "CUDA context (estimate)", -other))
    return base.Budget(gpu.cuda_total - weights - other, parts,
                       ("activations of the prefill are charged per batch x ctx (engines/overhead.py)",))


def fits(prepared: Prepared, ctx: int, batch: int, budgets: list[int]) -> bool:
    from kvplan.engines import overhead

    act = overhead.hf_activation(prepared.spec, batch, ctx, prepared.kvd.k.block_bytes)
    return prepared.plan(ctx, batch).kv_bytes + act <= budgets[0]


def max_batch(prepared: Prepared, ctx: int, budgets: list[int]) -> int:
    from kvplan.engines import base

    return max(0, base.largest(1, 1 << 16, lambda b: fits(prepared, ctx, b, budgets)))


def capacity(prepared: Prepared, spec: ModelSpec, ctx: int, budgets: list[int], opts: dict[str, Any],
             gpu, max_model_len: int | None):
    from kvplan.engines import base

    b = max_batch(prepared, ctx, budgets)
    tokens = max(0, base.largest(1, max(max_model_len or 0, ctx) * 4, lambda c: fits(prepared, c, 1, budgets)))
    return base.Capacity(b, tokens, float(b), None, b > 0, None if b else "one sequence does not fit next to the weights")
