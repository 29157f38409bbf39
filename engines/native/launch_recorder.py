"""Kernel launches written down as they are made, for launch programs: set a
``ProgramRecorder`` as this thread's ``kernel_launch.RECORDING.recorder`` (``recording``),
run the launches (they are still made), and its ``launches`` are ``Launch``es by instance
name, with the operands they point into kept alive. A launch CuPy made for the launcher
(an argument it does not pack) marks the recording ``refused``: it has no record."""
from __future__ import annotations

import contextlib
from typing import Any

from engines.native.kernel_launch import RECORDING
from engines.native.launch_program import Launch


def function_pointer(function) -> int:
    """A compiled kernel's ``CUfunction`` (a ``RawKernel``'s or a ``Function``'s)."""
    return int(getattr(getattr(function, "kernel", function), "ptr", 0) or 0)


def kernel_names(*families) -> dict[int, str]:
    """Each kernel of these families' ``CUfunction`` -> its instance name."""
    return {function_pointer(f): name for family in families
            for name, f in family._functions.items()}


class ProgramRecorder:
    """What ``KernelLauncher.launch`` tells a step memo's recorder, kept as ``Launch``es."""

    def __init__(self, families):
        self.names = kernel_names(*families)
        self.launches: list[Launch] = []
        self.refused = False

    def allocation(self, array, stream) -> None:
        pass  # the outputs are the launches' operands; nothing to re-base

    def launch(self, launcher, pointer, grid, block, shared_mem, stream, fmt, values,
               args) -> None:
        name = self.names.get(pointer, f"<kernel {pointer:#x}>")
        self.launches.append(Launch(name, tuple(grid), tuple(block), int(shared_mem), fmt,
                                    tuple(values), keep=tuple(args)))

    def refuse(self) -> None:
        self.refused = True


@contextlib.contextmanager
def recording(recorder: Any):
    """``recorder`` hears this thread's launches inside the block."""
    held = RECORDING.recorder
    RECORDING.recorder = recorder
    try:
        yield recorder
    finally:
        RECORDING.recorder = held
