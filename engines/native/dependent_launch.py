"""Programmatic dependent launch (PDL) for the kernels a graph slot captures.

A decode forward is about 200 kernels of a few microseconds each; between two of them the
GPU drains one grid before it starts the next. With PDL (compute capability 9.0 and later)
a kernel launched with ``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` may be
scheduled while its predecessor still runs, once that predecessor has asked for it
(``griddepcontrol.launch_dependents``). Every kernel of ours starts with
``lk_dependent_wait()`` (``cuda_kernels``' prelude): what it may do before it (only ask L2
for its weight rows, which no kernel writes) and the wait itself, which returns once the
predecessor has finished and its writes are visible; then it lets its own successor in.
So the arithmetic, and every bit of every output, is what a plain launch computes: only
the gap between kernels shrinks.

Only captures use it (``capturing()``, entered by ``CupyGraphDevice.capture``): a replay
is where the gaps are, and an eager launch through ctypes would cost host time. A kernel
whose source lacks the wait is launched plainly (``waits(source)`` finds the ones that
have it), as are all kernels where the driver or the device cannot (``available()`` gives
the reason) or where ``LOCKSTEP_NATIVE_CUDA_PDL=off`` (read at each capture) says no.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

ENV = "LOCKSTEP_NATIVE_CUDA_PDL"
WAIT_CALL = "lk_dependent_wait();"
_PROGRAMMATIC_STREAM_SERIALIZATION = 6  # CUlaunchAttributeID
_MIN_CAPABILITY = 90

_state = threading.local()


class _AttributeValue(ctypes.Union):
    _fields_ = [("pad", ctypes.c_char * 64), ("allowed", ctypes.c_int),
                ("align", ctypes.c_uint64)]


class _Attribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", _AttributeValue)]


class _Config(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shared", ctypes.c_uint), ("stream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_Attribute)), ("count", ctypes.c_uint)]


_HEAD = re.compile(r'extern "C" __global__ void (\w+)\(')


def with_waits(source: str) -> str:
    """``source`` with ``lk_dependent_wait();`` as the first statement of every kernel whose
    body does not call it already (a kernel that asks L2 for its weights first places its
    own call after that)."""
    heads = list(_HEAD.finditer(source))
    for head, after in reversed(list(zip(heads, heads[1:] + [None]))):
        end = after.start() if after is not None else len(source)
        if WAIT_CALL in source[head.end():end]:
            continue
        brace = source.index("{", head.end())
        source = source[:brace + 1] + "\n    " + WAIT_CALL + source[brace + 1:]
    return source


def waits(source: str) -> frozenset[str]:
    """Names of the ``extern "C"`` kernels in ``source`` whose body calls the wait."""
    names = set()
    heads = list(_HEAD.finditer(source))
    for head, after in zip(heads, heads[1:] + [None]):
        body = source[head.end():after.start() if after is not None else len(source)]
        if WAIT_CALL in body:
            names.add(head.group(1))
    return frozenset(names)


def enabled() -> bool:
    """Whether ``LOCKSTEP_NATIVE_CUDA_PDL`` leaves PDL on (the default); read per capture."""
    return os.environ.get(ENV, "on").lower() not in ("0", "off", "false", "no")


@contextlib.contextmanager
def capturing() -> Iterator[None]:
    """Launches inside this block (one thread's) use PDL where their launcher can, unless
    ``LOCKSTEP_NATIVE_CUDA_PDL=off``."""
    before = getattr(_state, "on", False)
    _state.on = enabled()
    try:
        yield
    finally:
        _state.on = before


def _driver() -> tuple[Any, str]:
    cached = getattr(_driver, "cached", None)
    if cached is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            launch = lib.cuLaunchKernelEx
            launch.restype = ctypes.c_int
            launch.argtypes = [ctypes.POINTER(_Config), ctypes.c_void_p,
                               ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
            cached = (launch, "")
        except (OSError, AttributeError) as exc:
            cached = (None, f"the driver has no cuLaunchKernelEx ({exc})")
        _driver.cached = cached
    return cached


def available(capability: int) -> tuple[bool, str]:
    """(whether a device of ``capability`` (e.g. 90) and the driver can launch with PDL,
    why not)."""
    if capability < _MIN_CAPABILITY:
        return False, f"compute capability {capability / 10:.1f} < 9.0"
    launch, why = _driver()
    return launch is not None, why


def _argument(value: Any) -> ctypes._SimpleCData | ctypes.Array:
    """A kernel argument as CuPy passes it: a device array as its pointer, a NumPy scalar
    as its bytes, a Python int as int64 and a float as float64."""
    data = getattr(value, "data", None)
    if hasattr(data, "ptr"):
        return ctypes.c_uint64(int(data.ptr))
    if not isinstance(value, np.generic):
        if isinstance(value, int):
            value = np.int64(value)
        elif isinstance(value, float):
            value = np.float64(value)
        else:
            raise TypeError(f"kernel argument of type {type(value).__name__}")
    raw = value.tobytes()
    return (ctypes.c_char * len(raw)).from_buffer_copy(raw)


class Launcher:
    """A compiled kernel, called as CuPy's ``Function`` is; inside ``capturing()`` and when
    ``dependent`` it is launched with PDL through the driver. ``Launcher.dependent_launches``
    counts those launches (what a GPU test checks, so PDL cannot be off unnoticed)."""

    dependent_launches = 0

    def __init__(self, function: Any, dependent: bool):
        self.function = function
        self.dependent = bool(dependent)

    def __call__(self, grid, block, args, stream=None, shared_mem: int = 0) -> None:
        if not (self.dependent and getattr(_state, "on", False)):
            self.function(grid, block, args, stream=stream, shared_mem=shared_mem)
            return
        launch, why = _driver()
        if launch is None:
            raise RuntimeError(why)
        if stream is None:  # as CuPy launches: on the current stream
            from engines.cuda_support import import_cupy

            stream = import_cupy().cuda.get_current_stream()
        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        attribute = _Attribute(id=_PROGRAMMATIC_STREAM_SERIALIZATION)
        attribute.value.allowed = 1
        config = _Config((ctypes.c_uint * 3)(*grid), (ctypes.c_uint * 3)(*block),
                         int(shared_mem), ctypes.c_void_p(int(stream.ptr)),
                         ctypes.pointer(attribute), 1)
        values = [_argument(a) for a in args]
        params = (ctypes.c_void_p * max(1, len(values)))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        function = getattr(self.function, "kernel", self.function)  # a RawKernel's Function
        code = launch(ctypes.byref(config), ctypes.c_void_p(int(function.ptr)), params, None)
        if code != 0:
            raise RuntimeError(f"cuLaunchKernelEx failed with CUresult {code}")
        Launcher.dependent_launches += 1


def launchers(functions: dict[str, Any], source: str, capability: int) -> dict[str, Launcher]:
    """``functions`` (name -> CuPy Function) as launchers: PDL for the kernels of ``source``
    that wait, where ``available(capability)``."""
    on, _why = available(capability)
    dependent = waits(source) if on else frozenset()
    return {name: Launcher(f, name in dependent) for name, f in functions.items()}


__all__ = ["ENV", "Launcher", "WAIT_CALL", "available", "capturing", "enabled", "launchers", "waits",
           "with_waits"]
