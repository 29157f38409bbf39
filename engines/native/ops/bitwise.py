"""Bitwise ops on integer tensors: And, Or, Xor, Not and BitShift. Broadcasting is numpy's,
which is ONNX's multidirectional rule."""
from __future__ import annotations

import numpy as np

from .base import Kernel


class BitwiseAnd(Kernel):
    def __call__(self, be, a, b):
        return (be.xp.bitwise_and(a, b),)


class BitwiseOr(Kernel):
    def __call__(self, be, a, b):
        return (be.xp.bitwise_or(a, b),)


class BitwiseXor(Kernel):
    def __call__(self, be, a, b):
        return (be.xp.bitwise_xor(a, b),)


class BitwiseNot(Kernel):
    def __call__(self, be, x):
        return (be.xp.invert(x),)


class BitShift(Kernel):
    """x << y or x >> y per element (ONNX 1.23's reading, signed types included). A shift
    count outside [0, width) shifts every bit out: 0 to the left; to the right 0, or -1 for
    a negative signed x (its sign fills). A left shift of a signed x wraps as its unsigned
    bits do; a right shift of one is arithmetic."""

    def setup(self) -> None:
        self.direction = self.attr("direction")
        if self.direction not in ("LEFT", "RIGHT"):
            raise self.fail("BitShift needs a direction", field="direction",
                            value=self.direction, remedy='set direction to "LEFT" or "RIGHT"')

    def __call__(self, be, x, y):
        xp = be.xp
        if x.dtype.kind not in "iu":
            raise self.fail("BitShift shifts integers only", field="X.dtype",
                            value=str(x.dtype), remedy="cast to an integer type first")
        x, y = xp.broadcast_arrays(x, y)
        width = x.dtype.itemsize * 8
        inside = (y >= 0) & (y < width)
        count = xp.where(inside, y, 0).astype(x.dtype)
        zero = x.dtype.type(0)
        if self.direction == "RIGHT":
            filled = xp.where(x < zero, x.dtype.type(-1), zero) if x.dtype.kind == "i" else zero
            return (xp.where(inside, xp.right_shift(x, count), filled),)
        bits = np.dtype(f"u{x.dtype.itemsize}")
        shifted = xp.left_shift(x.view(bits), count.view(bits)).view(x.dtype)
        return (xp.where(inside, shifted, zero),)
