"""ModelSpec: a normalized, immutable description of a model, built from a raw config.json.

Each layer's cache is a kind of caches.py (re-exported here, where every module has always imported them from);
identical layer caches merge into one group. Weights are listed as components (what weight counting and TP
splitting need).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from functools import cached_property

from kvplan.caches import *  # noqa: F401,F403  (the cache kinds, imported from kvplan.spec across the package)
from kvplan.caches import LayerCache


# ---------------------------------------------------------------------------------------------- weights
_set_attr = object.__setattr__  # how a frozen instance is filled in


@dataclass(frozen=True)
class WeightPart:
    """A set of identical parameter tensors.

    role:  embedding | lm_head | linear | expert | norm | bias | other | quant_scale   (what quantization applies to;
           quant_scale: a quantized export's stored scalars, shape (0,): bytes but no parameters)
    part:  text | vision | encoder | mtp                                    (CONTRACTS.md breakdown)
    split: how tensor parallelism divides it: vocab | column | row | expert | replicated
    layer: decoder layer index (None for embeddings/final norm/lm_head and non-decoder parts)
    shape: shape of ONE tensor; `count` identical tensors (e.g. experts)
    stored_bytes: the exact bytes of all `count` tensors as a file stores them (a GGUF tensor of its ggml type);
                  when set, weight counting uses it as is and no weight format applies (weights.part_bytes)
    """

    name: str
    shape: tuple[int, ...]
    role: str
    part: str = "text"
    split: str = "replicated"
    layer: int | None = None
    count: int = 1
    stored_bytes: int | None = None

    def __init__(self, name: str, shape: tuple[int, ...], role: str, part: str = "text", split: str = "replicated",
                 layer: int | None = None, count: int = 1, stored_bytes: int | None = None):
        # The instance dict in one assignment: a model has thousands of parts, and the generated frozen __init__
        # (one object.__setattr__ per field) cost three times as much (`fit` over the catalog builds 37,000).
        _set_attr(self, "__dict__", {"name": name, "shape": shape, "role": role, "part": part, "split": split,
                                     "layer": layer, "count": count, "stored_bytes": stored_bytes})

    @property
    def params(self) -> int:
        n = self.count
        for d in self.shape:
            n *= d
        return n


COUNTED_WEIGHT_FORMATS = ("fp8", "mxfp4", "int4", "nvfp4", "mixed")  # methods weights.py counts; others are warned about
QUANT_SOURCE_KEY = "_kvplan_read_from"  # in a quantization_config kvplan took from another file (hf_quant_config.json)


@dataclass(frozen=True)
class Quantization:
    """What a checkpoint's quantization_config says about stored weights (see weights.py)."""

    method: str  # fp8 | mxfp4 | int4 | int8 | ...
    detail: str
    block: tuple[int, ...] | None = None
    excluded: tuple[str, ...] = ()
    kv_dtype_hint: str | None = None
    per_tensor_scale: bool = False  # fp8 with one fp32 scale per tensor (ModelOpt), not per output channel
    expert_method: str | None = None  # routed experts stored another way (DeepSeek-V4 expert_dtype fp4: mxfp4)
    source: str = "quantization_config"  # or hf_quant_config.json (a ModelOpt export up to 0.29)
    # method "mixed" (ModelOpt MIXED_PRECISION): quantized_layers by module path, then each weight part's
    # (format, group size) once normalize has mapped them (architectures/modelopt_mixed.py)
    mixed_entries: tuple[tuple[str, tuple[str, int]], ...] = ()
    part_formats: tuple[tuple[tuple[str, int | None, str], tuple[str, int]], ...] = ()

    def part_format(self, name: str, layer: int | None, part: str) -> tuple[str, int] | None:
        """A MIXED_PRECISION export's format for one weight part, None where it stays 16-bit."""
        return self._format_table.get((name, layer, part))

    @cached_property
    def _format_table(self) -> dict[tuple[str, int | None, str], tuple[str, int]]:
        return dict(self.part_formats)


# ---------------------------------------------------------------------------------------------- model
@dataclass(frozen=True)
class Widths:
    """Sizes the activation estimates need (engines/overhead.py): hidden width, vocabulary, and the widest MLP
    a token passes through (dense intermediate, or top-k x expert intermediate)."""

    hidden: int
    vocab: int
    intermediate: int
    experts_per_token: int = 0  # routed experts each token uses (0: dense)
    expert_intermediate: int = 0  # one routed expert's MLP width (moe_intermediate_size, else intermediate_size)


@dataclass(frozen=True)
class LayerGroup:
    """Layers with the same cache kind and shape, listed by index (the unit of size's breakdown)."""
    cache: LayerCache
    layer_ids: tuple[int, ...]

    @property
    def kind(self) -> str:
        return self.cache.kind


@dataclass(frozen=True)
class RopeTable:
    """One rotary cos/sin table: [rows, dim] (cos and sin halves side by side), in the model dtype unless fp32."""

    rows: int
    dim: int
    fp32: bool = False  # kept in fp32 whatever the model dtype (gpt-oss passes dtype=torch.float32)
    # rows are min(rows, max_model_len): the model code passes that as max_position (MiniMax-01 in vLLM)
    capped: bool = False

    def nbytes(self, float_bytes: int, max_model_len: int | None = None) -> int:
        rows = min(self.rows, max_model_len) if self.capped and max_model_len else self.rows
        return rows * self.dim * (4 if self.fp32 else float_bytes)


@dataclass(frozen=True)
class EncoderShape:
    """An encoder-decoder's encoder self-attention as the config states it, for an engine whose token pool keeps
    buffers for the encoder layers too (SGLang's Whisper): layer count, heads, head_dim, and the encoder positions
    (Whisper's max_source_positions, whatever --encoder-len says)."""

    layers: int
    heads: int
    head_dim: int
    positions: int


@dataclass(frozen=True)
class ModelSpec:
    """Everything an engine needs to lay out the cache and count weights; built once per config."""

    architecture: str
    model_type: str
    family: str
    num_layers: int  # decoder layers (what pipeline parallelism splits)
    caches: tuple[tuple[int, LayerCache], ...]  # (layer index, cache) -- a layer may hold two (self + cross)
    dtype: str | None  # model dtype from the config (fp16/bf16/fp32) or None
    weights: tuple[WeightPart, ...]
    max_ctx: int | None
    max_ctx_source: str
    vllm_max_ctx: int | None = None
    vllm_max_ctx_source: str = ""
    tied_embeddings: bool = False
    quantization: Quantization | None = None
    is_encoder_decoder: bool = False
    encoder_len: int | None = None
    mtp_layers: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)
    stored_format: str | None = None  # weights read from a file as stored (GGUF: its file type, e.g. "Q4_K_M")
    widths: Widths = Widths(0, 0, 0)
    warnings: tuple[str, ...] = ()  # what the spec leaves out (an unmodelled vision/audio tower), said in every output
    # the config's own state-dtype fields as written (e.g. ("mamba_ssm_dtype", "float32")): engines that honour one
    # for some architectures read it here
    config_state_dtypes: tuple[tuple[str, str], ...] = ()
    # the config's Mamba-2 SSD chunk (mamba_chunk_size, else chunk_size; vLLM ModelConfig.get_mamba_chunk_size), 0
    # when it names none: vLLM's prefix caching in mamba_cache_mode 'all' aligns blocks to it
    mamba_chunk_size: int = 0
    # rotary cos/sin tables the engines' model code precomputes at load (architectures/rope.py); neither weights
    # nor KV, charged by the vLLM budget
    rope_tables: tuple[RopeTable, ...] = ()
    # the encoder's self-attention (Whisper only; None elsewhere): SGLang sizes its token pool over these layers too
    encoder_shape: EncoderShape | None = None

    @property
    def groups(self) -> tuple[LayerGroup, ...]:
        """Identical layer caches merged, in order of first appearance."""
        merged: OrderedDict[LayerCache, list[int]] = OrderedDict()
        for idx, cache in self.caches:
            merged.setdefault(cache, []).append(idx)
        return tuple(LayerGroup(c, tuple(ids)) for c, ids in merged.items())

    @property
    def encoder_layers(self) -> int:
        """An encoder-decoder's encoder layer count (its encoder weights carry layer ids; 0 for a decoder-only
        model): llama.cpp's T5 cache has one layer per encoder block."""
        return len({w.layer for w in self.weights if w.part == "encoder" and w.layer is not None})

    def caches_of_layers(self, layers: range | set[int]) -> tuple[tuple[int, LayerCache], ...]:
        return tuple((i, c) for i, c in self.caches if i in layers)

    @property
    def kind(self) -> str:
        """multimodal (a vision tower) | moe (routed experts) | dense: the class of public logs fit's estimate uses
        (evidence.py), since the engines profile these differently (the largest images, the fused-MoE scratch)."""
        if any(w.part == "vision" for w in self.weights):
            return "multimodal"
        return "moe" if self.widths.experts_per_token else "dense"

    @property
    def params(self) -> int:
        return sum(w.params for w in self.weights if w.part != "mtp")

    def params_of(self, part: str) -> int:
        return sum(w.params for w in self.weights if w.part == part)
