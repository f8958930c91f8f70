"""A one-line spinner on stderr while kvplan waits (the Hub, an allocation, a bisection, an engine run, a replay),
shown only when stderr is a terminal: pipes, files and CI logs get nothing, so outputs stay byte-for-byte the same."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import Iterator


def on_terminal() -> bool:
    stream = sys.stderr
    return bool(getattr(stream, "isatty", None) and stream.isatty())


@contextmanager
def waiting(message: str) -> Iterator[None]:
    if not on_terminal():
        yield
        return
    from rich.console import Console

    with Console(stderr=True).status(message, spinner="dots"):
        yield
