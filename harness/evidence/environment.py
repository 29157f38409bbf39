"""What machine produced a piece of evidence: cheap to collect, never fails.

Library versions are those of the modules Python actually imports (``__version__``), since
two distributions may provide one module (``onnxruntime`` and ``onnxruntime-gpu``, one of them
shadowing the other through ``PYTHONPATH``); package metadata only where the module will not
import. GPU facts only when CuPy imports and a device answers. Anything unknown is None.

Which commit: ``LOCKSTEP_COMMIT`` where set (a copied tree, e.g. a ``git archive`` snapshot,
has no ``.git`` of its own); otherwise ``git rev-parse HEAD`` only where lockstep's own folder
is the top level of the work tree git finds (a snapshot placed inside another checkout must
not record that checkout's HEAD), with ``-dirty`` after it where tracked files differ from
that commit (seen on the GPU machine: a copied work tree whose ``.git`` named another
commit than the code it held); otherwise None.

Which GPU: ``gpu_index`` is the index nvidia-smi gives it (from ``CUDA_VISIBLE_DEVICES``, which
a pytest-xdist worker of ``lockstep run --devices`` is pinned with; ``LOCKSTEP_GPU`` names the
pinned GPU even where CuPy cannot start), ``gpu_uuid`` the UUID as nvidia-smi prints it.
"""
from __future__ import annotations

import ctypes
import importlib
import importlib.metadata as metadata
import importlib.util
import os
import platform
import socket
import subprocess
from collections.abc import Mapping
from pathlib import Path

from .schema import Environment

_REPO_ROOT = Path(__file__).resolve().parents[2]


def _dist_version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def _module_version(module: str, *dists: str) -> str | None:
    """The ``__version__`` of ``module`` as imported here, or else the first installed
    distribution's metadata version (the module will not import, or names no version)."""
    try:
        version = getattr(importlib.import_module(module), "__version__", None)
    except Exception:  # absent or broken install: evidence still gets written
        version = None
    if isinstance(version, str) and version:
        return version
    return _dist_version(*dists) if dists else None


def _cuda_version(code: int) -> str:
    return f"{code // 1000}.{(code % 1000) // 10}"


def format_gpu_uuid(raw) -> str | None:
    """A device UUID as nvidia-smi prints it, ``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx``,
    from the 16 raw bytes (``getDeviceProperties(...)["uuid"]``, ``cuDeviceGetUuid``), 32 hex
    digits, or the printed form itself. Fewer than 16 bytes (a binding that stops a char array
    at its first zero byte) is no identity: None."""
    if raw is None:
        return None
    if isinstance(raw, str):
        text = raw.strip()
        if text.startswith("GPU-"):
            return text
        digits = text.replace("-", "").lower()
        if len(digits) != 32 or any(c not in "0123456789abcdef" for c in digits):
            return None
    else:
        data = bytes(raw)
        if len(data) < 16:
            return None
        digits = data[:16].hex()
    d = digits
    return f"GPU-{d[:8]}-{d[8:12]}-{d[12:16]}-{d[16:20]}-{d[20:32]}"


def _driver_uuid(device_id: int) -> bytes | None:
    """The device's 16 UUID bytes from the driver API (``cuDeviceGetUuid``), or None."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        device = ctypes.c_int()
        if lib.cuInit(0) != 0 or lib.cuDeviceGet(ctypes.byref(device), int(device_id)) != 0:
            return None
        buf = (ctypes.c_ubyte * 16)()
        get = getattr(lib, "cuDeviceGetUuid_v2", None) or lib.cuDeviceGetUuid
        return bytes(buf) if get(buf, device) == 0 else None
    except (OSError, AttributeError, TypeError):
        return None


def gpu_index_of(device_id: int, environ: Mapping[str, str] | None = None) -> int | None:
    """The index nvidia-smi gives CUDA device ``device_id`` of this process: the entry of
    ``CUDA_VISIBLE_DEVICES`` it stands for (None where that is a UUID or MIG name), else the
    device id itself."""
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return int(device_id)
    entries = [e.strip() for e in visible.split(",") if e.strip()]
    if 0 <= device_id < len(entries) and entries[device_id].isdigit():
        return int(entries[device_id])
    return None


def pinned_gpu_index(environ: Mapping[str, str] | None = None) -> int | None:
    """The index of the GPU this process was pinned to (``LOCKSTEP_GPU``), or None."""
    env = os.environ if environ is None else environ
    pinned = (env.get("LOCKSTEP_GPU") or "").strip()
    return int(pinned) if pinned.isdigit() else None


def _gpu_facts() -> dict:
    facts: dict = {}
    pinned = pinned_gpu_index()
    if pinned is not None:
        facts["gpu_index"] = pinned
    if importlib.util.find_spec("cupy") is None:
        return facts
    try:
        import cupy  # noqa: PLC0415 - optional dependency
        facts["cupy"] = cupy.__version__
        runtime = cupy.cuda.runtime
        facts["cuda_runtime"] = _cuda_version(runtime.runtimeGetVersion())
        facts["cuda_driver"] = _cuda_version(runtime.driverGetVersion())
        device_id = cupy.cuda.Device().id
        props = runtime.getDeviceProperties(device_id)
        name = props.get("name", b"")
        facts["gpu_name"] = name.decode() if isinstance(name, bytes) else str(name)
        facts["gpu_memory_bytes"] = int(props.get("totalGlobalMem", 0)) or None
        index = gpu_index_of(device_id)
        if index is not None:
            facts["gpu_index"] = index
        facts["gpu_uuid"] = (format_gpu_uuid(props.get("uuid"))
                             or format_gpu_uuid(_driver_uuid(device_id)))
    except Exception:  # no driver, no device, broken install: evidence still gets written
        pass
    return facts


def _same_path(a: str | Path, b: str | Path) -> bool:
    try:
        return Path(a).resolve() == Path(b).resolve()
    except OSError:
        return False


def git_commit(cwd: Path | None = None, environ: Mapping[str, str] | None = None) -> str | None:
    """The commit of the tree lockstep runs from: ``LOCKSTEP_COMMIT`` where set and non-empty,
    else git's HEAD (``-dirty`` after it where tracked files differ) where ``cwd``
    (lockstep's repository root) is itself the top level of the work tree git reports, else
    None (no git, no commits, not a repo, or a tree without its
    own ``.git`` nested in another checkout, whose HEAD is some other commit)."""
    env = os.environ if environ is None else environ
    pinned = (env.get("LOCKSTEP_COMMIT") or "").strip()
    if pinned:
        return pinned
    root = _REPO_ROOT if cwd is None else Path(cwd)
    try:
        done = subprocess.run(["git", "rev-parse", "--show-toplevel", "HEAD"], cwd=root,
                              capture_output=True, text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or len(lines) != 2 or not _same_path(lines[0], root):
        return None
    commit = lines[1].strip()
    if not commit:
        return None
    return commit + "-dirty" if _tracked_changes(root) else commit


def _tracked_changes(root: Path) -> bool:
    """Whether tracked files differ from HEAD (git's own ``-dirty``); unknown counts as
    changed, so a record never claims a clean commit it could not check."""
    try:
        done = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                              cwd=root, capture_output=True, text=True, timeout=10,
                              check=False)
    except (OSError, subprocess.SubprocessError):
        return True
    return done.returncode != 0 or bool(done.stdout.strip())


def collect_environment() -> Environment:
    return Environment(
        host=socket.gethostname(),
        platform=platform.platform(),
        python=platform.python_version(),
        numpy=_module_version("numpy", "numpy"),
        onnx=_module_version("onnx", "onnx"),
        onnxruntime=_module_version("onnxruntime", "onnxruntime", "onnxruntime-gpu"),
        git_commit=git_commit(),
        **_gpu_facts(),
    )
