"""Per-model facts of vLLM as tables keyed by what vLLM keys on (the model class, `architectures[0]`, or the
config's model_type where vLLM has no class at all), and the refusals they imply.

Nothing here compares a family name: a model of a new family built of existing cache kinds needs no row, and a row
is added only where vLLM's own model code or registry treats a class specially.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from kvplan.dtypes import DType
from kvplan.engines import layout
from kvplan.engines.versions import Selected, version_key
from kvplan.engines.vllm.rules import ENGINE, Rules
from kvplan.errors import InputError
from kvplan.spec import FullAttention, ModelSpec, SharedKV, SlidingWindow, WindowBeyondContext

# vLLM 0.32's model_executor/models/registry.py _PREVIOUSLY_SUPPORTED_MODELS, as data: an architecture (config.json
# `architectures[0]`) vLLM stopped loading, and the last release that loaded it ("was supported in vLLM until
# v<version>"); kvplan refuses the versions after that release rather than size a model the engine would not start
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
# Model classes without SupportsPP (vLLM refuses --pipeline-parallel-size > 1 for them at start-up): class -> (the
# model's name in the message, why)
_GEMMA3N_NO_PP = ("gemma3n", "models/gemma3n.py Gemma3nForCausalLM and gemma3n_mm.py Gemma3nForConditionalGeneration "
                             "do not implement SupportsPP")
NO_PIPELINE: dict[str, tuple[str, str]] = {
    "Zamba2ForCausalLM": ("zamba2", "models/zamba2.py Zamba2ForCausalLM does not implement SupportsPP"),
    "Gemma3nForCausalLM": _GEMMA3N_NO_PP,
    "Gemma3nForConditionalGeneration": _GEMMA3N_NO_PP,
}
# Classes whose attention uses every head for K/V (no KV-head replication), so tp must divide the heads
HEADS_NOT_REPLICATED = {"Zamba2ForCausalLM": "vLLM's Zamba2Attention asserts num_attention_heads % tp == 0 (its K/V "
                                             "use every head, there is no KV-head replication; models/zamba2.py)"}
# Classes whose KV-shared layers point at a target computed from the first shared layer (_check_kv_sharing)
KV_SHARING_BY_OFFSET = frozenset({"Gemma3nForCausalLM", "Gemma3nForConditionalGeneration"})
# Classes whose sliding layers get per_layer_sliding_window = sliding_window + 1 (Rules.cohere2_window_plus_one)
WINDOW_PLUS_ONE = {"Cohere2ForCausalLM": "Cohere2 sliding layers: window sliding_window + 1 (models/commandr.py "
                                         "CohereAttention)"}

# Classes vLLM only ever ran on its V0 engine, and the last release that had them (registry.py _PREVIOUSLY_SUPPORTED_MODELS: "supported in vLLM until v<version>").
# Llama-3.2-Vision: models/mllama.py declared SupportsV0Only up to its removal with V0's encoder-decoder runner (vLLM
# PR #24907, Sep 2025), and engine/arg_utils.py _is_v1_supported_oracle sent such models to V0; kvplan's rule sets
# model V1 only.
V0_ONLY: dict[str, str] = {"MllamaForConditionalGeneration": "0.10.2"}
# Encoder-decoders other than Whisper have no model on vLLM's V1 engine, the only one kvplan lays out (every rule set
# here): BART / mBART ran on V0 alone and left with it ("Remove V0 Encoder-Decoder Support", PR #24907, Sept 2025);
# 0.32's model_executor/models/registry.py sends BartForConditionalGeneration / MBartForConditionalGeneration to
# the out-of-tree vllm-project/bart-plugin (_OOT_SUPPORTED_MODELS), whose cache kvplan has not read. T5 /
# MT5ForConditionalGeneration are in no registry; the Transformers backend treats a model with encoder layers as
# encoder-only (models/transformers/base.py _get_attn_cls). The CPU build falls back to that backend for both and
# fails ("Argument position_ids not found in the forward method of T5Stack" / "... of BartDecoder",
# tests/test_engine_vllm.py cases t5 and bart). Keyed by model_type: no class of these types loads.
_T5 = ("vLLM has no T5 model: T5ForConditionalGeneration / MT5ForConditionalGeneration are in no registry "
       "(0.32 model_executor/models/registry.py) and its Transformers backend runs a model with encoder layers as "
       "encoder-only; use --engine hf, llamacpp")
_BART = ("vLLM's V1 engine has no BART: BART / mBART ran on V0 only and were removed with it (PR #24907, 0.11); 0.32's "
         "registry.py _OOT_SUPPORTED_MODELS points them to the vllm-project/bart-plugin, whose cache kvplan has not "
         "read, and its Transformers-backend fallback fails on them (the CPU build: no position_ids in "
         "BartDecoder.forward); use --engine hf")
NO_MODEL = {t: layout.Refusal(t, why) for t, why in (("t5", _T5), ("mt5", _T5), ("bart", _BART), ("mbart", _BART))}

# models/*.py classes that declare SupportsMambaPrefixCaching (the 0.18.1 and 0.26.0 wheels; Bamba until its
# removal in 0.23.0): with prefix caching, vLLM 0.15.0-0.27.0 give them mamba_cache_mode "all" (Rules.mamba_all_mode;
# pure Mamba models are attention-free, where vLLM keeps prefix caching off)
SUPPORTS_MAMBA_PREFIX_CACHING = frozenset({
    "BambaForCausalLM", "FalconH1ForCausalLM", "GraniteMoeHybridForCausalLM", "JambaForCausalLM",
    "MambaForCausalLM", "Mamba2ForCausalLM", "NemotronHForCausalLM", "NemotronHPuzzleForCausalLM",
    "Zamba2ForCausalLM"})
MAMBA1_CHUNK = 2048  # config/model.py get_mamba_chunk_size: a config naming no chunk (Mamba-1) gets 2048


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

# MiniMax-01 (0.10.0 models/minimax_text_01.py: SupportsV0Only, its own MinimaxCacheManager of fp32 states sized by
# max_num_seqs, which kvplan does not model) runs on V1 from 0.10.1; up to 0.20 (0.10.1-0.20.0 mamba_utils.py
# linear_attention_state_dtype) an fp32 state is refused, "fp32 state for minimax is not yet supported" (gone in 0.21.0)
MINIMAX01_V1_SINCE = (0, 10, 1)
MINIMAX01_FP32_SINCE = (0, 21)


def refuse(spec: ModelSpec, selected: Selected[Rules], tp: int, pp: int) -> None:
    """The model-specific refusals vLLM's registry and model classes imply, before any layout is made."""
    asked = selected.asked
    if spec.architecture in V0_ONLY:
        arch, last = spec.architecture, V0_ONLY[spec.architecture]
        if version_key(asked) > version_key(last):
            raise layout.UnsupportedKind(f"vLLM {asked} does not load {arch}: supported until v{last}, then removed "
                                         "with V0's encoder-decoder support (model_executor/models/registry.py "
                                         "_PREVIOUSLY_SUPPORTED_MODELS)")
        raise layout.UnsupportedKind(f"vLLM {asked} runs {arch} on its V0 engine only (models/mllama.py "
                                     "SupportsV0Only; engine/arg_utils.py falls back to V0), whose cache kvplan does "
                                     "not model (its rules are V1's)")
    layout.refuse_model(ENGINE.name, NO_MODEL, spec)


def refuse_class(spec: ModelSpec, selected: Selected[Rules], tp: int, pp: int) -> None:
    """What vLLM refuses for a model class: a removed architecture, KV sharing it cannot run, no pipeline stages,
    heads tp does not divide."""
    last = REMOVED_ARCHITECTURES.get(spec.architecture)
    asked = selected.asked
    if last and version_key(asked) > version_key(last):
        raise layout.UnsupportedKind(f"vLLM {asked} does not load {spec.architecture}: supported until v{last}, then "
                                     "removed (model_executor/models/registry.py _PREVIOUSLY_SUPPORTED_MODELS); use "
                                     f"--engine vllm@{last} or earlier, or another engine")
    if spec.architecture in KV_SHARING_BY_OFFSET:
        _check_kv_sharing(spec)
    if pp > 1 and spec.architecture in NO_PIPELINE:
        name, why = NO_PIPELINE[spec.architecture]
        raise layout.UnsupportedKind(f"vLLM cannot split this {name} model into pipeline stages: {why}")
    why = HEADS_NOT_REPLICATED.get(spec.architecture)
    if why and any(c.kv_heads % tp for _, c in spec.caches if isinstance(c, FullAttention)):
        raise InputError(f"--tp {tp}: {why}")


def _check_kv_sharing(spec: ModelSpec) -> None:
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


def window_plus_one(spec: ModelSpec, rules: Rules, caches):
    """The stage's caches with the +1 window of WINDOW_PLUS_ONE classes (from the 0.29 row), else as they are."""
    if not (rules.cohere2_window_plus_one and spec.architecture in WINDOW_PLUS_ONE):
        return caches
    return tuple((i, replace(c, window=c.window + 1) if type(c) is SlidingWindow else c) for i, c in caches)


def check_minimax01(selected: Selected[Rules], state: DType) -> None:
    """MiniMax-01's lightning attention: V1 from 0.10.1, an fp32 state from 0.21 (MINIMAX01_*)."""
    requested = selected.requested
    if requested and version_key(requested) < MINIMAX01_V1_SINCE:
        raise layout.UnsupportedKind(f"vLLM {requested} runs MiniMax-Text-01 / M1 on the V0 engine only "
                                     "(SupportsV0Only: its own MinimaxCacheManager, not the V1 KV pool), which kvplan "
                                     "does not model: use --engine vllm@0.10.1 up to vllm@0.23")
    asked = selected.asked
    if state.name == "fp32" and version_key(asked) < MINIMAX01_FP32_SINCE:
        raise InputError(f"vLLM {asked} refuses an fp32 MiniMax-01 state (mamba_utils.py "
                         "linear_attention_state_dtype: 'fp32 state for minimax is not yet supported', until 0.21)")


def minimax_m3_block(opts: dict[str, Any], msa_block: int) -> dict[str, Any]:
    """MiniMax-M3's block size: msa_block (128) unless --block-size gives a multiple of it."""
    user = opts.get("block_size")
    if user and int(user) % msa_block:
        raise InputError(f"vLLM's MiniMax-M3 sparse attention takes block sizes that are multiples of {msa_block} "
                         f"only (its backends' kernel block), not --block-size {user}")
    return {**opts, "block_size": int(user or msa_block)}
