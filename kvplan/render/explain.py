"""`kvplan explain` for people: what the log states, then one row per number it printed and kvplan's figure."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.markup import escape as esc
from rich.table import Table
from rich.text import Text

from kvplan.render.cells import bytes_cell, label_grid, note_block


_VERDICT_STYLE = {"reproduced": "green", "differs": "red", "estimated": "yellow", "not reproduced": "dim"}


def explain_view(x: Any) -> Group:
    """`kvplan explain`: what the log states, then one row per number it printed."""
    from kvplan.explain.common import FIGURES

    c, f = x.context, x.facts
    head = label_grid()
    head.add_row("engine", esc(c.engine) + (f"   tp {f.tp} x pp {f.pp}" if f.tp * f.pp > 1 else ""))
    head.add_row("model", f"{esc(c.model or '-')}  [dim]{esc(c.model_why)}[/dim]")
    head.add_row("GPU", f"{esc(c.gpu.gpu.name) if c.gpu_known else '-'}  [dim]{esc(c.gpu_why)}[/dim]")
    settings = [f"{k} {getattr(f, k, None) if k in ('tp', 'pp', 'kv_dtype', 'k_dtype', 'v_dtype', 'weight_dtype', 'ctx') else f.knobs.get(k)}"
                for k in f.stated if k not in ("model", "version", "gpu_name", "gpu_total", "tp", "pp")]
    if settings:
        head.add_row("settings read", esc(", ".join(settings)))
    head.add_row("same as", f"[dim]{esc(c.command())}[/dim]")
    t = Table(title="what the log printed, and kvplan's figure", title_justify="left")
    for col, just in (("line", "right"), ("figure", "left"), ("log", "right"), ("kvplan", "right"), ("verdict", "left"),
                      ("how / why", "left")):
        t.add_column(col, justify=just)
    for fd in x.findings:
        p = fd.printed
        what = FIGURES.get(p.what, p.what.replace("_", " ")) if p else "-"
        if p and p.at:
            what += f" at {p.at:,}"
        if p and p.worker:
            what += f" ({p.worker})"
        err = f" {fd.error:+.1%}" if fd.error is not None else ""
        verdict = f"[{_VERDICT_STYLE[fd.verdict]}]{fd.verdict}{err}[/{_VERDICT_STYLE[fd.verdict]}]"
        t.add_row(str(p.line) if p else "-", esc(what), esc(p.shown) if p else "-", esc(fd.kvplan or "-"), verdict,
                  esc(fd.why))
    counts = ", ".join(f"{x.count(v)} {v}" for v in ("reproduced", "differs", "estimated", "not reproduced") if x.count(v))
    parts: list[Any] = [head, t, Text(f"{counts or 'no KV-related number found'}", style="bold")]
    unread = note_block("lines about the KV cache that kvplan has no rule for", (f"line {i}: {s[:160]}" for i, s in x.unread), "dim")
    notes = note_block("notes", [*f.notes, *c.notes], "yellow")
    parts += [n for n in (unread, notes) if n is not None]
    if x.saved:
        e = x.saved["entry"]
        shown = " / ".join(bytes_cell(b) for b in e["non_kv_bytes"])
        what = f"non-KV memory {shown}"
        if e.get("free_at_start_bytes"):  # SGLang: the free memory it budgets from, and what the load took
            what = (f"free memory {' / '.join(bytes_cell(b) for b in e['free_at_start_bytes'])} before the weights "
                    f"load, {shown} taken by it")
        parts.append(Text(f"calibration {'replaced' if x.saved['replaced'] else 'saved'} in {x.saved['path']}: "
                          f"{what} per GPU for {e['key']['engine']} {e['key']['rules']} rules, {e['key']['gpu']}, "
                          f"tp {e['key']['tp']} x pp {e['key']['pp']}; later fit / check / plan runs with the same "
                          "model shape use it", style="green"))
    return Group(*parts)
