"""The CLI's terminal output: a rich console fitted to the terminal, lines wrapped at its
width, and tables laid out for it (:class:`Grid`, :func:`fit`, :func:`print_grid`).

rich is imported by what prints (a table command), never at import: ``--json``, ``logs`` and
the one-line commands do without it.
"""

from __future__ import annotations

import dataclasses
import os
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.console import Console


PIPED_WIDTH = 160
"""The width of what is printed to no terminal (a pipe, a file) when ``COLUMNS`` is not set:
rows stay on one line where they can."""


def console() -> Console:
    """A rich console on stdout: the terminal's width (or ``COLUMNS``), else
    :data:`PIPED_WIDTH`; no highlighting. Imports rich (only the table commands do)."""
    from rich.console import Console

    out = Console(highlight=False)
    if not out.is_terminal and "COLUMNS" not in os.environ:
        out.width = PIPED_WIDTH  # no terminal to fit, keep rows on one line when possible
        _piped.add(out)
    return out


_piped: weakref.WeakSet[Console] = weakref.WeakSet()


def piped(out: Console) -> bool:
    """Whether :func:`console` made ``out`` for no terminal and no given width (``COLUMNS``):
    notes are then printed on one line each, for grep."""
    return out in _piped


def print_line(out: Console, text: str, *, style: str = "") -> None:
    """``text`` as typed (no markup), wrapped at spaces to the console's width (on one line
    when :func:`piped`)."""
    from rich.text import Text

    out.print(Text(text, style=style), soft_wrap=piped(out))


# -- tables that fit ---------------------------------------------------------------------------
#
# A table is laid out for the console's width before rich draws it: each column's width is
# its widest cell (its header may wrap at its spaces). While the table is wider than the
# console, the table's steps apply in order: first a column whose every cell is "-" is left
# out, then a column's cells get shorter (a time without its seconds, then as an age), or a
# column is left out (the line after the table names those). Then the columns left out come
# back, the last left out first, each that fits beside those shown (a column of "-" only
# last, and only once every other one is back). A column marked ``keep``
# (an id, a job name, the column a listing is filtered on) is never left out.
# An id and a job name are never shortened nor cut: their columns are kept, on one line each.
# Free text (an error, a key, a cron schedule) wraps at its spaces within its column.

BORDER = 3
"""What each column adds to a table's width: a border and a space either side."""

SHORT_ID = 8
"""How many characters of an id are shown in the last resort (the kept columns alone are
wider than the console); ``show`` and ``--json`` give it whole."""


@dataclasses.dataclass
class Column:
    """One column of a :class:`Grid`.

    - ``levels``: the cells, longest first; a ``shrink`` step moves to the next list.
    - ``keep``: never left out nor shortened (an id, a job name): one line per cell.
    - ``wraps``: free text, wrapped at its spaces (a word longer than the column is folded),
      ``min_width`` wide at least, given what room is left.
    """

    header: str
    levels: list[list[str]]
    keep: bool = False
    wraps: bool = False
    min_width: int = 12
    level: int = 0
    legend: str = ""
    """Said under the table once the column's cells are shorter than its first ones."""
    short_header: str = ""
    """One word said instead of ``header`` when the column is too narrow for ``header`` on
    one line (``short_legend`` says what it stands for, under the table)."""
    short_legend: str = ""

    @property
    def cells(self) -> list[str]:
        return self.levels[self.level]

    def natural(self) -> int:
        """The widest cell (a cell's lines), or the header's longest word."""
        words = max((len(w) for w in self.header.split()), default=0)
        lines = [len(line) for cell in self.cells for line in cell.splitlines() or [""]]
        return max([words, *lines])

    def narrowest(self) -> int:
        return min(self.natural(), self.min_width) if self.wraps else self.natural()


Step = tuple[str, str]
"""``("shrink", header)``: that column's next, shorter cells; ``("drop", header)``: leave
that column out."""


@dataclasses.dataclass
class Grid:
    """A table before it is fitted: its title, columns and narrowing steps (in order)."""

    title: str
    columns: list[Column]
    steps: list[Step]
    notes: list[str] = dataclasses.field(default_factory=list)

    def width(self, columns: list[Column] | None = None) -> int:
        cols = self.columns if columns is None else columns
        return sum(c.narrowest() for c in cols) + BORDER * len(cols) + 1


@dataclasses.dataclass
class Fitted:
    """A :class:`Grid` laid out for ``width`` columns: each column with its width, what was
    left out, whether ids were shortened."""

    grid: Grid
    widths: list[int]
    dropped: list[str]
    shortened: bool
    width: int
    headers: list[str] = dataclasses.field(default_factory=list)
    """Each column's header as printed (its ``short_header`` when ``header`` would wrap)."""


def fit(grid: Grid, width: int) -> Fitted:
    """Lay ``grid`` out for a console ``width`` characters wide (see above)."""
    order = list(grid.columns)
    columns = {c.header: c for c in order}
    dropped: list[str] = []
    empty: list[Step] = [("drop", c.header) for c in order  # nothing to show: first to go
                         if not c.keep and c.cells and all(x == "-" for x in c.cells)]
    for kind, header in empty + grid.steps:
        if grid.width() <= width:
            break
        column = columns.get(header)
        if column is None or not any(c is column for c in grid.columns):
            continue
        if kind == "shrink" and column.level + 1 < len(column.levels):
            column.level += 1
        elif kind == "drop" and not column.keep:
            grid.columns.remove(column)
            dropped.append(header)
    blank = {h for _, h in empty}  # back last: a column of "-" only shows nothing
    again = [h for h in reversed(dropped) if h not in blank] + \
        [h for h in reversed(dropped) if h in blank]
    for header in again:  # one left out early may fit beside the rest now
        if header in blank and any(h not in blank for h in dropped):
            break  # "-" only, while a column with something to show is still left out
        back = [c for c in order if c in grid.columns or c.header == header]
        if grid.width(back) <= width:
            grid.columns[:] = back
            dropped.remove(header)
    shortened = False
    if grid.width() > width:
        for column in grid.columns:  # the last resort: ids shortened, said under the table
            if column.header == "id":
                column.levels.append([c[:SHORT_ID] + "\u2026" if len(c) > SHORT_ID + 1 else c
                                      for c in column.cells])
                column.level = len(column.levels) - 1
                shortened = True
    if grid.width() > width:
        for column in grid.columns:  # still too wide: a long name folds, never cut
            if column.keep and column.header != "id":
                column.wraps, column.min_width = True, 10
    widths = [c.narrowest() for c in grid.columns]
    room = width - grid.width()
    for i, column in enumerate(grid.columns):  # what is left: headers on one line first,
        if room > 0 and len(column.header) > widths[i]:
            more = min(room, len(column.header) - widths[i])
            widths[i] += more
            room -= more
    for i, column in enumerate(grid.columns):  # then the wrapping columns' text
        if column.wraps and room > 0:
            more = min(room, column.natural() - widths[i])
            widths[i] += more
            room -= more
    headers = [c.short_header if len(c.header) > w and c.short_header
               and len(c.short_header) <= w else c.header
               for c, w in zip(grid.columns, widths, strict=True)]
    return Fitted(grid, widths, dropped, shortened, width, headers)


def _header(text: str, width: int) -> str:
    """``text`` wrapped at its spaces into lines of at most ``width``."""
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return "\n".join(lines)


def print_grid(grid: Grid, out: Console | None = None) -> None:
    """Print ``grid``'s title, the table fitted to the console's width, the line naming
    what was left out to fit, then the grid's notes."""
    from rich.table import Table
    from rich.text import Text

    out = out if out is not None else console()
    fitted = fit(grid, out.width)
    if grid.title:
        print_line(out, grid.title)
    table = Table()
    for column, width, header in zip(grid.columns, fitted.widths, fitted.headers,
                                     strict=True):
        table.add_column(_header(header, width), width=width, min_width=width,
                         max_width=width, no_wrap=not column.wraps,
                         overflow="fold" if column.wraps else "ellipsis")
    for row in zip(*(c.cells for c in grid.columns), strict=True):
        table.add_row(*(Text(cell) for cell in row))
    out.print(table)
    if fitted.dropped:
        print_line(out, f"left out to fit {fitted.width} columns: {', '.join(fitted.dropped)} "
                        f"(a wider terminal, or --json, shows them)")
    for column, header in zip(grid.columns, fitted.headers, strict=True):
        if column.level and column.legend:
            print_line(out, column.legend)
        if header != column.header and column.short_legend:
            print_line(out, column.short_legend)
    if fitted.shortened:
        print_line(out, f"ids shortened to fit {fitted.width} columns: --json, or a wider "
                        f"terminal, shows them whole")
    for note in grid.notes:
        print_line(out, note)
