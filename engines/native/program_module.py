"""The launch-program module (``kernels/program.cu``): the persistent kernel ``lk_program``
and the kernel instances a program may run, each by its code.

A program runs kernels of one block size (``PROGRAM_BLOCK``, 128 threads: the GEMVs with a
prologue, the plain GEMVs and, from a family made by ``program_family``, the decode's
rotation, cache write and attention); any other launch ends the program before it. The
instances are the launchers' own, so a code is the position of an instance name in
``PROGRAM_OPS``, the same list the source is built from.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

from engines.cuda_module import CudaModule
from engines.errors import ExecutionError
from engines.native.kernel_source import COMPILE_OPTIONS, KERNELS, instance
from engines.native.launch.attention import AttentionKernels, attention_module
from engines.native.launch.gemv import GEMV_WARPS_PER_BLOCK, GemvKernels
from engines.native.launch.prologue_gemv import PROLOGUE_BLOCK, PrologueGemvKernels, with_warps

PROGRAM_BLOCK = 32 * GEMV_WARPS_PER_BLOCK
assert PROLOGUE_BLOCK == PROGRAM_BLOCK
PROGRAM_KERNEL = "lk_program"
# the modules program.cu includes (attention's with PROGRAM_BLOCK-thread blocks), and the
# kernels of theirs a program runs
_MODULES = (PrologueGemvKernels.MODULE, GemvKernels.MODULE, attention_module(PROGRAM_BLOCK))
PROGRAM_OPS = tuple(
    name for module in _MODULES for name in module.instances
    if name.split("<")[0] in ("norm_gemv", "norm_glu", "swiglu_gemv", "gemv_vec", "gemv_vec1",
                              "gemv_vec3", "rotary_kv_attention"))


def program_family(family: type) -> type:
    """``family`` (a kernel family with attention's launchers) whose attention launches
    ``PROGRAM_BLOCK``-thread blocks, so a program can run them: other bits than the
    256-thread attention's (its orders over keys follow the block), the same in every
    launch of the family. A verification's norm prologues keep ``PROGRAM_BLOCK`` threads
    too (``WIDE_VERIFY`` off: the same bits, since a column's are its team's)."""
    if not issubclass(family, AttentionKernels):
        return family
    fields = {"BLOCK": PROGRAM_BLOCK, "MODULE": attention_module(PROGRAM_BLOCK)}
    if issubclass(family, PrologueGemvKernels):
        fields["WIDE_VERIFY"] = False
    return type(f"{family.__name__}{PROGRAM_BLOCK}", (family,), fields)


@dataclass(frozen=True)
class ProgramModule(CudaModule):
    """``program.cu`` with its instance list (``ops``) written before the source."""
    ops: tuple[str, ...] = ()

    def text(self) -> str:
        cases = " ".join(f"OP({code}, {name})" for code, name in enumerate(self.ops))
        return f"#define LK_PROGRAM_OPS(OP) {cases}\n" + super().text()


def _defines() -> tuple[tuple[str, int], ...]:
    merged: dict[str, int] = {}
    for module in _MODULES:
        merged.update(module.defines)
    return tuple(merged.items())


@functools.lru_cache(maxsize=None)
def program_module(ops: tuple[str, ...], min_blocks: int | None = None) -> ProgramModule:
    """The program module running exactly ``ops`` (instances of ``PROGRAM_OPS``), each code
    its position there. A program compiles only what it runs: every instance's shared
    arrays are the kernel's (six attention instances alone are 150 KB, over the 48 KB a
    kernel's static shared memory may take) and its registers the most any needs, unless
    ``min_blocks`` asks that many blocks a multiprocessor (registers capped, spilling)."""
    unknown = [name for name in ops if name not in PROGRAM_OPS]
    if unknown or not ops:
        raise ExecutionError(f"a launch program cannot run {unknown[0] if unknown else 'nothing'}",
                             field="ops", value=unknown[0] if unknown else (),
                             remedy="instances of program_module.PROGRAM_OPS")
    bounds = () if min_blocks is None else (("LK_PROGRAM_MIN_BLOCKS", int(min_blocks)),)
    return ProgramModule(KERNELS, "program.cu", (PROGRAM_KERNEL,), _defines() + bounds,
                         COMPILE_OPTIONS, tuple(ops))


def decode_ops(dtype: str) -> tuple[str, ...]:
    """The instances a uniform ``dtype`` decode layer's program runs (q/k/v and gate/up with
    their norms, the rotation + cache write + attention with float32 tables, the o and down
    GEMVs, ``gemv_vec1`` at one row), in a program's order: the program module the catalog
    and the source checks compile."""
    warps = GEMV_WARPS_PER_BLOCK  # a program's blocks: the narrow prologues
    return tuple(sorted((with_warps(instance("norm_gemv", dtype, dtype, dtype), warps),
                         with_warps(instance("norm_glu", dtype, dtype, dtype), warps),
                         instance("gemv_vec", dtype), instance("gemv_vec1", dtype),
                         instance("rotary_kv_attention", dtype, "float32", dtype))))
