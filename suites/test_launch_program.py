"""Launch programs (``kernels/program.cu``, ``engines/native/launch_program.py``) on the CPU
emulator: the launches of a decode's layers, recorded from the forward's own launchers,
run as one persistent cooperative launch give the launches' outputs bit for bit, whatever
the persistent grid (one block to more blocks than any instruction has) and the order blocks
and threads run in. Planted: the grid barrier between instructions left out (a block reads
what another has not written yet) and an argument record packed one place off are caught.
What a program costs on a GPU the H200 measured: 2.3x the launches (``docs/PERFORMANCE.md``)."""
from __future__ import annotations

import dataclasses
import struct

import numpy as np
import pytest

from engines.errors import ExecutionError
from engines.native.emulation.host_device import (HOST_ALLOCATORS, NO_SIDE_STREAM,
                                                  EmulatedPrograms, emulated, run_program,
                                                  to_device, to_host)
from engines.native.fused_kernels import FusedKernels
from engines.native.cuda_kernels import CudaKernels
from engines.native.kernel_launch import KernelLauncher
from engines.native.launch.prologue_gemv import WIDE_ENV
from engines.native.launch_recorder import ProgramRecorder, kernel_names, recording
from engines.native.program_deferral import ProgramDeferral, deferring
from engines.native.launch_program import Launch, LaunchProgram, programmable
from engines.native.program_module import decode_ops, program_family, program_module
from suites import decode_chain as chain
from suites.decode_chain import TINY
from suites.nvcc_check import NVCC, compile_module
from suites.support import kernel_folder
from suites.test_kernel_launch import FakeArray, FakeCupy, FakeFunction, FakeStream

FUSED = program_family(FusedKernels)  # attention in 128-thread blocks, as a program runs it


def _case(dtype: str, rows: int, seed: int = 0):
    return (*chain.inputs(TINY, dtype, rows, to_device, seed),
            *chain.weights(TINY, dtype, to_device, seed))


def _forward(fused, dense, case) -> list:
    return chain.forward(fused, dense, TINY, *case)


def _recorded(case):
    launches: list[Launch] = []
    outs = _forward(emulated(FUSED, record=launches), emulated(CudaKernels, record=launches),
                    case)
    return launches, outs


def _eager_pair():
    return emulated(FUSED), emulated(CudaKernels)


@pytest.fixture(scope="module")
def eager():
    return _eager_pair()


@pytest.mark.claim("batch_invariance")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("rows", [1, 5])
def test_a_program_computes_its_launches_bit_for_bit(eager, dtype, rows):
    case = _case(dtype, rows)
    want = [to_host(v).tobytes() for v in _forward(*eager, case)]
    launches, outs = _recorded(case)
    assert len(launches) == 11 and all(programmable(launch) for launch in launches)
    assert sum(launch.name.startswith("rotary_kv_attention") for launch in launches) == 2
    program = LaunchProgram.of(launches)
    most = int(program.table[:, 1].max())
    for blocks in (1, 3, most + 2):  # one block runs everything; more blocks than work
        for descending in (False, True):
            for out in outs:
                to_host_view = np.asarray(out).view(np.uint8)
                to_host_view[...] = 0x5A  # the recording's outputs, refilled each run
            run_program(program, blocks, descending=descending)
            assert [to_host(v).tobytes() for v in outs] == want, (blocks, descending)


def _planted_program(tmp_path, ops, file: str, old: str, new: str):
    return dataclasses.replace(program_module(ops),
                               folder=kernel_folder(tmp_path, (file, old, new)))


def test_a_program_without_its_grid_barrier_is_caught(tmp_path):
    case = _case("float16", 3, seed=1)
    launches, outs = _recorded(case)
    want = [to_host(v).tobytes() for v in _forward(*_eager_pair(), case)]
    program = LaunchProgram.of(launches)
    module = _planted_program(tmp_path, program.ops, "program_tail.cuh",
                              "lk_program_grid_sync(lk_ps.barrier, lk_program_blocks());", "")
    wrong = []
    for descending in (False, True):
        run_program(program, 4, descending=descending, module=module)
        wrong.append([to_host(v).tobytes() for v in outs] != want)
    assert any(wrong)


def test_a_record_with_two_values_swapped_is_caught():
    case = _case("float32", 2, seed=2)
    launches, outs = _recorded(case)
    want = [to_host(v).tobytes() for v in _forward(*_eager_pair(), case)]
    # the o projection's (a square weight) two weight strides swapped in its record: what the
    # kernel reads is the record, so its product is another (and every read stays in bounds)
    i = next(i for i, launch in enumerate(launches) if launch.name.startswith("gemv_vec"))
    bad = launches[i]
    values = list(bad.values)
    k = TINY.hidden
    assert values[4] == values[5] == k and values[6:8] == [k, 1]  # K, N; w_nstep, w_kstep
    values[6], values[7] = values[7], values[6]
    launches[i] = dataclasses.replace(bad, values=tuple(values))
    run_program(LaunchProgram.of(launches), 3)
    assert [to_host(v).tobytes() for v in outs] != want


def test_a_launch_a_program_cannot_run_is_refused_by_name():
    attention = Launch("rotary_kv_attention<lk_half, float, lk_half>", (12,), (256,), 0, "Q",
                       (0,))
    assert not programmable(attention)
    with pytest.raises(ExecutionError, match="rotary_kv_attention") as err:
        LaunchProgram.of([attention])
    assert err.value.field == "launches"
    with pytest.raises(ExecutionError, match="at least one"):
        LaunchProgram.of([])


def test_the_gpu_recorder_names_each_launch_and_still_makes_it():
    """``ProgramRecorder`` under ``KernelLauncher`` (a fake driver): every launch is made and
    written down by instance name with the arguments packed as the driver reads them; a
    launch CuPy makes for the launcher marks the recording refused."""
    gemv, stray = FakeFunction(), FakeFunction()
    stray.ptr = 0  # not a compiled kernel: CuPy's own call
    family = type("Family", (), {"_functions": {"gemv_vec<float>": gemv}})()
    fake = FakeCupy([8, 8, 8, 8, 8, 8, 8, 8, 4, 4])
    launcher = KernelLauncher(fake)
    args = (FakeArray(0x1000), FakeArray(0x2000), FakeArray(0x3000), np.int64(1),
            np.int64(64), np.int64(64), np.int64(64), np.int64(1), np.int32(1), np.int32(1))
    with recording(ProgramRecorder([family])) as recorder:
        launcher.launch(gemv, (16,), (128,), args, FakeStream(9))
    assert len(fake.cuda.driver.launches) == 1 and not recorder.refused
    (launch,) = recorder.launches
    assert launch.name == "gemv_vec<float>" and launch.fmt == "QQQqqqqqii"
    assert launch.values[:3] == (0x1000, 0x2000, 0x3000) and programmable(launch)
    assert LaunchProgram.of([launch]).records.size == struct.calcsize("@QQQqqqqqii")
    with recording(recorder):
        launcher.launch(stray, (1,), (32,), (FakeArray(0x4000),), FakeStream(9))
    assert recorder.refused and len(recorder.launches) == 1


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_a_program_reads_no_operand_through_the_non_coherent_path(tmp_path):
    """Another instruction of the same launch writes what a program's kernel reads, so no
    load may take the read-only path (``ld.global.nc``, which a restrict-qualified operand
    gets): program_head.cuh drops ``__restrict__``. nvcc's optimised PTX of a float16
    decode's program has none; planted, the same with ``__restrict__`` kept has them."""
    ops = decode_ops("float16")
    module = program_module(ops)
    folder = tmp_path / "ptx"
    folder.mkdir()
    ptx = compile_module(module, "sm_90", folder, optimise=True)
    assert "ld.global" in ptx and "ld.global.nc" not in ptx
    kept = _planted_program(tmp_path, ops, "program_head.cuh",
                            "#define __restrict__\n", "#define __restrict__ __restrict__\n")
    assert "ld.global.nc" in compile_module(kept, "sm_90", folder, optimise=True)


def _deferred(fused, dense, case, blocks: int = 3):
    """The chain run inside a launch-program deferral on the emulator: its outputs, and the
    deferral (what it made)."""
    deferral = ProgramDeferral(EmulatedPrograms(blocks), kernel_names(fused, dense), None,
                               NO_SIDE_STREAM)
    with deferring(deferral, HOST_ALLOCATORS):
        outs = _forward(fused, dense, case)
    return outs, deferral


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_deferred_forward_runs_as_one_program_with_its_launches_bits(eager, dtype):
    """Every launch of the chain held by the deferral and made as one program at the end
    (``program_deferral``, as a graph slot's capture would): the launches' outputs."""
    case = _case(dtype, 3, seed=4)
    want = [to_host(v).tobytes() for v in _forward(*eager, case)]
    outs, deferral = _deferred(emulated(FUSED), emulated(CudaKernels), case)
    assert deferral.programs_made == 1 and deferral.launches_in_programs == 11
    assert [to_host(v).tobytes() for v in outs] == want


def test_a_deferral_splits_around_what_a_program_cannot_run(monkeypatch):
    """With today's 256-thread attention (no program runs it) each attention launch is made
    in its place, what comes before it first: a lone q/k/v GEMV as itself, the runs between
    attentions as programs; the outputs are the plain launches'. (The verification's wide
    norm prologues, 256 threads too, are switched off: attention alone splits here.)"""
    monkeypatch.setenv(WIDE_ENV, "off")
    case = _case("float16", 2, seed=5)
    plain = emulated(FusedKernels)
    want = [to_host(v).tobytes() for v in _forward(plain, emulated(CudaKernels), case)]
    outs, deferral = _deferred(emulated(FusedKernels), emulated(CudaKernels), case)
    assert deferral.programs_made == 2 and deferral.launches_in_programs == 8
    assert [to_host(v).tobytes() for v in outs] == want
