"""Typed errors. The library raises these; the CLI turns them into one line and an exit code."""

from __future__ import annotations


class KvplanError(Exception):
    """Base class: `str(err)` is the one line shown to the user."""

    exit_code = 2


class InputError(KvplanError):
    """Bad input from the user (a flag, a size, a name): exit 2."""


class ConfigError(InputError):
    """A model config that cannot be read or lacks the fields needed: exit 2."""


class ModelNotFoundError(InputError):
    """A model reference that resolves to nothing: exit 2."""


class EnvironmentProblem(KvplanError):
    """A missing dependency or device: exit 2."""


class CheckFailed(KvplanError):
    """A check that ran and failed (verify mismatch, failing deployment): exit 1."""

    exit_code = 1
