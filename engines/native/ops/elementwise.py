"""Elementwise ops: one kernel per op, broadcasting as numpy/CuPy broadcast (ONNX's rule)."""
from __future__ import annotations

import functools
import math

import numpy as np

from .base import Kernel


# ---- unary math --------------------------------------------------------------------

class Abs(Kernel):
    def __call__(self, be, x):
        return (be.xp.abs(x),)


class Neg(Kernel):
    def __call__(self, be, x):
        return (be.xp.negative(x),)


class Exp(Kernel):
    def __call__(self, be, x):
        return (be.xp.exp(x),)


class Log(Kernel):
    def __call__(self, be, x):
        return (be.xp.log(x),)


class Sqrt(Kernel):
    def __call__(self, be, x):
        return (be.xp.sqrt(x),)


class Sin(Kernel):
    def __call__(self, be, x):
        return (be.xp.sin(x),)


class Cos(Kernel):
    def __call__(self, be, x):
        return (be.xp.cos(x),)


class Tanh(Kernel):
    def __call__(self, be, x):
        return (be.xp.tanh(x),)


class Ceil(Kernel):
    def __call__(self, be, x):
        return (be.xp.ceil(x),)


class Floor(Kernel):
    def __call__(self, be, x):
        return (be.xp.floor(x),)


class Round(Kernel):
    """Halves round to the even neighbour (numpy's and ONNX's rule)."""

    def __call__(self, be, x):
        return (be.xp.round(x),)


class Sign(Kernel):
    def __call__(self, be, x):
        return (be.xp.sign(x),)


class Reciprocal(Kernel):
    def __call__(self, be, x):
        return (be.xp.reciprocal(x),)


class Relu(Kernel):
    def __call__(self, be, x):
        return (be.xp.maximum(x, x.dtype.type(0)),)


def sigmoid(xp, x):
    """1 / (1 + exp(-x)), split by sign so neither branch overflows to inf/inf."""
    e = xp.exp(-xp.abs(x))
    one = x.dtype.type(1)
    return xp.where(x >= 0, one / (one + e), e / (one + e))


class Sigmoid(Kernel):
    def __call__(self, be, x):
        return (sigmoid(be.xp, x),)


class Erf(Kernel):
    """erf in float64 from xp elementwise ops (neither numpy nor CuPy's core has erf).

    |x| < 3: the Maclaurin series, 60 terms (largest term ~170, so ~1e-14 absolute).
    |x| >= 3: 1 - erfc, erfc by its continued fraction evaluated bottom-up to depth 80.
    Both branches are computed on clipped arguments, so nothing overflows.
    """

    CUT = 3.0
    SERIES_TERMS = 60
    FRACTION_DEPTH = 80

    def __call__(self, be, x):
        xp = be.xp
        x64 = x.astype(np.float64)
        a = xp.clip(x64, -self.CUT, self.CUT)
        a2 = -(a * a)
        power = a.copy()  # (-1)^n a^(2n+1) / n!
        total = a.copy()
        for n in range(1, self.SERIES_TERMS):
            power = power * a2 / n
            total = total + power / (2 * n + 1)
        series = total * (2.0 / math.sqrt(math.pi))
        z = xp.clip(xp.abs(x64), self.CUT, 30.0)
        frac = z.copy()
        for n in range(self.FRACTION_DEPTH, 0, -1):
            frac = z + (n / 2.0) / frac
        tail = xp.sign(x64) * (1.0 - xp.exp(-(z * z)) / (math.sqrt(math.pi) * frac))
        out = xp.where(xp.abs(x64) < self.CUT, series, tail)
        return (out.astype(x.dtype),)


# ---- binary arithmetic -------------------------------------------------------------

class Add(Kernel):
    def __call__(self, be, a, b):
        return (be.xp.add(a, b),)


class Sub(Kernel):
    def __call__(self, be, a, b):
        return (be.xp.subtract(a, b),)


class Mul(Kernel):
    def __call__(self, be, a, b):
        return (be.xp.multiply(a, b),)


class Div(Kernel):
    """True division for floats; integer division truncates toward zero (ONNX, C)."""

    def __call__(self, be, a, b):
        xp = be.xp
        if a.dtype.kind != "i":
            return (xp.floor_divide(a, b) if a.dtype.kind == "u" else xp.divide(a, b),)
        q = xp.floor_divide(a, b)
        inexact = (a - q * b) != 0
        mixed_signs = (a < 0) != (b < 0)
        return (q + (inexact & mixed_signs).astype(q.dtype),)


class Mod(Kernel):
    """fmod=0: the remainder takes the divisor's sign (numpy's mod, for integers and, since
    ONNX 1.23, floats); fmod=1: C's fmod, the dividend's sign."""

    def setup(self) -> None:
        self.fmod = int(self.attr("fmod", 0))
        if self.fmod not in (0, 1):
            raise self.fail("fmod is 0 or 1", field="fmod", value=self.fmod,
                            remedy="use fmod=0 (the divisor's sign) or fmod=1 (C fmod)")

    def __call__(self, be, a, b):
        xp = be.xp
        if self.fmod or a.dtype.kind != "f":
            return ((xp.fmod if self.fmod else xp.mod)(a, b),)
        return (_python_mod(xp, a, b),)


def _python_mod(xp, a, b):
    """The remainder with the divisor's sign for floats, written out as numpy computes it
    (C's fmod, then the divisor added where the signs differ, a zero taking the divisor's
    sign; 16-bit floats in float32, rounded once): CuPy's own float mod gives NaN for an
    infinite divisor, where numpy and ONNX give the dividend or an infinity."""
    wide = xp.float32 if a.dtype.itemsize < 4 else a.dtype
    x, y = a.astype(wide), xp.broadcast_to(b, a.shape if a.ndim >= b.ndim else b.shape)
    y = y.astype(wide)
    r = xp.fmod(x, y)
    r = xp.where((r != 0) & ((r < 0) != (y < 0)), r + y, r)
    r = xp.where(r == 0, xp.copysign(xp.zeros_like(r), y), r)
    return r.astype(a.dtype)


class Pow(Kernel):
    """The result has the base's type; mixed int/float powers compute in float64."""

    def __call__(self, be, a, b):
        xp = be.xp
        ints = a.dtype.kind in "iu" and b.dtype.kind in "iu"
        if ints or a.dtype.kind not in "iu":
            return (xp.power(a, b.astype(a.dtype)),)
        return (xp.power(a.astype(np.float64), b.astype(np.float64)).astype(a.dtype),)


class Max(Kernel):
    def __call__(self, be, *xs):
        return (functools.reduce(be.xp.maximum, xs),)


class Min(Kernel):
    def __call__(self, be, *xs):
        return (functools.reduce(be.xp.minimum, xs),)


# ---- comparisons and logic ---------------------------------------------------------

class Equal(Kernel):
    def __call__(self, be, a, b):
        return (be.xp.equal(a, b).astype(np.bool_),)


class Greater(Kernel):
    def __call__(self, be, a, b):
        return (be.xp.greater(a, b),)


class GreaterOrEqual(Kernel):
    def __call__(self, be, a, b):
        return (be.xp.greater_equal(a, b),)


class Less(Kernel):
    def __call__(self, be, a, b):
        return (be.xp.less(a, b),)


class LessOrEqual(Kernel):
    def __call__(self, be, a, b):
        return (be.xp.less_equal(a, b),)


class And(Kernel):
    def __call__(self, be, a, b):
        return (be.xp.logical_and(a, b),)


class Or(Kernel):
    def __call__(self, be, a, b):
        return (be.xp.logical_or(a, b),)


class Xor(Kernel):
    def __call__(self, be, a, b):
        return (be.xp.logical_xor(a, b),)


class Not(Kernel):
    def __call__(self, be, x):
        return (be.xp.logical_not(x),)
