#!/usr/bin/env python3
"""First thing to run on a GPU machine: compile every native-cuda kernel, run each once
against numpy, and print one PASS/FAIL line per check with errors and timings.

Needs only numpy and CuPy (no pytest, no pydantic). Exit status 0 when every check passes.

    python scripts/gpu_selfcheck.py [--json PATH] [--quick]

Checks: compile; GEMV rows bit-identical for every M and agreeing with float64; the
batched matmul and the sum bit-identical to the host backend's arithmetic, independent of
M and of trailing zeros; the CuPy array backend against the numpy one; the kernels
captured in a CUDA graph and replayed (no cuBLAS, no host sync inside); per-call timings.
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import time
import traceback
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESULTS: list[dict] = []


def report(name: str, ok: bool, detail: str = "", **numbers) -> bool:
    RESULTS.append({"check": name, "ok": bool(ok), "detail": detail, **numbers})
    extra = " ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}"
                     for k, v in numbers.items())
    print(f"{'PASS' if ok else 'FAIL'}  {name:<44} {extra} {detail}".rstrip(), flush=True)
    return ok


def check(name: str):
    """Run a check function; an exception is a FAIL with its message, never a crash."""
    def wrap(fn):
        try:
            fn()
        except Exception as exc:  # noqa: BLE001 - report and go on to the next check
            report(name, False, f"{type(exc).__name__}: {exc}")
            traceback.print_exc(limit=4)
        return fn
    return wrap


def max_errors(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    g, w = got.astype(np.float64), want.astype(np.float64)
    diff = np.abs(g - w)
    rel = diff / np.maximum(np.abs(w), np.finfo(np.float64).tiny)
    return float(diff.max(initial=0.0)), float(rel.max(initial=0.0))


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", help="also write the results as JSON to this path")
    parser.add_argument("--quick", action="store_true", help="skip the timings")
    args = parser.parse_args()

    import cupy as cp

    from engines.ledger import Ledger
    from engines.native import cuda_kernels as ck
    from engines.native.array_backend import NumpyArrayBackend
    from engines.tolerances import tolerance_for

    rt = cp.cuda.runtime
    props = rt.getDeviceProperties(0)
    name = props["name"].decode() if isinstance(props["name"], bytes) else props["name"]
    env = {"python": platform.python_version(), "numpy": np.__version__, "cupy": cp.__version__,
           "runtime": rt.runtimeGetVersion(), "driver": rt.driverGetVersion(), "gpu": name}
    print("environment:", env, flush=True)

    stream = cp.cuda.Stream(non_blocking=True)
    stream.use()  # every CuPy call in this script runs on it, as in the engine
    state: dict = {}

    def get(value):
        # Read back on the kernels' stream: a non-blocking stream does not order with the
        # default stream, so a plain asnumpy could copy before the kernel has finished.
        return cp.asnumpy(value, stream=stream)

    @check("compile")
    def _compile():
        t0 = time.perf_counter()
        state["k"] = ck.get_kernels(0)
        report("compile", True, f"{len(state['k']._functions)} kernels",
               seconds=time.perf_counter() - t0)

    kern = state.get("k")
    if kern is None:
        return finish(args, env)
    host_be = NumpyArrayBackend()

    # -- GEMV ------------------------------------------------------------------------------
    for (n, k) in [(1536, 576), (576, 1536), (2048, 64), (100, 77)]:
        for dtype in ("float32", "float16"):
            label = f"gemv_rows {n}x{k} {dtype}"

            @check(label)
            def _gemv(n=n, k=k, dtype=dtype, label=label):
                rng = np.random.default_rng(n + k)
                w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype)
                x = rng.standard_normal((33, k)).astype(dtype)
                with stream:
                    xd, wd = cp.asarray(x), cp.asarray(w)
                    w_nk = cp.ascontiguousarray(wd.T)
                    singles = [get(kern.gemv_rows(xd[i:i + 1], w_nk, stream=stream))[0]
                               for i in range(33)]
                    bad = []
                    for m in list(range(1, 10)) + [16, 17, 33]:
                        out = get(kern.gemv_rows(xd[:m], w_nk, stream=stream))
                        bad += [(m, i) for i in range(m) if not same_bits(out[i], singles[i])]
                    kn = get(kern.gemv_rows(xd[:9], wd, stream=stream, w_layout="kn"))
                full = np.stack(singles)
                ref = x.astype(np.float64) @ w.astype(np.float64)
                abs_err, rel_err = max_errors(full, ref)
                tol = tolerance_for(dtype)
                fine = abs_err <= tol.max_abs
                layouts = same_bits(kn, full[:9])
                report(label, not bad and fine and layouts,
                       ("" if not bad else f"rows differ (M, row): {bad[:4]} ") +
                       ("" if layouts else "kn layout differs from nk ") +
                       ("" if fine else f"max_abs above {tol.max_abs}"),
                       max_abs=abs_err, max_rel=rel_err)

    # -- batched matmul ---------------------------------------------------------------------
    for dtype in ("float32", "float16", "float64", "int32", "int64"):
        label = f"bmm {dtype}"

        @check(label)
        def _bmm(dtype=dtype, label=label):
            rng = np.random.default_rng(7)
            q = (rng.standard_normal((1, 4, 9, 16)) * 3).astype(dtype)
            kt_store = (rng.standard_normal((1, 4, 11, 16)) * 3).astype(dtype)  # [.., T, D]
            a = (rng.standard_normal((2, 1, 5, 7)) * 3).astype(dtype)
            b = (rng.standard_normal((1, 3, 7, 6)) * 3).astype(dtype)
            with stream:
                qd, kd = cp.asarray(q), cp.asarray(kt_store)
                kt_view = cp.swapaxes(kd, -1, -2)  # a transposed view: strides, no copy
                full = get(kern.batched_matmul(qd, kt_view, stream=stream))
                bad = [i for i in range(9) if not same_bits(
                    get(kern.batched_matmul(qd[:, :, i:i + 1], kt_view, stream=stream)),
                    full[:, :, i:i + 1])]
                bcast = get(kern.batched_matmul(cp.asarray(a), cp.asarray(b), stream=stream))
                p = rng.random((1, 2, 3, 11)).astype(dtype)
                v = rng.standard_normal((1, 2, 11, 5)).astype(dtype)
                pz = np.concatenate([p, np.zeros((1, 2, 3, 4), dtype)], axis=-1)
                vz = np.concatenate([v, rng.standard_normal((1, 2, 4, 5)).astype(dtype)], axis=-2)
                short = get(kern.batched_matmul(cp.asarray(p), cp.asarray(v), stream=stream))
                padded = get(kern.batched_matmul(cp.asarray(pz), cp.asarray(vz), stream=stream))
            host_full = host_be.matmul(q, np.swapaxes(kt_store, -1, -2))
            host_bcast = host_be.matmul(a, b)
            abs_err, rel_err = max_errors(full, host_full)
            ok = (not bad and same_bits(full, host_full) and same_bits(bcast, host_bcast)
                  and same_bits(short, padded))
            report(label, ok, ("" if not bad else f"rows differ from M=1: {bad} ") +
                   ("" if same_bits(full, host_full) else "differs from host arithmetic ") +
                   ("" if same_bits(bcast, host_bcast) else "broadcast differs from host ") +
                   ("" if same_bits(short, padded) else "trailing zeros changed the result"),
                   max_abs=abs_err, max_rel=rel_err)

    # -- sum ---------------------------------------------------------------------------------
    for dtype in ("float32", "float16", "float64", "int32", "int64"):
        label = f"sum_axis {dtype}"

        @check(label)
        def _sum(dtype=dtype, label=label):
            from engines.native.cupy_array_backend import CupyArrayBackend

            backend = CupyArrayBackend(stream, Ledger(), device_id=0)
            rng = np.random.default_rng(3)
            x = (rng.standard_normal((3, 4, 37, 5)) * 10).astype(dtype)
            with stream:
                xd = cp.asarray(x)
                wrong = [(axis, keep) for axis in range(-4, 4) for keep in (False, True)
                         if not same_bits(get(backend.sum(xd, axis, keepdims=keep)),
                                          host_be.sum(x, axis, keepdims=keep))]
                pad = cp.concatenate([xd, cp.zeros((3, 4, 37, 3), xd.dtype)], axis=-1)
                zeros_ok = same_bits(get(backend.sum(pad, 3)), get(backend.sum(xd, 3)))
                padded_rows = cp.concatenate([xd, cp.zeros((3, 4, 5, 5), xd.dtype)], axis=2)
                zeros_ok &= same_bits(get(backend.sum(padded_rows, 2)),
                                      get(backend.sum(xd, 2)))
            got = get(backend.sum(xd, 2))
            abs_err, rel_err = max_errors(got, x.astype(np.float64).sum(axis=2))
            report(label, not wrong and zeros_ok,
                   ("" if not wrong else f"differs from host at (axis, keepdims) {wrong[:4]} ") +
                   ("" if zeros_ok else "trailing zeros changed the result"),
                   max_abs=abs_err, max_rel=rel_err)

    # -- the backend's matmul dispatch --------------------------------------------------------
    @check("backend matmul dispatch")
    def _backend():
        from engines.native.cupy_array_backend import CupyArrayBackend

        ledger = Ledger()
        backend = CupyArrayBackend(stream, ledger, device_id=0)
        rng = np.random.default_rng(4)
        w = (rng.standard_normal((96, 48)) / np.sqrt(96)).astype(np.float32)
        with backend.weight_loading({w.shape}):
            wd = backend.adopt(w)
        problems = []
        if ledger.h2d_bytes != w.nbytes or backend.transposed_weights != 1:
            problems.append(f"adopt: h2d {ledger.h2d_bytes}, transposes {backend.transposed_weights}")
        cases = [((2, 3, 96), wd, w), ((96,), wd, w), ((5, 96), None, None),
                 ((2, 4, 96), "vec", None), ((1, 2, 3, 96), "batched", None)]
        for a_shape, b_dev, b_host in cases:
            a = rng.standard_normal(a_shape).astype(np.float32)
            if b_dev is None:
                b_host = w.copy()
                b_dev = cp.asarray(b_host)
            elif isinstance(b_dev, str) and b_dev == "vec":
                b_host = rng.standard_normal(96).astype(np.float32)
                b_dev = cp.asarray(b_host)
            elif isinstance(b_dev, str) and b_dev == "batched":
                b_host = rng.standard_normal((2, 96, 5)).astype(np.float32)
                b_dev = cp.asarray(b_host)
            with stream:
                got = get(backend.matmul(cp.asarray(a), b_dev))
            want = np.matmul(a.astype(np.float64), b_host.astype(np.float64))
            abs_err, _ = max_errors(got, want)
            if got.shape != want.shape or abs_err > tolerance_for("float32").max_abs:
                problems.append(f"{a_shape} @ {b_host.shape}: shape {got.shape}, max_abs {abs_err:.3g}")
        report("backend matmul dispatch", not problems, "; ".join(problems))

    # -- capture in a CUDA graph and replay ---------------------------------------------------
    @check("graph capture + replay")
    def _capture():
        rng = np.random.default_rng(5)
        x = rng.standard_normal((4, 576)).astype(np.float32)
        w = (rng.standard_normal((1536, 576)) / 24).astype(np.float32)  # [N, K]
        q = rng.standard_normal((1, 4, 3, 16)).astype(np.float32)
        kk = rng.standard_normal((1, 4, 16, 9)).astype(np.float32)
        with stream:
            xd, wd, qd, kd = (cp.asarray(v) for v in (x, w, q, kk))
            out_g = cp.empty((4, 1536), cp.float32)
            out_b = cp.empty((1, 4, 3, 9), cp.float32)
            out_s = cp.empty((4,), cp.float32)
            eager = [get(kern.gemv_rows(xd, wd, stream=stream)),
                     get(kern.batched_matmul(qd, kd, stream=stream)),
                     get(kern.sum_axis(xd, 1, 2, stream=stream))]
        stream.synchronize()
        stream.begin_capture()
        try:
            kern.gemv_rows(xd, wd, out_g, stream=stream)
            kern.batched_matmul(qd, kd, out_b, stream=stream)
            kern.sum_axis(xd, 1, 2, out_s, stream=stream)
        finally:
            graph = stream.end_capture()
        with stream:
            for out in (out_g, out_b, out_s):
                out.fill(np.nan)  # poison: a replay that does nothing cannot pass
        stream.synchronize()
        graph.launch(stream)
        graph.launch(stream)
        stream.synchronize()
        same = [same_bits(get(o), e) for o, e in zip((out_g, out_b, out_s), eager)]
        report("graph capture + replay", all(same), f"gemv/bmm/sum equal to eager: {same}")

    @check("graph capture of backend.matmul (allocates)")
    def _capture_backend():
        # Informational for the graph-slot work: CuPy allocations inside a capture.
        from engines.native.cupy_array_backend import CupyArrayBackend

        backend = CupyArrayBackend(stream, Ledger(), device_id=0)
        rng = np.random.default_rng(6)
        w = (rng.standard_normal((64, 32)) / 8).astype(np.float32)
        with backend.weight_loading():
            wd = backend.adopt(w)
        with stream:
            x = cp.asarray(rng.standard_normal((2, 64)).astype(np.float32))
        eager = get(backend.matmul(x, wd))
        stream.synchronize()
        stream.begin_capture()
        try:
            out = backend.matmul(x, wd)
            total = backend.sum(out, 1)
        finally:
            graph = stream.end_capture()
        graph.launch(stream)
        stream.synchronize()
        ok = same_bits(get(out), eager)
        report("graph capture of backend.matmul (allocates)", ok,
               f"sum shape {tuple(total.shape)}")

    if not args.quick:
        timings(cp, kern, stream)
    return finish(args, env)


def timings(cp, kern, stream) -> None:
    """Per-call device time from events around 200 back-to-back launches (eager)."""
    rng = np.random.default_rng(9)
    cases = [("gemv 1536x576 f32", "float32", 1536, 576), ("gemv 576x1536 f32", "float32", 576, 1536),
             ("gemv 49152x576 f16", "float16", 49152, 576), ("gemv 49152x576 f32", "float32", 49152, 576)]
    for label, dtype, n, k in cases:
        try:
            with stream:
                w = cp.asarray((rng.standard_normal((n, k)) / 24).astype(dtype))
                row = {}
                for m in (1, 8):
                    x = cp.asarray(rng.standard_normal((m, k)).astype(dtype))
                    out = cp.empty((m, n), dtype)
                    row[f"M{m}_us"] = time_launches(cp, stream, lambda: kern.gemv_rows(
                        x, w, out, stream=stream))
            report(f"time {label}", True, **row)
        except Exception as exc:  # noqa: BLE001
            report(f"time {label}", False, f"{type(exc).__name__}: {exc}")
    try:
        with stream:
            q = cp.asarray(rng.standard_normal((1, 9, 8, 64)).astype(np.float32))
            kt = cp.asarray(rng.standard_normal((1, 9, 64, 256)).astype(np.float32))
            out = cp.empty((1, 9, 8, 256), cp.float32)
            x = cp.asarray(rng.standard_normal((8, 49152)).astype(np.float32))
            s = cp.empty((8,), cp.float32)
            h = cp.asarray(rng.standard_normal((8, 576)).astype(np.float32))
            s1 = cp.empty((1,), cp.float32)
            report("time bmm + sum", True,
                   bmm_qk_us=time_launches(cp, stream, lambda: kern.batched_matmul(q, kt, out, stream=stream)),
                   sum_8x49152_us=time_launches(cp, stream, lambda: kern.sum_axis(x, 1, 2, s, stream=stream)),
                   sum_1x576_us=time_launches(cp, stream, lambda: kern.sum_axis(h[:1], 1, 2, s1, stream=stream)),
                   sum_8x576_us=time_launches(cp, stream, lambda: kern.sum_axis(h, 1, 2, s, stream=stream)))
    except Exception as exc:  # noqa: BLE001
        report("time bmm + sum", False, f"{type(exc).__name__}: {exc}")


def time_launches(cp, stream, launch, reps: int = 200) -> float:
    for _ in range(10):
        launch()
    start, end = cp.cuda.Event(), cp.cuda.Event()
    start.record(stream)
    for _ in range(reps):
        launch()
    end.record(stream)
    end.synchronize()
    return cp.cuda.get_elapsed_time(start, end) * 1000.0 / reps


def finish(args, env) -> int:
    failed = [r["check"] for r in RESULTS if not r["ok"]]
    print(f"\n{len(RESULTS) - len(failed)} passed, {len(failed)} failed"
          + (f": {', '.join(failed)}" if failed else ""), flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"environment": env, "results": RESULTS}, indent=1))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
