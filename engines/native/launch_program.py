"""A launch program: a sequence of kernel launches packed for ``lk_program`` (one persistent,
cooperative launch that runs them in order, ``kernels/program.cu``).

Each launch becomes a row of the table (the kernel's code: its place in the program's
``ops``, the instances it runs, sorted; its grid, its shared memory, where its argument
record starts) and its arguments a record packed as the
launcher packs them for the driver (``struct``'s native layout, device arrays as their
pointers). The persistent grid is any number of blocks that can all be resident: each runs
every instruction's blocks b, b + grid, ..., and waits at the grid barrier between
instructions, so the outputs are the launches' whatever the grid.
"""
from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engines.errors import ExecutionError
from engines.native.program_module import PROGRAM_BLOCK, PROGRAM_OPS

RECORD_ALIGN = 16  # every record starts 16-byte aligned (its widest parameter: 8)


@dataclass(frozen=True)
class Launch:
    """One kernel launch: its instance, grid, block, shared memory and packed arguments
    (``fmt``: struct codes, ``values``: device arrays already their addresses). ``keep``
    holds the arrays those addresses are in: a launch run later needs its operands alive
    (a temporary the launcher made, a contiguous copy, would otherwise be freed)."""
    name: str
    grid: tuple[int, ...]
    block: tuple[int, ...]
    shared_mem: int
    fmt: str
    values: tuple
    keep: tuple = field(default=(), compare=False, repr=False)


def programmable(launch: Launch) -> bool:
    """Whether a program can run ``launch``: a kernel of the program module, a 1-D grid of
    ``PROGRAM_BLOCK``-thread blocks."""
    return (launch.name in PROGRAM_OPS and tuple(launch.block) in ((PROGRAM_BLOCK,),
                                                              (PROGRAM_BLOCK, 1, 1))
            and all(int(g) == 1 for g in tuple(launch.grid)[1:]))


@dataclass(frozen=True)
class LaunchProgram:
    table: np.ndarray  # int64 [instructions, 4]: code, grid, shared memory, record offset
    records: np.ndarray  # uint8: the argument records
    shared_mem: int  # the most any instruction takes
    ops: tuple[str, ...]  # the instances it runs (program_module(ops) compiles them)

    @classmethod
    def of(cls, launches: Sequence[Launch]) -> "LaunchProgram":
        if not launches:
            raise ExecutionError("a launch program needs at least one launch",
                                 field="launches", value=0, remedy="pass the launches to run")
        rows, records = [], bytearray()
        ops = tuple(sorted({launch.name for launch in launches}))
        codes = {name: code for code, name in enumerate(ops)}
        for i, launch in enumerate(launches):
            if not programmable(launch):
                raise ExecutionError(f"launch {i} ({launch.name}, block {launch.block}) is not "
                                     f"one a program runs", field="launches", value=launch.name,
                                     remedy=f"{PROGRAM_BLOCK}-thread kernels of "
                                            "program_module.PROGRAM_OPS only")
            records.extend(b"\0" * (-len(records) % RECORD_ALIGN))
            rows.append((codes[launch.name], int(launch.grid[0]), int(launch.shared_mem),
                         len(records)))
            records.extend(struct.pack("@" + launch.fmt, *launch.values))
        return cls(np.asarray(rows, dtype=np.int64),
                   np.frombuffer(bytes(records), dtype=np.uint8).copy(),
                   max(int(launch.shared_mem) for launch in launches), ops)

    @property
    def count(self) -> int:
        return int(self.table.shape[0])
