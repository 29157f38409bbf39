"""The sum's launcher (``kernels/sum_axis.cu``): one thread per output element, a sequential
loop over the reduced extent from +0 (float16 accumulated in float32, rounded once): the
host backend's arithmetic.
"""
from __future__ import annotations

import numpy as np

from engines.errors import ExecutionError
from engines.native.kernel_source import STORAGE_TYPES, instance, instance_for, module
from engines.native.launch.family import LINEAR_BLOCK, KernelFamily, i64

SUM_DTYPES = tuple(STORAGE_TYPES)


class SumKernels(KernelFamily):
    MODULE = module("sum_axis.cu", [instance("sum_axis", d) for d in SUM_DTYPES])

    def sum_axis(self, x, start: int, stop: int, out=None, *, stream):
        """Sum a C-contiguous ``x`` over its consecutive axes ``[start, stop)``, ascending
        along the flattened run; the result has shape ``shape[:start] + shape[stop:]``."""
        self._on_device(x, "x")
        self._require_contiguous(x, "x")
        if not 0 <= start <= stop <= x.ndim:
            raise ExecutionError(f"axes [{start}, {stop}) are not a run of x's {x.ndim} axes",
                                 field="axis", value=(start, stop),
                                 remedy=f"use 0 <= start <= stop <= {x.ndim}")
        name = instance_for("sum_axis", x.dtype, SUM_DTYPES)
        shape = tuple(x.shape)
        outer = int(np.prod(shape[:start], dtype=np.int64))
        length = int(np.prod(shape[start:stop], dtype=np.int64))
        inner = int(np.prod(shape[stop:], dtype=np.int64))
        out = self._out(out, shape[:start] + shape[stop:], x.dtype, stream)
        count = outer * inner
        if count == 0:
            return out
        self._launch(name, (count + LINEAR_BLOCK - 1) // LINEAR_BLOCK, LINEAR_BLOCK,
                     (x, out, i64(outer), i64(length), i64(inner)), stream)
        return out
