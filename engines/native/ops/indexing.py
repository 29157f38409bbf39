"""Indexing ops: Gather, Slice, Where, Trilu, OneHot."""
from __future__ import annotations

import numpy as np

from engines.native.cupy_array_backend import CupyArrayBackend

from .base import Kernel, host_ints, norm_axis


class Gather(Kernel):
    """Negative indices count from the end; indices may be device or host values. On a
    device whose plan compiled the fused kernels, device data and indices take one launch
    (``launch/gather.py``) where the array path makes four."""

    def setup(self) -> None:
        self.axis = self.attr("axis", 0)

    def __call__(self, be, data, indices):
        xp = be.xp
        axis = norm_axis(self.axis, data.ndim, self)
        kernels = be.loaded_fused_kernels() if isinstance(be, CupyArrayBackend) else None
        if kernels is not None and isinstance(data, xp.ndarray) \
                and isinstance(indices, xp.ndarray):
            got = kernels.gather(data, indices, axis, stream=be.stream)
            if got is not None:
                return (got,)
        extent = data.shape[axis]
        idx = xp.where(indices < 0, indices + extent, indices)
        return (xp.take(data, idx, axis=axis),)


class Slice(Kernel):
    """starts/ends/axes/steps as attributes (< 10) or host inputs 1..4 (>= 10)."""

    host_inputs = frozenset({1, 2, 3, 4})

    def setup(self) -> None:
        self.starts_attr = self.attr("starts")
        self.ends_attr = self.attr("ends")
        self.axes_attr = self.attr("axes")

    def __call__(self, be, x, starts=None, ends=None, axes=None, steps=None):
        if self.starts_attr is not None:
            s_list, e_list = list(self.starts_attr), list(self.ends_attr)
            a_list = list(self.axes_attr) if self.axes_attr is not None else None
            st_list = None
        else:
            s_list, e_list = host_ints(starts), host_ints(ends)
            a_list = host_ints(axes) if axes is not None else None
            st_list = host_ints(steps) if steps is not None else None
        if a_list is None:
            a_list = list(range(len(s_list)))
        if st_list is None:
            st_list = [1] * len(s_list)
        if not len(s_list) == len(e_list) == len(a_list) == len(st_list):
            raise self.fail("starts, ends, axes and steps differ in length", field="Slice",
                            value=(s_list, e_list, a_list, st_list),
                            remedy="give one entry per sliced axis in each")
        index = [slice(None)] * x.ndim
        for s, e, a, st in zip(s_list, e_list, a_list, st_list):
            axis = norm_axis(a, x.ndim, self, "axes")
            index[axis] = self.clamp(s, e, st, x.shape[axis])
        return (x[tuple(index)],)

    def clamp(self, start: int, end: int, step: int, dim: int) -> slice:
        if step == 0:
            raise self.fail("Slice step is zero", field="steps", value=step,
                            remedy="use a non-zero step")
        start = start + dim if start < 0 else start
        end = end + dim if end < 0 else end
        if step > 0:
            start, end = min(max(start, 0), dim), min(max(end, 0), dim)
            return slice(start, end, step)
        start, end = min(max(start, 0), dim - 1), min(max(end, -1), dim - 1)
        # end == -1 means "through index 0"; Python spells that as None.
        return slice(start, None if end < 0 else end, step)


class Where(Kernel):
    def __call__(self, be, cond, x, y):
        return (be.xp.where(cond, x, y),)


class Trilu(Kernel):
    """Upper (default) or lower triangle of the last two axes, diagonal offset k (host)."""

    host_inputs = frozenset({1})

    def setup(self) -> None:
        self.upper = bool(self.attr("upper", 1))

    def __call__(self, be, x, k=None):
        offset = host_ints(k)[0] if k is not None else 0
        fn = be.xp.triu if self.upper else be.xp.tril
        return (fn(x, offset),)


class OneHot(Kernel):
    """on_value where an index names the slot along the new ``axis``, off_value elsewhere;
    a negative index in [-depth, 0) counts from the end, any other index out of range hits
    nothing (a row of off_value). ``depth`` sets the output's shape, so it is a host input."""

    host_inputs = frozenset({1})

    def setup(self) -> None:
        self.axis = int(self.attr("axis", -1))

    def __call__(self, be, indices, depth, values):
        xp = be.xp
        given = host_ints(depth)
        if len(given) != 1 or given[0] < 1:
            raise self.fail("depth is one positive number", field="depth", value=given,
                            remedy="give depth as a scalar or one-element tensor >= 1")
        extent = given[0]
        axis = norm_axis(self.axis, indices.ndim + 1, self)
        idx = indices.astype(np.int64)  # float indices truncate toward zero
        idx = xp.where(idx < 0, idx + extent, idx)
        idx = xp.expand_dims(idx, axis)
        slots = xp.arange(extent, dtype=np.int64).reshape(
            (1,) * axis + (extent,) + (1,) * (indices.ndim - axis))
        return (xp.where(idx == slots, values[1], values[0]),)
