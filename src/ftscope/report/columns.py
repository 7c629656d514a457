"""Tables that fit the terminal: columns kept by priority for the width at hand, and no cell ever cut.

A FitTable holds its rows as plain values (what `--csv` writes) and its columns as formats. Rich renders it at
the console's width; when the whole table is wider, text columns wrap at spaces, headers wrap and then take
their short form, and last the lowest-priority columns are left out (a line under the table names them). A number
never wraps and is never shortened. A console as wide as the table (`--wide`) shows every column.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Mapping, Sequence

from rich.console import Console, ConsoleOptions
from rich.table import Table
from rich.text import Text

FOLD_AT = 16
"""A word longer than this (a URL, a path, a long case id) may break across lines in a wrapping column; shorter
words never do, nor does a number of any length."""
NUMBER = re.compile(r"[-+~$(]*[\d.,]*\d[\d.,]*[%)x]?|[-+$]?\d[\d.,]*[a-zA-Z]{0,3}")
"""A word that is a number (with its sign, currency, unit letters or percent): never broken."""
BORDER = 3
"""Characters each column adds to a boxed rich table: a space of padding on each side and one rule."""


@dataclass(frozen=True)
class Col:
    """One column: where its value comes from, how it is shown, how readily it gives way."""

    header: str
    key: str = ""
    """The row's key whose value the cell shows."""
    cell: Callable[[Mapping[str, Any]], str] | None = None
    """The cell's text (rich markup allowed) from the whole row; default: str(row[key]), '-' for None."""
    justify: str = "right"
    priority: int = 0
    """0: always shown; when the table is too wide the highest number is left out first."""
    wrap: bool = False
    """Text that may wrap at spaces (a label, a reason); a column that does not wrap keeps every cell on one line."""
    short: str = ""
    """A shorter header for narrow widths (the full one is used when it fits)."""
    style: str | None = None
    optional: bool = False
    """Left out when no row has text in it (a notes column with nothing to say)."""

    def text(self, row: Mapping[str, Any]) -> str:
        if self.cell is not None:
            return self.cell(row)
        value = row.get(self.key)
        return "-" if value is None else str(value)


@dataclass(frozen=True)
class Layout:
    """Which columns a width keeps, at what widths, under which headers, and which it left out."""

    columns: list[int]
    widths: list[int]
    headers: list[str]
    dropped: list[int] = field(default_factory=list)


def _length(markup: str) -> int:
    return max((Text.from_markup(line).cell_len for line in markup.split("\n")), default=0)


def _longest_word(markup: str, fold: bool = False) -> int:
    """The longest word; with fold, words past FOLD_AT count as FOLD_AT unless they are numbers."""
    return max((len(w) if not fold or len(w) <= FOLD_AT or NUMBER.fullmatch(w) else FOLD_AT
                for w in Text.from_markup(markup).plain.split()), default=0)


def _natural(header: str, cells: Sequence[str]) -> int:
    return max([_length(header), *map(_length, cells)])


def _minimum(col: Col, header: str, cells: Sequence[str], fold: bool = True) -> int:
    """The narrowest the column can be with nothing cut: the header may wrap at spaces; a wrapping column's text
    too (with fold, a word past FOLD_AT may break); any other cell keeps its full length."""
    if col.wrap:
        text = max([_longest_word(c, fold=fold) for c in cells], default=1)
    else:
        text = max(map(_length, cells), default=1)
    return max(_longest_word(header), text, 1)


def _squeeze(natural: list[int], minimum: list[int], room: int) -> list[int] | None:
    """Widths within room: each column gives up a share of the excess in proportion to its slack (what it can
    lose before a word breaks), never going below its minimum."""
    if sum(minimum) > room:
        return None
    excess = sum(natural) - room
    if excess <= 0:
        return list(natural)
    slack = [n - m for n, m in zip(natural, minimum)]
    widths = [n - excess * s // sum(slack) for n, s in zip(natural, slack)]
    for i in sorted(range(len(widths)), key=lambda j: -(widths[j] - minimum[j])):  # the rounding's remainder
        if sum(widths) <= room:
            break
        widths[i] -= min(sum(widths) - room, widths[i] - minimum[i])
    return widths


def _fold(widths: list[int], minimum: list[int], room: int) -> list[int] | None:
    """Widths within room when long words must break: the widest column gives way first, so that the fewest
    words break (a URL in one column rather than every id in every column)."""
    if sum(minimum) > room:
        return None
    widths = list(widths)
    while sum(widths) > room:
        i = max(range(len(widths)), key=lambda j: (widths[j] - minimum[j], widths[j]))
        widths[i] -= 1
    return widths


def fit(cols: Sequence[Col], cells: Sequence[Sequence[str]], width: int) -> Layout:
    """The columns and widths of the widest table that fits `width`: full headers, then short ones, then the
    lowest-priority column left out, and again (cells[i] are column i's texts)."""
    keep = list(range(len(cols)))
    dropped: list[int] = []
    while True:
        for short in (False, True):
            headers = [(cols[i].short if short and cols[i].short else cols[i].header) for i in keep]
            natural = [_natural(h, cells[i]) for h, i in zip(headers, keep)]
            room = width - BORDER * len(keep) - 1
            whole = [_minimum(cols[i], h, cells[i], fold=False) for h, i in zip(headers, keep)]
            minimum = [_minimum(cols[i], h, cells[i]) for h, i in zip(headers, keep)]
            # wrapping at spaces first; breaking a long word (a URL, an id) only when that is not enough
            widths = _squeeze(natural, whole, room) or _fold(
                [max(n, w) for n, w in zip(whole, minimum)], minimum, room)
            if widths is not None:
                return Layout(keep, widths, headers, dropped)
        droppable = [i for i in keep if cols[i].priority > 0]
        if not droppable:  # narrower than the essentials: rich squeezes what is left
            return Layout(keep, minimum, headers, dropped)  # wider than the width: see __rich_console__
        worst = max(droppable, key=lambda i: (cols[i].priority, i))
        keep.remove(worst)
        dropped.append(worst)


class FitTable:
    """A rich renderable table that fits the console it is printed on (see the module's docstring)."""

    def __init__(self, title: str, cols: Sequence[Col], rows: Sequence[Mapping[str, Any]]) -> None:
        self.title = title
        self.rows = list(rows)
        cells = [[c.text(r) for r in self.rows] for c in cols]
        shown = [i for i, c in enumerate(cols) if not (c.optional and not any(cells[i]))]
        self.cols = [cols[i] for i in shown]
        self.cells = [cells[i] for i in shown]

    def layout(self, width: int) -> Layout:
        return fit(self.cols, self.cells, width)

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Any]:
        lay = self.layout(options.max_width)
        table = Table(title=self.title or None, title_justify="left")
        for i, w, header in zip(lay.columns, lay.widths, lay.headers):
            c = self.cols[i]
            table.add_column(header, justify=c.justify, style=c.style, width=w, overflow="fold")  # type: ignore[arg-type]
        for r in range(len(self.rows)):
            table.add_row(*[self.cells[i][r] for i in lay.columns])
        needed = sum(lay.widths) + BORDER * len(lay.widths) + 1
        # narrower than the essentials: wider lines (the terminal wraps them) rather than cut cells
        yield from console.render(table, options.update(width=max(needed, options.max_width)))
        if lay.dropped:
            names = ", ".join(self.cols[i].header for i in lay.dropped)
            yield Text(f"not shown at {options.max_width} columns: {names} (--wide shows every column)", style="dim")


def plain_columns(columns: Sequence[str]) -> list[Col]:
    """Columns of formatted text that all wrap; on a narrow terminal the rightmost give way first."""
    return [Col(name, key=str(i), justify="left", wrap=True, priority=i) for i, name in enumerate(columns)]


class Breakdown:
    """Named values (a breakdown by category) side by side, one header each, when they fit the width; else one
    per line, so that no header or value is ever cut."""

    def __init__(self, title: str, values: Mapping[str, str], names: tuple[str, str]) -> None:
        self.title = title
        self.values = dict(values)
        self.names = names
        """The headers of the one-per-line form: (what, unit)."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> Iterator[Any]:
        across = sum(max(_length(k), _length(v)) for k, v in self.values.items()) + BORDER * len(self.values) + 1
        if across <= options.max_width:
            table = Table(title=self.title or None, title_justify="left")
            for k in self.values:
                table.add_column(k, justify="right")
            table.add_row(*self.values.values())
            yield table
            return
        yield FitTable(self.title, [Col(self.names[0], "k", justify="left", wrap=True), Col(self.names[1], "v")],
                       [{"k": k, "v": v} for k, v in self.values.items()])
