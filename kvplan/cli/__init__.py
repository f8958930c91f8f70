"""The `kvplan` command line: thin typer commands that parse, call the library and render.

app.py holds the app, the help layout and main() (the error boundary: one line on stderr and the CONTRACTS.md exit
code); options.py the shared options and the engine knob options generated from the engine listings; one module
per command registers it on the app. Importing them here, in this order, is what orders `kvplan --help`.
"""

from kvplan.cli.app import INTERNAL_ERROR_EXIT, app, main
from kvplan.cli import size, fit, plan, explain, check, catalog, verify  # noqa: E402,F401  (register the commands)

__all__ = ["INTERNAL_ERROR_EXIT", "app", "main"]
