"""CUDA support: is CuPy usable here, which versions, and the sanctioned-readback marker.

Every CUDA module imports CuPy through ``import_cupy()`` so a machine without it gets one
clear ``EngineUnavailable`` (what is missing, how to get it) instead of an ImportError deep
in a stack. ``cuda_availability()`` is what engines and the ``gpu`` test marker use to
decide whether to run or skip, and ``versions()`` is what evidence records.

``sanctioned_readback(purpose)`` marks the one code path allowed to read device values
back (token ids, acceptance counts). It lives here, below ``harness/``, so engine code can
mark its readback and the independent transfer guard (``harness.transfer_guard``) can
count it as readback rather than host staging without engines importing the harness.
"""
from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Iterator
from typing import Any

from engines.errors import EngineUnavailable
from engines.ledger import READBACK_PURPOSES

REMEDY = ("install CuPy for your CUDA major version: pip install 'lockstep[cuda12]' "
          "(CUDA 12) or pip install 'lockstep[cuda13]' (CUDA 13), on a machine with an "
          "NVIDIA GPU and driver")


def _format_cuda_version(v: int) -> str:
    """CUDA encodes versions as 1000*major + 10*minor (12040 -> '12.4')."""
    return f"{v // 1000}.{(v % 1000) // 10}"


def _probe() -> tuple[bool, str, Any]:
    try:
        import cupy  # noqa: PLC0415 - optional dependency, imported on demand
    except Exception as exc:  # ImportError, or a broken install raising anything
        return False, f"CuPy is not importable ({type(exc).__name__}: {exc})", None
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDARuntimeError: no driver, driver too old, no device
        return False, (f"CuPy {cupy.__version__} is installed but CUDA is not usable "
                       f"({type(exc).__name__}: {exc})"), None
    if count < 1:
        return False, f"CuPy {cupy.__version__} is installed but no CUDA device is present", None
    try:
        runtime = _format_cuda_version(cupy.cuda.runtime.runtimeGetVersion())
        driver = _format_cuda_version(cupy.cuda.runtime.driverGetVersion())
        props = cupy.cuda.runtime.getDeviceProperties(0)
    except Exception as exc:
        return False, (f"CuPy {cupy.__version__} cannot query device 0 "
                       f"({type(exc).__name__}: {exc})"), None
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return True, (f"CuPy {cupy.__version__}, CUDA runtime {runtime}, driver {driver}, "
                  f"{count} device(s), device 0: {name}"), cupy


@functools.lru_cache(maxsize=1)
def _cached_probe() -> tuple[bool, str, Any]:
    return _probe()


def cuda_availability() -> tuple[bool, str]:
    """(ok, reason): whether CuPy imports and sees a CUDA device; the reason says why not,
    or which CuPy, runtime, driver and GPU were found. Cached for the process."""
    ok, reason, _ = _cached_probe()
    return ok, reason


def import_cupy():
    """The ``cupy`` module, or ``EngineUnavailable`` naming the reason and the remedy."""
    ok, reason, cupy = _cached_probe()
    if not ok:
        raise EngineUnavailable(f"CUDA is unavailable: {reason}", field="cupy", remedy=REMEDY)
    return cupy


def versions() -> dict[str, Any]:
    """Evidence: CuPy version, CUDA runtime and driver versions, GPU name and memory.

    Works without a GPU: fields that cannot be read are ``None`` and ``available`` is False.
    """
    ok, reason, cupy = _cached_probe()
    out: dict[str, Any] = {"available": ok, "reason": reason, "cupy": None,
                           "cuda_runtime": None, "cuda_driver": None, "device_count": 0,
                           "gpu_name": None, "gpu_total_memory": None,
                           "compute_capability": None}
    try:
        import cupy as cp  # noqa: PLC0415
        out["cupy"] = cp.__version__
    except Exception:
        return out
    if not ok:
        return out
    rt = cupy.cuda.runtime
    props = rt.getDeviceProperties(0)
    name = props["name"]
    out.update(
        cuda_runtime=_format_cuda_version(rt.runtimeGetVersion()),
        cuda_driver=_format_cuda_version(rt.driverGetVersion()),
        device_count=rt.getDeviceCount(),
        gpu_name=name.decode() if isinstance(name, bytes) else str(name),
        gpu_total_memory=int(props["totalGlobalMem"]),
        compute_capability=f"{props['major']}.{props['minor']}",
    )
    return out


# -- the sanctioned readback marker ---------------------------------------------------------
_marker = threading.local()


@contextlib.contextmanager
def sanctioned_readback(purpose: str, *more: str) -> Iterator[None]:
    """Mark the device-to-host reads inside as a sanctioned readback of ``purpose``.

    Only engine code that also records ``ledger.record_readback(purpose, nbytes)`` for the
    same bytes may use it; the transfer guard then counts the bytes as readback. Thread-local.
    With ``more`` purposes one copy carries several values of equal size, one a purpose in
    order (the accept count and the bonus id in one 8-byte read): the guard splits its bytes
    evenly over them, as the ledger records them.
    """
    purposes = (purpose, *more)
    for name in purposes:
        if name not in READBACK_PURPOSES:
            raise ValueError(f"readback purpose {name!r} is not sanctioned; "
                             f"valid: {', '.join(READBACK_PURPOSES)}")
    stack = getattr(_marker, "stack", None)
    if stack is None:
        stack = _marker.stack = []
    stack.append(purposes)
    try:
        yield
    finally:
        stack.pop()


def current_readback_purposes() -> tuple[str, ...]:
    """The innermost active ``sanctioned_readback``'s purposes on this thread, or ()."""
    stack = getattr(_marker, "stack", None)
    return stack[-1] if stack else ()
