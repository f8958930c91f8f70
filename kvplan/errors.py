"""Typed errors. The library raises these; the CLI turns them into one line and an exit code."""

from __future__ import annotations


class KvplanError(Exception):
    """Base class: `str(err)` is the one line shown to the user."""

    exit_code = 2


def flag(field: str) -> str:
    """An input's name as the command line spells it (tp -> --tp, weight_dtype -> --weight-dtype)."""
    return "--" + field.replace("_", "-")


class InputError(KvplanError):
    """Bad input from the user (a flag, a size, a name): exit 2.

    `fields` names the inputs the message is about, written in it as {field}: `str(err)` spells them as the command
    line does (--tp); another front end spells them its way (check: its YAML keys, `err.spelled(str)`)."""

    def __init__(self, message: str, *, fields: tuple[str, ...] = ()):
        self.template, self.fields = message, fields
        super().__init__(self.spelled(flag) if fields else message)

    def spelled(self, spell) -> str:
        return self.template.format(**{f: spell(f) for f in self.fields}) if self.fields else str(self)


class ConfigError(InputError):
    """A model config that cannot be read or lacks the fields needed: exit 2."""


class ModelNotFoundError(InputError):
    """A model reference that resolves to nothing: exit 2."""


class EnvironmentProblem(KvplanError):
    """A missing dependency or device: exit 2."""


class CheckFailed(KvplanError):
    """A check that ran and failed (verify mismatch, failing deployment): exit 1."""

    exit_code = 1


def shown(value: object, limit: int = 60) -> str:
    """A value echoed in a message: its repr on one line (newlines escaped), cut to `limit` characters; an integer
    too long to print (over Python's digit limit) by its size."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 200:
        return f"an integer of {value.bit_length()} bits"
    text = repr(value)
    if len(text) <= limit:
        return text
    length = f" ({len(value):,} characters)" if isinstance(value, str) else ""
    return text[: limit - 3] + "..." + length
