"""Names in a narrow terminal's table: wrapped at their own separators, never cut.

rich wraps text at spaces only and cuts what does not fit with an ellipsis, so a column
headed ``onnx-reference`` on an 80-column terminal reads ``onnx-refe…``. ``Name`` renders an
engine, package or mode name whole where there is room and otherwise breaks it after a
``-``, ``_``, ``/`` or ``.``; only a part wider than its column folds, and nothing is dropped.
"""
from __future__ import annotations

import re

from rich.cells import cell_len
from rich.measure import Measurement
from rich.text import Text

_PART = re.compile(r"[^-_/.]+[-_/.]*|[-_/.]+")


class Name:
    """A cell or header holding one name (a rich renderable)."""

    def __init__(self, text: str, style: str = ""):
        self.text, self.style = text, style
        self.parts = _PART.findall(text) or [text]

    def __rich_measure__(self, console, options) -> Measurement:
        return Measurement(max(cell_len(p) for p in self.parts), cell_len(self.text))

    def __rich_console__(self, console, options):
        lines, line = [], ""
        for part in self.parts:
            if line and cell_len(line) + cell_len(part) > options.max_width:
                lines.append(line)
                line = ""
            line += part
        lines.append(line)
        yield Text("\n".join(lines), style=self.style, overflow="fold")

    def __str__(self) -> str:
        return self.text


__all__ = ["Name"]
