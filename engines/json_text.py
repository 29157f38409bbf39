"""JSON from files a user hands us, parsed so that every failure is a ``JSONDecodeError``.

``json.loads`` raises ``RecursionError`` on a document nested deeper than the interpreter's
recursion limit (``[[[[...]]]]``), which no caller catches as bad input: a damaged file
then ends in a traceback. ``loads`` turns it into the error every caller already handles.

``json.loads`` also keeps the last of a repeated key and drops the first without a word
(``{"text": "a", "text": "b"}`` is ``{"text": "b"}``); with ``unique_keys`` a repeated key is
a ``RepeatedKey`` naming it, for files where a silent choice would run the wrong thing.
"""
from __future__ import annotations

import json
from typing import Any


class RepeatedKey(ValueError):
    """An object holds ``key`` twice (``loads(..., unique_keys=True)``)."""

    def __init__(self, key: str):
        super().__init__(f"the key {key!r} is repeated in one object (JSON would keep only "
                         f"the last)")
        self.key = key


def _unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise RepeatedKey(key)
        seen[key] = value
    return seen


def loads(text: str | bytes, unique_keys: bool = False) -> Any:
    """``json.loads``, except that nesting too deep to parse is a ``JSONDecodeError`` and,
    with ``unique_keys``, a repeated key in an object is a ``RepeatedKey``."""
    try:
        return json.loads(text, object_pairs_hook=_unique if unique_keys else None)
    except RecursionError:
        doc = text if isinstance(text, str) else text.decode("utf-8", "replace")
        raise json.JSONDecodeError("nested too deeply to parse (a damaged or hostile file)",
                                   doc, 0) from None
