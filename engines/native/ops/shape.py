"""Shape ops: shapes, reshapes, joins and splits, constants.

Every shape-like input (Reshape's shape, axes, split sizes, Range bounds) is a host slot:
the plan guarantees it is shape arithmetic, so reading it here is never a device read.
"""
from __future__ import annotations

import math

import numpy as np

from .base import Kernel, host_ints, norm_axis


class Shape(Kernel):
    metadata_only = True

    def setup(self) -> None:
        self.start = self.attr("start", 0)
        self.end = self.attr("end")

    def __call__(self, be, x):
        # Python slicing clamps exactly as ONNX Shape-15 specifies.
        dims = tuple(x.shape)[self.start:self.end]
        return (be.adopt(np.array(dims, dtype=np.int64)),)


class Size(Kernel):
    metadata_only = True

    def __call__(self, be, x):
        return (be.adopt(np.array(math.prod(x.shape), dtype=np.int64)),)


class Identity(Kernel):
    """Passes any value through, sequences and optionals included."""

    def __call__(self, be, x):
        return (x,)


class Constant(Kernel):
    def setup(self) -> None:
        attrs = self.attrs
        if "value" in attrs:
            value = np.asarray(attrs["value"])
        elif "value_float" in attrs:
            value = np.array(attrs["value_float"], dtype=np.float32)
        elif "value_floats" in attrs:
            value = np.array(attrs["value_floats"], dtype=np.float32)
        elif "value_int" in attrs:
            value = np.array(attrs["value_int"], dtype=np.int64)
        elif "value_ints" in attrs:
            value = np.array(attrs["value_ints"], dtype=np.int64)
        elif "value_string" in attrs:
            value = np.array(attrs["value_string"], dtype=object)
        elif "value_strings" in attrs:
            value = np.array(attrs["value_strings"], dtype=object)
        else:
            raise self.fail("Constant has no supported value attribute",
                            field="Constant.attribute", value=sorted(attrs),
                            remedy="use value, value_float(s), value_int(s) or value_string(s); "
                                   "sparse_value is not supported")
        self.value = value

    def __call__(self, be):
        return (be.adopt(self.value),)


class ConstantOfShape(Kernel):
    host_inputs = frozenset({0})

    def setup(self) -> None:
        value = self.attr("value")
        self.value = np.zeros(1, np.float32) if value is None else np.asarray(value).reshape(-1)

    def __call__(self, be, shape):
        dims = tuple(host_ints(shape))
        return (be.xp.full(dims, self.value[0], dtype=self.value.dtype),)


class Reshape(Kernel):
    host_inputs = frozenset({1})

    def setup(self) -> None:
        self.allowzero = bool(self.attr("allowzero", 0))
        self.shape_attr = self.attr("shape")  # Reshape-1

    def target(self, in_shape: tuple[int, ...], spec: list[int]) -> tuple[int, ...]:
        dims = list(spec)
        if not self.allowzero:
            for i, d in enumerate(dims):
                if d == 0:
                    if i >= len(in_shape):
                        raise self.fail("0 copies a missing input dimension", field="shape",
                                        value=spec, remedy=f"input shape is {in_shape}")
                    dims[i] = in_shape[i]
        if dims.count(-1) > 1:
            raise self.fail("at most one -1 in a Reshape shape", field="shape", value=spec,
                            remedy="give every other dimension explicitly")
        total = math.prod(in_shape)
        if -1 in dims:
            known = math.prod(d for d in dims if d != -1)
            if known == 0 or total % known:
                raise self.fail("cannot infer the -1 dimension", field="shape", value=spec,
                                remedy=f"input shape {in_shape} has {total} elements")
            dims[dims.index(-1)] = total // known
        if math.prod(dims) != total:
            raise self.fail("Reshape changes the number of elements", field="shape",
                            value=spec, remedy=f"input shape {in_shape} has {total} elements")
        return tuple(dims)

    def __call__(self, be, x, shape=None):
        spec = list(self.shape_attr) if self.shape_attr is not None else host_ints(shape)
        return (be.xp.reshape(x, self.target(tuple(x.shape), spec)),)


class Flatten(Kernel):
    def setup(self) -> None:
        self.axis = self.attr("axis", 1)

    def __call__(self, be, x):
        axis = self.axis + x.ndim if self.axis < 0 else self.axis
        outer = math.prod(x.shape[:axis])
        return (be.xp.reshape(x, (outer, math.prod(x.shape[axis:]))),)


class Squeeze(Kernel):
    host_inputs = frozenset({1})

    def setup(self) -> None:
        self.axes_attr = self.attr("axes")  # before opset 13

    def __call__(self, be, x, axes=None):
        raw = list(self.axes_attr) if self.axes_attr is not None else (
            host_ints(axes) if axes is not None else None)
        if raw is None:
            picked = tuple(i for i, s in enumerate(x.shape) if s == 1)
        else:
            picked = tuple(sorted({norm_axis(a, x.ndim, self, "axes") for a in raw}))
            bad = [a for a in picked if x.shape[a] != 1]
            if bad:
                raise self.fail("Squeeze axis does not have extent 1", field="axes",
                                value=raw, remedy=f"input shape is {tuple(x.shape)}")
        shape = tuple(s for i, s in enumerate(x.shape) if i not in picked)
        return (be.xp.reshape(x, shape),)


class Unsqueeze(Kernel):
    host_inputs = frozenset({1})

    def setup(self) -> None:
        self.axes_attr = self.attr("axes")  # before opset 13

    def __call__(self, be, x, axes=None):
        raw = list(self.axes_attr) if self.axes_attr is not None else host_ints(axes)
        rank = x.ndim + len(raw)
        picked = sorted({norm_axis(a, rank, self, "axes") for a in raw})
        if len(picked) != len(raw):
            raise self.fail("Unsqueeze axes repeat", field="axes", value=raw,
                            remedy="list each new axis once")
        dims = list(x.shape)
        for a in picked:
            dims.insert(a, 1)
        return (be.xp.reshape(x, tuple(dims)),)


class Transpose(Kernel):
    def setup(self) -> None:
        perm = self.attr("perm")
        self.perm = None if perm is None else tuple(perm)

    def __call__(self, be, x):
        perm = self.perm if self.perm is not None else tuple(reversed(range(x.ndim)))
        return (be.xp.transpose(x, perm),)


class Concat(Kernel):
    def setup(self) -> None:
        self.axis = self.attr("axis")
        if self.axis is None:
            raise self.fail("Concat needs an axis", field="Concat.axis", value=None,
                            remedy="set the axis attribute")

    def __call__(self, be, *xs):
        axis = norm_axis(self.axis, xs[0].ndim, self)
        return (be.xp.concatenate(xs, axis=axis),)


class Split(Kernel):
    """Sizes from the ``split`` attribute (< 13), input 1 (>= 13), or ``num_outputs`` /
    the output count (even parts; opset 18's uneven last part)."""

    host_inputs = frozenset({1})

    def setup(self) -> None:
        self.axis = self.attr("axis", 0)
        self.split_attr = self.attr("split")
        self.num_outputs = self.attr("num_outputs")

    def sizes(self, extent: int, split) -> list[int]:
        if self.split_attr is not None:
            sizes = list(self.split_attr)
        elif split is not None:
            sizes = host_ints(split)
        else:
            n = self.num_outputs or self.n_outputs
            if self.num_outputs is None and extent % n:
                raise self.fail("axis extent does not divide evenly", field="Split.axis",
                                value=extent, remedy=f"give split sizes for {n} outputs")
            part = -(-extent // n)
            sizes = [min(part, max(extent - i * part, 0)) for i in range(n)]
        if sum(sizes) != extent or len(sizes) != self.n_outputs:
            raise self.fail("split sizes do not match the axis or the outputs",
                            field="split", value=sizes,
                            remedy=f"{self.n_outputs} sizes summing to {extent}")
        return sizes

    def __call__(self, be, x, split=None):
        axis = norm_axis(self.axis, x.ndim, self)
        outs, start = [], 0
        for size in self.sizes(x.shape[axis], split):
            idx = (slice(None),) * axis + (slice(start, start + size),)
            outs.append(x[idx])
            start += size
        return tuple(outs)


class Expand(Kernel):
    host_inputs = frozenset({1})

    def __call__(self, be, x, shape):
        try:
            out = np.broadcast_shapes(tuple(x.shape), tuple(host_ints(shape)))
        except ValueError:
            raise self.fail("Expand shape does not broadcast with the input", field="shape",
                            value=host_ints(shape),
                            remedy=f"input shape is {tuple(x.shape)}") from None
        return (be.xp.broadcast_to(x, out),)


class Range(Kernel):
    """start + i * delta for i < max(ceil((limit - start) / delta), 0).

    Float16/bfloat16 bounds compute in ``stash_type`` when given (Range-27), else in
    float64 like integer-free Python arithmetic, then round to the input type.
    """

    host_inputs = frozenset({0, 1, 2})
    _STASH = {1: np.float32, 11: np.float64}

    def setup(self) -> None:
        stash = self.attr("stash_type")
        if stash is not None and stash not in self._STASH:
            raise self.fail("unsupported stash_type", field="Range.stash_type", value=stash,
                            remedy="use 1 (FLOAT) or 11 (DOUBLE)")
        self.stash = None if stash is None else self._STASH[stash]

    def __call__(self, be, start, limit, delta):
        dtype = np.asarray(start).dtype
        s, lim, d = (np.asarray(v).reshape(()).item() for v in (start, limit, delta))
        if d == 0:
            raise self.fail("Range delta is zero", field="delta", value=d,
                            remedy="use a non-zero step")
        if dtype.kind in "iu":
            n = max(-(-(int(lim) - int(s)) // int(d)), 0)
            values = int(s) + np.arange(n, dtype=np.int64) * int(d)
        else:
            compute = self.stash if (self.stash is not None and dtype.itemsize == 2) else np.float64
            s, d = compute(float(s)), compute(float(d))
            n = max(math.ceil((float(lim) - float(s)) / float(d)), 0)
            values = np.arange(n, dtype=compute) * d + s
        return (be.adopt(values.astype(dtype)),)


class Tile(Kernel):
    host_inputs = frozenset({1})

    def __call__(self, be, x, repeats):
        reps = host_ints(repeats)
        if len(reps) != x.ndim:
            raise self.fail("Tile repeats must give one count per input axis",
                            field="repeats", value=reps, remedy=f"input rank is {x.ndim}")
        return (be.xp.tile(x, tuple(reps)),)
