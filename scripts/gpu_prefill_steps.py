"""Where an eager native-cuda forward's host time goes, step by step (issue 12's prefill is
host-bound): the forward's wall to return, the plan's own run inside it, and each plan
step's host time (no synchronisation inside: what the host spends before the step returns)
summed by op type, for a prefill of PREFILL tokens and for one token. Diagnostic only.

Usage (repo root, on a CUDA machine): python scripts/gpu_prefill_steps.py PACKAGE
Environment: PREFILL (default 512), REPEATS (default 5).
"""
from __future__ import annotations

import collections
import os
import statistics
import sys
import time

PREFILL = int(os.environ.get("PREFILL", "512"))
REPEATS = int(os.environ.get("REPEATS", "5"))


def main(path: str) -> int:
    os.environ["LOCKSTEP_NATIVE_CUDA_GRAPHS"] = "off"  # every forward eager
    from engines.native import plan as plan_module
    from engines.package import load_package
    from engines.registry import get_engine_class
    from engines.workflow.session import DecodeSession

    package = load_package(path)
    engine = get_engine_class("native-cuda")(package)
    vocab = package.spec.vocab_size
    by_op: dict[str, list[float]] = collections.defaultdict(list)
    runs: list[float] = []
    original_call = plan_module.Plan._call
    original_run = plan_module.Plan.run

    def timed_call(kernel, be, args, label):
        t0 = time.perf_counter()
        try:
            return original_call(kernel, be, args, label)
        finally:
            by_op[type(kernel).__name__].append(time.perf_counter() - t0)

    def timed_run(self, feeds, *a, **k):
        t0 = time.perf_counter()
        try:
            return original_run(self, feeds, *a, **k)
        finally:
            runs.append(time.perf_counter() - t0)

    for m in (PREFILL, 1):
        tokens = [(7 * i + 3) % vocab for i in range(m)]
        warm = []
        for _ in range(2):  # warm: allocations, host-value caches, step memos' records
            engine.synchronize()
            t0 = time.perf_counter()
            DecodeSession(engine).forward(tokens, "prefill")
            engine.synchronize()
            warm.append((time.perf_counter() - t0) * 1e3)
        print(f"== M = {m}: the first forwards at this M (synchronised): "
              f"{warm[0]:.3f} ms, then {warm[1]:.3f} ms")
        plan_module.Plan._call = staticmethod(timed_call)
        plan_module.Plan.run = timed_run
        by_op.clear()
        runs.clear()
        walls, sessions, ends = [], [], []
        for _ in range(REPEATS):
            engine.synchronize()
            t0 = time.perf_counter()
            session = DecodeSession(engine)
            t1 = time.perf_counter()
            session.forward(tokens, "prefill")
            t2 = time.perf_counter()
            engine.synchronize()
            t3 = time.perf_counter()
            sessions.append(t1 - t0)
            walls.append(t2 - t1)
            ends.append(t3 - t1)
        plan_module.Plan._call = staticmethod(original_call)
        plan_module.Plan.run = original_run
        ms = lambda xs: statistics.median(xs) * 1e3  # noqa: E731
        print(f"== M = {m}: new session {ms(sessions):.3f} ms; forward returned after "
              f"{ms(walls):.3f} ms (plan.run {ms(runs):.3f} ms), device done at "
              f"{ms(ends):.3f} ms (medians of {REPEATS})")
        rows = sorted(by_op.items(), key=lambda kv: -sum(kv[1]))
        total = sum(sum(v) for v in by_op.values()) / REPEATS * 1e3
        print(f"   steps' host time {total:.3f} ms a forward; by op type (ms a forward, calls "
              f"a forward, us a call):")
        for op, times in rows:
            count = len(times) / REPEATS
            print(f"   {op:24s} {sum(times) / REPEATS * 1e3:8.3f} {count:6.0f} "
                  f"{statistics.median(times) * 1e6:8.1f}")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
