"""Element formats and their exact byte costs (one table; CONTRACTS.md names).

Block-quantized GGUF types store `block_elems` elements in `block_bytes` bytes (ggml-common.h static_asserts):
q8_0 = fp16 scale + 32 x int8 = 34 B per 32, q4_0 = 18, q4_1 = 20, q5_0 = 22, q5_1 = 24, iq4_nl = 18.
"""

from __future__ import annotations

from dataclasses import dataclass

from kvplan.errors import InputError


@dataclass(frozen=True)
class DType:
    """A cache or weight element type; block formats (q8_0, q4_0...) store block_elems values in block_bytes."""
    name: str
    block_elems: int
    block_bytes: int
    torch_name: str  # what verify allocates: a torch dtype name, or "uint8" for packed block formats

    @property
    def is_block(self) -> bool:
        return self.block_elems > 1

    @property
    def below_16_bits(self) -> bool:
        """fp8 and the quantized block formats: what engines call a quantized KV cache."""
        return self.nbytes(8) < 16

    def nbytes(self, n_elements: int) -> int:
        """Exact bytes for a row of `n_elements` (block formats need whole blocks, as ggml_row_size does)."""
        if self.block_elems == 1:
            return n_elements * self.block_bytes
        if n_elements % self.block_elems:
            raise InputError(
                f"{self.name} stores blocks of {self.block_elems} elements; a row of {n_elements} is not a whole "
                "number of blocks"
            )
        return n_elements // self.block_elems * self.block_bytes

    def __str__(self) -> str:
        return self.name


_TABLE = [
    DType("fp32", 1, 4, "float32"),
    DType("fp16", 1, 2, "float16"),
    DType("bf16", 1, 2, "bfloat16"),
    DType("fp8_e4m3", 1, 1, "float8_e4m3fn"),
    DType("fp8_e5m2", 1, 1, "float8_e5m2"),
    DType("q8_0", 32, 34, "uint8"),
    DType("q4_0", 32, 18, "uint8"),
    DType("q4_1", 32, 20, "uint8"),
    DType("q5_0", 32, 22, "uint8"),
    DType("q5_1", 32, 24, "uint8"),
    DType("iq4_nl", 32, 18, "uint8"),
]
KV_DTYPES: dict[str, DType] = {d.name: d for d in _TABLE}

ALIASES = {
    "fp8": "fp8_e4m3",
    "fp8_e4m3fn": "fp8_e4m3",
    "e4m3": "fp8_e4m3",
    "e5m2": "fp8_e5m2",
    "f16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "f32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "bfloat16": "bf16",
}

# config.json `torch_dtype` / `dtype` values -> canonical names
_CONFIG_DTYPES = {"float16": "fp16", "bfloat16": "bf16", "float32": "fp32", "half": "fp16", "float": "fp32"}


def canonical(name: str) -> str:
    key = name.strip().lower().replace("-", "_")
    return ALIASES.get(key, key)


def kv_dtype(name: str) -> DType:
    """A KV dtype by canonical name or alias; one clear line otherwise."""
    key = canonical(name)
    if key not in KV_DTYPES:
        raise InputError(
            f"unknown KV dtype {name!r}; accepted: auto, {', '.join(KV_DTYPES)} "
            "(aliases fp8, f16/float16/half, f32/float32, bfloat16)"
        )
    return KV_DTYPES[key]


def from_config(value: object) -> str | None:
    """The model dtype named by a config's torch_dtype/dtype, canonical, or None when absent/unknown."""
    if not isinstance(value, str):
        return None
    return _CONFIG_DTYPES.get(value.strip().lower().replace("torch.", ""))
