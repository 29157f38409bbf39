"""Floating-point class tests: IsNaN and IsInf (bool results; torch's exports of masked
softmax guard with IsNaN)."""
from __future__ import annotations

import numpy as np

from .base import Kernel


class IsNaN(Kernel):
    def __call__(self, be, x):
        return (be.xp.isnan(x),)


class IsInf(Kernel):
    """Infinities of the signs ``detect_positive`` / ``detect_negative`` select (both by
    default)."""

    def setup(self) -> None:
        self.positive = bool(self.attr("detect_positive", 1))
        self.negative = bool(self.attr("detect_negative", 1))

    def __call__(self, be, x):
        xp = be.xp
        if x.dtype.kind != "f":
            return (xp.zeros(x.shape, dtype=np.bool_),)
        inf = x.dtype.type(np.inf)
        pos = (x == inf) if self.positive else xp.zeros(x.shape, dtype=np.bool_)
        neg = (x == -inf) if self.negative else xp.zeros(x.shape, dtype=np.bool_)
        return (pos | neg,)
