"""Index-tuple gathers and scatters torch's exporter writes: GatherElements, GatherND and
ScatterND. Indices are device values (negative ones count from the end) and are never read
on the host; out-of-range indices are not clamped.

ScatterND's reductions use the one-hot formulation of ``scatter.py`` over the flattened
leading axes (index count x slot count elements), the same code on every backend.
"""
from __future__ import annotations

import math

import numpy as np

from .base import Kernel, norm_axis
from .scatter import REDUCTIONS, one_hot_reduce


def _wrap(xp, idx, extent):
    idx = idx.astype(np.int64)
    return xp.where(idx < 0, idx + extent, idx)


class GatherElements(Kernel):
    def setup(self) -> None:
        self.axis = int(self.attr("axis", 0))

    def __call__(self, be, data, indices):
        xp = be.xp
        axis = norm_axis(self.axis, data.ndim, self)
        idx = _wrap(xp, indices, data.shape[axis])
        if idx.shape == data.shape:
            return (xp.take_along_axis(data, idx, axis=axis),)
        grid = list(xp.indices(tuple(idx.shape), dtype=np.int64))
        grid[axis] = idx
        return (data[tuple(grid)],)


def _flat_positions(xp, data_shape, indices, batch_dims: int = 0):
    """indices [..., k] -> (index tuple into data, k), negative entries wrapped."""
    k = indices.shape[-1]
    parts = [_wrap(xp, indices[..., j], data_shape[batch_dims + j]) for j in range(k)]
    return parts, k


class GatherND(Kernel):
    def setup(self) -> None:
        self.batch_dims = int(self.attr("batch_dims", 0))

    def __call__(self, be, data, indices):
        xp = be.xp
        b = self.batch_dims
        k = indices.shape[-1]
        if b + k > data.ndim:
            raise self.fail("batch_dims + indices.shape[-1] exceeds data's rank",
                            field="indices.shape", value=(tuple(data.shape), tuple(indices.shape)),
                            remedy="index at most the data's remaining axes")
        batch = tuple(data.shape[:b])
        nb = math.prod(batch)
        flat_data = data.reshape((nb,) + tuple(data.shape[b:]))
        flat_idx = indices.reshape((nb,) + tuple(indices.shape[b:]))
        parts, _ = _flat_positions(xp, data.shape, flat_idx, b)
        lead = xp.arange(nb, dtype=np.int64).reshape((nb,) + (1,) * (flat_idx.ndim - 2))
        out = flat_data[(lead, *parts)]
        return (out.reshape(batch + tuple(indices.shape[b:-1]) + tuple(data.shape[b + k:])),)


class ScatterND(Kernel):
    def setup(self) -> None:
        self.reduction = self.attr("reduction", "none")
        if self.reduction not in REDUCTIONS:
            raise self.fail("unknown ScatterND reduction", field="reduction",
                            value=self.reduction, remedy="use none, add, mul, max or min")

    def __call__(self, be, data, indices, updates):
        xp = be.xp
        parts, k = _flat_positions(xp, data.shape, indices)
        out = xp.array(data, copy=True)
        if self.reduction == "none":
            out[tuple(parts)] = updates
            return (out,)
        slots = math.prod(data.shape[:k])
        rest = tuple(data.shape[k:])
        linear = xp.zeros(indices.shape[:-1], dtype=np.int64)
        for j in range(k):
            linear = linear * data.shape[j] + parts[j]
        n = math.prod(indices.shape[:-1])
        hit = linear.reshape(n, 1) == xp.arange(slots, dtype=np.int64)  # [n, slots]
        hit = hit.reshape((n, slots) + (1,) * len(rest))
        upd = updates.reshape((n, 1) + rest)
        target = out.reshape((slots,) + rest)
        result = one_hot_reduce(be, self.reduction, target, hit, upd, axis=0)
        return (result.reshape(data.shape),)
