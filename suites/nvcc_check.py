"""The CUDA sources compiled by nvcc on a machine without a GPU (where nvcc is installed).

What these checks ask is whether the source compiles and which entries and instructions the
front end emits (a kernel per dtype, the bfloat16 rounding chosen for the target), not what
the optimiser makes of them: NVRTC compiles the same source optimised on the GPU, where the
GPU suites run it. So the front end runs with NVVM's optimiser off (``-Xcicc -O0``), which
keeps every entry and the instruction choices and takes a few seconds instead of a minute.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from engines.native.cuda_kernels import COMPILE_OPTIONS

NVCC = shutil.which("nvcc")


def compile_ptx(source: str, arch: str, folder: Path) -> str:
    """The PTX nvcc writes for ``source`` on ``arch`` (an assertion error with nvcc's words
    when it does not compile)."""
    cu, ptx = folder / f"{arch}.cu", folder / f"{arch}.ptx"
    cu.write_text(source)
    done = subprocess.run([NVCC, f"-arch={arch}", "-ptx", *COMPILE_OPTIONS, "-Xcicc", "-O0",
                           str(cu), "-o", str(ptx)], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return ptx.read_text()
