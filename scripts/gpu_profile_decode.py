"""Where a native-cuda decode step's time goes (issue 12): host work, the replayed graph,
and each kernel's share of it. Diagnostic only: the figures issue 12 is judged on come from
``lockstep bench`` run side by side; this says what bounds them.

For each package: a greedy decode with eos ignored (warm-up, then timed), the same decode
under cProfile (the host functions that cost most), the PRIMARY slot's graph replayed back
to back and timed with CUDA events (the device time of one forward), and, where torch is
importable, one replay under torch's CUPTI profiler (every kernel's device time, by name).

Usage (repo root, on a CUDA machine): python scripts/gpu_profile_decode.py PACKAGE [...]
Environment: TOKENS (default 128), REPLAYS (default 200), PREFILL (tokens of a prefill whose
kernels and host work are profiled too; default 0, none), VERIFY (rows of a verification
forward whose VERIFY graph is timed and profiled beside the PRIMARY one, and whose single
forward is timed beside an M = 1 one, host and device apart; default 0, none).
"""
from __future__ import annotations

import cProfile
import io
import os
import pstats
import statistics
import sys
import time

TOKENS = int(os.environ.get("TOKENS", "128"))
REPLAYS = int(os.environ.get("REPLAYS", "200"))
PREFILL = int(os.environ.get("PREFILL", "0"))  # tokens of a profiled prefill (0: none)
VERIFY = int(os.environ.get("VERIFY", "0"))  # rows of a profiled verification (0: none)


def decode_steps(engine, prompt):
    from engines.workflow import greedy_decode

    result = greedy_decode(engine, prompt, TOKENS, ignore_eos=True)
    engine.synchronize()
    return result


def top_functions(profiler: cProfile.Profile, rows: int = 30) -> str:
    """The host functions that cost most, by their own time and with their callees."""
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text)
    stats.sort_stats("tottime").print_stats(rows)
    stats.sort_stats("cumulative").print_stats(rows)
    return text.getvalue()


def profile_host(engine, prompt) -> str:
    profiler = cProfile.Profile()
    profiler.enable()
    decode_steps(engine, prompt)
    profiler.disable()
    return top_functions(profiler)


def replay_ms(engine, cp, slot: str = "PRIMARY") -> float:
    """Device ms of one replay of a slot's graph, launched REPLAYS times back to back."""
    from engines.native.graph_slots import GraphSlot

    state = engine.slots[GraphSlot[slot]]
    if state.graph is None:
        return float("nan")
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(10):
        state.graph.launch(engine.stream)
    start.record(engine.stream)
    for _ in range(REPLAYS):
        state.graph.launch(engine.stream)
    stop.record(engine.stream)
    stop.synchronize()
    return cp.cuda.get_elapsed_time(start, stop) / REPLAYS


def kernel_table(engine, slot: str = "PRIMARY") -> str:
    """Five replays of a slot's graph under torch's profiler (CUPTI sees CuPy's kernels
    too), by kernel name."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except Exception as exc:  # noqa: BLE001 - diagnostic: say why and go on
        return f"(no kernel table: torch unavailable: {exc})"
    from engines.native.graph_slots import GraphSlot

    state = engine.slots[GraphSlot[slot]]
    torch.cuda.init()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            state.graph.launch(engine.stream)
        engine.synchronize()
    return prof.key_averages().table(sort_by="cuda_time_total", row_limit=40)


def verify_profile(engine, cp, prompt) -> str:
    """A verification forward of VERIFY rows after the prompt (captured on its second
    call), its VERIFY graph timed back to back and profiled: what a verification costs over
    the PRIMARY replay, kernel by kernel."""
    from engines.workflow.session import DecodeSession

    vocab = engine.package.spec.vocab_size
    rows = [(5 * i + 11) % vocab for i in range(VERIFY)]
    session = DecodeSession(engine)
    session.forward(prompt, "prefill")
    start = session.position
    for _ in range(3):
        session.truncate(start)
        session.forward(rows, "verify")
    engine.synchronize()
    device = replay_ms(engine, cp, "VERIFY")
    return (f"VERIFY graph replay ({VERIFY} rows), back to back: {device:.3f} ms a forward\n"
            + kernel_table(engine, "VERIFY") + "\n" + single_forward_split(engine, prompt))


def single_forward_split(engine, prompt, repeats: int = 20) -> str:
    """What ``bench-forward`` times, taken apart: a forward of M = 1 (decode, PRIMARY) and of
    M = VERIFY (verify, VERIFY) after the prompt, each from the same cache, timed to the
    forward's return (the host's enqueueing) and to its token's readback (the device done);
    then the host functions of each under cProfile (decode first), from forwards of their
    own: a profiled forward's host time is not the timed one's (until run 15, the timed
    verification forwards ran under the profiler and the decode ones did not, which added
    about 0.4 ms to the verification's enqueue figure)."""
    from engines.workflow.session import DecodeSession

    vocab = engine.package.spec.vocab_size
    session = DecodeSession(engine)
    session.forward(prompt, "prefill")
    start = session.position
    lines, tables = [], []
    for m, phase in ((1, "decode"), (VERIFY, "verify")):
        profiler = cProfile.Profile()
        rows = [(5 * i + 11) % vocab for i in range(m)]
        enqueued, done = [], []
        for rep in range(2 * repeats + 3):
            session.truncate(start)
            engine.synchronize()
            profiled = rep >= repeats + 3  # timed first (the first 3 capture), then profiled
            if profiled:
                profiler.enable()
            t0 = time.perf_counter()
            out = session.forward(rows, phase)
            t1 = time.perf_counter()
            session.last_token(out["logits"])
            t2 = time.perf_counter()
            profiler.disable()
            if 3 <= rep and not profiled:
                enqueued.append((t1 - t0) * 1e3)
                done.append((t2 - t0) * 1e3)
        lines.append(f"single forward M = {m} ({phase}): enqueued in "
                     f"{statistics.median(enqueued):.3f} ms, token back at "
                     f"{statistics.median(done):.3f} ms (medians of {repeats})")
        tables.append(f"host functions of the M = {m} ({phase}) forwards, {repeats} of them:\n"
                      + top_functions(profiler, rows=20))
    return "\n".join(lines) + "\n" + "\n".join(tables)


def prefill_table(engine) -> str:
    """One eager prefill of PREFILL tokens (after one untimed) under torch's profiler, by
    kernel name: what bounds the prefill target."""
    try:
        import torch
        from torch.profiler import ProfilerActivity, profile
    except Exception as exc:  # noqa: BLE001 - diagnostic: say why and go on
        return f"(no prefill table: torch unavailable: {exc})"
    from engines.workflow.session import DecodeSession

    vocab = engine.package.spec.vocab_size
    tokens = [(7 * i + 3) % vocab for i in range(PREFILL)]
    DecodeSession(engine).forward(tokens, "prefill")
    engine.synchronize()
    torch.cuda.init()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        DecodeSession(engine).forward(tokens, "prefill")
        engine.synchronize()
    return (f"prefill of {PREFILL} tokens, one eager forward:\n"
            + prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))


def prefill_host(engine) -> str:
    """Where a prefill's wall goes besides its kernels: each of 5 eager prefills of PREFILL
    tokens timed to the forward's return (the host's enqueueing) and to the device's end,
    then 3 more under cProfile (the host functions that cost most)."""
    from engines.workflow.session import DecodeSession

    vocab = engine.package.spec.vocab_size
    tokens = [(7 * i + 3) % vocab for i in range(PREFILL)]
    lines = []
    for _ in range(5):
        session = DecodeSession(engine)
        engine.synchronize()
        t0 = time.perf_counter()
        session.forward(tokens, "prefill")
        t1 = time.perf_counter()
        engine.synchronize()
        t2 = time.perf_counter()
        lines.append(f"prefill of {PREFILL}: enqueued in {(t1 - t0) * 1e3:.3f} ms, "
                     f"finished at {(t2 - t0) * 1e3:.3f} ms")
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(3):
        DecodeSession(engine).forward(tokens, "prefill")
        engine.synchronize()
    profiler.disable()
    return "\n".join(lines) + "\n" + top_functions(profiler)


def main(paths: list[str]) -> int:
    from engines.cuda_support import import_cupy
    from engines.package import load_package
    from engines.registry import get_engine_class

    cp = import_cupy()
    for path in paths:
        package = load_package(path)
        engine = get_engine_class("native-cuda")(package)
        prompt = list(package.spec.prompts[0])
        print(f"=== {package.spec.name} ({package.spec.dtype}), prompt {len(prompt)} tokens, "
              f"{TOKENS} new tokens")
        for _ in range(2):
            decode_steps(engine, prompt)
        walls = []
        for _ in range(3):
            result = decode_steps(engine, prompt)
            walls.append(statistics.median(result.step_s[2:]) * 1e3)
        print(f"decode step wall (median of steady steps, 3 decodes): "
              f"{', '.join(f'{w:.3f}' for w in walls)} ms")
        t0 = time.perf_counter()
        device = replay_ms(engine, cp)
        print(f"PRIMARY graph replay, back to back: {device:.3f} ms a forward "
              f"({REPLAYS} replays, {time.perf_counter() - t0:.2f} s)")
        print(f"host share of a step: {statistics.median(walls) - device:.3f} ms")
        print(profile_host(engine, prompt))
        print(kernel_table(engine))
        if VERIFY:
            print(verify_profile(engine, cp, prompt))
        if PREFILL:
            print(prefill_table(engine))
            print(prefill_host(engine))
        engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
