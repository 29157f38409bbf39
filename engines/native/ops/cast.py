"""Cast and CastLike over numeric types, low-precision ones through ml_dtypes.

Float8 targets saturate by default (values clip to the largest finite, infinities too);
``saturate=0`` keeps numpy/ml_dtypes overflow (inf or NaN). FLOAT8E8M0 follows the spec's
exponent rounding (``round_mode`` up/down/nearest) with integer bit operations. 4-bit and
2-bit integers and FLOAT4E2M1 convert as ml_dtypes does (the reference's ``astype``).
Strings are not supported: CuPy has no string arrays and no fixture casts strings.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import onnx
from onnx import TensorProto, helper

from .base import Kernel

_FLOAT8_SATURATING = {TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ,
                      TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ}
_STRING = TensorProto.STRING


def _np_dtype(kernel: Kernel, to: int) -> np.dtype:
    if to == _STRING:
        raise kernel.fail("casting to or from STRING is not supported", field="to",
                          value="STRING", remedy="keep strings out of executed graphs")
    try:
        return np.dtype(helper.tensor_dtype_to_np_dtype(to))
    except (KeyError, ValueError, TypeError):
        raise kernel.fail("unknown ONNX element type", field="to", value=to,
                          remedy="use a TensorProto.DataType value") from None


def cast_to(be, x, to: int, dtype: np.dtype, saturate: bool, round_mode: str):
    xp = be.xp
    if x.dtype == object:
        raise ValueError("string inputs are not supported by Cast")
    if to in _FLOAT8_SATURATING and saturate:
        info = _finfo(dtype)
        src = x if x.dtype.kind == "f" else x.astype(np.float32)
        return xp.clip(src, src.dtype.type(info.min), src.dtype.type(info.max)).astype(dtype)
    if to == TensorProto.FLOAT8E8M0:
        return _to_e8m0(xp, x, saturate, round_mode).view(dtype)
    return x.astype(dtype)


def _finfo(dtype: np.dtype):
    return ml_dtypes.finfo(dtype)


def _to_e8m0(xp, x, saturate: bool, round_mode: str):
    """The float32 exponent byte, rounded per ``round_mode``; NaN/inf map to 0xFF."""
    bits = x.astype(np.float32).view(np.uint32)
    exponent = ((bits >> np.uint32(23)) & np.uint32(0xFF)).astype(np.uint16)
    special = exponent == 0xFF
    if round_mode == "up":
        round_up = ((bits & np.uint32(0x7FFFFF)) > 0) & ~special
    elif round_mode == "nearest":
        g = (bits & np.uint32(0x400000)) > 0
        r = (bits & np.uint32(0x200000)) > 0
        s = (bits & np.uint32(0x1FFFFF)) > 0
        round_up = g & (r | s | (exponent > 0)) & ~special
    else:  # "down"
        round_up = xp.zeros(exponent.shape, dtype=np.bool_)
    if saturate:
        round_up = round_up & (exponent != 0xFE)
    exponent = exponent + round_up.astype(np.uint16)
    return xp.where(special, np.uint8(0xFF), exponent.astype(np.uint8))


class Cast(Kernel):
    def setup(self) -> None:
        self.to = self.attr("to")
        if self.to is None:
            raise self.fail("Cast needs a 'to' attribute", field="Cast.to", value=None,
                            remedy="set to= an ONNX element type")
        self.dtype = _np_dtype(self, self.to)
        self.saturate = bool(self.attr("saturate", 1))
        self.round_mode = self.attr("round_mode", "up")
        if self.round_mode not in ("up", "down", "nearest"):
            raise self.fail("unknown round_mode", field="Cast.round_mode",
                            value=self.round_mode, remedy="use up, down or nearest")

    def __call__(self, be, x):
        return (cast_to(be, x, self.to, self.dtype, self.saturate, self.round_mode),)


class CastLike(Kernel):
    def setup(self) -> None:
        self.saturate = bool(self.attr("saturate", 1))
        self.round_mode = self.attr("round_mode", "up")

    def __call__(self, be, x, like):
        dtype = like.dtype
        to = onnx.helper.np_dtype_to_tensor_dtype(dtype)
        return (cast_to(be, x, to, dtype, self.saturate, self.round_mode),)
