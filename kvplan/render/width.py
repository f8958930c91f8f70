"""The width machinery every view is printed through: a console that never cuts a cell, and tables that become
stacked records where even their narrowest layout is wider than the terminal.

Why: a cut number or name (an ellipsis, a folded figure) is a wrong answer to copy; people read these tables at
any terminal width, and CI logs read them off a pipe.
"""

from __future__ import annotations

import re
from typing import Any

from rich.cells import cell_len
from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text


OFF_TERMINAL_WIDTH = 160  # a pipe or a file: wide enough that tables keep one line per row


class UncutConsole(Console):
    """A console that never cuts a cell: a column is never narrower than its longest number or word (names fold at
    punctuation only when a single word is longer than the whole line), and a table that cannot fit the width that
    way is printed as stacked records, one "header: value" line per cell. Off a terminal the width is
    OFF_TERMINAL_WIDTH unless COLUMNS says otherwise."""

    def print(self, *objects: Any, **kwargs: Any) -> None:  # type: ignore[override]
        super().print(*(fit_width(o, self) for o in objects), **kwargs)


def console(stderr: bool = False) -> Console:
    import os
    import sys

    stream = sys.stderr if stderr else sys.stdout
    width = None
    if not (hasattr(stream, "isatty") and stream.isatty()) and not os.environ.get("COLUMNS"):
        width = OFF_TERMINAL_WIDTH
    return UncutConsole(stderr=stderr, highlight=False, soft_wrap=False, width=width, emoji=False)


_NUMBER = re.compile(r"^[-+<>=~ ]*[\d.,]+(?:\s?(?:[KMGTP]i?B|B|GB/s|ms|x|%|tokens|requests|GPUs?))?(?:\s\(est\.\))?$")


def _longest_word(text: str) -> int:
    return max((cell_len(w) for w in text.split()), default=0)


def uncut(renderable: Any) -> Any:
    """Walk a renderable (groups, panels, nested tables): every column folds rather than ending in an ellipsis and
    is at least as wide as its longest word; a column of numbers keeps each number whole on one line."""
    if isinstance(renderable, Table):
        for col in renderable.columns:
            col.overflow = "fold"
            cells = [_plain(c) for c in col._cells]
            header = _plain(col.header)
            filled = [c for c in cells if c and c != "-"]
            if filled and all(_NUMBER.match(c) for c in filled):
                col.no_wrap = True
                col.min_width = max(col.min_width or 0, max(cell_len(c) for c in filled), _longest_word(header))
            else:
                col.min_width = max(col.min_width or 0, max([_longest_word(c) for c in cells] + [_longest_word(header)]))
            for c in col._cells:
                uncut(c)
    elif isinstance(renderable, Group):
        for r in renderable.renderables:
            uncut(r)
    elif isinstance(renderable, Panel):
        uncut(renderable.renderable)
    return renderable


def fit_width(renderable: Any, con: Console) -> Any:
    """The renderable made uncuttable; a top-level table (or one inside a group) whose narrowest layout is wider
    than the console becomes stacked records."""
    from rich.measure import Measurement

    uncut(renderable)
    if isinstance(renderable, Table) and renderable.columns and renderable.show_header:
        narrowest = _text_table_minimum(renderable)
        if narrowest is None:  # a cell that is not text: let rich measure it (tens of ms on the whole catalog)
            narrowest = Measurement.get(con, con.options.update(max_width=1 << 16), renderable).minimum
        if narrowest > con.width:
            return stacked(renderable)
        if _text_table_minimum(renderable) is not None:
            _preset_natural_widths(renderable, con.width)
    if isinstance(renderable, Group):
        renderable.renderables[:] = [fit_width(r, con) for r in renderable.renderables]
    return renderable


def _preset_natural_widths(table: Table, width: int) -> None:
    """A text-only table whose widest cells fit the width: give each column that natural width, the layout rich
    picks for it anyway, so rich does not measure every cell again while rendering (a fifth of the catalog table's
    28 ms). tests/test_no_cut.py holds the output equal to rich's own layout."""
    if table.expand:
        return
    natural = []
    for col in table.columns:
        cells = (col.header, *col._cells, *((col.footer,) if table.show_footer else ()))
        natural.append(max(cell_len(line) for c in cells for line in (_plain(c).split("\n") or [""])))
    if table._extra_width + sum(n + table._get_padding_width(i) for i, n in enumerate(natural)) <= width:
        for col, n in zip(table.columns, natural):
            col.width = n


def _text_table_minimum(table: Table) -> int | None:
    """The narrowest width rich can lay out a table whose cells are all text, by rich's own arithmetic
    (Table.__rich_measure__: each column's min_width plus its padding, plus the borders), without rendering
    every cell; None when a cell is something else, or the table has a width or min_width of its own."""
    if table.width is not None or table.min_width is not None:
        return None
    total = table._extra_width
    for i, col in enumerate(table.columns):
        if col.width is not None or col.max_width is not None or not all(isinstance(c, (str, Text)) for c in (col.header, *col._cells)):
            return None
        total += (col.min_width or 0) + table._get_padding_width(i)
    return total


def stacked(table: Table) -> Group:
    """A table as records: the title, then per row one `header: value` line per non-empty cell."""
    parts: list[Any] = []
    if table.title:
        parts.append(Text(_plain(table.title), style="bold"))
    rows = max((len(c._cells) for c in table.columns), default=0)
    for i in range(rows):
        g = Table.grid(padding=(0, 1))
        g.add_column(style="bold", no_wrap=True)
        g.add_column(overflow="fold")
        for col in table.columns:
            cell = col._cells[i] if i < len(col._cells) else ""
            if _plain(cell) in ("",):
                continue
            g.add_row((_plain(col.header) or "-") + ":", cell)
        parts.append(g)
        parts.append(Text(""))
    return Group(*parts)


def _plain(cell: Any) -> str:
    if isinstance(cell, Text):
        return cell.plain
    if isinstance(cell, str):
        if "[" not in cell:  # no markup: the string is its own text
            return cell
        try:
            return Text.from_markup(cell, emoji=False).plain
        except Exception:  # noqa: BLE001 - a cell that is not markup is its own text
            return cell
    return ""


def plain_text(renderable: Any, width: int = 140) -> str:
    """A renderable as plain text (no colour, no terminal codes), e.g. for --output FILE."""
    import io

    buf = io.StringIO()
    con = Console(file=buf, width=width, color_system=None, force_terminal=False, highlight=False, soft_wrap=False,
                  emoji=False)
    con.print(fit_width(renderable, con))
    return buf.getvalue()
