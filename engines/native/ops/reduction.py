"""Reduce* ops. Sums go through ``be.sum`` (fixed order); max/min are order-free.

Axes are an attribute before opset 13 (ReduceSum) / 18 (the others) and an optional
host input after; a kernel takes whichever the node carries.
"""
from __future__ import annotations

import numpy as np

from .base import Kernel, host_ints, norm_axis


class _Reduce(Kernel):
    host_inputs = frozenset({1})

    def setup(self) -> None:
        self.keepdims = bool(self.attr("keepdims", 1))
        self.noop_with_empty_axes = bool(self.attr("noop_with_empty_axes", 0))
        self.axes_attr = self.attr("axes")

    def axes(self, x, axes_input) -> tuple[int, ...] | None:
        """Normalised sorted axes; None means identity (noop_with_empty_axes)."""
        if self.axes_attr is not None:
            raw = list(self.axes_attr)
        elif axes_input is not None:
            raw = host_ints(axes_input)
        else:
            raw = []
        if not raw:
            return None if self.noop_with_empty_axes else tuple(range(x.ndim))
        return tuple(sorted({norm_axis(a, x.ndim, self, "axes") for a in raw}))

    def out_shape(self, x, axes) -> tuple[int, ...]:
        if self.keepdims:
            return tuple(1 if i in axes else s for i, s in enumerate(x.shape))
        return tuple(s for i, s in enumerate(x.shape) if i not in axes)

    def sum(self, be, x, axes):
        """Sum over ``axes`` one axis at a time, each in fixed order, kept as size 1."""
        for axis in axes:
            x = be.sum(x, axis, keepdims=True)
        return x.reshape(self.out_shape(x, axes))


class ReduceSum(_Reduce):
    def __call__(self, be, x, axes_input=None):
        axes = self.axes(x, axes_input)
        if axes is None:
            return (x,)
        return (self.sum(be, x, axes),)


class ReduceMean(_Reduce):
    def __call__(self, be, x, axes_input=None):
        axes = self.axes(x, axes_input)
        if axes is None:
            return (x,)
        count = 1
        for a in axes:
            count *= x.shape[a]
        total = self.sum(be, x, axes)
        if total.dtype.kind in "iu":
            return ((total // count).astype(x.dtype),)
        return (total / total.dtype.type(count),)


class _Extreme(_Reduce):
    """Max/min: order-free; an empty reduction gives the identity (-inf/+inf, False/True)."""

    largest: bool

    def identity(self, dtype):
        if dtype == np.bool_:
            return not self.largest
        if dtype.kind in "iu":
            info = np.iinfo(dtype)
            return info.min if self.largest else info.max
        return -np.inf if self.largest else np.inf

    def __call__(self, be, x, axes_input=None):
        axes = self.axes(x, axes_input)
        if axes is None:
            return (x,)
        xp = be.xp
        if any(x.shape[a] == 0 for a in axes):
            return (xp.full(self.out_shape(x, axes), self.identity(x.dtype), dtype=x.dtype),)
        fn = xp.max if self.largest else xp.min
        return (fn(x, axis=axes, keepdims=self.keepdims),)


class ReduceMax(_Extreme):
    largest = True


class ReduceMin(_Extreme):
    largest = False


class ReduceProd(_Reduce):
    """The product along each axis in index order from 1 (a fixed order, like ``be.sum``:
    every output element is its own sequential product, whatever the other rows are)."""

    def __call__(self, be, x, axes_input=None):
        axes = self.axes(x, axes_input)
        if axes is None:
            return (x,)
        xp = be.xp
        for axis in axes:
            shape = list(x.shape)
            shape[axis] = 1
            acc = xp.ones(tuple(shape), dtype=x.dtype)
            for k in range(x.shape[axis]):
                acc = acc * x[(slice(None),) * axis + (slice(k, k + 1),)]
            x = acc
        return (x.reshape(self.out_shape(x, axes)),)
