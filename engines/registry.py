"""Engine registry: the built-in engines plus third parties' through an entry point group.

A third-party package declares ``[project.entry-points."lockstep.engines"]
my-engine = "my_pkg.engine:MyEngine"`` and its class appears here by name.
"""
from __future__ import annotations

import importlib
from functools import lru_cache
from importlib.metadata import entry_points

from engines.engine import Availability, Engine
from engines.errors import UnknownEngine

ENTRY_POINT_GROUP = "lockstep.engines"

BUILTIN: dict[str, str] = {
    "ort-cpu": "engines.backends.ort_cpu:OrtCpuEngine",
    "onnx-reference": "engines.backends.onnx_reference:OnnxReferenceEngine",
    "native-host": "engines.backends.native_host:NativeHostEngine",
    "native-cuda": "engines.backends.native_cuda:NativeCudaEngine",
    "ort-cuda": "engines.backends.ort_cuda:OrtCudaEngine",
    "hf": "engines.backends.hf:HfEngine",
}

REFERENCE_ENGINE = "ort-cpu"


@lru_cache(maxsize=1)
def _entries() -> dict[str, str]:
    found = dict(BUILTIN)
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        found.setdefault(ep.name, ep.value)
    return found


def engine_names() -> list[str]:
    """Every engine this build provides (built in or by entry point), available here or not."""
    return [name for name, target in _entries().items() if _load(target) is not None]


def _load(target: str) -> type[Engine] | None:
    module_name, _, attr = target.partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            return None  # not landed in this build
        raise
    return getattr(module, attr)


def get_engine_class(name: str) -> type[Engine]:
    entries = _entries()
    cls = _load(entries[name]) if name in entries else None
    if cls is None:
        raise UnknownEngine(f"no engine named {name!r}", field="engine", value=name,
                            remedy=f"choose one of: {', '.join(engine_names())}")
    return cls


def availability(name: str) -> Availability:
    return get_engine_class(name).availability()


def available_engines() -> list[str]:
    """Names of the engines that can run here (their dependencies are present)."""
    out = []
    for name in engine_names():
        try:
            if get_engine_class(name).availability().ok:
                out.append(name)
        except UnknownEngine:
            continue
    return out
