"""`kvplan check`: CI capacity checks from kvplan.yaml files, reported as a table, JSON, JUnit or GitHub
annotations (exit 0 all pass, 1 any fails, 2 a file is invalid)."""

from __future__ import annotations

import json
import os
import sys
from typing import Annotated, Optional

import typer

from kvplan.cli.app import GroupedCommand, app
from kvplan.cli.options import Calibrations, NoCalibration, Offline, Timeout, calibrations as load_calibrations


@app.command(cls=GroupedCommand, short_help="CI capacity checks from YAML (exit 0/1/2).",
             help="CI capacity checks: deployments in YAML must fit (exit 0 all pass, 1 any fails, 2 a file is invalid).\n\n"
              "Examples: kvplan check kvplan.yaml;  kvplan check a.yaml b.yaml --format junit --output kvplan.xml")
def check(
    files: Annotated[list[str], typer.Argument(metavar="FILE...", help="kvplan.yaml files (defaults + deployments; README: CI capacity checks)")],
    fmt: Annotated[str, typer.Option("--format", "-f", metavar="FORMAT", help="table (default), json, junit, github (::error annotations)", rich_help_panel="Output")] = "table",
    output: Annotated[Optional[str], typer.Option("--output", "-o", metavar="FILE", help="write the --format report to FILE (the console still gets the table)", rich_help_panel="Output")] = None,
    only: Annotated[Optional[list[str]], typer.Option("--only", metavar="NAME", help="check only the deployment NAME (repeatable)", rich_help_panel="Output")] = None,
    offline: Offline = False,
    timeout: Timeout = None,
    calibrations: Calibrations = None, no_calibration: NoCalibration = False,
    json_out: Annotated[bool, typer.Option("--json", help="the same as --format json", rich_help_panel="Output")] = False,
) -> None:
    from kvplan import check as checks, render
    from kvplan.errors import InputError
    from kvplan.progress import waiting

    if timeout is not None or os.environ.get("KVPLAN_HUB_TIMEOUT"):  # checked now, as every command does
        from kvplan import hub as hub_mod

        hub_mod.resolve_timeout(timeout)

    fmt = "json" if json_out else fmt.strip().lower()
    if fmt not in checks.FORMATS:
        raise InputError(f"--format {fmt!r} is not known; accepted: {', '.join(checks.FORMATS)}")
    with waiting("checking deployments"):
        report = checks.run(files, only=only, offline=offline, timeout=timeout,
                            calibrations=load_calibrations(calibrations, no_calibration))
    if fmt == "json":
        text = json.dumps(report.to_json(), indent=2) + "\n"
    elif fmt == "junit":
        text = render.check_junit(report)
    elif fmt == "github":
        text = render.check_github(report)
    else:
        text = None
    if output:
        try:
            with open(output, "w", encoding="utf-8") as fh:
                fh.write(text if text is not None else render.plain_text(render.check_view(report)))
        except OSError as e:
            raise InputError(f"--output {output}: cannot write: {e.strerror or e}") from None
    if text is None or output:
        render.print_check(report)
    else:
        sys.stdout.write(text)
        sys.stdout.flush()
    for problem in report.problems:  # every problem as FILE:LINE:COLUMN: message, then the one summary line
        sys.stderr.write(f"{problem}\n")
    if report.exit_code:
        raise checks.outcome_error(report)
