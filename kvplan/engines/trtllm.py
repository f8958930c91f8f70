"""TensorRT-LLM paged KV cache, V1 manager (engines.md §5): pools [num_blocks, num_layers, kv_factor, H_kv *
tokens_per_block * D], one primary pool per (window size, head count); kv_factor 2, or 1 for MLA (head =
kv_lora_rank + rope). KV heads per GPU = ceil(H / tp). A request needs cdiv(ctx, tokens_per_block) blocks.

Windows: the V1 manager takes attention windows only from KvCacheConfig.max_attention_window (None by default); the
PyTorch backend's models hand their sliding window to the attention op instead (modeling_cohere2.py:
attention_window_size per forward), and _torch/pyexecutor/_util.py builds variable-window pools only when that list
holds more than one window (is_vswa_enabled). So by default every layer, sliding or chunked, keeps the whole
context; NVIDIA's own Gemma 3 VSWA recipe sets the list by hand (Dynamo engine_configs/gemma3/vswa_agg.yaml:
max_attention_window [512 x 5, 32768]), the PR that brought Gemma 3 to the PyTorch backend (#3999) left windowed pools
for later, and kvcache.md says only V2 derives windows from layer_types.

A launch that sets max_attention_window (VSWA) is not modelled, because what it does changed across the releases
kvplan sizes and no release tree could be read here: the pool each window gets was the C++
BaseKVCacheManager::calculateMaxNumBlocks share (calculateWindowSizeToShare: bytes per token x window, after PR
#6481 of July 2025 removed a second factor of the layer count), then equal shares per window in Python
(calculate_max_num_blocks_for_vswa, overridable by TRTLLM_WINDOW_SIZE_SHARES, PR #7923 of September 2025); and a
sliding pool's reservation per request grew from min(length, window) blocks to min(length, window + a temporary
window of up to max_num_tokens) with paged context FMHA (WindowBlockManager::calculateTemporaryAttentionWindow),
while PR #6768 (SWA KV cache reuse) changed how sliding pools allocate. Which combination 1.2 ships is not
established.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from kvplan import dtypes
from kvplan.engines import base, layout
from kvplan.engines.base import EngineInfo, KVDtypes, PlanGroup, cdiv, tensor
from kvplan.engines.listing import LISTINGS
from kvplan.engines.versions import Selected, select
from kvplan.errors import InputError
from kvplan.parallel import heads_ceil
from kvplan.spec import (MsaIndexerKeys, ChunkedLocal, CrossAttention, FullAttention, IndexerKeys, LatentAttention, LayerCache,
                         KimiDeltaState, LightningState, LinearAttentionState, MambaState, ModelSpec, NoCache,
                         RecurrentState, SharedKV, ShortConvState, SlidingLatent, SlidingWindow, SparseLatentAttention, WindowBeyondContext)


@dataclass(frozen=True)
class Rules:
    tokens_per_block: int
    blocks_round_up: bool  # max_tokens -> blocks rounded up (the July 2025 PyTorch-backend log: 860,308 -> 860,320)


# 1.2 (1.2.0 2026-03, 1.2.1 2026-04, the newest release): 1.0's rules (see LAST_V1_PRERELEASE below); 1.2's own
# llm_args.py was not read (no 1.2 source here) and its release notes change no KV cache default.
VERSIONS = [("0.10", Rules(64, True)), ("1.0", Rules(32, True)), ("1.2", Rules(32, True))]
KV_DTYPES = ("fp16", "bf16", "fp32", "fp8_e4m3")  # cache dtypes this engine can store
LISTED = LISTINGS["trtllm"]
KNOBS = LISTED.knobs
ENGINE = EngineInfo(
    name=LISTED.name, aliases=LISTED.aliases, summary=LISTED.summary, versions=VERSIONS, kv_dtypes=KV_DTYPES,
    knobs=KNOBS, default_kv_dtype=base.serving_dtype, honours_checkpoint_kv=True, uses_vllm_max_ctx=True,
    weight_float_dtype=base.serving_dtype, heads_per_gpu=heads_ceil,
)


# TensorRT-LLM chooses its KV cache manager per model from mid-2026: use_kv_cache_manager_v2 defaults to "auto",
# resolved from the model class's get_model_defaults() (llmapi/llm_utils.py _resolve_kv_cache_manager_v2_auto, PR
# #15823 of July 2026, where only DeepSeek-V4 opted in), then GPT-OSS (#16942, opened 2026-07-28), Kimi K2.5 (#17125),
# MiniMax-M2 (#17360), Gemma 3/4 (#17396), Llama, Kimi Linear, the Mamba hybrids and the sparse-attention models
# (docs/source/features/kvcache.md "Selecting the KV Cache Manager"). So 1.3.0rc0-rc22 (up to 2026-07-22) still run
# every model but DeepSeek-V4 (refused by family) on the V1 manager, and later pre-releases are refused. 1.1.0
# (2025-12) and 1.2.x (2026-03/04) predate all of it (the "enable V2 by default" PRs #12837 / #15407 closed unmerged);
# V1's KvCacheConfig defaults (tokens_per_block 32, free_gpu_memory_fraction 0.9) are 1.0's and the 1.3.0rc27 /
# 1.4.0rc4 references still list them.
LAST_V1_PRERELEASE = "1.3.0rc22"
# PR #12185 (merged about mid-April 2026) moved a hybrid's Mamba state into the KV pool (CppMambaHybridCacheManager);
# 1.3.0rc8 shipped on 2026-03-17 without it, and which pre-release first had it is not established (rc12 or rc13):
# kvplan refuses hybrids from the later one
MAMBA_IN_POOL_FROM = "1.3.0rc13"


def release_key(version: str) -> tuple[int, int, int, float]:
    """'1.3.0rc7' -> (1, 3, 0, 7); '1.2' / '1.2.1' / '1.3' -> (.., inf): a final release sorts after its candidates."""
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.(\d+))?(?:rc(\d+))?(?:\.(?:post|dev)\d+)*(?:\+\S*)?", version.strip().lower())
    if not m:
        raise InputError(f"{ENGINE.name}@{version}: not a TensorRT-LLM version (e.g. 1.2, 1.2.1, 1.3.0rc7)")
    major, minor, patch, rc = m.groups()
    return int(major), int(minor), int(patch or 0), float(rc) if rc is not None else float("inf")


def select_version(requested: str | None) -> Selected[Rules]:
    if requested is None:
        return select(ENGINE.name, requested, VERSIONS)
    key = release_key(requested)
    if key > release_key(LAST_V1_PRERELEASE):
        raise InputError(
            f"{ENGINE.name}@{requested}: TensorRT-LLM pre-releases after {LAST_V1_PRERELEASE} (July 2026) choose "
            "KVCacheManagerV2 per model by default (use_kv_cache_manager_v2 'auto': GPT-OSS, Gemma 3/4, Llama, the "
            "Mamba hybrids, the sparse-attention models, ...), whose pools kvplan has not laid out; for a launch on "
            "the V1 manager (use_kv_cache_manager_v2: false) size it as trtllm@1.2")
    selected = select(ENGINE.name, requested, VERSIONS)
    if key[:2] == (1, 3):
        note = (f"{ENGINE.name}@{requested}: a pre-release up to {LAST_V1_PRERELEASE}, the V1 manager for every model "
                f"(per-model KVCacheManagerV2 defaults came after it) with {ENGINE.name}@{selected.version}'s defaults")
        selected = Selected(selected.name, selected.version, requested, selected.rules, note)
    return selected


# The first release that can run an architecture, where an older one certainly cannot: the model came out after that
# release shipped or after its release candidates, or a later change added it (from a 1.3 pre-release on). Release
# notes are not enough on their own: 1.1's say "Add GPT-OSS model support", yet NVIDIA's GPT-OSS quick-start recipe ran
# it on the 1.0.0rc6 container. Not gated where unsure: Qwen3-Next / Qwen3-VL and Nemotron-3 on 1.1 (1.2's notes add
# the first two; Nemotron-3's PR was opened after 1.1's release candidates began). An older rule set refuses a gated
# model rather than size it for a release that cannot load it. Nemotron-3 shares NemotronHForCausalLM with Nemotron-H
# and is told apart by its MoE layers (release_gate).
_AFTER_1_0 = "1.0 shipped on 2025-09-24 without it"
_QWEN3_5 = ("1.3.0rc8", "Qwen3.5", "PR #12242 added it on 2026-03-16, after 1.2.0 and 1.3.0rc7 shipped")
FIRST_RELEASE = {
    "DeepseekV32ForCausalLM": ("1.1", "DeepSeek-V3.2", f"the model came out on 2025-09-29; {_AFTER_1_0}"),
    "MiniMaxM2ForCausalLM": ("1.1", "MiniMax-M2", f"the model came out on 2025-10-27; {_AFTER_1_0}"),
    "Qwen3NextForCausalLM": ("1.1", "Qwen3-Next", f"the model came out on 2025-09-11, during 1.0's release candidates; "
                                                  f"{_AFTER_1_0} (1.2's release notes add it)"),
    **dict.fromkeys(("Qwen3VLForConditionalGeneration", "Qwen3VLMoeForConditionalGeneration"),
                    ("1.1", "Qwen3-VL", f"the model came out on 2025-09-23; {_AFTER_1_0} (1.2's release notes add it)")),
    **dict.fromkeys(("Qwen3_5ForCausalLM", "Qwen3_5ForConditionalGeneration", "Qwen3_5MoeForCausalLM",
                     "Qwen3_5MoeForConditionalGeneration"), _QWEN3_5),
    "GlmMoeDsaForCausalLM": ("1.3.0rc8", "GLM-5", "NVIDIA's GLM-5 deployment guide: 'Minimum TensorRT LLM version: "
                                                 "1.3.0rc8'"),
    **dict.fromkeys(("KimiLinearForCausalLM", "KimiK3ForConditionalGeneration"),
                    ("1.3.0rc23", "Kimi Linear / Kimi-K3", "PR #17269 added it in August 2026")),
}
# NemotronHForCausalLM with MoE layers (Nemotron-3 Nano / Super / Ultra): PR #9261 ("Add support for nano-v3 and
# super-v3 with pytorch backend", opened 2025-11-18) brought its MoE blocks to the PyTorch backend
NEMOTRON_3 = ("1.1", "Nemotron-3", f"PR #9261, opened on 2025-11-18, added them; {_AFTER_1_0}")
# classes whose MoE variant arrived later than the class: class -> (row, what an older release lacks)
FIRST_RELEASE_WITH_MOE = {"NemotronHForCausalLM": (NEMOTRON_3, "NemotronHForCausalLM with MoE layers")}


def release_gate(spec: ModelSpec) -> tuple[tuple[str, str, str] | None, str]:
    """FIRST_RELEASE's row for the model and what an older release lacks: by architecture, and Nemotron-3 apart from
    the Nemotron-H it shares one with."""
    moe = FIRST_RELEASE_WITH_MOE.get(spec.architecture)
    if moe is not None and spec.widths.experts_per_token:
        return moe
    return FIRST_RELEASE.get(spec.architecture), spec.architecture


def check_release_runs(spec: ModelSpec, selected: Selected[Rules]) -> None:
    """Refuse an architecture the selected release cannot load (FIRST_RELEASE), in one line."""
    first, missing = release_gate(spec)
    version = selected.asked
    if first and release_key(version) < release_key(first[0]):
        on_v2 = release_key(first[0]) > release_key(LAST_V1_PRERELEASE)
        later = (f"{first[0]}, after {LAST_V1_PRERELEASE}: on KVCacheManagerV2, not modelled" if on_v2
                 else f"{first[0]}: --engine {ENGINE.name}@{first[0]}")
        raise layout.UnsupportedKind(f"{ENGINE.name}@{version} cannot size this {first[1]} model: TensorRT-LLM "
                                     f"{version} has no {missing} ({first[2]}); it runs from {later}")


heads_per_gpu = heads_ceil


# ---------------------------------------------------------------------------------------------- kind rules
@dataclass(frozen=True)
class BlockPool:
    """A primary pool [blocks, layers, kv_factor, heads x tokens_per_block x dim] per head count; a request needs
    cdiv(ctx, tokens_per_block) blocks. fixed: cross attention holds the encoder's length and stays out of
    max_tokens' bytes per token."""

    fixed: bool = False

    def tokens(self, c: FullAttention, ctx: int) -> int:
        if self.fixed:
            return c.span
        return ctx

    def token_bytes(self, c: FullAttention, p: "Prepared") -> int:
        """get_cache_size_per_token for one layer: kv_factor x heads x head dim x element size."""
        k, v = c.token_elems(heads_ceil(c.kv_heads, p.tp))
        return p.kvd.k.nbytes(k) + p.kvd.v.nbytes(v)

    @property
    def per_request_bytes(self) -> bool:
        """fit charges whole requests' bytes (fixed-size caches) instead of counting blocks."""
        return self.fixed

    @property
    def in_max_tokens(self) -> bool:
        return not self.fixed

    def dtype_label(self, kvd: KVDtypes) -> str:
        return kvd.label

    def group(self, c: LayerCache, layers: list[int], ctx: int, batch: int, p: "Prepared") -> PlanGroup:
        n = len(layers)
        blocks = cdiv(self.tokens(c, ctx), p.tpb) * batch
        per_block = self.token_bytes(c, p) * p.tpb
        t = tensor(f"pool [blocks, {n} layers, kv_factor, heads x {p.tpb} tokens x dim]", (blocks * n * per_block,), "uint8")
        grows = self.tokens(c, ctx + 1) > self.tokens(c, ctx)
        return PlanGroup(
            kind=c.kind, layer_ids=tuple(layers), tokens=cdiv(self.tokens(c, ctx), p.tpb) * p.tpb,
            dtype=self.dtype_label(p.kvd), bytes=t.total_bytes, bytes_per_token=self.token_bytes(c, p) * n if grows else 0,
            tensors=(t,), description=c.describe(), **layout.geometry(c, p.tp, ENGINE.heads_per_gpu),
        )


@dataclass(frozen=True)
class LatentBlockPool(BlockPool):
    """MLA: kv_factor 1, one 'head' of kv_lora_rank + rope in the K dtype."""

    def tokens(self, c: LatentAttention, ctx: int) -> int:
        return ctx

    def token_bytes(self, c: LatentAttention, p: "Prepared") -> int:
        return p.kvd.k.nbytes(c.latent_dim)

    def dtype_label(self, kvd: KVDtypes) -> str:
        return kvd.k.name


@dataclass(frozen=True)
class IndexerBlockPool(LatentBlockPool):
    """DSA indexer keys (_torch/attention_backend/sparse/dsa/cache_manager.py DSACacheManager): a uint8 pool sharing
    the latent pool's block ids, fp8 keys + an fp32 scale per 128 per token, counted in get_cache_size_per_token
    and not scaled by the KV dtype."""

    def token_bytes(self, c: IndexerKeys, p: "Prepared") -> int:
        return c.fp8_record_bytes

    def dtype_label(self, kvd: KVDtypes) -> str:
        return "fp8+scales"


@dataclass(frozen=True)
class StateBuffers:
    """Mamba conv (kernel - 1, conv_dim / tp) and SSM states, in the state dtype (the model dtype under
    mamba_ssm_cache_dtype "auto"): MambaHybridCacheManager allocates them for max_batch_size slots before the KV
    pool is sized (_torch/pyexecutor/mamba_cache_manager.py MambaCacheManager.__init__), so KvCacheCreator's profile
    counts them as used memory and the pool's tokens are attention-only; a request is charged no state bytes."""

    per_request_bytes = False
    in_max_tokens = False
    reserved_slots = True

    def token_bytes(self, c: RecurrentState, p: "Prepared") -> int:
        return 0

    def group(self, c: RecurrentState, layers: list[int], ctx: int, batch: int, p: "Prepared") -> PlanGroup:
        n = len(layers)
        # conv_dim / tp as before: whether TensorRT-LLM replicates Mamba-2 groups tp does not divide (as vLLM and
        # SGLang do, MambaState.conv_shape) is not read here
        conv = RecurrentState.conv_shape(c, p.tp)
        tensors = (tensor("conv_state", (batch, *conv), p.state, n),
                   tensor("ssm_state", (batch, *c.ssm_shape_for(p.tp)), p.state, n))
        return PlanGroup(c.kind, tuple(layers), None, None, None, None, 0, p.state.name,
                         sum(t.total_bytes for t in tensors), 0, tensors, c.describe())


KIND_RULES: dict[type, Any] = {
    FullAttention: BlockPool(),
    WindowBeyondContext: BlockPool(),  # a window beyond the context is full attention here
    SlidingWindow: BlockPool(),  # full length: no max_attention_window by default (module docstring)
    ChunkedLocal: BlockPool(),  # likewise (kvcache.md: "chunked attention does not partition the pools")
    CrossAttention: BlockPool(fixed=True),
    LatentAttention: LatentBlockPool(),
    SparseLatentAttention: LatentBlockPool(),  # DSACacheManager: the plain 576-wide latent pool (no 656 B record)
    IndexerKeys: IndexerBlockPool(),
    MsaIndexerKeys: layout.NotModelled("TensorRT-LLM's MiniMax-M3 sparse attention (sparse_attention_config algorithm minimax_m3) is not in the source kvplan read"),
    MambaState: StateBuffers(),
    LinearAttentionState: StateBuffers(),
    ShortConvState: layout.Unsupported("TensorRT-LLM has no model with short-convolution layers (LFM2: "
                                       "Lfm2ForCausalLM is in neither of its model registries)"),
    LightningState: layout.Unsupported("TensorRT-LLM has no MiniMax-Text-01 / MiniMax-M1 model "
                                       "(tensorrt_llm/_torch/models/_arch_index.py MODEL_ARCH_TO_MODULE lists "
                                       "MiniMax-M2 and MiniMax-M3 only)"),
    KimiDeltaState: layout.Unsupported("TensorRT-LLM runs Kimi Delta Attention only from pre-releases after "
                                       "1.3.0rc22 (PR #17269, August 2026), on KVCacheManagerV2, which kvplan does "
                                       "not model"),
    SharedKV: layout.NO_CACHE,
    NoCache: layout.NO_CACHE,
    **layout.DEEPSEEK_V4_NOT_MODELLED,
}


def _rule(c: LayerCache):
    return layout.rule_for(ENGINE.name, KIND_RULES, c)


# ---------------------------------------------------------------------------------------------- layout
@dataclass(frozen=True)
class Prepared(layout.StagedLayout):
    selected: Selected[Rules]
    stages: tuple[layout.Caches, ...]
    kvd: KVDtypes
    tpb: int
    tp: int
    pp: int
    state: dtypes.DType
    assumptions: tuple[str, ...]
    max_tokens: int | None = None

    @property
    def label(self) -> str:
        return self.selected.label

    def token_bytes(self, c: LayerCache) -> int:
        return _rule(c).token_bytes(c, self)

    def bytes_per_token(self, stage: int) -> int:
        return sum(self.token_bytes(c) for _, c in self.stages[stage] if getattr(_rule(c), "in_max_tokens", False))

    def charges_requests(self) -> bool:
        return any(getattr(_rule(c), "per_request_bytes", False) for st in self.stages for _, c in st)

    def state_slot_bytes(self, stage: int) -> int:
        """One slot of the stage's Mamba state buffers (conv + SSM of its state layers)."""
        return sum(_rule(c).group(c, [i], 1, 1, self).bytes for i, c in self.stages[stage]
                   if getattr(_rule(c), "reserved_slots", False))

    def groups_of(self, ctx: int, batch: int, stage: int) -> list[PlanGroup]:
        out = []
        for c, layers, rule in layout.groups(ENGINE.name, KIND_RULES, self.stages[stage]):
            out.append(layout.no_cache_group(c, layers) if isinstance(rule, layout.NoCacheRule)
                       else rule.group(c, layers, ctx, batch, self))
        return out

    def details(self, ctx: int, batch: int, stage: int) -> dict[str, Any]:
        return {"tokens_per_block": self.tpb, "bytes_per_token": self.bytes_per_token(stage)}


# Families whose TensorRT-LLM code kvplan has not read (no source here): refused rather than sized by another rule
# T5 / BART / Whisper: TensorRT-LLM keeps cross-attention K/V in a second KV cache manager that is handed
# cross_kv_cache_fraction (0.5 in its examples) of the free memory, the self-attention manager the rest
# (cpp/tensorrt_llm/batch_manager/trtGptModelInflightBatching.cpp: for any model with useCrossAttention(),
# createKvCacheManager(kSELF, free x (1 - fraction)) and (kCROSS, free x fraction); the fraction has no default,
# "Must set crossKvCacheFraction for encoder-decoder model"); kvplan's one block pool does not reproduce that split.
# Whisper runs there as an encoder-decoder engine pair (examples/models/core/whisper), so it takes the same path.
_ENC_DEC = ("not modelled: TensorRT-LLM holds cross-attention K/V in a separate KV cache manager given "
            "cross_kv_cache_fraction of the memory (trtGptModelInflightBatching.cpp), a split kvplan's pool does not "
            "reproduce")
# Families neither of TensorRT-LLM's registries lists (tests/data/trtllm-architectures.yaml: the PyTorch backend's
# _torch/models/_arch_index.py MODEL_ARCH_TO_MODULE and the TensorRT-engine flow's tensorrt_llm/models MODEL_MAP, read in
# main 2026): it cannot load them, so no layout rule applies. tests/test_trtllm_architectures.py checks each family's
# architectures against both lists.
_NO_MODEL = {  # the model as messages name it: (its name, the classes its configs carry, its config model types)
    "lfm2": ("LFM2", "Lfm2ForCausalLM", ("lfm2", "lfm2_moe")),
    "falcon-h1": ("Falcon-H1", "FalconH1ForCausalLM", ("falcon_h1",)),
    "granite-hybrid": ("Granite-4.0-H", "GraniteMoeHybridForCausalLM", ("granitemoehybrid",)),
    "bamba": ("Bamba", "BambaForCausalLM", ("bamba",)),
    "jamba": ("Jamba", "JambaForCausalLM", ("jamba",)),
    # a fork's modeling_mimo_v2_flash.py (WeiHaocheng/TensorRT-LLM, not merged) pads V to the 192-wide K in the cache
    "mimo-v2-flash": ("MiMo-V2-Flash", "MiMoV2FlashForCausalLM", ("mimo_v2_flash",)),
    "smollm3": ("SmolLM3", "SmolLM3ForCausalLM", ("smollm3",)),
    "zamba2": ("Zamba2", "Zamba2ForCausalLM", ("zamba2",)),
    "gemma3n": ("Gemma-3n", "Gemma3nForConditionalGeneration / Gemma3nForCausalLM", ("gemma3n", "gemma3n_text")),
}
# keyed by the model class (layout.model_row), or by model_type where TensorRT-LLM has no class of that type at all
REFUSED: dict[str, layout.Refusal] = {
    **{t: layout.Refusal(family, f"TensorRT-LLM has no {name} model ({arch} is in neither _torch/models/_arch_index.py "
                                 "MODEL_ARCH_TO_MODULE nor tensorrt_llm/models MODEL_MAP)")
       for family, (name, arch, types) in _NO_MODEL.items() for t in types},
    # Llama-3.2-Vision: the PyTorch backend's _torch/models/modeling_mllama.py builds the cross-attention layers as
    # None ("TODO: Cross-attention decoder layer impl.") and runs text only (skip_cross_attention); the TensorRT-engine
    # flow (models/mllama, enc-dec cross KV pools) is not read here
    **layout.refusals("not modelled: TensorRT-LLM's PyTorch backend runs Llama-3.2-Vision text-only (its "
                      "cross-attention layers are not built: _torch/models/modeling_mllama.py), and kvplan has not read "
                      "its TensorRT-engine flow (models/mllama)", "mllama", "MllamaForConditionalGeneration"),
    **{t: layout.Refusal(t, _ENC_DEC) for t in ("t5", "mt5", "bart", "mbart", "whisper")},
    # Read in NVIDIA/TensorRT-LLM main (2026, after the 1.2.1 wheel; the model files are newer than the 1.0 rules):
    # docs/source/features/kvcache.md "Selecting the KV Cache Manager" routes Gemma 4's hybrid attention and the
    # sparse-attention models to KVCacheManagerV2 unconditionally, and Gemma3/Gemma4 to V2 by default
    # (NVIDIA/TensorRT-LLM#17396); V2's per-layer-group pools (head_dim_per_layer, pool_ratio) are not laid out here
    **layout.refusals("not modelled: TensorRT-LLM (_torch/models/modeling_gemma4.py) runs Gemma 4 on "
                      "KVCacheManagerV2 unconditionally (docs/source/features/kvcache.md: its per-layer buffer layouts, "
                      "head_dim 256 sliding / global_head_dim 512 full, cannot be represented by V1's unified pool), "
                      "whose pools kvplan has not laid out", "gemma4", "gemma4", "gemma4_text"),
    # modeling_step3p7.py (registered as Step3p5ForCausalLM) passes the sliding window per forward
    # (Step3p7Attention.forward: attention_window_size or sliding_window) and names FlashInfer + KVCacheManagerV2 its
    # production path; which release first ran it on V1 was not established, so no V1 figure is given
    **layout.refusals("not modelled: TensorRT-LLM (_torch/models/modeling_step3p7.py) names FlashInfer on "
                      "KVCacheManagerV2 its production path, whose pools kvplan has not laid out, and the first release "
                      "that runs it on the V1 manager is not established", "step-3.7",
                      "Step3p7ForConditionalGeneration", "Step3p7FlashForCausalLM"),
}
# DeepSeek-V4's caches: the whole model is refused first, in these words
REFUSED_KINDS: dict[type, layout.Refusal] = {
    SlidingLatent: layout.Refusal("deepseek-v4", "not modelled: TensorRT-LLM (_torch/models/modeling_deepseekv4.py) "
                                  "runs DeepSeek-V4 on KVCacheManagerV2 with auxiliary per-layer sparse-attention "
                                  "buffers (docs/source/features/kvcache.md), which kvplan has not laid out"),
}


def prepare(spec: ModelSpec, tp: int, pp: int, kvd: KVDtypes, selected: Selected[Rules], opts: dict[str, Any],
            gpu: base.GpuContext | None = None) -> Prepared:
    layout.refuse_model(ENGINE.name, REFUSED, spec)
    for kind, refusal in REFUSED_KINDS.items():
        if any(isinstance(c, kind) for _, c in spec.caches):
            raise layout.UnsupportedKind(f"{ENGINE.name} cannot size this {refusal.name} model: {refusal.why}")
    check_release_runs(spec, selected)
    layout.check_rules(ENGINE.name, KIND_RULES, spec.caches)
    layout.refuse_parallel_hybrid(ENGINE.name, spec.caches, "TensorRT-LLM's source for it is not read here")
    tpb = int(opts.get("tokens_per_block") or selected.rules.tokens_per_block)
    notes = [f"{tpb} tokens per block" + ("" if opts.get("tokens_per_block") else f" (TensorRT-LLM {selected.version} default)"),
             "KV heads per GPU = ceil(heads / tp); MLA kv_factor 1 (latent only)"]
    if {type(c) for _, c in spec.caches} & {SlidingWindow, ChunkedLocal}:
        notes.append("sliding/chunked layers keep the whole context: TensorRT-LLM's V1 manager takes windows only "
                     "from KvCacheConfig.max_attention_window (unset by default); a launch that sets it (VSWA) is not "
                     "modelled (its per-window memory split and sliding reservations changed between releases)")
    if any(isinstance(_rule(c), StateBuffers) for _, c in spec.caches):
        version = selected.asked
        if release_key(version) >= release_key(MAMBA_IN_POOL_FROM):
            raise layout.UnsupportedKind(
                f"{ENGINE.name}@{version}: from PR #12185 (merged about mid-April 2026; the first pre-release with it, "
                f"around {MAMBA_IN_POOL_FROM}, is not established) TensorRT-LLM keeps a hybrid's Mamba state as blocks "
                "in the KV pool (CppMambaHybridCacheManager), whose sizing kvplan has not read; trtllm@1.2 plans the "
                "separate state buffers of the releases before it")
        notes.append(f"Mamba state buffers for max_batch_size ({int(opts.get('max_batch_size') or DEFAULT_MAX_BATCH_SIZE)}) "
                     "slots, allocated before the KV pool and counted as used memory by its profile "
                     "(MambaHybridCacheManager); the pool's tokens are the attention layers'")
    if selected.note:
        notes.append(selected.note)
    state = kvd.state or base.serving_dtype(spec)
    cap = opts.get("max_tokens")
    return Prepared(selected, layout.stages(spec, pp), kvd, tpb, tp, pp, state, tuple(notes), int(cap) if cap else None)


# ---------------------------------------------------------------------------------------------- budget, capacity
DEFAULT_MAX_BATCH_SIZE = 2048  # LLM API BuildConfig.max_batch_size default


def budget(prepared: Prepared, spec: ModelSpec, gpu: base.GpuContext, stage: int, weights: int,
           opts: dict[str, Any], reserve: int | None, dtype_bytes: int) -> base.Budget:
    """KvCacheCreator (PyTorch backend): free_gpu_memory_fraction x (memory free after weights and the
    profiling peak at max_num_tokens)."""
    from kvplan.engines import overhead

    frac = float(opts.get("free_gpu_memory_fraction") or 0.9)
    if reserve is not None:
        other = reserve
        parts = [base.BudgetPart("reserve", "reserve (--reserve)", -reserve)]
    else:
        act = overhead.forward_activation(spec, overhead.TRTLLM_MAX_NUM_TOKENS, prepared.tp, dtype_bytes)
        ctxb = overhead.CUDA_CONTEXT_BYTES + (overhead.NCCL_BYTES if prepared.tp * prepared.pp > 1 else 0)
        other = act + ctxb
        parts = [base.BudgetPart("activation", "activation peak at max_num_tokens 8192 (estimate)", -act),
                 base.BudgetPart("cuda_context", "CUDA context/NCCL (estimate)", -ctxb)]
    slot = prepared.state_slot_bytes(stage)
    if slot:  # the Mamba state buffers, live while KvCacheCreator profiles: used memory before the fraction
        slots = int(opts.get("max_batch_size") or DEFAULT_MAX_BATCH_SIZE)
        other += slots * slot
        parts.append(base.BudgetPart("mamba_state", f"Mamba state buffers: {slots} slots (max_batch_size) x {slot:,} B",
                                     -slots * slot))
    free = gpu.cuda_total - weights - other
    kv = int(free * frac)
    parts = [base.BudgetPart("total", "total", gpu.cuda_total), base.BudgetPart("weights", "weights", -weights), *parts,
             base.BudgetPart("fraction", f"x free_gpu_memory_fraction {frac}", kv - free)]
    return base.Budget(kv, tuple(parts), (f"free_gpu_memory_fraction {frac}" + ("" if opts.get("free_gpu_memory_fraction") else " (default)"),))


def _max_tokens(prepared: Prepared, budgets: list[int]) -> int:
    """max_tokens = kv // bytes_per_token (min over stages, min with --max-tokens), rounded UP to whole blocks
    as the July 2025 PyTorch-backend log shows (860,308 requested -> 860,320 = 26,885 x 32)."""
    counts = [max(0, budgets[s]) // prepared.bytes_per_token(s) for s in range(len(prepared.stages)) if prepared.bytes_per_token(s)]
    n = min(counts) if counts else 0
    if prepared.max_tokens:
        n = min(n, prepared.max_tokens)
    return cdiv(n, prepared.tpb) * prepared.tpb if prepared.selected.rules.blocks_round_up else n // prepared.tpb * prepared.tpb


def max_batch(prepared: Prepared, ctx: int, budgets: list[int]) -> int:
    tokens = _max_tokens(prepared, budgets)
    blocks = tokens // prepared.tpb
    per = cdiv(ctx, prepared.tpb)
    if prepared.charges_requests():
        # window pools / state: charge a request's bytes against the budget
        return min(max(0, budgets[s]) // max(1, prepared.stage_bytes(ctx, 1, s)) for s in range(len(prepared.stages)))
    return blocks // per if per else 0


def fits(prepared: Prepared, ctx: int, batch: int, budgets: list[int]) -> bool:
    return batch <= max_batch(prepared, ctx, budgets)


def capacity(prepared: Prepared, spec: ModelSpec, ctx: int, budgets: list[int], opts: dict[str, Any],
             gpu: base.GpuContext, max_model_len: int | None) -> base.Capacity:
    tokens = _max_tokens(prepared, budgets)
    cap = int(opts.get("max_batch_size") or DEFAULT_MAX_BATCH_SIZE)
    return base.Capacity(max_batch(prepared, ctx, budgets), tokens, round(tokens / ctx, 2) if ctx else None, cap,
                         tokens > 0, None if tokens > 0 else "no memory left for the KV cache", None,
                         {"blocks": tokens // prepared.tpb, "tokens_per_block": prepared.tpb})
