"""The CUDA modules compiled by nvcc on a machine without a GPU (where nvcc is installed).

What these checks ask is whether a module compiles and which entries and instructions the
front end emits (an instance per dtype, the bfloat16 rounding chosen for the target), not what
the optimiser makes of them: NVRTC compiles the same source optimised on the GPU, where the
GPU suites run it. So the front end runs with NVVM's optimiser off (``-Xcicc -O0``), which
keeps every entry and the instruction choices and takes a few seconds instead of a minute.
``scripts/kernel_ptx_compare.py`` compiles with the optimiser on.
"""
from __future__ import annotations

import hashlib
import re
import shutil
import subprocess
from pathlib import Path

from engines.cuda_module import CudaModule

NVCC = shutil.which("nvcc")
ENTRY = re.compile(r"^\.(?:visible|weak) \.entry (\w+)\(", re.MULTILINE)


def compile_ptx(text: str, arch: str, folder: Path, options: tuple[str, ...] = (),
                optimise: bool = False) -> str:
    """The PTX nvcc writes for ``text`` on ``arch`` (an assertion error with nvcc's words
    when it does not compile)."""
    stem = hashlib.sha256("\0".join((text, arch, str(optimise)) + tuple(options))
                          .encode()).hexdigest()[:16]
    cu, ptx = folder / f"{stem}.cu", folder / f"{stem}.ptx"
    quick = () if optimise else ("-Xcicc", "-O0")
    if not ptx.exists():  # a folder kept between runs keeps what compiled
        cu.write_text(text)
        done = subprocess.run([NVCC, f"-arch={arch}", "-ptx", *options, *quick, str(cu),
                               "-o", f"{ptx}.part"], capture_output=True, text=True,
                              timeout=900)
        assert done.returncode == 0, done.stderr[-4000:]
        Path(f"{ptx}.part").replace(ptx)
    return ptx.read_text()


def compile_module(module: CudaModule, arch: str, folder: Path, optimise: bool = False) -> str:
    """A module's PTX: its text with every instance the launcher names instantiated."""
    return compile_ptx(module.text() + module.instantiation(), arch, folder,
                       module.compile_options(), optimise)


def entry_instances(ptx: str, module: CudaModule) -> dict[str, str]:
    """Each instance of ``module`` that has an entry in ``ptx`` -> the entry's mangled name
    (read back with binutils' ``c++filt``)."""
    names = ENTRY.findall(ptx)
    plain = subprocess.run(["c++filt"], input="\n".join(names), capture_output=True,
                           text=True, check=True).stdout.split("\n")
    spelled = {}
    for name, text in zip(names, plain):
        text = text.removeprefix("void ")
        spelled[text.split("(", 1)[0]] = name
    typedefs = re.findall(r"^typedef ([\w ]+?) (\w+);", module.text(), re.MULTILINE)
    found = {}
    for instance in module.instances:
        spelling = instance
        for target, alias in typedefs:  # the demangler spells a typedef as its type
            spelling = re.sub(rf"\b{alias}\b", target, spelling)
        if spelling in spelled:
            found[instance] = spelled[spelling]
    return found
