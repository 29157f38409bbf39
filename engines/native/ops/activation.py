"""Activations exporters write as one op: Gelu (both approximations), Clip, Softplus, PRelu,
and onnxruntime's FastGelu, BiasGelu and QuickGelu."""
from __future__ import annotations

import math

import numpy as np
from onnx import helper

from .base import Kernel
from .elementwise import Erf, sigmoid


class Gelu(Kernel):
    """x * Phi(x): exact (``approximate="none"``, through the Erf kernel's erf) or the tanh
    form (``approximate="tanh"``)."""

    def setup(self) -> None:
        self.approximate = self.attr("approximate", "none")
        if self.approximate not in ("none", "tanh"):
            raise self.fail("unknown Gelu approximation", field="approximate",
                            value=self.approximate, remedy='use "none" or "tanh"')
        self.erf = Erf(helper.make_node("Erf", ["x"], ["y"]), self.opset)

    def __call__(self, be, x):
        xp = be.xp
        half, one = x.dtype.type(0.5), x.dtype.type(1)
        if self.approximate == "tanh":
            inner = x.dtype.type(math.sqrt(2 / math.pi)) * (x + x.dtype.type(0.044715) * x * x * x)
            return (half * x * (one + xp.tanh(inner)),)
        (erf,) = self.erf(be, x * x.dtype.type(1 / math.sqrt(2)))
        return (half * x * (one + erf),)


class Clip(Kernel):
    """min(max(x, lo), hi); bounds are attributes before opset 11 and optional inputs
    (device values are fine: nothing is read) after. lo > hi gives hi, as ONNX states."""

    def setup(self) -> None:
        self.lo_attr = self.attr("min")
        self.hi_attr = self.attr("max")

    def __call__(self, be, x, lo=None, hi=None):
        xp = be.xp
        if self.opset < 11:
            lo = None if self.lo_attr is None else x.dtype.type(self.lo_attr)
            hi = None if self.hi_attr is None else x.dtype.type(self.hi_attr)
        y = x
        if lo is not None:
            y = xp.maximum(y, lo)
        if hi is not None:
            y = xp.minimum(y, hi)
        return (y,)


class Softplus(Kernel):
    """log(1 + exp(x)) as max(x, 0) + log1p(exp(-|x|)): no overflow for large x."""

    def __call__(self, be, x):
        xp = be.xp
        return (xp.maximum(x, x.dtype.type(0)) + xp.log1p(xp.exp(-xp.abs(x))),)


class PRelu(Kernel):
    """x where x >= 0, slope * x elsewhere; slope broadcasts to x (ONNX's unidirectional
    rule, which numpy's broadcasting covers)."""

    def __call__(self, be, x, slope):
        return (be.xp.where(x < 0, slope * x, x),)


# ---- onnxruntime's com.microsoft activations ------------------------------------------

def _in_float32(x):
    """16-bit inputs compute in float32 and round once, as onnxruntime's CPU kernels do."""
    return x.astype(np.float32) if x.dtype.itemsize < 4 else x


class FastGelu(Kernel):
    """GELU's tanh approximation of (x + bias): 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    domain = "com.microsoft"

    def __call__(self, be, x, bias=None):
        xp = be.xp
        y = _in_float32(x if bias is None else x + bias)
        t = y.dtype.type
        inner = t(math.sqrt(2 / math.pi)) * (y + t(0.044715) * y * y * y)
        return ((t(0.5) * y * (t(1) + xp.tanh(inner))).astype(x.dtype, copy=False),)


class BiasGelu(Kernel):
    """The exact (erf) GELU of A + B, B a bias along the last axis."""

    domain = "com.microsoft"

    def setup(self) -> None:
        self.gelu = Gelu(helper.make_node("Gelu", ["x"], ["y"]), self.opset)

    def __call__(self, be, a, b):
        return self.gelu(be, a + b)


class QuickGelu(Kernel):
    """x * sigmoid(alpha * x), alpha 1.702 unless set."""

    domain = "com.microsoft"

    def setup(self) -> None:
        self.alpha = float(self.attr("alpha", 1.702))

    def __call__(self, be, x):
        y = _in_float32(x)
        return ((y * sigmoid(be.xp, y * y.dtype.type(self.alpha))).astype(x.dtype, copy=False),)
