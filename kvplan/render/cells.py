"""The small pieces the views share: the labels of the cache kinds, the label/value grid every panel starts with,
byte cells, and the bulleted note blocks (warnings, assumptions)."""

from __future__ import annotations

from typing import Iterable

from rich.table import Table
from rich.text import Text

from kvplan.units import fmt_bytes, fmt_int


# The JSON kinds sliding_latent, compressed_latent and compressor_state have no label yet and show as their raw
# name (as before the split); the labels are to move onto the cache classes.
KIND_LABELS = {
    "full": "full",
    "sliding": "sliding",
    "chunked": "chunked",
    "mla": "MLA latent",
    "indexer": "indexer keys",
    "linear_state": "linear state",
    "mamba_state": "Mamba state",
    "conv_state": "short-conv state",
    "lightning_state": "lightning state",
    "cross": "cross",
    "shared": "shared KV",
    "none": "no cache",
}


def label_grid() -> Table:
    """The two-column "label  value" grid every panel starts with."""
    t = Table.grid(padding=(0, 2))
    t.add_column(style="bold")
    t.add_column()
    return t


def bytes_cell(n: int | None) -> str:
    return "-" if n is None else f"{fmt_int(n)} B ({fmt_bytes(n)})"


def note_block(title: str, lines: Iterable[str], style: str) -> Text | None:
    lines = list(lines)
    if not lines:
        return None
    t = Text()
    t.append(f"{title}\n", style=f"bold {style}")
    for line in lines:
        t.append(f"  • {line}\n", style=style)
    return t
