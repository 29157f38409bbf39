"""Kernel launches through ``cuLaunchKernel`` with the arguments packed by ``struct``.

An eager forward (a prefill) is a few hundred launches, and each one's host cost is on the
critical path. CuPy's ``Function.__call__`` builds a Python object per argument (a device
array becomes a ``CArray`` with its shape and strides, a scalar a ``CNumpyArray``) before
the driver's launch. Here the arguments are written into one preallocated buffer with a
compiled ``struct.Struct`` (device arrays as their data pointer, numpy scalars at their own
width, a Python int as 64-bit, as CuPy passes it) and the driver reads each parameter
through a fixed table of pointers into that buffer: the driver's own launch and little else.
Measured on the H200's host (run 11): 7.1 us a launch through CuPy's call, 6.0 through this;
the driver's launch is most of both.

The driver copies the parameters when the launch is issued (and a stream capture copies
them into the graph's node), so one buffer per thread and argument format can be rewritten
by the next launch. A call with an argument of any other kind goes through CuPy's own
launch, so nothing changes for it; so does a callable that is not a compiled kernel.
A launcher made with ``dependent=True`` (for modules whose every kernel calls
``lk_grid_wait`` first) launches through ``dependent_launch`` where the device supports it,
except inside ``plain_launches``.
"""
from __future__ import annotations

import contextlib
import ctypes
import struct
import threading
from typing import Any

import numpy as np

from engines.native.dependent_launch import dependent_launch_for

# numpy scalar types and Python ints by struct code: the width CuPy passes each at
_CODES: dict[type, str] = {
    np.int64: "q", np.uint64: "Q", np.int32: "i", np.uint32: "I", np.float32: "f",
    np.float64: "d", np.int16: "h", np.uint16: "H", np.int8: "b", np.uint8: "B", int: "q",
}  # (a bool is not here: CuPy passes it as one byte, and it goes through CuPy)


class _Frame:
    """One argument format's packed buffer and the table of pointers into it."""

    __slots__ = ("pack_into", "buffer", "params")

    def __init__(self, fmt: str):
        layout = struct.Struct("@" + fmt)
        self.pack_into = layout.pack_into
        self.buffer = ctypes.create_string_buffer(max(layout.size, 8))
        base = ctypes.addressof(self.buffer)
        # a zero-count code aligns the offset to that code's type, as C lays out parameters
        offsets = [struct.calcsize("@" + fmt[:i] + "0" + code) for i, code in enumerate(fmt)]
        table = (ctypes.c_void_p * max(len(fmt), 1))(*[base + o for o in offsets])
        self.params = (table, ctypes.addressof(table))


class _Recording(threading.local):
    """The ``step_memo.Recorder`` of this thread's step being recorded, if any."""
    recorder = None


RECORDING = _Recording()


class _Deferring(threading.local):
    """This thread's launch-program deferral (``program_deferral.deferring``), if any, and
    whether a kernel family is allocating (its allocations do not flush the deferral)."""
    deferral = None
    family_allocation = False


DEFERRING = _Deferring()


def family_allocation(allocate, *args, **kwargs):
    """``allocate(*args, **kwargs)`` as a kernel family's (or a step memo's) own allocation:
    it flushes no launch-program deferral. Without a deferral, the call as it is."""
    if DEFERRING.deferral is None:
        return allocate(*args, **kwargs)
    held, DEFERRING.family_allocation = DEFERRING.family_allocation, True
    try:
        return allocate(*args, **kwargs)
    finally:
        DEFERRING.family_allocation = held


def note_allocation(array, stream):
    """``array``, allocated by a kernel family for the step being run: told to the step
    memo recording this thread's step, if one is."""
    recorder = RECORDING.recorder
    if recorder is not None:
        recorder.allocation(array, stream)
    return array


class _Plain(threading.local):
    """Whether this thread's launches are plain for now (``plain_launches``)."""
    active = False


PLAIN = _Plain()


@contextlib.contextmanager
def plain_launches():
    """Launches inside are the driver's plain ones, even from a ``dependent`` launcher.
    native-cuda's verification forwards run so: on the H200, early-started kernels made the
    5-row forward 10% slower (VERIFY replay 1.248 -> 1.373 ms) while the 1-row decode gained
    2.5% (0.892 -> 0.870 ms), run 14."""
    held = PLAIN.active
    PLAIN.active = True
    try:
        yield
    finally:
        PLAIN.active = held


class KernelLauncher:
    """``launch(function, grid, block, args, stream, shared_mem)`` for CuPy ``Function``s:
    the same arguments and effect as ``function(grid, block, args, stream=stream,
    shared_mem=shared_mem)``, with the argument handling done by ``struct``."""

    def __init__(self, cupy, device_id: int | None = None, dependent: bool = False):
        self._ndarray = cupy.ndarray
        self._driver = cupy.cuda.driver
        self._current_stream = cupy.cuda.get_current_stream
        self._local = threading.local()
        self._pointers: dict[Any, int] = {}
        self.dependent = (dependent_launch_for(cupy, device_id)
                          if dependent and device_id is not None else None)

    def _frame(self, fmt: str) -> _Frame:
        frames = getattr(self._local, "frames", None)
        if frames is None:
            frames = self._local.frames = {}
        frame = frames.get(fmt)
        if frame is None:
            frame = frames[fmt] = _Frame(fmt)
        return frame

    def _pointer(self, function) -> int:
        """The ``CUfunction`` of a ``RawKernel`` (its ``kernel``) or of a ``Function``; 0 for
        any other callable (a test's spy, say), which is then called as CuPy's call."""
        ptr = self._pointers.get(function)
        if ptr is None:
            inner = getattr(function, "kernel", function)
            ptr = getattr(inner, "ptr", 0)
            ptr = self._pointers[function] = ptr if type(ptr) is int else 0
        return ptr

    def launch(self, function, grid: tuple, block: tuple, args: tuple, stream,
               shared_mem: int = 0) -> None:
        pointer = self._pointer(function)
        recorder = RECORDING.recorder
        if not pointer:
            if recorder is not None:
                recorder.refuse()
            if DEFERRING.deferral is not None:
                DEFERRING.deferral.flush()
            function(grid, block, args, stream=stream, shared_mem=shared_mem)
            return
        ndarray = self._ndarray
        codes = []
        values = []
        for arg in args:
            kind = type(arg)
            if kind is ndarray:
                codes.append("Q")
                values.append(arg.data.ptr)
                continue
            code = _CODES.get(kind)
            if code is None:  # anything else: CuPy's own argument handling
                if recorder is not None:
                    recorder.refuse()
                if DEFERRING.deferral is not None:
                    DEFERRING.deferral.flush()
                function(grid, block, args, stream=stream, shared_mem=shared_mem)
                return
            codes.append(code)
            values.append(arg)
        gx, gy, gz = (tuple(grid) + (1, 1))[:3]
        bx, by, bz = (tuple(block) + (1, 1))[:3]
        if stream is None:
            stream = self._current_stream()
        fmt = "".join(codes)
        if recorder is not None:
            recorder.launch(self, pointer, (gx, gy, gz), (bx, by, bz), int(shared_mem), stream,
                            fmt, tuple(values), args)
        self.launch_packed(pointer, (gx, gy, gz), (bx, by, bz), fmt, values, stream,
                           int(shared_mem))

    def launch_packed(self, pointer: int, grid: tuple, block: tuple, fmt: str, values,
                      stream, shared_mem: int) -> None:
        """The driver's launch of ``values`` packed as ``fmt`` (device arrays already their
        pointers): what ``launch`` ends with, and what a step memo replays. Inside a
        launch-program deferral the launch is offered to it first (``program_deferral``)."""
        deferral = DEFERRING.deferral
        if deferral is not None and deferral.take(self, pointer, grid, block, fmt, values,
                                                  stream, shared_mem):
            return
        frame = self._frame(fmt)
        frame.pack_into(frame.buffer, 0, *values)
        if self.dependent is not None and not PLAIN.active:
            self.dependent.launch(pointer, grid, block, shared_mem, stream.ptr, frame.params[1])
            return
        self._driver.launchKernel(pointer, grid[0], grid[1], grid[2], block[0], block[1],
                                  block[2], shared_mem, stream.ptr, frame.params[1], 0)

