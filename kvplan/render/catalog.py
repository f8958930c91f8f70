"""The listings for people: `kvplan models`, `kvplan gpus` and `kvplan gpus --local`."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.markup import escape as esc
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kvplan.render.cells import bytes_cell, label_grid
from kvplan.units import fmt_bytes, fmt_int


def models_view(rows: list[tuple[str, str, str]], title: str | None = None) -> Table:
    t = Table(title=title or "bundled catalog (model_configs/)", title_justify="left")
    t.add_column("alias")
    t.add_column("Hub id")
    t.add_column("note", style="dim")
    for alias, repo, note in rows:
        t.add_row(esc(alias), esc(repo), esc(note))
    return t


def gpus_view(rows: list[dict[str, Any]]) -> Table:
    t = Table(title="GPU catalog", title_justify="left")
    for col, just in (("name", "left"), ("aliases", "left"), ("nvidia-smi total", "right"), ("CUDA total", "right"),
                      ("bandwidth", "right")):
        t.add_column(col, justify=just)
    for r in rows:
        cuda = fmt_bytes(r["cuda_total_bytes"]) + (" (est.)" if r.get("estimated") else "")
        nvml = fmt_bytes(r["nvml_bytes"]) if r.get("nvml_bytes") else "-"
        bw = f"{r['bandwidth_gbps']:,} GB/s" if r.get("bandwidth_gbps") else "-"
        t.add_row(esc(r["name"]), esc(", ".join(r.get("aliases") or [])), nvml, cuda, bw)
    return t


def local_gpus_view(devices: list[dict[str, Any]]) -> Group:
    """`kvplan gpus --local`: each device and its catalog entry (JSON, ready for kvplan/data/gpus.json's list)."""
    import json

    parts: list[Any] = []
    for d in devices:
        t = label_grid()
        t.add_row("device", f"cuda:{d['index']}  {d['name']}  [dim](compute {d['compute_capability']})[/dim]")
        t.add_row("CUDA total", bytes_cell(d["cuda_total_bytes"]) + "  [dim](torch total_memory)[/dim]")
        t.add_row("cudaMemGetInfo", f"total {bytes_cell(d['mem_get_info_total_bytes'])}, free {bytes_cell(d['free_bytes'])}")
        t.add_row("NVML total", bytes_cell(d["nvml_bytes"]) + (f"  [dim]({d['nvml_source']})[/dim]" if d["nvml_source"] else
                                                               "  [dim](no pynvml, no nvidia-smi)[/dim]"))
        if d["match"]:
            diff = d["cuda_total_bytes"] - d["match_cuda_total_bytes"]
            t.add_row("catalog entry", f"{d['match']}  [dim](catalog CUDA total {fmt_int(d['match_cuda_total_bytes'])} B"
                                       f"{' estimated' if d['match_estimated'] else ''}, local {diff:+,} B)[/dim]")
        else:
            t.add_row("catalog entry", "[yellow]none matches[/yellow]: add the entry below to kvplan/data/gpus.json")
        parts.append(Panel(t, title=Text(f"local GPU {d['index']}"), title_align="left"))
        parts.append(Text(json.dumps(d["catalog_entry"], indent=2)))
    return Group(*parts)
