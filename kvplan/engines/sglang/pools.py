"""SGLang's pools per cache kind (KIND_RULES): the token pools (MHA, MLA, DSA latent and index keys) a layer's tokens
occupy, and the Mamba state slots a running request holds; each rule sizes its layers' buffers for a plan."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kvplan import dtypes
from kvplan.engines import layout
from kvplan.engines.base import KVDtypes, PlanGroup, tensor
from kvplan.engines.sglang import dsv4
from kvplan.engines.sglang.rules import ENGINE, STATE_COVERAGE
from kvplan.errors import InputError
from kvplan.parallel import heads_floor, pad_to
from kvplan.spec import (ChunkedLocal, CrossAttention, FullAttention, IndexerKeys, KimiDeltaState, LatentAttention,
                         LayerCache, LightningState, LinearAttentionState, MambaState, ModelSpec, MsaIndexerKeys,
                         NoCache, RecurrentState, SharedKV, ShortConvState, SlidingWindow, SparseLatentAttention,
                         WindowBeyondContext)

if TYPE_CHECKING:
    from kvplan.engines.sglang.prepared import Prepared


def _not_read(kind: type, p: "Prepared") -> None:
    cov = STATE_COVERAGE[kind]
    if not cov.covers(p.selected.version):
        raise layout.UnsupportedKind(cov.message.format(version=p.selected.version))


@dataclass(frozen=True)
class TokenPool:
    """MHATokenToKVPool: per layer K [(N + page), H_kv, D_k] and V [(N + page), H_kv, D_v]; a request holds
    `tokens` rows of each, rounded up to the page. pool: the hybrid-SWA pool these layers join ("full" or "swa";
    "cross" joins neither); fixed: cross attention holds the encoder's length whatever the context."""

    pool: str = "full"
    fixed: bool = False

    def tokens(self, c: FullAttention, ctx: int, p: "Prepared") -> int:
        if p.encoder_tokens:  # the request's vision tokens sit in the same pool as its text (Prepared.encoder_tokens)
            return ctx + p.encoder_tokens
        if self.fixed:
            return c.span
        if self.pool == "swa" and p.hybrid_swa:
            return min(ctx, c.span)
        return ctx

    def token_bytes(self, c: FullAttention, p: "Prepared") -> int:
        k, v = c.token_elems(heads_floor(c.kv_heads, p.tp))
        return p.kvd.k.nbytes(k) + p.kvd.v.nbytes(v)

    def tensors(self, c: FullAttention, rows: int, n: int, p: "Prepared") -> tuple:
        h = heads_floor(c.kv_heads, p.tp)
        return (tensor("k_buffer", (rows, h, c.head_dim_k), p.kvd.k, n),
                tensor("v_buffer", (rows, h, c.head_dim_v), p.kvd.v, n))

    def dtype_label(self, kvd: KVDtypes) -> str:
        return kvd.label

    def group(self, c: FullAttention, layers: list[int], ctx: int, batch: int, p: "Prepared") -> PlanGroup:
        held = pad_to(self.tokens(c, ctx, p), p.page)
        tensors = self.tensors(c, batch * held + p.page, len(layers), p)  # pools allocate size + page_size rows
        grows = self.tokens(c, ctx + 1, p) > self.tokens(c, ctx, p)
        return PlanGroup(
            kind=c.kind, layer_ids=tuple(layers), tokens=held, dtype=self.dtype_label(p.kvd),
            bytes=sum(t.total_bytes for t in tensors), bytes_per_token=self.token_bytes(c, p) * len(layers) if grows else 0,
            tensors=tensors, description=c.describe(), **layout.geometry(c, p.tp, ENGINE.heads_per_gpu),
        )


@dataclass(frozen=True)
class LatentPool(TokenPool):
    """MLATokenToKVPool: one [(N + page), 1, kv_lora_rank + rope] buffer per layer, in the K dtype."""

    def tokens(self, c: LatentAttention, ctx: int, p: "Prepared") -> int:
        return ctx

    def token_bytes(self, c: LatentAttention, p: "Prepared") -> int:
        return p.kvd.k.nbytes(c.latent_dim)

    def tensors(self, c: LatentAttention, rows: int, n: int, p: "Prepared") -> tuple:
        return (tensor("kv_buffer (latent)", (rows, 1, c.latent_dim), p.kvd.k, n),)

    def dtype_label(self, kvd: KVDtypes) -> str:
        return kvd.k.name


@dataclass(frozen=True)
class SparseLatentPool(LatentPool):
    """DSATokenToKVPool's latent buffer (mem_cache/memory_pool.py): fp8 is stored as a uint8 record of the fp8
    latent, one fp32 scale per 128 and the RoPE part in bf16 (512 + 16 + 128 = 656 B), except where the DSA
    backend reads the plain layout (trtllm on Blackwell in 0.5.23)."""

    def token_bytes(self, c: SparseLatentAttention, p: "Prepared") -> int:
        if p.kvd.k.below_16_bits and not p.dsa_plain_fp8:
            return c.fp8_record_bytes
        return p.kvd.k.nbytes(c.latent_dim)

    def tensors(self, c: SparseLatentAttention, rows: int, n: int, p: "Prepared") -> tuple:
        if p.kvd.k.below_16_bits and not p.dsa_plain_fp8:
            return (tensor("kv_buffer (fp8 latent + scales + bf16 rope)", (rows, 1, self.token_bytes(c, p)), "uint8", n),)
        return super().tensors(c, rows, n, p)

    def dtype_label(self, kvd: KVDtypes) -> str:
        return kvd.k.name + ("+scales" if kvd.k.below_16_bits else "")


@dataclass(frozen=True)
class IndexKeyPool(LatentPool):
    """DSA indexer keys (mem_cache/index_key_cache.py): per layer (pages, page x 132) uint8 with pages =
    (pool size + page + 1) // page; counted in the cell size (pool_configurator.py _compute_dsa_indexer_cell_size)."""

    def token_bytes(self, c: IndexerKeys, p: "Prepared") -> int:
        return c.fp8_record_bytes

    def tensors(self, c: IndexerKeys, rows: int, n: int, p: "Prepared") -> tuple:
        pages = (rows + 1) // p.page  # rows = pool size + one page
        return (tensor("index_k_with_scale_buffer", (pages, p.page * c.fp8_record_bytes), "uint8", n),)

    def dtype_label(self, kvd: KVDtypes) -> str:
        return "fp8+scales"


# The config classes that pass themselves to mamba2_state_dtype (0.5.10 and 0.5.23 configs/: qwen3_next.py, whose
# Qwen3_5TextConfig inherits it, nemotron_h.py, falcon_h1.py, lfm2.py), so a config's mamba_ssm_dtype (its
# text_config's for Qwen3.5) sets the SSM state dtype; granitemoehybrid, lfm2_moe and kimi_linear take the default.
READS_CONFIG_SSM_DTYPE = frozenset({"qwen3_next", "qwen3_5", "qwen3_5_moe", "qwen3_5_text", "qwen3_5_moe_text",
                                    "nemotron_h", "falcon_h1", "lfm2"})
_SSM_DTYPE_NAMES = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}


def config_ssm_dtype(spec: ModelSpec) -> tuple[dtypes.DType, str]:
    """SGLang's SSM state dtype: the config's mamba_ssm_dtype where its config class reads it (a value outside
    float32 / bfloat16 / float16 is warned about and left at the default), else float32."""
    written = dict(spec.config_state_dtypes).get("mamba_ssm_dtype")
    if spec.model_type in READS_CONFIG_SSM_DTYPE and written in _SSM_DTYPE_NAMES:
        return dtypes.KV_DTYPES[_SSM_DTYPE_NAMES[written]], f"the config's mamba_ssm_dtype {written}"
    return dtypes.KV_DTYPES["fp32"], ""


@dataclass(frozen=True)
class StateSlots:
    """MambaPool: one state slot per running request, conv window kernel-1 in the model dtype and the SSM
    state in fp32 (--mamba-ssm-dtype default)."""

    pool: str = "state"
    fixed: bool = True

    def token_bytes(self, c: RecurrentState, p: "Prepared") -> int:
        return 0

    def group(self, c: RecurrentState, layers: list[int], ctx: int, batch: int, p: "Prepared") -> PlanGroup:
        n = len(layers)
        tensors = (tensor("conv_state", (batch, *c.conv_shape(p.tp)), p.state[0], n),
                   tensor("ssm_state", (batch, *c.ssm_shape_for(p.tp)), p.state[1], n))
        return PlanGroup(c.kind, tuple(layers), None, None, None, None, 0, "state",
                         sum(t.total_bytes for t in tensors), 0, tensors, c.describe())


@dataclass(frozen=True)
class ShortConvSlots(StateSlots):
    """LFM2's conv layers in MambaPool (configs/lfm2.py, lfm2_moe.py mamba2_cache_params, 0.5.10): a
    Mamba2StateShape of hidden_size channels, n_groups 1 and state_size 0, so conv (hidden / tp, L_cache - 1) in the
    conv dtype and a temporal state (1, hidden, 0) of no bytes."""

    def group(self, c: ShortConvState, layers: list[int], ctx: int, batch: int, p: "Prepared") -> PlanGroup:
        _not_read(ShortConvState, p)
        if c.conv_dim % p.tp:
            raise InputError(f"--tp {p.tp} does not divide the model's hidden_size {c.conv_dim} (SGLang's "
                             "Mamba2StateShape divides the conv width exactly)")
        n = len(layers)
        tensors = (tensor("conv_state", (batch, *c.conv_shape(p.tp)), p.state[0], n),)
        return PlanGroup(c.kind, tuple(layers), None, None, None, None, 0, "state",
                         sum(t.total_bytes for t in tensors), 0, tensors, c.describe())


@dataclass(frozen=True)
class KdaSlots(StateSlots):
    """Kimi Delta Attention in MambaPool (configs/mamba_utils.py KimiLinearStateShape, 0.5.10): conv (kernel - 1,
    3 x heads x head_dim / tp) and temporal (heads / tp, head_dim, head_dim) per request, in
    KimiLinearCacheParams' default dtypes (mamba2_state_dtype(None): conv SGLANG_MAMBA_CONV_DTYPE = bfloat16,
    temporal fp32) - StateSlots' shapes. The MLA layers join HybridLinearKVPool's MLATokenToKVPool (LatentPool).
    SGLang has no Kimi-K3 model (no KimiK3ForConditionalGeneration; its KimiLinear layer has no full-rank gate)."""

    def group(self, c: KimiDeltaState, layers: list[int], ctx: int, batch: int, p: "Prepared") -> PlanGroup:
        if c.full_rank_gate:
            raise layout.UnsupportedKind("SGLang (0.5.10) has no Kimi-K3 model: no KimiK3ForConditionalGeneration, "
                                         "and its Kimi Linear layer builds no full-rank KDA gate")
        _not_read(KimiDeltaState, p)
        if c.num_v_heads % p.tp:
            raise InputError(f"--tp {p.tp} does not divide the model's {c.num_v_heads} KDA heads (SGLang's "
                             "KimiLinearStateShape divides them by the attention TP size)")
        return super().group(c, layers, ctx, batch, p)


KIND_RULES: dict[type, Any] = {
    FullAttention: TokenPool("full"),
    WindowBeyondContext: TokenPool("full"),  # a window beyond the context is full attention here
    SlidingWindow: TokenPool("swa"),
    ChunkedLocal: TokenPool("swa"),
    CrossAttention: TokenPool("cross", fixed=True),
    LatentAttention: LatentPool("full"),
    SparseLatentAttention: SparseLatentPool("full"),
    IndexerKeys: IndexKeyPool("full"),
    MsaIndexerKeys: layout.Unsupported("SGLang 0.5.10 has no MiniMax-M3 model (no minimax_m3 file in srt/models)"),
    MambaState: StateSlots(),
    LinearAttentionState: StateSlots(),
    KimiDeltaState: KdaSlots(),
    ShortConvState: ShortConvSlots(),
    LightningState: layout.Unsupported("SGLang 0.5.10 has no MiniMax-Text-01 / MiniMax-M1 model (srt/models; its "
                                       "lightning-attention pool serves BailingMoeV2_5 only, model_runner.py "
                                       "hybrid_lightning_config)"),
    SharedKV: layout.NO_CACHE,
    NoCache: layout.NO_CACHE,
    # DeepSeek-V4 (0.5.23 only: 0.5.10 refuses the family in prepare): DeepSeekV4TokenToKVPool (dsv4.py)
    **dict.fromkeys(layout.DEEPSEEK_V4_CACHES, dsv4.DSV4_RULE),
}


def rule_of(c: LayerCache):
    return layout.rule_for(ENGINE.name, KIND_RULES, c)


def pooled(c: LayerCache) -> bool:
    """Layers whose tokens occupy the token pool (attention and latent kinds)."""
    return isinstance(rule_of(c), TokenPool)

