"""The GPU catalog (kvplan/data/gpus.json) and the GPU references people type: names, sizes, `NxGPU`.

Every catalog GPU has two totals (CONTRACTS.md, "GPU memory"): `nvml_bytes`, what nvidia-smi shows, and
`cuda_total_bytes`, what cudaMemGetInfo / torch `total_memory` report. The CUDA total is the one budgets use.

Where the catalog has no measured CUDA total, it is estimated by one rule and flagged `estimated`:

    cuda_total_MiB = nvml_MiB - (256 + round(nvml_MiB / 400))        (256 MiB + 0.25 % of the board)

The rule comes from the measured (nvidia-smi, torch) pairs in shared/reference/gpus.yaml: the two constants are
set by H100 SXM (81559 vs 81082..81090 MiB) and H200 (143771 vs 143156), where it gives 81099 (+9..+17 MiB)
and 143156 (exact). On the pairs it was not fitted to it is off by +288 MiB on GH200-144GB (+0.20 %), +113 MiB
on the RTX 3090 total in a vLLM log (23.58 GiB; +0.47 %) and -316 MiB on the RTX 4090 (-1.29 %, whose
nvidia-smi total already leaves the reservation out). A fixed share or a fixed MiB figure fits these pairs
worse; kvplan/data/README.md gives the numbers.

A bare size ("24GB") is a device whose CUDA total is that size; `NxGPU` ("8xH100") is N identical devices.
"""

from __future__ import annotations

import difflib
import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from kvplan.errors import InputError, shown
from kvplan.units import MiB, fmt_bytes, parse_bytes

CATALOG_PATH = Path(__file__).resolve().parent / "data" / "gpus.json"  # fields: data/README.md

ESTIMATE_FIXED_MIB = 256
ESTIMATE_SHARE_DIVISOR = 400  # 1/400 = 0.25 %
ESTIMATE_RULE = "nvidia-smi total - (256 MiB + 0.25%)"

LOCAL_MATCH_TOLERANCE = 0.02  # a local device matches a catalog entry within 2 % of its CUDA total

_ACCEPTED = "a catalog name (see `kvplan gpus`), a size such as 24GB or 80GiB, or NxGPU such as 8xH100"
_MULTI_RE = re.compile(r"^\s*([-+]?[\d.]*)\s*[x×]\s*(.*?)\s*$", re.IGNORECASE | re.ASCII)
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]+)\s*$", re.IGNORECASE | re.ASCII)
_SIZE_UNITS = {"b", "k", "kb", "kib", "m", "mb", "mib", "g", "gb", "gib", "t", "tb", "tib"}
_VENDOR_WORDS = ("nvidia", "geforce", "tesla", "quadro", "amd", "instinct")


@dataclass(frozen=True)
class Gpu:
    """One board of the GPU catalog (kvplan/data/gpus.json), with the memory its driver reports and sources."""
    name: str
    display: str
    aliases: tuple[str, ...]
    vendor: str
    nvml_bytes: int | None
    cuda_total_bytes: int
    cuda_total_estimated: bool
    bandwidth_gbps: float | None
    marketing_gb: float | None
    source: str
    cuda_total_source: str = ""
    tflops: tuple[tuple[str, float], ...] = ()  # dense tensor TFLOPS by dtype (bf16 / fp16 / fp8), as the catalog cites
    tflops_source: str = ""
    # datacenter | workstation | consumer | unknown: the evidence class of fit's likely range (evidence.py)
    tier: str = "unknown"
    # between the boards of one node: nvswitch | nvlink | pcie | xgmi | unknown (engines' all-reduce paths differ)
    interconnect: str = "unknown"
    nccl_nvls: bool = False  # NVLink SHARP (Hopper+ on NVSwitch): NCCL's multicast buffers, about 2 GiB per GPU

    def to_json(self) -> dict:
        """One catalog row, for `kvplan gpus --json`."""
        return {
            "name": self.name,
            "display": self.display,
            "aliases": list(self.aliases),
            "vendor": self.vendor,
            "nvml_bytes": self.nvml_bytes,
            "cuda_total_bytes": self.cuda_total_bytes,
            "estimated": self.cuda_total_estimated,
            "cuda_total_source": self.cuda_total_source,
            "bandwidth_gbps": self.bandwidth_gbps,
            "marketing_gb": self.marketing_gb,
            "source": self.source,
            "tflops": dict(self.tflops),
            "tflops_source": self.tflops_source,
            "tier": self.tier,
            "interconnect": self.interconnect,
            "nccl_nvls": self.nccl_nvls,
        }


@dataclass(frozen=True)
class GpuSelection:
    """What `--gpu` named: a catalog board (or a plain size) and how many of them."""
    gpu: Gpu
    count: int
    requested: str

    @property
    def total_bytes(self) -> int:
        """The CUDA total of ONE device (CONTRACTS.md: `gpu.total_bytes` is one device)."""
        return self.gpu.cuda_total_bytes

    def to_json(self) -> dict:
        """The `gpu` object of `kvplan fit --json`."""
        return {
            "name": self.gpu.name,
            "count": self.count,
            "total_bytes": self.gpu.cuda_total_bytes,
            "cuda_total_bytes": self.gpu.cuda_total_bytes,
            "nvml_bytes": self.gpu.nvml_bytes,
            "estimated": self.gpu.cuda_total_estimated,
        }


def estimate_cuda_total(nvml_bytes: int) -> int:
    """The CUDA-runtime total of a board from its nvidia-smi total (module docstring: the rule and its error)."""
    nvml_mib = nvml_bytes // MiB
    reserved_mib = ESTIMATE_FIXED_MIB + (nvml_mib + ESTIMATE_SHARE_DIVISOR // 2) // ESTIMATE_SHARE_DIVISOR
    return (nvml_mib - reserved_mib) * MiB


def _key(text: str) -> str:
    """Case- and punctuation-insensitive form of a name: 'H100_SXM', 'h100-sxm' -> 'h100sxm'."""
    return re.sub(r"[^0-9a-z]", "", text.lower())


def _gpu_from_entry(entry: dict) -> Gpu:
    nvml = entry.get("nvml_bytes")
    measured = entry.get("cuda_total_bytes")
    if measured is None and nvml is None:
        raise ValueError(f"gpus.json: {entry['name']} has neither nvml_bytes nor cuda_total_bytes")
    return Gpu(
        name=entry["name"],
        display=entry["display"],
        aliases=tuple(str(a) for a in entry.get("aliases") or ()),
        vendor=entry["vendor"],
        nvml_bytes=nvml,
        cuda_total_bytes=measured if measured is not None else estimate_cuda_total(nvml),
        cuda_total_estimated=measured is None or bool(entry.get("cuda_total_estimated")),
        bandwidth_gbps=entry.get("bandwidth_gbps"),
        marketing_gb=entry.get("marketing_gb"),
        source=entry.get("source", ""),
        cuda_total_source=entry.get("cuda_total_source") or f"estimated: {ESTIMATE_RULE}",
        tflops=tuple((k[len("tflops_"):], float(entry[k])) for k in ("tflops_bf16", "tflops_fp16", "tflops_fp8")
                     if entry.get(k) is not None),
        tflops_source=entry.get("tflops_source", ""),
        tier=entry.get("tier", "unknown"),
        interconnect=entry.get("interconnect", "unknown"),
        nccl_nvls=bool(entry.get("nccl_nvls")),
    )


@lru_cache(maxsize=1)
def _load() -> tuple[tuple[Gpu, ...], dict[str, Gpu], dict[str, tuple[str, ...]]]:
    data = json.loads(CATALOG_PATH.read_text(encoding="utf-8"))
    gpus = tuple(_gpu_from_entry(e) for e in data["gpus"])
    by_name = {g.name: g for g in gpus}
    index: dict[str, Gpu] = {}
    for gpu in gpus:
        for text in (gpu.name, gpu.display, *gpu.aliases):
            key = _key(text)
            if index.get(key, gpu) is not gpu:
                raise ValueError(f"gpus.json: {text!r} names both {index[key].name} and {gpu.name}")
            index[key] = gpu
    ambiguous: dict[str, tuple[str, ...]] = {}
    for text, candidates in (data.get("ambiguous") or {}).items():
        key = _key(str(text))
        if key in index:
            raise ValueError(f"gpus.json: {text!r} is both ambiguous and an alias of {index[key].name}")
        unknown = [c for c in candidates if c not in by_name]
        if unknown:
            raise ValueError(f"gpus.json: ambiguous {text!r} lists unknown GPUs {unknown}")
        ambiguous[key] = tuple(candidates)
    return gpus, index, ambiguous


def load_catalog() -> tuple[Gpu, ...]:
    """Every catalog GPU, in file order (read once)."""
    return _load()[0]


def catalog_rows() -> list[dict]:
    """Data for the `kvplan gpus` table / JSON: one dict per GPU (see Gpu.to_json)."""
    return [gpu.to_json() for gpu in load_catalog()]


def sized_gpu(total_bytes: int) -> Gpu:
    """A generic device whose CUDA total (and nvidia-smi total) is exactly `total_bytes`."""
    name = f"{fmt_bytes(total_bytes)} device"
    return Gpu(
        name=name,
        display=name,
        aliases=(),
        vendor="generic",
        nvml_bytes=total_bytes,
        cuda_total_bytes=total_bytes,
        cuda_total_estimated=False,
        bandwidth_gbps=None,
        marketing_gb=None,
        source="size given by the user",
        cuda_total_source="given",
    )


MAX_GPUS = 100_000  # the largest clusters have about this many GPUs; more is a typo


def resolve_gpu(text: str) -> GpuSelection:
    """'H100', 'h100_sxm', '24GB', '8xH100', '4x24GB' -> GpuSelection; InputError (one line) otherwise."""
    requested = str(text).strip()
    if not requested:
        raise InputError(f"GPU: empty; use {_ACCEPTED}")
    count = 1
    single = requested
    multi = _MULTI_RE.match(requested)
    if multi:
        number, single = multi.groups()
        if not re.fullmatch(r"[0-9]+", number) or len(number) > 9 or not 1 <= int(number) <= MAX_GPUS:
            raise InputError(
                f"GPU {shown(requested)}: the count before 'x' must be a whole number from 1 to {MAX_GPUS:,}, "
                f"got {number[:20] + '...' if len(number) > 20 else number or 'nothing'}; use NxGPU such as 8xH100 or 2x24GB"
            )
        if not single:
            raise InputError(f"GPU {shown(requested)}: no GPU after the count; use NxGPU such as 8xH100 or 2x24GB")
        count = int(number)
    return GpuSelection(gpu=_resolve_one(single, requested), count=count, requested=requested)


def _resolve_one(text: str, requested: str) -> Gpu:
    _, index, ambiguous = _load()
    key = _key(text)
    if key in index:
        return index[key]
    if key in ambiguous:
        raise InputError(
            f"GPU {text!r} is ambiguous: use one of {', '.join(ambiguous[key])}, or give its memory as a size"
        )
    size = _SIZE_RE.match(text)
    if size and size.group(2).lower() in _SIZE_UNITS:
        return sized_gpu(parse_bytes(text, f"GPU size {shown(requested)}"))
    if key in _SIZE_UNITS:
        raise InputError(f"GPU {shown(requested)}: a unit without a number; use {_ACCEPTED}")
    if re.fullmatch(r"\s*[\d.]+\s*", text):
        raise InputError(f"GPU {shown(requested)}: a number without a unit; use {_ACCEPTED}")
    raise InputError(f"unknown GPU {shown(text)}{_suggest(key, index)}; use {_ACCEPTED}")


def _suggest(key: str, index: dict[str, Gpu]) -> str:
    names: list[str] = []
    for match in difflib.get_close_matches(key, list(index), n=10, cutoff=0.6):
        name = index[match].name
        if name not in names:
            names.append(name)
    return f" (did you mean {', '.join(names[:3])}?)" if names else ""


def match_local(name: str, total_bytes: int) -> Gpu | None:
    """The catalog entry for a local device (torch name + total), or None.

    The name must match the entry's name, display name or an alias (vendor words like 'NVIDIA'/'GeForce'
    optional), and the total must lie within 2 % of the entry's CUDA total: boards named 'NVIDIA H100 PCIe'
    exist with 81559, 81920 and 94514 MiB, so the name alone does not decide. Nearest total wins.
    """
    gpus, _, ambiguous = _load()
    wanted = _stripped_key(name)
    candidates = [
        g for g in gpus
        if any(_stripped_key(t) == wanted for t in (g.name, g.display, *g.aliases))
    ]
    for key, names in ambiguous.items():
        if _stripped_key(key) == wanted:
            candidates += [g for g in gpus if g.name in names]
    fitting = [
        g for g in candidates
        if abs(total_bytes - g.cuda_total_bytes) <= LOCAL_MATCH_TOLERANCE * g.cuda_total_bytes
    ]
    return min(fitting, key=lambda g: abs(total_bytes - g.cuda_total_bytes), default=None)


def _stripped_key(text: str) -> str:
    words = re.split(r"[^0-9a-z]+", text.lower())
    return "".join(w for w in words if w not in _VENDOR_WORDS)
