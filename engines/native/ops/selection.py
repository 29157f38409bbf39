"""Selection ops: ArgMax and ArgMin (int64 results, ties to the first index unless
``select_last_index``), TopK, and NonZero (whose output shape is read from its values)."""
from __future__ import annotations

import numpy as np

from .base import Kernel, host_ints, norm_axis


class ArgMax(Kernel):
    largest = True

    def setup(self) -> None:
        self.axis = int(self.attr("axis", 0))
        self.keepdims = bool(self.attr("keepdims", 1))
        self.last = bool(self.attr("select_last_index", 0))

    def __call__(self, be, x):
        xp = be.xp
        axis = norm_axis(self.axis, x.ndim, self)
        fn = xp.argmax if self.largest else xp.argmin
        if self.last:  # the first index of the reversed axis is the last of the original
            idx = (x.shape[axis] - 1) - fn(xp.flip(x, axis=axis), axis=axis)
        else:
            idx = fn(x, axis=axis)
        idx = idx.astype(np.int64)
        return (xp.expand_dims(idx, axis) if self.keepdims else idx,)


class ArgMin(ArgMax):
    largest = False


class TopK(Kernel):
    """The k largest (or smallest) values along ``axis`` and their int64 indices, sorted,
    equal values in index order (the lower index first, as ONNX states). k sets the output
    shape, so it is a host input: a k computed from device values is refused when the plan
    is built (``Plan``'s host-slot rule), never read back. Ordering is a stable sort; for
    the largest values the axis is reversed around it so ties still keep the lower index
    first (negating would overflow the smallest integer and lose -0.0's order)."""

    host_inputs = frozenset({1})

    def setup(self) -> None:
        self.axis = int(self.attr("axis", -1))
        self.largest = bool(self.attr("largest", 1))
        self.k_attr = self.attr("k")  # opset 1 only

    def __call__(self, be, x, k=None):
        xp = be.xp
        axis = norm_axis(self.axis, x.ndim, self)
        given = [int(self.k_attr)] if k is None else host_ints(k)
        extent = x.shape[axis]
        if len(given) != 1 or not 0 <= given[0] <= extent:
            raise self.fail("k must be one number in [0, the axis' extent]", field="K",
                            value=given, remedy=f"use a k in [0, {extent}]")
        count = given[0]
        if self.largest:
            flipped = xp.flip(x, axis=axis)
            order = xp.flip(xp.argsort(flipped, axis=axis, kind="stable"), axis=axis)
            order = (extent - 1) - order
        else:
            order = xp.argsort(x, axis=axis, kind="stable")
        order = order[(slice(None),) * axis + (slice(0, count),)].astype(np.int64)
        return (xp.take_along_axis(x, order, axis=axis), order)


class NonZero(Kernel):
    """The indices of the non-zero elements, [rank, count] int64 in row-major order. Its
    output shape is the count of non-zero values, so it is read from the values: free on
    the host; on a device the plan runs it only on host-resolved inputs and refuses it
    otherwise (``value_dependent_shape``), as reading the count back would be a staging."""

    value_dependent_shape = True

    def __call__(self, be, x):
        xp = be.xp
        if x.ndim == 0:  # a scalar has no index axes: [0, 1] if it is non-zero, else [0, 0]
            return (xp.zeros((0, int(bool(x))), dtype=np.int64),)
        return (xp.stack(xp.nonzero(x)).astype(np.int64).reshape(x.ndim, -1),)
