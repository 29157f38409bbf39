"""What one persistent kernel per decode step could reach at best (issue 37 asks for a step
within 4x the floor), measured before it is built: ``scripts/persistent_bound.cu`` runs
SmolLM2-135M's float16 decode chain as stages (per layer q/k/v, the KV cache read at
position 128, o, gate/up, down; then the head: 151 stages, each reading the bytes that
stage of the real step reads), with no arithmetic that matters. Timed on one device, in
turns, with CUDA events (median of ``REPEATS`` turns of ``REPLAYS`` steps):

- ``persistent``: one cooperative launch, a grid barrier between stages (the launch
  programs' barrier), for grids of 1 to the most resident blocks a multiprocessor and
  block sizes ``THREADS``, polled tight or with a ``SLEEP_NS`` nanosleep;
- ``launches``: the same stages as one launch each, replayed from a CUDA graph, plain and as
  dependent launches (native-cuda's way today);

each in four modes: 0 the waits alone, 1 with the activations' round trip through L2, 2 with
the weights read after the wait, 3 with the next stage's weights in registers before it.
First, with no bytes: the barrier alone at ``SMALL_GRIDS`` blocks, and a launch of one block
and of a block a multiprocessor (what 151 launches cost before any work). Then dependent
launches of one, two and the most blocks a multiprocessor in modes 1 to 3, each also with
its stage asking L2 for the weights of the stage ``AHEAD`` after it (5: a layer ahead;
weights depend on nothing computed, so they can be asked for any time). Mode 3's best is
what such a kernel costs before its arithmetic; the floor is the bytes over a
device-to-device copy's bandwidth, as ``lockstep bench`` measures it. Printed, and
written to ``$OUT/persistent_bound.json``. Usage (repo root, CUDA machine with CuPy):
``python scripts/gpu_persistent_bound.py``.
"""
from __future__ import annotations

import ctypes
import json
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engines.cuda_module import CudaModule  # noqa: E402
from engines.native.dependent_launch import DependentLaunch, driver_function  # noqa: E402
from harness.bench import cuda_copy_bandwidth  # noqa: E402
from suites.decode_chain import SMOLLM2  # noqa: E402

REPEATS = int(os.environ.get("REPEATS", 5))
REPLAYS = int(os.environ.get("REPLAYS", 20))
THREADS = [int(t) for t in os.environ.get("THREADS", "128 256 512").split()]
SLEEP_NS = [int(t) for t in os.environ.get("SLEEP_NS", "0 64").split()]
SMALL_GRIDS = [int(t) for t in os.environ.get("SMALL_GRIDS", "1 8 33 66").split()]
AHEAD = [int(t) for t in os.environ.get("AHEAD", "5 10").split()]
MODES = (0, 1, 2, 3)
MODULE = CudaModule(Path(__file__).parent, "persistent_bound.cu",
                    ("lk_bound_persistent", "lk_bound_launch"), options=("-std=c++17",))
_COOPERATIVE, _PROGRAMMATIC = 2, 6  # CUlaunchAttributeID values


def stage_bytes(shape=SMOLLM2, itemsize: int = 2, position: int = 128) -> list[int]:
    """The bytes each stage of a float16 decode step reads: per layer the q/k/v weights,
    the K and V cache up to ``position``, o, gate/up, down; then the tied head."""
    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    layer = [h * (h + 2 * kv) * itemsize, 2 * kv * position * itemsize, h * h * itemsize,
             2 * h * shape.mlp * itemsize, shape.mlp * h * itemsize]
    return layer * shape.layers + [shape.vocab * h * itemsize]


class Bound:
    """The module, its two kernels, the stage table and the cooperative and dependent
    launches through ``cuLaunchKernelEx``."""

    def __init__(self, cp):
        self.cp = cp
        functions = MODULE.load(cp.cuda.Device().id)
        self.persistent = functions["lk_bound_persistent"]
        self.single = functions["lk_bound_launch"]
        entry = driver_function("cuLaunchKernelEx", [ctypes.c_void_p] * 4)
        self.occupancy = driver_function(
            "cuOccupancyMaxActiveBlocksPerMultiprocessor",
            [ctypes.POINTER(ctypes.c_int), ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t])
        if entry is None or self.occupancy is None:
            raise SystemExit("no cuLaunchKernelEx or occupancy query in the CUDA driver")
        self.cooperative = DependentLaunch(entry, _COOPERATIVE)
        self.dependent = DependentLaunch(entry, _PROGRAMMATIC)
        sizes = stage_bytes()
        self.stages = len(sizes)
        self.bytes = sum(sizes)
        words = [0]
        for size in sizes:
            words.append(words[-1] + size // 16)
        self.start = cp.asarray(words, dtype=cp.int64)
        self.weights = cp.arange(words[-1] * 4, dtype=cp.uint32)
        self.act = cp.zeros(2 * SMOLLM2.hidden, dtype=cp.float32)
        self.bar = cp.zeros(1, dtype=cp.uint32)
        self.sms = int(cp.cuda.Device().attributes["MultiProcessorCount"])
        self._keep: list = []

    def resident(self, threads: int) -> int:
        per_sm = ctypes.c_int(0)
        status = self.occupancy(ctypes.byref(per_sm), self.persistent.kernel.ptr, threads, 0)
        if status:
            raise SystemExit(f"occupancy query failed: CUresult {status}")
        return per_sm.value

    def _params(self, values: list):
        """The kernel's argument pointers (kept alive until the next call)."""
        cells = list(values)
        table = (ctypes.c_void_p * len(cells))(*[ctypes.addressof(c) for c in cells])
        self._keep = [cells, table]
        return ctypes.addressof(table)

    def launch_persistent(self, blocks: int, threads: int, mode: int, sleep_ns: int, stream):
        params = self._params([
            ctypes.c_void_p(self.weights.data.ptr), ctypes.c_void_p(self.start.data.ptr),
            ctypes.c_int(self.stages), ctypes.c_void_p(self.act.data.ptr),
            ctypes.c_int(SMOLLM2.hidden), ctypes.c_void_p(self.bar.data.ptr),
            ctypes.c_int(mode), ctypes.c_int(sleep_ns)])
        self.cooperative.launch(self.persistent.kernel.ptr, (blocks, 1, 1), (threads, 1, 1), 0,
                                stream.ptr, params)

    def launch_chain(self, blocks: int, threads: int, mode: int, dependent: bool, stream,
                     ahead: int = 0):
        """The stages as one launch each, on ``stream``; ``ahead``: each also asks L2 for
        the weights of the stage that many after it."""
        for s in range(self.stages):
            args = (self.weights, self.start, self.cp.int32(s), self.cp.int32(self.stages),
                    self.act, self.cp.int32(SMOLLM2.hidden), self.cp.int32(mode),
                    self.cp.int32(ahead))
            if not dependent:
                self.single((blocks,), (threads,), args, stream=stream)
                continue
            params = self._params([
                ctypes.c_void_p(self.weights.data.ptr), ctypes.c_void_p(self.start.data.ptr),
                ctypes.c_int(s), ctypes.c_int(self.stages), ctypes.c_void_p(self.act.data.ptr),
                ctypes.c_int(SMOLLM2.hidden), ctypes.c_int(mode), ctypes.c_int(ahead)])
            self.dependent.launch(self.single.kernel.ptr, (blocks, 1, 1), (threads, 1, 1), 0,
                                  stream.ptr, params)


def time_ms(cp, run, stream) -> dict:
    """``run()`` queues one step on ``stream``: ms a step, median of REPEATS turns of
    REPLAYS steps (one untimed turn first), and each turn's figure."""
    start, end = cp.cuda.Event(), cp.cuda.Event()
    turns = []
    for turn in range(REPEATS + 1):
        start.record(stream)
        for _ in range(REPLAYS):
            run()
        end.record(stream)
        end.synchronize()
        if turn:
            turns.append(cp.cuda.get_elapsed_time(start, end) / REPLAYS)
    return {"ms": statistics.median(turns), "turns": [round(t, 4) for t in turns]}


def graph_of(cp, bound: Bound, blocks: int, threads: int, mode: int, dependent: bool, stream,
             ahead: int = 0):
    stream.begin_capture()
    bound.launch_chain(blocks, threads, mode, dependent, stream, ahead)
    return stream.end_capture()


def main() -> int:
    import cupy as cp

    stream = cp.cuda.Stream(non_blocking=True)
    bound = Bound(cp)
    bandwidth = cuda_copy_bandwidth(cupy=cp).gb_per_s
    floor_ms = bound.bytes / (bandwidth * 1e9) * 1e3
    found: dict = {"device": cp.cuda.runtime.getDeviceProperties(0)["name"].decode(),
                   "sms": bound.sms, "stages": bound.stages, "bytes": bound.bytes,
                   "bandwidth_gbs": bandwidth, "floor_ms": floor_ms, "repeats": REPEATS,
                   "replays": REPLAYS, "rows": []}
    print(f"{found['device']}: {bound.stages} stages, {bound.bytes / 1e6:.1f} MB, "
          f"{bandwidth:.0f} GB/s, floor {floor_ms:.4f} ms", flush=True)

    def row(kind: str, blocks: int, threads: int, mode: int, extra: dict, timed: dict):
        entry = {"kind": kind, "blocks": blocks, "threads": threads, "mode": mode, **extra,
                 **timed, "x_floor": timed["ms"] / floor_ms}
        found["rows"].append(entry)
        print(f"{kind:10s} blocks {blocks:4d} threads {threads:4d} mode {mode} {extra} "
              f"{timed['ms']:.4f} ms ({entry['x_floor']:.2f}x floor) {timed['turns']}",
              flush=True)

    # what a stage costs before any bytes: a grid barrier by grid size (from a block to a
    # multiprocessor's most), and a launch replayed from a graph with one block and with a
    # block a multiprocessor (151 of them at 2 us would already be 0.30 ms, over 4x the floor)
    for blocks in SMALL_GRIDS:
        row("persistent", blocks, THREADS[0], 0, {"sleep_ns": 0},
            time_ms(cp, lambda: bound.launch_persistent(blocks, THREADS[0], 0, 0, stream),
                    stream))
    for blocks in (1, bound.sms):
        for dependent in (False, True):
            graph = graph_of(cp, bound, blocks, THREADS[0], 0, dependent, stream)
            row("launches", blocks, THREADS[0], 0, {"dependent": dependent},
                time_ms(cp, lambda: graph.launch(stream), stream))
    # weights asked into L2 AHEAD stages early (5: a layer), dependent launches of fewer
    # blocks than the most resident, so the next launch's blocks find room beside them
    for threads in THREADS[:2]:
        for blocks in (bound.sms, 2 * bound.sms, bound.resident(threads) * bound.sms):
            for mode in (1, 2, 3):
                for ahead in (0, *AHEAD):
                    graph = graph_of(cp, bound, blocks, threads, mode, True, stream, ahead)
                    row("launches", blocks, threads, mode, {"dependent": True, "ahead": ahead},
                        time_ms(cp, lambda: graph.launch(stream), stream))
    for threads in THREADS:
        most = bound.resident(threads)
        grids = sorted({bound.sms, most * bound.sms})
        for mode in MODES:
            for blocks in grids:
                for sleep_ns in SLEEP_NS:
                    row("persistent", blocks, threads, mode, {"sleep_ns": sleep_ns},
                        time_ms(cp, lambda: bound.launch_persistent(
                            blocks, threads, mode, sleep_ns, stream), stream))
            blocks = grids[-1]
            for dependent in (False, True):
                graph = graph_of(cp, bound, blocks, threads, mode, dependent, stream)
                row("launches", blocks, threads, mode, {"dependent": dependent},
                    time_ms(cp, lambda: graph.launch(stream), stream))
    stream.synchronize()
    if int(bound.bar.get()[0]) & 0x7fffffff:
        print("the barrier word's low bits are not zero after the runs", flush=True)
        found["barrier_ok"] = False
    else:
        found["barrier_ok"] = True
    best = min((r for r in found["rows"] if r["kind"] == "persistent" and r["mode"] == 3),
               key=lambda r: r["ms"])
    found["best_persistent_mode3"] = best
    print(f"best persistent with its weights: {best['ms']:.4f} ms = {best['x_floor']:.2f}x "
          f"floor ({best['blocks']} blocks of {best['threads']})", flush=True)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "persistent_bound.json").write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
