"""CumSum: a running sum along one host-resolved axis (exclusive and reverse forms)."""
from __future__ import annotations

import numpy as np

from .base import Kernel, host_ints, norm_axis


def _running_sum(xp, x, axis: int):
    """x[0], x[0]+x[1], ... along ``axis``, each sum the previous one plus the next element,
    in the input's dtype: numpy's order (``add.accumulate``). On the device it is written
    out as one add per position (the axis length is host metadata), not ``cupy.cumsum``,
    which returned its input unchanged for a negative-axis ONNX case on the H200 (CuPy
    14.2, docs/evidence)."""
    if xp is np:
        return np.cumsum(x, axis=axis, dtype=x.dtype)
    moved = xp.moveaxis(x, axis, -1)
    out = xp.empty_like(moved)
    if moved.shape[-1]:
        out[..., 0] = moved[..., 0]
    for k in range(1, moved.shape[-1]):
        out[..., k] = out[..., k - 1] + moved[..., k]
    return xp.moveaxis(out, -1, axis)


class CumSum(Kernel):
    host_inputs = frozenset({1})

    def setup(self) -> None:
        self.exclusive = bool(self.attr("exclusive", 0))
        self.reverse = bool(self.attr("reverse", 0))

    def __call__(self, be, x, axis_input):
        xp = be.xp
        axes = host_ints(axis_input)
        if len(axes) != 1:
            raise self.fail("CumSum's axis must hold one value", field="axis", value=axes,
                            remedy="pass a scalar (or 1-element) axis")
        axis = norm_axis(axes[0], x.ndim, self)
        y = xp.flip(x, axis=axis) if self.reverse else x
        y = _running_sum(xp, y, axis)
        if self.exclusive:  # shift by one along the axis, a zero first
            lead = [slice(None)] * x.ndim
            lead[axis] = slice(0, x.shape[axis] - 1)
            pad = list(x.shape)
            pad[axis] = 1
            y = xp.concatenate([xp.zeros(tuple(pad), dtype=x.dtype), y[tuple(lead)]], axis=axis)
        return (xp.flip(y, axis=axis) if self.reverse else y,)
