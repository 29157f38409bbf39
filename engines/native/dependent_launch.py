"""Programmatic dependent launch: a kernel may start before the one ahead of it finishes.

A decode step is about 150 small kernels back to back, each a few microseconds, so each
one's start (its blocks dispatched, its first weight loads in flight) is a large share of
it. On sm_90 and later a launch with ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION``
lets the driver start a kernel while the previous kernel on the stream is still running;
the kernel then waits on the device (``griddepcontrol.wait``, the prelude's
``lk_grid_wait``) until the previous kernel has finished and its writes are visible. The
compiled modules of ``cuda_kernels`` and ``fused_kernels`` call ``lk_grid_wait`` in every
kernel before touching anything another kernel writes (only their weight prefetches come
first), so the results are the serial order's, bit for bit; a kernel launched without the
attribute, or one after a copy, waits as usual.

Launched through the driver's ``cuLaunchKernelEx`` by ``ctypes``: CuPy has no binding for
it. Off where the device is older than sm_90, where the driver lacks the entry point, or
with ``LOCKSTEP_DEPENDENT_LAUNCH=off`` (the A/B switch of the evidence runs).
"""
from __future__ import annotations

import ctypes
import ctypes.util
import struct
import threading

from engines.errors import ExecutionError
from engines.native.env_switch import switch

ENV = "LOCKSTEP_DEPENDENT_LAUNCH"
_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID
# CUlaunchConfig: grid x/y/z, block x/y/z, shared bytes (7 x uint32), the stream (8-byte
# aligned), the attribute array and its count
_CONFIG = struct.Struct("@7I4xQQI4x")
# CUlaunchAttribute: the id (uint32, padded to 8 bytes), then a 64-byte value union whose
# first int is programmaticStreamSerializationAllowed
_ATTRIBUTE = struct.Struct("@I4xi60x")


def requested() -> bool:
    """Whether the environment leaves dependent launches on (``env_switch``; default on)."""
    return switch(ENV)


def driver_function(name: str, argtypes):
    """Entry point ``name`` of the CUDA driver library (returning a CUresult), or None where
    the library or the entry is missing."""
    for library_name in ("libcuda.so.1", ctypes.util.find_library("cuda")):
        if not library_name:
            continue
        try:
            entry = getattr(ctypes.CDLL(library_name), name)
        except (OSError, AttributeError):
            continue
        entry.restype = ctypes.c_int
        entry.argtypes = list(argtypes)
        return entry
    return None


def _driver_entry():
    """``cuLaunchKernelEx`` from the driver library, or None where it is missing."""
    return driver_function("cuLaunchKernelEx", [ctypes.c_void_p] * 4)


class DependentLaunch:
    """``launch(pointer, grid, block, shared_mem, stream_ptr, params)``: one kernel through
    ``cuLaunchKernelEx`` with the programmatic serialization attribute (or another launch
    attribute set to 1: ``attribute``). The config buffer is one per thread: every launch
    rewrites it, and the driver copies it when called."""

    REMEDY = (f"set {ENV}=off to launch without programmatic serialization, and report the "
              "device and driver")

    def __init__(self, entry, attribute: int = _PROGRAMMATIC_STREAM_SERIALIZATION):
        self._entry = entry
        self._attribute = ctypes.create_string_buffer(_ATTRIBUTE.size)
        _ATTRIBUTE.pack_into(self._attribute, 0, attribute, 1)
        self._attribute_ptr = ctypes.addressof(self._attribute)
        self._local = threading.local()

    def _config(self):
        config = getattr(self._local, "config", None)
        if config is None:
            config = self._local.config = ctypes.create_string_buffer(_CONFIG.size)
        return config

    def launch(self, pointer: int, grid: tuple, block: tuple, shared_mem: int, stream_ptr: int,
               params: int) -> None:
        config = self._config()
        _CONFIG.pack_into(config, 0, grid[0], grid[1], grid[2], block[0], block[1], block[2],
                          shared_mem, stream_ptr, self._attribute_ptr, 1)
        status = self._entry(ctypes.addressof(config), pointer, params, None)
        if status:
            raise ExecutionError(f"cuLaunchKernelEx failed with CUresult {status}",
                                 field="launch", value=status, remedy=self.REMEDY)


def dependent_launch_for(cupy, device_id: int) -> DependentLaunch | None:
    """A ``DependentLaunch`` where this device and driver support it and the environment
    leaves it on; None otherwise (launches are then the driver's plain ``cuLaunchKernel``)."""
    if not requested():
        return None
    try:
        major = int(cupy.cuda.Device(device_id).compute_capability) // 10
    except Exception:  # noqa: BLE001 - no device answer: plain launches
        return None
    if major < 9:
        return None
    entry = _driver_entry()
    return DependentLaunch(entry) if entry is not None else None
