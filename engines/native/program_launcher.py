"""Launch programs on a CUDA device: ``lk_program`` (``kernels/program.cu``) launched
cooperatively, so every persistent block is resident and its grid barrier ends.

The grid is the most blocks the device holds at once for this kernel and the program's
shared memory (the driver's occupancy, times the multiprocessors), capped at the most
blocks any instruction has: a block more has no work. The launch goes through
``cuLaunchKernelEx`` with the cooperative attribute (``dependent_launch``'s entry), so it
can be captured into a CUDA graph like the launches it replaces. A ``DeviceProgram`` holds
the program's table, records and barrier on the device; they must stay alive as long as a
graph that launched them may replay.
"""
from __future__ import annotations

import ctypes
import struct
from dataclasses import dataclass
from typing import Any

from engines.errors import ExecutionError
from engines.native.dependent_launch import DependentLaunch, driver_function
from engines.native.launch_program import LaunchProgram
from engines.native.program_module import PROGRAM_BLOCK, PROGRAM_KERNEL, program_module

_COOPERATIVE = 2  # CUlaunchAttributeID: CU_LAUNCH_ATTRIBUTE_COOPERATIVE
_PARAMS = struct.Struct("@QiQQ")  # lk_program(table, count, records, barrier)


class _CooperativeLaunch(DependentLaunch):
    REMEDY = ("the device or driver refused a cooperative launch (too many blocks for the "
              "device, or no cooperative launch in a capture): run without launch programs, "
              "and report the device and driver")


@dataclass(frozen=True)
class DeviceProgram:
    """A program's arrays on the device, its kernel, and the launch's grid and shared
    memory."""
    table: Any
    records: Any
    barrier: Any
    count: int
    blocks: int
    shared_mem: int
    pointer: int  # the CUfunction of its program module's lk_program


class ProgramLauncher:
    """Uploads and launches ``LaunchProgram``s on ``cuda:device_id``."""

    def __init__(self, cupy, device_id: int = 0, min_blocks: int | None = None):
        self._cupy = cupy
        self.device_id = int(device_id)
        self.min_blocks = min_blocks  # program_module's register cap (None: the compiler's)
        entry = driver_function("cuLaunchKernelEx", [ctypes.c_void_p] * 4)
        occupancy = driver_function("cuOccupancyMaxActiveBlocksPerMultiprocessor",
                                    [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p,
                                     ctypes.c_int, ctypes.c_size_t])
        if entry is None or occupancy is None:
            raise ExecutionError("the CUDA driver has no cuLaunchKernelEx or occupancy query",
                                 field="driver", value="libcuda",
                                 remedy="a CUDA 12 driver or newer, or no launch programs")
        self._occupancy = occupancy
        self._launch = _CooperativeLaunch(entry, _COOPERATIVE)
        self._sms = int(cupy.cuda.Device(self.device_id).attributes["MultiProcessorCount"])
        with cupy.cuda.Device(self.device_id):
            # the programs' own pool: an upload during a deferral must not take a block
            # freed by an operand of a launch still held (it would overwrite it before the
            # program reads it); its blocks stay as long as the programs do
            self._pool = cupy.cuda.MemoryPool()
        self._params = ctypes.create_string_buffer(_PARAMS.size)
        self._table = (ctypes.c_void_p * 4)(*[ctypes.addressof(self._params) + offset
                                              for offset in (0, 8, 16, 24)])

    def kernel(self, ops: tuple[str, ...], shared_mem: int) -> int:
        """``lk_program`` of ``program_module(ops)`` (compiled once per process), allowed
        ``shared_mem`` bytes of dynamic shared memory (beside its static arrays, over the
        48 KB a launch takes without asking): its ``CUfunction``."""
        function = program_module(ops, self.min_blocks).load(self.device_id)[PROGRAM_KERNEL]
        if int(shared_mem) > getattr(function, "max_dynamic_shared_size_bytes", 0):
            function.max_dynamic_shared_size_bytes = int(shared_mem)
        return int(getattr(getattr(function, "kernel", function), "ptr"))

    def resident_blocks(self, pointer: int, shared_mem: int) -> int:
        """How many blocks of the ``lk_program`` at ``pointer`` the device holds at once
        with this shared memory."""
        per_sm = ctypes.c_int(0)
        status = self._occupancy(ctypes.byref(per_sm), pointer, PROGRAM_BLOCK,
                                 int(shared_mem))
        if status or per_sm.value < 1:
            raise ExecutionError(f"no lk_program block fits on cuda:{self.device_id} with "
                                 f"{shared_mem} bytes of shared memory (CUresult {status})",
                                 field="shared_mem", value=int(shared_mem),
                                 remedy="a program whose instructions take less shared memory")
        return per_sm.value * self._sms

    def upload(self, program: LaunchProgram, stream) -> DeviceProgram:
        """``program`` on the device (copied on ``stream``), with its grid."""
        cp = self._cupy
        most = int(program.table[:, 1].max())
        with cp.cuda.Device(self.device_id), stream, cp.cuda.using_allocator(self._pool.malloc):
            table = cp.asarray(program.table)
            records = cp.asarray(program.records)
            barrier = cp.zeros((1,), dtype=cp.uint32)
        pointer = self.kernel(program.ops, program.shared_mem)
        blocks = min(self.resident_blocks(pointer, program.shared_mem), most)
        return DeviceProgram(table, records, barrier, program.count, blocks,
                             program.shared_mem, pointer)

    def launch(self, program: DeviceProgram, stream) -> None:
        """One cooperative launch of ``program`` on ``stream`` (capturable)."""
        _PARAMS.pack_into(self._params, 0, program.table.data.ptr, program.count,
                          program.records.data.ptr, program.barrier.data.ptr)
        self._launch.launch(program.pointer, (program.blocks, 1, 1), (PROGRAM_BLOCK, 1, 1),
                            program.shared_mem, stream.ptr, ctypes.addressof(self._table))
