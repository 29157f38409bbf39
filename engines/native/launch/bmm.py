"""The batched matmul's launcher (``kernels/bmm.cu``): activation x activation ([..., M, K] @
[..., K, N], broadcasting up to four batch axes, any strides). One thread per output
element, sequential K loop, each product rounded then added: the host backend's arithmetic
exactly, so the two agree bit for bit (the GEMV's lane split cannot; it agrees within the
tolerance table).
"""
from __future__ import annotations

import numpy as np

from engines.errors import ExecutionError
from engines.native.kernel_source import STORAGE_TYPES, instance, instance_for, module
from engines.native.launch.family import LINEAR_BLOCK, KernelFamily, elem_strides, i64

MAX_BATCH_AXES = 4  # batched_matmul broadcasts over at most this many batch axes
MATMUL_DTYPES = tuple(STORAGE_TYPES)


class BmmKernels(KernelFamily):
    MODULE = module("bmm.cu", [instance("bmm", d) for d in MATMUL_DTYPES])

    def batched_matmul(self, a, b, out=None, *, stream):
        """out = a @ b for a [..., M, K], b [..., K, N] with NumPy broadcasting over at most
        four batch axes; any strides (views, transposes, broadcasts) without a copy. The
        output is C-contiguous [*batch, M, N]."""
        self._on_device(a, "a")
        self._on_device(b, "b")
        if a.ndim < 2 or b.ndim < 2:
            raise ExecutionError("batched_matmul takes operands of rank >= 2", field="shape",
                                 value=(tuple(a.shape), tuple(b.shape)),
                                 remedy="add the unit axis of a 1-D operand first")
        if a.dtype != b.dtype:
            raise ExecutionError(f"a is {a.dtype} but b is {b.dtype}", field="dtype",
                                 value=(a.dtype.name, b.dtype.name),
                                 remedy="cast one operand so both share a dtype")
        m, k = a.shape[-2:]
        kb, n = b.shape[-2:]
        if kb != k:
            raise ExecutionError(f"inner extents differ: a has K={k}, b has K={kb}",
                                 field="shape", value=(tuple(a.shape), tuple(b.shape)),
                                 remedy="pass operands with matching inner extents")
        try:
            batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        except ValueError:
            raise ExecutionError("batch axes do not broadcast", field="shape",
                                 value=(tuple(a.shape), tuple(b.shape)),
                                 remedy="give batch axes equal extents or extent 1") from None
        if len(batch) > MAX_BATCH_AXES:
            raise ExecutionError(f"{len(batch)} batch axes; the kernel takes at most "
                                 f"{MAX_BATCH_AXES}", field="shape", value=batch,
                                 remedy="merge batch axes (reshape) before the call")
        name = instance_for("bmm", a.dtype, MATMUL_DTYPES)
        out = self._out(out, batch + (m, n), a.dtype, stream)
        total = int(np.prod(batch, dtype=np.int64)) * m * n
        if total == 0:
            return out

        def batch_strides(array):
            extents = array.shape[:-2]
            strides = elem_strides(array)[:-2]
            pad = len(batch) - len(extents)
            own = [0 if e == 1 else s for e, s in zip(extents, strides)]
            full = [0] * pad + own
            return [0] * (MAX_BATCH_AXES - len(full)) + full

        dims = [1] * (MAX_BATCH_AXES - len(batch)) + list(batch)
        a_b, b_b = batch_strides(a), batch_strides(b)
        a_sm, a_sk = elem_strides(a)[-2:]
        b_sk, b_sn = elem_strides(b)[-2:]
        args = (a, b, out, i64(total), i64(m), i64(n), i64(k),
                i64(dims[1]), i64(dims[2]), i64(dims[3]),
                *map(i64, a_b), i64(a_sm), i64(a_sk),
                *map(i64, b_b), i64(b_sk), i64(b_sn))
        self._launch(name, (total + LINEAR_BLOCK - 1) // LINEAR_BLOCK, LINEAR_BLOCK, args, stream)
        return out
