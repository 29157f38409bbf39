"""The CUDA modules compiled by NVRTC, the compiler CuPy uses on the GPU, on a machine without
one: NVRTC needs no driver, only its library (the ``nvidia-cuda-nvrtc`` wheel of the test
extra, or a CUDA toolkit's).

nvcc (``suites/nvcc_check.py``) is not the same front end: it honoured ``#pragma
push_macro``, which NVRTC ignores, so a launch program compiled here with nvcc and failed on
the H200 (2026-12-05) with ``lk_program`` left a device function. What the GPU compiles, CI
compiles with the same library and options.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from engines.cuda_module import CudaModule

# where the nvidia-cuda-nvrtc wheels put the library (CUDA 13, then 12), under site-packages
_WHEEL_LIBS = (("cu13", "libnvrtc.so.13", "libnvrtc-builtins.so.13.*"),
               ("cuda_nvrtc", "libnvrtc.so.12", "libnvrtc-builtins.so.12.*"))


@dataclass(frozen=True)
class Compiled:
    ok: bool
    log: str
    lowered: dict[str, str]  # each name expression -> its mangled name (where it compiled)


def _wheel_library() -> Path | None:
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations or []) if spec else []:
        for folder, name, builtins in _WHEEL_LIBS:
            lib = Path(root) / folder / "lib"
            if (lib / name).exists():
                for found in sorted(lib.glob(builtins)):  # NVRTC opens it by its soname
                    ctypes.CDLL(str(found), mode=ctypes.RTLD_GLOBAL)
                return lib / name
    return None


@lru_cache(maxsize=1)
def nvrtc() -> ctypes.CDLL | None:
    """NVRTC's library, or None where none is installed."""
    path = _wheel_library()
    found = str(path) if path else ctypes.util.find_library("nvrtc")
    if not found:
        return None
    try:
        return ctypes.CDLL(found)
    except OSError:
        return None


def compile_with_nvrtc(module: CudaModule, arch: str = "sm_90") -> Compiled:
    """``module`` compiled as CuPy's ``RawModule`` compiles it: its whole text, its options,
    its instances as name expressions."""
    lib = nvrtc()
    assert lib is not None, "no NVRTC library"
    program = ctypes.c_void_p()
    status = lib.nvrtcCreateProgram(ctypes.byref(program), module.text().encode(),
                                    f"{module.file}".encode(), 0, None, None)
    assert status == 0, f"nvrtcCreateProgram: {status}"
    try:
        for name in module.instances:
            assert lib.nvrtcAddNameExpression(program, name.encode()) == 0, name
        options = [f"--gpu-architecture={arch}", *module.compile_options()]
        array = (ctypes.c_char_p * len(options))(*[o.encode() for o in options])
        status = lib.nvrtcCompileProgram(program, len(options), array)
        size = ctypes.c_size_t()
        lib.nvrtcGetProgramLogSize(program, ctypes.byref(size))
        log = ctypes.create_string_buffer(size.value + 1)
        lib.nvrtcGetProgramLog(program, log)
        lowered = {}
        if status == 0:
            for name in module.instances:
                mangled = ctypes.c_char_p()
                if lib.nvrtcGetLoweredName(program, name.encode(), ctypes.byref(mangled)) == 0:
                    lowered[name] = mangled.value.decode()
        return Compiled(status == 0, log.value.decode(errors="replace"), lowered)
    finally:
        lib.nvrtcDestroyProgram(ctypes.byref(program))
