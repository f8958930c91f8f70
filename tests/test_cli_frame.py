"""The frame around every command (CONTRACTS.md exit codes): Ctrl-C, a closed or full output, an error nobody
foresaw, -h and --version. Each failure is one line on stderr and a stated exit code, never a traceback."""

from __future__ import annotations

import errno
import io
import os
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout

import pytest

from kvplan import cli, sizing
from conftest import run_cli


class _Broken(io.StringIO):
    """An output whose reader is gone (BrokenPipeError) or whose disk is full (ENOSPC)."""

    def __init__(self, error: OSError) -> None:
        super().__init__()
        self.error = error

    def write(self, text: str) -> int:
        raise self.error


def _run_into(stream: io.StringIO, *args: str) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stdout(stream), redirect_stderr(err):
        try:
            cli.main(list(args))
        except SystemExit as e:
            return int(e.code or 0), err.getvalue()
    raise AssertionError("main() must always exit")


def test_ctrl_c_is_130_with_one_line(monkeypatch):
    def interrupted(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(sizing, "size", interrupted)
    r = run_cli("size", "llama-2-7b", "--ctx", "4096")
    assert r.code == 130
    assert r.err == "kvplan: error: interrupted\n"


def test_an_unforeseen_error_is_one_line_and_exit_3(monkeypatch):
    def broken(*a, **k):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(sizing, "size", broken)
    monkeypatch.delenv("KVPLAN_DEBUG", raising=False)
    r = run_cli("size", "llama-2-7b", "--ctx", "4096")
    assert r.code == cli.INTERNAL_ERROR_EXIT == 3
    assert r.err.count("\n") == 1 and "Traceback" not in r.err
    assert "internal error: ZeroDivisionError: division by zero" in r.err and "KVPLAN_DEBUG=1" in r.err


def test_kvplan_debug_shows_the_traceback(monkeypatch):
    def broken(*a, **k):
        raise ZeroDivisionError("division by zero")

    monkeypatch.setattr(sizing, "size", broken)
    monkeypatch.setenv("KVPLAN_DEBUG", "1")
    with pytest.raises(ZeroDivisionError):
        cli.main(["size", "llama-2-7b", "--ctx", "4096"])


@pytest.mark.parametrize("args", [("size", "llama-2-7b", "--ctx", "4096", "--json"),
                                  ("size", "llama-2-7b", "--ctx", "4096"),
                                  ("fit", "--gpu", "24GB")])
def test_a_closed_pipe_ends_quietly_with_0(args):
    code, err = _run_into(_Broken(BrokenPipeError(errno.EPIPE, "Broken pipe")), *args)
    assert (code, err) == (0, "")


def test_a_full_disk_is_one_line_and_exit_2():
    code, err = _run_into(_Broken(OSError(errno.ENOSPC, "No space left on device")), "size", "llama-2-7b")
    assert code == 2
    assert err == "kvplan: error: cannot write the output: No space left on device\n"


def test_a_closed_pipe_in_a_real_process():
    """`kvplan models --json | head -c 1`: the reader leaves after one byte; no traceback, exit 0."""
    p = subprocess.Popen([sys.executable, "-m", "kvplan", "fit", "--gpu", "24GB", "--json"],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stderr is not None
    p.stdout.read(1)
    p.stdout.close()
    err = p.stderr.read().decode()
    assert p.wait(timeout=60) == 0
    assert "Traceback" not in err and "Exception ignored" not in err


@pytest.mark.skipif(not os.path.exists("/dev/full"), reason="needs /dev/full")
@pytest.mark.parametrize("args", [("size", "llama-2-7b", "--json"), ("size", "llama-2-7b")])
def test_a_full_disk_in_a_real_process(args):
    """`kvplan size ... > /dev/full`: one line and exit 2; the interpreter's last flush of the buffered output must
    not add 'Exception ignored ...' and turn the exit code into 120."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # buffered, as a user's shell runs it
    with open("/dev/full", "w") as full:
        p = subprocess.run([sys.executable, "-m", "kvplan", *args], stdout=full, stderr=subprocess.PIPE, timeout=60,
                           env=env)
    err = p.stderr.decode()
    assert p.returncode == 2, err
    assert err.splitlines() == ["kvplan: error: cannot write the output: No space left on device"]


def test_h_is_help_everywhere_and_version_names_the_stack():
    assert run_cli("-h").out.startswith("Usage: kvplan")
    assert run_cli("size", "-h").out.startswith("Usage: kvplan size")
    v = run_cli("--version")
    assert v.code == 0
    assert v.out.startswith("kvplan ") and "Python " in v.out and "typer " in v.out and "huggingface_hub " in v.out


@pytest.mark.parametrize("columns", [60, 80, 120])
def test_the_command_list_shows_every_summary_whole(columns, monkeypatch):
    """click cuts a command's first help sentence to fit its list ("weights and the total,..."); each command
    carries a short summary that the list shows whole, at 60 columns too, and its full help under `CMD -h`."""
    monkeypatch.setenv("COLUMNS", str(columns))
    text = run_cli("-h").out
    listing = text.split("Commands:", 1)[1].split("\n\n", 1)[0]
    rows = [line.split(None, 1) for line in listing.strip().splitlines()]
    names = {row[0] for row in rows}
    assert names == {"size", "fit", "plan", "explain", "check", "models", "pull", "gpus", "verify"}
    assert all(len(row) == 2 and not row[1].endswith("...") for row in rows), listing
    assert max(len(line) for line in text.splitlines()) <= columns


def test_top_level_help_states_the_exit_codes():
    assert "130 interrupted" in " ".join(run_cli("--help").out.split())


def test_the_console_entry_runs_main_without_the_collector_and_freezes_it_after():
    """kvplan.entry.run (the `kvplan` script, `python -m kvplan`): the cyclic collector is off from before kvplan.cli
    is imported, main's exit code passes through, and what is alive at the end is frozen (no full collection at
    exit). Library callers of cli.main keep the collector."""
    code = ("import gc, sys\n"
            "import kvplan.entry as entry\n"
            "assert 'kvplan.cli' not in sys.modules and gc.isenabled()\n"
            "import kvplan.cli as cli\n"
            "def fake():\n"
            "    print('enabled', gc.isenabled())\n"
            "    sys.exit(2)\n"
            "cli.main = fake\n"
            "try:\n    entry.run()\nexcept SystemExit as e:\n    print('exit', e.code, 'frozen', gc.get_freeze_count() > 0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["enabled", "False", "exit", "2", "frozen", "True"], out.stderr
