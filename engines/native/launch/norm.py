"""RMSNorm's launchers (``kernels/norm.cu``): one warp a row, the residual add first where
there is one; each row's arithmetic its own (batch-invariant)."""
from __future__ import annotations

import numpy as np

from engines.errors import ExecutionError
from engines.native.kernel_source import instance, module
from engines.native.launch.family import KernelFamily, ceil_div, i64
from engines.native.launch.fused_dtypes import every_instance, fused_dtype

NORM_ROWS_PER_BLOCK = 4  # a norm kernel's block: one warp a row (lk_norm_row)


class NormKernels(KernelFamily):
    MODULE = module("norm.cu", every_instance("add_rms_norm", 3) + every_instance("rms_norm", 2))

    def rms_norm(self, x, gain, eps: float, out_dtype, *, stream):
        """[..., n] rows normalised over n, times gain [n]; the result in ``out_dtype``."""
        self._check(x, "x")
        self._check(gain, "gain")
        n = x.shape[-1]
        if gain.shape != (n,) or gain.dtype != x.dtype:
            raise ExecutionError("RMSNorm's gain must be [n] in x's dtype", field="gain",
                                 value=(tuple(gain.shape), gain.dtype.name),
                                 remedy=f"a {x.dtype.name} gain of shape ({n},)")
        name = instance("rms_norm", fused_dtype(x.dtype, "x"), fused_dtype(out_dtype, "out"))
        x = self._contiguous(x, stream)
        out = self._empty(x.shape, out_dtype, stream)
        rows = x.size // n if n else 0
        if rows:
            self._launch(name, ceil_div(rows, NORM_ROWS_PER_BLOCK), 32 * NORM_ROWS_PER_BLOCK,
                         (x, self._contiguous(gain, stream), out, i64(rows), i64(n),
                          np.float32(eps)), stream)
        return out

    def add_rms_norm(self, residual, delta, gain, eps: float, out_dtype, *, stream):
        """(residual + delta, RMSNorm of it): delta of any float dtype is added in
        residual's dtype; both [..., n]."""
        self._check(residual, "residual")
        self._check(delta, "delta")
        self._check(gain, "gain")
        n = residual.shape[-1]
        if delta.shape != residual.shape or gain.shape != (n,) or gain.dtype != residual.dtype:
            raise ExecutionError("AddRMSNorm's operands do not match", field="delta",
                                 value=(tuple(residual.shape), tuple(delta.shape),
                                        tuple(gain.shape)),
                                 remedy=f"residual and delta of one shape, a gain of ({n},)")
        name = instance("add_rms_norm", fused_dtype(residual.dtype, "residual"),
                        fused_dtype(delta.dtype, "delta"), fused_dtype(out_dtype, "out"))
        residual = self._contiguous(residual, stream)
        delta = self._contiguous(delta, stream)
        total = self._empty(residual.shape, residual.dtype, stream)
        out = self._empty(residual.shape, out_dtype, stream)
        rows = residual.size // n if n else 0
        if rows:
            self._launch(name, ceil_div(rows, NORM_ROWS_PER_BLOCK), 32 * NORM_ROWS_PER_BLOCK,
                         (residual, delta, self._contiguous(gain, stream), total, out,
                          i64(rows), i64(n), np.float32(eps)), stream)
        return total, out
