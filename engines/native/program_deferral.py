"""Launches held back while a stream is captured, and made as launch programs: what lets a
captured forward replay as a few persistent launches instead of one launch a kernel.

Inside ``deferring(deferral, cupy)`` every launch ``KernelLauncher.launch_packed`` would make
on the deferral's stream is offered to it first. A launch a program can run
(``launch_program.programmable``) is held; anything else that would reach the stream flushes
what is held first, so the stream sees the launches' order:
- a launch a program cannot run (then made as usual), or one on another stream;
- a launch CuPy makes for a launcher (``KernelLauncher.launch``'s fallback);
- an allocation that is not a kernel family's or a step memo's own
  (``kernel_launch.family_allocation``): a CuPy operation
  allocates before it launches, so a contiguous copy or a fallback product flushes first;
- the end of the block.
A flush of one launch makes it as it was; of several, one program: uploaded on a side stream
(a synchronous copy, which a relaxed capture allows, never captured) from the program
launcher's own pool (a block freed by a held launch's operand, taken by the upload, would
be overwritten before the program reads it), launched on the deferral's stream, its device
arrays kept (``keep``) as long as a graph may replay it. Its
program module must be loaded before the capture (``ProgramLauncher.kernel``): a module
cannot load inside one.
"""
from __future__ import annotations

import contextlib
from typing import Any

from engines.native.kernel_launch import DEFERRING
from engines.native.launch_program import Launch, LaunchProgram, programmable


class ProgramDeferral:
    """What one captured stream holds back. ``programs``: a ``ProgramLauncher`` (``upload``,
    ``launch``); ``names``: each kernel's ``CUfunction`` -> its instance name."""

    def __init__(self, programs, names: dict[int, str], stream, side_stream):
        self.programs = programs
        self.names = names
        self.stream = stream
        self.side_stream = side_stream
        self.pending: list[tuple[Any, int, Launch]] = []
        self.keep: list[Any] = []  # device programs: alive as long as the graph
        self.programs_made = 0  # programs launched, and launches they replaced
        self.launches_in_programs = 0

    def take(self, launcher, pointer: int, grid, block, fmt: str, values, stream,
             shared_mem: int) -> bool:
        """Whether the launch is held (True) or is to be made now, after what was held."""
        name = self.names.get(pointer)
        launch = Launch(name or "", tuple(grid), tuple(block), int(shared_mem), fmt,
                        tuple(values))
        if name is None or stream is not self.stream or not programmable(launch):
            self.flush()
            return False
        self.pending.append((launcher, pointer, launch))
        return True

    def flush(self) -> None:
        """Make what is held: one launch as itself, several as one program."""
        pending, self.pending = self.pending, []
        if not pending:
            return
        if len(pending) == 1:
            launcher, pointer, launch = pending[0]
            held, DEFERRING.deferral = DEFERRING.deferral, None
            try:
                launcher.launch_packed(pointer, launch.grid, launch.block, launch.fmt,
                                       list(launch.values), self.stream, launch.shared_mem)
            finally:
                DEFERRING.deferral = held
            return
        program = LaunchProgram.of([launch for _, _, launch in pending])
        device_program = self.programs.upload(program, self.side_stream)
        self.side_stream.synchronize()
        self.keep.append(device_program)
        self.programs.launch(device_program, self.stream)
        self.programs_made += 1
        self.launches_in_programs += len(pending)


@contextlib.contextmanager
def deferring(deferral: ProgramDeferral, cupy):
    """Launches on the deferral's stream held and made as programs inside the block; what is
    held when it ends is made then (not when it raises: the capture is abandoned)."""
    held = DEFERRING.deferral
    current = cupy.cuda.get_allocator()

    def allocate(nbytes):
        if not DEFERRING.family_allocation:
            deferral.flush()
        return current(nbytes)

    DEFERRING.deferral = deferral
    try:
        with cupy.cuda.using_allocator(allocate):
            yield deferral
            deferral.flush()
    finally:
        DEFERRING.deferral = held
