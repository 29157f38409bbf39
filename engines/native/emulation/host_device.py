"""native-cuda's launchers over the CPU emulator: the kernel families (``FusedKernels``,
``CudaKernels``) with numpy arrays for device memory, so a test calls the very launcher a
forward calls (its checks, its grid, its arguments) and the very kernel, without a GPU.

``EmulatedArray`` is a numpy array that answers ``.data.ptr`` as a CuPy array does (the
launchers test alignment with it); ``emulated(Family)`` is the family with its modules
compiled by ``cpu_module`` and its launches run there, in ascending or descending order of
threads and blocks, or written down (``record=``: a launch program's instructions), and
``run_program`` runs such a program as one cooperative launch.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import numpy as np

from engines.errors import ResidencyError
from engines.native.kernel_launch import DEFERRING
from engines.native.emulation.cpu_module import CpuModule, pointer
from engines.native.launch_program import Launch, LaunchProgram
from engines.native.program_module import PROGRAM_BLOCK, PROGRAM_KERNEL, program_module

# the emulator's parameter codes -> struct's, as the GPU launcher packs them
_STRUCT = {"p": "Q", "q": "q", "i": "i", "I": "I", "f": "f", "d": "d"}


@dataclass(frozen=True)
class _Memory:
    ptr: int
    device_id: int = 0


class EmulatedArray(np.ndarray):
    """A numpy array standing for device memory on the emulator."""

    @property
    def data(self):  # CuPy's MemoryPointer, as far as the launchers read it
        return _Memory(self.ctypes.data)


def to_device(array) -> EmulatedArray:
    """A C-contiguous copy of ``array`` in the emulator's memory."""
    return np.array(array, order="C", copy=True).view(EmulatedArray)


def to_host(array) -> np.ndarray:
    """A plain numpy copy of an emulator array."""
    return np.asarray(array).view(np.ndarray).copy()


class _NumpyAsCupy:
    """What a launcher asks of ``self._cupy`` (broadcasting), answered with numpy."""
    ndarray = EmulatedArray

    @staticmethod
    def broadcast_to(array, shape):
        return np.broadcast_to(array, shape, subok=True)


def _packed(function, args) -> tuple[str, tuple]:
    """(struct codes, values) of a launch's arguments as the GPU launcher packs them."""
    return ("".join(_STRUCT[code] for code in function.codes),
            tuple(pointer(a) if code == "p" else a for code, a in zip(function.codes, args)))


class _Launcher:
    """``KernelLauncher``'s two entries on the emulator: ``launch`` packs the arguments as the
    driver reads them (a kernel's "pointer" is its ``CpuKernel.ptr``) and goes through
    ``launch_packed``, which a launch-program deferral sees first, as on the GPU."""

    def __init__(self, functions: dict):
        self.by_pointer = {f.ptr: f for f in functions.values()}
        self._alive: list = []  # the operands of launches a deferral holds

    def launch(self, function, grid, block, args, stream, shared_mem: int = 0) -> None:
        fmt, values = _packed(function, args)
        if DEFERRING.deferral is not None:
            self._alive.append(args)
        self.launch_packed(function.ptr, grid, block, fmt, values, stream, shared_mem)

    def launch_packed(self, ptr: int, grid, block, fmt: str, values, stream,
                      shared_mem: int) -> None:
        deferral = DEFERRING.deferral
        if deferral is not None and deferral.take(self, ptr, grid, block, fmt, values,
                                                  stream, shared_mem):
            return
        self.by_pointer[ptr](grid, block, list(values), shared_mem=shared_mem)


class EmulatedPrograms:
    """A ``ProgramLauncher`` on the emulator: uploading is nothing, launching runs the
    program on ``blocks`` persistent blocks."""

    def __init__(self, blocks: int = 3, descending: bool = False):
        self.blocks, self.descending = blocks, descending

    def upload(self, program: LaunchProgram, stream) -> LaunchProgram:
        return program

    def launch(self, program: LaunchProgram, stream) -> None:
        run_program(program, self.blocks, descending=self.descending)


class _HostAllocators:
    """The allocator switch ``deferring`` wraps; numpy never calls it."""

    class cuda:  # noqa: N801 - stands where ``cupy.cuda`` is read
        @staticmethod
        def get_allocator():
            return None

        @staticmethod
        @contextlib.contextmanager
        def using_allocator(allocator):
            yield


HOST_ALLOCATORS = _HostAllocators()  # ``deferring(deferral, HOST_ALLOCATORS)`` on the emulator


class _NoSideStream:
    """The side stream a deferral uploads on: the emulator has nothing to wait for."""

    @staticmethod
    def synchronize() -> None:
        pass


NO_SIDE_STREAM = _NoSideStream()


class _Recorder:
    """Launches written down (``launch_program.Launch``), not run: a program's instructions."""

    def __init__(self, launches: list):
        self.launches = launches

    def launch(self, function, grid, block, args, stream, shared_mem: int = 0) -> None:
        fmt, values = _packed(function, args)
        self.launches.append(Launch(function.name, tuple(int(g) for g in grid),
                                    tuple(int(b) for b in block), int(shared_mem), fmt, values,
                                    keep=tuple(args)))


class _Emulated:
    """Placed before a kernel family: its modules compiled for the CPU, its arrays numpy."""

    def __init__(self, device_id: int = 0, *, descending: bool = False, record=None):
        self._cupy = _NumpyAsCupy
        self.device_id = 0
        self.descending = descending
        self._functions = {}
        for module in self.modules():
            self._functions.update(CpuModule(module).functions(descending=descending))
        self._launcher = _Launcher(self._functions) if record is None else _Recorder(record)

    def _on_device(self, array, what: str) -> None:
        if not isinstance(array, EmulatedArray):
            raise ResidencyError(f"{what} is a {type(array).__name__}, not an array of the "
                                 f"CPU emulator", field=what, value=type(array).__name__,
                                 remedy="pass emulation.host_device.to_device(...) of it")

    _check = _on_device

    def _contiguous(self, array, stream):
        return array if array.flags.c_contiguous else to_device(array)

    def _empty(self, shape, dtype, stream):
        # filled with a pattern, not zeros: a kernel that skips an element leaves garbage
        return _garbage(shape, dtype)


def _garbage(shape, dtype) -> EmulatedArray:
    dtype = np.dtype(dtype)
    raw = np.full(int(np.prod(shape, dtype=np.int64)) * dtype.itemsize, 0x7B, np.uint8)
    return raw.view(dtype).reshape(shape).view(EmulatedArray)


def emulated(family: type, *, descending: bool = False, record: list | None = None):
    """An instance of ``family`` (a ``KernelFamily`` subclass) running on the CPU emulator;
    with ``record``, its launches are appended there (``Launch``) and not run."""
    cls = type(f"Emulated{family.__name__}", (_Emulated, family), {})
    return cls(descending=descending, record=record)


def run_program(program: LaunchProgram, blocks: int, *, descending: bool = False,
                module=None) -> None:
    """``program`` as one cooperative launch of ``blocks`` persistent blocks (``module``: its
    program module, else ``program_module(program.ops)``)."""
    module = program_module(program.ops) if module is None else module
    kernel = CpuModule(module).functions(descending=descending)[PROGRAM_KERNEL]
    barrier = to_device(np.zeros(1, np.uint32))
    kernel((int(blocks),), (PROGRAM_BLOCK,),
           (to_device(program.table), np.int32(program.count), to_device(program.records),
            barrier), shared_mem=program.shared_mem, cooperative=True)
