"""MatMul through ``be.matmul``: batch-invariant, every row reduced on its own."""
from __future__ import annotations

from .base import Kernel


class MatMul(Kernel):
    def __call__(self, be, a, b):
        return (be.matmul(a, b),)


class Gemm(Kernel):
    """alpha * A' @ B' + beta * C, A' and B' optionally transposed, C broadcast to [M, N];
    the product through ``be.matmul`` (batch-invariant)."""

    def setup(self) -> None:
        self.alpha = float(self.attr("alpha", 1.0))
        self.beta = float(self.attr("beta", 1.0))
        self.trans_a = bool(self.attr("transA", 0))
        self.trans_b = bool(self.attr("transB", 0))

    def __call__(self, be, a, b, c=None):
        if a.ndim != 2 or b.ndim != 2:
            raise self.fail("Gemm multiplies 2-D matrices", field="A/B.shape",
                            value=(tuple(a.shape), tuple(b.shape)),
                            remedy="use MatMul for batched products")
        a = a.T if self.trans_a else a
        b = b.T if self.trans_b else b
        y = be.matmul(a, b)
        if self.alpha != 1.0:
            y = y * y.dtype.type(self.alpha)
        if c is not None and self.beta != 0.0:
            y = y + (c if self.beta == 1.0 else c * c.dtype.type(self.beta))
        return (y,)
