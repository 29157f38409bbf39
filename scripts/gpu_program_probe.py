"""Whether a launch program (one persistent cooperative launch, ``kernels/program.cu``) cuts
native-cuda's decode step toward the floor (issue 37: 0.772 ms a token, 11.4 x the floor).

The decode chain of ``suites/decode_chain.py`` at SmolLM2-135M's shapes (30 layers of
q/k/v with its norm, rotation + cache write + attention, o, gate/up with its norm and
SwiGLU, down; then the tied head with the final norm: 151 launches, random weights), at
``ROWS`` rows (1: decode, 8: a width-7 verification), in float16 and bfloat16. Timed side by
side in one process, each a CUDA graph replayed (CUDA events, median of ``REPEATS`` turns of
``REPLAYS`` replays, the graphs taken in turns):
- ``launches``: the recorded launches as native-cuda makes them (dependent launches), with
  attention in 256-thread blocks (today's forward);
- ``launches128``: the same with 128-thread attention blocks (what a program runs);
- ``program``: the 128-thread launches as one ``lk_program`` launch, its grid the most
  blocks the device holds; ``program_sms``: the same on one block a multiprocessor;
- ``deferred``: the chain's launchers run again inside a capture with a launch-program
  deferral (``engines/native/program_deferral.py``: what a graph slot would do), its
  programs uploaded on a side stream during the capture.
- ``barriers``/``barriers_sms``: the program's table with every instruction's grid zero,
  so each instruction is its grid barrier alone (what 150 barriers cost, no work);
- ``program_minN`` for each N of ``MIN_BLOCKS`` (e.g. "6 8"): the program compiled to fit N
  blocks a multiprocessor (registers capped, ``program_module(ops, N)``), at that many.
Every program's outputs are checked bit for bit against ``launches128``'s. The floor: the
chain's weight bytes over a device-to-device copy's bandwidth (256 MiB, read + write, median
of 5), as ``lockstep bench`` measures it. Written to ``$OUT/program_probe.json`` and printed.
Usage (repo root, GPU image): ``python scripts/gpu_program_probe.py``.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.native.cuda_kernels import CudaKernels  # noqa: E402
from engines.native.fused_kernels import FusedKernels  # noqa: E402
from engines.native.launch_program import LaunchProgram  # noqa: E402
from engines.native.launch_recorder import (ProgramRecorder, kernel_names,  # noqa: E402
                                            recording)
from engines.native.program_deferral import ProgramDeferral, deferring  # noqa: E402
from engines.native.program_launcher import ProgramLauncher  # noqa: E402
from engines.native.program_module import program_family  # noqa: E402
from suites import decode_chain as chain  # noqa: E402

REPEATS = int(os.environ.get("REPEATS", 5))
REPLAYS = int(os.environ.get("REPLAYS", 50))
ROWS = [int(r) for r in os.environ.get("ROWS", "1 8").split()]
DTYPES = os.environ.get("DTYPES", "float16 bfloat16").split()
MIN_BLOCKS = [int(n) for n in os.environ.get("MIN_BLOCKS", "").split()]


def bandwidth_gbs(cp) -> float:
    """A 256 MiB device-to-device copy's bytes moved (read + write) a second, median of 5."""
    n = 256 << 20
    src, dst = cp.empty(n, cp.uint8), cp.empty(n, cp.uint8)
    stream = cp.cuda.Stream(non_blocking=True)
    start, end = cp.cuda.Event(), cp.cuda.Event()
    times = []
    for i in range(6):
        start.record(stream)
        cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, n, 3, stream.ptr)
        end.record(stream)
        end.synchronize()
        if i:
            times.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
    return 2 * n / statistics.median(times) / 1e9


def record(cp, fused, dense, case, stream):
    recorder = ProgramRecorder([fused, dense])
    with recording(recorder):
        outs = chain.forward(fused, dense, chain.SMOLLM2, *case, stream=stream)
    stream.synchronize()
    if recorder.refused:
        raise SystemExit("a launch went through CuPy's own call: no program")
    pointers = {name: ptr for ptr, name in recorder.names.items()}
    return recorder.launches, pointers, outs


def capture_launches(cp, launcher, launches, pointers, stream):
    stream.begin_capture()
    for launch in launches:
        launcher.launch_packed(pointers[launch.name], (tuple(launch.grid) + (1, 1))[:3],
                               (tuple(launch.block) + (1, 1))[:3], launch.fmt,
                               list(launch.values), stream, launch.shared_mem)
    return stream.end_capture()


class _Direct:
    """A program launched on the stream each replay, where its capture failed."""

    def __init__(self, programs, device_program):
        self.programs, self.device_program = programs, device_program

    def launch(self, stream):
        self.programs.launch(self.device_program, stream)


def capture_program(programs, device_program, stream, notes: dict, name: str):
    """A graph of the program's one launch; where the capture fails (a driver that cannot
    capture a cooperative launch), the launch itself, and why in ``notes``."""
    try:
        stream.begin_capture()
        programs.launch(device_program, stream)
        return stream.end_capture()
    except Exception as error:  # noqa: BLE001 - the probe reports it and goes on
        try:
            stream.end_capture()
        except Exception:  # noqa: BLE001
            pass
        notes[name] = f"not captured ({type(error).__name__}: {error}); launched directly"
        return _Direct(programs, device_program)


def capture_deferred(cp, programs, fused, dense, case, stream, notes: dict):
    """The chain's launchers run inside a capture with a deferral: (graph, its outputs,
    the deferral), or (None, None, None) with why in ``notes``."""
    deferral = ProgramDeferral(programs, kernel_names(fused, dense), stream,
                               cp.cuda.Stream(non_blocking=True))
    try:
        stream.begin_capture()
        with deferring(deferral, cp):
            outs = chain.forward(fused, dense, chain.SMOLLM2, *case, stream=stream)
        graph = stream.end_capture()
    except Exception as error:  # noqa: BLE001 - the probe reports it and goes on
        try:
            stream.end_capture()
        except Exception:  # noqa: BLE001
            pass
        notes["deferred"] = f"capture failed ({type(error).__name__}: {error})"
        return None, None, None
    notes["deferred_programs"] = deferral.programs_made
    notes["deferred_launches_in_programs"] = deferral.launches_in_programs
    return graph, outs, deferral


def timed_ms(cp, graphs: dict, stream) -> dict:
    """Each graph's ms a replay: median over REPEATS turns, the graphs taken in turn."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    for graph in graphs.values():
        for _ in range(3):
            graph.launch(stream)
    stream.synchronize()
    times = {name: [] for name in graphs}
    for _ in range(REPEATS):
        for name, graph in graphs.items():
            start.record(stream)
            for _ in range(REPLAYS):
                graph.launch(stream)
            end.record(stream)
            end.synchronize()
            times[name].append(cp.cuda.get_elapsed_time(start, end) / REPLAYS)
    return {name: round(statistics.median(t), 4) for name, t in times.items()}


def bits(cp, outs, stream) -> list[bytes]:
    stream.synchronize()
    return [cp.asnumpy(v.view(cp.uint8)).tobytes() for v in outs]


def main() -> int:
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    dense = CudaKernels(0)
    fused256, fused128 = FusedKernels(0), program_family(FusedKernels)(0)
    programs = ProgramLauncher(cp, 0)
    sms = int(cp.cuda.Device(0).attributes["MultiProcessorCount"])
    result = {"gpu": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
              "sms": sms, "replays": REPLAYS, "repeats": REPEATS, "rows": {}}
    gbs = bandwidth_gbs(cp)
    result["bandwidth_gbs"] = round(gbs, 1)
    for dtype in DTYPES:
        with stream:
            weights = chain.weights(chain.SMOLLM2, dtype, cp.asarray)
        layers, head = weights
        weight_bytes = sum(a.nbytes for layer in layers for key, value in layer.items()
                           if key != "cache"
                           for a in (value if isinstance(value, list) else [value]))
        weight_bytes += sum(a.nbytes for a in head.values())
        floor_ms = weight_bytes / (gbs * 1e9) * 1e3
        for rows in ROWS:
            with stream:
                case = (*chain.inputs(chain.SMOLLM2, dtype, rows, cp.asarray), *weights)
            l256, p256, _ = record(cp, fused256, dense, case, stream)
            l128, p128, outs = record(cp, fused128, dense, case, stream)
            want = bits(cp, outs, stream)
            program = LaunchProgram.of(l128)
            device_program = programs.upload(program, stream)
            notes: dict = {}
            one_per_sm = dataclasses.replace(device_program,
                                             blocks=min(sms, device_program.blocks))
            graphs = {"launches": capture_launches(cp, fused256._launcher, l256, p256, stream),
                      "launches128": capture_launches(cp, fused128._launcher, l128, p128,
                                                      stream),
                      "program": capture_program(programs, device_program, stream, notes,
                                                 "program"),
                      "program_sms": capture_program(programs, one_per_sm, stream, notes,
                                                     "program_sms")}
            with stream:  # where the upload went
                empty = dataclasses.replace(device_program, table=device_program.table.copy())
                empty.table[:, 1] = 0  # every instruction its barrier alone
            graphs["barriers"] = capture_program(programs, empty, stream, notes, "barriers")
            graphs["barriers_sms"] = capture_program(
                programs, dataclasses.replace(empty, blocks=min(sms, empty.blocks)), stream,
                notes, "barriers_sms")
            for n in MIN_BLOCKS:
                capped = ProgramLauncher(cp, 0, min_blocks=n)
                variant = capped.upload(program, stream)
                notes.setdefault("min_blocks", {})[n] = variant.blocks
                graphs[f"program_min{n}"] = capture_program(capped, variant, stream, notes,
                                                            f"program_min{n}")
            graph, deferred_outs, deferral = capture_deferred(cp, programs, fused128, dense,
                                                              case, stream, notes)
            identical = {}
            if graph is not None:
                graphs["deferred"] = graph
                graph.launch(stream)
                identical["deferred"] = bits(cp, deferred_outs, stream) == want
            for name in ("program", "program_sms", *(f"program_min{n}" for n in MIN_BLOCKS)):
                with stream:
                    for v in outs:
                        v.view(cp.uint8)[...] = 0x5A
                graphs[name].launch(stream)
                identical[name] = bits(cp, outs, stream) == want
            ms = timed_ms(cp, graphs, stream)
            row = {"launches": len(l128), "program_blocks": device_program.blocks,
                   "program_shared_mem": device_program.shared_mem,
                   "weight_bytes": weight_bytes, "floor_ms": round(floor_ms, 4),
                   "ms": ms, "x_floor": {k: round(v / floor_ms, 2) for k, v in ms.items()},
                   "program_vs_launches": round(ms["launches"] / ms["program"], 3),
                   "identical_to_launches128": identical, "notes": notes}
            result["rows"][f"{dtype}-{rows}"] = row
            print(dtype, rows, json.dumps(row), flush=True)
    out = Path(os.environ.get("OUT", "."))
    out.mkdir(parents=True, exist_ok=True)
    (out / "program_probe.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
