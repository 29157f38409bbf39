"""Launch programs (``kernels/program.cu``, ``engines/native/launch_program.py``) on the CPU
emulator: the launches of a decode's layers, recorded from the forward's own launchers,
run as one persistent cooperative launch give the launches' outputs bit for bit, whatever
the persistent grid (one block to more blocks than any instruction has) and the order blocks
and threads run in. Planted: the grid barrier between instructions left out (a block reads
what another has not written yet) and an argument record packed one place off are caught.
What a program costs on a GPU is for the GPU run to say (``docs/PERFORMANCE.md``)."""
from __future__ import annotations

import dataclasses
import shutil

import numpy as np
import pytest

from engines.errors import ExecutionError
from engines.native.emulation.host_device import emulated, run_program, to_device, to_host
from engines.native.fused_kernels import FusedKernels
from engines.native.cuda_kernels import CudaKernels
from engines.native.kernel_source import KERNELS
from engines.native.launch_program import Launch, LaunchProgram, programmable
from engines.native.program_module import PROGRAM_MODULE, program_family
from suites.test_kernel_emulation import _np, _rand

K, HIDDEN = 64, 96  # a row, the MLP's width
HEADS, KV_HEADS, HEAD_DIM, SLOTS, START = 2, 1, 32, 16, 5  # attention's shape, the cache
EPS = 1e-5
FUSED = program_family(FusedKernels)  # attention in 128-thread blocks, as a program runs it


def _weights(dtype: str, layers: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    per = [{"gain1": to_device((1 + 0.1 * rng.standard_normal(K)).astype(_np(dtype))),
            "qkv": [_rand(rng, (n, K), dtype, 0.1) for n in (K, 32, 32)],
            "cache": [_rand(rng, (1, KV_HEADS, SLOTS, HEAD_DIM), dtype) for _ in range(2)],
            "o": _rand(rng, (K, K), dtype, 0.1),
            "gain2": to_device((1 + 0.1 * rng.standard_normal(K)).astype(_np(dtype))),
            "glu": [_rand(rng, (HIDDEN, K), dtype, 0.1) for _ in range(2)],
            "down": _rand(rng, (K, HIDDEN), dtype, 0.1)} for _ in range(layers)]
    head = {"gain": to_device((1 + 0.1 * rng.standard_normal(K)).astype(_np(dtype))),
            "w": _rand(rng, (40, K), dtype, 0.1)}
    return per, head


def _heads(x, heads: int):
    """[1, M, heads * D] as attention reads it: [1, heads, M, D], a strided view."""
    return x.reshape(1, x.shape[1], heads, HEAD_DIM).transpose(0, 2, 1, 3)


def _forward(fused, dense, residual, delta, per, head) -> list:
    """A decode's launches, each reading what one before it wrote: per layer the q/k/v GEMV
    with its norm, the rotation, cache write and attention, the o projection, the gate/up
    GEMV with its norm and SwiGLU, the down projection; then the head with the final norm.
    Returns every output."""
    rows = residual.shape[1]
    angles = np.arange(START, START + rows)[:, None] * (0.05 * np.arange(HEAD_DIM) + 0.1)
    cos = to_device(np.cos(angles).astype(np.float32)[None, None])
    sin = to_device(np.sin(angles).astype(np.float32)[None, None])
    positions = to_device(np.arange(START, START + rows, dtype=np.int64)[None])
    outs = []
    for layer in per:
        residual, q, k, v = fused.norm_gemv(residual, delta, layer["gain1"], EPS,
                                            residual.dtype, layer["qkv"], stream=None)
        cache_k, cache_v, attended = fused.rotary_kv_attention(
            _heads(q, HEADS), _heads(k, KV_HEADS), cos, sin, "halves", np.dtype(np.float32),
            None, None, residual.dtype, *layer["cache"], _heads(v, KV_HEADS), positions,
            KV_HEADS, HEADS // KV_HEADS, HEAD_DIM ** -0.5, np.dtype(np.float32), stream=None)
        projected = dense.gemv_rows(attended.reshape(rows, K), layer["o"], stream=None)
        residual, glu = fused.norm_glu(residual, projected.reshape(1, rows, K), layer["gain2"],
                                       EPS, residual.dtype, layer["glu"], residual.dtype,
                                       residual.dtype, stream=None)
        delta = dense.gemv_rows(glu.reshape(rows, HIDDEN), layer["down"],
                                stream=None).reshape(1, rows, K)
        outs += [residual, q, k, v, cache_k, cache_v, attended, projected, glu, delta]
    outs += list(fused.norm_gemv(residual, delta, head["gain"], EPS, residual.dtype,
                                 [head["w"]], stream=None))
    return outs


def _case(dtype: str, rows: int, layers: int = 2, seed: int = 0):
    rng = np.random.default_rng(seed + 100)
    residual = _rand(rng, (1, rows, K), dtype)
    delta = _rand(rng, (1, rows, K), dtype)
    return residual, delta, *_weights(dtype, layers, seed)


def _recorded(case):
    launches: list[Launch] = []
    outs = _forward(emulated(FUSED, record=launches), emulated(CudaKernels, record=launches),
                    *case)
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
    want = [to_host(v).tobytes() for v in _forward(*eager, *case)]
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


def _planted_program(tmp_path, file: str, old: str, new: str):
    folder = tmp_path / "kernels"
    shutil.copytree(KERNELS, folder)
    text = (folder / file).read_text()
    assert text.count(old) == 1
    (folder / file).write_text(text.replace(old, new))
    return dataclasses.replace(PROGRAM_MODULE, folder=folder)


def test_a_program_without_its_grid_barrier_is_caught(tmp_path):
    module = _planted_program(tmp_path, "program_tail.cuh",
                              "lk_program_grid_sync(lk_ps.barrier, lk_program_blocks());", "")
    case = _case("float16", 3, seed=1)
    launches, outs = _recorded(case)
    want = [to_host(v).tobytes() for v in _forward(*_eager_pair(), *case)]
    program = LaunchProgram.of(launches)
    wrong = []
    for descending in (False, True):
        run_program(program, 4, descending=descending, module=module)
        wrong.append([to_host(v).tobytes() for v in outs] != want)
    assert any(wrong)


def test_a_record_with_two_values_swapped_is_caught():
    case = _case("float32", 2, seed=2)
    launches, outs = _recorded(case)
    want = [to_host(v).tobytes() for v in _forward(*_eager_pair(), *case)]
    # the o projection's (a square weight) two weight strides swapped in its record: what the
    # kernel reads is the record, so its product is another (and every read stays in bounds)
    i = next(i for i, launch in enumerate(launches) if launch.name.startswith("gemv_vec"))
    bad = launches[i]
    values = list(bad.values)
    assert values[4] == values[5] == K and values[6:8] == [K, 1]  # K, N; w_nstep, w_kstep
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
