"""Tensor ops on a CUDA device with CuPy, every write on the engine's stream.

Only the memory-touching primitives are here; the rules are in ``base.py``. Choices:

- Data movement (copy, gather, scatter) works on the bits: float16/bfloat16 are moved as
  uint16, so it is exact and does not depend on CuPy having bfloat16 kernels. CuPy must
  still be able to *hold* a bfloat16 array; if it cannot, adopt/zeros raise
  ``EngineUnavailable`` saying so (CuPy 14 can).
- ``argmax_rows`` is one hand-written kernel (one 1024-thread block per row, read in 16-byte
  runs where the rows start on 16 bytes, NaN skipped, ties to the lowest index) writing int32
  ids; they come back in ONE synchronous copy of exactly
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
from pathlib import Path
from typing import Any

import numpy as np

from engines.cuda_module import CudaModule
from engines.cuda_support import import_cupy, sanctioned_readback
from engines.errors import EngineUnavailable, InputError
from engines.ledger import Ledger
from engines.tensor_ops.base import TensorOps, _int_arg, dtype_name
from engines.tensor_ops.pending import DeviceToken

ARGMAX_BLOCK = 1024  # threads a row: a vocabulary of 49152 is 48 columns a thread
ARGMAX_UNROLL = 8  # columns whose loads a thread issues together
FEED_STAGE_BYTES = 128  # a staged feed's most bytes: 16 int64 positions (decode, verify)

KERNELS = Path(__file__).resolve().parent / "kernels"
ARGMAX_SIZES = (("LK_ARGMAX_BLOCK", ARGMAX_BLOCK), ("LK_ARGMAX_UNROLL", ARGMAX_UNROLL))


def argmax_module(name: str) -> CudaModule:
    """``kernels/argmax.cu`` for one dtype name: its row argmax, the verification's accept and
    the test hook, each instantiated for the dtype's tag ``lk_argmax_<name>``."""
    tag = f"lk_argmax_{name}"
    return CudaModule(KERNELS, "argmax.cu", (f"lockstep_argmax_rows<{tag}>",
                                             f"lockstep_accept_rows<{tag}>",
                                             f"lockstep_keys<{tag}>"), ARGMAX_SIZES)


ARGMAX_MODULES = {name: argmax_module(name)
                  for name in ("float32", "float16", "bfloat16", "int32", "int64", "bool")}

# dtypes whose bits the kernels and the movers see as another dtype of the same width
_BITS_AS = {"float16": np.uint16, "bfloat16": np.uint16, "bool": np.uint8}


def kernel_layout(shape: tuple[int, int], strides: tuple[int, int], itemsize: int
                  ) -> tuple[int, bool]:
    """(row stride in elements, usable): whether a 2-D value can be read by the kernel in
    place (unit column stride, row stride a whole number of elements) or needs a copy."""
    rows, cols = shape
    col_ok = cols <= 1 or strides[1] == itemsize
    row_ok = rows <= 1 or strides[0] % itemsize == 0
    row_stride = strides[0] // itemsize if rows > 1 else 0
    return row_stride, col_ok and row_ok


class CudaTensorOps(TensorOps):
    """CuPy implementation of ``TensorOps`` on ``device_id``, ordered on ``stream``."""

    supports_device_feed = True
    asynchronous_ids = True  # the id's copy is queued behind its argmax (DeviceToken)

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
        self._accept_buffers: dict[str, Any] | None = None  # _accept_scratch's
        self._feed_stages: dict[tuple, tuple] = {}  # _adopt_feeds's, by key and shape

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

    def _argmax_kernel(self, logits2d: Any, instance: int):
        """Instance ``instance`` of the argmax module of the logits' dtype (0: the row
        argmax, 1: the accept), refusing rows wider than the kernels' int32 column index."""
        if int(logits2d.shape[1]) >= 2 ** 31:
            raise InputError("rows wider than 2**31 - 1 are not supported", field="logits2d",
                             value=tuple(logits2d.shape),
                             remedy="split the vocabulary before taking the argmax")
        module = ARGMAX_MODULES[dtype_name(logits2d.dtype)]
        return module.load(self.device_id)[module.instances[instance]]

    @staticmethod
    def _runs_fit(x: Any, row_stride: np.int64) -> bool:
        """Whether every row the argmax kernels read of ``x`` starts on 16 bytes, so they
        read it in 16-byte runs (``lk_block_argmax``'s ``vec``)."""
        data = x.data  # a CuPy array's memory pointer; a host array stands in for one in tests
        address = data.ptr if hasattr(data, "ptr") else x.__array_interface__["data"][0]
        rows = int(x.shape[0])
        return address % 16 == 0 and (rows <= 1 or int(row_stride) * x.itemsize % 16 == 0)

    def _kernel_rows(self, logits2d: Any, rows: int) -> tuple[Any, np.int64, np.int32]:
        """The first ``rows`` rows as the argmax kernels read them (on the stream): their bits,
        the row stride in elements (a contiguous copy where the layout does not allow one)
        and the column count."""
        cols = int(logits2d.shape[1])
        x = self._bits(logits2d[:rows])
        row_stride, usable = kernel_layout(x.shape, x.strides, x.itemsize)
        if not usable:
            x = self.cp.ascontiguousarray(x)
            row_stride = cols
        return x, np.int64(row_stride), np.int32(cols)

    def _row_argmax_on_device(self, logits2d: Any, rows: int, feed: Any = None):
        """int32 [rows] argmaxes left on the device (-1 for an all-NaN row); ``feed``, an
        int64 array of ``rows`` values, gets them too, from the same kernel."""
        fn = self._argmax_kernel(logits2d, 0)
        with self.on_stream():
            x, row_stride, cols = self._kernel_rows(logits2d, rows)
            out = self.cp.empty((rows,), dtype=self.cp.int32)
            fn((rows,), (ARGMAX_BLOCK,), (x, row_stride, cols, out,
                                          np.uint64(0) if feed is None else feed,
                                          np.int32(self._runs_fit(x, row_stride))))
        return out

    def _accept(self, logits2d: Any, drafts: np.ndarray, fed: Any = None,
                head: Any = None) -> tuple[int, int]:
        """One launch (``lockstep_accept_rows``) and one 8-byte read: the count and the bonus
        id come back together into a pinned pair, each recorded under its own purpose. The
        drafts are read where the verification's tokens feed ``fed`` holds them, else adopted.
        With ``head`` the kernel's first block reads that row and the others ``logits2d``'s."""
        width = int(drafts.size)
        rows = width + 1
        own = rows if head is None else width  # the rows read from logits2d
        fn = self._argmax_kernel(logits2d, 1)
        scratch = self._accept_scratch(rows)
        with self.on_stream():
            first = np.uint64(0) if head is None else self._kernel_rows(head, 1)[0]
            x, row_stride, cols = self._kernel_rows(logits2d if own else head, max(own, 1))
            vec = self._runs_fit(x, row_stride) and (head is None
                                                     or self._runs_fit(first, np.int64(0)))
            if fed is not None:  # the pending token first, unless a head row stands for it
                dev_drafts = fed.reshape(-1)[own - width:]
            elif width:
                dev_drafts = self._adopt(drafts)
            else:
                dev_drafts = scratch["no_drafts"]
            fn((rows,), (ARGMAX_BLOCK,), (x, row_stride, cols, first, dev_drafts,
                                          np.int32(width), scratch["best"], scratch["done"],
                                          scratch["out"], np.int32(vec)))
            with sanctioned_readback("accept_count", "token_id"):
                scratch["out"].get(stream=self.stream, out=scratch["host"], blocking=False)
            scratch["event"].record(self.stream)
        scratch["event"].synchronize()
        self.ledger.record_readback("accept_count", 4)
        self.ledger.record_readback("token_id", 4)
        accepted, bonus = scratch["host"]
        return int(accepted), int(bonus)

    def _accept_scratch(self, rows: int) -> dict[str, Any]:
        """The accept's buffers, made once and grown with the rows: each row's argmax, the
        finished-block ticket (zero between launches: the last block resets it), the pair
        on the device and its pinned host copy, and the event the host waits on."""
        scratch = self._accept_buffers
        if scratch is None or scratch["best"].size < rows:
            import cupyx

            with self.on_stream():
                scratch = {"best": self.cp.empty((max(rows, 16),), dtype=self.cp.int32),
                           "done": self.cp.zeros((1,), dtype=self.cp.uint32),
                           "out": self.cp.empty((2,), dtype=self.cp.int32),
                           "no_drafts": self.cp.zeros((1,), dtype=self.cp.int64),
                           "host": cupyx.empty_pinned((2,), dtype=np.int32),
                           "event": self.cp.cuda.Event(disable_timing=True)}
            self._accept_buffers = scratch
        return scratch

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

    def _adopt_feeds(self, arrays: tuple[np.ndarray, ...], key: str) -> tuple:
        """Feeds of one shape and dtype, FEED_STAGE_BYTES or fewer each: written into a
        pinned pair kept for (key, count, shape, dtype) and copied to its device twin in one
        ``memcpyAsync``; the views of the twin are returned (the same ones every call). The
        pinned side is reused once the copy out of it has run (its event); the device side
        is rewritten in stream order, after every forward queued before it has read it."""
        first = arrays[0] if arrays else None
        if (first is None or first.size == 0 or first.nbytes > FEED_STAGE_BYTES
                or any(a.shape != first.shape or a.dtype != first.dtype for a in arrays)):
            return super()._adopt_feeds(arrays, key)
        self._require_dtype(first.dtype)
        stage_key = (key, len(arrays), first.shape, first.dtype.str)
        stage = self._feed_stages.get(stage_key)
        if stage is None:
            import cupyx

            shape = (len(arrays),) + first.shape
            with self.on_stream():
                device = self.cp.empty(shape, dtype=first.dtype)
                stage = (device, cupyx.empty_pinned(shape, dtype=first.dtype),
                         self.cp.cuda.Event(disable_timing=True),
                         tuple(device[i] for i in range(len(arrays))))
            self._feed_stages[stage_key] = stage
        else:
            stage[2].synchronize()  # the last copy out of the pinned side has run
        device, pinned, event, views = stage
        for i, array in enumerate(arrays):
            pinned[i] = array
        runtime = self.cp.cuda.runtime
        with self.cp.cuda.Device(self.device_id):
            runtime.memcpyAsync(device.data.ptr, pinned.ctypes.data, device.nbytes,
                                runtime.memcpyHostToDevice, self.stream.ptr)
            event.record(self.stream)
        for array in arrays:
            self.ledger.record_adopt(array.nbytes)
        return views

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
