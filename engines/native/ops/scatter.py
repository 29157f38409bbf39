"""ScatterElements: write (or reduce) updates into a copy of data at per-element indices.

Indices are device values like any other; a negative one counts from the end. Nothing is
read back to the host, so an index out of range is never clamped: without a reduction it
fails in the array library; with one it matches no slot and is dropped. Reductions use one
formulation on every backend (CuPy has no general ``ufunc.at``): a one-hot comparison of
each update's index with every slot along the axis, reduced over the updates (sums through
``be.sum``, in index order). That costs indices.size x data.shape[axis] elements, fine for
the sizes exports scatter.
"""
from __future__ import annotations

import numpy as np

from .base import Kernel, norm_axis

REDUCTIONS = ("none", "add", "mul", "max", "min")


def one_hot_reduce(be, reduction: str, target, hit, updates, axis: int):
    """``target`` with every update whose ``hit`` is set combined into its slot by
    ``reduction`` (add, mul, max or min); ``hit`` and ``updates`` broadcast against each
    other and hold the updates along ``axis``. Sums go through ``be.sum`` in update order; a
    slot no update hits keeps its value. ScatterElements and ScatterND share it."""
    xp = be.xp
    dtype = target.dtype
    if reduction == "add":
        picked = xp.moveaxis(xp.where(hit, updates, dtype.type(0)), axis, -1)  # updates last
        return target + be.sum(xp.ascontiguousarray(picked), picked.ndim - 1)
    if reduction == "mul":
        return target * xp.prod(xp.where(hit, updates, dtype.type(1)), axis=axis)
    largest = reduction == "max"
    if dtype.kind == "f":
        neutral = dtype.type(-np.inf if largest else np.inf)
    else:
        info = np.iinfo(dtype)
        neutral = dtype.type(info.min if largest else info.max)
    best = (xp.max if largest else xp.min)(xp.where(hit, updates, neutral), axis=axis)
    pick = xp.maximum if largest else xp.minimum
    return xp.where(xp.any(hit, axis=axis), pick(target, best), target)


class ScatterElements(Kernel):
    def setup(self) -> None:
        self.axis = int(self.attr("axis", 0))
        self.reduction = self.attr("reduction", "none")
        if self.reduction not in REDUCTIONS:
            raise self.fail("unknown ScatterElements reduction", field="reduction",
                            value=self.reduction, remedy="use none, add, mul, max or min")

    def __call__(self, be, data, indices, updates):
        xp = be.xp
        axis = norm_axis(self.axis, data.ndim, self)
        if tuple(indices.shape) != tuple(updates.shape) or indices.ndim != data.ndim:
            raise self.fail("indices and updates must share a shape of data's rank",
                            field="updates.shape",
                            value=(tuple(data.shape), tuple(indices.shape), tuple(updates.shape)),
                            remedy="give indices and updates one shape, of data's rank")
        extent = data.shape[axis]
        idx = indices.astype(np.int64)
        idx = xp.where(idx < 0, idx + extent, idx)
        out = xp.array(data, copy=True)
        if self.reduction == "none":
            grid = list(xp.indices(tuple(indices.shape), dtype=np.int64))
            grid[axis] = idx
            out[tuple(grid)] = updates
            return (out,)
        # the block of data the updates can reach, the scatter axis last: [..., extent]
        block = tuple(slice(None) if k == axis else slice(0, n)
                      for k, n in enumerate(indices.shape))
        target = xp.moveaxis(out[block], axis, -1)
        idx_l = xp.moveaxis(idx, axis, -1)[..., None]  # [..., m, 1]
        upd_l = xp.moveaxis(updates, axis, -1)[..., None]
        hit = idx_l == xp.arange(extent, dtype=np.int64)  # [..., m, extent]
        result = one_hot_reduce(be, self.reduction, target, hit, upd_l, axis=-2)
        out[block] = xp.moveaxis(result, -1, axis)
        return (out,)


class TensorScatter(Kernel):
    """ONNX TensorScatter (24): a copy of the cache with each batch row's S updates written
    along ``axis`` from that row's write index (0 without ``write_indices``), wrapping modulo
    the axis' extent in ``circular`` mode. The write indices are device values: every slot t
    takes update t - w[b] when that lies in [0, S) and keeps the cache's value otherwise
    (index arithmetic and a gather, nothing read back). In ``linear`` mode a write past the
    end of the buffer, which ONNX forbids, is therefore dropped rather than clamped or
    reported; lockstep's decode never makes one (positions stop at max_context)."""

    def setup(self) -> None:
        self.axis = int(self.attr("axis", -2))
        self.mode = self.attr("mode", "linear")
        if self.mode not in ("linear", "circular"):
            raise self.fail("unknown TensorScatter mode", field="mode", value=self.mode,
                            remedy="use linear or circular")

    def __call__(self, be, past, update, write_indices=None):
        xp = be.xp
        axis = norm_axis(self.axis, past.ndim, self)
        if axis == 0:
            raise self.fail("the sequence axis cannot be the batch axis", field="axis",
                            value=self.axis, remedy=f"use an axis in [1, {past.ndim - 1}]")
        length, count = past.shape[axis], update.shape[axis]
        other = [k for k in range(past.ndim) if k != axis]
        if update.ndim != past.ndim or count > length or \
                any(past.shape[k] != update.shape[k] for k in other):
            raise self.fail("update must match the cache except along axis, and be no longer",
                            field="update.shape", value=(tuple(past.shape), tuple(update.shape)),
                            remedy=f"give update the cache's shape with at most {length} "
                                   f"positions along axis {axis}")
        batch = past.shape[0]
        if write_indices is None:
            start = xp.zeros((batch,), dtype=np.int64)
        else:
            start = write_indices.astype(np.int64, copy=False)
        slot = xp.arange(length, dtype=np.int64).reshape(
            (1,) * axis + (length,) + (1,) * (past.ndim - axis - 1))
        offset = slot - start.reshape((batch,) + (1,) * (past.ndim - 1))
        if self.mode == "circular":
            offset = xp.mod(offset, length)
        written = (offset >= 0) & (offset < count)
        index = xp.broadcast_to(xp.clip(offset, 0, max(count - 1, 0)), past.shape)
        if count == 0:
            return (xp.array(past, copy=True),)
        return (xp.where(written, xp.take_along_axis(update, index, axis=axis), past),)
