"""`kvplan fit` for people: one model on a GPU (budget, limits, the batch x context frontier), or the catalog's
table."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.markup import escape as esc
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kvplan.render.cells import bytes_cell, label_grid, note_block
from kvplan.units import fmt_bytes, fmt_int


def _yes(ok: bool) -> str:
    return "[green]yes[/green]" if ok else "[red]no[/red]"


def _concurrency_words(c: Any, ctx: int) -> str:
    """vLLM's "Maximum concurrency" is for requests of its max_model_len, not of the row's ctx: say which."""
    if c.concurrency is None:
        return ""
    mml = c.details.get("max_model_len")
    basis = f" at max_model_len {fmt_int(mml)}" if mml and mml != ctx else ""
    return f"   concurrency {c.concurrency:.2f}x{basis}"


def fit_one_view(report: Any) -> Group:
    r = report.results[0]
    s, c = r.setup, r.capacity
    head = label_grid()
    g = report.gpu
    est = " (estimated)" if g.gpu.cuda_total_estimated else ""
    head.add_row("GPU", f"{g.count} x {g.gpu.name}, CUDA total {fmt_bytes(g.total_bytes)}{est} each")
    head.add_row("model", f"{esc(s.ref.id or s.ref.requested)}  [dim]{s.ref.source}[/dim]")
    head.add_row("engine", f"{report.engine}   tp {report.tp} x pp {report.pp}" + (f"   ({r.replicas} replicas)" if r.replicas > 1 else ""))
    if not r.weights_fit:
        head.add_row("fits", f"[red]no: the weights alone ({fmt_bytes(r.weight_bytes)} per GPU) leave no KV memory on "
                     f"{g.gpu.name}[/red]; more GPUs (NxGPU), a smaller --weight-dtype or a larger GPU would")
    else:
        head.add_row("fits", _yes(r.fits) + "   engine would start: " + _yes(c.engine_would_start)
                     + ("" if c.engine_would_start or not r.fits else
                        "  [dim](requests of this ctx fit; the engine's start-up check at its max_model_len does not: "
                        "see warnings)[/dim]"))
    head.add_row("weights / GPU", bytes_cell(r.weight_bytes) + f"  [dim]{s.weight_format.name}[/dim]")
    head.add_row("KV budget / GPU", bytes_cell(r.kv_budget_bytes) + f"  [dim]{r.kv_budget_source}[/dim]"
                 + (f"   likely {fmt_bytes(r.kv_budget_range[0])} .. {fmt_bytes(r.kv_budget_range[1])}"
                    if r.kv_budget_range else ""))
    head.add_row("KV capacity", f"{fmt_int(c.kv_capacity_tokens)} tokens  [dim](as {report.engine} prints it)[/dim]"
                 + (f"   likely {fmt_int(r.kv_capacity_tokens_range[0])} .. {fmt_int(r.kv_capacity_tokens_range[1])}"
                    if r.kv_capacity_tokens_range else ""))
    head.add_row(f"at ctx {fmt_int(r.ctx)}", f"max batch {fmt_int(r.max_batch)}" + (f"  [dim](engine cap {fmt_int(c.engine_batch_cap)})[/dim]" if c.engine_batch_cap else "")
                 + _concurrency_words(c, r.ctx))
    head.add_row(f"at batch {fmt_int(r.batch)}", f"max ctx {fmt_int(r.max_ctx)}" + (f"  [dim](model max {fmt_int(s.max_ctx)})[/dim]" if s.max_ctx else ""))
    budget = Table(title="KV budget (limiting GPU)", title_justify="left", show_header=False)
    budget.add_column()
    budget.add_column(justify="right")
    for part in r.budgets[0].parts:
        what, value = part.label, part.bytes
        budget.add_row(what, f"{value:+,} B" if value < 0 else f"{value:,} B")
    budget.add_row("[bold]KV budget[/bold]", f"[bold]{r.budgets[0].kv_bytes:,} B[/bold]")
    parts: list[Any] = [Panel(head, title=Text("kvplan fit"), title_align="left"), budget]
    if r.frontier and r.weights_fit:
        parts.append(frontier_chart(r.frontier))
    basis = (f"likely range: {r.kv_budget_range_basis}",) if r.kv_budget_range_basis else ()
    for block in (note_block("warnings", r.warnings, "yellow"), note_block("assumptions", (*basis, *r.assumptions), "dim")):
        if block is not None:
            parts.append(block)
    return Group(*parts)


def frontier_chart(frontier: tuple[tuple[int, int], ...], width: int = 40) -> Table:
    """Max batch per context as horizontal bars (log-scaled so 1 and 1,000 both show)."""
    import math

    t = Table(title="batch x context frontier", title_justify="left")
    t.add_column("ctx", justify="right")
    t.add_column("max batch", justify="right")
    t.add_column("")
    top = max((b for _, b in frontier), default=0)
    scale = math.log2(top + 1) if top else 1
    for ctx, b in frontier:
        n = round(width * math.log2(b + 1) / scale) if b else 0
        t.add_row(fmt_int(ctx), fmt_int(b), "[cyan]" + "█" * n + "[/cyan]" if b else "[red]does not fit[/red]")
    return t


def fit_catalog_view(report: Any) -> Group:
    g = report.gpu
    t = Table(title=f"{g.count} x {g.gpu.name} ({fmt_bytes(g.total_bytes)} CUDA total each), {report.engine}, tp {report.tp} x pp {report.pp}",
              title_justify="left")
    for col, just in (("model", "left"), ("weights/GPU", "right"), ("KV budget", "right"), ("ctx", "right"),
                      ("max batch", "right"), ("max ctx @1", "right"), ("KV tokens", "right"), ("fits", "left")):
        t.add_column(col, justify=just)
    for r in report.results:
        if not r.weights_fit:
            verdict = "[red]no: weights do not fit[/red]"
        elif not r.fits:
            verdict = "[red]no: not one request[/red]"
        else:
            verdict = "[green]yes[/green]" + ("" if r.capacity.engine_would_start else " [yellow](lower max_model_len)[/yellow]")
        t.add_row(esc(r.setup.ref.requested), fmt_bytes(r.weight_bytes), fmt_bytes(max(0, r.kv_budget_bytes)), fmt_int(r.ctx),
                  fmt_int(r.max_batch), fmt_int(r.max_ctx), fmt_int(r.capacity.kv_capacity_tokens), verdict)
    parts: list[Any] = [t]
    if report.errors:
        parts.append(note_block("not planned", [f"{m}: {e}" for m, e in report.errors], "yellow"))
    return Group(*parts)
