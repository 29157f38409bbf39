"""Many device-to-device copies in one kernel launch (a graph slot's feeds, every replay).

Why: a replay copies each feed into its static input, and a decode of SmolLM2 feeds 60 kv
cells; one ``memcpyAsync`` each costs several microseconds of host time a step. Here the
whole table of (dst, src, nbytes) travels as the launch's own argument (at most
``MAX_ENTRIES`` a launch, 3 KiB, under the 4 KiB argument limit), so nothing is copied
from the host and nothing is allocated; the argument buffers are built once per table and
reused while the pointers stay the same (a caller feeding back the last replay's outputs).
Each copy moves 16-byte words where both ends allow it, then single bytes: the bytes land
exactly as ``memcpyAsync`` would put them. CuPy is imported lazily.
"""
from __future__ import annotations

import numpy as np

from engines.cuda_module import CudaModule
from engines.errors import ExecutionError
from engines.native.kernel_source import KERNELS

MAX_ENTRIES = 128  # copies per launch: 3 * 8 * 128 bytes of kernel argument
THREADS = 256
MAX_BLOCKS_PER_COPY = 64

KERNEL_NAME = "lk_copy_many"
# kernels/batched_copy.cu, its table sized by MAX_ENTRIES (no float arithmetic: no options)
MODULE = CudaModule(KERNELS, "batched_copy.cu", (KERNEL_NAME,),
                    (("LK_COPY_ENTRIES", MAX_ENTRIES),))


class BatchedCopy:
    """The copy kernel on one device and a launcher that keeps the argument buffers of the
    last few tables it launched (a PRIMARY and a VERIFY slot alternate two)."""

    KEEP_TABLES = 8

    def __init__(self, device_id: int = 0):
        from engines.cuda_support import import_cupy

        self._cupy = import_cupy()
        self.device_id = int(device_id)
        self._function = _kernel_pointer(self.device_id)
        self._tables: dict[tuple, list[tuple]] = {}  # key -> [(params, keep, blocks, count)]
        self.launches = 0  # kernel launches made (what a test counts)
        self.builds = 0  # argument tables built (a changed pointer builds one)

    @staticmethod
    def _build(entries: list[tuple[int, int, int]]) -> list[tuple]:
        built = []
        for at in range(0, len(entries), MAX_ENTRIES):
            part = entries[at:at + MAX_ENTRIES]
            table = np.zeros((3, MAX_ENTRIES), np.uint64)
            table[:, :len(part)] = np.asarray(part, np.uint64).T
            count = np.array([len(part)], np.int32)
            params = np.array([table.ctypes.data, count.ctypes.data], np.uint64)
            widest = max(n for _d, _s, n in part)
            blocks = int(min(MAX_BLOCKS_PER_COPY, max(1, -(-widest // (16 * THREADS)))))
            built.append((params, (table, count), blocks, len(part)))
        return built

    def copy(self, entries: list[tuple[int, int, int]], stream) -> None:
        """Queue every (dst pointer, src pointer, nbytes) copy on ``stream``: one launch
        per ``MAX_ENTRIES`` copies, or, where ranges overlap, one ``memcpyAsync`` each."""
        if not entries:
            return
        key = tuple(entries)
        built = self._tables.pop(key, None)
        if built is None:
            for dst, src, nbytes in entries:
                if nbytes < 0 or not dst or not src:
                    raise ExecutionError(
                        "a batched copy needs two device pointers and a size",
                        field="entries", value=(dst, src, nbytes),
                        remedy="pass (dst.data.ptr, src.data.ptr, src.nbytes)")
            # Overlapping ranges would race in one launch: those go one by one, in order,
            # as memcpyAsync would run them (a slot never feeds its own inputs like this).
            built = self._build(list(entries)) if disjoint(entries) else []
            self.builds += 1
            while len(self._tables) >= self.KEEP_TABLES:
                self._tables.pop(next(iter(self._tables)))
        self._tables[key] = built  # most recent last
        driver = self._cupy.cuda.driver
        with self._cupy.cuda.Device(self.device_id):
            if not built:
                runtime = self._cupy.cuda.runtime
                for dst, src, nbytes in entries:
                    runtime.memcpyAsync(dst, src, nbytes, runtime.memcpyDeviceToDevice,
                                        stream.ptr)
            for params, _keep, blocks, count in built:
                driver.launchKernel(self._function, blocks, count, 1, THREADS, 1, 1, 0,
                                    stream.ptr, int(params.ctypes.data), 0)
                self.launches += 1


def disjoint(entries: list[tuple[int, int, int]]) -> bool:
    """Whether no copy's destination overlaps another copy's source or destination (a
    sweep over the ranges sorted by start)."""
    spans = sorted([(dst, dst + n, i, True) for i, (dst, _s, n) in enumerate(entries) if n]
                   + [(src, src + n, i, False) for i, (_d, src, n) in enumerate(entries) if n])
    active: list[tuple[int, int, bool]] = []  # (end, copy, is_dst) of ranges still open
    for start, end, index, is_dst in spans:
        active = [a for a in active if a[0] > start]
        if any(i != index and (d or is_dst) for _e, i, d in active):
            return False
        active.append((end, index, is_dst))
    return True


def _kernel_pointer(device_id: int) -> int:
    """The loaded kernel's CUfunction on ``device_id``, compiled once per process (when a
    launcher is made, never inside a capture)."""
    kernel = MODULE.load(device_id)[KERNEL_NAME]
    return int(getattr(kernel, "kernel", kernel).ptr)  # RawKernel -> its loaded Function
