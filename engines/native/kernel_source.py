"""native-cuda's kernel source: the folder of its ``.cu`` files, how they are compiled, and
the C++ storage type each dtype name takes as a template argument.

Every kernel is a template over storage types, instantiated by name: ``rms_norm<float,
lk_half>`` is RMSNorm of float32 rows into float16. ``instance`` builds those names, the
same way for a module's list of instances and for a launch, so the two always agree.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from engines.cuda_module import CudaModule
from engines.errors import ExecutionError
from engines.native.dtype_names import dtype_name

KERNELS = Path(__file__).resolve().parent / "kernels"
# Compiled with --fmad=false: the only fused multiply-adds are the kernels' explicit ones.
COMPILE_OPTIONS = ("--fmad=false",)

# dtype name -> its storage type in the .cu files (prelude.cuh): float16 and bfloat16 are
# raw 16-bit words, converted with PTX cvt, so the source needs no CUDA header
STORAGE_TYPES = {
    "float32": "float",
    "float16": "lk_half",
    "bfloat16": "lk_bf16",
    "float64": "double",
    "int32": "int",
    "int64": "long long",
}


def instance(family: str, *dtypes: str) -> str:
    """The name expression of ``family``'s instance for these dtype names, in the order of
    its template parameters: ``instance("attention", "float16", "float32")`` is
    ``attention<lk_half, float>``."""
    return f"{family}<{', '.join(STORAGE_TYPES[d] for d in dtypes)}>"


def instance_for(family: str, dtype: Any, supported: Iterable[str]) -> str:
    """``family``'s instance for one dtype, or an ``ExecutionError`` naming the dtypes it
    has kernels for."""
    name = dtype_name(dtype)
    if name not in supported:
        raise ExecutionError(f"{family} has no CUDA kernel for dtype {name}", field="dtype",
                             value=name, remedy=f"use one of: {', '.join(supported)}")
    return instance(family, name)


def module(file: str, instances: Iterable[str],
           defines: Mapping[str, int] | None = None) -> CudaModule:
    """A .cu file of ``KERNELS`` with the instances its launcher calls and its sizes."""
    return CudaModule(KERNELS, file, tuple(instances), tuple((defines or {}).items()),
                      COMPILE_OPTIONS)
