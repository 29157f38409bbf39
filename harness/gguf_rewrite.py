"""A GGUF file copied with some tensors changed: what planted weight bugs and fresh
quantizations are written with.

Every key/value is copied as the ``gguf`` package reads it; each tensor keeps its raw bytes,
type and shape unless ``change`` returns a replacement for it (:class:`Tensor`: raw data
in the GGUF's own block layout, its type and its logical shape). The result is written to a
temporary sibling and renamed into place, so a reader never sees half a file.

A planted weight bug changes one tensor's bytes and nothing else: ``patch_tensor`` copies
the file and writes that tensor's new bytes where the old ones were, found by the header's
walk (``engines.gguf_header.tensor_table``), instead of the gguf package's full parse
(seconds on a real vocabulary) and a rewrite of every field.
"""
from __future__ import annotations

import mmap
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engines.gguf_fields import copy_gguf_fields
from engines.gguf_header import tensor_table
from harness.convert.gguf_reader import open_gguf


@dataclass(frozen=True)
class Tensor:
    """One tensor as the GGUF stores it: ``data`` (for a quantized type uint8, one row of
    blocks a row, as ``gguf.quants.quantize`` returns it; the values for a float one) and
    its ``type`` (``gguf.GGMLQuantizationType``)."""

    name: str
    data: np.ndarray
    type: object


def _copy_fields(reader, writer, file_type: int | None) -> None:
    import gguf

    skip = {"general.architecture", "general.file_type"} | (
        {"general.quantization_version"} if file_type is not None else set())
    copy_gguf_fields(reader, writer, skip)
    old = reader.fields.get("general.file_type")
    if file_type is not None:
        writer.add_file_type(file_type)
        if file_type != gguf.LlamaFileType.ALL_F32:
            writer.add_quantization_version(gguf.GGML_QUANT_VERSION)
    elif old is not None:
        writer.add_file_type(int(old.contents()))


def read_tensor(t) -> Tensor:
    """A reader's tensor as a :class:`Tensor` (its stored bytes, not dequantized)."""
    return Tensor(t.name, np.array(t.data), t.tensor_type)


def rewrite_gguf(src: Path, dst: Path, change: Callable[[Tensor], Tensor | None],
                 file_type: int | None = None) -> Path:
    """Copy ``src`` to ``dst`` with each tensor ``change`` returns a replacement for
    (``None``: kept as stored). ``file_type``: the ``general.file_type`` to declare (default:
    the source's)."""
    import gguf

    src, dst = Path(src), Path(dst)
    reader = open_gguf(src)
    arch = reader.fields["general.architecture"]
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    writer = gguf.GGUFWriter(str(tmp), bytes(arch.parts[arch.data[0]]).decode())
    try:
        _copy_fields(reader, writer, file_type)
        for t in reader.tensors:
            stored = read_tensor(t)
            new = change(stored) or stored
            writer.add_tensor(new.name, new.data, raw_dtype=new.type)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, dst)
    except BaseException:
        writer.close()
        tmp.unlink(missing_ok=True)
        raise
    return dst


def _stored(data: np.ndarray, dims: tuple[int, ...], kind) -> np.ndarray:
    """A tensor's bytes as the gguf reader hands them: a quantized type's uint8 rows of
    blocks, a float type's values, the slowest dimension first."""
    import gguf

    shape = tuple(reversed(dims))
    floats = {gguf.GGMLQuantizationType.F32: np.float32, gguf.GGMLQuantizationType.F16:
              np.float16}
    if kind in floats:
        return data.view(floats[kind]).reshape(shape)
    block, size = gguf.GGML_QUANT_SIZES[kind]
    return data.reshape(*shape[:-1], shape[-1] // block * size)


def patch_tensor(src: Path, dst: Path, name: str, change: Callable[[Tensor], np.ndarray]
                 ) -> bool:
    """Copy ``src`` to ``dst`` with tensor ``name``'s bytes replaced by ``change`` of it (the
    same type and byte count). False, and nothing written, where the walk cannot follow the
    file, it holds no such tensor of a type the walk can size, or its data is cut short."""
    import gguf

    table = tensor_table(src)
    names = [t[0] for t in table.tensors] if table is not None else []
    if name not in names:
        return False
    i = names.index(name)
    try:
        kind = gguf.GGMLQuantizationType(table.tensors[i][1])
        block, size = gguf.GGML_QUANT_SIZES[kind]
    except (ValueError, KeyError):
        return False
    if block > 1 and table.dims[i][0] % block or block == 1 and kind not in (
            gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        return False
    start = table.data_start + table.offsets[i]
    nbytes = table.tensors[i][2] // block * size
    src, dst = Path(src), Path(dst)
    if start + nbytes > src.stat().st_size:
        return False  # cut short: the full reader names it
    tmp = dst.with_name(f".{dst.name}.tmp-{os.getpid()}")
    try:
        shutil.copyfile(src, tmp)
        with open(tmp, "r+b") as fh, mmap.mmap(fh.fileno(), 0) as data:
            old = np.frombuffer(data, np.uint8, nbytes, start).copy()
            new = np.ascontiguousarray(change(Tensor(name, _stored(old, table.dims[i], kind),
                                                     kind)))
            raw = new.view(np.uint8).reshape(-1)
            if raw.size != nbytes:
                raise ValueError(f"the new {name} holds {raw.size} bytes, the file's {nbytes}")
            data[start:start + nbytes] = raw.tobytes()
        os.replace(tmp, dst)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return True


__all__ = ["Tensor", "patch_tensor", "read_tensor", "rewrite_gguf"]
