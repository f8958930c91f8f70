"""The `kvplan` application: the typer app and its help layout, --version, and main(), the one error boundary.

Every library error becomes ONE line on stderr and an exit code here (CONTRACTS.md): 0 success, 1 a check that ran
and failed, 2 bad input or environment, 3 internal error, 130 interrupted. The commands live one per module beside
this one and register themselves on `app` when kvplan.cli is imported.
"""

from __future__ import annotations

import copy
import os
import sys
from typing import Annotated, Any

import typer

try:  # typer >= 0.26 vendors click
    from typer._click import exceptions as click_exc
except ImportError:  # pragma: no cover - older typer on real click
    from click import exceptions as click_exc

from kvplan.cli.options import KNOBS_PANEL
from kvplan.errors import EnvironmentProblem, KvplanError


class GroupedCommand(typer.core.TyperCommand):
    """Plain (never cut) click help, with the options grouped under their panel names: Options, Workload, Engine and
    layout, the engine knobs, Budget, Output, Model."""

    def format_options(self, ctx: Any, formatter: Any) -> None:
        args, groups = [], {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is None:
                continue
            if param.param_type_name == "argument":
                args.append(record)
            else:
                groups.setdefault(getattr(param, "rich_help_panel", None) or "Options", []).append(record)
        if args:
            with formatter.section("Arguments"):
                formatter.write_dl(args)
        order = ["Options", "Workload (plan)", "Engine and layout", KNOBS_PANEL, "Budget", "Output", "Model"]
        for name in sorted(groups, key=lambda g: order.index(g) if g in order else len(order)):
            with formatter.section(name):
                formatter.write_dl(groups[name])


app = typer.Typer(
    name="kvplan",
    help="Exact KV-cache and weight memory for LLM inference, and what fits on a GPU.",
    add_completion=True,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
    epilog="Exit codes: 0 success, 1 a check that ran and failed, 2 bad input or environment, 3 internal error, "
           "130 interrupted.",
)


def _version_line() -> str:
    """kvplan's version and what a bug report needs beside it (torch only when installed; never imported here)."""
    from importlib import metadata
    import platform

    from kvplan import __version__

    parts = [f"kvplan {__version__}", f"Python {platform.python_version()}"]
    for dist in ("typer", "rich", "huggingface_hub", "torch", "transformers"):
        try:
            parts.append(f"{dist} {metadata.version(dist)}")
        except metadata.PackageNotFoundError:
            if dist in ("typer", "rich", "huggingface_hub"):
                parts.append(f"{dist} (not installed)")
    return ", ".join(parts)


def _show_version(value: bool) -> None:
    if value:
        sys.stdout.write(_version_line() + "\n")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", help="print the versions of kvplan and what it runs on, then exit",
                                          callback=_show_version, is_eager=True)] = False,
) -> None:
    """Exact KV-cache and weight memory for LLM inference, and what fits on a GPU."""


# ---------------------------------------------------------------------------------------------- entry point
INTERNAL_ERROR_EXIT = 3  # CONTRACTS.md: not 1 (a check result) nor 2 (bad input)


def main(argv: list[str] | None = None) -> None:
    """Run the CLI; one line on stderr and the contract's exit code for every failure (CONTRACTS.md)."""
    command = _click_command(sys.argv[1:] if argv is None else argv)
    stdout = sys.stdout
    sys.stdout = _ClosedPipeGuard(stdout)  # type: ignore[assignment]
    try:
        code = command.main(args=argv, prog_name="kvplan", standalone_mode=False)
        sys.stdout.flush()
        if code == 130:  # typer turns Ctrl-C into Exit(130) and returns it when not standalone
            _fail("interrupted", 130)
        if isinstance(code, int) and code:
            sys.exit(code)
    except KvplanError as e:
        _fail(str(e), e.exit_code)
    except click_exc.NoArgsIsHelpError as e:
        sys.stdout.write(e.ctx.get_help() + "\n" if e.ctx is not None else "")
        sys.exit(0)
    except click_exc.UsageError as e:
        hint = f" (see `kvplan {e.ctx.info_name} --help`)" if e.ctx is not None and e.ctx.info_name != "kvplan" else " (see `kvplan --help`)"
        _fail(e.format_message().replace("\n", " ") + hint, 2)
    except (typer.Exit, getattr(click_exc, "Exit", typer.Exit)) as e:
        sys.exit(getattr(e, "exit_code", 0))
    except (KeyboardInterrupt, getattr(click_exc, "Abort", KeyboardInterrupt)):
        _fail("interrupted", 130)
    except BrokenPipeError:
        _quiet_closed_pipe()
    except SystemExit:
        raise
    except Exception as e:  # the last resort: one line, never a traceback unless asked for
        if os.environ.get("KVPLAN_DEBUG"):
            raise
        _fail(f"internal error: {type(e).__name__}: {' '.join(str(e).split())[:300]}; set KVPLAN_DEBUG=1 for the "
              "traceback", INTERNAL_ERROR_EXIT)
    finally:
        sys.stdout = stdout
    sys.exit(0)


def _click_command(args: list[str]) -> Any:
    """The click group for this run. typer turns every command's signature into click parameters (about 40 ms for
    the eight); a run that names its command first gets a group holding that command alone, so only its own
    parameters are built. Help, completion and errors see the same command either way."""
    if args and not args[0].startswith("-"):
        for info in app.registered_commands:
            if (info.name or typer.main.get_command_name(info.callback.__name__)) == args[0]:
                one = copy.copy(app)  # the same settings and callback; a list of its own
                one.registered_commands = [info]
                return typer.main.get_command(one)
    return typer.main.get_command(app)


# ---------------------------------------------------------------------------------------------- stdout plumbing
class _ClosedPipeGuard:
    """stdout whose reader may go away (`kvplan ... | head`): a write or flush into a closed pipe ends the run
    quietly with 0 instead of a traceback (typer would turn it into exit 1)."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            _quiet_closed_pipe()
            return 0
        except OSError as e:
            raise _unwritable(e) from None

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            _quiet_closed_pipe()
        except OSError as e:
            raise _unwritable(e) from None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _stdout_to_devnull() -> None:
    """Point stdout's descriptor at /dev/null, so the interpreter's last flush of what is still buffered succeeds
    (else Python prints 'Exception ignored ...' and exits 120)."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass


def _quiet_closed_pipe() -> None:
    """The reader went away (`| head`, `| true`): stop quietly, and keep Python from complaining at exit."""
    _stdout_to_devnull()
    sys.exit(0)


def _unwritable(e: OSError) -> EnvironmentProblem:
    """stdout refuses the bytes (a full disk, /dev/full): one line and exit 2, and nothing more at exit."""
    _stdout_to_devnull()
    return EnvironmentProblem(f"cannot write the output: {e.strerror or e}")


def _fail(message: str, code: int) -> None:
    try:
        sys.stderr.write(f"kvplan: error: {message}\n")
        sys.stderr.flush()
    except (BrokenPipeError, OSError, ValueError):
        pass
    sys.exit(code)
