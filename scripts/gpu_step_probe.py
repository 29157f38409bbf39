"""Where the host's time goes in one pipelined greedy step (issue 12: the pipelined loop is
device-bound only while the host queues a step faster than the device runs one). Each piece
of a step is wrapped with a perf_counter_ns timer (no profiler: nothing else is inflated),
then one graph launch is timed alone, idle and back to back. Diagnostic only.

Usage (repo root, on a CUDA machine): python scripts/gpu_step_probe.py PACKAGE [...]
Environment: TOKENS (default 128), DECODES (timed pipelined decodes, default 3).
"""
from __future__ import annotations

import collections
import os
import statistics
import sys
import time

TOKENS = int(os.environ.get("TOKENS", "128"))
DECODES = int(os.environ.get("DECODES", "3"))


def wrap(owner, name: str, label: str, samples: dict[str, list[int]]):
    """Replace ``owner.name`` by a timed twin; returns the undo."""
    original = getattr(owner, name)

    def timed(*args, **kwargs):
        t0 = time.perf_counter_ns()
        try:
            return original(*args, **kwargs)
        finally:
            samples[label].append(time.perf_counter_ns() - t0)

    setattr(owner, name, timed)
    return lambda: setattr(owner, name, original)


def pieces():
    """(owner, attribute, label) of every piece a pipelined step is made of."""
    from engines.native import capacity_cache, graph_slots
    from engines.tensor_ops import pending
    from engines.workflow import session, state

    return [
        (session.DecodeSession, "forward_fed", "forward_fed (queue a forward)"),
        (state.DecodeState, "feeds", "  state.feeds"),
        (state.DecodeState, "absorb", "  state.absorb"),
        (capacity_cache.CapacityCells, "feeds", "  capacity feeds"),
        (capacity_cache.CapacityCells, "outputs", "  capacity outputs"),
        (graph_slots.Signature, "of", "  Signature.of"),
        (graph_slots.CupyGraphDevice, "accepts", "  accepts (each feed)"),
        (graph_slots.CupyGraphDevice, "copy_many", "  copy_many"),
        (graph_slots.CupyGraphDevice, "launch", "  graph launch"),
        (session.DecodeSession, "_next_async", "_next_async (argmax, copy, event)"),
        (pending.DeviceToken, "_wait", "token wait"),
    ]


def probe(path: str) -> None:
    import cupy as cp

    from engines.native.graph_slots import GraphSlot
    from engines.package import load_package
    from engines.registry import get_engine_class
    from engines.workflow import greedy_decode

    package = load_package(path)
    engine = get_engine_class("native-cuda")(package, graphs=True)
    prompt = list(package.spec.prompts[0])
    for _ in range(2):
        greedy_decode(engine, prompt, TOKENS, ignore_eos=True, pipelined=True)
    engine.synchronize()
    samples: dict[str, list[int]] = collections.defaultdict(list)
    undo = [wrap(owner, name, label, samples) for owner, name, label in pieces()
            if hasattr(owner, name)]  # an older tree may lack a piece
    steps: list[float] = []
    try:
        for _ in range(DECODES):
            result = greedy_decode(engine, prompt, TOKENS, ignore_eos=True, pipelined=True)
            steps.extend(result.step_s[2:])
    finally:
        for u in undo:
            u()
    engine.synchronize()
    plain = []
    for _ in range(DECODES):
        plain.extend(greedy_decode(engine, prompt, TOKENS, ignore_eos=True).step_s[2:])
    engine.synchronize()
    count = DECODES * (TOKENS - 1)
    print(f"=== {package.spec.name}: pipelined step {statistics.median(steps) * 1e3:.3f} ms "
          f"(timed pieces on), plain step {statistics.median(plain) * 1e3:.3f} ms; "
          f"{count} forwards")
    print(f"{'piece':40s} {'calls/step':>10s} {'median us':>10s} {'us/step':>9s}")
    for _, _, label in pieces():
        got = samples.get(label, [])
        if got:
            per = len(got) / count
            med = statistics.median(got) / 1e3
            print(f"{label:40s} {per:10.2f} {med:10.1f} {sum(got) / 1e3 / count:9.1f}")
    state = engine.slots[GraphSlot.PRIMARY]
    if state.graph is None:
        print("no PRIMARY graph")
        return
    stream = engine.stream
    idle = []
    for _ in range(50):
        stream.synchronize()
        t0 = time.perf_counter_ns()
        state.graph.launch(stream)
        idle.append(time.perf_counter_ns() - t0)
    stream.synchronize()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    t0 = time.perf_counter_ns()
    for _ in range(200):
        state.graph.launch(stream)
    host = (time.perf_counter_ns() - t0) / 200
    stop.record(stream)
    stop.synchronize()
    device = cp.cuda.get_elapsed_time(start, stop) / 200
    print(f"graph launch, idle device: {statistics.median(idle) / 1e3:.1f} us host "
          f"(median of 50); 200 back to back: {host / 1e3:.1f} us host a launch, "
          f"{device:.3f} ms device a replay")
    engine.close()


def main(paths: list[str]) -> int:
    os.environ.setdefault("LOCKSTEP_NATIVE_CUDA_GRAPHS", "on")
    for path in paths:
        probe(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
