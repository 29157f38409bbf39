"""Launch programs in native-cuda's captured forwards (``LOCKSTEP_PROGRAMS=on``; off by
default: on the H200 a program was 2.3x slower than its launches, ``docs/PERFORMANCE.md``).

With the switch on, the engine's fused nodes launch attention in 128-thread blocks
(``program_family``: the other kernels are 128-thread already), and:
- an eager forward is observed (``observing``): its launches a program can run, split where
  anything else reaches the stream as a deferral would split them, and each run's program
  module loaded then, since a graph slot's capture follows its eager run with the same
  launches and a module cannot load inside a capture;
- a captured forward defers (``capturing``, ``program_deferral``): the graph then holds a
  few ``lk_program`` launches where it held one launch a kernel; their device arrays are
  the capture's to keep.
"""
from __future__ import annotations

import contextlib

from engines.native.env_switch import switch
from engines.native.launch_program import Launch, LaunchProgram, programmable
from engines.native.launch_recorder import kernel_names
from engines.native.program_deferral import ProgramDeferral, deferring
from engines.native.program_launcher import ProgramLauncher

ENV = "LOCKSTEP_PROGRAMS"


def programs_requested() -> bool:
    """``LOCKSTEP_PROGRAMS``: on or off (``env_switch``; default off)."""
    return switch(ENV, default=False)


class ProgramObserver:
    """A deferral that holds nothing: the runs of launches a deferral would have made as
    programs (two or more programmable launches with nothing else between them)."""

    def __init__(self, names: dict[int, str]):
        self.names = names
        self.runs: list[list[Launch]] = [[]]

    def take(self, launcher, pointer: int, grid, block, fmt: str, values, stream,
             shared_mem: int) -> bool:
        launch = Launch(self.names.get(pointer, ""), tuple(grid), tuple(block),
                        int(shared_mem), fmt, tuple(values))
        if programmable(launch):
            self.runs[-1].append(launch)
        else:
            self.flush()
        return False

    def flush(self) -> None:
        if self.runs[-1]:
            self.runs.append([])

    def programs(self) -> list[LaunchProgram]:
        return [LaunchProgram.of(run) for run in self.runs if len(run) > 1]


class ForwardPrograms:
    """One engine's launch programs: its launcher, its kernels' names, its streams."""

    def __init__(self, cupy, device_id: int, stream, families):
        self.cupy = cupy
        self.launcher = ProgramLauncher(cupy, device_id)
        self.names = kernel_names(*families)
        self.stream = stream
        with cupy.cuda.Device(device_id):
            self.side_stream = cupy.cuda.Stream(non_blocking=True)
        self.made = 0  # programs made in captures, and the launches they replaced
        self.replaced = 0

    @contextlib.contextmanager
    def observing(self):
        """An eager forward inside: then every program module its capture would need."""
        observer = ProgramObserver(self.names)
        with deferring(observer, self.cupy):
            yield observer
        for program in observer.programs():
            self.launcher.kernel(program.ops, program.shared_mem)

    @contextlib.contextmanager
    def capturing(self):
        """A captured forward inside, its launches made as programs; the deferral's
        ``keep`` must live as long as the graph."""
        deferral = ProgramDeferral(self.launcher, self.names, self.stream, self.side_stream)
        with deferring(deferral, self.cupy):
            yield deferral
        self.made += deferral.programs_made
        self.replaced += deferral.launches_in_programs
