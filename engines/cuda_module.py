"""A CUDA module of lockstep: one ``.cu`` file, the sizes its launcher passes as ``-D``
options, and the template instances its launcher calls.

Kernel source lives in ``.cu`` and ``.cuh`` files shipped as package data (editors, ``nvcc``
and ``cuobjdump`` read them as CUDA), one kernel family a file with the dtypes as C++
template parameters. A launcher names each kernel it calls by its name expression
(``gemv_rows<lk_half>``): NVRTC instantiates exactly those (CuPy's ``RawModule(...,
name_expressions=...)``) and ``get_function`` takes the same string. The module's
``#include "..."`` lines are expanded here, each header once, so the text CuPy compiles,
and keys its cache on, is the whole source. CuPy is imported only to load a module.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_INCLUDE = re.compile(r'^#include "([\w.]+)"[^\n]*\n', re.MULTILINE)
_ONCE = re.compile(r"^#pragma once[^\n]*\n", re.MULTILINE)


def read_text(path: Path) -> str:
    """A kernel file's text (what every module reads its files through)."""
    return path.read_text(encoding="utf-8")


@dataclass(frozen=True)
class CudaModule:
    folder: Path  # the .cu file's folder; its headers are there too
    file: str
    instances: tuple[str, ...]  # the name expressions the launcher calls
    defines: tuple[tuple[str, int], ...] = ()  # the launcher's sizes, passed as -D options
    options: tuple[str, ...] = ()  # NVRTC's (and nvcc's) other compile options

    def text(self) -> str:
        """The .cu file with its headers expanded in place, each one once."""
        seen: set[str] = set()

        def expand(name: str) -> str:
            if name in seen:
                return ""
            seen.add(name)
            text = _ONCE.sub("", read_text(self.folder / name))
            return _INCLUDE.sub(lambda m: expand(m.group(1)), text)

        return expand(self.file)

    def compile_options(self) -> tuple[str, ...]:
        return self.options + tuple(f"-D{name}={value}" for name, value in self.defines)

    def instantiation(self) -> str:
        """What ``nvcc`` needs after ``text()`` to emit every instance NVRTC would (NVRTC
        instantiates the name expressions itself): host code that takes each one's address."""
        table = ",\n    ".join(f"(const void*)&{name}" for name in self.instances)
        return f"\n[[maybe_unused]] static const void* const lk_instances[] = {{\n    {table}}};\n"

    def load(self, device_id: int) -> dict[str, Any]:
        """Each instance's function on ``device_id``, compiled and loaded once per process
        (when a launcher is made, never inside a stream capture: a module cannot load
        there). The module stays referenced here."""
        key = (self, int(device_id))
        loaded = _LOADED.get(key)
        if loaded is None:
            from engines.cuda_support import import_cupy

            cupy = import_cupy()
            with cupy.cuda.Device(int(device_id)):
                module = cupy.RawModule(code=self.text(), options=self.compile_options(),
                                        name_expressions=self.instances)
                loaded = _LOADED[key] = {name: module.get_function(name)
                                         for name in self.instances}
        return loaded


_LOADED: dict[tuple[CudaModule, int], dict[str, Any]] = {}
