"""A few metadata values of a GGUF file, read without the gguf package's full parse.

``gguf.GGUFReader`` parses every key/value pair when it opens a file, a Python loop over each
element of every array: for a 262k-token vocabulary that is tens of seconds before the first
value can be looked at. Whether the converter can read a file at all (its
``general.architecture``, which llama.cpp writes first) and how large its rotary tables
would be (its head width) are known from the first few pairs, so they are read here by
walking the pairs (the format's own layout: GGUF v2/v3, little-endian) up to the last one
wanted. Anything this walk cannot follow ends it quietly: the full reader then opens the
file and says what is wrong with it. ``field_value`` reads one value of a file the full
reader has parsed (the GGUF reader and the tokenizer builder both read through it).
"""
from __future__ import annotations

import mmap
import struct
from pathlib import Path
from typing import Any

MAGIC = b"GGUF"
STRING, ARRAY = 8, 9  # value types of the format
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
           11: "<q", 12: "<d"}


class _End(Exception):
    """The walk cannot go on (a truncated or unfamiliar header)."""


class _Cursor:
    def __init__(self, data):
        self.data, self.pos = data, 0

    def take(self, fmt: str):
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.data):
            raise _End
        (value,) = struct.unpack_from(fmt, self.data, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.data):
            raise _End
        raw = bytes(self.data[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", "replace")

    def value(self, kind: int):
        if kind == STRING:
            return self.string()
        if kind in SCALARS:
            return self.take(SCALARS[kind])
        if kind != ARRAY:
            raise _End
        item, count = self.take("<I"), self.take("<Q")
        if item == STRING:
            for _ in range(count):
                n = self.take("<Q")  # (taken before pos is read: take moves it)
                self.pos += n
        elif item in SCALARS:
            self.pos += count * struct.calcsize(SCALARS[item])
        else:
            raise _End
        return None  # arrays are skipped, not read


def read_metadata(path: str | Path, wanted: set[str]) -> dict[str, Any]:
    """The scalar and string values of the ``wanted`` keys that the walk reaches."""
    found: dict[str, Any] = {}
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            cursor = _Cursor(data)
            if bytes(data[:4]) != MAGIC:
                return found
            cursor.pos = 4
            if cursor.take("<I") not in (2, 3):
                return found
            cursor.take("<Q")  # tensor count
            for _ in range(cursor.take("<Q")):
                key = cursor.string()
                value = cursor.value(cursor.take("<I"))
                if key in wanted:
                    found[key] = value
                    if len(found) == len(wanted):
                        break
    except (_End, OSError, ValueError):  # ValueError: mmap of an empty file
        pass
    return found


def field_value(reader, key: str, default=None):
    """The value of ``key`` in a parsed ``gguf.GGUFReader``, or ``default`` when absent."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()
