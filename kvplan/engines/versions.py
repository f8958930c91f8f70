"""Engine versions: a requested version -> the rule set that version follows.

Each engine lists the versions whose rules were read (engines.md); a requested version takes the newest rule
set at or below it, and an older one than any we read takes the oldest with a stated assumption.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Generic, Sequence, TypeVar

from kvplan.errors import InputError

R = TypeVar("R")

@dataclass(frozen=True)
class Selected(Generic[R]):
    """The rule set chosen for `--engine NAME[@VERSION]`, with the version asked for and a note when they differ."""
    name: str
    version: str  # the resolved rule set's version label
    requested: str | None
    rules: R
    note: str | None = None

    @property
    def label(self) -> str:
        return f"{self.name}@{self.version}"

    @property
    def asked(self) -> str:
        """The version the user named, else the rule set's own: what refusals and notes quote."""
        return self.requested or self.version


def version_key(text: str) -> tuple[int, ...]:
    """'0.10.1.1' -> (0, 10, 1, 1); 'b5331' -> (5331,); '5.14' -> (5, 14)."""
    t = text.strip().lower().lstrip("v")
    if t.startswith("b") and t[1:].isdigit():
        return (int(t[1:]),)
    parts = re.findall(r"\d+", t.split("+")[0].split("rc")[0].split(".dev")[0])
    if not parts:
        raise ValueError(text)
    return tuple(int(p) for p in parts)


def select(name: str, requested: str | None, table: Sequence[tuple[str, R]]) -> Selected[R]:
    """Pick the rule set for `requested` from `table` (ascending (version label, rules))."""
    if requested is None:
        label, rules = table[-1]
        return Selected(name, label, None, rules)
    try:
        want = version_key(requested)
    except ValueError:
        known = ", ".join(label for label, _ in table)
        raise InputError(f"{name}@{requested}: not a version; rule sets known for {name}: {known}") from None
    chosen = None
    for label, rules in table:
        if version_key(label) <= want:
            chosen = (label, rules)
    if chosen is None:
        label, rules = table[0]
        return Selected(name, label, requested, rules,
                        f"{name}@{requested} is older than any version whose rules were read; using {name}@{label} rules")
    newest = version_key(chosen[0])
    if chosen[0] == table[-1][0] and want[:len(newest)] > newest:  # 1.0.0 / 0.32.1 are in the 1.0 / 0.32 series
        return Selected(name, chosen[0], requested, chosen[1],
                        f"{name}@{requested} is newer than any version whose rules were read; using {name}@{chosen[0]} "
                        "rules (the newest), which may not match it")
    return Selected(name, chosen[0], requested, chosen[1])
