"""JSON from files a user hands us, parsed so that every failure is a ``JSONDecodeError``.

``json.loads`` raises ``RecursionError`` on a document nested deeper than the interpreter's
recursion limit (``[[[[...]]]]``), which no caller catches as bad input: a damaged file
then ends in a traceback. ``loads`` turns it into the error every caller already handles.
"""
from __future__ import annotations

import json
from typing import Any


def loads(text: str | bytes) -> Any:
    """``json.loads``, except that nesting too deep to parse is a ``JSONDecodeError``."""
    try:
        return json.loads(text)
    except RecursionError:
        doc = text if isinstance(text, str) else text.decode("utf-8", "replace")
        raise json.JSONDecodeError("nested too deeply to parse (a damaged or hostile file)",
                                   doc, 0) from None
