"""The rotary embeddings' launchers (``kernels/rotary.cu``): x [B, H, M, D] (any strides)
rotated with cos/sin tables broadcast to it, one thread an element; queries and keys in
one launch (``rotary2``), and with the cache write that takes the keys (``rotary_kv``)."""
from __future__ import annotations

import functools

import numpy as np

from engines.errors import ExecutionError
from engines.native.kernel_source import instance, module
from engines.native.launch.family import (LINEAR_BLOCK, KernelFamily, ceil_div, elem_strides,
                                          i64)
from engines.native.launch.fused_dtypes import every_instance, fused_dtype
from engines.native.launch.kv_write import runs_fit


@functools.lru_cache(maxsize=256)
def broadcast_element_strides(table_shape: tuple, table_strides: tuple, itemsize: int,
                              shape: tuple) -> tuple[int, ...] | None:
    """What ``broadcast_to(table, shape).strides`` gives, in elements, with 0 along every
    axis of extent 1; None where the table does not broadcast to ``shape``. Arithmetic on
    the metadata (and remembered): a prefill asks about 120 times with the same shapes,
    and a broadcast view costs microseconds to build only to read its strides."""
    lead = len(shape) - len(table_shape)
    if lead < 0:
        return None
    out = []
    for axis, extent in enumerate(shape):
        j = axis - lead
        own = table_shape[j] if j >= 0 else 1
        if own != extent and own != 1:
            return None
        out.append(0 if extent == 1 or own == 1 else table_strides[j] // itemsize)
    return tuple(out)


def _broadcast_strides(table, shape, what: str) -> list[int]:
    """The table's element strides broadcast to ``shape``; 0 along every axis of extent
    1 (only index 0 is read there), so tables broadcast to shapes that differ only in
    such axes (queries and a single KV head) compare equal."""
    strides = broadcast_element_strides(tuple(table.shape), tuple(table.strides),
                                        table.itemsize, tuple(shape))
    if strides is None:
        raise ExecutionError(f"{what} does not broadcast to x", field=what,
                             value=(tuple(table.shape), shape),
                             remedy="feed tables of shape [1, 1, M, head_dim]")
    return list(strides)


def table_strides(cos, sin, shape) -> list[int]:
    """cos's then sin's element strides broadcast to ``shape`` (a rotation's launch
    arguments)."""
    return (_broadcast_strides(cos, shape, "cos")
            + _broadcast_strides(sin, shape, "sin"))


class RotaryKernels(KernelFamily):
    MODULE = module("rotary.cu", every_instance("rotary", 3) + every_instance("rotary2", 3)
                    + every_instance("rotary_kv", 3))

    def rotary(self, x, cos, sin, layout: str, compute_dtype, scale, out_dtype, *, stream):
        """x [B, H, M, D] (any strides) rotated with cos/sin broadcast to it."""
        for value, what in ((x, "x"), (cos, "cos"), (sin, "sin")):
            self._check(value, what)
        shape = tuple(x.shape)
        try:
            cos_b = self._cupy.broadcast_to(cos, shape)
            sin_b = self._cupy.broadcast_to(sin, shape)
        except ValueError:
            raise ExecutionError("cos/sin do not broadcast to x", field="cos",
                                 value=(tuple(cos.shape), shape),
                                 remedy="feed tables of shape [1, 1, M, head_dim]") from None
        name = instance("rotary", fused_dtype(x.dtype, "x"), fused_dtype(compute_dtype, "cos"),
                        fused_dtype(out_dtype, "out"))
        out = self._empty(shape, out_dtype, stream)
        total = out.size
        if total:
            strides = [s // a.itemsize for a in (x, cos_b, sin_b) for s in a.strides]
            self._launch(name, ceil_div(total, LINEAR_BLOCK), LINEAR_BLOCK,
                         (x, cos_b, sin_b, out, i64(total), i64(shape[1]), i64(shape[2]),
                          i64(shape[3]), *map(i64, strides), np.int32(layout == "pairs"),
                          np.int32(scale is not None),
                          np.float32(0.0 if scale is None else scale)), stream)
        return out

    def rotary2(self, xa, xb, cos, sin, layout: str, compute_dtype, scale_a, scale_b,
                out_dtype, *, stream):
        """Two ``rotary``s over the same cos/sin in one launch (queries and keys: their
        heads and scales may differ; dtype, M and head_dim may not, else two launches)."""
        for value, what in ((xa, "xa"), (xb, "xb"), (cos, "cos"), (sin, "sin")):
            self._check(value, what)
        shape_a, shape_b = tuple(xa.shape), tuple(xb.shape)
        tables_a, tables_b = table_strides(cos, sin, shape_a), table_strides(cos, sin, shape_b)
        if xa.dtype != xb.dtype or shape_a[0] != shape_b[0] or shape_a[2:] != shape_b[2:] \
                or tables_a != tables_b:
            return (self.rotary(xa, cos, sin, layout, compute_dtype, scale_a, out_dtype,
                                stream=stream),
                    self.rotary(xb, cos, sin, layout, compute_dtype, scale_b, out_dtype,
                                stream=stream))
        name = instance("rotary2", fused_dtype(xa.dtype, "x"), fused_dtype(compute_dtype, "cos"),
                        fused_dtype(out_dtype, "out"))
        out_a = self._empty(shape_a, out_dtype, stream)
        out_b = self._empty(shape_b, out_dtype, stream)
        total = out_a.size + out_b.size
        if total:
            def part(x, out, scale):
                strides = [st // x.itemsize for st in x.strides]
                return (x, out, i64(out.size), i64(x.shape[1]), *map(i64, strides),
                        np.int32(scale is not None),
                        np.float32(0.0 if scale is None else scale))

            self._launch(name, ceil_div(total, LINEAR_BLOCK), LINEAR_BLOCK,
                         (*part(xa, out_a, scale_a), *part(xb, out_b, scale_b),
                          cos, sin, i64(shape_a[2]),
                          i64(shape_a[3]), *map(i64, tables_a),
                          np.int32(layout == "pairs")), stream)
        return out_a, out_b

    def rotary_kv(self, xq, xk, cos, sin, layout: str, compute_dtype, scale_q, scale_k,
                  out_dtype, old_k, old_v, new_v, positions, *, stream):
        """``rotary2(xq, xk, ...)`` then ``kv_write2(old_k, rotated keys, old_v, new_v,
        positions)`` in one launch: (rotated queries, key cache, value cache), bit for bit
        the two launches'. None where one launch cannot take the operands (the caller runs
        the two)."""
        for value, what in ((xq, "xq"), (xk, "xk"), (cos, "cos"), (sin, "sin"),
                            (old_k, "old_k"), (old_v, "old_v"), (new_v, "new_v")):
            self._check(value, what)
        shape_q, shape_k = tuple(xq.shape), tuple(xk.shape)
        tables = table_strides(cos, sin, shape_q)
        if xq.dtype != xk.dtype or shape_q[0] != shape_k[0] or shape_q[2:] != shape_k[2:] \
                or tables != table_strides(cos, sin, shape_k):
            return None
        b, hk, m, d = shape_k
        dtype = np.dtype(out_dtype)
        if old_k.ndim != 4 or old_v.ndim != 4 or new_v.ndim != 4 \
                or (old_k.shape[0], old_k.shape[1], old_k.shape[3]) != (b, hk, d) \
                or old_v.shape[2] != old_k.shape[2] \
                or (new_v.shape[0], new_v.shape[1], new_v.shape[2], new_v.shape[3]) \
                != (old_v.shape[0], old_v.shape[1], m, old_v.shape[3]) or old_v.shape[3] != d \
                or not (old_k.dtype == old_v.dtype == new_v.dtype == dtype):
            return None
        old_k, old_v = self._contiguous(old_k, stream), self._contiguous(old_v, stream)
        per = 16 // dtype.itemsize
        if not all(runs_fit(x, per) for x in (old_k, old_v, new_v)):
            return None
        name = instance("rotary_kv", fused_dtype(xq.dtype, "x"), fused_dtype(compute_dtype, "cos"),
                        fused_dtype(dtype, "out"))
        pos = self._positions(positions, m, stream)
        out_q = self._empty(shape_q, dtype, stream)
        cache_k = self._empty(old_k.shape, dtype, stream)
        cache_v = self._empty(old_v.shape, dtype, stream)
        runs_k, runs_v = cache_k.size // per, cache_v.size // per
        total = out_q.size + runs_k + runs_v
        if total:
            vb, vh, vm, _ = elem_strides(new_v)
            self._launch(name, ceil_div(total, LINEAR_BLOCK), LINEAR_BLOCK,
                         (xq, out_q, i64(out_q.size), i64(shape_q[1]),
                          *map(i64, elem_strides(xq)), np.int32(scale_q is not None),
                          np.float32(0.0 if scale_q is None else scale_q),
                          xk, i64(hk), *map(i64, elem_strides(xk)),
                          np.int32(scale_k is not None),
                          np.float32(0.0 if scale_k is None else scale_k),
                          cos, sin, i64(m), i64(d),
                          *map(i64, tables), np.int32(layout == "pairs"),
                          old_k, cache_k, i64(runs_k), old_v, new_v, cache_v, i64(runs_v),
                          i64(old_v.shape[1]), i64(vb), i64(vh), i64(vm), pos,
                          i64(old_k.shape[2])), stream)
        return out_q, cache_k, cache_v
