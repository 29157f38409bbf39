"""``program_deferral`` on the host (a fake driver, a fake program launcher): inside
``deferring`` the launches a program can run are held and made as one program, and the
stream still sees everything in the order it was asked for: whatever else would reach it
(a launch a program cannot run, one on another stream, CuPy's own call, a CuPy operation's
allocation) makes what is held first; a family's and a step memo's allocations do not; one
held launch is made as itself; the end of the block makes the rest. Planted: a deferral
that let a foreign allocation pass would put a copy before the launches it follows."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from engines.errors import InputError

from engines.native.forward_programs import ProgramObserver, programs_requested
from engines.native.kernel_launch import DEFERRING, KernelLauncher, family_allocation
from engines.native.program_deferral import ProgramDeferral, deferring
from suites.test_kernel_launch import FakeArray, FakeCupy, FakeFunction, FakeStream

GEMV = "gemv_vec<float>"
NORM = "norm_gemv<float, float, float, 4>"
OTHER = "rms_norm<float, float>"  # not a kernel a program runs


class _Allocators:
    """CuPy's allocator switch, as ``deferring`` uses it."""

    def __init__(self, log):
        self.current = lambda nbytes: log.append(("alloc", nbytes))

    def get_allocator(self):
        return self.current

    @contextlib.contextmanager
    def using_allocator(self, allocator):
        held, self.current = self.current, allocator
        try:
            yield
        finally:
            self.current = held


class _Programs:
    """A ProgramLauncher's upload and launch, written to the same log as the driver's."""

    def __init__(self, log):
        self.log = log

    def upload(self, program, stream):
        return program

    def launch(self, program, stream):
        self.log.append(("program", [int(c) for c in program.table[:, 0]], len(program.ops)))


class _Side:
    def synchronize(self):
        pass


def _setup():
    fake = FakeCupy([8, 8, 8, 8])
    log = fake.cuda.driver.launches  # the driver's launches and the programs', in order
    allocators = _Allocators(log)
    fake.cuda.get_allocator = allocators.get_allocator
    fake.cuda.using_allocator = allocators.using_allocator
    functions = {}
    for ptr, name in ((0x10, GEMV), (0x20, NORM), (0x30, OTHER)):
        functions[name] = FakeFunction()
        functions[name].ptr = ptr
    stream = FakeStream(7)
    deferral = ProgramDeferral(_Programs(log), {0x10: GEMV, 0x20: NORM, 0x30: OTHER},
                               stream, _Side())
    return fake, log, KernelLauncher(fake), functions, stream, deferral


ARGS = (FakeArray(0x1000), FakeArray(0x2000), np.int64(4), np.int64(64))


def _kinds(log) -> list:
    return [entry[0] if isinstance(entry, tuple) else hex(entry["f"]) for entry in log]


def test_held_launches_become_one_program_before_what_follows_them():
    fake, log, launcher, f, stream, deferral = _setup()
    with deferring(deferral, fake):
        for name in (NORM, GEMV, GEMV):
            launcher.launch(f[name], (8,), (128,), ARGS, stream)
        assert log == []  # held
        launcher.launch(f[OTHER], (2,), (64,), ARGS, stream)  # a program cannot run it
        launcher.launch(f[GEMV], (8,), (128,), ARGS, stream)
        launcher.launch(f[NORM], (8,), (128,), ARGS, stream)
    assert _kinds(log) == ["program", "0x30", "program"]
    assert log[0][1:] == ([1, 0, 0], 2)  # codes by the program's sorted ops: gemv 0, norm 1
    assert deferral.programs_made == 2 and deferral.launches_in_programs == 5
    assert DEFERRING.deferral is None


def test_one_held_launch_is_made_as_itself():
    fake, log, launcher, f, stream, deferral = _setup()
    with deferring(deferral, fake):
        launcher.launch(f[GEMV], (8,), (128,), ARGS, stream)
    assert _kinds(log) == ["0x10"] and deferral.programs_made == 0


def test_another_stream_and_cupys_own_call_flush_first():
    fake, log, launcher, f, stream, deferral = _setup()
    with deferring(deferral, fake):
        launcher.launch(f[GEMV], (8,), (128,), ARGS, stream)
        launcher.launch(f[NORM], (8,), (128,), ARGS, stream)
        launcher.launch(f[GEMV], (8,), (128,), ARGS, FakeStream(8))  # another stream
        launcher.launch(f[GEMV], (8,), (128,), ARGS, stream)
        launcher.launch(f[NORM], (8,), (128,), ARGS, stream)
        stray = FakeFunction()
        stray.ptr = 0  # CuPy's own call, not the driver's
        launcher.launch(stray, (1,), (32,), ARGS, stream)
    assert _kinds(log) == ["program", "0x10", "program"] and len(stray.calls) == 1


def test_a_cupy_operations_allocation_flushes_a_familys_does_not():
    fake, log, launcher, f, stream, deferral = _setup()
    with deferring(deferral, fake):
        launcher.launch(f[GEMV], (8,), (128,), ARGS, stream)
        launcher.launch(f[NORM], (8,), (128,), ARGS, stream)
        family_allocation(fake.cuda.get_allocator(), 256)  # a family's output: stays held
        launcher.launch(f[GEMV], (8,), (128,), ARGS, stream)
        fake.cuda.get_allocator()(512)  # a CuPy copy's output: what is held goes first
    assert _kinds(log) == ["alloc", "program", "alloc"]
    assert log[1][1] == [0, 1, 0]


def test_planted_a_deferral_blind_to_allocations_misorders_the_stream(monkeypatch):
    fake, log, launcher, f, stream, deferral = _setup()
    monkeypatch.setattr(DEFERRING, "family_allocation", True)  # every allocation "a family's"
    with deferring(deferral, fake):
        launcher.launch(f[GEMV], (8,), (128,), ARGS, stream)
        launcher.launch(f[NORM], (8,), (128,), ARGS, stream)
        fake.cuda.get_allocator()(512)
    assert _kinds(log) == ["alloc", "program"]  # the copy went ahead of the launches


def test_an_eager_forward_observed_gives_the_programs_its_capture_will_make():
    """``ProgramObserver`` holds nothing (every launch made at once) and splits the runs
    where a deferral would flush: the programs it lists are the capture's."""
    fake, log, launcher, f, stream, _ = _setup()
    observer = ProgramObserver({0x10: GEMV, 0x20: NORM, 0x30: OTHER})
    with deferring(observer, fake):
        for name in (NORM, GEMV):
            launcher.launch(f[name], (8,), (128,), ARGS, stream)
        fake.cuda.get_allocator()(64)  # a CuPy operation between: a flush
        launcher.launch(f[GEMV], (8,), (128,), ARGS, stream)  # alone: no program
        launcher.launch(f[OTHER], (2,), (64,), ARGS, stream)
        for name in (GEMV, GEMV, GEMV):
            launcher.launch(f[name], (8,), (128,), ARGS, stream)
    assert _kinds(log) == ["0x20", "0x10", "alloc", "0x10", "0x30", "0x10", "0x10", "0x10"]
    programs = observer.programs()
    assert [(p.count, p.ops) for p in programs] == [(2, (GEMV, NORM)), (3, (GEMV,))]


def test_programs_are_off_unless_asked_and_a_bad_word_is_refused(monkeypatch):
    monkeypatch.delenv("LOCKSTEP_PROGRAMS", raising=False)
    assert programs_requested() is False
    monkeypatch.setenv("LOCKSTEP_PROGRAMS", "on")
    assert programs_requested() is True
    monkeypatch.setenv("LOCKSTEP_PROGRAMS", "maybe")
    with pytest.raises(InputError) as err:
        programs_requested()
    assert err.value.field == "LOCKSTEP_PROGRAMS"
