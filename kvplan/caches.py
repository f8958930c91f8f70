"""The layer cache kinds: one small frozen dataclass per kind that knows its own geometry (the habit of vLLM's
kv_cache_interface.py). Engines lay these out by class (each engine's KIND_RULES); they never re-read the config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

__all__ = ["LayerCache", "NoCache", "FullAttention", "SlidingWindow", "WindowBeyondContext", "ChunkedLocal",
           "CrossAttention", "LatentAttention", "SparseLatentAttention", "IndexerKeys", "MsaIndexerKeys",
           "SlidingLatent", "CompressedLatent", "CompressedIndexerKeys", "CompressorState", "RecurrentState",
           "MambaState", "LinearAttentionState", "ShortConvState", "LightningState", "KimiDeltaState", "SharedKV",
           "cache_kinds"]


# ---------------------------------------------------------------------------------------------- caches
# Every kind answers for its own engine-neutral arithmetic (elements per token for a head count, its span, state
# shapes for a TP degree); how an engine pages, pads or pools them is a rule of that engine (engines/<name>.py
# KIND_RULES, looked up by class in engines/layout.py).
@dataclass(frozen=True)
class LayerCache:
    """What one layer keeps per request; each engine's KIND_RULES table sizes it by its class."""
    kind: ClassVar[str] = "none"

    @property
    def grows_with_context(self) -> bool:
        return False

    def describe(self) -> str:
        return "no cache"


@dataclass(frozen=True)
class NoCache(LayerCache):
    """A layer that keeps nothing (an MLP-only block, a no-op attention). zero_kv_heads: an attention layer with no
    KV heads (Nemotron-NAS no-op/linear blocks, a GGUF's head_count_kv 0): llama.cpp keeps such a layer in its
    cache with a zero-width K, and with flash attention off a V row as wide as the widest layer's."""

    kind: ClassVar[str] = "none"
    zero_kv_heads: bool = False

    def describe(self) -> str:
        return "no cache (attention without KV heads)" if self.zero_kv_heads else "no cache"


@dataclass(frozen=True)
class FullAttention(LayerCache):
    """K and V for every token of the context, kv_heads x head_dim each (K and V widths may differ)."""
    kind: ClassVar[str] = "full"
    kv_heads: int
    head_dim_k: int
    head_dim_v: int

    @property
    def grows_with_context(self) -> bool:
        return True

    @property
    def span(self) -> int | None:
        """Tokens a sequence attends over in this layer: None = all of them."""
        return None

    def token_elems(self, heads: int) -> tuple[int, int]:
        """(K, V) elements one token stores in this layer for `heads` KV heads (one GPU's share)."""
        return heads * self.head_dim_k, heads * self.head_dim_v

    def describe(self) -> str:
        return f"full attention, {self.kv_heads} KV heads x {_dims(self)}"


@dataclass(frozen=True)
class SlidingWindow(FullAttention):
    """Full attention over the last `window` tokens only; engines differ in how many they actually keep."""
    kind: ClassVar[str] = "sliding"
    window: int = 0
    # transformers' window where its config class differs from the engines' reading of the same config
    # (MiMo-V2-Flash: sliding_window_size + 1, the reference implementation's query-plus-window); 0 = window
    hf_window: int = 0

    @property
    def span(self) -> int | None:
        return self.window

    def describe(self) -> str:
        return f"sliding window {self.window:,}, {self.kv_heads} KV heads x {_dims(self)}"


@dataclass(frozen=True)
class WindowBeyondContext(FullAttention):
    """A sliding_window no shorter than the model's context (Phi-3.5: 262,144 vs 131,072). It never slides, so most
    engines (and JSON `kind`) treat it as full attention; vLLM still builds a SlidingWindowSpec from it, which
    reserves one block more per request (its rule in engines/vllm/specs.py)."""

    kind: ClassVar[str] = "full"
    window: int = 0

    def describe(self) -> str:
        return (f"full attention (its sliding window {self.window:,} is beyond the context), {self.kv_heads} KV heads "
                f"x {_dims(self)}")


@dataclass(frozen=True)
class ChunkedLocal(FullAttention):
    """Llama-4 style: attention restricted to fixed chunks of `chunk` tokens."""

    kind: ClassVar[str] = "chunked"
    chunk: int = 0

    @property
    def span(self) -> int | None:
        return self.chunk

    def describe(self) -> str:
        return f"chunked local attention, chunk {self.chunk:,}, {self.kv_heads} KV heads x {_dims(self)}"


@dataclass(frozen=True)
class CrossAttention(FullAttention):
    """Decoder cross-attention over the encoder output: fixed length `encoder_len` per sequence."""

    kind: ClassVar[str] = "cross"
    encoder_len: int = 0

    @property
    def grows_with_context(self) -> bool:
        return False

    @property
    def span(self) -> int | None:
        return self.encoder_len

    def describe(self) -> str:
        return f"cross attention over {self.encoder_len:,} encoder positions, {self.kv_heads} KV heads x {_dims(self)}"


@dataclass(frozen=True)
class LatentAttention(LayerCache):
    """DeepSeek MLA: the cache is the compressed latent (kv_lora_rank) plus the shared RoPE key (rope_dim).

    The head counts and dims are kept for engines that store decompressed K/V instead (transformers <= 5.14).
    """

    kind: ClassVar[str] = "mla"
    kv_lora_rank: int
    rope_dim: int
    num_heads: int
    qk_nope_head_dim: int
    v_head_dim: int

    @property
    def latent_dim(self) -> int:
        return self.kv_lora_rank + self.rope_dim

    @property
    def grows_with_context(self) -> bool:
        return True

    def describe(self) -> str:
        return f"latent attention (MLA), latent {self.kv_lora_rank} + rope {self.rope_dim}"


@dataclass(frozen=True)
class SparseLatentAttention(LatentAttention):
    """DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5): the MLA latent of a layer whose attention reads only
    the top-k tokens a lightning indexer picks. Same latent as MLA (JSON kind `mla`); engines store it differently
    (vLLM and SGLang keep fp8 as a 656-byte record with scales and a bf16 RoPE part), so it is a class of its own."""

    kind: ClassVar[str] = "mla"

    @property
    def fp8_record_bytes(self) -> int:
        """DeepSeek's fp8 latent record (FlashMLA's sparse layout, used by vLLM and SGLang): the latent in fp8, one
        fp32 scale per 128 of it, the RoPE part in bf16 (512 + 16 + 128 = 656 B for DeepSeek-V3.2)."""
        return self.kv_lora_rank + self.kv_lora_rank // 128 * 4 + 2 * self.rope_dim

    def describe(self) -> str:
        return f"sparse latent attention (DSA), latent {self.kv_lora_rank} + rope {self.rope_dim}"


@dataclass(frozen=True)
class IndexerKeys(LayerCache):
    """The DSA lightning indexer's key cache: one `head_dim`-wide key per token per layer (single head, whatever
    `index_n_heads` is: the heads live on the query side). Sits beside the layer's SparseLatentAttention."""

    kind: ClassVar[str] = "indexer"
    head_dim: int

    @property
    def grows_with_context(self) -> bool:
        return True

    @property
    def fp8_record_bytes(self) -> int:
        """Bytes per token as the serving engines store the keys: fp8 values plus one fp32 scale per 128 (vLLM's
        DeepseekV32IndexerCache, SGLang's index_k_with_scale_buffer, TensorRT-LLM's indexer K pool all agree),
        whatever the KV cache dtype."""
        return self.head_dim + self.head_dim // 128 * 4

    def describe(self) -> str:
        return f"sparse-attention indexer keys, 1 head x {self.head_dim}"


@dataclass(frozen=True)
class MsaIndexerKeys(IndexerKeys):
    """MiniMax-M3's sparse-attention (MSA) indexer keys: one `head_dim` key per token per sparse layer (a single head,
    replicated on every TP rank), beside the layer's full K/V. A class of its own because the engines keep it unlike
    DeepSeek's: vLLM 0.32 stores it in bf16 (its indexer_kv_dtype "auto"), not as fp8 records with scales."""

    def describe(self) -> str:
        return f"sparse-attention (MSA) indexer keys, 1 head x {self.head_dim}"


# DeepSeek-V4 (transformers models/deepseek_v4, vLLM models/deepseek_v4): every layer keeps a short sliding window of
# its single 512-wide K=V vector; "compressed" layers also keep one entry per `ratio` tokens (4: compressed sparse
# attention, with a lightning indexer's keys at the same ratio; 128: heavily compressed), and the compressors keep a
# few tokens of fp32 state while an entry fills.
@dataclass(frozen=True)
class SlidingLatent(LayerCache):
    """The last `window` tokens of a layer's shared K=V vector (dim wide, its last rope_dim in RoPE)."""

    kind: ClassVar[str] = "sliding_latent"
    dim: int
    rope_dim: int
    window: int

    @property
    def grows_with_context(self) -> bool:
        return True

    @property
    def span(self) -> int:
        return self.window

    @property
    def fp8_record_bytes(self) -> int:
        """The fp8_ds_mla record of DeepSeek-V4 (vLLM sparse_swa.py packed_bytes_per_token 584 for 512/64): the
        non-RoPE part in fp8 with one ue8m0 byte of scale per 64 plus one byte of padding, the RoPE part in bf16."""
        nope = self.dim - self.rope_dim
        return nope + nope // 64 + 1 + 2 * self.rope_dim

    def describe(self) -> str:
        return f"sliding window of the K=V latent ({self.dim}), {self.window} tokens"


@dataclass(frozen=True)
class CompressedLatent(SlidingLatent):
    """One K=V latent entry per `ratio` tokens, kept for the whole context (window unused: 0)."""

    kind: ClassVar[str] = "compressed_latent"
    ratio: int = 4

    @property
    def span(self) -> None:  # type: ignore[override]
        return None

    def describe(self) -> str:
        return f"compressed latent ({self.dim}), one entry per {self.ratio} tokens"


@dataclass(frozen=True)
class CompressedIndexerKeys(IndexerKeys):
    """The lightning indexer's keys of a compressed sparse-attention layer: one key per `ratio` tokens."""

    ratio: int = 4

    def describe(self) -> str:
        return f"sparse-attention indexer keys, 1 head x {self.head_dim}, one per {self.ratio} tokens"


@dataclass(frozen=True)
class CompressorState(LayerCache):
    """A compressor's running state: fp32 `width` values per token for the last `window` tokens (the entry being
    filled, and for ratio 4 the overlapping one)."""

    kind: ClassVar[str] = "compressor_state"
    width: int
    window: int
    ratio: int  # the compression it serves (engines page the two kinds differently)

    @property
    def grows_with_context(self) -> bool:
        return True

    @property
    def span(self) -> int:
        return self.window

    def describe(self) -> str:
        return f"compressor state, {self.width} fp32 values x the last {self.window} tokens"


@dataclass(frozen=True)
class RecurrentState(LayerCache):
    """A fixed-size state per sequence: a convolution window over `conv_dim` channels and a recurrent matrix
    (`ssm_shape`). Its first SSM axis and the conv channels split across tensor-parallel ranks."""

    kind: ClassVar[str] = "state"

    conv_dim: int
    conv_kernel: int

    @property
    def ssm_shape(self) -> tuple[int, ...]:  # pragma: no cover - every concrete state names its shape
        raise NotImplementedError

    def conv_shape(self, tp: int = 1) -> tuple[int, int]:
        """(kernel - 1, conv_dim / tp): the window serving engines keep (the newest input is not stored)."""
        return self.conv_kernel - 1, self.conv_dim // tp

    def ssm_shape_for(self, tp: int = 1) -> tuple[int, ...]:
        first, *rest = self.ssm_shape
        return (first // tp, *rest)


@dataclass(frozen=True)
class MambaState(RecurrentState):
    """Mamba-1/2 recurrent state: a conv window over `conv_dim` channels and the SSM state.

    ssm_shape is (intermediate, state) for Mamba-1 and (heads, head_dim, state) for Mamba-2.
    """

    kind: ClassVar[str] = "mamba_state"
    ssm_shape: tuple[int, ...] = ()
    n_groups: int = 0  # Mamba-2's B/C groups (0: Mamba-1)

    def conv_shape(self, tp: int = 1) -> tuple[int, int]:
        """Mamba-2 under tensor parallelism: groups that tp does not divide are replicated up to tp first (vLLM
        mamba_utils.py mamba2_state_shape and SGLang configs/mamba_utils.py Mamba2StateShape.create:
        extra_groups_for_head_shards = tp - n_groups), widening the conv window by 2 x extra x d_state."""
        extra = 0 if not self.n_groups or self.n_groups % tp == 0 else tp - self.n_groups
        return self.conv_kernel - 1, (self.conv_dim + 2 * extra * self.ssm_shape[-1]) // tp

    def describe(self) -> str:
        return f"Mamba state: conv {self.conv_dim} x {self.conv_kernel}, SSM {'x'.join(map(str, self.ssm_shape))}"


@dataclass(frozen=True)
class LinearAttentionState(RecurrentState):
    """Gated DeltaNet (Qwen3-Next) state: a conv window over `conv_dim` channels and a recurrent matrix per head."""

    kind: ClassVar[str] = "linear_state"
    num_v_heads: int = 0
    key_head_dim: int = 0
    value_head_dim: int = 0

    @property
    def ssm_shape(self) -> tuple[int, ...]:
        return (self.num_v_heads, self.key_head_dim, self.value_head_dim)

    def describe(self) -> str:
        return (
            f"linear-attention state: conv {self.conv_dim} x {self.conv_kernel}, "
            f"recurrent {self.num_v_heads} x {self.key_head_dim} x {self.value_head_dim}"
        )


@dataclass(frozen=True)
class ShortConvState(RecurrentState):
    """LFM2's short convolution (a gated depthwise conv over conv_dim channels): a conv window and no recurrent
    matrix. A class of its own because a state rule that adds an SSM term would count one element too many."""

    kind: ClassVar[str] = "conv_state"

    @property
    def ssm_shape(self) -> tuple[int, ...]:
        return ()

    def describe(self) -> str:
        return f"short-conv state: conv {self.conv_dim} x {self.conv_kernel}"


@dataclass(frozen=True)
class LightningState(RecurrentState):
    """MiniMax-01 lightning attention (MiniMax-Text-01, MiniMax-M1; transformers' `minimax`): a linear-attention layer
    whose whole per-request cache is one head_dim x head_dim matrix (the decayed sum of K^T V) per head, and no
    convolution window (conv_dim 0, conv_kernel 1). A class of its own because the engines keep it unlike Gated
    DeltaNet: vLLM in its mamba_cache_dtype (the conv dtype, not the SSM one), transformers in the compute dtype."""

    kind: ClassVar[str] = "lightning_state"
    num_heads: int = 0
    head_dim: int = 0

    @property
    def ssm_shape(self) -> tuple[int, ...]:
        return (self.num_heads, self.head_dim, self.head_dim)

    def describe(self) -> str:
        return f"lightning-attention state: {self.num_heads} x {self.head_dim} x {self.head_dim} per request"


@dataclass(frozen=True)
class KimiDeltaState(LinearAttentionState):
    """Kimi Delta Attention (Kimi Linear, Kimi-K3): q, k and v each through a short convolution (conv_dim = 3 x heads
    x head_dim) and one head_dim x head_dim recurrent matrix per head. A class of its own because engines store it
    unlike Gated DeltaNet (vLLM keeps the recurrent matrix in fp32 whatever the cache dtype). full_rank_gate: Kimi-K3's
    layer (use_full_rank_gate), which vLLM builds with its own class and state rules; gate_lower_bound: the config's
    bound on the decay gate (None when absent), a condition of vLLM's FlashKDA prefill."""

    full_rank_gate: bool = False
    gate_lower_bound: float | None = None

    def describe(self) -> str:
        return (f"Kimi Delta Attention state: conv {self.conv_dim} x {self.conv_kernel}, "
                f"recurrent {self.num_v_heads} x {self.key_head_dim} x {self.value_head_dim}")


@dataclass(frozen=True)
class SharedKV(LayerCache):
    """Reuses the cache of an earlier layer (Gemma-3n num_kv_shared_layers): no bytes of its own."""

    kind: ClassVar[str] = "shared"
    target: int

    def describe(self) -> str:
        return f"KV shared with layer {self.target}"


def cache_kinds() -> list[type[LayerCache]]:
    """Every concrete cache class (the guard tests check each engine has a rule for each)."""
    out, todo = [], list(LayerCache.__subclasses__())
    while todo:
        cls = todo.pop(0)
        todo.extend(cls.__subclasses__())
        if cls is not RecurrentState:
            out.append(cls)
    return out


def _dims(c: FullAttention) -> str:
    return str(c.head_dim_k) if c.head_dim_k == c.head_dim_v else f"{c.head_dim_k}/{c.head_dim_v}"


