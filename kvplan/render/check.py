"""`kvplan check` reports: the console tables, and the JUnit XML and GitHub Actions annotations CI reads."""

from __future__ import annotations

import re
from typing import Any

from rich.console import Group
from rich.markup import escape as esc
from rich.table import Table
from rich.text import Text

from kvplan.render.cells import note_block
from kvplan.render.width import console
from kvplan.units import fmt_int


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
    block = note_block("warnings", warnings, "yellow")
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
