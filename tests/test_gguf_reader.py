"""kvplan.gguf: header-only GGUF reader. Files are written with the `gguf` package's GGUFWriter."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
from gguf import GGMLQuantizationType as Q  # noqa: E402
from gguf import GGUFEndian, GGUFReader  # noqa: E402
from gguf.constants import GGML_QUANT_SIZES  # noqa: E402

from conftest import write_gguf_file  # noqa: E402
from gguf.quants import quantize  # noqa: E402

from kvplan.errors import ConfigError  # noqa: E402
from kvplan.gguf import (  # noqa: E402
    GGML_TYPES,
    LEGACY_TYPE_IDS,
    read_header,
    read_header_from_path,
    read_split_headers,
    tensor_nbytes,
)

RNG = np.random.default_rng(0)

# Nemotron-Ultra-253B per-layer n_head_kv (cases/engine-logs.yaml): 162 layers, 64 with attention.
NEMOTRON_HEAD_KV = [
    8, 8, 8, 8, 8, 8, 8, 8, 8, 0, 0, 0, 0, 8, 8, 8, 8, 8, 0, 0, 0, 0, 0, 0, 8, 8, 8, 0, 0, 0, 0, 0,
    8, 8, 8, 8, 0, 0, 0, 8, 8, 8, 0, 8, 0, 0, 0, 0, 0, 0, 8, 8, 8, 8, 0, 0, 0, 0, 0, 8, 8, 8, 8, 0,
    0, 0, 0, 0, 8, 8, 8, 8, 0, 0, 0, 0, 0, 8, 8, 8, 8, 0, 0, 0, 0, 0, 8, 8, 8, 8, 0, 0, 8, 8, 8, 8,
    0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 0, 0, 8, 8, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 8, 8, 0, 8, 8, 8, 8, 8, 8,
    8, 8,
]  # fmt: skip


# ------------------------------------------------------------------------------------------------
# helpers


def tensor_set() -> list[tuple[str, np.ndarray, Q | None]]:
    """(name, array as written, raw_dtype): quantized tensors are uint8 arrays of the byte shape."""
    f = RNG.standard_normal((4, 256)).astype(np.float32)
    return [
        ("token_embd.weight", RNG.standard_normal((8, 64)).astype(np.float16), None),  # F16
        ("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32), None),  # F32
        ("blk.0.attn_q.weight", quantize(f, Q.Q8_0), Q.Q8_0),  # 4 x 272 B
        ("blk.0.attn_k.weight", quantize(f, Q.Q4_0), Q.Q4_0),  # 4 x 144 B
        ("blk.0.ffn_up.weight", RNG.integers(0, 256, (16, 144 * 2), dtype=np.uint8), Q.Q4_K),
        ("blk.0.ffn_down.weight", RNG.integers(0, 256, (8, 210), dtype=np.uint8), Q.Q6_K),
        ("output.weight", quantize(f, Q.BF16), Q.BF16),
    ]


def gguf_shape(arr: np.ndarray, raw: Q | None) -> tuple[int, ...]:
    """GGUF order (ne[0] first) of the element shape the writer records."""
    if raw is None:
        return tuple(reversed(arr.shape))
    block, size = GGML_QUANT_SIZES[raw]
    return tuple(reversed((*arr.shape[:-1], arr.shape[-1] // size * block)))


def write_gguf(path: Path, arch: str, kv: dict, tensors=None, endian=GGUFEndian.LITTLE, **kw) -> Path:
    return write_gguf_file(path, arch, kv, tensors if tensors is not None else tensor_set(), endianess=endian, **kw)


LLAMA_KV = {
    "general.name": "Llama-3.1-8B-Instruct",
    "llama.block_count": 32,
    "llama.context_length": 131072,
    "llama.embedding_length": 4096,
    "llama.attention.head_count": 32,
    "llama.attention.head_count_kv": 8,
    "llama.attention.key_length": 128,
    "llama.attention.value_length": 128,
    "llama.rope.freq_base": 500000.0,
    "llama.attention.layer_norm_rms_epsilon": 1.0e-5,
    "general.some_flag": True,
    "tokenizer.ggml.tokens": ["<s>", "</s>", "héllo", "", "▁the", "日本"],
    "tokenizer.ggml.scores": [0.0, -1.5, -2.25, 0.5, 3.0, -0.125],
    "tokenizer.ggml.token_type": [3, 3, 1, 1, 1, 1],
    "test.nested": [[1, 2, 3], [4, 5]],
}


class Recorder:
    """A byte source over a bytes object that records every request."""

    def __init__(self, data: bytes):
        self.data = data
        self.calls: list[tuple[int, int]] = []

    def __call__(self, offset: int, size: int) -> bytes:
        self.calls.append((offset, size))
        return self.data[offset : offset + size]


def one_line_error(fn, *args, **kw) -> str:
    with pytest.raises(ConfigError) as ei:
        fn(*args, **kw)
    msg = str(ei.value)
    assert "\n" not in msg and msg
    return msg


# ------------------------------------------------------------------------------------------------
# type table


def test_type_table_matches_gguf_package():
    for t in Q:
        block, size = GGML_QUANT_SIZES[t]
        ours = GGML_TYPES[t.value]
        assert (ours.name, ours.block_size, ours.type_size) == (t.name, block, size), t
    assert set(GGML_TYPES) - {t.value for t in Q} == LEGACY_TYPE_IDS


def test_tensor_nbytes():
    assert tensor_nbytes("Q8_0", (4096, 1024)) == 4096 * 1024 // 32 * 34
    assert tensor_nbytes(12, (256, 3)) == 3 * 144  # Q4_K
    assert tensor_nbytes("F32", ()) == 4  # a scalar
    with pytest.raises(ValueError):
        tensor_nbytes("Q4_K", (100, 2))


# ------------------------------------------------------------------------------------------------
# round trips


def test_llama_roundtrip(tmp_path):
    path = write_gguf(tmp_path / "llama.gguf", "llama", LLAMA_KV)
    h = read_header_from_path(path)

    assert h.version == 3 and h.architecture == "llama" and h.byte_order == "little"
    assert h.source == str(path)
    for key, val in LLAMA_KV.items():
        if isinstance(val, float):
            assert h.metadata[key] == pytest.approx(val, rel=1e-7)
        elif key == "tokenizer.ggml.scores":
            assert h.metadata[key] == pytest.approx(val)
        else:
            assert h.metadata[key] == val, key
    assert h.metadata["general.architecture"] == "llama"
    assert h.arch_key("block_count") == 32
    assert h.arch_key("attention.head_count_kv") == 8
    assert h.arch_key("attention.sliding_window") is None
    assert h.require_arch_key("attention.key_length") == 128
    msg = one_line_error(h.require_arch_key, "attention.sliding_window")
    assert "llama.attention.sliding_window" in msg and "llama.gguf" in msg

    written = tensor_set()
    assert [t.name for t in h.tensors] == [n for n, _, _ in written]
    for t, (_, arr, raw) in zip(h.tensors, written):
        assert t.shape == gguf_shape(arr, raw)
        assert t.nbytes == arr.nbytes
        assert t.n_elements == int(np.prod(t.shape))
    assert [t.ggml_type for t in h.tensors] == ["F16", "F32", "Q8_0", "Q4_0", "Q4_K", "Q6_K", "BF16"]
    assert h.tensors[4].shape == (512, 16)  # Q4_K: 2 blocks per row
    assert h.weight_bytes() == sum(a.nbytes for _, a, _ in written)
    assert h.n_elements() == sum(t.n_elements for t in h.tensors)

    # independent check against gguf-py's own reader (which reads the whole file)
    ref = GGUFReader(path)
    assert h.data_offset == ref.data_offset
    assert h.header_bytes <= h.data_offset < h.header_bytes + 32
    for ours, theirs in zip(h.tensors, ref.tensors):
        assert ours.name == theirs.name
        assert ours.shape == tuple(int(x) for x in theirs.shape)
        assert ours.ggml_type == theirs.tensor_type.name
        assert ours.nbytes == theirs.n_bytes
        assert h.data_offset + ours.offset == theirs.data_offset


def test_quant_mix(tmp_path):
    h = read_header_from_path(write_gguf(tmp_path / "m.gguf", "llama", LLAMA_KV))
    mix = h.quant_mix()
    total = h.weight_bytes()
    # Q4_K 16x288=4608, Q8_0 4x272=1088, BF16 2048, Q6_K 8x210=1680, F16 1024, Q4_0 576, F32 256
    assert [(n, b) for n, b, _ in mix] == [
        ("Q4_K", 4608), ("BF16", 2048), ("Q6_K", 1680), ("Q8_0", 1088), ("F16", 1024), ("Q4_0", 576), ("F32", 256),
    ]  # fmt: skip
    assert sum(b for _, b, _ in mix) == total
    assert sum(s for _, _, s in mix) == pytest.approx(1.0)
    assert mix[0][2] == pytest.approx(4608 / total)


def test_per_layer_head_count_kv_array(tmp_path):
    kv = {
        "deci.block_count": 162,
        "deci.attention.head_count": [128 if x else 0 for x in NEMOTRON_HEAD_KV],
        "deci.attention.head_count_kv": NEMOTRON_HEAD_KV,
        "deci.attention.key_length": 128,
        "deci.attention.value_length": 128,
        "deci.context_length": 131072,
    }
    h = read_header_from_path(write_gguf(tmp_path / "nemotron.gguf", "deci", kv))
    arr = h.arch_key("attention.head_count_kv")
    assert arr == NEMOTRON_HEAD_KV
    assert len(arr) == 162 and sum(arr) == 512 and sum(1 for x in arr if x) == 64


def test_deepseek2_mla_and_gemma3_keys(tmp_path):
    ds = {
        "deepseek2.block_count": 61,
        "deepseek2.attention.head_count": 128,
        "deepseek2.attention.head_count_kv": 1,
        "deepseek2.attention.kv_lora_rank": 512,
        "deepseek2.attention.key_length": 576,
        "deepseek2.attention.value_length": 512,
        "deepseek2.attention.key_length_mla": 192,
        "deepseek2.attention.value_length_mla": 128,
        "deepseek2.rope.dimension_count": 64,
        "deepseek2.expert_count": 256,
    }
    h = read_header_from_path(write_gguf(tmp_path / "ds.gguf", "deepseek2", ds))
    assert h.architecture == "deepseek2"
    assert h.arch_key("attention.key_length") == 576
    assert h.arch_key("attention.value_length") == 512
    assert h.arch_key("attention.kv_lora_rank") == 512
    assert h.arch_key("attention.head_count_kv") == 1

    gm = {
        "gemma3.block_count": 62,
        "gemma3.attention.head_count": 32,
        "gemma3.attention.head_count_kv": 16,
        "gemma3.attention.key_length": 128,
        "gemma3.attention.value_length": 128,
        "gemma3.attention.sliding_window": 1024,
        "gemma3.context_length": 131072,
    }
    h = read_header_from_path(write_gguf(tmp_path / "gemma.gguf", "gemma3", gm))
    assert h.arch_key("attention.sliding_window") == 1024
    assert h.arch_key("block_count") == 62


def test_big_endian_file(tmp_path):
    path = write_gguf(tmp_path / "be.gguf", "llama", LLAMA_KV, endian=GGUFEndian.BIG)
    assert path.read_bytes()[4:8] == b"\x00\x00\x00\x03"
    h = read_header_from_path(path)
    assert h.byte_order == "big" and h.version == 3
    assert h.metadata["tokenizer.ggml.tokens"] == LLAMA_KV["tokenizer.ggml.tokens"]
    assert h.arch_key("block_count") == 32
    little = read_header_from_path(write_gguf(tmp_path / "le.gguf", "llama", LLAMA_KV))
    assert h.tensors == little.tensors


def test_version_2_is_read(tmp_path):
    path = write_gguf(tmp_path / "v3.gguf", "llama", LLAMA_KV)
    data = bytearray(path.read_bytes())
    data[4:8] = struct.pack("<I", 2)  # v2 and v3 share the layout (v3 added big-endian files)
    v2 = tmp_path / "v2.gguf"
    v2.write_bytes(bytes(data))
    h = read_header_from_path(v2)
    assert h.version == 2 and h.arch_key("block_count") == 32


# ------------------------------------------------------------------------------------------------
# incremental reading


def test_reads_only_the_header_small_chunks(tmp_path):
    data = write_gguf(tmp_path / "m.gguf", "llama", LLAMA_KV).read_bytes()
    src = Recorder(data)
    h = read_header(src, len(data), source="mem", chunk_size=64)
    assert h.tensors == read_header_from_path(tmp_path / "m.gguf").tensors
    assert len(src.calls) > 3  # grew the buffer several times
    pos = 0
    for offset, size in src.calls:
        assert offset == pos  # contiguous, never re-reads
        assert offset < h.data_offset  # never starts in the tensor data
        pos += size
    assert pos < 2 * h.header_bytes + 64  # doubling: at most ~2x the header


def test_reads_only_the_header_large_tensor(tmp_path):
    big = [("token_embd.weight", np.zeros((1024, 1024), dtype=np.float32), None)]  # 4 MiB of data
    data = write_gguf(tmp_path / "big.gguf", "llama", {"llama.block_count": 1}, big).read_bytes()
    src = Recorder(data)
    h = read_header(src, len(data))
    assert h.weight_bytes() == 4 << 20
    assert src.calls == [(0, 1 << 20)]  # one 1 MiB request for a small header
    assert all(offset < h.data_offset for offset, _ in src.calls)


def test_unknown_total_size_and_short_reads(tmp_path):
    data = write_gguf(tmp_path / "m.gguf", "llama", LLAMA_KV).read_bytes()

    def stingy(offset: int, size: int) -> bytes:  # a source that returns at most 10 bytes a call
        return data[offset : offset + min(size, 10)]

    h = read_header(stingy, None, chunk_size=16)
    assert h.metadata["tokenizer.ggml.tokens"] == LLAMA_KV["tokenizer.ggml.tokens"]
    assert h.weight_bytes() == sum(a.nbytes for _, a, _ in tensor_set())


def test_large_vocab_header_request_count(tmp_path):
    tokens = [f"tok{i}" for i in range(150_000)]
    kv = {"llama.block_count": 32, "tokenizer.ggml.tokens": tokens, "tokenizer.ggml.scores": [0.0] * 150_000}
    data = write_gguf(tmp_path / "vocab.gguf", "llama", kv).read_bytes()
    src = Recorder(data)
    h = read_header(src, len(data))
    assert h.metadata["tokenizer.ggml.tokens"][-1] == "tok149999"
    assert 1 << 20 < h.header_bytes < 3 << 20
    assert [size for _, size in src.calls] == [1 << 20, 1 << 20, len(data) - (2 << 20)]  # clipped at EOF


# ------------------------------------------------------------------------------------------------
# split files


def write_split(tmp_path: Path) -> list[Path]:
    write_gguf(tmp_path / "Model.gguf", "llama", LLAMA_KV, split_max_tensors=3)
    shards = sorted(tmp_path.glob("Model-*-of-*.gguf"))
    assert [p.name for p in shards] == [f"Model-0000{i}-of-00003.gguf" for i in (1, 2, 3)]
    return shards


def test_split_headers(tmp_path):
    shards = write_split(tmp_path)
    first = read_header_from_path(shards[0])
    assert first.metadata["split.count"] == 3 and first.metadata["split.tensors.count"] == 7
    assert len(first.tensors) == 3

    whole = read_split_headers(shards[0])
    assert len(whole.shards) == 3 and [len(s.tensors) for s in whole.shards] == [3, 3, 1]
    assert [t.name for t in whole.tensors] == [n for n, _, _ in tensor_set()]
    assert whole.weight_bytes() == sum(a.nbytes for _, a, _ in tensor_set())
    assert whole.architecture == "llama" and whole.arch_key("block_count") == 32
    assert whole.shards[1].architecture == ""  # later shards carry only split.* keys
    assert whole.source == str(shards[0])

    from_middle = read_split_headers(shards[1])  # any shard finds the others
    assert from_middle.tensors == whole.tensors and from_middle.metadata == whole.metadata

    single = write_gguf(tmp_path / "single.gguf", "llama", LLAMA_KV)
    assert read_split_headers(single).shards == ()


def test_split_missing_shard(tmp_path):
    shards = write_split(tmp_path)
    shards[2].unlink()
    msg = one_line_error(read_split_headers, shards[0])
    assert "Model-00003-of-00003.gguf" in msg and "missing" in msg


def test_split_badly_named(tmp_path):
    shards = write_split(tmp_path)
    odd = tmp_path / "renamed.gguf"
    shards[0].rename(odd)
    msg = one_line_error(read_split_headers, odd)
    assert "renamed.gguf" in msg and "split.count = 3" in msg


# ------------------------------------------------------------------------------------------------
# errors


def test_missing_file_and_directory(tmp_path):
    assert "no such file" in one_line_error(read_header_from_path, tmp_path / "nope.gguf")
    assert "directory" in one_line_error(read_header_from_path, tmp_path)


@pytest.mark.parametrize(
    ("content", "hint"),
    [
        (b'{\n  "architectures": ["LlamaForCausalLM"]\n}', "JSON"),
        (struct.pack("<Q", 20) + b'{"__metadata__":{}} ', "safetensors"),
        (b"PK\x03\x04\x14\x00\x00\x00", "zip"),
        (b"version https://git-lfs.github.com/spec/v1\noid sha256:abc\n", "Git LFS"),
        (b"<!DOCTYPE html><html>", "HTML"),
        (struct.pack("<I", 0x67676A74) + b"\x03\x00\x00\x00", "GGJT"),
        (b"", "empty"),
    ],
)
def test_bad_magic(tmp_path, content, hint):
    path = tmp_path / "model.gguf"
    path.write_bytes(content)
    msg = one_line_error(read_header_from_path, path)
    assert str(path) in msg and "not a GGUF file" in msg and hint in msg


def test_truncated_at_many_points(tmp_path):
    path = write_gguf(tmp_path / "m.gguf", "llama", LLAMA_KV)
    data = path.read_bytes()
    h = read_header_from_path(path)
    cut_points = [2, 6, 12, 20, 30, 100, h.header_bytes // 2, h.header_bytes - 40, h.header_bytes - 1]
    for cut in cut_points:
        cut_path = tmp_path / f"cut{cut}.gguf"
        cut_path.write_bytes(data[:cut])
        msg = one_line_error(read_header_from_path, cut_path)
        assert "truncated GGUF header" in msg and str(cut_path) in msg, (cut, msg)
        # same without a known size: the source simply runs dry
        msg = one_line_error(read_header, Recorder(data[:cut]), None, source="x", chunk_size=32)
        assert "truncated GGUF header" in msg, (cut, msg)
    # a complete header but a partial download of the tensor data
    part = tmp_path / "partial.gguf"
    part.write_bytes(data[: h.data_offset + 100])
    msg = one_line_error(read_header_from_path, part)
    assert "truncated GGUF file" in msg and "incomplete download" in msg


@pytest.mark.parametrize(("version", "shown"), [(99, "99"), (1, "1"), (0x63000000, "99")])
def test_unsupported_version(tmp_path, version, shown):
    data = bytearray(write_gguf(tmp_path / "m.gguf", "llama", LLAMA_KV).read_bytes())
    data[4:8] = struct.pack("<I", version)
    path = tmp_path / "v.gguf"
    path.write_bytes(bytes(data))
    msg = one_line_error(read_header_from_path, path)
    assert f"unsupported GGUF version {shown}" in msg and "2 and 3" in msg


# Hand-built headers for corruption the writer cannot produce.


def s(text: str | bytes) -> bytes:
    b = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(b)) + b


def raw_gguf(kvs: bytes = b"", n_kv: int = 0, infos: bytes = b"", n_tensors: int = 0, pad: int = 0) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kvs + infos + b"\0" * pad


def kv_u32(key: str, v: int) -> bytes:
    return s(key) + struct.pack("<II", 4, v)


def tensor_info(name: str, dims: list[int], type_id: int, offset: int = 0) -> bytes:
    dims_packed = struct.pack(f"<I{len(dims)}Q", len(dims), *dims)
    return s(name) + dims_packed + struct.pack("<IQ", type_id, offset)


ARCH = s("general.architecture") + struct.pack("<I", 8) + s("llama")


def read_bytes(data: bytes, name: str = "corrupt.gguf"):
    return read_header(Recorder(data), len(data), source=name)


def test_raw_builder_sanity():
    data = raw_gguf(ARCH + kv_u32("llama.block_count", 2), 2, tensor_info("w", [64, 2], 8), 1, pad=32 + 136)
    h = read_bytes(data)
    assert h.architecture == "llama" and h.tensors[0].nbytes == 2 * 2 * 34


@pytest.mark.parametrize(
    ("data", "expect"),
    [
        (raw_gguf(n_tensors=1 << 62), "tensor_count"),
        (raw_gguf(n_kv=1 << 60), "kv_count"),
        (raw_gguf(struct.pack("<Q", 1 << 50) + b"general", 1), "string length"),
        (raw_gguf(s("k") + struct.pack("<IIQ", 9, 8, 1 << 40), 1), "array length"),
        (raw_gguf(s("k") + struct.pack("<IIQ", 9, 4, 1 << 40), 1), "array length"),
        (raw_gguf(s("k") + struct.pack("<I", 13) + b"\0" * 8, 1), "unknown value type 13"),
        (raw_gguf(s("k") + struct.pack("<IIQ", 9, 42, 1), 1), "unknown array item type 42"),
        (raw_gguf(kv_u32("a", 1) + kv_u32("a", 2), 2), "duplicate key 'a'"),
        (raw_gguf(ARCH, 1, tensor_info("w", [1, 1, 1, 1, 1, 1, 1, 1, 1], 0), 1), "9 dimensions"),
        (raw_gguf(ARCH, 1, tensor_info("w", [1 << 40, 1 << 40], 0), 1), "absurd"),
        (raw_gguf(ARCH, 1, tensor_info("w", [100, 2], 12), 1, pad=1000), "not a multiple of the Q4_K block"),
        (raw_gguf(ARCH, 1, tensor_info("w", [4], 0) * 2, 2, pad=64), "duplicate tensor name 'w'"),
        (
            raw_gguf(ARCH, 1, tensor_info("a", [4], 0) + tensor_info("b", [4], 0, 16), 2, pad=96),
            "offset 16, expected 32",
        ),
        (raw_gguf(kv_u32("general.alignment", 24), 1), "general.alignment"),
    ],
)
def test_corrupt_headers(data, expect):
    msg = one_line_error(read_bytes, data)
    assert "corrupt.gguf" in msg and expect in msg, msg


def test_moderate_count_in_tiny_file_is_truncation():
    msg = one_line_error(read_bytes, raw_gguf(ARCH, 1000))
    assert "truncated GGUF header" in msg and "key/value 2 of 1000" in msg


def test_unknown_ggml_type():
    data = raw_gguf(ARCH, 1, tensor_info("blk.0.attn_q.weight", [256, 4], 77), 1, pad=4096)
    msg = one_line_error(read_bytes, data)
    assert "unknown ggml type id 77" in msg and "blk.0.attn_q.weight" in msg and "corrupt.gguf" in msg


def test_legacy_q4_0_4_4_type_is_sized():
    data = raw_gguf(ARCH, 1, tensor_info("w", [64, 4], 31), 1, pad=1024)
    t = read_bytes(data).tensors[0]
    assert t.ggml_type == "Q4_0_4_4" and t.nbytes == 4 * 2 * 18
