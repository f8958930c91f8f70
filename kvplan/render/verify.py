"""`kvplan verify` for people: predicted against measured allocations (and --fit, --with-model), and
`verify --run`'s engine figures beside kvplan's."""

from __future__ import annotations

from typing import Any

from rich.console import Group
from rich.markup import escape as esc
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kvplan.render.cells import KIND_LABELS, bytes_cell, label_grid, note_block
from kvplan.units import fmt_bytes, fmt_int


def _pass(ok: bool) -> str:
    return "[green]pass[/green]" if ok else "[bold red]FAIL[/bold red]"


def verify_view(r: Any) -> Group:
    """The result of `kvplan verify` (kvplan.verify.core.VerifyResult)."""
    s, p, a, d = r.setup, r.plan, r.alloc, r.device
    head = label_grid()
    ref = s.ref
    head.add_row("model", f"{esc(ref.id or ref.requested)}  [dim]{ref.source}[/dim]")
    head.add_row("engine", p.engine + (f"   tp {s.tp} x pp {s.pp} (one GPU's share)" if s.tp > 1 or s.pp > 1 else ""))
    head.add_row("request", f"batch {fmt_int(r.batch)} x ctx {fmt_int(r.ctx)} tokens")
    head.add_row("KV dtype", f"{s.kvd.label} [dim]({s.kvd.source})[/dim]")
    head.add_row("device", f"{d.device}  {d.name}" + (f"  [dim]total {fmt_bytes(d.total_bytes)}[/dim]" if d.total_bytes else "")
                 + f"  [dim]torch {d.torch_version}[/dim]")

    cuda = a.device != "cpu"
    groups = Table(title="allocation: predicted vs measured by layer group", title_justify="left")
    cols = [("kind", "left"), ("layers", "right"), ("tensors", "right"), ("predicted", "right")]
    cols += [("expected", "right")] if cuda else []
    for col, just in cols + [("measured", "right"), ("", "left")]:
        groups.add_column(col, justify=just)
    for g in a.groups:
        cells = [KIND_LABELS.get(g.kind, g.kind), str(g.layers), fmt_int(g.tensors), fmt_int(g.predicted_bytes)]
        if cuda:
            cells.append(fmt_int(g.expected_bytes))
        cells += [fmt_int(g.measured_bytes), _pass(g.passed)]
        groups.add_row(*cells)

    totals = Table.grid(padding=(0, 2))
    totals.add_column(style="bold")
    totals.add_column(justify="right")
    totals.add_row("predicted (plan)", bytes_cell(a.predicted_bytes))
    if cuda:
        totals.add_row("expected allocated", bytes_cell(a.expected_bytes) + "  [dim](after the allocator's rounding)[/dim]")
        totals.add_row("memory_allocated +", bytes_cell(a.measured_bytes))
        totals.add_row("memory_reserved +", bytes_cell(a.measured_reserved_bytes)
                       + (f"  [dim](model from an empty cache {fmt_int(a.expected_reserved_bytes)} B)[/dim]"
                          if a.expected_reserved_bytes is not None else ""))
        totals.add_row("mem_get_info used +", bytes_cell(a.measured_device_bytes))
    else:
        totals.add_row("storage bytes", bytes_cell(a.measured_bytes))
    if r.rss is not None:
        x = r.rss
        totals.add_row("RSS growth", (esc(x.error) if x.error else bytes_cell(x.measured_bytes))
                       + f"  [dim]({fmt_int(x.tensors)} tensors >= 1 MiB, {fmt_int(x.expected_bytes)} B touched, "
                         f"tolerance {fmt_int(x.tolerance_bytes)} B)[/dim]")
    parts: list[Any] = [Panel(head, title=Text("kvplan verify"), title_align="left"), groups, totals]

    if r.fit is not None:
        f = r.fit
        unit = "batch" if f.mode == "batch" else "ctx"
        ft = Table.grid(padding=(0, 2))
        ft.add_column(style="bold")
        ft.add_column(justify="right")
        ft.add_row("weights (charged)", bytes_cell(f.weight_bytes))
        ft.add_row("KV budget", bytes_cell(f.kv_budget_bytes) + f"  [dim]({f.source})[/dim]")
        if f.fraction is not None:
            ft.add_row("memory fraction", f"{f.fraction:.6f}  [dim](restored to {f.restored_fraction})[/dim]")
        ft.add_row(f"predicted max {unit}", fmt_int(f.predicted)
                   + (f"  [dim](plan under the budget {fmt_int(f.plan_predicted)})[/dim]"
                      if f.planner_predicted is not None else ""))
        ft.add_row(f"measured max {unit}", fmt_int(f.measured) + f"  [dim]({len(f.trials)} allocations)[/dim]")
        ft.add_row("difference", f"{f.difference:+,}  {_pass(f.passed)}")
        if f.allocator_rounding_bytes is not None:
            ft.add_row("allocator rounding", bytes_cell(f.allocator_rounding_bytes) + "  [dim](segments minus plan)[/dim]")
        if f.os_overhead_bytes is not None:
            ft.add_row("address-space overhead", bytes_cell(f.os_overhead_bytes) + "  [dim](pages per tensor)[/dim]")
        parts += [Text("--fit", style="bold"), ft]

    if r.model is not None:
        m = r.model
        mt = Table(title=f"--with-model: transformers {m.transformers_version} cache vs {m.engine}", title_justify="left")
        for col, just in (("run", "left"), ("class", "left"), ("kind", "left"), ("predicted", "right"),
                          ("measured", "right"), ("", "left")):
            mt.add_column(col, justify=just)
        for run in m.runs:
            label = run.device + (" (scaled)" if run.config_scaled else "")
            if run.status != "ran":
                mt.add_row(label, run.model_class, "-", "-", "-", f"[yellow]skipped[/yellow]: {esc(run.reason)}")
                continue
            for g in run.groups:
                mt.add_row(label, run.model_class, KIND_LABELS.get(g.kind, g.kind), fmt_int(g.predicted_bytes),
                           fmt_int(g.measured_bytes), _pass(g.passed))
            if run.unassigned_bytes or run.extra_bytes:
                mt.add_row(label, run.model_class, "outside the plan's groups", "0",
                           fmt_int(run.unassigned_bytes + run.extra_bytes), _pass(False))
        parts.append(mt)

    verdict = Text()
    for c in r.checks:
        verdict.append(f"{'PASS' if c.passed else 'FAIL'} ", style="green" if c.passed else "bold red")
        verdict.append(f"{c.name}: {c.detail}\n")
    parts.append(verdict)
    for block in (note_block("warnings", r.warnings, "yellow"), note_block("notes", a.notes, "dim")):
        if block is not None:
            parts.append(block)
    return Group(*parts)


def engine_run_view(r: Any) -> Group:
    """`kvplan verify --run ENGINE` (kvplan.verify.engine_run.EngineRunResult): the engine's figures beside kvplan's."""
    head = label_grid()
    ref = r.model
    head.add_row("model", f"{esc(ref.id or ref.requested)}  [dim]{ref.source}[/dim]")
    head.add_row("engine", f"{r.engine} on {r.device}, started in {r.seconds:.1f} s  [dim](kvplan rules {r.kvplan_engine})[/dim]")
    s = r.settings
    if "budget_bytes" in s:  # vLLM: what it was handed and resolved
        head.add_row("settings", f"KV budget {fmt_int(s.get('budget_bytes'))} B, max_model_len "
                                 f"{fmt_int(s.get('max_model_len'))}, block {s.get('block_size')}, max_num_batched_tokens "
                                 f"{fmt_int(s.get('max_num_batched_tokens'))}")
    else:
        head.add_row("settings", ", ".join(f"{k} {v}" for k, v in s.items() if v is not None))
    t = Table(title="the engine's start-up figures vs kvplan", title_justify="left")
    for col, just in (("", "left"), ("engine", "right"), ("kvplan", "right"), ("", "left")):
        t.add_column(col, justify=just, no_wrap=True)
    for row in r.rows:
        fmt = (lambda v: fmt_int(v) if isinstance(v, int) else str(v))
        verdict = _pass(row.equal) if row.judged else ("[dim]same[/dim]" if row.equal else "[dim]differs[/dim]")
        t.add_row(row.what, fmt(row.engine), fmt(row.kvplan), verdict)
    line = Text(("PASS" if r.passed else "FAIL") + f" {r.engine} vs kvplan {r.kvplan_engine}",
                style="bold green" if r.passed else "bold red")
    parts: list[Any] = [Panel(head, title=Text("kvplan verify --run"), title_align="left"), t, line]
    if r.notes:
        parts.append(Text("notes", style="bold"))
        parts.extend(Text(f"  • {n}") for n in r.notes)
    return Group(*parts)
