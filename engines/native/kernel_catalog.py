"""Every CUDA module of the device engines, in one list: what the source checks compile
(``suites/nvcc_check.py``) and what ``scripts/kernel_ptx_compare.py`` compares."""
from __future__ import annotations

from engines.cuda_module import CudaModule
from engines.native.batched_copy import MODULE as COPY
from engines.native.cuda_kernels import CudaKernels
from engines.native.cupy_array_backend import CASTS
from engines.native.fused_kernels import FusedKernels
from engines.native.program_module import decode_ops, program_module
from engines.tensor_ops.cuda import ARGMAX_MODULES


def cuda_modules() -> dict[str, CudaModule]:
    """Each module by a name: its file's stem, and the argmax's dtype after it."""
    modules = {m.file.removesuffix(".cu"): m
               for m in CudaKernels.modules() + FusedKernels.modules() + (CASTS, COPY)}
    modules.update({f"argmax_{name}": m for name, m in ARGMAX_MODULES.items()})
    modules["program"] = program_module(decode_ops("float16"))  # a float16 decode's program
    return modules
