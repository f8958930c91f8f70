"""SGLang token pools (engines.md §2): per layer K [(N + page), H_kv, D_k] and V [(N + page), H_kv, D_v]
(MLA: one [(N + page), 1, kv_lora_rank + rope] buffer), N = tokens in the pool rounded to the page size.

Only the architectures configs/model_config.py is_hybrid_swa_model lists get a separate sliding-window pool
(0.5.10: Llama-4, GPT-OSS, MiMo-V2-Flash, Step-3.5; 0.5.23 adds Gemma 4 and Step-3.7); Gemma-2/3 sliding layers
get full-length cache. A Mamba hybrid's state pool (MambaPool: max_mamba_cache_size slots of a request's conv window
kernel-1 in bf16 and SSM state in fp32) takes r / (1 + r) of the budget before the token pool is sized, and a
running request takes 1, 3 or 5 of its slots (Rules.mamba_pool; tests/oracle_sglang_mamba.py runs SGLang's own code).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvplan import dtypes
from kvplan.engines import base, layout, sglang_dsv4
from kvplan.engines.base import EngineInfo, KVDtypes, PlanGroup, tensor
from kvplan.engines.listing import LISTINGS
from kvplan.engines.versions import Selected, select
from kvplan.errors import InputError
from kvplan.parallel import heads_floor, pad_to
from kvplan.spec import (MsaIndexerKeys, ChunkedLocal, CrossAttention, FullAttention, IndexerKeys, LatentAttention, LayerCache,
                         KimiDeltaState, LightningState, LinearAttentionState, MambaState, ModelSpec, NoCache,
                         RecurrentState, SharedKV, ShortConvState, SlidingLatent, SlidingWindow, SparseLatentAttention,
                         WindowBeyondContext)


@dataclass(frozen=True)
class Rules:
    fraction_tiers: bool  # mem_fraction_static from GPU-size tiers (0.5) vs the TP table (<= 0.4)
    # DSA fp8 latent on Blackwell (SM >= 10): the trtllm DSA backends read the plain 576-byte fp8 latent
    # (kv_cache_configurator.py calculate_mla_kv_cache_dim, 0.5.23); earlier 0.5 builds stored the 656-byte
    # scaled record there too (an 8x B200 DeepSeek-V3.2 log of 2025-10: 788 B per layer)
    dsa_blackwell_plain_fp8: bool = False
    # Kimi Linear (srt/models/kimi_linear.py, configs/kimi_linear.py) is a 0.5 model; the 0.4 rule set predates it
    kda: bool = True
    # LFM2 / LFM2-MoE (srt/models/lfm2.py, lfm2_moe.py) read in 0.5.10; the 0.4 rule set is not known to have them
    short_conv: bool = True
    # Cohere2 (srt/models/commandr.py) and SmolLM3 (no native class: srt/models/transformers.py, the Transformers
    # fallback) read in 0.5.10; in the 0.4 era Cohere2ForCausalLM was a stub (sgl-project/sglang#4570)
    cohere2_smollm3: bool = True
    # Gemma 4 (srt/models/gemma4_causal.py) and Step-3.7 (srt/models/step3p7.py -> Step3p5ForCausalLM) read in the
    # 0.5.23 wheel; the 0.5.10.post1 wheel has neither (no gemma4_* / step3p7 model, Step3p5ForCausalLM only), and the
    # versions in between were not read
    gemma4_step37: bool = False
    # hybrid-SWA pool split. 0.5.10 (model_executor/model_runner_kv_cache_mixin.py profile_max_num_token +
    # _resolve_hybrid_swa_tokens): tokens = rest // (F + S), then full = tokens x (F + S) / (F + r S). 0.5.23
    # (model_executor/pool_configurator.py HybridSWAPoolConfigurator): full = rest // (F + r S) directly, r a float.
    swa_ratio_cell: bool = False
    # How a hybrid's Mamba / linear-attention state pool (MambaPool of max_mamba_cache_size slots) takes its share of
    # the KV budget, read in each wheel: "k" (0.5.10-0.5.16 model_runner_kv_cache_mixin.py / kv_cache_configurator.py
    # handle_max_mamba_cache): K = int(rest x r / (1 + r) // per_req), the pool K x per_req, per_req of every state
    # layer; "k+1" (0.5.17-0.5.23 mem_cache/kv_cache_configurator.py _handle_max_mamba_cache): K = int((rest x r /
    # (1 + r) - per_req) // per_req), (K + 1) x per_req with the pool's padding slot, per_req of the largest pipeline
    # stage (pp_layer_scale). r = --mamba-full-memory-ratio (0.9). The token pool gets the rest. "" = not read (0.4).
    mamba_pool: str = ""
    # State slots a running request takes (_calculate_mamba_ratio): 3 with the radix cache, 1 without it (the models
    # in mamba_radix_off), 3 + 2 where mamba_radix_cache_strategy "auto" resolves to "extra_buffer" (the default
    # overlap schedule, the triton linear-attention backend and an architecture of _MAMBA_EXTRA_BUFFER_ARCHS, 0.5.14 on;
    # mem_cache/allocation_sizing.py get_mamba_tracking_slots: 2 with overlap)
    mamba_radix_off: frozenset = frozenset()
    mamba_extra_buffer: frozenset = frozenset()

    @property
    def mamba_padding_slot_charged(self) -> bool:
        """0.5.17+: the state pool is charged K + 1 slots and per_req is the largest pipeline stage's."""
        return self.mamba_pool == "k+1"


# 0.5.10-0.5.13 server_args.py: Kimi Linear calls _handle_mamba_radix_cache(support_mamba_cache=False), radix cache
# off; from 0.5.14 it keeps it. _MAMBA_EXTRA_BUFFER_ARCHS (server_args.py _support_mamba_cache_extra_buffer in 0.5.14,
# arg_groups/overrides.py from 0.5.15), the architectures kvplan sizes, per wheel:
_EXTRA_0_5_14 = frozenset({"Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForConditionalGeneration",
                           "Qwen3NextForCausalLM", "FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM",
                           "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM"})
_EXTRA_0_5_16 = _EXTRA_0_5_14 | {"KimiLinearForCausalLM"}
_EXTRA_0_5_19 = _EXTRA_0_5_16 | {"Qwen3_5ForCausalLM", "Qwen3_5MoeForCausalLM"}  # unchanged to 0.5.23 for these
_MAMBA_0_5_10 = dict(mamba_pool="k", mamba_radix_off=frozenset({"KimiLinearForCausalLM"}))
_V0_5 = dict(fraction_tiers=True)
VERSIONS = [("0.4", Rules(False, kda=False, short_conv=False, cohere2_smollm3=False)),
            ("0.5", Rules(**_V0_5, **_MAMBA_0_5_10)),
            # 0.5.14-0.5.22: the rows differ from 0.5's in the Mamba pool only (the other rules were read in 0.5.10
            # and 0.5.23, not in between)
            ("0.5.14", Rules(**_V0_5, mamba_pool="k", mamba_extra_buffer=_EXTRA_0_5_14)),
            ("0.5.16", Rules(**_V0_5, mamba_pool="k", mamba_extra_buffer=_EXTRA_0_5_16)),
            ("0.5.17", Rules(**_V0_5, mamba_pool="k+1", mamba_extra_buffer=_EXTRA_0_5_16)),
            ("0.5.19", Rules(**_V0_5, mamba_pool="k+1", mamba_extra_buffer=_EXTRA_0_5_19)),
            ("0.5.23", Rules(**_V0_5, dsa_blackwell_plain_fp8=True, gemma4_step37=True, swa_ratio_cell=True,
                             mamba_pool="k+1", mamba_extra_buffer=_EXTRA_0_5_19))]
MAMBA_FULL_MEMORY_RATIO = 0.9  # --mamba-full-memory-ratio default (server_args.py 0.5.10; arg_groups 0.5.23 fallback)
MAMBA_RUNNING_RATIO = 3  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO: state slots per running request, radix cache on
DSA_PAGE = 64  # arg_groups/model_overrides/deepseek_v2.py: DSA models run with page_size 64 (even over --page-size)
# ... on CUDA. On ROCm, 0.5.10's server_args.py sets page_size 1 for DSA models (an 0.5.8 MI355X GLM-5 log's KV size
# is N + 1 rows of the record); 0.5.23 sets 1 only where aiter's preshuffle paged-MQA kernel is unavailable (a
# property of the ROCm stack), else the pooled-index page: not modelled there
DSA_ROCM_PAGE = 1
AMD_GPU_WORDS = ("mi300", "mi325", "mi350", "mi355", "mi250", "instinct", "radeon")


def is_amd(gpu: base.GpuContext | None) -> bool:
    return gpu is not None and any(k in (gpu.name or "").lower() for k in AMD_GPU_WORDS)
KV_DTYPES = ("fp16", "bf16", "fp32", "fp8_e4m3", "fp8_e5m2")  # cache dtypes this engine can store
LISTED = LISTINGS["sglang"]
KNOBS = LISTED.knobs
ENGINE = EngineInfo(
    name=LISTED.name, aliases=LISTED.aliases, summary=LISTED.summary, versions=VERSIONS, kv_dtypes=KV_DTYPES,
    knobs=KNOBS, default_kv_dtype=lambda spec: default_kv_dtype(spec), honours_checkpoint_kv=True, uses_vllm_max_ctx=True,
    weight_float_dtype=base.serving_dtype, heads_per_gpu=heads_floor,
)
# model_config.py is_hybrid_swa_model: the HF classes SGLang gives a separate sliding-window pool (plus the GGUF
# architecture names of the same models); every other model's sliding layers hold full-length cache.
HYBRID_SWA_ARCHITECTURES = frozenset({
    "Llama4ForConditionalGeneration", "GptOssForCausalLM", "MiMoV2FlashForCausalLM", "MiMoV2MTP",
    "Step3p5ForCausalLM", "Step3p5MTP", "llama4", "gpt-oss",
})


# Hybrid-SWA models whose SGLang model class answers get_attention_sliding_window_size with sliding_window - 1
# (models/gpt_oss.py, 0.5.10.post1 and 0.5.23 alike). ModelRunner takes that as sliding_window_size (0.5.10
# model_runner.py; 0.5.23 load_model_utils.py resolve_sliding_window_size), the window _evict_swa
# (managers/schedule_batch.py) keeps and 0.5.23's validate_swa_pool_size checks. The other hybrid-SWA models have no
# such method: Llama-4 takes attention_chunk_size, MiMo-V2-Flash and Step-3.5 model_config.sliding_window_size
# (the config's sliding_window_size, else sliding_window), the window kvplan's spec already holds; Gemma 4 (0.5.23)
# is _hybrid_swa_0_5_23's.
WINDOW_MINUS_ONE = frozenset({"GptOssForCausalLM", "gpt-oss"})


def default_kv_dtype(spec: ModelSpec) -> dtypes.DType:
    """`auto`: the model dtype; DeepSeek-V4's fp8_e4m3 (arg_groups/overrides.py _deepseek_v4_kv_cache_dtype)."""
    if any(isinstance(c, SlidingLatent) for _, c in spec.caches):
        return dtypes.KV_DTYPES["fp8_e4m3"]
    return base.serving_dtype(spec)


def select_version(requested: str | None) -> Selected[Rules]:
    return select(ENGINE.name, requested, VERSIONS)


# ---------------------------------------------------------------------------------------------- kind rules
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
        if not p.selected.rules.short_conv:
            raise layout.UnsupportedKind(f"{p.selected.label}: kvplan read SGLang's LFM2 models in 0.5.10 only; "
                                         "--engine sglang@0.5 plans it")
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
        if not p.selected.rules.kda:
            raise layout.UnsupportedKind(f"{p.selected.label} predates SGLang's Kimi Linear model "
                                         "(srt/models/kimi_linear.py); --engine sglang@0.5 or later plans it")
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
    # DeepSeek-V4 (0.5.23 only: 0.5.10 refuses the family in prepare): DeepSeekV4TokenToKVPool (sglang_dsv4.py)
    **dict.fromkeys(layout.DEEPSEEK_V4_CACHES, sglang_dsv4.DSV4_RULE),
}


def _rule(c: LayerCache):
    return layout.rule_for(ENGINE.name, KIND_RULES, c)


def _pooled(c: LayerCache) -> bool:
    """Layers whose tokens occupy the token pool (attention and latent kinds)."""
    return isinstance(_rule(c), TokenPool)


# ---------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Prepared(layout.StagedLayout):
    selected: Selected[Rules]
    spec: ModelSpec
    stages: tuple[layout.Caches, ...]
    kvd: KVDtypes
    page: int
    tp: int
    pp: int
    hybrid_swa: bool
    state: tuple[dtypes.DType, dtypes.DType]
    assumptions: tuple[str, ...]
    max_total_tokens: int | None = None
    dsa_plain_fp8: bool = False  # a DSA latent in fp8 is stored plain (576 B), not as the 656 B record
    # Encoder tokens a request keeps in the shared token pool (ENCODER_IN_POOL): every pooled layer, self- and
    # cross-attention alike, holds ctx + encoder_tokens rows per request; 0 for every other model
    encoder_tokens: int = 0
    # SGLang's derived context_len where it is not the model maximum kvplan prints (Whisper: 2048), else None
    context_len: int | None = None
    # DeepSeek-V4 (0.5.23, sglang_dsv4.py): each stage's counts for DSV4PoolConfigurator, the window, and the
    # --max-running-requests the configurator reserves c128 state rings for; () for every other model
    dsv4: tuple[sglang_dsv4.Dsv4Stage, ...] = ()
    dsv4_window: int = 0
    dsv4_requests: int = 0
    # Mamba hybrids (Rules.mamba_pool): one request's state bytes as SGLang charges them (mamba_cache_per_req: every
    # state layer in 0.5.10, the largest stage's in 0.5.23), state slots per running request, r, and a given
    # --max-mamba-cache-size; per_req 0 for every other model
    mamba_per_req: int = 0
    mamba_ratio: int = 0
    mamba_memory_ratio: float = MAMBA_FULL_MEMORY_RATIO
    max_mamba_cache_size: int | None = None

    @property
    def label(self) -> str:
        return self.selected.label

    def _token_bytes(self, c: LayerCache) -> int:
        return _rule(c).token_bytes(c, self)

    def cell_size(self, stage: int) -> int:
        """Bytes one token takes across the stage's pooled layers (SGLang's cell_size)."""
        return sum(self._token_bytes(c) for _, c in self.stages[stage] if _pooled(c))

    def has_fixed_state(self) -> bool:
        """Cross-attention K/V: a fixed cost per request beside the token pool (not the encoder tokens of
        ENCODER_IN_POOL models, which are pool rows). Mamba slots are a pool of their own (mamba_split)."""
        return any(getattr(_rule(c), "fixed", False) and not (self.encoder_tokens and isinstance(c, CrossAttention))
                   and not isinstance(c, RecurrentState) for st in self.stages for _, c in st)

    def mamba_split(self, budget: int) -> tuple[int, int]:
        """(max_mamba_cache_size, the token pool's bytes) from a stage's KV budget, as SGLang splits the rest."""
        per, r, rest = self.mamba_per_req, self.mamba_memory_ratio, max(0, budget) / (1 << 30)
        new = self.selected.rules.mamba_padding_slot_charged
        if self.max_mamba_cache_size is not None:
            k = self.max_mamba_cache_size
        elif new:
            k = int((rest * r / (1 + r) * (1 << 30) - per) // per)
        else:
            k = int(rest * r / (1 + r) * (1 << 30) // per)
        pool = (k + 1 if new else k) * per
        return max(0, k), int((rest - pool / (1 << 30)) * (1 << 30))

    def groups_of(self, ctx: int, batch: int, stage: int) -> list[PlanGroup]:
        out = []
        for c, layers, rule in layout.groups(ENGINE.name, KIND_RULES, self.stages[stage]):
            if isinstance(rule, layout.NoCacheRule):
                out.append(layout.no_cache_group(c, layers))
            else:
                out.append(rule.group(c, layers, ctx, batch, self))
        return out

    def details(self, ctx: int, batch: int, stage: int) -> dict[str, Any]:
        if self.dsv4:
            st = self.dsv4[stage]
            return {"page_size": self.page, "bytes_per_full_token": st.bytes_per_full_token(),
                    "bytes_per_swa_token": st.bytes_per_swa_token(),
                    "c128_state_fixed_bytes": st.c128_state_fixed_bytes(self.dsv4_requests),
                    "padding_bytes": sglang_dsv4.padding_bytes(st, ctx, batch, self.dsv4_window)}
        return {"page_size": self.page, "cell_size": self.cell_size(stage)}


# configs/model_config.py is_encoder_decoder_model (0.5.10): Whisper (whisper_pool below) and Llama-3.2-Vision.
# The latter's input ids are the image's pad tokens followed by the text (models/mllama.py pad_input_ids: images x
# tiles x num_patches of them, tiles = the processor's padded max_num_tiles); prepare_for_extend allocates pool slots
# for all of them and managers/schedule_batch.py prepare_encoder_info_extend hands the first encoder_len slots to the
# cross-attention layers (encoder_out_cache_loc) and the rest to the text; decode writes at encoder_len + seq_len
# (mem_cache/common.py alloc_for_decode). The pool is one MHATokenToKVPool of every decoder layer
# (num_effective_layers = num_hidden_layers, cell_size over all of them), so each of those slots costs every layer's
# K/V: a request holds ctx + encoder_len rows in self- and cross-attention layers alike.
ENCODER_IN_POOL = frozenset({"MllamaForConditionalGeneration"})

# Whisper (WhisperForConditionalGeneration, read in 0.5.10.post1 and 0.5.23, alike): configs/model_config.py
# _derive_model_shapes sets num_attention_layers = encoder_layers + 2 x decoder_layers ("Even though cross-attention
# doesn't save KV cache, attention backend needs buffer to exist") and ModelRunner takes num_effective_layers =
# max(num_hidden_layers, num_attention_layers) (0.5.23: model_runner_components/layer_setup.py), so the one
# MHATokenToKVPool allocates, and get_cell_size_per_token counts, every one of them: layer ids 0..E-1 the encoder's
# (never written: WhisperAttention runs SDPA), E..E+D-1 the decoder's self-attention, E+D..E+2D-1 its
# cross-attention (WhisperDecoderLayer), each with num_key_value_heads = encoder_attention_heads
# (WhisperConfig.attribute_map) of head_dim d_model // heads. models/whisper.py pad_input_ids prepends
# max_source_positions pad ids, which prepare_for_extend allocates pool slots for and prepare_encoder_info_extend
# hands to the cross-attention layers, as for Llama-3.2-Vision: a request holds ctx + max_source_positions rows.
# utils get_context_length finds none of its keys in WhisperConfig, so context_len is its fallback 2048.
WHISPER_CONTEXT_LEN = 2048


def whisper_pool(spec: ModelSpec, tp: int, pp: int) -> tuple[tuple[layout.Caches, ...], int, str]:
    """SGLang's Whisper token pool (see above): the stage's (layer, cache) rows under SGLang's layer ids, the pool
    rows a request's audio takes, and a note."""
    enc = spec.encoder_shape
    if enc is None:
        raise layout.UnsupportedKind("SGLang sizes Whisper's pool over its encoder layers too, and this spec "
                                     "carries no encoder shape")
    dec = next(c for _, c in spec.caches if type(c) is FullAttention)
    cross = next(c for _, c in spec.caches if isinstance(c, CrossAttention))
    if (enc.heads, enc.head_dim) != (dec.kv_heads, dec.head_dim_k):
        raise layout.UnsupportedKind(
            f"SGLang cannot run this Whisper: its pool gives every layer encoder_attention_heads ({enc.heads}) x "
            f"{enc.head_dim} (WhisperConfig maps num_key_value_heads to them), but the decoder writes "
            f"decoder_attention_heads ({dec.kv_heads}) x {dec.head_dim_k} into it (models/whisper.py)")
    if spec.encoder_len != enc.positions:
        raise InputError(f"--encoder-len {spec.encoder_len} does not apply to SGLang's Whisper: every request takes "
                         f"max_source_positions ({enc.positions}) pool slots for its audio (models/whisper.py "
                         "pad_input_ids)")
    if enc.heads % tp:
        raise InputError(f"--tp {tp} does not divide Whisper's {enc.heads} attention heads (SGLang's "
                         "WhisperAttention asserts num_heads % tp_size == 0)")
    if pp > 1:
        raise layout.UnsupportedKind("SGLang cannot split Whisper into pipeline stages: models/whisper.py builds every "
                                     "layer on every rank (no start_layer / end_layer, no PP proxy tensors)")
    e, d = enc.layers, spec.num_layers
    # the encoder layers' buffers have the decoder self-attention's shape (checked above): one "full" group of e + d
    buffers = FullAttention(enc.heads, enc.head_dim, enc.head_dim)
    rows = ([(i, buffers) for i in range(e)] + [(e + i, dec) for i in range(d)]
            + [(e + d + i, cross) for i in range(d)])
    note = (f"SGLang's Whisper pool has {e + 2 * d} layers (model_config.py num_attention_layers = {e} encoder + "
            f"2 x {d} decoder): ids 0-{e - 1} the encoder's, allocated but never written, {e}-{e + d - 1} decoder "
            f"self-attention, {e + d}-{e + 2 * d - 1} cross-attention; a request holds ctx + {enc.positions:,} "
            f"rows in each (max_source_positions pad slots for the audio, models/whisper.py pad_input_ids); "
            f"context_len {WHISPER_CONTEXT_LEN} (no context key in WhisperConfig), the pad slots included")
    return (tuple(rows),), enc.positions, note

# Families SGLang 0.5.10 has no model for (srt/models); granitemoehybrid is there (configs/granitemoehybrid.py:
# Mamba2CacheParams of the mamba layers, the same Mamba2StateShape as Nemotron-H's)
# SGLang 0.5.10 has no T5 / BART model file (srt/models) and configs/model_config.py is_encoder_decoder_model lists
# only WhisperForConditionalGeneration and MllamaForConditionalGeneration
_ENC_DEC = ("SGLang (0.5.10 read) has no {} model: srt/models has none, and configs/model_config.py "
            "is_encoder_decoder_model knows only Whisper and Mllama")
REFUSED_FAMILIES = {"bamba": "SGLang 0.5.10 has no BambaForCausalLM (srt/models)",
                    "zamba2": "SGLang has no Zamba2ForCausalLM (no srt/models/zamba2.py)",
                    **dict.fromkeys(("t5", "mt5"), _ENC_DEC.format("T5 / mT5")),
                    **dict.fromkeys(("bart", "mbart"), _ENC_DEC.format("BART / mBART"))}
# Families read in 0.5.10 only (Rules.cohere2_smollm3). In 0.5.10 Cohere2 is not a hybrid-SWA architecture
# (model_config.py is_hybrid_swa_model), so its sliding layers hold full-length cache, and SmolLM3 runs through the
# Transformers fallback (model_loader/utils.py resolve_transformers_arch), one RadixAttention per layer, one pool.
NOT_READ_BEFORE_0_5 = {
    "cohere2": "not modelled: kvplan read Cohere2 in SGLang 0.5.10 (srt/models/commandr.py); SGLang 0.4's "
               "Cohere2ForCausalLM was a stub (sgl-project/sglang#4570): use --engine sglang@0.5",
    "smollm3": "not modelled: kvplan read SGLang 0.5.10's Transformers fallback (srt/models/transformers.py) that runs "
               "SmolLM3; 0.4's is not read: use --engine sglang@0.5",
    "whisper": "not modelled: kvplan read SGLang's Whisper in 0.5.10 and 0.5.23 (srt/models/whisper.py); 0.4's is "
               "not read: use --engine sglang@0.5",
}


def gemma3n_pool(spec: ModelSpec, pp: int) -> ModelSpec:
    """Gemma-3n in SGLang 0.5.10: the KV-shared layers compute no K/V (RadixAttention reads layer first_shared - 1 or
    - 2, save_kv_cache=False; models/gemma3n_causal.py Gemma3nAttention), but the token pool has a K and V buffer for
    every layer all the same (ModelRunner: num_effective_layers = num_hidden_layers, the model has no start_layer /
    end_layer; model_runner_kv_cache_mixin.py get_cell_size_per_token), so each shared layer costs what the layer it
    reads costs; hybrid-SWA memory is off for Gemma-3n (server_args.py), so sliding layers hold full length too.
    Gemma3nTextModel builds its layers with make_layers without a pp rank: every rank would hold all of them."""
    if pp > 1:
        raise layout.UnsupportedKind("SGLang 0.5.10 cannot split Gemma-3n into pipeline stages: Gemma3nTextModel "
                                     "calls make_layers without pp_rank / pp_size (models/gemma3n_causal.py)")
    own = dict(spec.caches)
    caches = tuple((i, own[c.target] if isinstance(c, SharedKV) else c) for i, c in spec.caches)
    return replace(spec, caches=caches)


# Families read in the 0.5.23 wheel only (Rules.gemma4_step37); the 0.5.10.post1 wheel has no model for them
NOT_IN_0_5_10 = {
    "gemma4": "not modelled: SGLang 0.5.10 has no Gemma 4 model (no srt/models/gemma4_causal.py); kvplan read "
              "0.5.23's: use --engine sglang@0.5.23",
    "step-3.7": "not modelled: SGLang 0.5.10 has no Step3p7ForConditionalGeneration (srt/models has step3p5.py only); "
                "kvplan read 0.5.23's (models/step3p7.py): use --engine sglang@0.5.23",
    "deepseek-v4": "SGLang 0.5.10 has no DeepSeek-V4 model (no srt/models/deepseek_v4.py)",
}
# Read in 0.5.23 and not laid out (none now: DeepSeek-V4 is sglang_dsv4.py)
NOT_MODELLED_0_5_23: dict[str, str] = {}
# Gemma 4 on SM100: arg_groups/model_overrides/gemma4.py picks trtllm_mha there, and arg_groups/overrides.py moves a
# page size outside 16/32/64/128 to 64 for that backend (triton, page 1, elsewhere)
TRTLLM_MHA_PAGES = (16, 32, 64, 128)


def _hybrid_swa_0_5_23(spec: ModelSpec,
                       stages: tuple[layout.Caches, ...]) -> tuple[tuple[layout.Caches, ...], list[str]]:
    """Gemma 4 / Step-3.7 as SGLang 0.5.23 pools them: is_hybrid_swa_model lists Gemma4ForCausalLM,
    Gemma4ForConditionalGeneration and Step3p7ForConditionalGeneration, and get_hybrid_layer_ids (configs/
    model_config.py) makes every layer_types entry below num_hidden_layers a full-pool or an SWA-pool layer. The flat
    text-only Step-3.7 file (aiconfigurator's Step3p7FlashForCausalLM, a class no engine has) is sized as the
    release's wrapper, as every other engine here reads it.

    Gemma 4 (models/gemma4_causal.py, utils/hf_transformers/config.py _apply_gemma4_attention_overrides): the full
    pool takes the full layers' (head_dim, KV heads) from transformers' per_layer_config (global_head_dim 512,
    num_global_key_value_heads with attention_k_eq_v), the SWA pool the sliding layers' (swa_head_dim,
    swa_num_key_value_heads), one shape per layer type (_gemma4_attention_shapes refuses more); a KV-shared layer
    still owns rows in its type's pool (its RadixAttention reads the target's layer_id, but the pool is built from
    the layer lists); the window is sliding_window - 1 (get_attention_sliding_window_size).
    Step-3.7 (models/step3p5.py Step3p5DecoderLayer): both pools take head_dim and the full layers' KV heads
    (_build_hybrid_swa_kv_pool passes no swa_* shape outside is_hybrid_swa_compress); the MTP layers past
    num_hidden_layers hold nothing without speculative decoding."""
    gemma = spec.family == "gemma4"
    by_layer = {i: c for i, c in spec.caches if not isinstance(c, SharedKV)}
    shapes: dict[str, set] = {}
    for c in by_layer.values():
        if isinstance(c, FullAttention):
            kind = "sliding" if isinstance(c, (SlidingWindow, WindowBeyondContext)) else "full"
            shapes.setdefault(kind, set()).add((c.kv_heads, c.head_dim_k, c.head_dim_v))
    for kind, found in shapes.items():
        if len(found) > 1:
            raise layout.UnsupportedKind(f"SGLang 0.5.23 carries one (head_dim, KV heads) per layer type and this "
                                         f"{spec.family} config gives its {kind} layers {len(found)} "
                                         "(utils/hf_transformers/config.py _gemma4_attention_shapes refuses it)")
    if not gemma and len({s for found in shapes.values() for s in found}) > 1:
        raise layout.UnsupportedKind("SGLang 0.5.23 sizes Step-3.7's SWA pool with attention_other_setting's heads but "
                                     "allocates it with the full layers' (no swa_* shape outside "
                                     "is_hybrid_swa_compress); this config's sliding and full layers differ")
    out, shared = [], 0
    for stage in stages:
        rows = []
        for i, c in stage:
            if isinstance(c, SharedKV):
                c, shared = by_layer[c.target], shared + 1
            if isinstance(c, WindowBeyondContext):  # still a sliding_attention layer of the SWA pool
                c = SlidingWindow(c.kv_heads, c.head_dim_k, c.head_dim_v, window=c.window)
            if gemma and isinstance(c, SlidingWindow):
                c = SlidingWindow(c.kv_heads, c.head_dim_k, c.head_dim_v, window=c.window - 1)
            rows.append((i, c))
        if not any(isinstance(c, SlidingWindow) for _, c in rows):
            raise layout.UnsupportedKind(f"SGLang 0.5.23 runs {spec.family} on its hybrid-SWA pool, which needs a "
                                         "sliding layer on every pipeline stage (HybridSWAPoolConfigurator asserts "
                                         "one); this config (or stage) has none")
        out.append(tuple(rows))
    notes = []
    if gemma:
        notes.append("SGLang 0.5.23 Gemma 4: window sliding_window - 1 (models/gemma4_causal.py "
                     "get_attention_sliding_window_size)")
        if shared:
            notes.append(f"SGLang 0.5.23 keeps pool rows for the {shared} KV-shared layer(s) too (the pools are built "
                         "from layer_types; those layers read their target's rows)")
    elif spec.architecture == "Step3p7FlashForCausalLM":
        notes.append("SGLang has no Step3p7FlashForCausalLM: sized as the release's Step3p7ForConditionalGeneration "
                     "(models/step3p7.py), whose text model this file describes")
    return tuple(out), notes


def prepare(spec: ModelSpec, tp: int, pp: int, kvd: KVDtypes, selected: Selected[Rules], opts: dict[str, Any],
            gpu: base.GpuContext | None = None) -> Prepared:
    layout.check_family(ENGINE.name, REFUSED_FAMILIES, spec.family)
    if not selected.rules.cohere2_smollm3:
        layout.check_family(ENGINE.name, NOT_READ_BEFORE_0_5, spec.family)
    layout.check_family(ENGINE.name, NOT_MODELLED_0_5_23 if selected.rules.gemma4_step37 else NOT_IN_0_5_10,
                        spec.family)
    own_layers = {i for i, c in spec.caches if not isinstance(c, SharedKV)}
    shared = len(spec.caches) - len(own_layers) if spec.family == "gemma3n" else 0
    if spec.family == "gemma3n":
        spec = gemma3n_pool(spec, pp)
    layout.check_rules(ENGINE.name, KIND_RULES, spec.caches)
    base.check_tp_heads(spec, tp)
    kinds = {type(c) for _, c in spec.caches}
    sparse = SparseLatentAttention in kinds
    arch = base.gpu_arch(gpu.name) if gpu is not None else "hopper"
    stages = layout.stages(spec, pp)
    if spec.family == "deepseek-v4":
        return _prepare_dsv4(spec, stages, tp, pp, kvd, selected, opts, gpu)
    family_notes: list[str] = []
    hybrid_swa = spec.architecture in HYBRID_SWA_ARCHITECTURES
    if selected.rules.gemma4_step37 and spec.family in ("gemma4", "step-3.7"):
        stages, family_notes = _hybrid_swa_0_5_23(spec, stages)
        hybrid_swa = True
    if hybrid_swa and spec.architecture in WINDOW_MINUS_ONE:
        windows = {c.window for _, c in spec.caches if type(c) is SlidingWindow}
        stages = tuple(tuple((i, replace(c, window=c.window - 1) if type(c) is SlidingWindow else c) for i, c in st)
                       for st in stages)
        family_notes.append("SGLang's GPT-OSS window is sliding_window - 1 = "
                            f"{', '.join(str(w - 1) for w in sorted(windows))} (models/gpt_oss.py "
                            "get_attention_sliding_window_size)")
    given = int(opts.get("page_size") or 0)
    page = DSA_PAGE if sparse else given or 1
    why = " (DSA models run with 64)" if sparse else "" if given else " (SGLang default)"
    if sparse and is_amd(gpu):
        if selected.rules.gemma4_step37:  # the 0.5.23 rule set
            raise layout.UnsupportedKind(
                f"{selected.label} cannot size DeepSeek sparse attention on an AMD GPU: its page is 1 only where "
                "aiter's preshuffle paged-MQA kernel is unavailable, else the pooled-index page "
                "(arg_groups/model_overrides/deepseek_v2.py), which depends on the ROCm stack; sglang@0.5 sizes the "
                "0.5.10-era rule (page 1 on ROCm)")
        page, why = DSA_ROCM_PAGE, " (DSA on ROCm runs with 1: server_args.py)"
    if spec.family == "gemma4" and arch == "blackwell" and page not in TRTLLM_MHA_PAGES:
        page, why = 64, " (Gemma 4 on SM100 runs trtllm_mha, which needs 16/32/64/128-token pages: SGLang picks 64)"
    notes = [f"page size {page} token(s){why}; each pool allocates one extra page of padding rows", *family_notes]
    if spec.family == "gemma4" and gpu is None and not given and hybrid_swa:
        notes.append("Gemma 4 on SM100 (B200/B300) runs trtllm_mha with 64-token pages; this plan assumes another GPU "
                     "(triton, page 1): --gpu plans a given one")
    if selected.note:
        notes.append(selected.note)
    if shared:
        first = next(i for i, c in spec.caches if i not in own_layers)
        kv_params = sum(w.params for w in spec.weights if w.layer == 0 and w.name.startswith(
            ("self_attn.k_proj", "self_attn.v_proj", "self_attn.k_norm")))
        notes.append(f"Gemma-3n's {shared} KV-shared layers (from layer {first}) write no K/V but keep their buffers "
                     "in the token pool (SGLang sizes it for every layer); SGLang also builds their k/v projections "
                     f"(qkv_proj on every layer): {shared * kv_params:,} parameters more than the weights shown")
    plain_fp8 = sparse and selected.rules.dsa_blackwell_plain_fp8 and arch == "blackwell"
    if sparse:
        where = arch if gpu is not None else "Hopper (size assumes a Hopper GPU)"
        notes.append(f"DeepSeek sparse attention on {where}: an fp8 latent is "
                     + ("stored plain (576 B; the trtllm DSA backends)" if plain_fp8 else
                        "a 656 B record (fp8 latent + fp32 scales + bf16 RoPE)")
                     + "; indexer keys fp8 + fp32 scales (132 B) per layer, in the cell size")
        if kvd.source == "engine default" and arch == "blackwell":
            notes.append("SGLang's auto KV dtype for DSA models is fp8_e4m3 on SM >= 10 (arg_groups/overrides.py "
                         "_dsa_kv_cache_dtype_default); this plan uses the model dtype: --kv-dtype fp8 plans SGLang's default")
    if kinds & {SlidingWindow, ChunkedLocal}:
        notes.append("sliding/chunked layers hold min(ctx, window) tokens (SGLang hybrid-SWA pool)" if hybrid_swa
                     else "SGLang gives this model's sliding-window layers full-length cache (not a hybrid-SWA model)")
    # conv state in SGLANG_MAMBA_CONV_DTYPE (bfloat16 by default, whatever the model dtype), SSM state float32 or
    # the config's mamba_ssm_dtype (configs/mamba_utils.py mamba2_state_dtype; environ.py)
    ssm, ssm_from = config_ssm_dtype(spec)
    state = (kvd.state or dtypes.KV_DTYPES["bf16"], kvd.state or ssm)
    if any(issubclass(k, RecurrentState) for k in kinds):
        notes.append(f"Mamba state per request: conv kernel-1 in {state[0].name}, SSM in {state[1].name}"
                     + (f" ({ssm_from})" if ssm_from and not kvd.state else ""))
    encoder_tokens, context_len = 0, None
    if spec.family == "whisper":
        stages, encoder_tokens, note = whisper_pool(spec, tp, pp)
        notes.append(note)
        context_len = WHISPER_CONTEXT_LEN
    elif spec.architecture in ENCODER_IN_POOL:
        encoder_tokens = max((c.encoder_len for _, c in spec.caches if isinstance(c, CrossAttention)), default=0)
        notes.append(f"SGLang keeps a request's {encoder_tokens:,} vision tokens in the token pool beside its text "
                     "(models/mllama.py pad_input_ids, schedule_batch.py prepare_encoder_info_extend): every layer, "
                     f"self- and cross-attention, holds ctx + {encoder_tokens:,} rows per request, and the padded "
                     "prompt counts against --context-length")
    cap = opts.get("max_total_tokens")
    prepared = Prepared(selected, spec, stages, kvd, page, tp, pp, hybrid_swa, state, tuple(notes),
                        int(cap) if cap else None, plain_fp8, encoder_tokens, context_len)
    if any(issubclass(k, RecurrentState) for k in kinds):
        prepared = _mamba_pool(prepared, spec, opts)
    elif opts.get("mamba_full_memory_ratio") or opts.get("max_mamba_cache_size") or opts.get("disable_radix_cache"):
        prepared = replace(prepared, assumptions=prepared.assumptions + (
            "--mamba-full-memory-ratio / --max-mamba-cache-size / --disable-radix-cache change nothing here: this "
            "model keeps no Mamba state (the radix cache does not change a token pool's size)",))
    return prepared


def _mamba_pool(p: Prepared, spec: ModelSpec, opts: dict[str, Any]) -> Prepared:
    """A Mamba hybrid's state pool: mamba_cache_per_req (conv + SSM of every state layer in 0.5.10, of the largest
    pipeline stage in 0.5.23: _handle_max_mamba_cache's pp_layer_scale), the slots a running request takes
    (_calculate_mamba_ratio) and the share of the budget it gets (--mamba-full-memory-ratio)."""
    rules = p.selected.rules
    new = rules.mamba_padding_slot_charged
    per_stage = [sum(_rule(c).group(c, [i], 1, 1, p).bytes for i, c in p.stages[s] if isinstance(c, RecurrentState))
                 for s in range(len(p.stages))]  # (a kind the rule set predates is refused here, by name)
    if not p.selected.rules.mamba_pool:
        raise layout.UnsupportedKind(f"{p.selected.label}: kvplan read how SGLang sizes its Mamba state pool in "
                                     "0.5.10-0.5.23 only (handle_max_mamba_cache); --engine sglang@0.5 or later "
                                     "plans this hybrid")
    per_req = max(per_stage) if new else sum(per_stage)
    radix_off = bool(opts.get("disable_radix_cache"))
    if radix_off or spec.architecture in rules.mamba_radix_off:
        ratio, why = 1, "radix cache off" + ("" if radix_off else " for this model")
    elif spec.architecture in rules.mamba_extra_buffer:
        ratio, why = MAMBA_RUNNING_RATIO + 2, "radix cache, mamba_radix_cache_strategy 'auto' -> extra_buffer: 2 tracking slots"
    else:
        ratio, why = MAMBA_RUNNING_RATIO, "radix cache, no extra buffer"
    r = float(opts.get("mamba_full_memory_ratio") or MAMBA_FULL_MEMORY_RATIO)
    given = opts.get("max_mamba_cache_size")
    if given is None and radix_off and opts.get("max_running_requests"):
        given = opts["max_running_requests"]  # handle_max_mamba_cache: the radix cache off, one slot a running request
    note = (f"Mamba state pool (MambaPool): {per_req:,} B a slot ({'the largest stage' if new else 'every state layer'}); "
            + (f"{int(given)} slots (--max-mamba-cache-size, or --max-running-requests with the radix cache off)"
               if given else
               f"r / (1 + r) of the KV budget, r = mamba_full_memory_ratio {r}")
            + (", plus the pool's padding slot" if new else "") + f"; the token pool gets the rest; {ratio} slot(s) a "
            f"running request ({why}), so max_running_requests <= max_mamba_cache_size // {ratio}")
    return replace(p, assumptions=p.assumptions + (note,), mamba_per_req=per_req, mamba_ratio=ratio,
                   mamba_memory_ratio=r, max_mamba_cache_size=int(given) if given else None)


def _prepare_dsv4(spec: ModelSpec, stages: tuple[layout.Caches, ...], tp: int, pp: int, kvd: KVDtypes,
                  selected: Selected[Rules], opts: dict[str, Any], gpu: base.GpuContext | None) -> Prepared:
    """DeepSeek-V4 on SGLang 0.5.23's DSV4PoolConfigurator / DeepSeekV4TokenToKVPool (sglang_dsv4.py)."""
    if is_amd(gpu):
        raise layout.UnsupportedKind("sglang cannot size this deepseek-v4 model on an AMD GPU: not modelled (kvplan "
                                     "read SGLang 0.5.23's NVIDIA flashmla pools; ROCm has the unified_kv_triton pool "
                                     "and aiter layouts)")
    if kvd.k.name != "fp8_e4m3" or kvd.v.name != "fp8_e4m3":
        raise InputError(f"SGLang 0.5.23 stores DeepSeek-V4's cache as fp8_e4m3 only, not {kvd.label}: its flashmla "
                         "pools hold uint8 V4 records (DeepSeekV4SingleKVPool.create_buffer asserts a uint8 store; "
                         "bfloat16 is the NPU pool's)")
    given = int(opts.get("page_size") or 0)
    if given and given != sglang_dsv4.PAGE:
        raise InputError(f"--page-size {given} does not apply to DeepSeek-V4 on SGLang 0.5.23: "
                         "model_overrides/deepseek_v4.py sets page_size 256 (_build_dsv4_kv_pool asserts it)")
    for st in stages:
        sglang_dsv4.check_geometry(st)
    dsv4 = tuple(sglang_dsv4.stage_of(st) for st in stages)
    window = next(c.window for _, c in spec.caches if type(c) is SlidingLatent)
    requested = int(opts.get("max_running_requests") or sglang_dsv4.MAX_RUNNING_REQUESTS)
    st = dsv4[0]
    notes = [
        "SGLang 0.5.23 DeepSeek-V4 (DSV4PoolConfigurator, DeepSeekV4TokenToKVPool; NVIDIA flashmla, V4 layout, every "
        "SGLANG_DSV4_* switch at its default): page size 256; V4 records of 584 B (448 fp8 + 8 B of scales + 64 bf16 "
        "RoPE) in pages padded to 576 B (585 B per SWA or c4 slot, 864 B per c128 slot); c4 indexer keys fp8 + "
        "scale (132 B) sized c128 x 32; fp32 compress states: c4 rings of 8 rows per SWA page, c128 rings of 128 "
        "rows per request slot; each pool allocates one 256-token page of padding",
        f"pools from the budget: full = (budget - c128 state rings for {requested} requests) / bytes_per_full_token "
        f"({st.bytes_per_full_token()} = 0.1 x {st.bytes_per_swa_token()} per SWA slot + the c4 / c128 latents and "
        "indexer), floored to the page; swa = full x 0.1 (swa_full_tokens_ratio, model_overrides/deepseek_v4.py); "
        "c4 = full / 4, c128 = full / 128",
        f"a request holds ctx tokens of the full pool and min(ctx, {window}) of the SWA pool, each rounded to the "
        "256-token page (the steady state: SWA eviction lag and prefill chunks are the scheduler's)",
    ]
    if kvd.source == "engine default":
        notes.append("KV dtype fp8_e4m3: SGLang's auto for DeepSeek-V4 (arg_groups/overrides.py "
                     "_deepseek_v4_kv_cache_dtype)")
    if spec.rope_tables:
        notes.append("SGLang's DeepSeek-V4 rotary tables (complex64 freqs_cis per RoPE base, models/deepseek_v4.py, "
                     "and get_rope caches) are not laid out: the estimated budget subtracts kvplan's one table; "
                     "--kv-budget plans a measured budget exactly")
    if selected.note:
        notes.append(selected.note)
    cap = opts.get("max_total_tokens")
    return Prepared(selected, spec, stages, kvd, sglang_dsv4.PAGE, tp, pp, False, (kvd.k, kvd.k), tuple(notes),
                    int(cap) if cap else None, dsv4=dsv4, dsv4_window=window, dsv4_requests=requested)


def default_mem_fraction(gpu_mib: int | None, tp: int, pp: int, rules: Rules, mla: bool) -> float:
    """ServerArgs._handle_gpu_memory_settings (0.5): reserved MiB from GPU-size tiers; <= 0.4: a TP table."""
    if not rules.fraction_tiers:
        return 0.79 if tp >= 16 else 0.81 if tp >= 8 else 0.85 if tp >= 4 else 0.87 if tp >= 2 else 0.88
    if gpu_mib is None:
        return 0.88
    gib = gpu_mib / 1024
    if gib < 20:
        chunk, graph_bs = 2048, 8
    elif gib < 35:
        chunk, graph_bs = 2048, 24 if tp < 4 else 80
    elif gib < 60:
        chunk, graph_bs = 4096, 32 if tp < 4 else 160
    elif gib < 160:
        chunk, graph_bs = 8192, 256 if tp < 4 else 512
    else:
        chunk, graph_bs = 16384, 512
    reserved = 512 + max(chunk, 2048) * 1.5 + graph_bs * 2 + tp * pp / 8 * 1024
    reserved += 58 * 8 + (1536 if mla else 0)  # piecewise CUDA graphs (on by default): 58 token sizes x 8 MiB
    if gib > 60:
        reserved = max(reserved, 10240)
    return round((gpu_mib - reserved) / gpu_mib, 3)



# ---------------------------------------------------------------------------------------------- budget, capacity
def budget(prepared: Prepared, spec: ModelSpec, gpu: base.GpuContext, stage: int, weights: int,
           opts: dict[str, Any], reserve: int | None, dtype_bytes: int) -> base.Budget:
    """profile_max_num_token: pre = free memory after NCCL init, post = pre - what the load took (weights and the
    rotary tables); rest = post - pre x (1 - mem_fraction_static), i.e. KV = mem_fraction_static x pre - load."""
    from kvplan.engines import overhead

    f, note = mem_fraction(prepared, spec, gpu, opts)
    pre = gpu.cuda_total - overhead.CUDA_CONTEXT_BYTES - (overhead.NCCL_BYTES if prepared.tp * prepared.pp > 1 else 0)
    if reserve is not None:
        pre = gpu.cuda_total - reserve
    parts = [("free after NCCL init (estimate)", pre), ("x mem_fraction_static", int(pre * f) - pre), ("weights", -weights)]
    # SGLang keeps the rotary cos/sin tables in fp32 on CUDA (layers/rotary_embedding/base.py, 0.5.10)
    rope = sum(t.nbytes(4) for t in spec.rope_tables)
    if rope and reserve is None:
        parts.append(("rotary cos/sin tables, fp32 (built with the model)", -rope))
    return base.Budget(sum(v for _, v in parts), tuple(parts), (note,))


def mem_fraction(prepared: Prepared, spec: ModelSpec, gpu: base.GpuContext, opts: dict[str, Any]) -> tuple[float, str]:
    """mem_fraction_static as given, else SGLang's default for this GPU, parallelism and version; and a note."""
    given = opts.get("mem_fraction_static")
    if given:
        return float(given), f"mem_fraction_static {float(given)}"
    mla = any(isinstance(c, LatentAttention) for _, c in spec.caches)
    nvml_mib = (gpu.nvml_total or gpu.cuda_total) >> 20
    f = default_mem_fraction(nvml_mib, prepared.tp, prepared.pp, prepared.selected.rules, mla)
    return f, f"mem_fraction_static {f} (SGLang default for this GPU)"


def calibrated_budget(prepared: Prepared, spec: ModelSpec, gpu: base.GpuContext, stage: int, opts: dict[str, Any],
                      dtype_bytes: int, cal) -> base.Budget:
    """The budget from the free memory SGLang measured (calibration.py): KV = mem_fraction_static x pre - (pre -
    post), pre and post the free memory its log printed before and after the weights load. Neither depends on
    mem_fraction_static or the context length, so a calibration carries over to any of them."""
    f, note = mem_fraction(prepared, spec, gpu, opts)
    pre, load = cal.free_at_start_bytes[stage], cal.non_kv_bytes[stage]
    parts = ((f"free after NCCL init (calibrated: {cal.log})", pre), ("x mem_fraction_static", int(pre * f) - pre),
             (f"weights as loaded (calibrated: {cal.log})", -load))
    notes = (note, f"free memory measured by {cal.describe()} (kvplan explain --save-calibration); "
             f"± {cal.half_width_bytes:,} B as printed")
    return base.Budget(int(pre * f) - load, parts, notes)


def _token_pool(prepared: Prepared, budgets: list[int]) -> int:
    """max_total_num_tokens: int(rest) // cell, min over stages, --max-total-tokens cap, floored to the page; a Mamba
    hybrid's rest is what its state pool leaves (Prepared.mamba_split)."""
    counts = []
    for s in range(len(prepared.stages)):
        cell = prepared.cell_size(s)
        if cell:
            rest = prepared.mamba_split(budgets[s])[1] if prepared.mamba_per_req else budgets[s]
            counts.append(max(0, rest) // cell)
    n = min(counts) if counts else 0
    if prepared.max_total_tokens:
        n = min(n, prepared.max_total_tokens)
    return n // prepared.page * prepared.page


def dsv4_pools(prepared: Prepared, budgets: list[int]) -> sglang_dsv4.PoolSizes:
    return sglang_dsv4.pool_sizes(prepared.dsv4, budgets, prepared.dsv4_requests, prepared.max_total_tokens)


def _dsv4_batch(prepared: Prepared, ctx: int, budgets: list[int]) -> int:
    """Requests of ctx tokens both pools hold: ctx of the full pool, min(ctx, window) of the SWA pool, each rounded
    to the 256-token page; at most max_running_requests, the request slots the c128 state rings and the req-to-token
    pool are allocated for (a request beyond them has no state ring, whatever the token pools hold)."""
    s = dsv4_pools(prepared, budgets)
    page = sglang_dsv4.PAGE
    return min(s.full // base.pad_to(ctx, page), s.swa // base.pad_to(min(ctx, prepared.dsv4_window), page),
               s.max_running_requests)


def max_batch(prepared: Prepared, ctx: int, budgets: list[int]) -> int:
    if prepared.dsv4:
        return _dsv4_batch(prepared, ctx, budgets)
    if prepared.hybrid_swa:
        return _hybrid_swa_batch(prepared, ctx, budgets)
    if prepared.has_fixed_state():
        # fixed-size per-request state (cross K/V): charge whole requests against the budget
        return base.max_batch_by_bytes(prepared.stage_bytes, budgets, ctx)
    per = base.pad_to(ctx + prepared.encoder_tokens, prepared.page)
    n = _token_pool(prepared, budgets) // per if per else 0
    if prepared.mamba_per_req:  # each running request holds a state slot of the Mamba pool
        n = min(n, min(prepared.mamba_split(b)[0] for b in budgets))
    return n


SWA_FULL_TOKENS_RATIO = 0.8  # --swa-full-tokens-ratio default


def _swa_cells(prepared: Prepared, stage: int) -> tuple[int, int]:
    """(F, S): bytes one token takes in the stage's full-pool layers and in its SWA-pool layers."""
    caches = prepared.stages[stage]
    full = sum(prepared._token_bytes(c) for _, c in caches if _pooled(c) and _rule(c).pool == "full")
    swa = sum(prepared._token_bytes(c) for _, c in caches if _pooled(c) and _rule(c).pool == "swa")
    return full, swa


def hybrid_pool_tokens(prepared: Prepared, budgets: list[int]) -> tuple[int, int]:
    """(full pool tokens, SWA pool tokens) of a hybrid-SWA model; SGLang's max_total_num_tokens is the first (the
    SWA pool alone when the model has no full layer), r = --swa-full-tokens-ratio.

    0.5.10 (model_runner_kv_cache_mixin.py): capacity = rest // (F + S) floored to the page (min over pipeline
    stages, --max-total-tokens), then full = int(capacity x (F + S) / (F + r S)) floored to the page, F and S of the
    first stage (the model's layer lists). 0.5.23 (pool_configurator.py HybridSWAPoolConfigurator.calculate_pool_sizes,
    kv_cache_configurator.py _apply_token_constraints): full = int(rest // (F + r S)) per stage, min over stages and
    --max-total-tokens, floored to the page. Both: swa = int(full x r) floored to the page."""
    page, r = prepared.page, SWA_FULL_TOKENS_RATIO
    if not prepared.selected.rules.swa_ratio_cell:
        full, swa = _swa_cells(prepared, 0)
        cap = _token_pool(prepared, budgets)
        if not full:
            return 0, cap
        full_tokens = int(cap * (full + swa) / (full + r * swa)) // page * page
        return full_tokens, int(full_tokens * r) // page * page
    counts, all_swa = [], False
    for s in range(len(prepared.stages)):
        full, swa = _swa_cells(prepared, s)
        all_swa = all_swa or not full
        cell = full + r * swa if full else swa
        if cell:
            counts.append(int(max(0, budgets[s]) // cell))
    n = min(counts) if counts else 0
    if prepared.max_total_tokens:
        n = min(n, prepared.max_total_tokens)
    n = n // page * page
    if all_swa:
        return 0, n
    return n, int(n * r) // page * page


def _hybrid_swa_batch(prepared: Prepared, ctx: int, budgets: list[int]) -> int:
    """A request needs ctx full-pool tokens and min(ctx, window) SWA-pool tokens, each rounded to the page."""
    full_tokens, swa_tokens = hybrid_pool_tokens(prepared, budgets)
    caches = prepared.stages[0]
    windows = [c.span for _, c in caches if _pooled(c) and _rule(c).pool == "swa"]
    need_full = base.pad_to(ctx, prepared.page) if any(
        _pooled(c) and _rule(c).pool == "full" for st in prepared.stages for _, c in st) else 0
    need_swa = base.pad_to(min(ctx, max(windows)), prepared.page) if windows else 0
    fits_ = [t // need for t, need in ((full_tokens, need_full), (swa_tokens, need_swa)) if need]
    return min(fits_) if fits_ else 0


def fits(prepared: Prepared, ctx: int, batch: int, budgets: list[int]) -> bool:
    if not prepared.dsv4 and not prepared.hybrid_swa and prepared.has_fixed_state():
        return all(prepared.stage_bytes(ctx, batch, s) <= budgets[s] for s in range(len(prepared.stages)))
    return batch <= max_batch(prepared, ctx, budgets)


def capacity(prepared: Prepared, spec: ModelSpec, ctx: int, budgets: list[int], opts: dict[str, Any],
             gpu: base.GpuContext, max_model_len: int | None) -> base.Capacity:
    if prepared.dsv4:
        return _dsv4_capacity(prepared, ctx, budgets, opts, max_model_len)
    n = _token_pool(prepared, budgets)
    extra: dict[str, Any] = {}
    refusal = None
    if prepared.hybrid_swa:
        full_tokens, swa_tokens = hybrid_pool_tokens(prepared, budgets)
        n = full_tokens or swa_tokens
        extra = {"full_max_total_num_tokens": full_tokens, "swa_max_total_num_tokens": swa_tokens}
        windows = [c.span for st in prepared.stages for _, c in st if _pooled(c) and _rule(c).pool == "swa"]
        # 0.5.23 MemoryPoolConfigurator.validate_swa_pool_size: an SWA pool at or below window + page never admits
        floor = max(windows) + prepared.page if windows else 0
        if prepared.selected.rules.swa_ratio_cell and full_tokens and windows and floor >= swa_tokens:
            refusal = (f"SWA pool ({swa_tokens} tokens) cannot hold even one request: the prefill admission floor "
                           f"is sliding_window_size ({max(windows)}) + page_size ({prepared.page}) "
                           "(SGLang refuses to start)")
    context_len = int(opts.get("context_length") or prepared.context_len or max_model_len or ctx)
    est = min(max(int(n / context_len * 512), 2048), 4096) if context_len else 2048
    user = opts.get("max_running_requests")
    cap = min(int(user), est) if user else min(est, n // 2)  # _resolve_max_num_reqs
    if prepared.mamba_per_req:  # _resolve_max_num_reqs: at most max_mamba_cache_size // state slots a request
        k = min(prepared.mamba_split(b)[0] for b in budgets)
        cap = min(cap, k // prepared.mamba_ratio)
        extra = {"max_mamba_cache_size": k, "mamba_cache_per_req": prepared.mamba_per_req,
                 "mamba_slots_per_request": prepared.mamba_ratio}
        if k <= 0 or cap <= 0:
            refusal = (f"Not enough GPU memory for the hybrid state cache (max_mamba_cache_size {k}, "
                           f"{prepared.mamba_ratio} slots a running request; SGLang refuses to start)")
    start = n > 0 and refusal is None
    message = refusal if n > 0 else ("Not enough memory. Please try to increase --mem-fraction-static. "
                                         "(SGLang refuses to start)")
    held = ctx + prepared.encoder_tokens
    return base.Capacity(max_batch(prepared, ctx, budgets), n, round(n / held, 2) if ctx else None, cap, start, message,
                         None, {"max_total_num_tokens": n, **extra, "page_size": prepared.page,
                                "context_len": context_len})


def _dsv4_capacity(prepared: Prepared, ctx: int, budgets: list[int], opts: dict[str, Any],
                   max_model_len: int | None) -> base.Capacity:
    """DeepSeek-V4 (0.5.23): max_total_num_tokens is the full pool (MemoryPoolConfig.max_total_num_tokens);
    max_running_requests = min(--max-running-requests or 256, full // 2) (resolve_max_num_reqs)."""
    s = dsv4_pools(prepared, budgets)
    message = sglang_dsv4.swa_floor_message(s, prepared.dsv4_window)
    context_len = int(opts.get("context_length") or max_model_len or ctx)
    details = {"max_total_num_tokens": s.full, **s.to_json(), "max_running_requests": s.max_running_requests,
               "page_size": prepared.page, "context_len": context_len,
               "bytes_per_full_token": [st.bytes_per_full_token() for st in prepared.dsv4],
               "c128_state_fixed_bytes": [st.c128_state_fixed_bytes(prepared.dsv4_requests) for st in prepared.dsv4]}
    return base.Capacity(_dsv4_batch(prepared, ctx, budgets), s.full, round(s.full / ctx, 2) if ctx else None,
                         s.max_running_requests, message is None, message, None, details)
