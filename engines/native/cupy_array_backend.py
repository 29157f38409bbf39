"""The executor's array layer on CuPy: one device, one stream, batch-invariant reductions.

Op kernels use ``xp`` (cupy) for elementwise work; ``matmul`` and ``sum`` go to the
hand-written kernels in ``cuda_kernels`` because cuBLAS cannot be captured and its float32
rows change with M. Every method runs inside ``with device, stream:`` so CuPy's own
kernels and allocations are ordered on the engine's stream, and nothing here reads a value
back to the host: shapes and dtypes are array metadata.

Weights: while the engine builds its plans inside ``weight_loading()``, every adopted 2-D
float16/bfloat16/float32 array (optionally only those of the given shapes) also gets a transposed
[N, K] copy on the device, so the GEMV reads it coalesced. ``matmul`` looks the transpose up
by the adopted array's identity; any other 2-D operand is used as it is (a transposed view
directly, else its [K, N] layout), which is slower but gives the same bits.

bfloat16 (``engines/native/bf16.py``): arrays of dtype ``ml_dtypes.bfloat16`` (CuPy 14 holds
them) are never handed to a CuPy routine that would compute on them: copies and transposes
move their ``uint16`` view, ``matmul`` and ``sum`` run the ``lk_bf16`` kernels, and
``bf16_to_float32`` / ``float32_to_bf16`` are the two conversions every other op goes through.
"""
from __future__ import annotations

import contextlib
import math
from typing import Any, Iterable

import numpy as np

from engines.cuda_support import import_cupy
from engines.errors import ExecutionError, ResidencyError
from engines.native.array_backend import _norm_axis, matmul_shapes
from engines.native.bf16 import BF16
from engines.native.cuda_kernels import get_kernels
from engines.native.dtype_names import dtype_name
from engines.native.fused_kernels import get_fused_kernels
from engines.native.kernel_source import instance, module
from engines.native.launch.bmm import MATMUL_DTYPES, MAX_BATCH_AXES
from engines.native.launch.gemv import GEMV_DTYPES, gemv_vectorised
from engines.native.launch.sum_axis import SUM_DTYPES


class CupyArrayBackend:
    """``ArrayBackend`` on CuPy for device ``device_id``, every launch on ``stream``."""

    def __init__(self, stream, ledger, device_id: int = 0, programs: bool = False):
        cupy = import_cupy()
        self.programs = bool(programs)  # fused kernels a launch program runs (forward_programs)
        self.xp = cupy
        self.stream = stream
        self.ledger = ledger
        self.device_id = int(device_id)
        self.residency = f"cuda:{self.device_id}"
        self._device = cupy.cuda.Device(self.device_id)
        self.kernels = get_kernels(self.device_id)  # compiled and loaded now, never mid-forward
        self._casts = CASTS.load(self.device_id)  # the bfloat16 conversions, loaded now
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

    def keep_constant(self, value: Any) -> Any:
        """As adopted: the device's GEMVs read a low-precision weight as it is stored."""
        return value

    def adopt(self, host_array: Any):
        """Copy a host array to the device on the stream; counted once in the ledger."""
        cupy = self.xp
        if isinstance(host_array, cupy.ndarray):
            self._check(host_array, "host_array")
            return host_array  # already here: nothing crosses
        host = np.asarray(host_array)
        if host.dtype.kind not in "biuf" and host.dtype != BF16:
            raise ExecutionError(f"cannot place a {host.dtype} array on {self.residency}",
                                 field="dtype", value=str(host.dtype),
                                 remedy="keep it host-resolved, or use bool, integer, float16, "
                                        "bfloat16, float32 or float64")
        with self._device, self.stream:
            if host.dtype == BF16:  # the bits cross; the array keeps its bfloat16 dtype
                device = cupy.asarray(np.asarray(host, order="C").view(np.uint16)).view(BF16)
            else:
                device = cupy.asarray(host)
            if self._loading and self._wants_transpose(device):
                self._transposed[id(device)] = (device, self.contiguous(device.T))
        self.ledger.record_adopt(host.nbytes)
        return device

    def _wants_transpose(self, device) -> bool:
        if device.ndim != 2 or dtype_name(device.dtype) not in GEMV_DTYPES or min(device.shape) < 2:
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
        if value.data.device_id != self.device_id:  # (value.device builds a Device object)
            raise ResidencyError(f"{what} lives on cuda:{value.device.id}, this backend "
                                 f"computes on {self.residency}", field=what,
                                 value=f"cuda:{value.device.id}",
                                 remedy=f"copy it device-to-device to {self.residency}, or "
                                        f"run it on an engine for cuda:{value.device.id}")

    # -- bfloat16 ----------------------------------------------------------------------------
    def contiguous(self, x):
        """A C-contiguous copy of ``x`` (``x`` itself when it already is), its bits moved."""
        if x.flags.c_contiguous:
            return x
        with self._device, self.stream:
            if x.dtype == BF16:
                return self.xp.ascontiguousarray(x.view(np.uint16)).view(BF16)
            return self.xp.ascontiguousarray(x)

    def bf16_to_float32(self, x):
        """float32 values of a bfloat16 array (exact: the bits become the high half)."""
        return self._convert(x, BF16, np.float32, TO_FLOAT32)

    def float32_to_bf16(self, x):
        """bfloat16 of a float32 array: round to nearest even, NaN kept (as ml_dtypes)."""
        return self._convert(x, np.float32, BF16, TO_BF16)

    def _convert(self, x, src, dst, kernel: str):
        self._check(x, "x")
        if x.dtype != src:
            raise ExecutionError(f"{kernel} converts {np.dtype(src).name}, got {x.dtype.name}",
                                 field="dtype", value=x.dtype.name,
                                 remedy=f"pass a {np.dtype(src).name} array")
        x = self.contiguous(x)
        with self._device, self.stream:
            out = self.xp.empty(x.shape, dtype=dst)
            n = int(x.size)
            if n:
                blocks = (n + _CAST_BLOCK - 1) // _CAST_BLOCK
                self._casts[kernel]((blocks,), (_CAST_BLOCK,), (x, out, np.int64(n)),
                                    stream=self.stream)
        return out

    def _as(self, x, dtype):
        """``x`` as ``dtype`` (itself when it already is); bfloat16 through float32."""
        if x.dtype == dtype:
            return x
        with self._device, self.stream:
            if x.dtype == BF16:
                x = self.bf16_to_float32(x)
                return x if dtype == np.float32 else x.astype(dtype)
            if dtype == BF16:
                return self.float32_to_bf16(x.astype(np.float32, copy=False))
            return x.astype(dtype)

    # -- reductions --------------------------------------------------------------------------
    def matmul(self, a, b):
        """ONNX MatMul. A 2-D ``b`` (a weight) goes to the batched GEMV, anything else to the
        batched kernel; both compute every row alone in a fixed order."""
        self._check(a, "a")
        self._check(b, "b")
        out_shape = matmul_shapes(tuple(a.shape), tuple(b.shape))
        dtype = np.result_type(a.dtype, b.dtype)
        if dtype_name(dtype) not in MATMUL_DTYPES:
            raise ExecutionError(f"MatMul on {self.residency} has no kernel for {dtype.name}",
                                 field="dtype", value=dtype.name,
                                 remedy=f"use one of: {', '.join(MATMUL_DTYPES)}")
        with self._device, self.stream:
            a2 = self._as(a, dtype)
            b2 = self._as(b, dtype)
            a2 = a2[None, :] if a2.ndim == 1 else a2
            b2 = b2[:, None] if b2.ndim == 1 else b2
            if b2.ndim == 2 and dtype_name(dtype) in GEMV_DTYPES:
                out = self._gemv(a2, b2)
            else:
                out = self._bmm(a2, b2)
            return out.reshape(out_shape)

    def _gemv(self, a2, b2):
        k, n = b2.shape
        lead = tuple(a2.shape[:-1])
        rows = math.prod(lead)
        x = self.contiguous(a2).reshape(rows, k)
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
            w, layout = self.contiguous(b2), "kn"
        out = self.kernels.gemv_rows(x, w, stream=self.stream, w_layout=layout)
        return out.reshape(lead + (n,))

    def _bmm(self, a2, b2):
        cupy = self.xp
        batch = tuple(np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2]))
        if len(batch) > MAX_BATCH_AXES:  # rare: materialise the broadcast, merge batch axes
            a2 = self.contiguous(cupy.broadcast_to(a2, batch + a2.shape[-2:]))
            b2 = self.contiguous(cupy.broadcast_to(b2, batch + b2.shape[-2:]))
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
        with self._device, self.stream:
            if x.dtype == np.bool_:
                x = x.astype(np.int64)
            if dtype_name(x.dtype) not in SUM_DTYPES:
                raise ExecutionError(f"sum on {self.residency} has no kernel for {x.dtype.name}",
                                     field="dtype", value=x.dtype.name,
                                     remedy=f"use one of: {', '.join(SUM_DTYPES)}, or bool")
            xc = self.contiguous(x)
            out = self.kernels.sum_axis(xc, axis, axis + 1, stream=self.stream)
            if keepdims:
                out = out.reshape(x.shape[:axis] + (1,) + x.shape[axis + 1:])
            return out

    # -- fused nodes ---------------------------------------------------------------------------
    def matmul_many(self, a, weights):
        """``[matmul(a, w) for w in weights]`` with one launch when every ``w`` is an
        adopted 2-D weight of ``a``'s dtype with a cached transpose (the fusion pass's
        sibling MatMuls: q/k/v, gate/up); each result is bit for bit its own ``matmul``."""
        cached = [self._transposed.get(id(w)) for w in weights]
        if a.ndim >= 2 and dtype_name(a.dtype) in GEMV_DTYPES and all(
                c is not None and c[0] is w and w.dtype == a.dtype
                for c, w in zip(cached, weights)):
            self._check(a, "a")
            k = a.shape[-1]
            lead = tuple(a.shape[:-1])
            x = self.contiguous(a).reshape(math.prod(lead), k)
            ts = [c[1] for c in cached]
            if all(t.shape[1] == k and gemv_vectorised(x, t) for t in ts):
                outs = self.kernels.gemv_many(x, ts, stream=self.stream)
                return [o.reshape(lead + (t.shape[0],)) for o, t in zip(outs, ts)]
        return [self.matmul(a, w) for w in weights]

    def cached_transposes(self, weights, dtype):
        """Each weight's cached [N, K] copy when every one is an adopted 2-D weight of
        ``dtype`` that has one (what a GEMV with a prologue reads), else None."""
        cached = [self._transposed.get(id(w)) for w in weights]
        if all(c is not None and c[0] is w and w.dtype == dtype
               for c, w in zip(cached, weights)):
            return [c[1] for c in cached]
        return None

    def fused_kernels(self):
        """The ``lockstep.fused`` nodes' kernels of this backend's device (each launch names
        ``self.stream``); compiled once per device, the first time a plan with fused nodes
        builds (never mid-forward: a module cannot load inside a capture)."""
        fused = getattr(self, "_fused", None)
        if fused is None:
            fused = self._fused = get_fused_kernels(self.device_id, self.programs)
        return fused

    def loaded_fused_kernels(self):
        """The fused kernels if a plan has compiled them (``fused_kernels``), else None: a
        node outside the fused domain (Gather) uses them only then, so it never loads a
        module mid-forward."""
        return getattr(self, "_fused", None)

    # -- introspection -----------------------------------------------------------------------
    @property
    def transposed_weights(self) -> int:
        """How many adopted weights carry a cached [N, K] copy."""
        return len(self._transposed)

    def release(self) -> None:
        """Drop the cached transposes (the engine's close)."""
        self._transposed.clear()


_CAST_BLOCK = 256
# the bfloat16 conversions (kernels/cast.cu): the bits shifted up, and round to nearest even
TO_FLOAT32 = instance("lk_cast", "bfloat16", "float32")
TO_BF16 = instance("lk_cast", "float32", "bfloat16")
CASTS = module("cast.cu", [TO_FLOAT32, TO_BF16])
