"""What every family of launchers shares: the device, the compiled modules, one launcher,
and the checks and allocations every launch makes.

A family class names its module (``MODULE``); a class that inherits several families
(``CudaKernels``, ``FusedKernels``) loads each of theirs when it is made, never mid-forward
(a module cannot load inside a stream capture). Launchers check shapes, dtypes, layout and
device from array metadata only (nothing is read from the device), allocate on the stream
they are given, and launch there; none synchronises with the host. Every kernel of these
modules calls ``lk_grid_wait`` first, so the launcher is a dependent one.
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from engines.cuda_module import CudaModule
from engines.cuda_support import import_cupy
from engines.errors import ExecutionError, ResidencyError
from engines.native.dtype_names import dtype_name
from engines.native.kernel_launch import KernelLauncher, family_allocation, note_allocation

LINEAR_BLOCK = 256  # threads per block for the one-thread-per-output kernels


def i64(value: int) -> np.int64:
    # CuPy passes a Python int as 64-bit; being explicit keeps every argument's width visible.
    return np.int64(value)


def elem_strides(array) -> tuple[int, ...]:
    return tuple(s // array.itemsize for s in array.strides)


def ceil_div(count: int, threads: int) -> int:
    return (count + threads - 1) // threads


class KernelFamily:
    MODULE: ClassVar[CudaModule | None] = None

    @classmethod
    def modules(cls) -> tuple[CudaModule, ...]:
        """The modules of every family this class is made of."""
        return tuple(c.__dict__["MODULE"] for c in reversed(cls.__mro__)
                     if c.__dict__.get("MODULE") is not None)

    def __init__(self, device_id: int = 0):
        cupy = import_cupy()
        self._cupy = cupy
        self.device_id = int(device_id)
        self._device = cupy.cuda.Device(self.device_id)  # one object: a launch enters it often
        self._functions: dict[str, Any] = {}
        for module in self.modules():
            self._functions.update(module.load(self.device_id))
        self._launcher = KernelLauncher(cupy, self.device_id, dependent=True)

    def _launch(self, name: str, blocks: int, threads: int, args: tuple, stream) -> None:
        self._launcher.launch(self._functions[name], (int(blocks),), (int(threads),), args,
                              stream)

    # -- residency ---------------------------------------------------------------------------
    def _on_device(self, array, what: str) -> None:
        """A CuPy array on this device, else a ``ResidencyError`` saying how to get one."""
        cupy = self._cupy
        if not isinstance(array, cupy.ndarray):
            raise ResidencyError(f"{what} is a {type(array).__name__}, not a CuPy array on "
                                 f"cuda:{self.device_id}", field=what,
                                 value=type(array).__name__,
                                 remedy="adopt host values once (backend.adopt / "
                                        "tensor_ops.adopt) before the kernel runs")
        if array.data.device_id != self.device_id:  # (array.device builds a Device object)
            raise ResidencyError(f"{what} lives on cuda:{array.device.id}, these kernels run "
                                 f"on cuda:{self.device_id}", field=what,
                                 value=f"cuda:{array.device.id}",
                                 remedy=f"move it with a device-to-device copy, or build the "
                                        f"backend for cuda:{array.device.id}")

    def _check(self, array, what: str) -> None:
        """The fused nodes' residency check: an operand adopted to this device."""
        cupy = self._cupy
        if not isinstance(array, cupy.ndarray) or array.data.device_id != self.device_id:
            raise ResidencyError(f"{what} does not live on cuda:{self.device_id}", field=what,
                                 value=type(array).__name__,
                                 remedy="adopt it to the backend before the forward")

    # -- layout and allocation ---------------------------------------------------------------
    @staticmethod
    def _require_contiguous(array, what: str) -> None:
        if not array.flags.c_contiguous:
            raise ExecutionError(f"{what} must be C-contiguous", field=what,
                                 value=f"strides {array.strides}",
                                 remedy="pass cupy.ascontiguousarray(...) of it")

    def _contiguous(self, array, stream):
        """A C-contiguous copy (or ``array`` itself); a bfloat16 array's bits move as uint16,
        since CuPy computes nothing in bfloat16."""
        if array.flags.c_contiguous:
            return array
        with self._device, stream:
            if dtype_name(array.dtype) == "bfloat16":
                bits = self._cupy.ascontiguousarray(array.view(np.uint16))
                return bits.view(array.dtype)
            return self._cupy.ascontiguousarray(array)

    def _empty(self, shape, dtype, stream):
        """A new array from the current allocator, on ``stream`` (a family's own allocation:
        it does not flush a launch-program deferral)."""
        with self._device, stream:
            out = family_allocation(self._cupy.empty, shape, dtype=dtype)
        return note_allocation(out, stream)

    def _out(self, out, shape, dtype, stream, what: str = "out"):
        """``out`` checked against the result's shape and dtype, or a new one."""
        if out is None:
            return self._empty(shape, dtype, stream)
        self._on_device(out, what)
        self._require_contiguous(out, what)
        if tuple(out.shape) != tuple(shape) or out.dtype != dtype:
            raise ExecutionError(f"{what} has shape {tuple(out.shape)} and dtype {out.dtype}, "
                                 f"the result needs {tuple(shape)} {np.dtype(dtype).name}",
                                 field=what, value=tuple(out.shape),
                                 remedy="pass an output of the result's shape and dtype, or none")
        return out

    def _positions(self, positions, count: int, stream):
        """The forward's positions: ``count`` int64 values on this device, contiguous."""
        self._check(positions, "positions")
        if positions.dtype != np.int64 or positions.size != count:
            raise ExecutionError(f"positions must be {count} int64 values",
                                 field="positions",
                                 value=(tuple(positions.shape), positions.dtype.name),
                                 remedy="feed position_ids as int64 [1, M]")
        return self._contiguous(positions, stream)
