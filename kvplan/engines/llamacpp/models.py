"""Per-model facts of llama.cpp (b11434) as tables keyed by what it keys on (the converter's class for a config.json,
the GGUF architecture, which follows the config's model_type; layout.model_row): the models it has no architecture
for, and what its converter and loader make of a config (fixed sliding patterns, Gemma-3n's shared layers,
MiniMax-01's layer pattern).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from kvplan.engines import layout
from kvplan.spec import LightningState, ModelSpec, SharedKV, SlidingWindow, WindowBeyondContext


# Models llama.cpp has no architecture for (src/llama-arch.cpp LLM_ARCH_NAMES, convert_hf_to_gguf.py /
# conversion/ of b11434), keyed by class or model type (layout.model_row): refused rather than sized by the generic
# recurrent + attention rows
_NO_BART = ("BART / mBART are not a llama.cpp architecture (b11434: no BART in src/llama-arch.cpp, no converter for "
            "BartForConditionalGeneration)")
REFUSED: dict[str, layout.Refusal] = {
    **layout.refusals("llama.cpp (b11434) has no zamba2 architecture (its hybrids: jamba, falcon-h1, granitehybrid, "
                      "nemotron_h; ggml-org/llama.cpp pull request 21412 proposing Zamba2 was open when read)",
                      "zamba2", "zamba2"),
    **layout.refusals("llama.cpp has no mllama architecture (b11434: none in src/llama-arch.cpp, and its converter "
                      "takes no MllamaForConditionalGeneration)", "mllama", "MllamaForConditionalGeneration"),
    # b11434 architectures (src/llama-arch.cpp) and converters (conversion/__init__.py) know no BART / mBART
    **layout.refusals(_NO_BART, "bart", "bart"), **layout.refusals(_NO_BART, "mbart", "mbart"),
}


def _cohere2_swa(spec: ModelSpec, sliding: set[int]) -> None:
    """cohere2: conversion/command_r.py Cohere2Model writes sliding_window but no pattern; src/models/cohere2.cpp
    load_swa_pattern(ml, 4) then slides layer il iff il % 4 < 3."""
    if sliding != {i for i in range(spec.num_layers) if i % 4 < 3}:
        raise layout.UnsupportedKind("llama.cpp's cohere2 GGUFs slide layers il % 4 < 3 (src/models/cohere2.cpp "
                                     "load_swa_pattern(ml, 4); the converter writes no pattern), not this config's "
                                     "sliding layers: it would not run this model as configured")


def _smollm3_swa(spec: ModelSpec, sliding: set[int]) -> None:
    """smollm3: src/models/smollm3.cpp builds build_attn_inp_kv (no SWA cache) and the converter writes no window."""
    if sliding:
        raise layout.UnsupportedKind("llama.cpp's smollm3 architecture has no sliding window (src/models/smollm3.cpp "
                                     "build_attn_inp_kv): it would run this config's sliding layers as full attention")


MINIMAX01_CONVERTED = ("MiniMaxText01ForCausalLM", "MiniMaxM1ForCausalLM")  # conversion/minimax.py's classes


def _minimax01_as_converted(spec: ModelSpec) -> ModelSpec:
    """A MiniMax-01 config.json becomes a GGUF through convert_hf_to_gguf (b11434 conversion/minimax.py), which maps
    MiniMaxText01ForCausalLM and MiniMaxM1ForCausalLM only and writes no layer pattern: llama.cpp then makes every
    8th layer full attention (src/models/minimax-01.cpp load_arch_hparams, full_attention_interval default 8). A
    config whose attn_type_list says otherwise, or transformers' native MiniMaxForCausalLM, is refused."""
    if spec.architecture not in MINIMAX01_CONVERTED:
        raise layout.UnsupportedKind(f"llama.cpp's converter (b11434 conversion/__init__.py) takes MiniMax-01 as "
                                     f"MiniMaxText01ForCausalLM or MiniMaxM1ForCausalLM, not {spec.architecture}")
    lightning = {i for i, c in spec.caches if isinstance(c, LightningState)}
    if lightning != {i for i in range(spec.num_layers) if (i + 1) % 8}:
        raise layout.UnsupportedKind("llama.cpp makes every 8th MiniMax-01 layer full attention (src/models/"
                                     "minimax-01.cpp; the converter writes no layer pattern), which this config's "
                                     "attn_type_list does not: size the GGUF itself")
    return spec


# src/models/gemma3n.cpp load_arch_hparams (b11434): n_layer_kv_from_start = 20 whatever the file says (the
# converter writes gemma3n.attention.shared_kv_layers; the loader never reads it)
GEMMA3N_KV_LAYERS = 20


def gemma3n_layers(spec: ModelSpec) -> ModelSpec:
    """Gemma-3n as llama.cpp (b11434) lays it out: the first 20 layers keep K/V (llama_hparams::has_kv), every later
    layer reuses layer 20 - 2 (sliding) or 20 - 1 (full) (llama-model.cpp create_memory's reuse callback), whatever
    num_kv_shared_layers says: E2B (30 layers, 10 shared) and E4B (35, 15) come out as in transformers, other
    splits do not (a model of 20 layers or fewer shares nothing)."""
    own = {i: c for i, c in spec.caches if not isinstance(c, SharedKV)}
    kind = {i: own[c.target] if isinstance(c, SharedKV) else c for i, c in spec.caches}
    caches = []
    for i, c in spec.caches:
        if i < GEMMA3N_KV_LAYERS:
            caches.append((i, kind[i]))
        else:
            swa = isinstance(kind[i], (SlidingWindow, WindowBeyondContext))
            caches.append((i, SharedKV(GEMMA3N_KV_LAYERS - (2 if swa else 1))))
    return replace(spec, caches=tuple(caches))


# What llama.cpp (b11434) runs for a config.json of these models (keyed by class or model type, layout.model_row):
# its converter and loader fix layers the config states otherwise, or refuse it in one line. A GGUF file carries
# llama.cpp's own metadata and skips this.
FROM_CONFIG: dict[str, Callable[[ModelSpec], ModelSpec]] = {
    **dict.fromkeys(("gemma3n", "gemma3n_text"), gemma3n_layers),
    # the two classes the converter maps, and the model types of MiniMax-01 configs (transformers' native minimax,
    # the remote-code minimax_text_01 / minimax_m1), which it refuses under any other class
    **dict.fromkeys((*MINIMAX01_CONVERTED, "minimax", "minimax_text_01", "minimax_m1"), _minimax01_as_converted),
}
# Models whose GGUF conversion fixes the sliding layers whatever config.json says (b11434), by model type (the GGUF
# architecture of the same name)
SWA_FROM_CONVERSION: dict[str, Callable[[ModelSpec, set[int]], None]] = {"cohere2": _cohere2_swa,
                                                                         "smollm3": _smollm3_swa}
GEMMA3N_MODEL_TYPES = ("gemma3n", "gemma3n_text")  # config model types and the GGUF architecture
