"""Tensor ops on a CUDA device with CuPy, every write on the engine's stream.

Only the memory-touching primitives are here; the rules are in ``base.py``. Choices:

- Data movement (copy, gather, scatter) works on the bits: float16/bfloat16 are moved as
  uint16, so it is exact and does not depend on CuPy having bfloat16 kernels. CuPy must
  still be able to *hold* a bfloat16 array; if it cannot, adopt/zeros raise
  ``EngineUnavailable`` saying so (CuPy 14 can).
- ``argmax_rows`` is one hand-written kernel (one 1024-thread block per row, NaN skipped, ties
  to the lowest index) writing int32 ids; they come back in ONE synchronous copy of exactly
  ``4 * rows`` bytes on the engine's stream, inside ``sanctioned_readback("token_id")`` and
  recorded ``ledger.record_readback("token_id", 4 * rows)``. An all-NaN row yields -1, which
  the base turns into an ``InputError`` after the (already counted) readback.
- ``gather_rows`` ids: host ids (list, tuple, numpy) are range-checked on the host, then
  adopted (counted). Device ids (a CuPy int array) are NOT range-checked, because that
  would need a readback: their bound is the caller's contract (for example ids produced by
  ``argmax_rows`` over a vocab equal to the table's row count). Out-of-range device ids
  are undefined (CuPy's ``take`` wraps them), so only pass device ids you have bounded.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Any

import numpy as np

from engines.cuda_support import import_cupy, sanctioned_readback
from engines.errors import EngineUnavailable, InputError
from engines.ledger import Ledger
from engines.tensor_ops.base import TensorOps, _int_arg, dtype_name
from engines.tensor_ops.pending import DeviceToken

ARGMAX_BLOCK = 1024  # threads a row: a vocabulary of 49152 is 48 columns a thread
ARGMAX_UNROLL = 8  # columns whose loads a thread issues together

# dtype -> (C type of a stored element, C type of its ordering key, key expression of p[j])
_KERNEL_TYPES: dict[str, tuple[str, str, str]] = {
    "float32": ("float", "float", "p[j]"),
    "float16": ("unsigned short", "float", "lockstep_f16_to_f32(p[j])"),
    "bfloat16": ("unsigned short", "float", "__uint_as_float(((unsigned int)p[j]) << 16)"),
    "int32": ("int", "int", "p[j]"),
    "int64": ("long long", "long long", "p[j]"),
    "bool": ("unsigned char", "int", "(int)p[j]"),
}

# dtypes whose bits the kernels and the movers see as another dtype of the same width
_BITS_AS = {"float16": np.uint16, "bfloat16": np.uint16, "bool": np.uint8}

_SOURCE = r"""
typedef __VALUE__ lk_value;
typedef __KEY__ lk_key;

// IEEE half -> float from the bits, exact (every half is a float); no cuda_fp16.h needed.
__device__ __forceinline__ float lockstep_f16_to_f32(unsigned short h) {
    unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
    unsigned int e = ((unsigned int)h >> 10) & 0x1fu;
    unsigned int m = (unsigned int)h & 0x3ffu;
    unsigned int bits;
    if (e == 0u) {
        float mag = (float)m * 5.9604644775390625e-08f;  // zero or subnormal: m * 2^-24
        bits = __float_as_uint(mag);
    } else if (e == 31u) {
        bits = 0x7f800000u | (m << 13);                  // inf (m == 0) or NaN
    } else {
        bits = ((e + 112u) << 23) | (m << 13);           // normal: rebias 15 -> 127
    }
    return __uint_as_float(bits | sign);
}

__device__ __forceinline__ lk_key lockstep_key(const lk_value* p, long long j) {
    return __LOAD__;
}

// One block of __BLOCK__ threads per row. Thread t scans columns j = t, t + __BLOCK__, ...
// ascending, __UNROLL__ at a time (every load of a group issued before its compares, so a
// row of a vocabulary's width is read in a few round trips, not one per column), keeping the
// first maximum it sees; a tree then keeps (larger value, else lower index). NaN (v != v) is
// skipped; a row with no non-NaN value yields -1. Every scan order and tree gives the same
// answer: the lowest index of the row's largest value. out64, when given, gets the same ids
// as int64 (a next forward's tokens feed, with no cast launched after this kernel).
extern "C" __global__ void lockstep_argmax_rows(const lk_value* __restrict__ x,
                                                long long row_stride, int cols,
                                                int* __restrict__ out,
                                                long long* __restrict__ out64) {
    __shared__ lk_key best_v[__BLOCK__];
    __shared__ int best_i[__BLOCK__];
    const lk_value* p = x + (long long)blockIdx.x * row_stride;
    lk_key bv = (lk_key)0;
    int bi = -1;
    for (long long base = threadIdx.x; base < cols; base += (long long)__BLOCK__ * __UNROLL__) {
        lk_key v[__UNROLL__];
#pragma unroll
        for (int u = 0; u < __UNROLL__; ++u) {
            const long long j = base + (long long)u * __BLOCK__;
            if (j < cols) v[u] = lockstep_key(p, j);
        }
#pragma unroll
        for (int u = 0; u < __UNROLL__; ++u) {
            const long long j = base + (long long)u * __BLOCK__;
            if (j < cols && !(v[u] != v[u]) && (bi < 0 || v[u] > bv)) { bv = v[u]; bi = (int)j; }
        }
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            lk_key ov = best_v[threadIdx.x + s];
            int oi = best_i[threadIdx.x + s];
            lk_key cv = best_v[threadIdx.x];
            int ci = best_i[threadIdx.x];
            if (oi >= 0 && (ci < 0 || ov > cv || (ov == cv && oi < ci))) {
                best_v[threadIdx.x] = ov;
                best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        out[blockIdx.x] = best_i[0];
        if (out64) out64[blockIdx.x] = best_i[0];
    }
}

// Verification: the length of the prefix where the row argmaxes equal the drafts, and the
// argmax of the first row after it (the bonus token), into out[0] and out[1].
extern "C" __global__ void lockstep_accept(const int* __restrict__ best,
                                           const long long* __restrict__ drafts, int width,
                                           int* __restrict__ out) {
    if (blockIdx.x != 0 || threadIdx.x != 0) return;
    int n = 0;
    while (n < width && (long long)best[n] == drafts[n]) n++;
    out[0] = n;
    out[1] = best[n];
}

// Test hook: the ordering key of every element, so the bit decoding can be checked
// against numpy for all 65536 half and bfloat16 patterns.
extern "C" __global__ void lockstep_keys(const lk_value* __restrict__ x, long long n,
                                         lk_key* __restrict__ out) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = lockstep_key(x, i);
}
"""


def kernel_source(name: str) -> str:
    """The CUDA source of the argmax module for a dtype name (host-inspectable)."""
    value, key, load = _KERNEL_TYPES[name]
    return (_SOURCE.replace("__VALUE__", value).replace("__KEY__", key)
            .replace("__LOAD__", load).replace("__BLOCK__", str(ARGMAX_BLOCK))
            .replace("__UNROLL__", str(ARGMAX_UNROLL)))


def kernel_layout(shape: tuple[int, int], strides: tuple[int, int], itemsize: int
                  ) -> tuple[int, bool]:
    """(row stride in elements, usable): whether a 2-D value can be read by the kernel in
    place (unit column stride, row stride a whole number of elements) or needs a copy."""
    rows, cols = shape
    col_ok = cols <= 1 or strides[1] == itemsize
    row_ok = rows <= 1 or strides[0] % itemsize == 0
    row_stride = strides[0] // itemsize if rows > 1 else 0
    return row_stride, col_ok and row_ok


@functools.lru_cache(maxsize=None)
def _module(name: str):
    cp = import_cupy()
    return cp.RawModule(code=kernel_source(name))


class CudaTensorOps(TensorOps):
    """CuPy implementation of ``TensorOps`` on ``device_id``, ordered on ``stream``."""

    supports_device_feed = True

    def __init__(self, ledger: Ledger, stream: Any, device_id: int = 0):
        super().__init__(ledger)
        self.cp = import_cupy()
        dev = _int_arg(device_id, "device_id")
        count = self.cp.cuda.runtime.getDeviceCount()
        if not 0 <= dev < count:
            raise InputError(f"no CUDA device {dev}; {count} present", field="device_id",
                             value=dev, remedy=f"use a device id in [0, {count})")
        if not (hasattr(stream, "ptr") and hasattr(stream, "__enter__")):
            raise InputError(f"stream must be a cupy.cuda.Stream, got {type(stream).__name__}",
                             field="stream", remedy="pass the engine's cupy.cuda.Stream")
        self.device_id = dev
        self.stream = stream
        self.residency = f"cuda:{dev}"
        self._dtype_ok: dict[str, bool] = {}
        self._token_slots_free: list[tuple[Any, Any]] = []  # (pinned word, event) to reuse

    @contextlib.contextmanager
    def on_stream(self):
        """The engine's device and stream current: every CuPy call inside is ordered on it."""
        with self.cp.cuda.Device(self.device_id), self.stream:
            yield

    # -- helpers -----------------------------------------------------------------------------
    def _require_dtype(self, dtype: np.dtype) -> None:
        name = dtype_name(dtype)
        ok = self._dtype_ok.get(name)
        if ok is None:
            try:
                with self.on_stream():
                    self.cp.empty((1,), dtype=dtype)
                ok = True
            except Exception:
                ok = False
            self._dtype_ok[name] = ok
        if not ok:
            raise EngineUnavailable(f"CuPy {self.cp.__version__} cannot hold {name} arrays",
                                    field="dtype", value=name,
                                    remedy="use CuPy >= 14 (pip install 'lockstep[cuda13]') "
                                           "or a float16/float32 package")

    @staticmethod
    def _bits(x):
        as_ = _BITS_AS.get(x.dtype.name)
        return x.view(as_) if as_ is not None else x

    # -- primitives --------------------------------------------------------------------------
    def _adopt(self, host_array: np.ndarray):
        self._require_dtype(host_array.dtype)
        src = np.ascontiguousarray(host_array)
        with self.on_stream():
            out = self.cp.empty(src.shape, dtype=src.dtype)
            out.set(src, stream=self.stream)
        self.ledger.record_adopt(src.nbytes)
        return out

    def _zeros(self, shape: tuple[int, ...], dtype: np.dtype):
        self._require_dtype(dtype)
        with self.on_stream():
            return self.cp.zeros(shape, dtype=dtype)

    def _copy(self, view: Any):
        with self.on_stream():
            return self._bits(view).copy(order="C").view(view.dtype)

    def _prepare_ids(self, ids: Any, rows: int):
        if isinstance(ids, self.cp.ndarray):
            if ids.ndim != 1 or ids.dtype.kind not in "iu":
                raise InputError("device ids must be a 1-D integer array", field="ids",
                                 value=f"{ids.dtype.name}{tuple(ids.shape)}")
            return ids  # bound is the caller's contract (module doc)
        host = self.check_host_ids(ids, rows)
        return host if host.size == 0 else self._adopt(host)

    def _gather(self, table: Any, ids: Any):
        with self.on_stream():
            return self.cp.take(self._bits(table), ids, axis=0).view(table.dtype)

    def _scatter(self, dst: Any, offset: int, src: Any) -> None:
        with self.on_stream():
            self._bits(dst)[..., offset:offset + src.shape[-1]] = self._bits(src)

    def _copy_into(self, dst: Any, src: Any) -> None:
        with self.on_stream():
            self._bits(dst)[...] = self._bits(src)  # device to device, on the stream

    def _row_argmax_on_device(self, logits2d: Any, rows: int, feed: Any = None):
        """int32 [rows] argmaxes left on the device (-1 for an all-NaN row); ``feed``, an
        int64 array of ``rows`` values, gets them too, from the same kernel."""
        name = dtype_name(logits2d.dtype)
        cols = int(logits2d.shape[1])
        if cols >= 2 ** 31:
            raise InputError("rows wider than 2**31 - 1 are not supported", field="logits2d",
                             value=tuple(logits2d.shape))
        fn = _module(name).get_function("lockstep_argmax_rows")
        with self.on_stream():
            x = self._bits(logits2d[:rows])
            row_stride, usable = kernel_layout(x.shape, x.strides, x.itemsize)
            if not usable:
                x = self.cp.ascontiguousarray(x)
                row_stride = cols
            out = self.cp.empty((rows,), dtype=self.cp.int32)
            fn((rows,), (ARGMAX_BLOCK,), (x, np.int64(row_stride), np.int32(cols), out,
                                          np.uint64(0) if feed is None else feed))
        return out

    def _accept(self, logits2d: Any, drafts: np.ndarray) -> tuple[int, int]:
        width = int(drafts.size)
        best = self._row_argmax_on_device(logits2d, width + 1)
        fn = _module(dtype_name(logits2d.dtype)).get_function("lockstep_accept")
        with self.on_stream():
            dev_drafts = (self._adopt(drafts) if width else
                          self.cp.zeros((1,), dtype=self.cp.int64))
            out = self.cp.empty((2,), dtype=self.cp.int32)
            fn((1,), (1,), (best, dev_drafts, np.int32(width), out))
            with sanctioned_readback("accept_count"):
                accepted = out[0:1].get(stream=self.stream)
            with sanctioned_readback("token_id"):
                bonus = out[1:2].get(stream=self.stream)
        self.ledger.record_readback("accept_count", accepted.nbytes)
        self.ledger.record_readback("token_id", bonus.nbytes)
        return int(accepted[0]), int(bonus[0])

    def _argmax_and_feed(self, logits2d: Any) -> tuple[Any, Any]:
        """Row 0's argmax on the device: (int32 [1], the int64 [1, 1] tokens feed), one
        launch writing both."""
        with self.on_stream():
            feed = self.cp.empty((1, 1), dtype=self.cp.int64)
        return self._row_argmax_on_device(logits2d, 1, feed), feed

    def _argmax_feed(self, logits2d: Any) -> tuple[int, Any]:
        """The argmax stays on the device as the next tokens feed (int64 [1, 1]); only its
        4 bytes come back, in one synchronous copy ordered after the kernel."""
        best, feed = self._argmax_and_feed(logits2d)
        with self.on_stream():
            with sanctioned_readback("token_id"):
                host = best.get(stream=self.stream)
        self.ledger.record_readback("token_id", host.nbytes)
        return int(host[0]), feed

    def _argmax_feed_async(self, logits2d: Any):
        """``_argmax_feed`` whose 4-byte copy goes into pinned memory without the host
        waiting: an event recorded behind it is what ``DeviceToken.result()`` waits on. The
        pinned word and the event are reused once their token has been read (a pipelined
        loop holds two at most), so a step allocates neither."""
        best, feed = self._argmax_and_feed(logits2d)
        host, event = self._token_slot()
        with self.on_stream():
            with sanctioned_readback("token_id"):
                best.get(stream=self.stream, out=host, blocking=False)
            event.record(self.stream)
        self.ledger.record_readback("token_id", host.nbytes)
        return DeviceToken(host, event, self._give_token_slot), feed

    def _give_token_slot(self, host, event) -> None:
        self._token_slots_free.append((host, event))

    def _token_slot(self):
        """A pinned int32 [1] and an event no unread token holds (made when none is free)."""
        free = self._token_slots_free
        if free:
            return free.pop()
        import cupyx

        with self.on_stream():
            host = cupyx.empty_pinned((1,), dtype=np.int32)
        return host, self.cp.cuda.Event(disable_timing=True)

    def _audit_rows(self, logits2d: Any) -> np.ndarray:
        """Logits rows read back for an audit decode, accounted as ``logits_audit``."""
        with self.on_stream():
            with sanctioned_readback("logits_audit"):
                host = self._bits(logits2d).get(stream=self.stream).view(logits2d.dtype)
        self.ledger.record_readback("logits_audit", host.nbytes)
        return host

    def _advance_positions(self, positions: Any, step: int):
        with self.on_stream():
            return positions[:, -1:] + np.int64(step)  # a new int64 [1, 1], on the stream

    def _stage(self, v: Any, site: str) -> np.ndarray:
        with self.on_stream():
            host = self._bits(v).get(stream=self.stream).view(v.dtype)  # staging, on purpose
        self.ledger.record_staging(host.nbytes, site)
        return host

    def _argmax(self, logits2d: Any, rows: int) -> list[int]:
        out = self._row_argmax_on_device(logits2d, rows)
        with self.on_stream(), sanctioned_readback("token_id"):
            ids = out.get(stream=self.stream)  # one synchronous copy of 4*rows bytes
        self.ledger.record_readback("token_id", ids.nbytes)
        return [int(i) for i in ids]
