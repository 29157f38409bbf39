"""SwiGLU's launcher (``kernels/swiglu.cu``): one thread an element, computed in the
compute dtype and rounded as the unfused graph stores it."""
from __future__ import annotations

from engines.native.kernel_source import instance, module
from engines.native.launch.family import LINEAR_BLOCK, KernelFamily, ceil_div, i64
from engines.native.launch.fused_dtypes import every_instance, fused_dtype


class SwigluKernels(KernelFamily):
    MODULE = module("swiglu.cu", every_instance("swiglu", 3))

    def swiglu(self, gate, up, compute_dtype, out_dtype, *, stream):
        self._check(gate, "gate")
        self._check(up, "up")
        name = instance("swiglu", fused_dtype(gate.dtype, "gate"),
                        fused_dtype(compute_dtype, "compute"), fused_dtype(out_dtype, "out"))
        gate, up = self._contiguous(gate, stream), self._contiguous(up, stream)
        out = self._empty(gate.shape, out_dtype, stream)
        if out.size:
            self._launch(name, ceil_div(out.size, LINEAR_BLOCK), LINEAR_BLOCK,
                         (gate, up, out, i64(out.size)), stream)
        return out
