"""A GGUF file's metadata values and tensor table, read without the gguf package's full parse.

``gguf.GGUFReader`` parses every key/value pair when it opens a file, a Python loop over each
element of every array: for a 262k-token vocabulary that is tens of seconds before the first
value can be looked at. Whether the converter can read a file at all (its
``general.architecture``, which llama.cpp writes first) and how large its rotary tables
would be (its head width) are known from the first few pairs, so they are read here by
walking the pairs (the format's own layout: GGUF v2/v3, little-endian) up to the last one
wanted. Anything this walk cannot follow ends it quietly: the full reader then opens the
file and says what is wrong with it. ``tensor_table`` walks every pair and then the tensor
infos: what a numeric scheme is made of (each tensor's type and element count), in
milliseconds where the full parse of SmolLM2's GGUF takes seconds. ``field_value`` reads one
value of a file the full reader has parsed (the GGUF reader and the tokenizer builder both
read through it).
"""
from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engines.package.file_identity import IdentityMemo, identity

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


def _pairs(cursor: _Cursor):
    """(tensor count, each (key, value) pair in the file's order); arrays' values are None."""
    if bytes(cursor.data[:4]) != MAGIC:
        raise _End
    cursor.pos = 4
    if cursor.take("<I") not in (2, 3):
        raise _End
    tensors, count = cursor.take("<Q"), cursor.take("<Q")

    def walk():
        for _ in range(count):
            key = cursor.string()
            yield key, cursor.value(cursor.take("<I"))
    return tensors, walk()


# a key absent from the header makes the walk read every pair (SmolLM2's has no key_length:
# 49,152 vocabulary strings a look); a file unchanged since is not walked again
_WALKED = IdentityMemo(size=16)


def read_metadata(path: str | Path, wanted: set[str]) -> dict[str, Any]:
    """The scalar and string values of the ``wanted`` keys that the walk reaches."""
    try:
        key = (str(path), identity(os.stat(path)), frozenset(wanted))
    except OSError:
        return {}
    return dict(_WALKED.get(key, lambda: _walk_metadata(path, wanted)))


def _walk_metadata(path: str | Path, wanted: set[str]) -> dict[str, Any]:
    found: dict[str, Any] = {}
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            _, pairs = _pairs(_Cursor(data))
            for key, value in pairs:
                if key in wanted:
                    found[key] = value
                    if len(found) == len(wanted):
                        break
    except (_End, OSError, ValueError):  # ValueError: mmap of an empty file
        pass
    return found


@dataclass(frozen=True)
class TensorTable:
    """What the walk read: the scalar and string metadata, and each tensor's
    (name, ggml type number, element count) in the file's order; where each tensor's data
    lies (its dimensions, fastest first, and its offset from ``data_start``)."""
    metadata: dict[str, Any]
    tensors: list[tuple[str, int, int]]
    dims: list[tuple[int, ...]]
    offsets: list[int]
    data_start: int


_TABLES = IdentityMemo(size=8)


def tensor_table(path: str | Path) -> TensorTable | None:
    """The file's metadata and tensor table, or None where the walk cannot follow the file
    (not GGUF, truncated, an unfamiliar type): the full reader then says what is wrong. Kept
    by the file's identity (a real vocabulary's walk takes a tenth of a second, and the
    llama engines, their mutations and their rewrites ask again and again): one table
    serves every caller, who reads it and changes nothing."""
    try:
        key = (str(path), identity(os.stat(path)))
    except OSError:
        return None
    return _TABLES.get(key, lambda: _walk_table(path))


def _walk_table(path: str | Path) -> TensorTable | None:
    try:
        with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
            cursor = _Cursor(data)
            count, pairs = _pairs(cursor)
            metadata = {key: value for key, value in pairs if value is not None}
            tensors, shapes, offsets = [], [], []
            for _ in range(count):
                name = cursor.string()
                dims = tuple(cursor.take("<Q") for _ in range(cursor.take("<I")))
                kind = cursor.take("<I")
                offsets.append(cursor.take("<Q"))
                tensors.append((name, kind, math.prod(dims)))
                shapes.append(dims)
            align = metadata.get("general.alignment", 32)
            if not isinstance(align, int) or align <= 0:
                raise _End
            start = -(-cursor.pos // align) * align
    except (_End, OSError, ValueError):
        return None
    return TensorTable(metadata, tensors, shapes, offsets, start)


def field_value(reader, key: str, default=None):
    """The value of ``key`` in a parsed ``gguf.GGUFReader``, or ``default`` when absent."""
    f = reader.fields.get(key)
    return default if f is None else f.contents()
