"""Which kernels a verification pays for beyond a decode step, and where a prefill's time goes
(issue 37): native-cuda's PRIMARY (M = 1) and VERIFY (M = W + 1) graphs replayed under
torch's profiler (CUPTI sees CuPy's kernels), each kernel's device microseconds a replay side
by side; then one eager prefill of the prompt timed on the host (until ``run_component``
returns) against its wall with the stream synchronised, and its kernels' device total.

A random SmolLM2-shaped float16 package (static cache) with a prompt-lookup section, as
``gpu_round_probe.py`` builds it. Printed, and written as JSON to ``$OUT/kernel_profile.json``.
Usage (repo root, GPU image, torch importable): python scripts/gpu_kernel_profile.py [WIDTH]

The eager prefill is measured with the engine's prefill graphs cut off. Then
``prefill_as_graph``: after a verification and ``truncate(0)``, three eager prefills of the
same prompt compared with each other bit for bit, then nine with the prefill graphs on
(``engines/native/prefill_graphs.py``: eager, capture, seven replays), each timed the same
way and its last row compared with the third eager one's. Every row is read on the engine's
stream: the first eager prefills after a verification once looked wrong because the probe
read them on the current stream before the engine's stream had written them
(docs/evidence/2026-12-04-h200-readback/).

``VARIANT=tile`` routes every GEMV of 2 to 16 rows to ``gemv_tile`` (the prefill's kernel,
the same arithmetic) for the A/B; each run also writes one verification's logits to
``$OUT/verify_logits_<variant>.npy`` so the two can be compared bit for bit.
"""
from __future__ import annotations

import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPLAYS = 20


def _device_us(event) -> float:
    found = getattr(event, "device_time_total", None)  # torch >= 2.4; cuda_time_total before
    return float(found if found is not None else getattr(event, "cuda_time_total", 0.0))


def kernels_of(run, replays: int) -> tuple[list[dict], float]:
    """``run()`` ``replays`` times under the profiler: each kernel's calls and device us per
    run, and the device us of all of them together per run."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.init()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            run()
    rows = [{"kernel": e.key[:90], "calls": e.count / replays,
             "us": _device_us(e) / replays} for e in prof.key_averages() if _device_us(e) > 0]
    rows.sort(key=lambda r: -r["us"])
    return rows, sum(r["us"] for r in rows)


def prefill_as_graph(engine, session, prompt, cupy) -> dict:
    """The engine's prefill graphs against its eager prefill (the module doc): three eager
    prefills (the graphs cut off), then nine with them on; host and synchronised wall of
    each, and whether each last row is the eager one bit for bit."""
    # read on the engine's stream: a copy on the current one raced the forward
    # (docs/evidence/2026-12-04-h200-readback/)
    last_row = lambda out: out["logits"][0, -1].view(cupy.uint16).get(  # noqa: E731
        stream=engine.stream)
    prefill_graphs, engine.slots.prefill = engine.slots.prefill, None
    eagers = []
    try:
        for _ in range(3):
            session.truncate(0)
            eagers.append(last_row(session.forward(prompt, "prefill")))
    finally:
        engine.slots.prefill = prefill_graphs
    eager = eagers[-1]
    as_float = lambda bits: bits.view(np.float16).astype(np.float32)  # noqa: E731
    engine.reset_slot("PREFILL")
    hosts, walls, same, replayed = [], [], [], []
    for _ in range(9):
        session.truncate(0)
        engine.synchronize()
        t0 = time.perf_counter()
        result = session.forward(prompt, "prefill")
        t1 = time.perf_counter()
        engine.synchronize()
        hosts.append(1e3 * (t1 - t0))
        walls.append(1e3 * (time.perf_counter() - t0))
        replayed.append(engine.slots.replayed)
        row = last_row(result)
        same.append(bool((row == eager).all()))
    return {"eager_runs_bitwise_equal": [bool((e == eager).all()) for e in eagers],
            "eager_runs_argmax": [int(as_float(e).argmax()) for e in eagers],
            "graph_vs_eager_max_abs": float(np.abs(as_float(row) - as_float(eager)).max()),
            "replayed": replayed, "host_ms": hosts, "wall_ms": walls,
            "host_ms_median_replays": statistics.median(hosts[2:]),
            "wall_ms_median_replays": statistics.median(walls[2:]),
            "last_row_bitwise_equal": same}


def main(width: int = 7) -> dict:
    from engines.native.graph_slots import GraphSlot
    from engines.registry import get_engine_class
    from engines.workflow import greedy_decode
    from engines.workflow.session import DecodeSession
    from engines.workflow.speculative import speculative_decode
    from harness.decode_profile import graph_replay_ms
    from suites.lookup_support import with_prompt_lookup

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_round_probe import PHRASE, shape_package

    variant = os.environ.get("VARIANT", "base")
    if variant == "tile":
        from engines.native.launch import gemv as gemv_launch

        plain = gemv_launch.gemv_tile_rows
        gemv_launch.gemv_tile_rows = lambda m, k: plain(max(m, 17), k) if m > 1 else 0

    root = Path(tempfile.mkdtemp(prefix="kernel-profile-"))
    prompt = PHRASE * 3
    built = shape_package(root / "base")
    package = with_prompt_lookup(built, root / "lookup", width)
    engine = get_engine_class("native-cuda")(package)
    import cupy

    out: dict = {"variant": variant, "width": width, "prompt": len(prompt), "replays": REPLAYS}
    prefill_graphs, engine.slots.prefill = engine.slots.prefill, None  # eager prefills first
    try:
        for _ in range(2):
            greedy_decode(engine, prompt, 32, ignore_eos=True, pipelined=True)
            speculative_decode(engine, prompt, 64, width, ignore_eos=True)
        for slot in (GraphSlot.PRIMARY, GraphSlot.VERIFY):
            graph = engine.slots[slot].graph
            if graph is None:
                out[slot.name] = "no graph"
                continue
            ms = graph_replay_ms(engine, cupy) if slot is GraphSlot.PRIMARY else None
            if ms is None:
                for _ in range(10):
                    graph.launch(engine.stream)
                start, stop = cupy.cuda.Event(), cupy.cuda.Event()
                start.record(engine.stream)
                for _ in range(200):
                    graph.launch(engine.stream)
                stop.record(engine.stream)
                stop.synchronize()
                ms = cupy.cuda.get_elapsed_time(start, stop) / 200
            rows, total = kernels_of(lambda g=graph: g.launch(engine.stream), REPLAYS)
            engine.synchronize()
            out[slot.name] = {"replay_ms": ms, "kernel_us_total": total, "kernels": rows}

        session = DecodeSession(engine)
        hosts, walls = [], []
        for _ in range(7):
            session.truncate(0)
            engine.synchronize()
            t0 = time.perf_counter()
            session.forward(prompt, "prefill")
            t1 = time.perf_counter()
            engine.synchronize()
            hosts.append(1e3 * (t1 - t0))
            walls.append(1e3 * (time.perf_counter() - t0))

        def prefill():
            session.truncate(0)
            session.forward(prompt, "prefill")
        rows, total = kernels_of(prefill, 3)
        engine.synchronize()
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(5):
            prefill()
        engine.synchronize()
        profiler.disable()
        text = io.StringIO()
        stats = pstats.Stats(profiler, stream=text)
        stats.sort_stats("tottime").print_stats(30)
        stats.sort_stats("cumulative").print_stats(40)
        out["prefill_host_profile_5"] = text.getvalue()
        plan = engine._plans[session.component]
        out["plan_steps"] = len(getattr(plan, "steps", ()) or ())
        session.truncate(0)
        session.forward(prompt, "prefill")
        verify = session.forward(prompt[:width + 1], "verify")["logits"]
        if os.environ.get("OUT"):
            np.save(Path(os.environ["OUT"], f"verify_logits_{variant}.npy"),
                    verify.view(cupy.uint16).get(stream=engine.stream))
        out["prefill"] = {"host_ms_median": statistics.median(hosts),
                          "wall_ms_median": statistics.median(walls),
                          "kernel_us_total": total, "kernels": rows[:25]}
        engine.slots.prefill = prefill_graphs
        out["prefill_as_graph"] = prefill_as_graph(engine, session, prompt, cupy)
    finally:
        engine.close()
    return out


def _table(found: dict) -> str:
    lines = []
    lines.append(f"prefill_as_graph: {found.get('prefill_as_graph')}")
    for name in ("PRIMARY", "VERIFY", "prefill"):
        part = found.get(name)
        if not isinstance(part, dict):
            continue
        head = {k: round(v, 4) for k, v in part.items() if isinstance(v, float)}
        lines.append(f"{name}: {head}")
        for r in part["kernels"][:25]:
            lines.append(f"  {r['us']:9.2f} us {r['calls']:6.1f}x  {r['kernel']}")
    return "\n".join(lines)


if __name__ == "__main__":
    found = main(*[int(a) for a in sys.argv[1:]])
    print(_table(found))
    print(found.get("prefill_host_profile_5", ""))
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "kernel_profile.json").write_text(json.dumps(found, indent=1))
