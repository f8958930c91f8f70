"""Dependency-free GGUF header reader: metadata and tensor infos, never tensor data.

The reader pulls bytes through a callable ``read(offset, size) -> bytes`` so the same code serves a
local file and HTTP range requests. It asks for a growing prefix of the file: the first request is
``chunk_size`` bytes (1 MiB), and every later one doubles what is buffered (1, 2, 4, 8 MiB ... of
prefix), so a typical 2-10 MiB header (tokenizer arrays dominate) costs 2-5 requests and at most
about twice the header's size. Every request starts inside the header; only the last one can run
on into the tensor data (by less than its own size), and tensor data is never parsed.

Layout (GGUF v2/v3; v1 used 32-bit counts and is refused): magic ``GGUF``, u32 version, u64
tensor_count, u64 kv_count, kv_count x (string key, u32 value type, value), tensor_count x (string
name, u32 n_dims, n_dims x u64 ne, u32 ggml type, u64 offset), padding to ``general.alignment``,
tensor data. Strings are u64 length + UTF-8 bytes; arrays are u32 item type + u64 count + items.
Big-endian files (``GGUFWriter(endianess=BIG)``) are detected from the version field and read.

Shapes are kept in GGUF/ggml order: ``shape[0]`` is ne[0], the innermost (row) dimension, the
reverse of the numpy/PyTorch order.
"""

from __future__ import annotations

import os
import re
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, NamedTuple

from kvplan.errors import ConfigError

__all__ = [
    "GGMLType",
    "GGML_TYPES",
    "GGML_TYPES_BY_NAME",
    "GGUFHeader",
    "GGUFTensor",
    "KNOWN_VERSIONS",
    "ReadFn",
    "read_header",
    "read_header_from_path",
    "read_split_headers",
    "tensor_nbytes",
]

ReadFn = Callable[[int, int], bytes]

KNOWN_VERSIONS = (2, 3)
DEFAULT_CHUNK = 1 << 20  # first request; later requests double the buffered prefix
MAX_HEADER_BYTES = 256 << 20  # real headers are < 20 MiB (256k-token vocabularies included)
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NESTING = 8  # arrays of arrays
DEFAULT_ALIGNMENT = 32


class GGMLType(NamedTuple):
    id: int
    name: str
    block_size: int  # elements per block
    type_size: int  # bytes per block


# ggml_type id -> (name, elements per block, bytes per block): ggml/include/ggml.h and the
# static_asserts of ggml/src/ggml-common.h, mirrored by gguf-py's GGML_QUANT_SIZES (the tests check
# this table against the installed gguf package). Ids 4/5 (Q4_2/Q4_3) predate GGUF; 36-38 were
# runtime-only repack types.
_TYPE_TABLE: dict[int, tuple[str, int, int]] = {
    0: ("F32", 1, 4),
    1: ("F16", 1, 2),
    2: ("Q4_0", 32, 18),
    3: ("Q4_1", 32, 20),
    6: ("Q5_0", 32, 22),
    7: ("Q5_1", 32, 24),
    8: ("Q8_0", 32, 34),
    9: ("Q8_1", 32, 40),
    10: ("Q2_K", 256, 84),
    11: ("Q3_K", 256, 110),
    12: ("Q4_K", 256, 144),
    13: ("Q5_K", 256, 176),
    14: ("Q6_K", 256, 210),
    15: ("Q8_K", 256, 292),
    16: ("IQ2_XXS", 256, 66),
    17: ("IQ2_XS", 256, 74),
    18: ("IQ3_XXS", 256, 98),
    19: ("IQ1_S", 256, 50),
    20: ("IQ4_NL", 32, 18),
    21: ("IQ3_S", 256, 110),
    22: ("IQ2_S", 256, 82),
    23: ("IQ4_XS", 256, 136),
    24: ("I8", 1, 1),
    25: ("I16", 1, 2),
    26: ("I32", 1, 4),
    27: ("I64", 1, 8),
    28: ("F64", 1, 8),
    29: ("IQ1_M", 256, 56),
    30: ("BF16", 1, 2),
    # Legacy ARM repacks of Q4_0 (same block_q4_0 layout): written by late-2024 llama-quantize,
    # no longer loadable by llama.cpp, still found on the Hub. Not in current gguf-py.
    31: ("Q4_0_4_4", 32, 18),
    32: ("Q4_0_4_8", 32, 18),
    33: ("Q4_0_8_8", 32, 18),
    34: ("TQ1_0", 256, 54),
    35: ("TQ2_0", 256, 66),
    39: ("MXFP4", 32, 17),
    40: ("NVFP4", 64, 36),
    41: ("Q1_0", 128, 18),
}
LEGACY_TYPE_IDS = frozenset({31, 32, 33})

GGML_TYPES: dict[int, GGMLType] = {i: GGMLType(i, *v) for i, v in _TYPE_TABLE.items()}
GGML_TYPES_BY_NAME: dict[str, GGMLType] = {t.name: t for t in GGML_TYPES.values()}


def tensor_nbytes(ggml_type: int | str, shape: tuple[int, ...] | list[int]) -> int:
    """Exact bytes of a tensor with GGUF-order ``shape`` (ne[0] first): n/block * type_size."""
    t = GGML_TYPES[ggml_type] if isinstance(ggml_type, int) else GGML_TYPES_BY_NAME[ggml_type]
    n = 1
    for d in shape:
        n *= d
    if shape and shape[0] % t.block_size:
        raise ValueError(f"row of {shape[0]} elements is not a multiple of the {t.name} block ({t.block_size})")
    return n // t.block_size * t.type_size


# --------------------------------------------------------------------------------------------------
# Result types


@dataclass(frozen=True)
class GGUFTensor:
    name: str
    shape: tuple[int, ...]  # GGUF/ggml order: ne[0] (the row length) first
    ggml_type: str
    n_elements: int
    nbytes: int
    offset: int = 0  # relative to the start of the file's tensor data


@dataclass(frozen=True, eq=False)
class GGUFHeader:
    version: int
    metadata: dict[str, Any]  # arrays are lists; strings are str (invalid UTF-8 replaced)
    tensors: tuple[GGUFTensor, ...]
    header_bytes: int  # where the header (kv + tensor infos) ends, before alignment padding
    architecture: str  # general.architecture ("" when absent, e.g. in shards after the first)
    data_offset: int = 0  # where tensor data starts (header_bytes rounded up to the alignment)
    byte_order: str = "little"
    source: str = ""  # file name or URL, for messages
    # For a split model (read_split_headers): each shard's own header, in order. Then `tensors`
    # holds every shard's tensors and header_bytes/data_offset describe the first shard.
    shards: tuple[GGUFHeader, ...] = ()

    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors)

    def n_elements(self) -> int:
        return sum(t.n_elements for t in self.tensors)

    def quant_mix(self) -> list[tuple[str, int, float]]:
        """[(ggml type name, bytes, share of weight bytes)] by bytes descending (then name)."""
        by_type: dict[str, int] = {}
        for t in self.tensors:
            by_type[t.ggml_type] = by_type.get(t.ggml_type, 0) + t.nbytes
        total = sum(by_type.values())
        rows = sorted(by_type.items(), key=lambda kv: (-kv[1], kv[0]))
        return [(name, b, b / total if total else 0.0) for name, b in rows]

    def arch_key(self, suffix: str, default: Any = None) -> Any:
        """Metadata ``<architecture>.<suffix>`` (e.g. "block_count"), or ``default`` if absent."""
        return self.metadata.get(f"{self.architecture}.{suffix}", default)

    def require_arch_key(self, suffix: str) -> Any:
        key = f"{self.architecture}.{suffix}"
        if key not in self.metadata:
            raise ConfigError(f"{self.source}: GGUF metadata lacks '{key}'")
        return self.metadata[key]


# --------------------------------------------------------------------------------------------------
# Parser

_STRING, _ARRAY = 8, 9
_SCALAR_FMT = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_MIN_SIZE = {**{k: struct.calcsize(v) for k, v in _SCALAR_FMT.items()}, _STRING: 8, _ARRAY: 12}
_MIN_KV = 8 + 4 + 1  # empty key, type, 1-byte value
_MIN_TENSOR_INFO = 8 + 4 + 4 + 8  # empty name, n_dims = 0, type, offset


def _bad_magic(source: str, head: bytes) -> ConfigError:
    if not head:
        return ConfigError(f"{source}: not a GGUF file (it is empty)")
    guess = ""
    stripped = head.lstrip()
    if stripped[:1] in (b"{", b"["):
        guess = "looks like JSON, e.g. a config.json"
    elif len(head) >= 9 and head[8:9] == b"{":
        guess = "looks like a safetensors file"
    elif head.startswith(b"PK\x03\x04"):
        guess = "looks like a zip archive, e.g. a PyTorch .bin/.pt checkpoint"
    elif head[:1] == b"\x80":
        guess = "looks like a Python pickle, e.g. a PyTorch checkpoint"
    elif head.startswith(b"version https://git-lfs"):
        guess = "it is a Git LFS pointer, not the model file: run `git lfs pull`"
    elif stripped[:1] == b"<":
        guess = "looks like HTML/XML, e.g. an error page saved by a download"
    elif head[:4] in (b"tjgg", b"lmgg", b"fmgg", b"algg"):
        guess = "a legacy GGML/GGJT model from before GGUF: convert it to GGUF"
    return ConfigError(
        f"{source}: not a GGUF file (starts with {head[:16]!r}{'; ' + guess if guess else ''})"
    )


class _Parser:
    def __init__(self, read_fn: ReadFn, total_size: int | None, source: str, chunk_size: int):
        self.read_fn = read_fn
        self.total = total_size
        self.source = source
        self.chunk = max(1, chunk_size)
        self.buf = bytearray()
        self.pos = 0
        self.e = "<"
        self.where = "the file header"

    # -- byte supply -------------------------------------------------------------------------------

    def _fetch(self, end: int) -> bool:
        """Grow the buffered prefix to ``end`` bytes; False when the source runs out first."""
        while len(self.buf) < end:
            have = len(self.buf)
            want = max(self.chunk, have, end - have)
            want = min(want, MAX_HEADER_BYTES - have)
            if self.total is not None:
                want = min(want, self.total - have)
            if want <= 0:
                return False
            data = self.read_fn(have, want)
            if not data:
                return False
            self.buf += data[:want]
        return True

    def need(self, n: int) -> None:
        end = self.pos + n
        if end <= len(self.buf):
            return
        if end > MAX_HEADER_BYTES:
            raise self.corrupt(f"{self.where} would end {end:,} bytes into the file, past any sane header")
        if (self.total is not None and end > self.total) or not self._fetch(end):
            size = self.total if self.total is not None else len(self.buf)
            raise ConfigError(
                f"{self.source}: truncated GGUF header: {self.where} needs bytes up to offset "
                f"{end:,} but the file ends at {size:,}"
            )

    def corrupt(self, why: str) -> ConfigError:
        return ConfigError(f"{self.source}: corrupt GGUF header: {why}")

    def check_count(self, count: int, min_size: int, what: str) -> None:
        if count * min_size > MAX_HEADER_BYTES:
            raise self.corrupt(f"{what} {count:,} is absurd (at least {count * min_size:,} bytes of header)")

    # -- primitives --------------------------------------------------------------------------------

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        self.need(size)
        (v,) = struct.unpack_from(self.e + fmt, self.buf, self.pos)
        self.pos += size
        return v

    def string(self) -> str:
        n = self.scalar("Q")
        if n > MAX_HEADER_BYTES:
            raise self.corrupt(f"{self.where}: string length {n:,} is absurd")
        self.need(n)
        s = self.buf[self.pos : self.pos + n].decode("utf-8", "replace")
        self.pos += n
        return s

    def value(self, vtype: int, depth: int = 0) -> Any:
        fmt = _SCALAR_FMT.get(vtype)
        if fmt is not None:
            return self.scalar(fmt)
        if vtype == _STRING:
            return self.string()
        if vtype == _ARRAY:
            return self.array(depth + 1)
        raise self.corrupt(f"{self.where}: unknown value type {vtype}")

    def array(self, depth: int) -> list[Any]:
        if depth > MAX_NESTING:
            raise self.corrupt(f"{self.where}: arrays nested more than {MAX_NESTING} deep")
        itype = self.scalar("I")
        count = self.scalar("Q")
        if itype not in _MIN_SIZE:
            raise self.corrupt(f"{self.where}: unknown array item type {itype}")
        self.check_count(count, _MIN_SIZE[itype], f"{self.where}: array length")
        fmt = _SCALAR_FMT.get(itype)
        if fmt is not None:  # numbers and bools in one unpack
            size = count * _MIN_SIZE[itype]
            self.need(size)
            items = list(struct.unpack_from(f"{self.e}{count}{fmt}", self.buf, self.pos))
            self.pos += size
            return items
        if itype == _STRING:  # hot path: tokenizer vocabularies and merges
            out = []
            ufmt = self.e + "Q"
            for _ in range(count):
                self.need(8)
                (n,) = struct.unpack_from(ufmt, self.buf, self.pos)
                if n > MAX_HEADER_BYTES:
                    raise self.corrupt(f"{self.where}: string length {n:,} is absurd")
                self.pos += 8
                self.need(n)
                out.append(self.buf[self.pos : self.pos + n].decode("utf-8", "replace"))
                self.pos += n
            return out
        return [self.value(itype, depth) for _ in range(count)]

    # -- structure ---------------------------------------------------------------------------------

    def parse(self) -> GGUFHeader:
        self._fetch(4)
        if bytes(self.buf[:4]) != b"GGUF":
            if 0 < len(self.buf) < 4 and b"GGUF".startswith(bytes(self.buf)):
                self.need(4)  # raises: truncated
            self._fetch(64)
            raise _bad_magic(self.source, bytes(self.buf[:64]))
        self.pos = 4
        self.where = "the version field"
        self.need(4)
        (version,) = struct.unpack_from("<I", self.buf, 4)
        (swapped,) = struct.unpack_from(">I", self.buf, 4)
        if version not in KNOWN_VERSIONS and swapped in KNOWN_VERSIONS:
            self.e, version = ">", swapped
        byte_order = "big" if self.e == ">" else "little"
        if version not in KNOWN_VERSIONS:
            shown = swapped if swapped < version else version
            extra = " (GGUF v1 from 2023: reconvert the model)" if shown == 1 else ""
            known = " and ".join(map(str, KNOWN_VERSIONS))
            raise ConfigError(f"{self.source}: unsupported GGUF version {shown}{extra}; kvplan reads versions {known}")
        self.pos = 8
        self.where = "the tensor and key/value counts"
        n_tensors = self.scalar("Q")
        n_kv = self.scalar("Q")
        self.check_count(n_tensors, _MIN_TENSOR_INFO, "tensor_count")
        self.check_count(n_kv, _MIN_KV, "kv_count")

        metadata: dict[str, Any] = {}
        for i in range(n_kv):
            self.where = f"key/value {i + 1} of {n_kv}"
            key = self.string()
            self.where = f"key/value {i + 1} of {n_kv} ('{key}')"
            if key in metadata:
                raise self.corrupt(f"duplicate key '{key}'")
            metadata[key] = self.value(self.scalar("I"))

        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):
            raise self.corrupt(f"general.alignment = {alignment!r} is not a power of two")

        tensors: list[GGUFTensor] = []
        names: set[str] = set()
        for i in range(n_tensors):
            self.where = f"tensor info {i + 1} of {n_tensors}"
            name = self.string()
            self.where = f"tensor info {i + 1} of {n_tensors} ('{name}')"
            n_dims = self.scalar("I")
            if n_dims > MAX_DIMS:
                raise self.corrupt(f"{self.where}: {n_dims} dimensions (ggml allows {MAX_DIMS})")
            self.need(8 * n_dims)
            shape = struct.unpack_from(f"{self.e}{n_dims}Q", self.buf, self.pos)
            self.pos += 8 * n_dims
            type_id = self.scalar("I")
            offset = self.scalar("Q")
            if name in names:
                raise self.corrupt(f"duplicate tensor name '{name}'")
            names.add(name)
            tensors.append(self._tensor(name, shape, type_id, offset))

        header_bytes = self.pos
        data_offset = -(-header_bytes // alignment) * alignment
        self._check_offsets(tensors, alignment, data_offset)
        arch = metadata.get("general.architecture", "")
        return GGUFHeader(
            version=version,
            metadata=metadata,
            tensors=tuple(tensors),
            header_bytes=header_bytes,
            architecture=arch if isinstance(arch, str) else "",
            data_offset=data_offset,
            byte_order=byte_order,
            source=self.source,
        )

    def _tensor(self, name: str, shape: tuple[int, ...], type_id: int, offset: int) -> GGUFTensor:
        t = GGML_TYPES.get(type_id)
        if t is None:
            raise ConfigError(
                f"{self.source}: tensor '{name}' has unknown ggml type id {type_id} (known: "
                f"{min(GGML_TYPES)}-{max(GGML_TYPES)}; a newer llama.cpp type or a fork-specific quant "
                "such as ik_llama.cpp's?)"
            )
        n = 1
        for d in shape:
            n *= d
        if n >= 1 << 63:
            raise self.corrupt(f"{self.where}: shape {list(shape)} is absurd")
        if shape and shape[0] % t.block_size:
            raise self.corrupt(
                f"{self.where}: row length {shape[0]} is not a multiple of the {t.name} block size {t.block_size}"
            )
        return GGUFTensor(name, tuple(shape), t.name, n, n // t.block_size * t.type_size, offset)

    def _check_offsets(self, tensors: list[GGUFTensor], alignment: int, data_offset: int) -> None:
        """Like llama.cpp's gguf loader: tensors sit back to back, each padded to the alignment.

        A mismatch means a corrupt file or a wrong size in the type table, so it is an error."""
        expected = 0
        for t in tensors:
            if t.offset != expected:
                raise self.corrupt(
                    f"tensor '{t.name}' ({t.ggml_type} {list(t.shape)}) has data offset {t.offset:,}, "
                    f"expected {expected:,}"
                )
            expected += -(-t.nbytes // alignment) * alignment
        if self.total is not None and tensors:
            end = data_offset + tensors[-1].offset + tensors[-1].nbytes
            if end > self.total:
                raise ConfigError(
                    f"{self.source}: truncated GGUF file: tensor data ends at {end:,} bytes but the file "
                    f"has {self.total:,} (incomplete download?)"
                )


# --------------------------------------------------------------------------------------------------
# Entry points


def read_header(
    read_fn: ReadFn,
    total_size: int | None = None,
    *,
    source: str = "GGUF source",
    chunk_size: int = DEFAULT_CHUNK,
) -> GGUFHeader:
    """Parse a GGUF header from ``read_fn(offset, size)`` (short or empty reads mean end of file).

    ``total_size`` (the file's length, e.g. from Content-Length) lets truncation be reported
    precisely and the last request be clipped; it is optional."""
    return _Parser(read_fn, total_size, source, chunk_size).parse()


def read_header_from_path(path: str | os.PathLike[str], *, chunk_size: int = DEFAULT_CHUNK) -> GGUFHeader:
    """Header of one local .gguf file (one shard only; see read_split_headers)."""
    source = os.fspath(path)
    try:
        with open(source, "rb") as f:
            size = os.fstat(f.fileno()).st_size

            def read(offset: int, n: int) -> bytes:
                f.seek(offset)
                return f.read(n)

            return read_header(read, size, source=source, chunk_size=chunk_size)
    except FileNotFoundError:
        raise ConfigError(f"{source}: no such file") from None
    except IsADirectoryError:
        raise ConfigError(f"{source}: is a directory, not a .gguf file") from None
    except OSError as exc:
        raise ConfigError(f"{source}: cannot read: {exc.strerror or exc}") from None


_SHARD_RE = re.compile(r"^(?P<prefix>.*)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")


def shard_paths(path: str | os.PathLike[str], count: int) -> list[Path] | None:
    """The ``<prefix>-0000i-of-0000N.gguf`` siblings of ``path`` (llama.cpp's llama_split_path)."""
    p = Path(path)
    m = _SHARD_RE.match(p.name)
    if not m or int(m["count"]) != count:
        return None
    return [p.with_name(f"{m['prefix']}-{i:05d}-of-{count:05d}.gguf") for i in range(1, count + 1)]


def read_split_headers(path: str | os.PathLike[str], *, chunk_size: int = DEFAULT_CHUNK) -> GGUFHeader:
    """Header of a whole model: a single file, or all shards of a gguf-split model.

    ``path`` may name any shard; the others must sit next to it with llama.cpp's naming. The result
    carries shard 1's metadata, every shard's tensors in order, and the per-shard headers in
    ``shards``. A single (unsplit) file comes back as read_header_from_path returns it."""
    header = read_header_from_path(path, chunk_size=chunk_size)
    count = header.metadata.get("split.count", 1)
    if not isinstance(count, int) or count <= 1:
        return header
    paths = shard_paths(path, count)
    if paths is None:
        raise ConfigError(
            f"{os.fspath(path)}: split.count = {count} but the name is not <model>-NNNNN-of-{count:05d}.gguf, "
            "so the other shards cannot be found"
        )
    missing = [p.name for p in paths if not p.is_file()]
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise ConfigError(f"{paths[0]}: missing shard {missing[0]}{more} of a {count}-file split GGUF")
    here = Path(path)
    shards = [header if p == here else read_header_from_path(p, chunk_size=chunk_size) for p in paths]
    for i, (p, h) in enumerate(zip(paths, shards)):
        no, cnt = h.metadata.get("split.no"), h.metadata.get("split.count")
        if no != i or cnt != count:
            raise ConfigError(f"{p}: shard says split.no = {no}, split.count = {cnt}; expected {i} and {count}")
    first = shards[0]
    tensors = tuple(t for h in shards for t in h.tensors)
    expected = first.metadata.get("split.tensors.count")
    if expected is not None and expected != len(tensors):
        raise ConfigError(
            f"{paths[0]}: split.tensors.count = {expected} but the {count} shards hold {len(tensors)} tensors"
        )
    return GGUFHeader(
        version=first.version,
        metadata=first.metadata,
        tensors=tensors,
        header_bytes=first.header_bytes,
        architecture=first.architecture,
        data_offset=first.data_offset,
        byte_order=first.byte_order,
        source=str(paths[0]),
        shards=tuple(shards),
    )
