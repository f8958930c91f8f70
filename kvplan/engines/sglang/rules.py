"""What changes between SGLang versions: one `Rules` row per rule set, written as the previous row plus what changed;
what kvplan has read of a cache kind by version (COVERAGE); the defaults SGLang derives from the GPU."""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvplan.engines import base, layout
from kvplan.engines.base import EngineInfo
from kvplan.engines.listing import LISTINGS
from kvplan.engines.versions import Selected, select
from kvplan.parallel import heads_floor
from kvplan.spec import KimiDeltaState, ShortConvState, SlidingLatent


@dataclass(frozen=True)
class Rules:
    fraction_tiers: bool  # mem_fraction_static from GPU-size tiers (0.5) vs the TP table (<= 0.4)
    # DSA fp8 latent on Blackwell (SM >= 10): the trtllm DSA backends read the plain 576-byte fp8 latent
    # (kv_cache_configurator.py calculate_mla_kv_cache_dim, 0.5.23); earlier 0.5 builds stored the 656-byte
    # scaled record there too (an 8x B200 DeepSeek-V3.2 log of 2025-10: 788 B per layer)
    dsa_blackwell_plain_fp8: bool = False
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
    # 0.5.23 (arg_groups/model_overrides/deepseek_v2.py): DSA's page on ROCm follows whether aiter's preshuffle
    # paged-MQA kernel is available, a property of the ROCm stack kvplan cannot see (0.5.10 server_args.py: page 1)
    dsa_rocm_page_by_stack: bool = False

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
V0_4 = Rules(fraction_tiers=False)
V0_5 = replace(V0_4, fraction_tiers=True, mamba_pool="k", mamba_radix_off=frozenset({"KimiLinearForCausalLM"}))
# 0.5.14-0.5.22: the rows differ from 0.5's in the Mamba pool only (the other rules were read in 0.5.10 and 0.5.23,
# not in between)
V0_5_14 = replace(V0_5, mamba_radix_off=frozenset(), mamba_extra_buffer=_EXTRA_0_5_14)
V0_5_16 = replace(V0_5_14, mamba_extra_buffer=_EXTRA_0_5_14 | {"KimiLinearForCausalLM"})
V0_5_17 = replace(V0_5_16, mamba_pool="k+1")
V0_5_19 = replace(V0_5_17, mamba_extra_buffer=V0_5_16.mamba_extra_buffer | {"Qwen3_5ForCausalLM",
                                                                             "Qwen3_5MoeForCausalLM"})
V0_5_23 = replace(V0_5_19, dsa_blackwell_plain_fp8=True, swa_ratio_cell=True, dsa_rocm_page_by_stack=True)
VERSIONS = [("0.4", V0_4), ("0.5", V0_5), ("0.5.14", V0_5_14), ("0.5.16", V0_5_16), ("0.5.17", V0_5_17),
            ("0.5.19", V0_5_19), ("0.5.23", V0_5_23)]

# What kvplan read of a cache kind, by rule set: COVERAGE is checked with the model refusals (models.py), STATE_COVERAGE
# when the Mamba pool's slots are sized (pools.py)
COVERAGE: dict[type, layout.Coverage] = {
    SlidingLatent: layout.Coverage((("0.5.23", None),), "sglang cannot size this deepseek-v4 model: SGLang 0.5.10 has "
                                   "no DeepSeek-V4 model (no srt/models/deepseek_v4.py)"),
}
STATE_COVERAGE: dict[type, layout.Coverage] = {
    # Kimi Linear (srt/models/kimi_linear.py, configs/kimi_linear.py) is a 0.5 model; the 0.4 rule set predates it
    KimiDeltaState: layout.Coverage((("0.5", None),), "sglang@{version} predates SGLang's Kimi Linear model "
                                    "(srt/models/kimi_linear.py); --engine sglang@0.5 or later plans it"),
    # LFM2 / LFM2-MoE (srt/models/lfm2.py, lfm2_moe.py) read in 0.5.10; the 0.4 rule set is not known to have them
    ShortConvState: layout.Coverage((("0.5", None),), "sglang@{version}: kvplan read SGLang's LFM2 models in 0.5.10 "
                                    "only; --engine sglang@0.5 plans it"),
}

MAMBA_FULL_MEMORY_RATIO = 0.9  # --mamba-full-memory-ratio default (server_args.py 0.5.10; arg_groups 0.5.23 fallback)
MAMBA_RUNNING_RATIO = 3  # MAMBA_CACHE_SIZE_MAX_RUNNING_REQUESTS_RATIO: state slots per running request, radix cache on
SWA_FULL_TOKENS_RATIO = 0.8  # --swa-full-tokens-ratio default
DSA_PAGE = 64  # arg_groups/model_overrides/deepseek_v2.py: DSA models run with page_size 64 (even over --page-size)
# ... on CUDA. On ROCm, 0.5.10's server_args.py sets page_size 1 for DSA models (an 0.5.8 MI355X GLM-5 log's KV size
# is N + 1 rows of the record); 0.5.23 sets 1 only where aiter's preshuffle paged-MQA kernel is unavailable (a
# property of the ROCm stack), else the pooled-index page: not modelled there
DSA_ROCM_PAGE = 1
AMD_GPU_WORDS = ("mi300", "mi325", "mi350", "mi355", "mi250", "instinct", "radeon")
KV_DTYPES = ("fp16", "bf16", "fp32", "fp8_e4m3", "fp8_e5m2")  # cache dtypes this engine can store
LISTED = LISTINGS["sglang"]
KNOBS = LISTED.knobs


def is_amd(gpu: base.GpuContext | None) -> bool:
    return gpu is not None and any(k in (gpu.name or "").lower() for k in AMD_GPU_WORDS)


default_kv_dtype = base.serving_kv_dtype  # `auto`


ENGINE = EngineInfo(
    name=LISTED.name, aliases=LISTED.aliases, summary=LISTED.summary, versions=VERSIONS, kv_dtypes=KV_DTYPES,
    knobs=KNOBS, default_kv_dtype=default_kv_dtype, honours_checkpoint_kv=True, uses_vllm_max_ctx=True,
    weight_float_dtype=base.serving_dtype, heads_per_gpu=heads_floor,
)


def select_version(requested: str | None) -> Selected[Rules]:
    return select(ENGINE.name, requested, VERSIONS)


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
    if gpu_mib <= reserved:  # a device smaller than what SGLang reserves (a size such as 1k): nothing is static
        return 0.0
    return round((gpu_mib - reserved) / gpu_mib, 3)
