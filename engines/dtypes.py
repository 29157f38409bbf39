"""Dtype names as the package format writes them, to numpy dtypes.

Below the workflow so that backends (``ort-cuda``'s bfloat16 bindings), the oracle and the
interpreter's state cells all read dtype names the same way without importing each other.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np


def dtype_of(name: str) -> np.dtype:
    """The numpy dtype of a package dtype name (``bfloat16`` through ``ml_dtypes``)."""
    if name == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


__all__ = ["dtype_of"]
