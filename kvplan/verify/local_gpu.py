"""`kvplan gpus --local`: the local CUDA devices as torch and NVML see them, written in the catalog's form
(kvplan/data/gpus.json), with the catalog entry each one matches, so users can extend the catalog."""

from __future__ import annotations

import os
import shutil
import subprocess
from datetime import date
from typing import Any

from kvplan.errors import EnvironmentProblem
from kvplan.units import MiB


def _nvml_totals() -> dict[str, Any]:
    """NVML totals by PCI bus id (and by NVML index): pynvml when installed, else nvidia-smi; {} when neither."""
    out: dict[str, Any] = {}
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            for i in range(pynvml.nvmlDeviceGetCount()):
                h = pynvml.nvmlDeviceGetHandleByIndex(i)
                bus = pynvml.nvmlDeviceGetPciInfo(h).busId
                bus = bus.decode() if isinstance(bus, bytes) else str(bus)
                entry = {"nvml_bytes": int(pynvml.nvmlDeviceGetMemoryInfo(h).total), "source": "pynvml"}
                out[_bus_key(bus)] = entry
                out[f"#{i}"] = entry
        finally:
            pynvml.nvmlShutdown()
        return out
    except Exception:
        out.clear()
    smi = shutil.which("nvidia-smi")
    if not smi:
        return out
    try:
        text = subprocess.run([smi, "--query-gpu=index,pci.bus_id,memory.total", "--format=csv,noheader,nounits"],
                              capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired):
        return out
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) == 3 and parts[2].isdigit():
            entry = {"nvml_bytes": int(parts[2]) * MiB, "source": "nvidia-smi"}
            out[_bus_key(parts[1])] = entry
            out[f"#{parts[0]}"] = entry
    return out


def _bus_key(bus: str) -> str:
    """'00000000:1B:00.0' and '0000:1b:00.0' -> '1b:00.0'."""
    bus = bus.strip().lower()
    parts = bus.split(":")
    return ":".join(parts[-2:]) if len(parts) >= 2 else bus


def _suggest_name(display: str) -> str:
    words = [w for w in display.replace("_", " ").split() if w.lower() not in ("nvidia", "geforce", "tesla")]
    return "-".join(words) or display


def local_devices() -> list[dict[str, Any]]:
    """Every CUDA device torch sees: name, CUDA totals (device properties and cudaMemGetInfo), NVML total, the
    catalog entry it matches (or None) and a catalog entry for it."""
    from kvplan import gpus
    from kvplan.verify.measure import require_torch

    torch = require_torch()
    try:
        available = bool(torch.cuda.is_available())
    except Exception:  # pragma: no cover
        available = False
    if not available:
        why = f"torch {torch.__version__} was built without CUDA" if not getattr(torch.version, "cuda", None) else \
            "torch sees no CUDA device (driver missing, or CUDA_VISIBLE_DEVICES hides them)"
        raise EnvironmentProblem(f"gpus --local: no CUDA device: {why}")
    nvml = _nvml_totals()
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES") not in (None, "")
    out = []
    for i in range(int(torch.cuda.device_count())):
        props = torch.cuda.get_device_properties(i)
        name = str(props.name)
        total = int(props.total_memory)
        free, info_total = (int(x) for x in torch.cuda.mem_get_info(i))
        bus = getattr(props, "pci_bus_id", None)
        nv = None
        if bus is not None:
            dom = getattr(props, "pci_domain_id", 0)
            dev = getattr(props, "pci_device_id", 0)
            nv = nvml.get(_bus_key(f"{dom:04x}:{int(bus):02x}:{int(dev):02x}.0"))
        if nv is None and not hidden:
            nv = nvml.get(f"#{i}")
        match = gpus.match_local(name, total)
        capability = f"{getattr(props, 'major', '?')}.{getattr(props, 'minor', '?')}"
        entry = {
            "name": match.name if match else _suggest_name(name),
            "display": name,
            "vendor": "nvidia" if "nvidia" in name.lower() or getattr(torch.version, "hip", None) is None else "amd",
            "aliases": list(match.aliases) if match else [],
            "nvml_bytes": nv["nvml_bytes"] if nv else None,
            "cuda_total_bytes": total,
            "cuda_total_source": f"torch total_memory {total // MiB} MiB on {date.today().isoformat()} "
                                 f"(torch {torch.__version__}, CUDA {getattr(torch.version, 'cuda', None)}; "
                                 "`kvplan gpus --local`)",
            "bandwidth_gbps": match.bandwidth_gbps if match else None,
            "marketing_gb": match.marketing_gb if match else None,
            "source": "kvplan gpus --local",
        }
        out.append({
            "index": i,
            "name": name,
            "compute_capability": capability,
            "cuda_total_bytes": total,
            "mem_get_info_total_bytes": info_total,
            "free_bytes": free,
            "nvml_bytes": nv["nvml_bytes"] if nv else None,
            "nvml_source": nv["source"] if nv else None,
            "match": match.name if match else None,
            "match_cuda_total_bytes": match.cuda_total_bytes if match else None,
            "match_estimated": match.cuda_total_estimated if match else None,
            "catalog_entry": entry,
        })
    return out
