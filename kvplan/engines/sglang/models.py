"""Per-model facts of SGLang as tables keyed by what SGLang keys on (the model class, `architectures[0]`; the
config's model_type where SGLang has no model of that type at all), and the pools those classes get: Whisper's
and Llama-3.2-Vision's encoder rows, Gemma-3n's shared layers, the 0.5.23 layer-type pools of Gemma 4 and Step-3.7.

Nothing here compares a family name: a model of a new family built of existing cache kinds needs no row.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvplan.engines import layout
from kvplan.engines.versions import Selected, version_key
from kvplan.engines.sglang.rules import COVERAGE, ENGINE, Rules
from kvplan.errors import InputError
from kvplan.spec import (CrossAttention, FullAttention, ModelSpec, SharedKV, SlidingWindow, WindowBeyondContext)

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
# is hybrid_swa_0_5_23's.
WINDOW_MINUS_ONE = frozenset({"GptOssForCausalLM", "gpt-oss"})


@dataclass(frozen=True)
class LayerTypePools:
    """A class SGLang 0.5.23 pools by its config's layer_types (is_hybrid_swa_model lists it, get_hybrid_layer_ids
    splits the layers): the model's name in messages, and whether its pools follow Gemma 4's per-layer shapes and
    window - 1 (models/gemma4_causal.py) or take the full layers' heads for both (Step-3.7, models/step3p5.py)."""

    name: str
    gemma4: bool
    note: str = ""


_GEMMA4 = LayerTypePools("gemma4", True)
_STEP37 = LayerTypePools("step-3.7", False)
LAYER_TYPE_POOLS: dict[str, LayerTypePools] = {
    "Gemma4ForCausalLM": _GEMMA4, "Gemma4ForConditionalGeneration": _GEMMA4,
    "Step3p7ForConditionalGeneration": _STEP37,
    # the flat text-only Step-3.7 file (aiconfigurator's Step3p7FlashForCausalLM, a class no engine has), sized as the
    # release's wrapper, as every other engine here reads it
    "Step3p7FlashForCausalLM": replace(_STEP37, note="SGLang has no Step3p7FlashForCausalLM: sized as the release's "
                                       "Step3p7ForConditionalGeneration (models/step3p7.py), whose text model this "
                                       "file describes"),
}
# Gemma 4 on SM100: arg_groups/model_overrides/gemma4.py picks trtllm_mha there, and arg_groups/overrides.py moves a
# page size outside 16/32/64/128 to 64 for that backend (triton, page 1, elsewhere)
TRTLLM_MHA_ON_SM100 = frozenset({"Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"})
TRTLLM_MHA_PAGES = (16, 32, 64, 128)
# Gemma-3n in 0.5.10 keeps pool rows for its KV-shared layers (gemma3n_pool)
SHARED_LAYERS_IN_POOL = frozenset({"Gemma3nForCausalLM", "Gemma3nForConditionalGeneration"})
WHISPER = frozenset({"WhisperForConditionalGeneration"})

# Model types SGLang 0.5.10 has no model for at all (srt/models), keyed by the config's model_type: (name, why).
# granitemoehybrid is there (configs/granitemoehybrid.py: Mamba2CacheParams of the mamba layers, the same
# Mamba2StateShape as Nemotron-H's). SGLang 0.5.10 has no T5 / BART model file (srt/models) and
# configs/model_config.py is_encoder_decoder_model lists only WhisperForConditionalGeneration and
# MllamaForConditionalGeneration.
_ENC_DEC = ("SGLang (0.5.10 read) has no {} model: srt/models has none, and configs/model_config.py "
            "is_encoder_decoder_model knows only Whisper and Mllama")
NO_MODEL: dict[str, layout.Refusal] = {
    t: layout.Refusal(t, why) for t, why in (
        ("bamba", "SGLang 0.5.10 has no BambaForCausalLM (srt/models)"),
        ("zamba2", "SGLang has no Zamba2ForCausalLM (no srt/models/zamba2.py)"),
        ("t5", _ENC_DEC.format("T5 / mT5")), ("mt5", _ENC_DEC.format("T5 / mT5")),
        ("bart", _ENC_DEC.format("BART / mBART")), ("mbart", _ENC_DEC.format("BART / mBART")))}


@dataclass(frozen=True)
class ReadSince:
    """A model class kvplan read in SGLang from a rule set on (older rule sets refuse it): name, first row, why."""

    name: str
    first: str
    why: str


# Cohere2 / SmolLM3 / Whisper read in 0.5.10 (and Whisper in 0.5.23). In 0.5.10 Cohere2 is not a hybrid-SWA
# architecture (model_config.py is_hybrid_swa_model), so its sliding layers hold full-length cache, and SmolLM3 runs
# through the Transformers fallback (model_loader/utils.py resolve_transformers_arch), one RadixAttention per layer,
# one pool. Gemma 4 and Step-3.7 read in the 0.5.23 wheel only; the 0.5.10.post1 wheel has no model for them.
_GEMMA4_LATE = ReadSince("gemma4", "0.5.23", "not modelled: SGLang 0.5.10 has no Gemma 4 model (no "
                         "srt/models/gemma4_causal.py); kvplan read 0.5.23's: use --engine sglang@0.5.23")
_STEP37_LATE = ReadSince("step-3.7", "0.5.23", "not modelled: SGLang 0.5.10 has no Step3p7ForConditionalGeneration "
                         "(srt/models has step3p5.py only); kvplan read 0.5.23's (models/step3p7.py): use --engine "
                         "sglang@0.5.23")
READ_SINCE: dict[str, ReadSince] = {
    "Cohere2ForCausalLM": ReadSince("cohere2", "0.5", "not modelled: kvplan read Cohere2 in SGLang 0.5.10 "
                                    "(srt/models/commandr.py); SGLang 0.4's Cohere2ForCausalLM was a stub "
                                    "(sgl-project/sglang#4570): use --engine sglang@0.5"),
    "SmolLM3ForCausalLM": ReadSince("smollm3", "0.5", "not modelled: kvplan read SGLang 0.5.10's Transformers "
                                    "fallback (srt/models/transformers.py) that runs SmolLM3; 0.4's is not read: use "
                                    "--engine sglang@0.5"),
    "WhisperForConditionalGeneration": ReadSince("whisper", "0.5", "not modelled: kvplan read SGLang's Whisper in "
                                                 "0.5.10 and 0.5.23 (srt/models/whisper.py); 0.4's is not read: use "
                                                 "--engine sglang@0.5"),
    **dict.fromkeys(("Gemma4ForCausalLM", "Gemma4ForConditionalGeneration"), _GEMMA4_LATE),
    **dict.fromkeys(("Step3p7ForConditionalGeneration", "Step3p7FlashForCausalLM"), _STEP37_LATE),
}


def refuse(spec: ModelSpec, selected: Selected[Rules]) -> None:
    """A model SGLang has no class for, or whose class kvplan read only in later rule sets: one line."""
    layout.refuse_model(ENGINE.name, NO_MODEL, spec)
    read = READ_SINCE.get(spec.architecture)
    if read is not None and version_key(selected.version) < version_key(read.first):
        raise layout.UnsupportedKind(f"sglang cannot size this {read.name} model: {read.why}")
    layout.check_coverage(COVERAGE, spec.caches, selected.version)


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



def hybrid_swa_0_5_23(spec: ModelSpec, stages: tuple[layout.Caches, ...],
                      model: LayerTypePools) -> tuple[tuple[layout.Caches, ...], list[str]]:
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
    gemma = model.gemma4
    by_layer = {i: c for i, c in spec.caches if not isinstance(c, SharedKV)}
    shapes: dict[str, set] = {}
    for c in by_layer.values():
        if isinstance(c, FullAttention):
            kind = "sliding" if isinstance(c, (SlidingWindow, WindowBeyondContext)) else "full"
            shapes.setdefault(kind, set()).add((c.kv_heads, c.head_dim_k, c.head_dim_v))
    for kind, found in shapes.items():
        if len(found) > 1:
            raise layout.UnsupportedKind(f"SGLang 0.5.23 carries one (head_dim, KV heads) per layer type and this "
                                         f"{model.name} config gives its {kind} layers {len(found)} "
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
            raise layout.UnsupportedKind(f"SGLang 0.5.23 runs {model.name} on its hybrid-SWA pool, which needs a "
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
    elif model.note:
        notes.append(model.note)
    return tuple(out), notes

