"""Index-of-extreme ops: ArgMax and ArgMin (int64 results, ties to the first index unless
``select_last_index``)."""
from __future__ import annotations

import numpy as np

from .base import Kernel, norm_axis


class ArgMax(Kernel):
    largest = True

    def setup(self) -> None:
        self.axis = int(self.attr("axis", 0))
        self.keepdims = bool(self.attr("keepdims", 1))
        self.last = bool(self.attr("select_last_index", 0))

    def __call__(self, be, x):
        xp = be.xp
        axis = norm_axis(self.axis, x.ndim, self)
        fn = xp.argmax if self.largest else xp.argmin
        if self.last:  # the first index of the reversed axis is the last of the original
            idx = (x.shape[axis] - 1) - fn(xp.flip(x, axis=axis), axis=axis)
        else:
            idx = fn(x, axis=axis)
        idx = idx.astype(np.int64)
        return (xp.expand_dims(idx, axis) if self.keepdims else idx,)


class ArgMin(ArgMax):
    largest = False
