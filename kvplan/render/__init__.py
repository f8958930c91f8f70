"""Everything that formats for people: rich tables, panels and charts, printed once through one console.
`--json` output bypasses this package entirely (the commands in kvplan/cli dump the result's to_json()).

width.py holds the console that never cuts a cell; cells.py the pieces the views share; one module per command
holds its view. What callers use is re-exported here, so `render.size_view(...)`, `render.console()` read as
before.
"""

from kvplan.render.cells import KIND_LABELS, bytes_cell, label_grid, note_block
from kvplan.render.width import OFF_TERMINAL_WIDTH, UncutConsole, console, fit_width, plain_text, stacked, uncut
from kvplan.render.size import size_view
from kvplan.render.fit import fit_catalog_view, fit_one_view, frontier_chart
from kvplan.render.check import check_github, check_junit, check_view, print_check
from kvplan.render.verify import engine_run_view, verify_view
from kvplan.render.plan import plan_view
from kvplan.render.explain import explain_view
from kvplan.render.catalog import gpus_view, local_gpus_view, models_view

__all__ = [
    "KIND_LABELS", "OFF_TERMINAL_WIDTH", "UncutConsole", "bytes_cell", "check_github", "check_junit", "check_view",
    "console", "engine_run_view", "explain_view", "fit_catalog_view", "fit_one_view", "fit_width", "frontier_chart",
    "gpus_view", "label_grid", "local_gpus_view", "models_view", "note_block", "plain_text", "plan_view",
    "print_check", "size_view", "stacked", "uncut", "verify_view",
]
