"""bfloat16 on a device backend: 16-bit storage, float32 arithmetic, nothing computed on bits.

A bfloat16 value lives on the device as a CuPy array whose dtype is ``ml_dtypes.bfloat16``
(CuPy 14 can hold one; its storage is the 16 bits): the dtype *is* the logical type, so the
plan's feed checks, the state cells and the tensor ops see what the package declares. No
CuPy routine ever computes on such an array. A plan step that touches one goes through
``bf16_call``, which sorts ops into four kinds:

- ``BITS_OPS`` only move elements (Gather, Reshape, Transpose, Concat, Slice, Where, ...):
  they run on the ``uint16`` view and their results are viewed back as bfloat16;
- ``Cast``/``CastLike`` to or from bfloat16 go through the backend's two conversions
  (``bf16_to_float32``: the bits shifted up, exact; ``float32_to_bf16``: round to nearest
  even, NaN kept), other source dtypes through float32 first, as ml_dtypes converts them;
- ``WIDENED_OPS`` are single-rounding ops (comparisons, max/min, add, sub, mul, div, neg,
  abs): computed in float32 and rounded once, which is what ml_dtypes' own ufuncs do on the
  host, so the device result equals native-host's bit for bit;
- MatMul (the backend's GEMV and batched kernels read ``lk_bf16``) and the fusion pass's
  nodes (``fused_kernels``, written against the same storage types) receive the arrays as
  they are.

Any other op on a bfloat16 value is an ``ExecutionError`` naming the op and the remedy.
The host helpers here are the reference the CUDA conversions (``kernels/cast.cu``, the
prelude's ``lk_load``/``lk_store`` for ``lk_bf16``) are tested against.
"""
from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import numpy as np

from engines.dtypes import dtype_of
from engines.errors import ExecutionError
from engines.native.plan import Plan

BF16 = dtype_of("bfloat16")

BITS_OPS = frozenset({"Gather", "Reshape", "Flatten", "Transpose", "Concat", "Slice", "Split",
                      "Where", "Unsqueeze", "Squeeze", "Expand", "Identity", "Tile"})
WIDENED_OPS = frozenset({"Equal", "Greater", "GreaterOrEqual", "Less", "LessOrEqual",
                         "ReduceMax", "ReduceMin", "Max", "Min", "Add", "Sub", "Mul", "Div",
                         "Neg", "Abs"})
# The ONNX MatMul kernel hands bfloat16 operands to ``backend.matmul`` (lk_bf16 kernels).
NATIVE_OPS = frozenset({"MatMul"})
# The fusion pass's nodes (``ops/fused.py``): on a device their kernels are written against
# the storage types (``fused_kernels``), bfloat16 included, so they take the arrays as they are.
FUSED_DOMAINS = frozenset({"lockstep.fused"})


def is_bf16(value: Any) -> bool:
    return getattr(value, "dtype", None) == BF16


# -- host reference of the conversions -------------------------------------------------------
def bits_to_float32(bits: np.ndarray) -> np.ndarray:
    """float32 values of bfloat16 bit patterns (uint16): the bits become the high half."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def float32_to_bits(x: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) of float32 values: round to nearest, ties to even;
    a NaN becomes the quiet NaN with its sign (0x7fc0 / 0xffc0); overflow gives infinity."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    quiet = ((u >> np.uint32(16)) & np.uint32(0x8000)) | np.uint32(0x7FC0)
    return np.where(nan, quiet, rounded).astype(np.uint16)


# -- the plan step -----------------------------------------------------------------------------
def _unsupported(kernel, where: str) -> ExecutionError:
    op = kernel.node.op_type
    return ExecutionError(
        f"{op} has no bfloat16 kernel on {where}; it would compute on the 16-bit storage",
        field=f"{op}.inputs", value="bfloat16",
        remedy=f"cast the value to float32 before the {op} and back after it (the converter's "
               "mixed-precision graphs do), or run the package on native-host")


def _cast(kernel, be, args: Sequence[Any], target: np.dtype):
    from engines.native.ops.cast import cast_to

    x = args[0]
    to = onnx_type(target)
    if is_bf16(x):
        if target == BF16:  # a copy of the bits, as astype copies
            return (be.xp.array(x.view(np.uint16), copy=True).view(BF16),)
        wide = be.bf16_to_float32(x)
        if target == np.float32:
            return (wide,)
        return (cast_to(be, wide, to, target, kernel.saturate, kernel.round_mode),)
    # target is bfloat16: every source goes through float32 first, as ml_dtypes converts
    wide = x if x.dtype == np.float32 else x.astype(np.float32)
    return (be.float32_to_bf16(wide),)


def onnx_type(dtype: np.dtype) -> int:
    from onnx import helper

    return helper.np_dtype_to_tensor_dtype(np.dtype(dtype))


def bf16_call(kernel, be, *args):
    """Run one plan step on a device backend whose bfloat16 values are 16-bit storage (see
    the module doc). Steps that touch no bfloat16 value run as they are."""
    from engines.native.ops.cast import Cast, CastLike

    if isinstance(kernel, Cast) and (kernel.dtype == BF16 or is_bf16(args[0])):
        return _cast(kernel, be, args, kernel.dtype)
    if isinstance(kernel, CastLike) and (is_bf16(args[1]) or is_bf16(args[0])):
        return _cast(kernel, be, args, args[1].dtype)
    if not any(is_bf16(a) for a in args):
        return kernel(be, *args)
    op = kernel.node.op_type
    if op in NATIVE_OPS and kernel.node.domain in ("", "ai.onnx"):
        return kernel(be, *args)
    if kernel.node.domain in FUSED_DOMAINS:
        return kernel(be, *args)
    if kernel.node.domain not in ("", "ai.onnx"):
        raise _unsupported(kernel, be.residency)
    if op in BITS_OPS:
        outs = kernel(be, *(a.view(np.uint16) if is_bf16(a) else a for a in args))
        return tuple(o.view(BF16) if getattr(o, "dtype", None) == np.uint16 else o
                     for o in outs)
    if op in WIDENED_OPS:
        outs = kernel(be, *(be.bf16_to_float32(a) if is_bf16(a) else a for a in args))
        return tuple(be.float32_to_bf16(o) if getattr(o, "dtype", None) == np.float32 else o
                     for o in outs)
    raise _unsupported(kernel, be.residency)


class Bf16Plan(Plan):
    """A ``Plan`` whose backend steps go through ``bf16_call`` (host-resolved steps, shape
    arithmetic on numpy, are untouched). Built by native-cuda for components that declare a
    bfloat16 value; every other component keeps the plain ``Plan``."""

    def _call(self, kernel, be, args, label):  # Plan._call is a staticmethod: same signature
        if be is self.backend:
            return Plan._call(functools.partial(bf16_call, kernel), be, args, label)
        return Plan._call(kernel, be, args, label)


def model_uses_bf16(model) -> bool:
    """Whether a component declares any bfloat16 value: an initializer, a graph input or
    output, a typed intermediate, or a Cast to bfloat16."""
    from onnx import TensorProto

    graph = model.graph
    if any(t.data_type == TensorProto.BFLOAT16 for t in graph.initializer):
        return True
    for v in list(graph.input) + list(graph.output) + list(graph.value_info):
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == TensorProto.BFLOAT16:
            return True
    for node in graph.node:
        for a in node.attribute:
            if node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.BFLOAT16:
                return True
            if a.t.data_type == TensorProto.BFLOAT16:
                return True
    return False


__all__ = ["BF16", "BITS_OPS", "Bf16Plan", "FUSED_DOMAINS", "NATIVE_OPS", "WIDENED_OPS",
           "bf16_call", "bits_to_float32", "float32_to_bits", "is_bf16", "model_uses_bf16"]
