"""An independent count of device-to-host transfers, in the spirit of JAX's transfer_guard.

``with transfer_guard(mode) as guard:`` patches CuPy's device-to-host entry points for the
duration of the block (always restoring them on exit, also on error) and records each
transfer as an event: the path, the bytes, and the call site (the first frame outside this
module and outside CuPy), once the call has returned (a refused call is recorded too).
Transfers made inside ``engines.cuda_support.sanctioned_readback``
count as *readback* for that purpose; every other one counts as *host staging*, whose
budget is zero (DESIGN.md claim 3). Modes: ``count`` records, ``log`` records and prints
each event, ``disallow`` records and raises ``TransferGuardError`` naming the call site
before a staging transfer happens (sanctioned readbacks still pass).

How CuPy is intercepted (CuPy 13/14). ``cupy.ndarray`` is a Python subclass of the Cython
type ``cupy._core.core._ndarray_base``, so attributes set on ``cupy.ndarray`` shadow the
base's methods and, for dunder names, replace the type slots. CuPy's conversion methods
are ``cpdef``/``def`` methods that call ``self.get()``, and a ``cpdef`` call dispatches to a
Python-level override on the instance's type, so patching ``get`` also catches the internal
calls; the other names are patched too so each event names its entry point (an event is
counted once, at the outermost intercepted call on the thread).

Intercepted:
- ``cupy.ndarray``: ``get``, ``item``, ``tolist``, ``tobytes``, ``tofile``, ``__int__``,
  ``__float__``, ``__complex__``, ``__bool__``, ``__bytes__``, ``__index__`` (where defined),
  ``__repr__``, ``__str__``, ``__format__``, ``__reduce__``/``__reduce_ex__`` (pickle,
  ``dump``, ``dumps``), ``__array__`` (``numpy.asarray(x)``; CuPy refuses it, so it is counted
  only if it returns), ``__dlpack__`` when the consumer asks for the CPU device
  (``numpy.from_dlpack(x, device="cpu")``), and every CuPy-internal caller of ``get``
  (``cupy.asnumpy``, ``cupy.testing``, implicit ``int()`` of a device scalar in CuPy code);
- ``cupy.asnumpy`` (module attribute);
- ``cupy.cuda.runtime.memcpy`` / ``memcpyAsync`` / ``memcpy2D`` / ``memcpy2DAsync`` /
  ``memcpy2DFromArray`` / ``memcpy2DFromArrayAsync`` called through the module attribute,
  when the kind is ``memcpyDeviceToHost``, or ``memcpyDefault`` with a device source and a
  host destination (``pointerGetAttributes``; counted if that query fails).

Not intercepted (a transfer through these is invisible to the guard):
- ``cupy.cuda.MemoryPointer.copy_to_host`` / ``copy_to_host_async`` called directly (an
  immutable extension type; CuPy's own ``get`` uses it below the intercepted level);
- the ``memcpy*`` functions bound by name before the guard started
  (``from cupy.cuda.runtime import memcpy``) or called from Cython (``cimport``), and
  ``memcpy3D`` / ``memcpy3DAsync`` (the direction sits in a C struct);
- zero-copy host access: the buffer protocol / ``memoryview`` under ``CUPY_ENABLE_UMP=1``,
  managed or host-mapped (pinned) memory read by the host, kernels writing to host memory;
- other libraries reading CuPy memory through ``__cuda_array_interface__`` or a DLPack
  capsule exported for the device (torch, numba, ...) and copying it to the host;
- library calls that write results to host memory (cuBLAS/cuSOLVER host pointer mode).

The patches are process-wide: events on any thread reach every active guard. Guards nest;
each keeps its own counts, and the patches come off when the last guard exits. The patch
logic takes a target description, so tests drive it with a fake array type on the host.
"""
from __future__ import annotations

import functools
import os
import sys
import threading
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from types import ModuleType
from typing import Any, Literal, TextIO

from engines.cuda_support import current_readback_purposes
from engines.errors import LockstepError
from engines.ledger import READBACK_PURPOSES

MODES = ("count", "log", "disallow")
STAGING = "staging"
READBACK = "readback"

# cudaMemcpyKind and cudaMemoryType values (CUDA runtime API)
MEMCPY_DEVICE_TO_HOST = 2
MEMCPY_DEFAULT = 4
_HOST_MEMORY_TYPES = (0, 1)  # unregistered, host
_DEVICE_MEMORY_TYPES = (2, 3)  # device, managed

ARRAY_METHODS = ("get", "item", "tolist", "tobytes", "tofile", "__int__", "__float__",
                 "__complex__", "__bool__", "__bytes__", "__index__", "__repr__", "__str__",
                 "__format__", "__reduce__", "__reduce_ex__", "__array__", "__dlpack__")
_KDL_CPU = 1


class TransferGuardError(LockstepError):
    """A device-to-host transfer happened under ``transfer_guard(mode="disallow")``."""


@dataclass(frozen=True)
class TransferEvent:
    path: str        # entry point, e.g. "cupy.ndarray.get"
    nbytes: int
    site: str        # "file:line in function" of the first frame outside the guard and CuPy
    kind: Literal["staging", "readback"]
    purpose: str | None = None  # readback purpose


@dataclass(frozen=True)
class InterceptPoint:
    """One attribute to patch: ``owner.name``; ``nbytes(args, kwargs)`` says how many bytes a
    call moves to the host, or None when the call is not a device-to-host transfer."""
    owner: Any
    name: str
    path: str
    nbytes: Callable[[tuple, dict], int | None]


@dataclass
class Target:
    """What to patch, plus the folders whose frames are skipped when naming a call site."""
    points: list[InterceptPoint]
    library_dirs: tuple[str, ...] = ()


# -- building targets ------------------------------------------------------------------------
def _arg(args: tuple, kwargs: dict, index: int, name: str, default: Any = None) -> Any:
    if len(args) > index:
        return args[index]
    return kwargs.get(name, default)


def _array_nbytes(name: str) -> Callable[[tuple, dict], int | None]:
    if name == "__dlpack__":
        def nbytes(args: tuple, kwargs: dict) -> int | None:
            dev = kwargs.get("dl_device")
            if dev is None or int(tuple(dev)[0]) != _KDL_CPU:
                return None  # exported for the device: no transfer here
            return int(args[0].nbytes)
        return nbytes
    return lambda args, kwargs: int(args[0].nbytes)


def _memcpy_nbytes(runtime: Any, kind_index: int, kind_name: str,
                   size: Callable[[tuple, dict], int], dst_index: int, src_index: int | None
                   ) -> Callable[[tuple, dict], int | None]:
    def nbytes(args: tuple, kwargs: dict) -> int | None:
        kind = int(_arg(args, kwargs, kind_index, kind_name, -1))
        if kind == MEMCPY_DEVICE_TO_HOST:
            return size(args, kwargs)
        if kind != MEMCPY_DEFAULT:
            return None
        try:
            def kind_of(index: int, name: str) -> int:
                return int(runtime.pointerGetAttributes(_arg(args, kwargs, index, name)).type)
            dst_type = kind_of(dst_index, "dst")
            # a CUDA array source (memcpy2DFromArray) is device memory
            src_type = 2 if src_index is None else kind_of(src_index, "src")
        except Exception:
            return size(args, kwargs)  # direction unknown: count it rather than miss it
        if src_type in _DEVICE_MEMORY_TYPES and dst_type in _HOST_MEMORY_TYPES:
            return size(args, kwargs)
        return None
    return nbytes


def _asnumpy_nbytes(array_type: type) -> Callable[[tuple, dict], int | None]:
    def nbytes(args: tuple, kwargs: dict) -> int | None:
        a = _arg(args, kwargs, 0, "a")
        if isinstance(a, array_type):
            return int(a.nbytes)
        cai = getattr(a, "__cuda_array_interface__", None)
        if cai is None:
            return None  # a host value: no transfer
        count = 1
        for d in cai["shape"]:
            count *= int(d)
        return count * int(cai["typestr"][2:])
    return nbytes


def cupy_target(cupy: ModuleType | Any) -> Target:
    """The intercept points of a CuPy-shaped module (the real one, or a test double)."""
    points: list[InterceptPoint] = []
    array_type = cupy.ndarray
    for name in ARRAY_METHODS:
        inherited_from_object = getattr(array_type, name, None) is getattr(object, name, None)
        if hasattr(array_type, name) and not inherited_from_object:
            points.append(InterceptPoint(array_type, name, f"cupy.ndarray.{name}",
                                         _array_nbytes(name)))
    if hasattr(cupy, "asnumpy"):
        points.append(InterceptPoint(cupy, "asnumpy", "cupy.asnumpy", _asnumpy_nbytes(array_type)))
    runtime = getattr(getattr(cupy, "cuda", None), "runtime", None)
    if runtime is not None:
        def size1d(a: tuple, k: dict) -> int:
            return int(_arg(a, k, 2, "size"))

        def size2d(a: tuple, k: dict) -> int:
            return int(_arg(a, k, 4, "width")) * int(_arg(a, k, 5, "height"))

        def size2d_from_array(a: tuple, k: dict) -> int:
            return int(_arg(a, k, 5, "width")) * int(_arg(a, k, 6, "height"))

        specs = (("memcpy", 3, size1d, 1), ("memcpyAsync", 3, size1d, 1),
                 ("memcpy2D", 6, size2d, 2), ("memcpy2DAsync", 6, size2d, 2),
                 ("memcpy2DFromArray", 7, size2d_from_array, None),
                 ("memcpy2DFromArrayAsync", 7, size2d_from_array, None))
        for name, kind_index, size, src_index in specs:
            if hasattr(runtime, name):
                points.append(InterceptPoint(
                    runtime, name, f"cupy.cuda.runtime.{name}",
                    _memcpy_nbytes(runtime, kind_index, "kind", size, 0, src_index)))
    dirs = []
    libraries = [cupy]
    if sys.modules.get("cupy") is cupy:  # the real CuPy: its sibling packages are library too
        libraries += [sys.modules.get("cupyx"), sys.modules.get("cupy_backends")]
    for mod in libraries:
        if mod is not None and getattr(mod, "__file__", None):
            dirs.append(os.path.dirname(os.path.abspath(mod.__file__)) + os.sep)
    return Target(points, tuple(sorted(set(dirs))))


def default_targets() -> list[Target]:
    """The real CuPy's target when CuPy imports here; none otherwise (nothing to cross)."""
    try:
        import cupy  # noqa: PLC0415 - optional dependency
    except Exception:
        return []
    return [cupy_target(cupy)]


# -- the patch registry ----------------------------------------------------------------------
_THIS_FILE = os.path.abspath(__file__)
_lock = threading.RLock()
_active: list[TransferGuard] = []
_installed: dict[tuple[int, str], tuple[Any, str, bool, Any]] = {}  # key -> owner, name, had, saved
_users: dict[tuple[int, str], int] = {}
_local = threading.local()


def _call_site(library_dirs: tuple[str, ...]) -> str:
    frame = sys._getframe(2)
    while frame is not None:
        fname = os.path.abspath(frame.f_code.co_filename)
        if fname != _THIS_FILE and not fname.startswith(library_dirs):
            return f"{fname}:{frame.f_lineno} in {frame.f_code.co_name}"
        frame = frame.f_back
    return "<unknown>"


def _wrap(point: InterceptPoint, original: Any, library_dirs: tuple[str, ...]) -> Callable:
    def intercepted(*args: Any, **kwargs: Any) -> Any:
        if getattr(_local, "depth", 0) or not _active:
            return original(*args, **kwargs)
        nbytes = point.nbytes(args, kwargs)
        if nbytes is None:
            return original(*args, **kwargs)
        site = _call_site(library_dirs)
        purposes = current_readback_purposes()
        with _lock:
            guards = list(_active)
        if not purposes and any(g.mode == "disallow" for g in guards):
            for g in guards:
                g._record(point.path, nbytes, site, purposes)
            raise TransferGuardError(
                f"device-to-host transfer of {nbytes} bytes through {point.path} at {site}",
                field="site", value=site, where="transfer_guard(disallow)",
                remedy=("keep the value on the device; only sanctioned readbacks (token ids, "
                        "acceptance counts) may cross, inside sanctioned_readback(purpose)"))
        _local.depth = getattr(_local, "depth", 0) + 1
        try:
            result = original(*args, **kwargs)
        finally:
            _local.depth -= 1
        for g in guards:  # recorded once it happened (CuPy refuses __array__, say)
            g._record(point.path, nbytes, site, purposes)
        return result

    try:
        functools.update_wrapper(intercepted, original)
    except (AttributeError, TypeError):
        pass
    intercepted.__lockstep_intercepted__ = True  # type: ignore[attr-defined]
    return intercepted


def _install(target: Target) -> tuple[list[str], list[str]]:
    """Patch every point (reference-counted); returns (intercepted paths, refused paths)."""
    done, refused = [], []
    for point in target.points:
        key = (id(point.owner), point.name)
        if key in _installed:
            _users[key] += 1
            done.append(point.path)
            continue
        owner_dict = vars(point.owner)
        had = point.name in owner_dict
        saved = owner_dict.get(point.name)
        original = getattr(point.owner, point.name)
        try:
            setattr(point.owner, point.name, _wrap(point, original, target.library_dirs))
        except (TypeError, AttributeError) as exc:
            refused.append(f"{point.path} ({exc})")
            continue
        _installed[key] = (point.owner, point.name, had, saved)
        _users[key] = 1
        done.append(point.path)
    return done, refused


def _uninstall(target: Target) -> None:
    for point in target.points:
        key = (id(point.owner), point.name)
        if key not in _users:
            continue
        _users[key] -= 1
        if _users[key]:
            continue
        owner, name, had, saved = _installed.pop(key)
        del _users[key]
        if had:
            setattr(owner, name, saved)
        else:
            delattr(owner, name)


# -- the guard -------------------------------------------------------------------------------
@dataclass(eq=False)
class TransferGuard:
    """Counts (and in ``disallow`` mode refuses) device-to-host transfers inside its block."""
    mode: str = "count"
    targets: list[Target] | None = None
    stream: TextIO | None = None  # where ``log`` prints; stderr when None
    events: list[TransferEvent] = field(default_factory=list)
    intercepted: list[str] = field(default_factory=list)
    refused_patches: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"transfer_guard mode {self.mode!r} is not one of {', '.join(MODES)}")
        self._event_lock = threading.Lock()
        self._entered = False

    # counts
    @property
    def staging_events(self) -> list[TransferEvent]:
        return [e for e in self.events if e.kind == STAGING]

    @property
    def staging_count(self) -> int:
        return len(self.staging_events)

    @property
    def staging_bytes(self) -> int:
        return sum(e.nbytes for e in self.staging_events)

    @property
    def staging_sites(self) -> list[str]:
        return [e.site for e in self.staging_events]

    @property
    def readback_bytes(self) -> dict[str, int]:
        out = {p: 0 for p in READBACK_PURPOSES}
        for e in self.events:
            if e.kind == READBACK:
                out[e.purpose] = out.get(e.purpose, 0) + e.nbytes
        return out

    @property
    def readback_count(self) -> dict[str, int]:
        out = {p: 0 for p in READBACK_PURPOSES}
        for e in self.events:
            if e.kind == READBACK:
                out[e.purpose] = out.get(e.purpose, 0) + 1
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"mode": self.mode, "staging_count": self.staging_count,
                "staging_bytes": self.staging_bytes, "staging_sites": self.staging_sites,
                "readback_bytes": self.readback_bytes, "readback_count": self.readback_count,
                "events": [asdict(e) for e in self.events], "intercepted": list(self.intercepted),
                "refused_patches": list(self.refused_patches)}

    def _record(self, path: str, nbytes: int, site: str, purposes: tuple[str, ...]) -> None:
        """One event, or with several purposes (one copy of equal-sized values) one event a
        purpose, the bytes split evenly; a copy that does not split evenly stays one event
        under its first purpose, so the budget sees every byte either way."""
        nbytes = int(nbytes)
        parts = len(purposes)
        if parts > 1 and nbytes % parts == 0:
            events = [TransferEvent(path, nbytes // parts, site, READBACK, p) for p in purposes]
        else:
            events = [TransferEvent(path, nbytes, site, READBACK if purposes else STAGING,
                                    purposes[0] if purposes else None)]
        with self._event_lock:
            self.events.extend(events)
        if self.mode == "log":
            for event in events:
                print(f"transfer_guard: {event.kind} {event.nbytes} B via {path} at {site}"
                      + (f" (purpose {event.purpose})" if event.purpose else ""),
                      file=self.stream if self.stream is not None else sys.stderr)

    # context manager
    def __enter__(self) -> TransferGuard:
        if self._entered:
            raise RuntimeError("a TransferGuard cannot be entered twice; make a new one")
        self._entered = True
        self._targets = self.targets if self.targets is not None else default_targets()
        with _lock:
            installed: list[Target] = []
            try:
                for t in self._targets:
                    done, refused = _install(t)
                    installed.append(t)
                    self.intercepted.extend(done)
                    self.refused_patches.extend(refused)
            except BaseException:
                for t in installed:
                    _uninstall(t)
                raise
            _active.append(self)
        return self

    def __exit__(self, *exc: Any) -> None:
        with _lock:
            if self in _active:
                _active.remove(self)
            for t in self._targets:
                _uninstall(t)


def transfer_guard(mode: str = "count", *, targets: list[Target] | None = None,
                   stream: TextIO | None = None) -> TransferGuard:
    """``with transfer_guard("disallow") as g: ...`` (see the module doc)."""
    return TransferGuard(mode=mode, targets=targets, stream=stream)
