"""A GGUF file copied with some tensors changed: what planted weight bugs and fresh
quantizations are written with.

Every key/value is copied as the ``gguf`` package reads it; each tensor keeps its raw bytes,
type and shape unless ``change`` returns a replacement for it (:class:`Tensor`: raw data
in the GGUF's own block layout, its type and its logical shape). The result is written to a
temporary sibling and renamed into place, so a reader never sees half a file.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engines.gguf_fields import copy_gguf_fields
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


__all__ = ["Tensor", "read_tensor", "rewrite_gguf"]
