"""transformers DynamicCache (engines.md §4): one K and one V tensor [batch, kv_heads, tokens, head_dim] per
layer in the compute dtype, no paging, no tensor parallelism.

Sliding layers keep the last window-1 tokens after an update (DynamicSlidingWindowLayer); chunked Llama-4 layers
use the same class with window = attention_chunk_size. MLA caches decompressed K/V up to 5.14 and the latent
from 5.15. Mamba/linear layers keep a conv window of the full kernel width in the compute dtype and the
recurrent/SSM state in fp32. DeepSeek-V4 (models/deepseek_v4) keeps its window, compressed entries and compressor
buffers in DeepseekV4HCACache / DeepseekV4CSACache; MiniMax-M3 (models/minimax_m3_vl) its index keys in
MiniMaxM3VLSparseCacheLayer.
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
from kvplan.spec import (ChunkedLocal, CompressedIndexerKeys, CompressedLatent, CompressorState, CrossAttention,
                         FullAttention, IndexerKeys, KimiDeltaState, LatentAttention, LayerCache, LightningState,
                         LinearAttentionState, MambaState, ModelSpec, MsaIndexerKeys, NoCache, RecurrentState, SharedKV,
                         ShortConvState, SlidingLatent, SlidingWindow, SparseLatentAttention, WindowBeyondContext)


@dataclass(frozen=True)
class Rules:
    mla_latent: bool  # >= 5.15 caches the MLA latent (kv_nope 512 as "keys", k_rot 64 as "values")


VERSIONS = [("4.57", Rules(mla_latent=False)), ("5.15", Rules(mla_latent=True))]
# The model code a rule set has: native models/kimi_linear (newer than 5.15.1; before it, Hub remote code only),
# models/deepseek_v4 and models/minimax_m3_vl (both in 5.15.1 with the cache classes 5.24 has; not in 4.57)
COVERAGE: dict[type, layout.Coverage] = {
    SlidingLatent: layout.Coverage((("5.15", None),), "hf@{version} has no DeepSeek-V4 model code (models/deepseek_v4 "
                                   "is newer; 5.15.1 has it); --engine hf (the newest rules) plans it"),
    MsaIndexerKeys: layout.Coverage((("5.15", None),), "hf@{version} has no MiniMax-M3 model code "
                                    "(models/minimax_m3_vl is newer; 5.15.1 has it); --engine hf (the newest rules) "
                                    "plans it"),
}
KDA_SINCE = layout.Coverage((("5.15", None),), "hf@{version} has no Kimi Linear model code (transformers' "
                            "models/kimi_linear is newer than 5.15.1; before it Kimi Linear ran as Hub remote code); "
                            "--engine hf (the newest rules) plans it")
# Remote-code model types transformers runs as one of its native classes (the -hf checkpoints): type -> native type
SIZED_AS_NATIVE = {"minimax_text_01": "minimax", "minimax_m1": "minimax"}
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
        if not KDA_SINCE.covers(p.selected.version):
            raise layout.UnsupportedKind(KDA_SINCE.message.format(version=p.selected.version))
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


class MsaIndexLayer(KVLayer):
    """MiniMax-M3 as transformers builds it (models/minimax_m3_vl, model_type minimax_m3_vl_text): a layer whose
    layer_types entry is minimax_m3_sparse (sparse_attention_freq 1) gets MiniMaxM3VLSparseCacheLayer, a DynamicLayer
    (its K/V: the FullAttention rule) whose update_index concatenates the indexer's key, idx_keys
    [batch, 1, tokens, index_head_dim], in the compute dtype (k_proj -> k_norm -> rotary, all type_as the input)."""

    def tokens(self, c: MsaIndexerKeys, ctx: int) -> int:
        return ctx

    def tensors(self, c: MsaIndexerKeys, ctx: int, batch: int, p: "Prepared") -> list:
        return [tensor("idx_keys", (batch, 1, ctx, c.head_dim), p.model_dt)]


# ---------------------------------------------------------------------------------------------- DeepSeek-V4
# transformers models/deepseek_v4 (5.24; the same cache classes in 5.15.1). DynamicCache(config) builds, from
# layer_types (compress_ratios 0 / 4 / 128 -> sliding_attention / compressed_sparse_attention /
# heavily_compressed_attention), a DynamicSlidingWindowLayer, a DeepseekV4CSACache or a DeepseekV4HCACache per layer.
# What one forward of ctx tokens leaves there (each tensor in the compute dtype unless said):
# - window-only layers: keys and values apart, [batch, 1, min(ctx, window - 1), head_dim] each (hf_caches plans
#   them as the SlidingWindow they are);
# - compressed layers (DeepseekV4HCACache.update): the same window once, `keys` (values is the same tensor);
# - store_compression_weights keeps the projected tokens no window has closed over yet, buffer_kv and buffer_gate
#   [batch, ctx % ratio, kv_proj width] (width 2 x head_dim for ratio 4, head_dim for 128; the indexer's
#   2 x index_head_dim);
# - update_compressor_states: compressed_kv [batch, ctx // ratio, head_dim] (the indexer's: index_head_dim);
# - ratio 4 only (DeepseekV4CSACache.update_overlap_state, once a window has closed): the last window's first half,
#   overlap_kv [batch, ratio, head_dim] and overlap_gate of the same shape in fp32 (the gate plus the fp32
#   position_bias parameter).
# Not monotone in ctx: when a window closes, its buffered tokens become one entry. Bytes are the tensors' own sizes,
# as for every layout here; right after the forward the window and buffer slices are views that still hold the
# storage of the whole prompt's projections, until the next update concatenates them into new tensors.
def hf_caches(caches: layout.Caches) -> layout.Caches:
    """DeepSeek-V4's window-only layers (no compressed entries) as the plain sliding layer transformers gives them."""
    compressed = {i for i, c in caches if isinstance(c, CompressedLatent)}
    return tuple((i, SlidingWindow(1, c.dim, c.dim, window=c.window)) if type(c) is SlidingLatent and i not in compressed
                 else (i, c) for i, c in caches)


@dataclass(frozen=True)
class SharedWindowLayer(KVLayer):
    """A compressed layer's window: the K=V vector once, keys [batch, 1, min(ctx, window - 1), dim]."""

    def tokens(self, c: SlidingLatent, ctx: int) -> int:
        return min(ctx, c.window - 1)

    def tensors(self, c: SlidingLatent, ctx: int, batch: int, p: "Prepared") -> list:
        return [tensor("keys", (batch, 1, self.tokens(c, ctx), c.dim), p.model_dt)]


@dataclass(frozen=True)
class CompressedEntriesLayer(KVLayer):
    """compressed_kv[name]: one entry per closed window of `ratio` tokens (tokens = the ones they cover)."""

    name: str = "compressor"

    def tokens(self, c: CompressedLatent | CompressedIndexerKeys, ctx: int) -> int:
        return ctx // c.ratio * c.ratio

    def tensors(self, c: CompressedLatent | CompressedIndexerKeys, ctx: int, batch: int, p: "Prepared") -> list:
        width = c.head_dim if isinstance(c, IndexerKeys) else c.dim
        return [tensor(f"compressed_kv[{self.name}]", (batch, ctx // c.ratio, width), p.model_dt)]


@dataclass(frozen=True)
class CompressorBufferLayer(KVLayer):
    """A compressor's tokens waiting for their window to close (kv and gate; tokens = ctx % ratio), and for
    overlapping windows (window = 2 x ratio: ratio 4) the closed window's first half, kv and an fp32 gate.
    CompressorState.width is the kv + gate width per token (vLLM's fp32 state row), so kv_proj is width / 2 wide."""

    def tokens(self, c: CompressorState, ctx: int) -> int:
        return ctx % c.ratio

    def tensors(self, c: CompressorState, ctx: int, batch: int, p: "Prepared") -> list:
        name = "indexer" if _is_indexer_state(c, p.spec) else "compressor"
        proj = c.width // 2
        out = [tensor(f"buffer_kv[{name}]", (batch, ctx % c.ratio, proj), p.model_dt),
               tensor(f"buffer_gate[{name}]", (batch, ctx % c.ratio, proj), p.model_dt)]
        if c.window == 2 * c.ratio and ctx >= c.ratio:
            out += [tensor(f"overlap_kv[{name}]", (batch, c.ratio, proj // 2), p.model_dt),
                    tensor(f"overlap_gate[{name}]", (batch, c.ratio, proj // 2), dtypes.KV_DTYPES["fp32"])]
        return out


def _is_indexer_state(c: CompressorState, spec: ModelSpec) -> bool:
    """The indexer's compressor state (2 x 2 x index_head_dim wide) rather than the layer's own (2 x 2 x head_dim)."""
    return any(isinstance(x, CompressedIndexerKeys) and x.ratio == c.ratio and c.width == 4 * x.head_dim
               for _, x in spec.caches)


KIND_RULES: dict[type, Any] = {
    FullAttention: KVLayer(),
    WindowBeyondContext: KVLayer(),  # a window beyond the context is full attention here
    SlidingWindow: KVLayer(keep=True),
    ChunkedLocal: KVLayer(keep=True),  # Llama-4: the same class with window = attention_chunk_size
    CrossAttention: KVLayer(fixed=True),
    LatentAttention: LatentLayer(),
    SparseLatentAttention: LatentLayer(),
    IndexerKeys: IndexerLayer(),
    MsaIndexerKeys: MsaIndexLayer(),
    MambaState: StateLayer("ssm_states"),
    LinearAttentionState: StateLayer("recurrent_states"),
    KimiDeltaState: KimiStateLayer("recurrent_states"),
    ShortConvState: ShortConvStateLayer("conv_states"),
    LightningState: LightningStateLayer("linear_cache"),
    SharedKV: layout.NO_CACHE,
    NoCache: layout.NO_CACHE,
    SlidingLatent: SharedWindowLayer(),
    CompressedLatent: CompressedEntriesLayer(name="compressor"),
    CompressedIndexerKeys: CompressedEntriesLayer(name="indexer"),
    CompressorState: CompressorBufferLayer(),
}


@dataclass(frozen=True)
class Prepared(layout.StagedLayout):
    selected: Selected[Rules]
    spec: ModelSpec
    kvd: KVDtypes
    assumptions: tuple[str, ...]
    model_dt: Any
    caches: layout.Caches = ()  # the spec's caches as transformers builds them (hf_caches)
    tp: int = 1
    pp: int = 1

    @property
    def label(self) -> str:
        return self.selected.label

    @property
    def stages(self) -> tuple[layout.Caches, ...]:
        return (self.caches,)

    @property
    def gpus_per_stage(self) -> int:
        return 1

    def _bytes(self, rule, c: LayerCache, ctx: int, batch: int) -> int:
        return sum(t.total_bytes for t in rule.tensors(c, ctx, batch, self))

    def groups_of(self, ctx: int, batch: int, stage: int) -> list[PlanGroup]:
        out = []
        for c, layers, rule in layout.groups(ENGINE.name, KIND_RULES, self.caches):
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
    layout.check_coverage(COVERAGE, spec.caches, selected.version)
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
        if spec.model_type in SIZED_AS_NATIVE:
            notes.append(f"model_type {spec.model_type} is Hub remote code: sized as transformers' native MiniMax "
                         f"class (model_type {SIZED_AS_NATIVE[spec.model_type]}, the -hf checkpoints) builds it")
    if any(issubclass(k, RecurrentState) and k is not LightningState for k in kinds):
        notes.append(f"conv state at full kernel width in {model_dt.name}, SSM/recurrent state in "
                     f"{(kvd.state or dtypes.KV_DTYPES['fp32']).name}")
    if SlidingLatent in kinds:
        notes.append("DeepSeek-V4 (models/deepseek_v4): window-only layers keep K and V of window-1 tokens; compressed "
                     "layers the window's K=V once, one entry per ratio tokens (+ indexer keys at ratio 4), the tokens "
                     "of the open window (kv + gate) and at ratio 4 the last window's half (kv + fp32 gate); this "
                     "shrinks when a window closes")
    if MsaIndexerKeys in kinds:
        notes.append("MiniMax-M3 as transformers' minimax_m3_vl_text (MiniMaxM3VLForCausalLM): sparse layers keep "
                     "idx_keys [batch, 1, tokens, index_head_dim] beside K/V")
    return Prepared(selected, spec, kvd, tuple(notes), model_dt, hf_caches(spec.caches))


# ---------------------------------------------------------------------------------------------- budget, capacity
def budget(prepared: Prepared, spec: ModelSpec, gpu, stage: int, weights: int, opts: dict[str, Any],
           reserve: int | None, dtype_bytes: int):
    """transformers: weights + cache + activations in one process, no paging; activations depend on the batch,
    so the budget here excludes them and fits() charges them per request shape."""
    from kvplan.engines import base, overhead

    other = reserve if reserve is not None else overhead.CUDA_CONTEXT_BYTES
    parts = (base.BudgetPart("total", "total", gpu.cuda_total), base.BudgetPart("weights", "weights", -weights),
             base.BudgetPart("reserve", "reserve (--reserve)", -other) if reserve is not None
             else base.BudgetPart("cuda_context", "CUDA context (estimate)", -other))
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
