"""GGUF header -> ModelSpec, reading the metadata the way llama.cpp's `llama_model::load_hparams` does.

Every architecture shares the generic keys (`<arch>.block_count`, `.context_length`, `.embedding_length`,
`.attention.head_count` / `.head_count_kv` as a scalar or one value per layer, `.attention.key_length` /
`.value_length`, default `embedding_length / head_count`). What differs per architecture (which layers slide,
which are recurrent, whether the cache is an MLA latent) is one row of ARCHS: data, not branches. Sources
(ggml-org/llama.cpp): src/llama-model.cpp `load_hparams` (and its later per-architecture split into
src/models/<arch>.cpp `load_arch_hparams`), src/llama-hparams.cpp `set_swa_pattern`.

* Sliding window: `set_swa_pattern(p)` makes layer il slide iff `il % p < p - 1` (the last of every p layers is
  full): gemma2 p=2 (window default 4096, key optional), gemma3 p=6 (newer builds: only when
  `.attention.sliding_window` > 0, p overridable by a scalar `.attention.sliding_window_pattern`), cohere2 p=4,
  gpt-oss p=2, olmo2 p=4 when the window is > 0. A `.attention.sliding_window_pattern` ARRAY (newer
  architectures) gives each layer's flag directly (true = sliding). Llama-4: chunked attention, chunk 8192
  (llama.cpp ignores the file's value unless it is 0, which turns chunking off), p=4. Phi-3: llama.cpp disables
  SWA even when the file has a window. Architectures without a rule (qwen2, llama/mistral, starcoder2 ...)
  attend fully, whatever `sliding_window` says: that is what llama.cpp allocates.
* Per-layer `head_count_kv` arrays (DeciLM/Nemotron-NAS `deci`): 0 = a layer without attention (no cache).
* Recurrent layers: mamba/mamba2/falcon-h1 all; jamba and granitehybrid where head_count_kv(il) == 0;
  nemotron_h where head_count_kv(il) == 0 and feed_forward_length(il) == 0; qwen3next / qwen35 by the
  `.attention.recurrent_layers` array (one flag per layer) when the file has it, else where
  (il + 1) % full_attention_interval != 0 (default 4). State sizes from the `.ssm.*` keys, as llama.cpp sizes
  its r/s rows: r = (conv_kernel - 1) x (inner_size + 2 x group_count x state_size), s = state_size x inner_size.
* Kimi Linear / Kimi-K3 (kimi-linear, kimi-k3): head_count_kv(il) == 0 marks a KDA layer, whose r/s rows are
  r = 3 x (conv_kernel - 1) x head_count x kda.head_dim and s = kda.head_dim^2 x head_count (KimiDeltaState); the
  others are MLA layers read as deepseek2's (the converters write head_count_kv 1 and key_length 576).
* LFM2 / LFM2-MoE (lfm2, lfm2moe): head_count_kv(il) == 0 marks a short-convolution layer, whose state is one conv
  window of n_embd x (shortconv.l_cache - 1) (ShortConvState; no SSM matrix); an lfm2 file with a sliding window
  (hybrid iSWA memory) is refused.
* MiniMax-M2 (minimax-m2): plain GQA. MiniMax-M3 (minimax-m3): plain GQA on every layer plus one index key of
  attention.indexer.key_length per token on the layers from leading_dense_block_count on (MsaIndexerKeys).
* Step-3.5/3.7 (step35), MiMo-V2-Flash (mimo2), Gemma 4 (gemma4): the sliding flags are the required
  `.attention.sliding_window_pattern` array, head counts per layer, the sliding layers' head dims from
  key_length_swa / value_length_swa. Gemma 4's last `.attention.shared_kv_layers` layers reuse the last own layer of
  their kind (SharedKV, no cache of their own).
* MiniMax-01 (minimax-01): recurrent (lightning) layers by `.attention.recurrent_layers` when present, else where
  (il + 1) % full_attention_interval != 0 (default 8; src/models/minimax-01.cpp load_arch_hparams); each keeps no
  r row and an s row of key_length^2 x head_count (n_embd_head_la = n_embd_head_k_full, src/llama-hparams.cpp).
* MLA (deepseek2): llama.cpp's `is_mla` is `.attention.key_length_mla` and `.value_length_mla` both present; the
  cache then holds key_length x head_count_kv (576 = kv_lora_rank + rope) per layer. Without them (GGUFs
  converted before MLA) llama.cpp caches plain K/V with the file's head counts and lengths.
* `.nextn_predict_layers` (GLM-4.5 MTP): the last N blocks keep no KV (`n_layer_kv_from_start`).
* Gemma-3n (gemma3n): window and per-layer sliding flags as above (period 5 without the array), and only the
  first 20 layers keep K/V: src/models/gemma3n.cpp sets n_layer_kv_from_start = 20 whatever the file's
  `.attention.shared_kv_layers` says; each later layer reuses layer 18 (sliding) or 19 (full) (llama-model.cpp
  create_memory's reuse callback).

Weights: one WeightPart per tensor with its exact stored bytes (ggml type and shape from the tensor infos), so
weight bytes are the sum of what the file holds; the role comes from the tensor name (token_embd, output, *norm,
*_exps ...). The runtime never imports the `gguf` package.
"""

from __future__ import annotations

import re
from dataclasses import astuple, dataclass
from typing import Any

from kvplan.architectures import deepseek, schema
from kvplan.errors import ConfigError, shown
from kvplan.gguf import GGUFHeader, GGUFTensor
from kvplan.spec import (
    ChunkedLocal,
    FullAttention,
    IndexerKeys,
    KimiDeltaState,
    LatentAttention,
    LayerCache,
    LightningState,
    LinearAttentionState,
    MambaState,
    ModelSpec,
    MsaIndexerKeys,
    NoCache,
    SharedKV,
    ShortConvState,
    SlidingWindow,
    SparseLatentAttention,
    WeightPart,
    Widths,
)


@dataclass(frozen=True)
class Arch:
    """What llama.cpp's load_hparams does for one `general.architecture` beyond the generic keys."""

    family: str = "decoder"  # the config path's family name (engines key some rules on it)
    swa: str = "none"  # none | standard | chunked | array (.attention.sliding_window_pattern: one flag per layer, required)
    swa_period: int = 0  # set_swa_pattern(p); overridable by a scalar .attention.sliding_window_pattern
    swa_window: int | None = None  # n_swa when the file has no .attention.sliding_window (None: no SWA then)
    swa_fixed_window: bool = False  # llama.cpp sets n_swa itself, ignoring the file's value (llama4 chunk 8192)
    ignores_swa: bool = False  # llama.cpp turns SWA off although the file has a window (phi3)
    recurrent: str = "none"  # none | all | kv0 | kv0_ff0 | interval
    state: str = ""  # mamba1 | mamba2 | gdn (gated delta net, qwen3next) | kda | kda-k3 (Kimi Delta Attention) |
    # shortconv (LFM2) | lightning (MiniMax-01)
    interval: int = 4  # recurrent="interval": full_attention_interval when the file has none
    attends_too: bool = False  # recurrent layers attend as well (falcon-h1: parallel hybrid)
    mla: bool = False  # deepseek2: latent cache when the *_mla keys are present
    dsa: str = ""  # DeepSeek sparse attention: "all" (deepseek32) or "types" (glm-dsa: indexer.types / defaults);
    # "msa": MiniMax-M3's index keys beside plain K/V on the layers from leading_dense_block_count on
    shared_kv: bool = False  # .attention.shared_kv_layers: the last N layers reuse an earlier layer's K/V (gemma4)
    no_position_limit: bool = False  # pure state-space: context_length is nominal
    kv_from_start: int = 0  # > 0: only layers below it keep K/V, later ones reuse n - 2 (sliding) / n - 1 (gemma3n)


_PLAIN = Arch()
ARCHS: dict[str, Arch] = {
    # plain attention (llama.cpp reads no window for these even when the file carries one)
    **{name: _PLAIN for name in (
        "llama", "mistral3", "qwen", "qwen2", "qwen2moe", "qwen2vl", "qwen3", "qwen3moe", "qwen3vl", "qwen3vlmoe",
        "glm4", "glm4moe", "chatglm", "command-r", "starcoder", "starcoder2", "phi2", "internlm2", "baichuan",
        "stablelm", "granite", "granitemoe", "olmo", "olmoe", "minicpm", "mpt", "dbrx", "exaone", "smollm3",
        "seed_oss", "ernie4_5", "ernie4_5-moe", "hunyuan-moe", "hunyuan-dense", "arcee", "apertus", "orion",
        "xverse", "codeshell", "refact", "gptneox", "gemma", "nemotron", "deepseek", "bailingmoe", "bailingmoe2",
        "dots1", "grok", "arctic", "openelm", "bitnet", "chameleon", "plm", "jais", "phimoe", "minimax-m2",
    )},
    "falcon": Arch("falcon"),
    "gpt2": Arch("gpt2"),
    "bloom": Arch("bloom"),
    "deci": Arch("nemotron-nas"),
    "phi3": Arch(ignores_swa=True),
    "gemma2": Arch("gemma", "standard", 2, swa_window=4096),
    "gemma3": Arch("gemma", "standard", 6),
    "gemma3n": Arch("gemma3n", "standard", 5, kv_from_start=20),
    "cohere2": Arch(swa="standard", swa_period=4),
    "olmo2": Arch(swa="standard", swa_period=4),
    "gpt-oss": Arch("gpt-oss", "standard", 2),
    "llama4": Arch("llama4", "chunked", 4, swa_window=8192, swa_fixed_window=True),
    "deepseek2": Arch("deepseek-mla", mla=True),
    "deepseek32": Arch("deepseek-mla", mla=True, dsa="all"),
    "glm-dsa": Arch("deepseek-mla", mla=True, dsa="types"),
    "mamba": Arch("mamba", recurrent="all", state="mamba1", no_position_limit=True),
    "mamba2": Arch("mamba2", recurrent="all", state="mamba2", no_position_limit=True),
    "jamba": Arch("jamba", recurrent="kv0", state="mamba1"),
    "granitehybrid": Arch("granite-hybrid", recurrent="kv0", state="mamba2"),
    "nemotron_h": Arch("nemotron-h", recurrent="kv0_ff0", state="mamba2"),
    "nemotron_h_moe": Arch("nemotron-h", recurrent="kv0_ff0", state="mamba2"),
    "falcon-h1": Arch("falcon-h1", recurrent="all", state="mamba2", attends_too=True),
    "qwen3next": Arch("qwen3-next", recurrent="interval", state="gdn"),
    "qwen35": Arch("qwen3-next", recurrent="interval", state="gdn"),
    "qwen35moe": Arch("qwen3-next", recurrent="interval", state="gdn"),
    # Kimi Linear / Kimi-K3: head_count_kv 0 marks a KDA layer, the others are MLA served as one latent head
    "kimi-linear": Arch("kimi-linear", recurrent="kv0", state="kda", mla=True),
    "kimi-k3": Arch("kimi-linear", recurrent="kv0", state="kda-k3", mla=True),
    # LFM2 / LFM2-MoE: head_count_kv 0 marks a short-convolution layer (src/models/lfm2.cpp, lfm2moe.cpp)
    "lfm2": Arch("lfm2", recurrent="kv0", state="shortconv"),
    "lfm2moe": Arch("lfm2", recurrent="kv0", state="shortconv"),
    # MiniMax-M3: llama_kv_cache_msa (src/llama-model.cpp create_memory: index keys where il >= n_layer_dense_lead)
    "minimax-m3": Arch("minimax-m3", dsa="msa"),
    # per-layer sliding flags from the required pattern array (src/models/step35.cpp, mimo2.cpp, gemma4.cpp)
    "step35": Arch("step-3.7", swa="array"),
    "mimo2": Arch("mimo-v2-flash", swa="array"),
    "gemma4": Arch("gemma4", swa="array", shared_kv=True),
    # T5 / Flan-T5 / mT5 (src/models/t5.cpp): llama_kv_cache holds block_count (the ENCODER's layer count) layers of
    # self-attention K/V, head_count x key_length; cross-attention K/V are recomputed from the encoder output
    "t5": Arch("t5"),
    # MiniMax-Text-01 / MiniMax-M1: lightning attention on every layer but each 8th
    "minimax-01": Arch("minimax-01", recurrent="interval", state="lightning", interval=8),
}

# Read generically these would be sized wrong (other recurrent states, shared KV, encoder-decoders, encoders).
NOT_MODELLED = {
    "rwkv6": "RWKV-6 recurrent state", "rwkv6qwen2": "RWKV-6 recurrent state", "rwkv7": "RWKV-7 recurrent state",
    "arwkv7": "RWKV-7 recurrent state",
    "plamo2": "PLaMo-2 hybrid state", "t5encoder": "an encoder",
    "bert": "an encoder", "nomic-bert": "an encoder", "nomic-bert-moe": "an encoder", "jina-bert-v2": "an encoder",
    "jina-bert-v3": "an encoder", "modern-bert": "an encoder", "neo-bert": "an encoder", "eurobert": "an encoder",
    "gemma-embedding": "an embedding encoder", "wavtokenizer-dec": "an audio decoder",
}

# general.file_type (llama_ftype) -> llama.cpp's name for the quantization recipe (llama_model_ftype_name)
FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K", 11: "Q3_K_S", 12: "Q3_K_M",
    13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S", 17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS",
    21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS", 24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S",
    29: "IQ2_M", 30: "IQ4_XS", 31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE", 39: "NVFP4",
    40: "Q1_0",
}
FLOAT_FILE_TYPES = {0: "fp32", 1: "fp16", 32: "bf16"}


# ---------------------------------------------------------------------------------------------- metadata access
class _Keys:
    """`<arch>.<suffix>` reads that remember every missing required key, so one error names them all."""

    def __init__(self, h: GGUFHeader):
        self.h, self.arch, self.missing = h, h.architecture, []

    def get(self, suffix: str, default: Any = None) -> Any:
        return self.h.metadata.get(f"{self.arch}.{suffix}", default)

    def need(self, suffix: str) -> Any:
        key = f"{self.arch}.{suffix}"
        if key not in self.h.metadata:
            self.missing.append(key)
            return 0
        return self.h.metadata[key]

    def int(self, suffix: str, default: int | None = None) -> int:
        value = self.get(suffix, default) if default is not None else self.need(suffix)
        return _as_int(value, f"{self.arch}.{suffix}", self.h.source, _LIMITS.get(suffix, schema.MAX_POSITIONS),
                       _AT_LEAST.get(suffix, 0))

    def per_layer(self, suffix: str, n: int, default: list[int] | None = None) -> list[int]:
        """llama.cpp get_key_or_arr: a scalar for every layer, or an array with one value per layer."""
        value = self.get(suffix) if default is not None else self.need(suffix)
        if value is None:
            return list(default or [0] * n)
        key = f"{self.arch}.{suffix}"
        if isinstance(value, list):
            if len(value) != n:
                raise ConfigError(f"{self.h.source}: {key} has {len(value)} entries for {n} layers")
            high = _LIMITS.get(suffix, schema.MAX_POSITIONS)
            return [_as_int(v, key, self.h.source, high) for v in value]
        return [_as_int(value, key, self.h.source, _LIMITS.get(suffix, schema.MAX_POSITIONS))] * n

    def check(self, what: str) -> None:
        if self.missing:
            raise ConfigError(f"{self.h.source}: GGUF metadata lacks {', '.join(self.missing)}, needed to size {what}")


# The same plausible ranges as for config.json fields (schema.py); anything else up to MAX_POSITIONS
_LIMITS = {"block_count": schema.MAX_LAYERS, "attention.head_count": schema.MAX_HEADS,
           "attention.head_count_kv": schema.MAX_HEADS, "nextn_predict_layers": schema.MAX_LAYERS,
           "attention.indexer.key_length": schema.MAX_DIM}


# Keys that size something and so cannot be 0 (a conv kernel of 0 would make a state of -1 columns)
_AT_LEAST = {"block_count": 1, "ssm.conv_kernel": 1, "ssm.inner_size": 1, "ssm.state_size": 1,
             "attention.indexer.key_length": 1}


def _as_int(value: Any, key: str, source: str, high: int = schema.MAX_POSITIONS, low: int = 0) -> int:
    """GGUF metadata as llama.cpp reads it: an unsigned integer, here also within a plausible range."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigError(f"{source}: {key} must be an integer in {low}..{high:,}, found {shown(value, 40)}")
    return value


# ---------------------------------------------------------------------------------------------- layers
def _swa_layers(k: _Keys, a: Arch, n: int) -> tuple[list[bool], int, list[str]]:
    """(per-layer sliding flags, window, notes) as llama.cpp's load_hparams sets swa_layers and n_swa."""
    window = k.get("attention.sliding_window")
    pattern = k.get("attention.sliding_window_pattern")
    if a.ignores_swa:
        note = [f"llama.cpp disables sliding-window attention for {k.arch} (window {window} in the file): "
                "every layer attends fully"] if window else []
        return [False] * n, 0, note
    if isinstance(pattern, list):  # newer architectures: one flag per layer (true = sliding)
        if len(pattern) != n:
            raise ConfigError(f"{k.h.source}: {k.arch}.attention.sliding_window_pattern has {len(pattern)} entries "
                              f"for {n} layers")
        flags = [bool(p) for p in pattern]
        size = _as_int(window or 0, f"{k.arch}.attention.sliding_window", k.h.source)
        return (flags, size, []) if size and any(flags) else ([False] * n, 0, [])
    if a.swa == "array":  # load_arch_hparams: ml.get_arr(..SLIDING_WINDOW_PATTERN..) is required
        raise ConfigError(f"{k.h.source}: {k.arch}.attention.sliding_window_pattern must be one flag per layer (an "
                          f"array); llama.cpp requires it for '{k.arch}'")
    if a.swa == "none":
        return [False] * n, 0, []
    if a.swa_fixed_window:  # llama4: a 0 in the file turns chunking off, any other value is ignored
        if window == 0:
            return [False] * n, 0, []
        window = a.swa_window
    elif window is None:
        window = a.swa_window
    window = _as_int(window or 0, f"{k.arch}.attention.sliding_window", k.h.source)
    if not window:
        return [False] * n, 0, []
    p = _as_int(pattern, f"{k.arch}.attention.sliding_window_pattern", k.h.source) if pattern is not None else a.swa_period
    # llama_hparams::set_swa_pattern: p == 0 means every layer slides
    return [p == 0 or il % p < p - 1 for il in range(n)], window, []


def _recurrent_layers(k: _Keys, a: Arch, n: int, kv: list[int]) -> list[bool]:
    if a.recurrent == "all":
        return [True] * n
    if a.recurrent == "kv0":
        return [h == 0 for h in kv]
    if a.recurrent == "kv0_ff0":
        ff = k.per_layer("feed_forward_length", n, [0] * n)
        return [h == 0 and f == 0 for h, f in zip(kv, ff)]
    if a.recurrent == "interval":
        flags = k.get("attention.recurrent_layers")  # load_arch_hparams: the per-layer array wins (get_key_or_arr)
        if isinstance(flags, list):
            if len(flags) != n:
                raise ConfigError(f"{k.h.source}: {k.arch}.attention.recurrent_layers has {len(flags)} entries "
                                  f"for {n} layers")
            return [bool(f) for f in flags]
        every = k.int("full_attention_interval", a.interval) or a.interval
        return [(il + 1) % every != 0 for il in range(n)]
    return [False] * n


def _kda(k: _Keys, a: Arch, n_head: int) -> KimiDeltaState:
    """kimi-linear / kimi-k3 (src/models/kimi-*.cpp load_arch_hparams, src/llama-hparams.cpp n_embd_r / n_embd_s):
    q, k and v convolutions over n_head() x kda.head_dim channels each, one head_dim x head_dim matrix per head;
    n_head() is the attention head count of layer 0 (the converters write num_attention_heads there)."""
    conv, dim = k.int("ssm.conv_kernel"), k.int("kda.head_dim")
    k.check(f"a '{k.arch}' model")
    if not n_head or not dim:
        raise ConfigError(f"{k.h.source}: {k.arch}.attention.head_count and kda.head_dim must be above 0 for KDA layers")
    bound = k.get("kda.gate_lower_bound")
    return KimiDeltaState(3 * n_head * dim, conv, n_head, dim, dim, full_rank_gate=a.state == "kda-k3",
                          gate_lower_bound=float(bound) if isinstance(bound, (int, float)) else None)


def _state(k: _Keys, a: Arch, n_head: int, head_dim: int) -> LayerCache:
    if a.state in ("kda", "kda-k3"):
        return _kda(k, a, n_head)
    if a.state == "shortconv":  # LFM2: n_embd_r() = n_embd x (shortconv.l_cache - 1), no S row (n_embd_s() = 0)
        n_embd, l_cache = k.int("embedding_length"), k.int("shortconv.l_cache")
        k.check(f"a '{k.arch}' model")
        if l_cache < 2:
            raise ConfigError(f"{k.h.source}: {k.arch}.shortconv.l_cache must be at least 2, found {l_cache}")
        return ShortConvState(n_embd, l_cache)
    if a.state == "lightning":  # n_embd_s = n_embd_head_la^2 x n_head, n_embd_head_la = key_length; no r row
        if not n_head or not head_dim:
            raise ConfigError(f"{k.h.source}: {k.arch}.attention.head_count and key_length must be above 0 for "
                              "lightning-attention layers")
        return LightningState(0, 1, num_heads=n_head, head_dim=head_dim)
    conv, inner, state = k.int("ssm.conv_kernel"), k.int("ssm.inner_size"), k.int("ssm.state_size")
    if a.state == "mamba1":
        k.check(f"a '{k.arch}' model")
        return MambaState(inner, conv, (inner, state))
    groups, heads = k.int("ssm.group_count"), k.int("ssm.time_step_rank")  # mamba2 / GDN: dt rank = heads
    k.check(f"a '{k.arch}' model")
    if not heads or inner % heads:
        raise ConfigError(f"{k.h.source}: {k.arch}.ssm.inner_size {inner} is not a multiple of "
                          f"{k.arch}.ssm.time_step_rank {heads} (the state heads)")
    conv_dim = inner + 2 * groups * state
    if a.state == "gdn":  # qwen3next: state_size = key head dim, time_step_rank = value heads
        return LinearAttentionState(conv_dim, conv, heads, state, inner // heads)
    return MambaState(conv_dim, conv, (heads, inner // heads, state))


def _latent(k: _Keys, kv_heads: int, key_len: int) -> LatentAttention | None:
    """deepseek2 with the *_mla keys: K = key_length x head_count_kv (kv_lora_rank + rope), V-less in new builds."""
    k_mla, v_mla = k.get("attention.key_length_mla"), k.get("attention.value_length_mla")
    if not k_mla or not v_mla:
        return None
    rank = k.int("attention.kv_lora_rank")
    heads = k.int("attention.head_count")
    k.check(f"an MLA '{k.arch}' model")
    rope = key_len * kv_heads - rank
    if rope <= 0 or rope >= k_mla:
        raise ConfigError(f"{k.h.source}: {k.arch}.attention.key_length {key_len} x head_count_kv {kv_heads} is not "
                          f"kv_lora_rank {rank} + a RoPE part below key_length_mla {k_mla}")
    return LatentAttention(rank, rope, heads, int(k_mla) - rope, int(v_mla))


def _indexer_layers(k: _Keys, a: Arch, trunk: int) -> list[bool]:
    """llama.cpp's is_indexer_full per trunk layer: every layer for deepseek32; for glm-dsa the file's
    attention.indexer.types, else every layer before GLM-5.2 (context_length < 1,048,576) and GLM-5.2's own default
    (layers 0-2, then every 4th) after it (src/models/glm-dsa.cpp)."""
    if a.dsa == "all":
        return [True] * trunk
    if a.dsa == "msa":  # minimax-m3 create_memory: filter_idx = il >= n_layer_dense_lead
        lead = k.int("leading_dense_block_count", 0)
        return [il >= lead for il in range(trunk)]
    types = k.get("attention.indexer.types")
    if isinstance(types, list):
        if len(types) < trunk or any(t not in (0, 1) for t in types[:trunk]):
            raise ConfigError(f"{k.h.source}: {k.arch}.attention.indexer.types must be 0 or 1 for each of the {trunk} layers")
        return [t == 1 for t in types[:trunk]]
    if k.int("context_length", 0) < 1048576:
        return [True] * trunk
    return deepseek.every_nth_indexer(trunk, freq=4, offset=3)


def _caches(k: _Keys, a: Arch, n: int) -> tuple[list[tuple[int, LayerCache]], list[str]]:
    attends = a.recurrent != "all" or a.attends_too
    heads = k.per_layer("attention.head_count", n) if attends else [0] * n
    kv = k.per_layer("attention.head_count_kv", n, heads) if attends else [0] * n
    n_embd = k.int("embedding_length") if attends else 0
    k.check(f"a '{k.arch}' model")
    if attends and a.recurrent == "none" and not any(kv):
        raise ConfigError(f"{k.h.source}: {k.arch}.attention.head_count(_kv) is 0 for every layer; an attention "
                          "model needs at least one key/value head")
    head0 = next((x for x in heads if x), 0)
    dk = k.int("attention.key_length", n_embd // head0 if head0 else 0)
    dv = k.int("attention.value_length", n_embd // head0 if head0 else 0)
    dk_swa, dv_swa = k.int("attention.key_length_swa", dk), k.int("attention.value_length_swa", dv)
    if any(kv) and not (dk and dk_swa):
        raise ConfigError(f"{k.h.source}: {k.arch}.attention.key_length is 0 (or embedding_length / head_count is) "
                          "for layers with key/value heads")
    swa, window, notes = _swa_layers(k, a, n)
    if k.arch == "lfm2" and isinstance(k.get("attention.sliding_window"), int) and k.get("attention.sliding_window") > 0:
        # lfm2 load_arch_hparams (not lfm2moe's): a window > 0 makes every attention layer SWA, in a
        # llama_memory_hybrid_iswa
        raise ConfigError(f"{k.h.source}: an '{k.arch}' GGUF with a sliding window (hybrid iSWA memory: "
                          "short-convolution state beside SWA attention) is not modelled by kvplan yet")
    recurrent = _recurrent_layers(k, a, n, kv)
    state = _state(k, a, heads[0] if heads else 0, dk) if any(recurrent) else None
    nextn = k.int("nextn_predict_layers", 0)
    if nextn:
        notes.append(f"the last {nextn} block(s) are multi-token-prediction layers: llama.cpp gives them no KV cache "
                     "(their weights are in the file and counted)")
    caches: list[tuple[int, LayerCache]] = []
    indexed = _indexer_layers(k, a, n - nextn) if a.dsa else []
    keys = (MsaIndexerKeys if a.dsa == "msa" else IndexerKeys)(k.int("attention.indexer.key_length")) if a.dsa else None
    # gemma4 load_arch_hparams: n_layer_kv_from_start = n - shared_kv_layers; a later layer reuses the last layer of
    # its own kind before it (create_memory's reuse callback: n_layer_kv_from_start - (is_swa ? 2 : 1))
    shared = k.int("attention.shared_kv_layers", 0) if a.shared_kv else 0
    first_shared = n - shared
    if shared and first_shared < 2:
        raise ConfigError(f"{k.h.source}: {k.arch}.attention.shared_kv_layers {shared} leaves fewer than 2 of "
                          f"{n} layers with their own KV cache (llama.cpp asserts at least 2)")
    # gemma3n fixes the first shared layer at 20 whatever the file says (src/models/gemma3n.cpp)
    kv_start = a.kv_from_start or (first_shared if shared else 0)
    for il in range(n):
        if il >= n - nextn:
            caches.append((il, NoCache()))
            continue
        if kv_start and il >= kv_start:  # llama_hparams::has_kv false: reuses an earlier layer
            caches.append((il, SharedKV(kv_start - (2 if swa[il] else 1))))
            continue
        if recurrent[il]:
            caches.append((il, state))
            if not a.attends_too:
                continue
        if kv[il] == 0:
            # a plain llama_kv_cache keeps such a layer (zero-width K); a hybrid's attention cache leaves it out
            caches.append((il, NoCache(zero_kv_heads=state is None)))
        elif a.mla and (latent := _latent(k, kv[il], dk)) is not None:
            caches.append((il, SparseLatentAttention(*astuple(latent)) if a.dsa else latent))
            if a.dsa and indexed[il]:
                caches.append((il, keys))
        elif swa[il] and a.swa == "chunked":
            caches.append((il, ChunkedLocal(kv[il], dk_swa, dv_swa, chunk=window)))
        elif swa[il]:
            caches.append((il, SlidingWindow(kv[il], dk_swa, dv_swa, window=window)))
        else:
            caches.append((il, FullAttention(kv[il], dk, dv)))
        if a.dsa == "msa" and kv[il] and indexed[il]:
            caches.append((il, keys))
    return caches, notes


# ---------------------------------------------------------------------------------------------- weights
_LAYER = re.compile(r"^blk\.(\d+)\.")
# (test on the tensor name, role, tensor-parallel split): first match wins
_ROLES: tuple[tuple[re.Pattern[str], str, str], ...] = tuple((re.compile(p), r, s) for p, r, s in (
    (r"^token_embd\.", "embedding", "vocab"),
    (r"^(position_embd|token_types|per_layer_token_embd)\.", "embedding", "replicated"),
    (r"^output\.weight$", "lm_head", "vocab"),
    (r"norm", "norm", "replicated"),
    (r"_(ch|sh)?exps\.bias$", "bias", "expert"),
    (r"_exps\.", "expert", "expert"),
    (r"\.bias$", "bias", "replicated"),
    (r"^blk\.\d+\.(attn_(q|k|v|qkv|gate)|ffn_(up|gate|up_shexp|gate_shexp)|ssm_in)\.", "linear", "column"),
    (r"^blk\.\d+\.(attn_output|ffn_down|ffn_down_shexp|ssm_out)\.", "linear", "row"),
    (r"^blk\.\d+\.(attn|ffn|ssm)_", "linear", "replicated"),
))


def tensor_weights(tensors: tuple[GGUFTensor, ...], part: str = "text") -> list[WeightPart]:
    """One WeightPart per tensor, numpy-order shape (GGUF stores ne[0] first), exact stored bytes."""
    out = []
    for t in tensors:
        role, split = next(((r, s) for p, r, s in _ROLES if p.search(t.name)), ("other", "replicated"))
        m = _LAYER.match(t.name)
        layer = int(m.group(1)) if m and part == "text" else None
        out.append(WeightPart(t.name, tuple(reversed(t.shape)) or (1,), role, part, split, layer, 1, t.nbytes))
    return out


def file_type(h: GGUFHeader) -> str:
    """llama.cpp's recipe name (general.file_type), e.g. "Q4_K_M"; else the dominant tensor type."""
    ft = h.metadata.get("general.file_type")
    if isinstance(ft, int) and ft in FILE_TYPES:
        return FILE_TYPES[ft]
    mix = h.quant_mix()
    return mix[0][0] if mix else "GGUF"


def _widths(k: _Keys, tensors: tuple[GGUFTensor, ...], n: int) -> Widths:
    hidden = k.int("embedding_length", 0)
    emb = next((t for t in tensors if t.name == "token_embd.weight"), None)
    vocab = k.int("vocab_size", 0) or (emb.shape[-1] if emb is not None and len(emb.shape) > 1 else 0)
    tokens = k.h.metadata.get("tokenizer.ggml.tokens")
    vocab = vocab or (len(tokens) if isinstance(tokens, list) else 0)
    ff = k.per_layer("feed_forward_length", n, [0] * n) if n else [0]
    moe = k.int("expert_feed_forward_length", 0) * k.int("expert_used_count", 0)
    return Widths(hidden, vocab, max([*ff, moe, 0]), k.int("expert_used_count", 0))


# ---------------------------------------------------------------------------------------------- entry point
def from_header(h: GGUFHeader, mmproj: GGUFHeader | None = None) -> ModelSpec:
    """The ModelSpec of a GGUF model (and its vision projector, counted as the vision part)."""
    arch = h.architecture
    if not arch:
        raise ConfigError(f"{h.source}: GGUF metadata lacks general.architecture (a later shard of a split model? "
                          "pass the first, -00001-of-N)")
    if arch == "clip":
        raise ConfigError(f"{h.source} is a vision/audio projector (mmproj), not a language model: pass the model "
                          "and this file with --mmproj")
    if arch in NOT_MODELLED:
        raise ConfigError(f"{h.source}: GGUF architecture '{arch}' ({NOT_MODELLED[arch]}) is not modelled by kvplan "
                          "yet; its cache is not attention K/V that kvplan could size from the generic keys")
    a = ARCHS.get(arch)
    notes: list[str] = []
    if a is None:
        a = _PLAIN
        notes.append(f"GGUF architecture '{arch}' is not in kvplan's table: read as plain attention from its "
                     "generic keys (no sliding window, no recurrent state)")
    k = _Keys(h)
    n = k.int("block_count")
    if a.no_position_limit:
        max_ctx, src = None, "none (a state-space model has no position limit)"
    else:  # llama.cpp requires it (n_ctx_train)
        max_ctx, src = k.int("context_length"), f"GGUF {arch}.context_length"
    caches, layer_notes = _caches(k, a, n)  # names every missing key at once
    notes += layer_notes
    if arch == "t5":
        dec = k.int("decoder_block_count", n)  # load_arch_hparams: dec_n_layer defaults to n_layer
        if dec > n:
            raise ConfigError(f"{h.source}: t5.decoder_block_count {dec} exceeds block_count {n}: llama.cpp's KV cache "
                              "has one layer per encoder block and fails to create the context (b11434)")
        notes.append(f"T5: {n} cache layers (one per encoder block; the decoder has {dec}); cross-attention K/V are "
                     "recomputed from the encoder output, not cached")
    if not n:
        raise ConfigError(f"{h.source}: {arch}.block_count is 0: a model without layers")
    weights = tensor_weights(h.tensors)
    if mmproj is not None:
        weights += tensor_weights(mmproj.tensors, "vision")
    names = {t.name for t in h.tensors}
    ft = h.metadata.get("general.file_type")
    return ModelSpec(
        architecture=arch,
        model_type=arch,
        family=a.family,
        num_layers=n,
        caches=tuple(caches),
        dtype=FLOAT_FILE_TYPES.get(ft) if isinstance(ft, int) else None,
        weights=tuple(weights),
        max_ctx=max_ctx,
        max_ctx_source=src,
        vllm_max_ctx=max_ctx,
        vllm_max_ctx_source=src,
        tied_embeddings="output.weight" not in names and "token_embd.weight" in names,
        notes=tuple(notes),
        stored_format=file_type(h),
        widths=_widths(k, h.tensors, n),
    )
