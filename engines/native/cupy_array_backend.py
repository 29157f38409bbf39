"""The executor's array layer on CuPy: one device, one stream, batch-invariant reductions.

Op kernels use ``xp`` (cupy) for elementwise work; ``matmul`` and ``sum`` go to the
hand-written kernels in ``cuda_kernels`` because cuBLAS cannot be captured and its float32
rows change with M. Every method runs inside ``with device, stream:`` so CuPy's own
kernels and allocations are ordered on the engine's stream, and nothing here reads a value
back to the host: shapes and dtypes are array metadata.

Weights: while the engine builds its plans inside ``weight_loading()``, every adopted 2-D
float16/float32 array (optionally only those of the given shapes) also gets a transposed
[N, K] copy on the device, so the GEMV reads it coalesced. ``matmul`` looks the transpose up
by the adopted array's identity; any other 2-D operand is used as it is (a transposed view
directly, else its [K, N] layout), which is slower but gives the same bits.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Iterable

import numpy as np

from engines.errors import ExecutionError, ResidencyError
from engines.native.array_backend import _norm_axis, matmul_shapes
from engines.native.cuda_kernels import GEMV_DTYPES, MATMUL_DTYPES, MAX_BATCH_AXES, SUM_DTYPES, get_kernels


class CupyArrayBackend:
    """``ArrayBackend`` on CuPy for device ``device_id``, every launch on ``stream``."""

    def __init__(self, stream, ledger, device_id: int = 0):
        from engines.cuda_support import import_cupy

        cupy = import_cupy()
        self.xp = cupy
        self.stream = stream
        self.ledger = ledger
        self.device_id = int(device_id)
        self.residency = f"cuda:{self.device_id}"
        self._device = cupy.cuda.Device(self.device_id)
        self.kernels = get_kernels(self.device_id)  # compiled and loaded now, never mid-forward
        # id(adopted weight) -> (the weight, its C-contiguous [N, K] transpose); the entry
        # holds the weight so its id cannot be reused while cached.
        self._transposed: dict[int, tuple[Any, Any]] = {}
        self._loading = False
        self._loading_shapes: set[tuple[int, int]] | None = None

    # -- placement ---------------------------------------------------------------------------
    @contextlib.contextmanager
    def weight_loading(self, shapes: Iterable[tuple[int, int]] | None = None):
        """Within this block, adopted 2-D float weights also get a cached [N, K] transpose
        (only those whose shape is in ``shapes``, when given: the MatMul B initializers)."""
        self._loading = True
        self._loading_shapes = None if shapes is None else {tuple(s) for s in shapes}
        try:
            yield self
        finally:
            self._loading = False
            self._loading_shapes = None

    def adopt(self, host_array: Any):
        """Copy a host array to the device on the stream; counted once in the ledger."""
        cupy = self.xp
        if isinstance(host_array, cupy.ndarray):
            self._check(host_array, "host_array")
            return host_array  # already here: nothing crosses
        host = np.asarray(host_array)
        if host.dtype.kind not in "biuf":
            raise ExecutionError(f"cannot place a {host.dtype} array on {self.residency}",
                                 field="dtype", value=str(host.dtype),
                                 remedy="keep it host-resolved, or use bool, integer, float16, "
                                        "float32 or float64 (CuPy has no bfloat16)")
        with self._device, self.stream:
            device = cupy.asarray(host)
            if self._loading and self._wants_transpose(device):
                self._transposed[id(device)] = (device, cupy.ascontiguousarray(device.T))
        self.ledger.record_adopt(host.nbytes)
        return device

    def _wants_transpose(self, device) -> bool:
        if device.ndim != 2 or device.dtype.name not in GEMV_DTYPES or min(device.shape) < 2:
            return False
        return self._loading_shapes is None or tuple(device.shape) in self._loading_shapes

    def _check(self, value, what: str) -> None:
        cupy = self.xp
        if not isinstance(value, cupy.ndarray):
            raise ResidencyError(f"{what} is a host {type(value).__name__}; this backend "
                                 f"computes on {self.residency}", field=what,
                                 value=type(value).__name__,
                                 remedy="adopt it once (backend.adopt at plan build, or "
                                        "tensor_ops.adopt for feeds), or keep the op host-resolved")
        if value.device.id != self.device_id:
            raise ResidencyError(f"{what} lives on cuda:{value.device.id}, this backend "
                                 f"computes on {self.residency}", field=what,
                                 value=f"cuda:{value.device.id}",
                                 remedy=f"copy it device-to-device to {self.residency}, or "
                                        f"run it on an engine for cuda:{value.device.id}")

    # -- reductions --------------------------------------------------------------------------
    def matmul(self, a, b):
        """ONNX MatMul. A 2-D ``b`` (a weight) goes to the batched GEMV, anything else to the
        batched kernel; both compute every row alone in a fixed order."""
        self._check(a, "a")
        self._check(b, "b")
        out_shape = matmul_shapes(tuple(a.shape), tuple(b.shape))
        dtype = np.result_type(a.dtype, b.dtype)
        if dtype.name not in MATMUL_DTYPES:
            raise ExecutionError(f"MatMul on {self.residency} has no kernel for {dtype.name}",
                                 field="dtype", value=dtype.name,
                                 remedy=f"use one of: {', '.join(MATMUL_DTYPES)}")
        with self._device, self.stream:
            a2 = a.astype(dtype, copy=False)
            b2 = b.astype(dtype, copy=False)
            a2 = a2[None, :] if a2.ndim == 1 else a2
            b2 = b2[:, None] if b2.ndim == 1 else b2
            if b2.ndim == 2 and dtype.name in GEMV_DTYPES:
                out = self._gemv(a2, b2)
            else:
                out = self._bmm(a2, b2)
            return out.reshape(out_shape)

    def _gemv(self, a2, b2):
        cupy = self.xp
        k, n = b2.shape
        lead = tuple(a2.shape[:-1])
        rows = math.prod(lead)
        x = cupy.ascontiguousarray(a2).reshape(rows, k)
        # An adopted weight itself (not a cast or view of it): its cached transpose. The cache
        # holds its weights alive, so a live b2 with a cached id is that weight.
        cached = self._transposed.get(id(b2))
        if cached is not None and cached[0] is b2:
            w, layout = cached[1], "nk"
        elif b2.flags.c_contiguous:
            w, layout = b2, "kn"
        elif b2.flags.f_contiguous:
            w, layout = b2.T, "nk"  # a transposed view of an [N, K] array: use it as is
        else:
            w, layout = cupy.ascontiguousarray(b2), "kn"
        out = self.kernels.gemv_rows(x, w, stream=self.stream, w_layout=layout)
        return out.reshape(lead + (n,))

    def _bmm(self, a2, b2):
        cupy = self.xp
        batch = tuple(np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
        if len(batch) > MAX_BATCH_AXES:  # rare: materialise the broadcast, merge batch axes
            a2 = cupy.ascontiguousarray(cupy.broadcast_to(a2, batch + a2.shape[-2:]))
            b2 = cupy.ascontiguousarray(cupy.broadcast_to(b2, batch + b2.shape[-2:]))
            a2 = a2.reshape((math.prod(batch),) + a2.shape[-2:])
            b2 = b2.reshape((math.prod(batch),) + b2.shape[-2:])
            out = self.kernels.batched_matmul(a2, b2, stream=self.stream)
            return out.reshape(batch + out.shape[-2:])
        return self.kernels.batched_matmul(a2, b2, stream=self.stream)

    def sum(self, x, axis: int, keepdims: bool = False):
        """Sum along one axis in index order from +0 (float16 accumulated in float32, bool
        counted in int64): the host backend's arithmetic, bit for bit."""
        self._check(x, "x")
        axis = _norm_axis(axis, x.ndim)
        if x.ndim == 0:
            raise ExecutionError("cannot sum a 0-d value along an axis", field="axis",
                                 value=axis, remedy="reshape it to [1] first")
        cupy = self.xp
        with self._device, self.stream:
            if x.dtype == np.bool_:
                x = x.astype(np.int64)
            if x.dtype.name not in SUM_DTYPES:
                raise ExecutionError(f"sum on {self.residency} has no kernel for {x.dtype.name}",
                                     field="dtype", value=x.dtype.name,
                                     remedy=f"use one of: {', '.join(SUM_DTYPES)}, or bool")
            xc = cupy.ascontiguousarray(x)
            out = self.kernels.sum_axis(xc, axis, axis + 1, stream=self.stream)
            if keepdims:
                out = out.reshape(x.shape[:axis] + (1,) + x.shape[axis + 1:])
            return out

    # -- introspection -----------------------------------------------------------------------
    @property
    def transposed_weights(self) -> int:
        """How many adopted weights carry a cached [N, K] copy."""
        return len(self._transposed)

    def release(self) -> None:
        """Drop the cached transposes (the engine's close)."""
        self._transposed.clear()
