"""The dtypes the fused nodes' kernels take (``ops/fused.py``): each kernel is instantiated
for every combination of them its node can carry (storage, compute, output)."""
from __future__ import annotations

import itertools

from engines.errors import ExecutionError
from engines.native.dtype_names import dtype_name
from engines.native.kernel_source import instance

FUSED_DTYPES = ("float32", "float16", "bfloat16")


def fused_dtype(dtype, what: str) -> str:
    """``dtype``'s name, or an ``ExecutionError`` where no fused kernel takes it."""
    name = dtype_name(dtype)
    if name not in FUSED_DTYPES:
        raise ExecutionError(f"no fused CUDA kernel for {what} of dtype {name}",
                             field=what, value=name,
                             remedy=f"use one of {', '.join(FUSED_DTYPES)}, or build the plan "
                                    "with fuse=False")
    return name


def every_instance(family: str, dtypes: int) -> list[str]:
    """``family``'s instance for every combination of ``dtypes`` fused dtypes."""
    return [instance(family, *combo)
            for combo in itertools.product(FUSED_DTYPES, repeat=dtypes)]
