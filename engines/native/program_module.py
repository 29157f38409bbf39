"""The launch-program module (``kernels/program.cu``): the persistent kernel ``lk_program``
and the kernel instances a program may run, each by its code.

A program runs kernels of one block size (``PROGRAM_BLOCK``: the GEMVs with a prologue and
the plain GEMVs, 128 threads); any other launch ends the program before it. The instances
are the launchers' own (``PrologueGemvKernels.MODULE``, ``GemvKernels.MODULE``), so a code is
the position of an instance name in ``PROGRAM_OPS``, the same list the source is built from.
"""
from __future__ import annotations

from dataclasses import dataclass

from engines.cuda_module import CudaModule
from engines.native.kernel_source import COMPILE_OPTIONS, KERNELS
from engines.native.launch.gemv import GEMV_WARPS_PER_BLOCK, GemvKernels
from engines.native.launch.prologue_gemv import PROLOGUE_BLOCK, PrologueGemvKernels

PROGRAM_BLOCK = 32 * GEMV_WARPS_PER_BLOCK
assert PROLOGUE_BLOCK == PROGRAM_BLOCK
PROGRAM_KERNEL = "lk_program"
# the 128-thread kernels of the two modules program.cu includes
PROGRAM_OPS = tuple(
    name for module in (PrologueGemvKernels.MODULE, GemvKernels.MODULE)
    for name in module.instances
    if name.split("<")[0] in ("norm_gemv", "norm_glu", "swiglu_gemv", "gemv_vec", "gemv_vec3"))


@dataclass(frozen=True)
class ProgramModule(CudaModule):
    """``program.cu`` with its instance list (``ops``) written before the source."""
    ops: tuple[str, ...] = ()

    def text(self) -> str:
        cases = " ".join(f"OP({code}, {name})" for code, name in enumerate(self.ops))
        return f"#define LK_PROGRAM_OPS(OP) {cases}\n" + super().text()


def _defines() -> tuple[tuple[str, int], ...]:
    merged: dict[str, int] = {}
    for module in (PrologueGemvKernels.MODULE, GemvKernels.MODULE):
        merged.update(module.defines)
    return tuple(merged.items())


PROGRAM_MODULE = ProgramModule(KERNELS, "program.cu", (PROGRAM_KERNEL,), _defines(),
                               COMPILE_OPTIONS, PROGRAM_OPS)
