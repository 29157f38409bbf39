"""Activations exporters write as one op: Gelu (both approximations) and Clip."""
from __future__ import annotations

import math

from onnx import helper

from .base import Kernel
from .elementwise import Erf


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
