"""Tables printed whole: no header, engine or package name cut.

rich fits a table to the console by shortening its widest columns, whatever they hold, and
a word longer than its column ends in an ellipsis: nine engines in 120 columns printed
``onnx-refe…``. ``print_table`` gives every column, as its minimum, the width of its longest
word (all of a cell where the column does not wrap; the header alone where it folds long
words onto the next line, which loses nothing); rich then lays the table out at the
console's width, or at the sum of those minimums where that is wider (rich alone would
squeeze a folding column to nothing there), and nothing is cropped (a terminal wraps the
lines; a log keeps them whole).
"""
from __future__ import annotations

from rich.console import Console
from rich.measure import Measurement
from rich.padding import Padding
from rich.table import Table

UNBOUNDED = 1 << 14  # columns: room for any word to measure at its full length


def print_table(console: Console, table: Table) -> None:
    wide = console.options.update_width(UNBOUNDED)
    for column in table.columns:
        column.min_width = max([column.min_width or 0, *(_least(console, wide, column, cell)
                                                         for cell in (column.header,
                                                                      *column.cells))])
    # laid out at the console's width, or at the sum of those minimums where that is wider:
    # rich would otherwise squeeze a folding column to nothing (a print cannot be wider than
    # its console)
    width = console.width
    console.width = max(width, least_width(table))
    try:
        console.print(table, crop=False)
    finally:
        console.width = width


def least_width(table: Table) -> int:
    """The table's width with every column at its ``min_width``: each column's padding, the
    edges and the lines between columns included."""
    _, right, _, left = Padding.unpack(table.padding)
    lines = (2 if table.show_edge else 0) + len(table.columns) - 1 if table.box else 0
    return sum((c.min_width or 0) + left + right for c in table.columns) + lines


def _least(console: Console, options, column, cell) -> int:
    """The narrowest a cell can be without losing a character: its longest word where the
    column wraps, all of it where it does not, its header alone where the column folds."""
    if column.overflow == "fold":
        return Measurement.get(console, options, cell).maximum if cell is column.header else 1
    measured = Measurement.get(console, options, cell)
    return measured.maximum if column.no_wrap else measured.minimum
