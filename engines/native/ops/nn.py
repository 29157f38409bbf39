"""Neural-network ops built from elementwise work and ``be.sum`` (fixed order)."""
from __future__ import annotations

import math

from .base import Kernel, norm_axis


def softmax_sum(be, e, axis: int):
    """A softmax's denominator along ``axis``, kept. bfloat16 adds in bfloat16, in index
    order: ONNX computes the softmax in the input type, and its reference rounds every
    addition (a float32 accumulator lands one bfloat16 ulp away). Other dtypes go through
    ``be.sum``. Both orders are fixed, so neither depends on the other rows."""
    if e.dtype.name != "bfloat16":
        return be.sum(e, axis, keepdims=True)
    shape = list(e.shape)
    shape[axis] = 1
    total = be.xp.zeros(tuple(shape), dtype=e.dtype)
    for k in range(e.shape[axis]):
        total = total + e[(slice(None),) * axis + (slice(k, k + 1),)]
    return total


class Softmax(Kernel):
    """exp(x - max) / sum, the sum in fixed order so masked (zero) tails change nothing.

    Opset 13+ normalises along ``axis`` (default -1); earlier opsets flatten the input to
    2-D at ``axis`` (default 1) and normalise each row.
    """

    def setup(self) -> None:
        self.axis = self.attr("axis", -1 if self.opset >= 13 else 1)

    def __call__(self, be, x):
        axis = norm_axis(self.axis, x.ndim, self)
        if self.opset >= 13:
            return (self.along(be, x, axis),)
        flat = be.xp.reshape(x, (math.prod(x.shape[:axis]), math.prod(x.shape[axis:])))
        return (be.xp.reshape(self.along(be, flat, 1), x.shape),)

    @staticmethod
    def along(be, x, axis: int):
        xp = be.xp
        shifted = x - xp.max(x, axis=axis, keepdims=True)
        e = xp.exp(shifted)
        return e / softmax_sum(be, e, axis)


class LogSoftmax(Softmax):
    @staticmethod
    def along(be, x, axis: int):
        xp = be.xp
        shifted = x - xp.max(x, axis=axis, keepdims=True)
        return shifted - xp.log(be.sum(xp.exp(shifted), axis, keepdims=True))
