"""`kvplan size` for people: the model and request, the KV cache by layer group, weights and totals."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.markup import escape as esc
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kvplan.render.cells import KIND_LABELS, bytes_cell, label_grid, note_block
from kvplan.units import fmt_bytes, fmt_int


def size_view(r: Any) -> Group:
    """The result of `kvplan size` (a SizeResult)."""
    s, p = r.setup, r.plan
    head = label_grid()
    ref = s.ref
    src = ref.source + (f" ({ref.path})" if ref.source in ("file",) and ref.path else "")
    head.add_row("model", f"{esc(ref.id or ref.requested)}  [dim]{esc(src)}{' @ ' + esc(ref.commit[:12]) if ref.commit else ''}[/dim]")
    head.add_row("architecture", f"{esc(s.spec.architecture)} ({s.spec.family})")
    head.add_row("engine", p.engine + (f"   tp {s.tp} x pp {s.pp}" if s.tp > 1 or s.pp > 1 else ""))
    head.add_row("request", f"batch {fmt_int(r.batch)} x ctx {fmt_int(r.ctx)} tokens"
                 + (f"  [dim](model max {fmt_int(s.max_ctx)})[/dim]" if s.max_ctx else ""))
    head.add_row("KV dtype", f"{s.kvd.label} [dim]({s.kvd.source})[/dim]")

    groups = Table(title="KV cache by layer group" + (" (limiting GPU)" if s.tp > 1 or s.pp > 1 else ""),
                   title_justify="left", show_lines=False)
    for col, just in (("kind", "left"), ("layers", "right"), ("heads", "right"), ("dim", "right"),
                      ("window", "right"), ("tokens", "right"), ("dtype", "left"), ("bytes", "right")):
        groups.add_column(col, justify=just, no_wrap=True)
    for g in p.groups:
        dims = "-" if g.head_dim_k is None else (str(g.head_dim_k) if g.head_dim_k == g.head_dim_v or not g.head_dim_v
                                                 else f"{g.head_dim_k}/{g.head_dim_v}")
        groups.add_row(KIND_LABELS.get(g.kind, g.kind), str(len(g.layer_ids)), fmt_int(g.kv_heads) if g.kv_heads else "-",
                       dims, fmt_int(g.window) if g.window else "-", fmt_int(g.tokens) if g.tokens else "-", g.dtype,
                       fmt_bytes(g.bytes))

    totals = Table.grid(padding=(0, 2))
    totals.add_column(style="bold")
    totals.add_column(justify="right")
    split = s.tp > 1 or s.pp > 1
    per = " / GPU" if split else ""  # tp/pp: the limiting GPU's share (CONTRACTS.md), said in the label
    totals.add_row("KV cache" + per, bytes_cell(p.kv_bytes))
    totals.add_row("KV per token" + per, bytes_cell(p.kv_bytes_per_token) + "  [dim](one more token of one sequence)[/dim]")
    params = fmt_int(s.spec.params)
    extra = [f"{k} {fmt_int(s.spec.params_of(k))}" for k in ("vision", "encoder") if s.spec.params_of(k)]
    totals.add_row("parameters" + (" (whole model)" if split else ""),
                   params + (f"  [dim]({', '.join(extra)})[/dim]" if extra else ""))
    totals.add_row("weights" + per, bytes_cell(r.weight_bytes) + f"  [dim]{s.weight_format.name}[/dim]")
    gguf, mmproj = s.resolved.extras.get("gguf"), s.resolved.extras.get("mmproj")
    if gguf is not None:
        from kvplan.sizing import quant_mix_text

        totals.add_row("quant mix", quant_mix_text(gguf))
    if mmproj is not None:
        totals.add_row("mmproj", bytes_cell(mmproj.weight_bytes()) + "  [dim](in weights)[/dim]")
    totals.add_row("total" + per, bytes_cell(r.total_bytes))
    if split:
        totals.add_row("KV, all GPUs", bytes_cell(p.kv_bytes_all_gpus))

    parts: list[Any] = [Panel(head, title=Text("kvplan size"), title_align="left"), groups, totals]
    for block in (note_block("warnings", r.warnings, "yellow"), note_block("assumptions", r.assumptions, "dim")):
        if block is not None:
            parts.append(block)
    return Group(*parts)
