"""Launch programs on the GPU (``engines/native/program_launcher.py``): the decode chain's
launches (``suites/decode_chain.py``), recorded as native-cuda's launchers make them, run as
one cooperative ``lk_program`` launch give the launches' outputs bit for bit, launched
directly, replayed from a captured CUDA graph, and made by a deferral inside a capture.
The CPU emulator checks the same program in CI (``suites/test_launch_program.py``);
``scripts/gpu_program_probe.py`` times it."""
from __future__ import annotations

import pytest

from engines.native.cuda_kernels import CudaKernels
from engines.native.fused_kernels import FusedKernels
from engines.native.launch_program import LaunchProgram, programmable
from engines.native.launch_recorder import ProgramRecorder, recording
from engines.native.program_deferral import ProgramDeferral, deferring
from engines.native.program_launcher import ProgramLauncher
from engines.native.program_module import PROGRAM_BLOCK, program_family
from suites import decode_chain as chain
from suites.decode_chain import SMOLLM2, TINY

pytestmark = pytest.mark.gpu


def _bits(cp, values, stream) -> list[bytes]:
    stream.synchronize()
    return [cp.asnumpy(v.view(cp.uint8)).tobytes() for v in values]


def _spoil(cp, values, stream) -> None:
    with stream:
        for v in values:
            v.view(cp.uint8)[...] = 0x5A


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape,rows", [(TINY, 1), (TINY, 5), (SMOLLM2, 1)],
                         ids=["tiny-1", "tiny-5", "smollm2-1"])
def test_a_program_on_the_gpu_computes_its_launches_bit_for_bit(cp, stream, dtype, shape,
                                                                rows):
    fused, dense = program_family(FusedKernels)(0), CudaKernels(0)
    assert fused.BLOCK == PROGRAM_BLOCK
    with stream:
        case = (*chain.inputs(shape, dtype, rows, cp.asarray),
                *chain.weights(shape, dtype, cp.asarray))
    recorder = ProgramRecorder([fused, dense])
    with recording(recorder):
        outs = chain.forward(fused, dense, shape, *case, stream=stream)
    want = _bits(cp, outs, stream)
    assert not recorder.refused
    assert all(programmable(launch) for launch in recorder.launches)
    launcher = ProgramLauncher(cp, 0)
    program = launcher.upload(LaunchProgram.of(recorder.launches), stream)
    assert 1 <= program.blocks
    _spoil(cp, outs, stream)
    launcher.launch(program, stream)
    assert _bits(cp, outs, stream) == want
    # captured into a graph and replayed twice: the barrier's low bits are back at zero
    # after every run, so a replay finds it as the first run did
    stream.begin_capture()
    launcher.launch(program, stream)
    graph = stream.end_capture()
    for _ in range(2):
        _spoil(cp, outs, stream)
        graph.launch(stream)
        assert _bits(cp, outs, stream) == want
    # one grid barrier between each instruction and the next, three runs: every block
    # arrived once at each (the low bits), and each flipped the top bit (its parity)
    (count,) = (int(v) for v in program.barrier.get())
    assert count == (3 * (program.count - 1) % 2) << 31


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_a_deferred_capture_replays_the_launches_bits(cp, stream, dtype):
    """The chain's launchers run inside a capture with a launch-program deferral (what a
    graph slot would do): the graph holds programs, made during the capture (uploaded on a
    side stream), and its replay gives the eager launches' outputs bit for bit."""
    fused, dense = program_family(FusedKernels)(0), CudaKernels(0)
    with stream:
        case = (*chain.inputs(TINY, dtype, 3, cp.asarray),
                *chain.weights(TINY, dtype, cp.asarray))
    recorder = ProgramRecorder([fused, dense])
    with recording(recorder):
        want = _bits(cp, chain.forward(fused, dense, TINY, *case, stream=stream), stream)
    programs = ProgramLauncher(cp, 0)
    programs.upload(LaunchProgram.of(recorder.launches), stream)  # its module, loaded now
    deferral = ProgramDeferral(programs, recorder.names, stream,
                               cp.cuda.Stream(non_blocking=True))
    stream.begin_capture()
    with deferring(deferral, cp):
        outs = chain.forward(fused, dense, TINY, *case, stream=stream)
    graph = stream.end_capture()
    assert deferral.programs_made == 1
    assert deferral.launches_in_programs == len(recorder.launches)
    graph.launch(stream)
    assert _bits(cp, outs, stream) == want


@pytest.mark.claim("token_identity", "zero_staging", "readback_budget", "graph_replay")
@pytest.mark.parametrize("package_name", ["tiny_llama_static", "tiny_llama_pair_static"])
def test_native_cuda_with_programs_decodes_the_oracles_tokens(packages, monkeypatch,
                                                              package_name):
    """``LOCKSTEP_PROGRAMS=on``: the decode and verification slots capture launch programs
    (made during the capture, none left as a fallback), greedy is the oracle's with nothing
    staged and 4 bytes a token, and the pair's speculative tokens are greedy's (batch
    invariance: verification rows and decode rows are the same kernels' arithmetic)."""
    from engines.registry import get_engine_class
    from engines.workflow.speculative import speculative_decode
    from suites.support import device_greedy_matches_oracle

    monkeypatch.setenv("LOCKSTEP_PROGRAMS", "on")
    package = packages[package_name]
    engine = get_engine_class("native-cuda")(package)
    try:
        assert engine.programs is not None and engine.backend.fused_kernels().BLOCK == 128
        assert engine.graphs  # static caches: the slots capture
        for prompt in package.spec.prompts:
            greedy = device_greedy_matches_oracle(engine, package, list(prompt), 24)
            if package_name == "tiny_llama_pair_static":  # a drafter: speculative decoding
                spec = speculative_decode(engine, list(prompt), 24, 3)
                assert spec.tokens == greedy.tokens
            primary = greedy.ledger.slot("PRIMARY")
            assert primary.captures + primary.replays > 0 and primary.fallbacks == 0
        assert engine.programs.made > 0 and engine.programs.replaced > engine.programs.made
    finally:
        engine.close()
