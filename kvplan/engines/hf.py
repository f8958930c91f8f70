"""transformers DynamicCache (engines.md §4): one K and one V tensor [batch, kv_heads, tokens, head_dim] per
layer in the compute dtype, no paging, no tensor parallelism.

Sliding layers keep the last window-1 tokens after an update (DynamicSlidingWindowLayer); chunked Llama-4 layers
use the same class with window = attention_chunk_size. MLA caches decompressed K/V up to 5.14 and the latent
from 5.15. Mamba/linear layers keep a conv window of the full kernel width in the compute dtype and the
recurrent/SSM state in fp32.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvplan import dtypes
from kvplan.engines import base, layout
from kvplan.engines.base import EngineInfo, KVDtypes, PlanGroup, tensor
from kvplan.engines.listing import LISTINGS
from kvplan.engines.versions import Selected, select
from kvplan.errors import InputError
from kvplan.parallel import heads_unsplit
from kvplan.spec import (MsaIndexerKeys, ChunkedLocal, CrossAttention, FullAttention, IndexerKeys, LatentAttention, LayerCache,
                         KimiDeltaState, LightningState, LinearAttentionState, MambaState, ModelSpec, NoCache,
                         RecurrentState, SharedKV, ShortConvState, SlidingWindow, SparseLatentAttention,
                         WindowBeyondContext)


@dataclass(frozen=True)
class Rules:
    mla_latent: bool  # >= 5.15 caches the MLA latent (kv_nope 512 as "keys", k_rot 64 as "values")
    kimi_linear: bool = True  # native models/kimi_linear (newer than 5.15.1; before it, Hub remote code only)


VERSIONS = [("4.57", Rules(False, kimi_linear=False)), ("5.15", Rules(True))]
KV_DTYPES = ("fp16", "bf16", "fp32")  # cache dtypes this engine can store
LISTED = LISTINGS["hf"]
KNOBS = LISTED.knobs


def load_dtype(spec: ModelSpec):
    """from_pretrained(dtype="auto"): the config's dtype. A config that names none leaves transformers to read
    the checkpoint's first floating-point tensor, which a config cannot show: bf16 is assumed (and stated)."""
    return dtypes.KV_DTYPES[spec.dtype or "bf16"]


ENGINE = EngineInfo(
    name=LISTED.name, aliases=LISTED.aliases, summary=LISTED.summary, versions=VERSIONS, kv_dtypes=KV_DTYPES,
    knobs=KNOBS, default_kv_dtype=load_dtype, honours_checkpoint_kv=False, uses_vllm_max_ctx=False,
    weight_float_dtype=load_dtype, heads_per_gpu=heads_unsplit,
)


def select_version(requested: str | None) -> Selected[Rules]:
    return select(ENGINE.name, requested, VERSIONS)


# ---------------------------------------------------------------------------------------------- kind rules
@dataclass(frozen=True)
class KVLayer:
    """DynamicLayer: keys and values [batch, kv_heads, tokens, head_dim]. keep: a sliding layer
    (DynamicSlidingWindowLayer) keeps its last span - 1 tokens; fixed: cross attention keeps the encoder's."""

    keep: bool = False
    fixed: bool = False

    def tokens(self, c: FullAttention, ctx: int) -> int:
        if self.fixed:
            return c.span
        span = getattr(c, "hf_window", 0) or c.span
        return min(ctx, span - 1) if self.keep else ctx

    def tensors(self, c: FullAttention, ctx: int, batch: int, p: "Prepared") -> list:
        s = self.tokens(c, ctx)
        return [tensor("keys", (batch, c.kv_heads, s, c.head_dim_k), p.kvd.k),
                tensor("values", (batch, c.kv_heads, s, c.head_dim_v), p.kvd.v)]

    def dtype_label(self, p: "Prepared") -> str:
        return p.kvd.label


@dataclass(frozen=True)
class LatentLayer(KVLayer):
    """MLA: the latent (kv_lora_rank as keys, the rope key as values) since 5.15; decompressed K/V before."""

    def tokens(self, c: LatentAttention, ctx: int) -> int:
        return ctx

    def tensors(self, c: LatentAttention, ctx: int, batch: int, p: "Prepared") -> list:
        if p.selected.rules.mla_latent:
            return [tensor("keys (kv latent)", (batch, 1, ctx, c.kv_lora_rank), p.kvd.k),
                    tensor("values (k_rot)", (batch, 1, ctx, c.rope_dim), p.kvd.v)]
        return [tensor("keys", (batch, c.num_heads, ctx, c.qk_nope_head_dim + c.rope_dim), p.kvd.k),
                tensor("values", (batch, c.num_heads, ctx, c.v_head_dim), p.kvd.v)]


@dataclass(frozen=True)
class IndexerLayer(KVLayer):
    """DSA (DeepseekV32 / GlmMoeDsa model code): DynamicIndexedLayer.indexer_keys [batch, tokens, index_head_dim]
    beside the layer's latent, in the compute dtype (cache_utils.py), on layers that run their own indexer."""

    def tokens(self, c: IndexerKeys, ctx: int) -> int:
        return ctx

    def tensors(self, c: IndexerKeys, ctx: int, batch: int, p: "Prepared") -> list:
        if not p.selected.rules.mla_latent:
            raise InputError(f"{p.selected.label} has no DeepSeek sparse attention model code (deepseek_v32, "
                             "glm_moe_dsa); --engine hf@5.15 or later plans it")
        return [tensor("indexer_keys", (batch, ctx, c.head_dim), p.kvd.k)]


@dataclass(frozen=True)
class StateLayer:
    """Mamba / linear-attention cache: a conv window of the full kernel width in the compute dtype, and the
    recurrent/SSM state in fp32."""

    name: str = "ssm_states"

    def tokens(self, c: RecurrentState, ctx: int) -> int:
        return 0

    def tensors(self, c: RecurrentState, ctx: int, batch: int, p: "Prepared") -> list:
        conv = p.kvd.state or p.model_dt
        ssm = p.kvd.state or dtypes.KV_DTYPES["fp32"]
        return [tensor("conv_states", (batch, c.conv_dim, c.conv_kernel), conv),
                tensor(self.name, (batch, *c.ssm_shape), ssm)]

    def dtype_label(self, p: "Prepared") -> str:
        return "state"


@dataclass(frozen=True)
class KimiStateLayer(StateLayer):
    """Kimi Delta Attention (models/kimi_linear KimiLinearDeltaAttention): one conv window over q, k and v together
    [batch, 3 x heads x head_dim, kernel] in the compute dtype (cache.update_conv_state keeps the last kernel
    columns) and the recurrent [batch, heads, head_dim, head_dim] cast to fp32 (update_recurrent_state(
    last_recurrent_state.to(torch.float32))): StateLayer's shapes; its MLA layers cache the latent (LatentLayer).
    The native class is newer than 5.15.1 (before it Kimi Linear ran as Hub remote code kvplan has not read), and it
    has no Kimi-K3 layer: K3 is model_type kimi_k3, remote code only (modeling_kimi_k3), and the KimiLinear class
    builds neither K3's full-rank gate nor its 'situ' activation."""

    def tensors(self, c: KimiDeltaState, ctx: int, batch: int, p: "Prepared") -> list:
        if c.full_rank_gate:
            raise layout.UnsupportedKind("transformers has no Kimi-K3 model code (model_type kimi_k3 is Hub remote "
                                         "code, and its KimiLinear class builds no full-rank KDA gate or 'situ' "
                                         "activation); kvplan has not read that remote code")
        if not p.selected.rules.kimi_linear:
            raise layout.UnsupportedKind(f"{p.selected.label} has no Kimi Linear model code (transformers' "
                                         "models/kimi_linear is newer than 5.15.1; before it Kimi Linear ran as Hub "
                                         "remote code); --engine hf (the newest rules) plans it")
        return super().tensors(c, ctx, batch, p)



@dataclass(frozen=True)
class ShortConvStateLayer(StateLayer):
    """LFM2's conv layers (cache_utils.py LAYER_TYPE_MAPPING "conv" -> LinearAttentionLayer): one conv window
    [batch, hidden, conv_L_cache] in the compute dtype (lazy_initialization keeps the full kernel width); the
    recurrent state is never written (Lfm2ShortConv only calls update_conv_state)."""

    def tensors(self, c: ShortConvState, ctx: int, batch: int, p: "Prepared") -> list:
        return [tensor("conv_states", (batch, c.conv_dim, c.conv_kernel), p.kvd.state or p.model_dt)]


@dataclass(frozen=True)
class LightningStateLayer(StateLayer):
    """MiniMax-01 lightning layers (models/minimax MiniMaxCache.linear_cache): one [batch, heads, head_dim, head_dim]
    tensor per layer, made by MiniMaxLightningAttention.forward as torch.zeros(..., dtype=value_states.dtype) and
    updated in that dtype (the compute dtype); no conv window. The softmax layers keep DynamicLayer K/V. The
    remote-code model types (minimax_text_01, minimax_m1) are sized as this native class builds them (the -hf
    checkpoints), not as their Hub modeling code (which keeps the state in fp32)."""

    def tensors(self, c: LightningState, ctx: int, batch: int, p: "Prepared") -> list:
        return [tensor("linear_cache", (batch, *c.ssm_shape), p.kvd.state or p.model_dt)]


KIND_RULES: dict[type, Any] = {
    FullAttention: KVLayer(),
    WindowBeyondContext: KVLayer(),  # a window beyond the context is full attention here
    SlidingWindow: KVLayer(keep=True),
    ChunkedLocal: KVLayer(keep=True),  # Llama-4: the same class with window = attention_chunk_size
    CrossAttention: KVLayer(fixed=True),
    LatentAttention: LatentLayer(),
    SparseLatentAttention: LatentLayer(),
    IndexerKeys: IndexerLayer(),
    MsaIndexerKeys: layout.NotModelled("transformers 5.24 builds MiniMax-M3's text model only as minimax_m3_vl_text (MiniMaxM3VLForCausalLM, its MiniMaxM3VLSparseCacheLayer keeping the index keys); kvplan has not checked it against that code yet"),
    MambaState: StateLayer("ssm_states"),
    LinearAttentionState: StateLayer("recurrent_states"),
    KimiDeltaState: KimiStateLayer("recurrent_states"),
    ShortConvState: ShortConvStateLayer("conv_states"),
    LightningState: LightningStateLayer("linear_cache"),
    SharedKV: layout.NO_CACHE,
    NoCache: layout.NO_CACHE,
    **layout.DEEPSEEK_V4_NOT_MODELLED,
}


@dataclass(frozen=True)
class Prepared(layout.StagedLayout):
    selected: Selected[Rules]
    spec: ModelSpec
    kvd: KVDtypes
    assumptions: tuple[str, ...]
    model_dt: Any
    tp: int = 1
    pp: int = 1

    @property
    def label(self) -> str:
        return self.selected.label

    @property
    def stages(self) -> tuple[layout.Caches, ...]:
        return (self.spec.caches,)

    @property
    def gpus_per_stage(self) -> int:
        return 1

    def _bytes(self, rule, c: LayerCache, ctx: int, batch: int) -> int:
        return sum(t.total_bytes for t in rule.tensors(c, ctx, batch, self))

    def groups_of(self, ctx: int, batch: int, stage: int) -> list[PlanGroup]:
        out = []
        for c, layers, rule in layout.groups(ENGINE.name, KIND_RULES, self.spec.caches):
            if isinstance(rule, layout.NoCacheRule):
                out.append(layout.no_cache_group(c, layers, self.kvd.label))
                continue
            n = len(layers)
            tensors = tuple(replace(t, count=t.count * n) for t in rule.tensors(c, ctx, batch, self))
            grows = rule.tokens(c, ctx + 1) > rule.tokens(c, ctx)
            one_token = self._bytes(rule, c, ctx + 1, 1) - self._bytes(rule, c, ctx, 1)
            out.append(PlanGroup(
                kind=c.kind, layer_ids=tuple(layers), tokens=rule.tokens(c, ctx), dtype=rule.dtype_label(self),
                bytes=sum(t.total_bytes for t in tensors), bytes_per_token=one_token * n if grows else 0,
                tensors=tensors, description=c.describe(), **layout.geometry(c, 1, ENGINE.heads_per_gpu),
            ))
        return out

    def details(self, ctx: int, batch: int, stage: int) -> dict[str, Any]:
        return {"layout": "DynamicCache"}


def prepare(spec: ModelSpec, tp: int, pp: int, kvd: KVDtypes, selected: Selected[Rules], opts: dict[str, Any],
            gpu: base.GpuContext | None = None) -> Prepared:
    if tp > 1 or pp > 1:
        raise InputError("the hf engine (transformers generate) runs the model on one device; --tp/--pp apply to "
                         "vllm, sglang, trtllm (and --pp to llamacpp)")
    layout.check_rules(ENGINE.name, KIND_RULES, spec.caches)
    model_dt = kvd.k
    kinds = {type(c) for _, c in spec.caches}
    notes = [f"{selected.label} DynamicCache after one forward of ctx tokens (no preallocation, no paging)"]
    if spec.dtype is None:
        notes.append("the config names no dtype: transformers would take the checkpoint's; bf16 assumed")
    if selected.note:
        notes.append(selected.note)
    if SlidingWindow in kinds:
        notes.append("sliding layers keep window-1 tokens (DynamicSlidingWindowLayer)")
    if IndexerKeys in kinds:
        notes.append("DeepSeek sparse attention: indexer keys [batch, tokens, index_head_dim] beside the latent")
    if kinds & {LatentAttention, SparseLatentAttention}:
        notes.append("MLA cached as the latent (512 + 64) since transformers 5.15" if selected.rules.mla_latent
                     else "MLA cached as decompressed K/V (transformers <= 5.14)")
    if LightningState in kinds:
        notes.append(f"lightning-attention state [batch, heads, head_dim, head_dim] in {(kvd.state or model_dt).name} "
                     "(models/minimax MiniMaxCache.linear_cache)")
        if spec.model_type != "minimax":
            notes.append(f"model_type {spec.model_type} is Hub remote code: sized as transformers' native MiniMax "
                         "class (model_type minimax, the -hf checkpoints) builds it")
    if any(issubclass(k, RecurrentState) and k is not LightningState for k in kinds):
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
