"""Op kernels, one module per family, registered in one table keyed by ONNX op type.

Only the default ONNX domain is served. Subgraph ops (If, Loop, Scan) are out of scope.
"""
from __future__ import annotations

from . import cast, elementwise, indexing, matmul, nn, reduction, shape
from .base import Kernel

_FAMILIES = (cast, elementwise, indexing, matmul, nn, reduction, shape)

KERNELS: dict[str, type[Kernel]] = {
    name: obj
    for module in _FAMILIES
    for name, obj in vars(module).items()
    if isinstance(obj, type) and issubclass(obj, Kernel) and not name.startswith("_")
    and obj.__module__ == module.__name__
}

__all__ = ["KERNELS", "Kernel"]
