"""One ``.safetensors`` file read as float32 arrays, its header checked against its size.

The layout (the format's own specification): an 8-byte little-endian header length, a JSON
object naming each tensor's dtype, shape and ``data_offsets`` (begin, end) into the bytes
that follow, then those bytes. Tensors are memory-mapped and read directly: the
``safetensors`` package's numpy loader refuses BF16, which most checkpoints use.

A damaged file (cut short by a download, random bytes, a header that lies) is refused
naming the file, the tensor and what is wrong, before any array is made from it: nothing
is allocated from a length or shape the file merely claims.
"""
from __future__ import annotations

import math
import struct
from pathlib import Path

import numpy as np

from engines import json_text
from engines.errors import InputError

DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8"),
          "BF16": np.dtype("<u2")}  # BF16: the high half of a float32
MAX_HEADER = 100_000_000  # the specification's limit on the JSON header
REMEDY = "download or save the checkpoint again (this file is damaged or not safetensors)"
TRUNCATED = "download the checkpoint again (the file was cut short)"


def _damaged(path: Path, what: str, field: str | None = None, value=None,
             remedy: str = REMEDY) -> InputError:
    """``field``: the header entry at fault (default: the file itself)."""
    return InputError(f"{path.name} {what}", field=field or path.name,
                      value=path.name if field is None else value, remedy=remedy,
                      where=str(path))


def read_header(path: Path) -> tuple[dict, int, int]:
    """The header's tensor entries (``__metadata__`` left out), where the data begins and
    how many bytes of data follow, each entry checked against them."""
    size = path.stat().st_size
    with open(path, "rb") as fh:
        raw = fh.read(8)
        if len(raw) != 8:
            raise _damaged(path, f"is too short to be a safetensors file ({size} bytes)")
        (length,) = struct.unpack("<Q", raw)
        if length > MAX_HEADER:
            raise _damaged(path, f"declares a {length}-byte header; the format allows at "
                                 f"most {MAX_HEADER}")
        if length > size - 8:
            raise _damaged(path, f"is truncated: its header needs {length} bytes, the file "
                                 f"holds {size - 8} after the header's length",
                           remedy=TRUNCATED)
        text = fh.read(length)
    try:
        header = json_text.loads(text)
    except ValueError as exc:  # not JSON, or not UTF-8
        raise _damaged(path, f"has no readable safetensors header ({exc})") from None
    if not isinstance(header, dict):
        raise _damaged(path, f"has a header that is a JSON {type(header).__name__}, not an "
                             f"object of tensors")
    header.pop("__metadata__", None)
    data_bytes = size - 8 - length
    for name, entry in header.items():
        _check_entry(path, name, entry, data_bytes)
    return header, 8 + length, data_bytes


def _check_entry(path: Path, name: str, entry, data_bytes: int) -> None:
    if not isinstance(entry, dict) or not {"dtype", "shape", "data_offsets"} <= set(entry):
        raise _damaged(path, f"describes tensor {name!r} without its dtype, shape and "
                             f"data_offsets", f"{path.name} {name}", entry)
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if dtype not in DTYPES:
        raise InputError(f"tensor {name!r} has dtype {dtype!r}, which the converter does not "
                         f"read", field="tensor type", value=dtype,
                         remedy="save the checkpoint in F32, F16 or BF16", where=str(path))
    if not (isinstance(shape, list)
            and all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)):
        raise _damaged(path, f"gives tensor {name!r} a shape that is not a list of sizes",
                       f"{path.name} {name}.shape", shape)
    if not (isinstance(offsets, list) and len(offsets) == 2
            and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
            and 0 <= offsets[0] <= offsets[1]):
        raise _damaged(path, f"gives tensor {name!r} data_offsets that are not a range of "
                             f"bytes", f"{path.name} {name}.data_offsets", offsets)
    begin, end = offsets
    need = math.prod(shape) * DTYPES[dtype].itemsize
    if end - begin != need:
        raise _damaged(path, f"gives tensor {name!r} {end - begin} bytes, but its shape "
                             f"{shape} in {dtype} needs {need}",
                       f"{path.name} {name}.data_offsets", offsets)
    if end > data_bytes:
        raise _damaged(path, f"is truncated: tensor {name!r} ends at byte {end} of the data, "
                             f"but the file holds only {data_bytes} bytes of data",
                       f"{path.name} {name}.data_offsets", offsets, TRUNCATED)


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor of one .safetensors file, as float32 (F32, F16, BF16 or F64 stored)."""
    header, start, data_bytes = read_header(path)
    data = (np.memmap(path, dtype=np.uint8, mode="r", offset=start) if data_bytes
            else np.empty(0, np.uint8))
    out = {}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        values = data[begin:end].view(DTYPES[info["dtype"]])
        if info["dtype"] == "BF16":
            values = (values.astype(np.uint32) << 16).view(np.float32)
        else:
            values = values.astype(np.float32)
        out[name] = values.reshape(info["shape"])
    return out
