"""Resident tensor ops: one interface (``TensorOps``), a numpy backend and a CuPy backend.

Importing this package never imports CuPy; ``CudaTensorOps(...)`` does, and raises
``EngineUnavailable`` (with the remedy) where CuPy or a GPU is missing.
"""
from engines.tensor_ops.base import SUPPORTED_DTYPES, TensorOps, dtype_name
from engines.tensor_ops.cuda import CudaTensorOps
from engines.tensor_ops.host import HostTensorOps

__all__ = ["SUPPORTED_DTYPES", "CudaTensorOps", "HostTensorOps", "TensorOps", "dtype_name"]
