"""Hand-written CUDA kernels for the native-cuda executor's array backend: the GEMVs, the
batched matmul and the sum (``engines/native/launch``: ``gemv``, ``bmm``, ``sum_axis``), one
object a device.

Why hand-written: cuBLAS cannot be called inside CUDA stream capture, and its float32 rows
change with the number of rows M (both seen on the H200). Every kernel computes each output
element with one fixed reduction order that depends on nothing but the element's own
operands, so row i of an M-row product is bit-for-bit the M=1 product, and zero terms
appended to a reduction leave its result unchanged. The source is in
``engines/native/kernels``; CuPy is imported lazily, so this module loads on machines
without CUDA.
"""
from __future__ import annotations

from engines.native.kernel_source import instance_for
from engines.native.launch.bmm import MATMUL_DTYPES, BmmKernels
from engines.native.launch.gemv import GEMV_DTYPES, GEMV_KERNELS, GemvKernels
from engines.native.launch.sum_axis import SUM_DTYPES, SumKernels


class CudaKernels(GemvKernels, BmmKernels, SumKernels):
    """The GEMV, batched-matmul and sum modules of one device, and their launchers."""


def kernel_name(family: str, dtype) -> str:
    """A family of this module (``gemv_rows``, ``bmm``, ...) and a dtype -> the instance its
    launcher calls (an ``ExecutionError`` for a dtype it has no kernel for)."""
    supported = dict.fromkeys(GEMV_KERNELS, GEMV_DTYPES) | {"bmm": MATMUL_DTYPES,
                                                            "sum_axis": SUM_DTYPES}
    return instance_for(family, dtype, supported[family])


_COMPILED: dict[int, CudaKernels] = {}


def get_kernels(device_id: int = 0) -> CudaKernels:
    """The compiled kernels for ``device_id``, compiled once per process."""
    kernels = _COMPILED.get(int(device_id))
    if kernels is None:
        kernels = _COMPILED[int(device_id)] = CudaKernels(device_id)
    return kernels
