"""A kernel module of native-cuda compiled for the CPU emulator (``cpu_shim.h``) by g++ and
loaded with ctypes, so a test runs the very ``.cu`` source without a GPU.

The source is the module's own text (``CudaModule.text``, headers expanded, the launcher's
``-D`` sizes) after the shim, then one ``extern "C"`` entry per instance: its launch and its
parameters' struct codes, by which a call's arguments are packed (device arrays as their
data pointers). Libraries are kept under the cache root, keyed by a hash of the source, so a
module compiles once per change.
"""
from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from engines.cache_root import cache_root
from engines.cuda_module import CudaModule, read_text
from engines.errors import ExecutionError

SHIM = Path(__file__).resolve().with_name("cpu_shim.h")
# -ffp-contract=off: no product and sum fused unless the source says so (the GPU build's
# --fmad=false); -fno-fast-math keeps IEEE rounding and NaN semantics
FLAGS = ("-std=c++17", "-O1", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-w")

_CTYPES = {"q": ctypes.c_longlong, "i": ctypes.c_int, "I": ctypes.c_uint,
           "f": ctypes.c_float, "d": ctypes.c_double}


def compiler() -> str | None:
    """The C++ compiler the emulator uses (``$CXX``, else g++), or None where there is none."""
    return shutil.which(os.environ.get("CXX") or "g++")


def pointer(value) -> int:
    """The address a pointer parameter takes: an array's data, or an integer as it is."""
    if isinstance(value, np.ndarray):
        return value.ctypes.data
    ptr = getattr(getattr(value, "data", None), "ptr", None)
    if isinstance(ptr, int):
        return ptr
    if isinstance(value, (int, np.integer)):
        return int(value)
    raise ExecutionError("a kernel's pointer parameter takes an array or an address",
                         field="args", value=type(value).__name__,
                         remedy="pass a numpy array (the emulator's device memory)")


@dataclass
class CpuKernel:
    """One instance's launch: ``kernel(grid, block, args, shared_mem=0)``, as CuPy's."""
    name: str
    codes: str
    entry: object
    error: object
    descending: bool = False  # threads and blocks in descending order

    @property
    def ptr(self) -> int:
        """What stands for its ``CUfunction`` (``launch_recorder.function_pointer``)."""
        return id(self)

    def __call__(self, grid, block, args, *, shared_mem: int = 0, stream=None,
                 cooperative: bool = False) -> None:
        """Runs the launch to its end; ``cooperative``: every block resident at once, as a
        kernel with a grid-wide barrier needs."""
        if len(args) != len(self.codes):
            raise ExecutionError(f"{self.name} takes {len(self.codes)} arguments, got "
                                 f"{len(args)}", field="args", value=len(args),
                                 remedy="pass the kernel's parameters in order")
        values = [ctypes.c_void_p(pointer(a)) if code == "p" else _CTYPES[code](a)
                  for code, a in zip(self.codes, args)]
        table = (ctypes.c_void_p * max(len(values), 1))(
            *[ctypes.cast(ctypes.pointer(v), ctypes.c_void_p) for v in values])
        dims = [(tuple(int(d) for d in dim) + (1, 1, 1))[:3] for dim in (grid, block)]
        status = self.entry((ctypes.c_uint * 3)(*dims[0]), (ctypes.c_uint * 3)(*dims[1]),
                            ctypes.c_ulonglong(int(shared_mem)), table,
                            int(self.descending) | (2 if cooperative else 0))
        if status:
            raise ExecutionError(f"{self.name} failed on the CPU emulator: "
                                 f"{self.error().decode()}", field="kernel", value=self.name,
                                 remedy="a barrier every thread reaches, whole warps")


class CpuModule:
    """``module``'s instances (all, or those named) compiled for the emulator."""

    def __init__(self, module: CudaModule, instances=None):
        self.module = module
        self.instances = tuple(instances) if instances is not None else module.instances
        missing = [name for name in self.instances if name not in module.instances]
        if missing:
            raise ExecutionError(f"{module.file} has no instance {missing[0]}",
                                 field="instances", value=missing[0],
                                 remedy=f"one of: {', '.join(module.instances)}")
        self._library = None

    def source(self) -> str:
        defines = "".join(f"#define {name} {value}\n" for name, value in self.module.defines)
        entries = "".join(
            f'extern "C" int lk_cpu_launch_{i}(const unsigned int* g, const unsigned int* b, '
            f"unsigned long long smem, void** args, int flags) {{\n"
            f"    return lk_cpu::launch(&{name}, g, b, smem, args, flags & 1, flags & 2);\n}}\n"
            f'extern "C" const char* lk_cpu_signature_{i}() {{ '
            f"return lk_cpu::signature(&{name}); }}\n"
            for i, name in enumerate(self.instances))
        return (f"{read_text(SHIM)}\n{defines}\n{self.module.text()}\n{entries}"
                'extern "C" const char* lk_cpu_error() { return lk_cpu::run().error.c_str(); }\n')

    def library_path(self) -> Path:
        """The compiled library, built now if it is not in the cache."""
        source = self.source()
        digest = hashlib.sha256("\0".join((source, *FLAGS)).encode()).hexdigest()[:16]
        folder = cache_root() / "cpu-kernels"
        path = folder / f"{Path(self.module.file).stem}-{digest}.so"
        if path.exists():
            return path
        cxx = compiler()
        if cxx is None:
            raise ExecutionError("no C++ compiler for the CPU emulator", field="CXX",
                                 value=os.environ.get("CXX", "g++"),
                                 remedy="install g++ (or set CXX to a C++17 compiler)")
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=folder) as tmp:
            src = Path(tmp) / "module.cpp"
            src.write_text(source, encoding="utf-8")
            built = Path(tmp) / "module.so"
            done = subprocess.run([cxx, *FLAGS, "-o", str(built), str(src)],
                                  capture_output=True, text=True, check=False)
            if done.returncode:
                raise ExecutionError(f"{self.module.file} does not compile for the CPU "
                                     f"emulator:\n{done.stderr[-4000:]}", field="file",
                                     value=self.module.file,
                                     remedy="keep the kernels within cpu_shim.h's CUDA")
            os.replace(built, path)  # atomic: a parallel test sees the whole file or none
        return path

    def functions(self, *, descending: bool = False) -> dict[str, CpuKernel]:
        """Each instance's launch on the emulator."""
        if self._library is None:
            self._library = ctypes.CDLL(str(self.library_path()))
        lib = self._library
        lib.lk_cpu_error.restype = ctypes.c_char_p
        out = {}
        for i, name in enumerate(self.instances):
            signature = getattr(lib, f"lk_cpu_signature_{i}")
            signature.restype = ctypes.c_char_p
            entry = getattr(lib, f"lk_cpu_launch_{i}")
            entry.restype = ctypes.c_int
            codes = signature().decode()
            if "?" in codes:
                raise ExecutionError(f"{name} has a parameter type the emulator cannot pass",
                                     field="instance", value=f"{name}: {codes}",
                                     remedy="pointers, int, unsigned int, long long, float "
                                            "or double parameters")
            out[name] = CpuKernel(name, codes, entry, lib.lk_cpu_error, descending)
        return out
