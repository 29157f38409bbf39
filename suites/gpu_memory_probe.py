"""Run in a process of its own: device memory across many decode steps on native-cuda.

The counting allocator's counters and the driver's free memory are process-wide, so the
flatness test (suites/test_native_cuda_decode.py) starts this module in a fresh interpreter
and reads one JSON line from it.

Usage: python -m suites.gpu_memory_probe PACKAGE_NAME STEPS [MODE]

MODE ``default`` (the engine's own choice), ``eager`` (graphs off) or ``graphs`` (graphs
on: every measured decode step is a PRIMARY replay; the slot counters are reported, and
the live counts include the graph slots' pools).
"""
from __future__ import annotations

import json
import sys


MODES = {"default": None, "eager": False, "graphs": True}


def probe(package_name: str, steps: int, mode: str = "default") -> dict:
    from engines.device_memory import driver_free_bytes
    from engines.registry import get_engine_class
    from engines.workflow import DecodeSession, greedy_decode
    from harness.packages import resolve_package

    package = resolve_package(package_name)
    engine = get_engine_class("native-cuda")(package, graphs=MODES[mode])
    prompt = list(package.spec.prompts[0])
    greedy_decode(engine, prompt, 8)  # warm-up: every kernel compiled, pools primed, graphs captured
    engine.reset_ledger()  # the measured loop's own counters
    session = DecodeSession(engine)
    out = session.forward(prompt, "prefill")
    token = session.last_token(out["logits"])
    length = session.position
    # One decode forward, then roll back to the same length: the state is the same before
    # every step, so anything that grows is a leak.
    series = []
    engine.stream.synchronize()
    free_before = driver_free_bytes()
    for i in range(steps + 1):
        out = session.forward([token], "decode")
        token = session.last_token(out["logits"])
        session.truncate(length)
        del out
        engine.publish_memory()
        series.append({"iteration": i, "live_allocations": engine.ledger.live_allocations,
                       "live_bytes": engine.ledger.live_bytes})
    engine.stream.synchronize()
    free_after = driver_free_bytes()
    return {"package": package_name, "steps": steps, "series": series,
            "free_before": free_before, "free_after": free_after,
            "readback_token_bytes": engine.ledger.readback_bytes["token_id"],
            "host_staging": engine.ledger.host_staging, "mode": mode,
            "graphs": engine.graphs,
            "graph_slots": {name: vars(c) for name, c in engine.ledger.graph_slots.items()},
            "slots": [state.describe() for state in engine.slots.values()]}


if __name__ == "__main__":
    print(json.dumps(probe(sys.argv[1], int(sys.argv[2]),
                           sys.argv[3] if len(sys.argv) > 3 else "default")))
