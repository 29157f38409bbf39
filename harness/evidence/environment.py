"""What machine produced a piece of evidence: cheap to collect, never fails.

Library versions come from package metadata (no import of onnxruntime just to ask); GPU
facts only when CuPy imports and a device answers. Anything unknown is None.
"""
from __future__ import annotations

import importlib.metadata as metadata
import importlib.util
import platform
import socket
import subprocess
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


def _cuda_version(code: int) -> str:
    return f"{code // 1000}.{(code % 1000) // 10}"


def _gpu_facts() -> dict:
    if importlib.util.find_spec("cupy") is None:
        return {}
    facts: dict = {}
    try:
        import cupy  # noqa: PLC0415 - optional dependency
        facts["cupy"] = cupy.__version__
        runtime = cupy.cuda.runtime
        facts["cuda_runtime"] = _cuda_version(runtime.runtimeGetVersion())
        facts["cuda_driver"] = _cuda_version(runtime.driverGetVersion())
        props = runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props.get("name", b"")
        facts["gpu_name"] = name.decode() if isinstance(name, bytes) else str(name)
        facts["gpu_memory_bytes"] = int(props.get("totalGlobalMem", 0)) or None
    except Exception:  # no driver, no device, broken install: evidence still gets written
        pass
    return facts


def git_commit(cwd: Path = _REPO_ROOT) -> str | None:
    """HEAD of the checkout lockstep runs from, or None (no git, no commits, not a repo)."""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True,
                              text=True, timeout=5, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


def collect_environment() -> Environment:
    return Environment(
        host=socket.gethostname(),
        platform=platform.platform(),
        python=platform.python_version(),
        numpy=_dist_version("numpy"),
        onnx=_dist_version("onnx"),
        onnxruntime=_dist_version("onnxruntime", "onnxruntime-gpu"),
        git_commit=git_commit(),
        **_gpu_facts(),
    )
