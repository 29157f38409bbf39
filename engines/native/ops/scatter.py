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
