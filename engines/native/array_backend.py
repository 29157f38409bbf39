"""The array layer the ONNX executor's kernels run on: numpy here, CuPy on a device.

Kernels touch arrays only through ``backend.xp`` (functions numpy and CuPy share, none of
which reads a value back to the host) and through the two reductions below, whose order is
fixed so that batching never changes a bit: every output row of ``matmul`` is computed on
its own with a sequential sum over K, and ``sum`` adds along its axis in index order from
+0, so neither the number of rows nor appended trailing zeros can change a result.
"""
from __future__ import annotations

import functools
from typing import Any, Protocol, runtime_checkable

import numpy as np

from engines.errors import ExecutionError

# Low-precision floats accumulate in float32 (products of two of them are exact there),
# then round once at the end; every other dtype accumulates in itself.
_WIDEN = {np.dtype(np.float16): np.dtype(np.float32)}
try:  # bfloat16 comes from ml_dtypes on the host
    import ml_dtypes

    _WIDEN[np.dtype(ml_dtypes.bfloat16)] = np.dtype(np.float32)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    pass


# a matmul with at most this many outputs, and products, forms its products at once (below
# that, a loop over K costs more in dispatch than in arithmetic)
_SMALL_OUTPUT = 1 << 14
_PRODUCTS = 1 << 22
# elements of the output block the loop over K updates at a time (256 KiB of float32)
_BLOCK = 1 << 16
# the float32 copies of a plan's low-precision constants kept for matmul, in bytes (SmolLM2's
# weights widened: about 540 MB); past it a constant is widened again at every use
WIDENED_BYTES = 1 << 30


@runtime_checkable
class ArrayBackend(Protocol):
    """What a kernel may use: the array module, adoption, and order-fixed reductions."""

    xp: Any
    residency: str

    def adopt(self, host_array: np.ndarray) -> Any:
        """Move a host array to where this backend computes (a contiguous array there)."""

    def matmul(self, a: Any, b: Any) -> Any:
        """ONNX MatMul, batch-invariant: each row on its own, sequential over K."""

    def sum(self, x: Any, axis: int, keepdims: bool = False) -> Any:
        """Sum along one axis in index order starting from +0."""

    def keep_constant(self, value: Any) -> Any:
        """``value`` (adopted) marked as fixed for the plan's life, returned for the plan to
        keep: a backend may cache something per constant (the host's float32 widenings)."""


def matmul_shapes(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple[int, ...]:
    """The ONNX MatMul result shape, or an ExecutionError naming both shapes."""
    if len(a_shape) == 0 or len(b_shape) == 0:
        raise ExecutionError("MatMul needs operands of rank >= 1", field="shapes",
                             value=(a_shape, b_shape), remedy="reshape scalars to [1]")
    a2 = (1,) + a_shape if len(a_shape) == 1 else a_shape
    b2 = b_shape + (1,) if len(b_shape) == 1 else b_shape
    if a2[-1] != b2[-2]:
        raise ExecutionError("MatMul inner dimensions differ", field="shapes",
                             value=(a_shape, b_shape),
                             remedy="the last axis of A must equal the second-to-last of B")
    try:
        batch = np.broadcast_shapes(a2[:-2], b2[:-2])
    except ValueError:
        raise ExecutionError("MatMul batch dimensions do not broadcast", field="shapes",
                             value=(a_shape, b_shape),
                             remedy="make the leading dimensions broadcast-compatible") from None
    out = tuple(batch) + (a2[-2], b2[-1])
    if len(a_shape) == 1:
        out = out[:-2] + out[-1:]
    if len(b_shape) == 1:
        out = out[:-1]
    return out


@functools.lru_cache(maxsize=1024)
def _matmul_layout(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> tuple:
    """``matmul``'s shapes, worked out once a pair (a decode step asks the same few
    thousands of times): the result's shape, the broadcast batch, M, K, N and the count of
    outputs. A bad pair raises ``matmul_shapes``' error every time (errors are not kept)."""
    out_shape = matmul_shapes(a_shape, b_shape)
    a2 = (1,) + a_shape if len(a_shape) == 1 else a_shape
    b2 = b_shape + (1,) if len(b_shape) == 1 else b_shape
    batch = tuple(np.broadcast_shapes(a2[:-2], b2[:-2]))
    m, k, n = a2[-2], a2[-1], b2[-1]
    return out_shape, batch, m, k, n, int(np.prod(batch, dtype=np.int64)) * m * n


class NumpyArrayBackend:
    """The host backend: numpy arrays, sequential fixed-order reductions."""

    residency = "host"

    def __init__(self) -> None:
        self.xp = np
        # id -> [a constant, its float32 widening once made]: the list holds the constant, so
        # its id names it for as long as the entry lives
        self._constants: dict[int, list] = {}
        self._widened_bytes = 0

    def adopt(self, host_array: Any) -> np.ndarray:
        # asarray keeps 0-d arrays 0-d (ascontiguousarray would make them 1-d).
        return np.asarray(host_array, order="C")

    def keep_constant(self, value: np.ndarray) -> np.ndarray:
        """Mark ``value`` as fixed for the plan's life (an initializer, a weight-only fold):
        a float16 or bfloat16 one is widened to float32 once, at its first matmul, and that
        copy is read at every later one (a decode step widened every weight again: 40% of
        a float16 SmolLM2 step), the same values, so the same bits."""
        if value.dtype in _WIDEN:
            self._constants[id(value)] = [value, None]
        return value

    def _widened(self, x: np.ndarray, dtype: np.dtype) -> np.ndarray:
        entry = self._constants.get(id(x))
        if entry is None or entry[0] is not x:
            return x.astype(dtype, copy=False)
        if entry[1] is None:  # every low-precision dtype widens to float32 (_WIDEN)
            wide = x.astype(dtype)
            if self._widened_bytes + wide.nbytes > WIDENED_BYTES:
                return wide
            self._widened_bytes += wide.nbytes
            entry[1] = wide
        return entry[1]

    def matmul(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        xp = self.xp
        out_shape, batch, m, k, n, outputs = _matmul_layout(tuple(a.shape), tuple(b.shape))
        out_dtype = np.result_type(a.dtype, b.dtype)
        acc_dtype = _WIDEN.get(out_dtype, out_dtype)
        a2 = a[None, :] if a.ndim == 1 else a
        b2 = b[:, None] if b.ndim == 1 else b
        a2 = self._widened(a2, acc_dtype)
        b2 = self._widened(b2, acc_dtype)
        acc = None
        if 2 <= n and outputs <= _SMALL_OUTPUT and outputs * k <= _PRODUCTS \
                and _plain(a2, b2):
            # Small outputs (a decode step's GEMVs): every product at once, then summed over K
            # by add.reduce along a non-innermost axis, which numpy does in index order
            # (0 + p0 + p1 + ...; pairwise summation is only used along the innermost axis,
            # hence n >= 2); the leading 0 is added last, where it only turns an
            # all-negative-zero sum's -0 into +0 as 0 + (-0) does first. Bit for bit the loop
            # below (suites/test_array_backend.py), without its dispatch per k. Where two NaNs
            # meet, which one's sign and payload survives depends on the operand order of the
            # vector instructions, so a result holding a NaN is made again by the loop.
            # (C order: a broadcast operand could otherwise lay the products out with K
            # innermost, where the reduction would be pairwise)
            products = np.multiply(a2[..., :, :, None], b2[..., None, :, :], order="C")
            acc = np.add.reduce(products, axis=-2) + acc_dtype.type(0)
            if acc.dtype.kind == "f" and xp.isnan(acc).any():
                acc = None
        if acc is None:
            acc = xp.zeros(batch + (m, n), dtype=acc_dtype)
            # One rank-1 update per k, in order: element (i, j) sees exactly
            # 0 + a[i,0]b[0,j] + a[i,1]b[1,j] + ... whatever the other rows are. Over a block
            # of columns at a time, small enough to stay in cache (a logits head's 49,152
            # columns would otherwise stream through memory once per k).
            rows = max(outputs // max(n, 1), 1)
            width = max(1, min(n, _BLOCK // rows))
            scratch = xp.empty(batch + (m, width), dtype=acc_dtype)
            for j in range(0, n, width):
                block = acc[..., :, j:j + width]
                product = scratch[..., :, :block.shape[-1]]
                for kk in range(k):
                    xp.multiply(a2[..., :, kk:kk + 1], b2[..., kk:kk + 1, j:j + width],
                                out=product)
                    xp.add(block, product, out=block)
        return acc.reshape(out_shape).astype(out_dtype, copy=False)

    def sum(self, x: np.ndarray, axis: int, keepdims: bool = False) -> np.ndarray:
        xp = self.xp
        axis = _norm_axis(axis, x.ndim)
        acc_dtype = _WIDEN.get(x.dtype, x.dtype)
        if x.dtype == np.bool_:
            acc_dtype = np.dtype(np.int64)
        shape = list(x.shape)
        shape[axis] = 1
        acc = None
        if acc_dtype.kind == "f" and 0 < x.size <= _PRODUCTS and _plain(x):
            # The summed axis made the outermost of a contiguous copy with two or more
            # columns (a zero column added where there is one), so add.reduce adds in index
            # order (its pairwise summation only runs along the innermost axis); the leading
            # +0 added last, and a result holding a NaN made again by the loop below, as in
            # matmul.
            moved = xp.moveaxis(x.astype(acc_dtype, copy=False), axis, 0)
            columns = moved.reshape(moved.shape[0], -1)
            if columns.shape[1] < 2:
                columns = xp.concatenate([columns, xp.zeros_like(columns)], axis=1)
            total = np.add.reduce(xp.ascontiguousarray(columns), axis=0) + acc_dtype.type(0)
            if not xp.isnan(total).any():
                acc = total[:int(np.prod(moved.shape[1:], dtype=np.int64))].reshape(shape)
        if acc is None:
            acc = xp.zeros(tuple(shape), dtype=acc_dtype)
            for k in range(x.shape[axis]):
                idx = (slice(None),) * axis + (slice(k, k + 1),)
                acc += x[idx].astype(acc_dtype, copy=False)
        if not keepdims:
            acc = acc.reshape(tuple(s for i, s in enumerate(x.shape) if i != axis))
        out_dtype = acc_dtype if x.dtype == np.bool_ else x.dtype
        return acc.astype(out_dtype, copy=False)


def _plain(*arrays) -> bool:
    """Plain host arrays: the order-fixed fast paths read back whether a NaN appeared, which
    only a host value may be asked (an array standing in for a device value takes the loop)."""
    return all(type(a) is np.ndarray for a in arrays)


def _norm_axis(axis: int, ndim: int) -> int:
    if not -ndim <= axis < max(ndim, 1):
        raise ExecutionError("reduction axis out of range", field="axis", value=axis,
                             remedy=f"use an axis in [-{ndim}, {ndim - 1}]")
    return axis % max(ndim, 1)
