"""Everything that formats for people: rich tables, panels and charts, printed once through one console.
`--json` output bypasses this module entirely (cli.py dumps the result's to_json())."""

from __future__ import annotations

import re
from typing import Any, Iterable

from rich.cells import cell_len
from rich.console import Console, Group
from rich.markup import escape as esc
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from kvplan.units import fmt_bytes, fmt_int

KIND_LABELS = {
    "full": "full",
    "sliding": "sliding",
    "chunked": "chunked",
    "mla": "MLA latent",
    "indexer": "indexer keys",
    "linear_state": "linear state",
    "mamba_state": "Mamba state",
    "conv_state": "short-conv state",
    "lightning_state": "lightning state",
    "cross": "cross",
    "shared": "shared KV",
    "none": "no cache",
}


OFF_TERMINAL_WIDTH = 160  # a pipe or a file: wide enough that tables keep one line per row


class UncutConsole(Console):
    """A console that never cuts a cell: a column is never narrower than its longest number or word (names fold at
    punctuation only when a single word is longer than the whole line), and a table that cannot fit the width that
    way is printed as stacked records, one "header: value" line per cell. Off a terminal the width is
    OFF_TERMINAL_WIDTH unless COLUMNS says otherwise."""

    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        super().print(*(fit_width(o, self) for o in objects), **kwargs)


def console(stderr: bool = False) -> Console:
    import os
    import sys

    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not (hasattr(stream, "isatty") and stream.isatty()) and not os.environ.get("COLUMNS"):
        width = OFF_TERMINAL_WIDTH
    return UncutConsole(stderr=stderr, highlight=False, soft_wrap=False, width=width, emoji=False)


_NUMBER = re.compile(r"^[-+<>=~ ]*[\d.,]+(?:\s?(?:[KMGTP]i?B|B|GB/s|ms|x|%|tokens|requests|GPUs?))?(?:\s\(est\.\))?$")


def _longest_word(text: str) -> int:
    return max((cell_len(w) for w in text.split()), default=0)


def uncut(renderable: Any) -> Any:
    """Walk a renderable (groups, panels, nested tables): every column folds rather than ending in an ellipsis and
    is at least as wide as its longest word; a column of numbers keeps each number whole on one line."""
    if isinstance(renderable, Table):
        for col in renderable.columns:
            col.overflow = "fold"
            cells = [_plain(c) for c in col._cells]
            header = _plain(col.header)
            filled = [c for c in cells if c and c != "-"]
            if filled and all(_NUMBER.match(c) for c in filled):
                col.no_wrap = True
                col.min_width = max(col.min_width or 0, max(cell_len(c) for c in filled), _longest_word(header))
            else:
                col.min_width = max(col.min_width or 0, max([_longest_word(c) for c in cells] + [_longest_word(header)]))
            for c in col._cells:
                uncut(c)
    elif isinstance(renderable, Group):
        for r in renderable.renderables:
            uncut(r)
    elif isinstance(renderable, Panel):
        uncut(renderable.renderable)
    return renderable


def fit_width(renderable: Any, con: Console) -> Any:
    """The renderable made uncuttable; a top-level table (or one inside a group) whose narrowest layout is wider
    than the console becomes stacked records."""
    from rich.measure import Measurement

    uncut(renderable)
    if isinstance(renderable, Table) and renderable.columns and renderable.show_header:
        narrowest = _text_table_minimum(renderable)
        if narrowest is None:  # a cell that is not text: let rich measure it (tens of ms on the whole catalog)
            narrowest = Measurement.get(con, con.options.update(max_width=1 << 16), renderable).minimum
        if narrowest > con.width:
            return stacked(renderable)
        if _text_table_minimum(renderable) is not None:
            _preset_natural_widths(renderable, con.width)
    if isinstance(renderable, Group):
        renderable.renderables[:] = [fit_width(r, con) for r in renderable.renderables]
    return renderable


def _preset_natural_widths(table: Table, width: int) -> None:
    """A text-only table whose widest cells fit the width: give each column that natural width, the layout rich
    picks for it anyway, so rich does not measure every cell again while rendering (a fifth of the catalog table's
    28 ms). tests/test_no_cut.py holds the output equal to rich's own layout."""
    if table.expand:
        return
    natural = []
    for col in table.columns:
        cells = (col.header, *col._cells, *((col.footer,) if table.show_footer else ()))
        natural.append(max(cell_len(line) for c in cells for line in (_plain(c).split("\n") or [""])))
    if table._extra_width + sum(n + table._get_padding_width(i) for i, n in enumerate(natural)) <= width:
        for col, n in zip(table.columns, natural):
            col.width = n


def _text_table_minimum(table: Table) -> int | None:
    """The narrowest width rich can lay out a table whose cells are all text, by rich's own arithmetic
    (Table.__rich_measure__: each column's min_width plus its padding, plus the borders), without rendering
    every cell; None when a cell is something else, or the table has a width or min_width of its own."""
    if table.width is not None or table.min_width is not None:
        return None
    total = table._extra_width
    for i, col in enumerate(table.columns):
        if col.width is not None or col.max_width is not None or not all(isinstance(c, (str, Text)) for c in (col.header, *col._cells)):
            return None
        total += (col.min_width or 0) + table._get_padding_width(i)
    return total


def stacked(table: Table) -> Group:
    """A table as records: the title, then per row one `header: value` line per non-empty cell."""
    parts: list[Any] = []
    if table.title:
        parts.append(Text(_plain(table.title), style="bold"))
    rows = max((len(c._cells) for c in table.columns), default=0)
    for i in range(rows):
        g = Table.grid(padding=(0, 1))
        g.add_column(style="bold", no_wrap=True)
        g.add_column(overflow="fold")
        for col in table.columns:
            cell = col._cells[i] if i < len(col._cells) else ""
            if _plain(cell) in ("",):
                continue
            g.add_row((_plain(col.header) or "-") + ":", cell)
        parts.append(g)
        parts.append(Text(""))
    return Group(*parts)


def _plain(cell: Any) -> str:
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        if "[" not in cell:  # no markup: the string is its own text
            return cell
        try:
            return Text.from_markup(cell, emoji=False).plain
        except Exception:  # noqa: BLE001 - a cell that is not markup is its own text
            return cell
    return ""


def label_grid() -> Table:
    """The two-column "label  value" grid every panel starts with."""
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    return t


def bytes_cell(n: int | None) -> str:
    return "-" if n is None else f"{fmt_int(n)} B ({fmt_bytes(n)})"


def _notes(title: str, lines: Iterable[str], style: str) -> Text | None:
    lines = list(lines)
    if not lines:
        return None
    t = Text()
    t.append(f"{title}\n", style=f"bold {style}")
    for line in lines:
        t.append(f"  • {line}\n", style=style)
    return t


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
    for block in (_notes("warnings", r.warnings, "yellow"), _notes("assumptions", r.assumptions, "dim")):
        if block is not None:
            parts.append(block)
    return Group(*parts)


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


# ---------------------------------------------------------------------------------------------- fit
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
    for what, value in r.budgets[0].parts:
        budget.add_row(what, f"{value:+,} B" if value < 0 else f"{value:,} B")
    budget.add_row("[bold]KV budget[/bold]", f"[bold]{r.budgets[0].kv_bytes:,} B[/bold]")
    parts: list[Any] = [Panel(head, title=Text("kvplan fit"), title_align="left"), budget]
    if r.frontier and r.weights_fit:
        parts.append(frontier_chart(r.frontier))
    basis = (f"likely range: {r.kv_budget_range_basis}",) if r.kv_budget_range_basis else ()
    for block in (_notes("warnings", r.warnings, "yellow"), _notes("assumptions", (*basis, *r.assumptions), "dim")):
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
        parts.append(_notes("not planned", [f"{m}: {e}" for m, e in report.errors], "yellow"))
    return Group(*parts)


# ---------------------------------------------------------------------------------------------- check
def _check_cells(q: Any) -> tuple[str, str, str]:
    """(required, achievable, margin) of one check.Requirement, as people read them."""
    v, a = fmt_int(q.value), fmt_int(q.achievable)
    if q.kind == "ctx":
        return f"ctx {v}", f"model max {a}", f"{q.margin:+,} tokens"
    if q.kind == "min_batch":
        return (f"{v} request{'s' if q.value != 1 else ''} @ ctx {fmt_int(q.at)}", f"{a} requests",
                f"{q.margin:+,} requests")
    if q.kind == "min_ctx":
        return f"ctx {v} @ batch {fmt_int(q.at)}", f"ctx {a}", f"{q.margin:+,} tokens"
    if q.kind == "min_running":
        return f"{v} running at once", f"{a} running", f"{q.margin:+,} requests"
    if q.kind == "max_gpus":
        if not q.passed and q.achievable >= (1 << 40):
            return f"at most {v} GPUs", "target not met", "-"
        return f"at most {v} GPUs", f"{a} GPUs", f"{q.margin:+,} GPUs"
    return f"{v} KV tokens", f"{a} tokens", f"{q.margin:+,} tokens"


def check_view(report: Any) -> Group:
    """`kvplan check` as tables: one per file, a row per deployment (required, achievable, margin, verdict with the
    reason), then the warnings and a summary line."""
    parts: list[Any] = []
    warnings: list[str] = []
    for f in report.files:
        if not f.valid:
            n = len(f.problems)
            parts.append(Text(f"{f.path}: invalid, {n} problem{'s' if n != 1 else ''} (listed on stderr); "
                              "nothing checked", style="bold red"))
            continue
        t = Table(title=esc(f.path), title_justify="left", show_lines=True)
        for col, just in (("deployment", "left"), ("required", "right"), ("achievable", "right"), ("margin", "right"),
                          ("result", "left")):
            t.add_column(col, justify=just)
        for r in f.results:
            cells = [_check_cells(q) for q in r.requirements]
            verdict = "[green]PASS[/green]" if r.passed else f"[red]FAIL[/red]: {esc(r.reason)}"
            if r.warnings:
                verdict += " [yellow](warning)[/yellow]"
                warnings.extend(f"{r.name}: {w}" for w in r.warnings)
            where = f"{r.figures['model']['requested']} on {r.deployment.get('gpu')}, {r.engine}"
            if r.tp * r.pp > 1:
                where += f", tp {r.tp} x pp {r.pp}"
            t.add_row(f"{esc(r.name)}\n[dim]{esc(where)}[/dim]", "\n".join(c[0] for c in cells), "\n".join(c[1] for c in cells),
                      "\n".join(c[2] for c in cells), verdict)
        parts.append(t)
    block = _notes("warnings", warnings, "yellow")
    if block is not None:
        parts.append(block)
    results = report.results
    failed = sum(not r.passed for r in results)
    invalid = sum(not f.valid for f in report.files)
    summary = f"{len(results) - failed} passed, {failed} failed"
    if invalid:
        summary += f", {invalid} invalid file{'s' if invalid != 1 else ''}"
    style = "bold green" if report.exit_code == 0 else "bold red"
    parts.append(Text(f"kvplan check: {summary} (exit {report.exit_code})", style=style))
    return Group(*parts)


def print_check(report: Any) -> None:
    """Print check_view; off a terminal (CI logs) at 120 columns at least, so rows do not wrap into towers."""
    con = console()
    if not con.is_terminal and con.width < 120:
        con.width = 120
    con.print(check_view(report))  # (uncut by the console)


def plain_text(renderable: Any, width: int = 140) -> str:
    """A renderable as plain text (no colour, no terminal codes), e.g. for --output FILE."""
    import io

    buf = io.StringIO()
    con = Console(file=buf, width=width, color_system=None, force_terminal=False, highlight=False, soft_wrap=False,
                  emoji=False)
    con.print(fit_width(renderable, con))
    return buf.getvalue()


def check_junit(report: Any) -> str:
    """JUnit XML: one <testsuite name=FILE> per file, one <testcase name=DEPLOYMENT> each, <failure message=REASON>
    for a failing one; an invalid file is one testcase with an <error> listing every problem."""
    import xml.etree.ElementTree as ET

    root = ET.Element("testsuites", name="kvplan check", tests="0", failures="0", errors="0", time="0")
    tests = failures = errors = 0
    for f in report.files:
        suite = ET.SubElement(root, "testsuite", name=f.path, tests="0", failures="0", errors="0", skipped="0",
                              time="0")
        if not f.valid:
            case = ET.SubElement(suite, "testcase", name=f.path, classname="kvplan.check", file=f.path, time="0")
            n = len(f.problems)
            err = ET.SubElement(case, "error", message=f"invalid file: {n} problem{'s' if n != 1 else ''}",
                                type="InvalidFile")
            err.text = "\n".join(str(p) for p in f.problems)
            suite.set("tests", "1")
            suite.set("errors", "1")
            tests, errors = tests + 1, errors + 1
            continue
        n_fail = 0
        for r in f.results:
            case = ET.SubElement(suite, "testcase", name=r.name, classname=f.path, file=f.path, line=str(r.line),
                                 time="0")
            body = [r.detail] + [f"warning: {w}" for w in r.warnings]
            if not r.passed:
                n_fail += 1
                fail = ET.SubElement(case, "failure", message=r.reason, type="CapacityCheckFailed")
                fail.text = "\n".join(body)
            else:
                out = ET.SubElement(case, "system-out")
                out.text = "\n".join(body)
        suite.set("tests", str(len(f.results)))
        suite.set("failures", str(n_fail))
        tests, failures = tests + len(f.results), failures + n_fail
    root.set("tests", str(tests))
    root.set("failures", str(failures))
    root.set("errors", str(errors))
    ET.indent(root)
    xml = ET.tostring(root, encoding="unicode")
    # ElementTree writes control characters as they are, which XML 1.0 forbids (a malformed report)
    xml = re.sub(r"[\x00-\x08\x0b\x0c\x0e-\x1f\ufffe\uffff]", "\ufffd", xml)
    return '<?xml version="1.0" encoding="utf-8"?>\n' + xml + "\n"


def _gh_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _gh_prop(text: str) -> str:
    return _gh_data(text).replace(":", "%3A").replace(",", "%2C")


def check_github(report: Any) -> str:
    """GitHub Actions workflow commands: `::error file=F,line=L::message` per failing deployment (and per problem of
    an invalid file, with col=), `::warning` for a passing deployment with a warning, then a plain summary."""
    lines: list[str] = []
    for p in report.problems:
        loc = f"file={_gh_prop(p.file)}" + (f",line={p.line},col={p.column}" if p.line is not None else "")
        lines.append(f"::error {loc}::{_gh_data(p.message)}")
    for r in report.results:
        loc = f"file={_gh_prop(r.file)},line={r.line}"
        if not r.passed:
            lines.append(f"::error {loc}::{_gh_data(f'{r.name}: {r.reason}')}")
        for w in r.warnings:
            lines.append(f"::warning {loc}::{_gh_data(f'{r.name}: {w}')}")
    for r in report.results:  # names come from the YAML: no newline may start a workflow command of its own
        lines.append(_gh_data(f"{'PASS' if r.passed else 'FAIL'} {r.name} ({r.file}:{r.line}): {r.reason}"))
    failed = sum(not r.passed for r in report.results)
    invalid = sum(not f.valid for f in report.files)
    lines.append(f"kvplan check: {len(report.results) - failed} passed, {failed} failed"
                 + (f", {invalid} invalid file{'s' if invalid != 1 else ''}" if invalid else "")
                 + f" (exit {report.exit_code})")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------- verify
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
    for block in (_notes("warnings", r.warnings, "yellow"), _notes("notes", a.notes, "dim")):
        if block is not None:
            parts.append(block)
    return Group(*parts)


def local_gpus_view(devices: list[dict[str, Any]]) -> Group:
    """`kvplan gpus --local`: each device and its catalog entry (YAML, ready for kvplan/data/gpus.yaml)."""
    import yaml

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
            t.add_row("catalog entry", "[yellow]none matches[/yellow]: add the entry below to kvplan/data/gpus.yaml")
        parts.append(Panel(t, title=Text(f"local GPU {d['index']}"), title_align="left"))
        parts.append(Text(yaml.safe_dump([d["catalog_entry"]], sort_keys=False, width=100).rstrip()))
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


def plan_view(p: Any) -> Group:
    """`kvplan plan`: the pool, the replay, the speed bound by batch and (with --users) the fleet."""
    f, run, pool = p.fit, p.run, p.pool
    s = f.setup
    head = label_grid()
    g = f.gpu
    head.add_row("GPU", f"{g.count} x {g.gpu.name}")
    head.add_row("model", f"{esc(s.ref.id or s.ref.requested)}  [dim]{s.ref.source}[/dim]")
    head.add_row("engine", f"{s.engine.label}   tp {s.tp} x pp {s.pp}   kv {s.kvd.label}")
    head.add_row("workload", esc(p.workload.description) + (f", shared prefix {fmt_int(p.workload.shared_prefix)}" if p.workload.shared_prefix else ""))
    pj = pool.to_json()
    server = "slots" in pj  # llama-server: slots over cells
    if server:
        head.add_row("llama-server", f"{esc(pj['flags'])}: {fmt_int(pj['slots'])} slots of {fmt_int(pj['ctx_per_slot'])} "
                     f"tokens, {fmt_int(pj['ctx_size'])} cells " + ("shared (--kv-unified)" if pj["kv_unified"] else
                                                                     "in per-slot streams")
                     + f" ({bytes_cell(pj['kv_bytes'])} of a {bytes_cell(pool.kv_budget_bytes)} {pool.kv_budget_source} budget)")
    else:
        head.add_row("KV pool / GPU", f"{fmt_int(pool.usable_blocks)} usable blocks x {fmt_int(pj['block_size'])} tokens "
                     f"({bytes_cell(pool.kv_budget_bytes)} {pool.kv_budget_source})")
    if p.mode == "burst":
        head.add_row("replay", f"all {fmt_int(run.requests)} requests at once: {fmt_int(run.steps)} engine steps")
    elif p.mode == "rate":
        head.add_row("replay", f"{fmt_int(run.requests)} requests arriving at {p.rate:g}/s (Poisson): "
                     f"{fmt_int(run.steps)} engine steps")
    else:
        head.add_row("replay", f"{fmt_int(p.users)} users in a closed loop, {fmt_int(run.requests)} requests, "
                     f"steady steps {fmt_int(run.window[0])}-{fmt_int(run.window[1])}")
    head.add_row("running at once", f"median {fmt_int(run.p50_running)}  (p10 {fmt_int(run.p10_running)}, p90 "
                 f"{fmt_int(run.p90_running)}, peak {fmt_int(run.peak_running)})")
    if server:
        a = run.answers or {}
        head.add_row("deferred", f"peak {fmt_int(a.get('peak_deferred', 0))} waiting for a slot")
        head.add_row("answers", f"{fmt_int(a.get('refused_requests', 0))} refused (prompt >= a slot's context), "
                     f"{fmt_int(a.get('cut_requests', 0))} cut at the slot's context, {fmt_int(a.get('failed_requests', 0))} "
                     f"failed ({fmt_int(a.get('kv_exhaustions', 0))} times the unified cache ran out of cells)")
    else:
        head.add_row("preemptions", f"{fmt_int(run.preemptions)} ({fmt_int(run.preempted_requests)} requests)")
    sc = p.static
    if sc:
        head.add_row("paged vs static", f"paged blocks leave {sc['paged_waste']:.1%} of what a request holds unused; a "
                     f"static cache sized for the longest request ({fmt_int(sc['static_reserved_tokens'])} tokens) "
                     f"leaves {sc['static_waste']:.1%} and holds {fmt_int(sc['static_requests_at_once'])} requests at once")
    if p.step_bound:
        head.add_row("decode bound", f"{p.step_bound * 1e3:.2f} ms per step at the median batch: "
                     f"<= {1 / p.step_bound:,.1f} tokens/s per request")
    if p.latency is not None:
        lt = p.latency

        def ms(v: float | None) -> str:
            return "-" if v is None else f"{v * 1e3:,.1f} ms"

        head.add_row("latency (at best)", f"TTFT p50 {ms(lt['ttft_p50_seconds'])}, p90 {ms(lt['ttft_p90_seconds'])}; "
                     f"TPOT p50 {ms(lt['tpot_p50_seconds'])}, p90 {ms(lt['tpot_p90_seconds'])}")
        head.add_row("throughput (at best)", f"{lt['requests_per_s']:,.2f} requests/s, {lt['output_tokens_per_s']:,.0f} "
                     "output tokens/s" + ("" if lt.get("kept_up", True) else
                                          "  [red]queue grows: this instance does not keep up[/red]"))
    if p.prefill_seconds is not None:
        mean_s, max_s = p.prefill_seconds
        head.add_row("prefill bound", f">= {mean_s * 1e3:,.1f} ms for the mean prompt, {max_s * 1e3:,.1f} ms for the "
                     f"longest  [dim]({p.prefill.dtype} {p.prefill.flops / 1e12:g} TFLOPS)[/dim]")
    parts: list[Any] = [Panel(head, title=Text("kvplan plan"), title_align="left")]
    if p.speed_table:
        t = Table(title="decode-step bound by batch (requests at mean prompt + half their output)", title_justify="left")
        for col in ("batch", "weights read", "cache read", "step (ms)", "tok/s per request", "tok/s total"):
            t.add_column(col, justify="right")
        t.add_column("total tok/s (bar)")
        top = max(r.batch / r.step_seconds for r in p.speed_table)
        for r in p.speed_table:
            total = r.batch / r.step_seconds
            bar = "[cyan]" + "█" * max(1, round(24 * total / top)) + "[/cyan]"
            t.add_row(fmt_int(r.batch), fmt_bytes(round(r.weight_read)), fmt_bytes(round(r.cache_read)),
                      f"{r.step_seconds * 1e3:.2f}", f"{r.tokens_per_s_per_request:,.1f}", f"{total:,.0f}", bar)
        parts.append(t)
        if p.crossover_batch:
            parts.append(Text(f"cache reads overtake weight reads from batch {p.crossover_batch:,}", style="dim"))
    fl = p.fleet
    if fl:
        t = label_grid()
        if fl.get("rate") is not None:
            t.add_row("load", f"{fl['rate']:g} requests/s; one instance sustains at most "
                      f"{fl['requests_per_s_per_instance']:,.2f}/s (saturated, step bounds)")
            t.add_row("instances", "-" if fl["instances"] is None else
                      f"{fmt_int(fl['instances'])} x {fl['gpus_per_instance']} GPU = {fmt_int(fl['gpus'])} GPUs (at full load; "
                      "leave headroom for TTFT targets)")
            parts.append(Panel(t, title=Text("fleet"), title_align="left"))
            fl = None
    if fl:
        t.add_row("users", fmt_int(fl["users"]) + (f" at <= {fl['tpot_seconds'] * 1e3:g} ms per output token" if fl["tpot_seconds"] else "")
                  + (f", first token <= {fl['ttft_seconds'] * 1e3:g} ms ({'met by the prefill bound' if fl['ttft_met'] else 'not met'})" if "ttft_seconds" in fl else ""))
        t.add_row("per instance", f"{fmt_int(fl['users_per_instance'])} (memory {fmt_int(fl['users_per_instance_memory'])}"
                  + (f", speed bound {fmt_int(fl['users_per_instance_speed'])}" if fl["users_per_instance_speed"] is not None else "") + ")")
        t.add_row("instances", "cannot serve the target" if fl["instances"] is None else
                  f"{fmt_int(fl['instances'])} x {fl['gpus_per_instance']} GPU = {fmt_int(fl['gpus'])} GPUs")
        parts.append(Panel(t, title=Text("fleet"), title_align="left"))
    for block in (_notes("warnings", p.warnings, "yellow"), _notes("assumptions", p.assumptions, "dim")):
        if block is not None:
            parts.append(block)
    return Group(*parts)


# ---------------------------------------------------------------------------------------------- explain
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
    unread = _notes("lines about the KV cache that kvplan has no rule for", (f"line {i}: {s[:160]}" for i, s in x.unread), "dim")
    notes = _notes("notes", [*f.notes, *c.notes], "yellow")
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
