"""One class per vLLM KVCacheSpec (vllm/v1/kv_cache_interface.py), each answering for its page and for the tokens a
request must be able to hold, and the per-kind rules (KIND_RULES) that turn a layer's cache into its spec
(get_kv_cache_spec of each attention / Mamba layer class)."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Any, ClassVar

from kvplan import dtypes
from kvplan.dtypes import DType
from kvplan.engines import layout
from kvplan.engines.base import KVDtypes, cdiv
from kvplan.engines.vllm.rules import ENGINE
from kvplan.errors import InputError
from kvplan.parallel import heads_floor
from kvplan.spec import (ChunkedLocal, CompressedIndexerKeys, CompressedLatent, CompressorState, CrossAttention,
                         FullAttention, IndexerKeys, KimiDeltaState, LatentAttention, LayerCache,
                         LightningState, LinearAttentionState, MambaState, MsaIndexerKeys, NoCache, RecurrentState,
                         SharedKV, ShortConvState, SlidingLatent, SlidingWindow, SparseLatentAttention,
                         WindowBeyondContext)


@dataclass(frozen=True)
class VSpec:
    """FullAttentionSpec: one layer's page = block_size tokens x token_bytes on one GPU."""

    block_size: int
    token_bytes: int = 0
    # decode context parallel (AttentionSpec.dcp_sharded): a request's tokens spread over `shards` TP ranks, so
    # it needs cdiv(len, block_size x shards) blocks on each (max_num_blocks_per_req)
    shards: int = field(default=1, kw_only=True)
    # DeepSeek-V4 (kv_cache_interface.py MLAAttentionSpec / SlidingWindowMLASpec): one stored entry per
    # `per_state` tokens (num_states = block_size // tokens_per_state), the page padded up to `align` bytes
    # (_apply_alignment_padding; 576 for fp8_ds_mla)
    per_state: int = field(default=1, kw_only=True)
    align: int = field(default=0, kw_only=True)
    label: str = field(default="", kw_only=True)  # a record that is not a plain dtype (fp8_ds_mla, fp8+scales)

    is_state: ClassVar[bool] = False

    @property
    def page(self) -> int:
        raw = self.block_size // self.per_state * self.token_bytes
        return cdiv(raw, self.align) * self.align if self.align else raw

    def reserved_tokens(self, max_len: int, inflight: int) -> int:
        """Tokens a request of max_len must be able to hold (before block rounding)."""
        return max_len

    def blocks(self, max_len: int, inflight: int) -> int:
        return cdiv(self.reserved_tokens(max_len, inflight), self.block_size * self.shards)

    def held_tokens(self, max_len: int, inflight: int) -> int:
        """Tokens the request's blocks hold on one GPU (what the plan reports per sequence)."""
        return self.blocks(max_len, inflight) * self.block_size

    def grows(self, ctx: int, inflight: int) -> bool:
        return self.reserved_tokens(ctx + 1, inflight) > self.reserved_tokens(ctx, inflight)

    def dtype_label(self, kvd: KVDtypes) -> str:
        return self.label or kvd.label


@dataclass(frozen=True)
class FullSpec(VSpec):
    """FullAttentionSpec."""


@dataclass(frozen=True)
class MLASpec(VSpec):
    """MLAAttentionSpec: one latent vector per token (no separate V), in the K dtype; `label` names a byte record
    that is not a plain dtype (fp8_ds_mla, the indexer's fp8 keys with scales)."""

    def dtype_label(self, kvd: KVDtypes) -> str:
        return self.label or kvd.k.name


@dataclass(frozen=True)
class SlidingSpec(VSpec):
    """SlidingWindowSpec: window - 1 tokens plus the tokens in flight, and one block more for the window's edge
    ("[XXCD] [EF]": a window can straddle a block boundary)."""

    window: int = 0

    def reserved_tokens(self, max_len: int, inflight: int) -> int:
        return min(self.window - 1 + inflight, max_len)

    def blocks(self, max_len: int, inflight: int) -> int:
        return super().blocks(max_len, inflight) + 1

    def held_tokens(self, max_len: int, inflight: int) -> int:
        return (self.blocks(max_len, inflight) - 1) * self.block_size


@dataclass(frozen=True)
class ChunkedSpec(VSpec):
    """ChunkedLocalAttentionSpec: the chunk plus the tokens in flight."""

    window: int = 0

    def reserved_tokens(self, max_len: int, inflight: int) -> int:
        return min(self.window + inflight, max_len)


@dataclass(frozen=True)
class CrossSpec(VSpec):
    """CrossAttentionSpec: the encoder's length, whatever the decoder's."""

    encoder_len: int = 0

    def reserved_tokens(self, max_len: int, inflight: int) -> int:
        return self.encoder_len


@dataclass(frozen=True)
class MambaSpec(VSpec):
    """MambaSpec: one page holds a request's whole state (conv window + SSM state), padded to the attention page
    in hybrids."""

    state_bytes: int = 0
    page_override: int = 0
    state_blocks: int = 1  # pages a request holds: 1, or 2 (+1 prefill checkpoint for Mamba-2) in "align" mode
    # mamba_cache_mode "all": a state page for every block of the request, kept like attention's
    # (MambaSpec.max_memory_usage_bytes: cdiv(max_model_len, block_size) pages; MambaManager allocates as the base
    # manager does outside "align")
    per_block: bool = False

    is_state: ClassVar[bool] = True

    @property
    def page(self) -> int:
        return self.page_override or self.state_bytes

    def reserved_tokens(self, max_len: int, inflight: int) -> int:
        return max_len if self.per_block else 0

    def blocks(self, max_len: int, inflight: int) -> int:
        return super().blocks(max_len, inflight) if self.per_block else self.state_blocks

    def held_tokens(self, max_len: int, inflight: int) -> int:
        return super().held_tokens(max_len, inflight) if self.per_block else 0

    def grows(self, ctx: int, inflight: int) -> bool:
        return self.per_block and super().grows(ctx, inflight)

    def dtype_label(self, kvd: KVDtypes) -> str:
        return "state"


SPARSE_BLOCK = 64  # DeepseekV32IndexerBackend supports block 64 only (CUDA); the sparse MLA backends multiples of 64
# MiniMax-M3: MiniMaxM3SparseBackend and MiniMaxM3IndexerBackend take kernel block 128 only ("Page size == sparse
# block size"); platforms/interface.py _preferred_block_size_for_backends picks the smallest size every backend
# accepts, lcm(16 of FlashAttention's MultipleOf(16), 128) = 128, and supports_block_size takes multiples of 128.
MSA_BLOCK = 128


@dataclass(frozen=True)
class SpecEnv:
    """What a layer's spec depends on beyond its own geometry."""

    tp: int
    kvd: KVDtypes
    block: int
    mla_block: int
    promote_local: bool  # sliding/chunked layers sized as full attention (hybrid manager off, mixed types)
    state_dtypes: tuple[DType, DType]  # (conv, SSM/recurrent)
    state_align: bool  # mamba_cache_mode "align" (prefix caching on a hybrid)
    cross_tokens: int | None  # what cross-attention reserves, when not the encoder length
    wide_windows_slide: bool  # Rules.window_beyond_context_slides
    arch: str = "hopper"  # gpu_arch of the planned GPU (size: Hopper)
    sparse_block: int = SPARSE_BLOCK
    dcp: int = 1  # decode_context_parallel_size: full-attention and MLA pages shard a request's tokens
    flashkda: bool = False  # Kimi-K3's KDA prefill picks FlashKDA here (SM90/10x/12x, bf16 model, bf16/fp32 state)
    gdn_checkpoint: bool = False  # Qwen GDN prefill on FlashInfer keeps a checkpoint page (Rules.gdn_flashinfer_checkpoint)
    mamba2_checkpoint: bool = False  # Mamba-2 mixers keep a prefill-checkpoint page (Rules.mamba2_checkpoint_page)
    state_all: bool = False  # mamba_cache_mode "all" (Rules.mamba_all_mode): a state page per block


def _attention_bytes(c: FullAttention, env: SpecEnv) -> int:
    k, v = c.token_elems(heads_floor(c.kv_heads, env.tp))
    return env.kvd.k.nbytes(k) + env.kvd.v.nbytes(v)


def _full(c: FullAttention, env: SpecEnv) -> VSpec:
    return FullSpec(env.block, _attention_bytes(c, env), shards=env.dcp)


def _sliding(c: SlidingWindow, env: SpecEnv) -> VSpec:
    if env.promote_local:
        return _full(c, env)
    return SlidingSpec(env.block, _attention_bytes(c, env), c.window)


def _wide_sliding(c: WindowBeyondContext, env: SpecEnv) -> VSpec:
    """Attention.__init__ takes the config's sliding_window whatever its length (nothing compares it with
    max_position_embeddings): a SlidingWindowSpec, one block more per request than full attention."""
    if env.promote_local or not env.wide_windows_slide:
        return _full(c, env)
    return SlidingSpec(env.block, _attention_bytes(c, env), c.window)


def _chunked(c: ChunkedLocal, env: SpecEnv) -> VSpec:
    if env.promote_local:
        return _full(c, env)
    return ChunkedSpec(env.block, _attention_bytes(c, env), c.chunk)


def _cross(c: CrossAttention, env: SpecEnv) -> VSpec:
    return CrossSpec(env.block, _attention_bytes(c, env), env.cross_tokens or c.encoder_len)


def _mla(c: LatentAttention, env: SpecEnv) -> VSpec:
    return MLASpec(env.mla_block, env.kvd.k.nbytes(c.latent_dim), shards=env.dcp)


# DeepSeek sparse attention. v1/attention/backends/mla/flashmla_sparse.py: the fp8_ds_mla record is 512 fp8 latent
# values + 4 fp32 scales (one per 128) + the 64-dim RoPE part in bf16 = 656 B (layers/attention/mla_attention.py
# state_content_bytes, a constant: only DeepSeek's 512 + 64 geometry has it); _canonicalize_sparse_mla_kv_cache_dtype
# turns any quantized dtype into it on FLASHMLA_SPARSE, and auto/fp8 into it on FLASHINFER_MLA_SPARSE_SM120.


def sparse_mla_record(c: SparseLatentAttention, kvd: KVDtypes, arch: str) -> tuple[int, str]:
    """(bytes per token, label) of a DSA layer's latent by the backend vLLM 0.32 picks (platforms/cuda.py):
    SM90 fp8 -> FLASHMLA_SPARSE (fp8_ds_mla), bf16 -> FLASH_ATTN_MLA_SPARSE (plain); SM100 fp8 -> FLASHINFER_MLA_SPARSE,
    which refuses fp8_ds_mla (plain fp8); SM120 -> FLASHINFER_MLA_SPARSE_SM120, fp8_ds_mla for auto and fp8."""
    quantized = kvd.k.below_16_bits
    auto = kvd.source == "engine default"
    if c.kv_lora_rank == 512 and c.rope_dim == 64 and (
            (quantized and arch in ("hopper", "other")) or (arch == "sm120" and (quantized or auto))):
        return c.fp8_record_bytes, "fp8_ds_mla"
    return kvd.k.nbytes(c.latent_dim), ""


def _sparse_mla(c: SparseLatentAttention, env: SpecEnv) -> VSpec:
    size, label = sparse_mla_record(c, env.kvd, env.arch)
    return MLASpec(env.sparse_block, size, label=label, shards=env.dcp)


def _indexer(c: IndexerKeys, env: SpecEnv) -> VSpec:
    """models/deepseek_v2.py Indexer: DeepseekV32IndexerCache(head_dim + head_dim // 128 * 4, torch.uint8), an
    MLAAttentionSpec of its own (one UniformTypeKVCacheSpecs group with the latents: same blocks, two pages)."""
    return MLASpec(env.sparse_block, c.fp8_record_bytes, label="fp8+scales", shards=env.dcp)


def _msa_indexer(c: MsaIndexerKeys, env: SpecEnv) -> VSpec:
    """models/minimax_m3/common/indexer.py MiniMaxM3IndexerCache.get_kv_cache_spec: MLAAttentionSpec(num_kv_heads=1,
    head_size=sparse_index_dim, dtype=bf16): the indexer_kv_dtype "auto" resolves to bf16 for MiniMax-M3
    (nvidia/model.py resolve_indexer_kv_dtype("bf16")), whatever --kv-cache-dtype says; one key per token, not split
    by TP."""
    return MLASpec(env.block, dtypes.KV_DTYPES["bf16"].nbytes(c.head_dim), label="bf16")


# DeepSeek-V4 (models/deepseek_v4/attention.py, compressor.py; v1/attention/backends/mla/sparse_swa.py): the
# FlashMLA (SM90/SM100) and FlashInfer-SM120 backends store the fp8_ds_mla layout whatever --kv-cache-dtype says
# (auto and fp8 become it; 16-bit is refused); pages are padded to 576 bytes; block sizes are fixed by the code:
# 64 for the window, 256 (the sparse backend's only size) for the compressed latent and indexer keys, 4 or 8 for
# the compressor states.
DSV4_ALIGN = 576
DSV4_BLOCK = 256


def _dsv4_check(env: SpecEnv) -> None:
    if not env.kvd.k.below_16_bits:
        raise InputError(f"vLLM's DeepSeek-V4 attention stores its cache as fp8_ds_mla only (models/deepseek_v4/"
                         f"attention.py refuses a {env.kvd.k.name} KV cache); use --kv-dtype auto or fp8")
    if env.block not in (16, DSV4_BLOCK):  # 16: no --block-size given
        raise InputError(f"vLLM's DeepSeek-V4 sparse attention takes block size {DSV4_BLOCK} only (--block-size)")


def _dsv4_window(c: SlidingLatent, env: SpecEnv) -> VSpec:
    _dsv4_check(env)
    return SlidingSpec(64, c.fp8_record_bytes, c.window, align=DSV4_ALIGN, label="fp8_ds_mla")


def _dsv4_compressed(c: CompressedLatent, env: SpecEnv) -> VSpec:
    _dsv4_check(env)
    return MLASpec(DSV4_BLOCK, c.fp8_record_bytes, per_state=c.ratio, align=DSV4_ALIGN, label="fp8_ds_mla")


def _dsv4_indexer(c: CompressedIndexerKeys, env: SpecEnv) -> VSpec:
    return MLASpec(DSV4_BLOCK, c.fp8_record_bytes, per_state=c.ratio, align=DSV4_ALIGN, label="fp8+scales")


def _dsv4_state(c: CompressorState, env: SpecEnv) -> VSpec:
    """compressor.py: a SlidingWindowMLASpec of fp32 state, block 4 for ratio 4 and 8 for ratio 128."""
    return SlidingSpec(4 if c.ratio == 4 else 8, 4 * c.width, c.window, align=DSV4_ALIGN, label="fp32 state")


def _mamba(c: RecurrentState, env: SpecEnv) -> VSpec:
    """MambaStateShapeCalculator: conv (kernel - 1, conv_dim / tp) + temporal state / tp. In "align" mode a request
    holds 2 pages (MambaSpec.max_memory_usage_bytes), Mamba-2 mixers one more for the prefill checkpoint from 0.32
    (layers/mamba/mamba_mixer2.py get_kv_cache_spec); Mamba-2 is the state with a 3-D (heads, head_dim, d_state) SSM."""
    conv, ssm = env.state_dtypes
    mamba2 = isinstance(c, MambaState) and len(c.ssm_shape) == 3
    checkpoint = (mamba2 and env.mamba2_checkpoint) or (isinstance(c, LinearAttentionState) and env.gdn_checkpoint)
    blocks = (3 if checkpoint else 2) if env.state_align else 1
    return MambaSpec(env.block, state_bytes=conv.nbytes(prod(c.conv_shape(env.tp))) + ssm.nbytes(prod(c.ssm_shape_for(env.tp))),
                     state_blocks=blocks, per_block=env.state_all)


def _kda(c: KimiDeltaState, env: SpecEnv) -> VSpec:
    """Kimi Delta Attention (layers/mamba/mamba_utils.py kda_state_shape / kda_state_dtype): conv (kernel - 1,
    3 x heads x head_dim / tp) in the conv dtype, recurrent (heads / tp, head_dim, head_dim) in the recurrent dtype
    prepare() resolved (fp32 by default). Kimi-K3's layer (models/kimi_k3/nvidia/kda.py get_kv_cache_spec) adds a
    prefill-checkpoint page in "align" mode when its prefill backend is FlashKDA (kda_checkpoint.py: alignment 16 for
    "flashkda" only; resolve_kda_prefill_backend: CUDA SM 9/10/12, head_dim 128, bf16 input, a gate_lower_bound)."""
    if c.num_v_heads % env.tp:
        raise InputError(f"--tp {env.tp} does not divide the model's {c.num_v_heads} KDA heads (vLLM asserts "
                         "num_heads % tp_size == 0)")
    conv, recurrent = env.state_dtypes
    checkpoint = int(env.flashkda and c.full_rank_gate and c.key_head_dim == 128 and c.gate_lower_bound is not None)
    return MambaSpec(env.block, state_bytes=conv.nbytes(prod(c.conv_shape(env.tp))) + recurrent.nbytes(prod(c.ssm_shape_for(env.tp))),
                     state_blocks=2 + checkpoint if env.state_align else 1)


def _short_conv(c: ShortConvState, env: SpecEnv) -> VSpec:
    """ShortConv (LFM2; layers/mamba/short_conv.py get_state_shape -> mamba_utils.py short_conv_state_shape): one conv
    window (conv_L_cache - 1, conv_dim / tp) in the conv dtype (short_conv_state_dtype), no SSM term; 2 pages per
    request in "align" mode like every MambaSpec without the Mamba-2 checkpoint."""
    if c.conv_dim % env.tp:
        raise InputError(f"--tp {env.tp} does not divide the model's conv_dim {c.conv_dim} (vLLM's "
                         "short_conv_state_shape divides it exactly)")
    conv, _ = env.state_dtypes
    return MambaSpec(env.block, state_bytes=conv.nbytes(prod(c.conv_shape(env.tp))), state_blocks=2 if env.state_align else 1)


def _lightning(c: LightningState, env: SpecEnv) -> VSpec:
    """MiniMax-01 lightning attention (0.10.1-0.23 models/minimax_text_01.py get_mamba_state_shape_from_config /
    get_mamba_state_dtype_from_config; layers/mamba/linear/minimax_linear_attn.py MiniMaxText01LinearAttention, a
    MambaBase whose get_kv_cache_spec is a MambaSpec): one state (num_heads / tp, head_dim, head_dim)
    (mamba_utils.py linear_attention_state_shape) in linear_attention_state_dtype = get_kv_cache_torch_dtype(
    mamba_cache_dtype, model dtype): the conv-state dtype (--state-dtype), not mamba_ssm_cache_dtype; no conv window.
    Like every MambaSpec it is padded to the attention page in the hybrid pool; 2 pages per request in 'align' mode."""
    if c.num_heads % env.tp:
        raise InputError(f"--tp {env.tp} does not divide the model's {c.num_heads} lightning-attention heads (vLLM "
                         "asserts num_heads % tp_size == 0)")
    conv, _ = env.state_dtypes
    return MambaSpec(env.block, state_bytes=conv.nbytes(prod(c.ssm_shape_for(env.tp))),
                     state_blocks=2 if env.state_align else 1)


# get_kv_cache_spec per layer kind: KV-sharing consumers and MLP-only layers get no spec
KIND_RULES: dict[type, Any] = {
    FullAttention: _full,
    WindowBeyondContext: _wide_sliding,
    SlidingWindow: _sliding,
    ChunkedLocal: _chunked,
    CrossAttention: _cross,
    LatentAttention: _mla,
    SparseLatentAttention: _sparse_mla,
    IndexerKeys: _indexer,
    MsaIndexerKeys: _msa_indexer,
    SlidingLatent: _dsv4_window,
    CompressedLatent: _dsv4_compressed,
    CompressedIndexerKeys: _dsv4_indexer,
    CompressorState: _dsv4_state,
    MambaState: _mamba,
    LinearAttentionState: _mamba,
    KimiDeltaState: _kda,
    ShortConvState: _short_conv,
    LightningState: _lightning,
    SharedKV: layout.NO_CACHE,
    NoCache: layout.NO_CACHE,
}


def layer_spec(c: LayerCache, env: SpecEnv) -> VSpec | None:
    rule = layout.rule_for(ENGINE.name, KIND_RULES, c)
    return None if isinstance(rule, layout.NoCacheRule) else rule(c, env)

