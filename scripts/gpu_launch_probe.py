"""What one eager launch costs the host (issue 12's prefill is host-bound): CuPy's
``Function.__call__`` against ``engines.native.kernel_launch`` for the same gemv_vec launch,
an output allocation with and without entering the device and stream, and one whole
``gemv_rows`` call of a prefill's shape. Enqueue time only (the stream is synchronised after
each batch of calls, outside the timer's figure per call). Diagnostic only.

Usage (repo root, on a CUDA machine): python scripts/gpu_launch_probe.py
"""
from __future__ import annotations

import statistics
import time

import numpy as np

CALLS = 2000


def per_call_us(fn, stream, calls: int = CALLS, repeats: int = 5) -> float:
    """Median over repeats of the host time per call, in microseconds."""
    times = []
    for _ in range(repeats):
        stream.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        times.append((time.perf_counter() - start) / calls * 1e6)
        stream.synchronize()
    return statistics.median(times)


def main() -> int:
    import cupy as cp

    from engines.native.cuda_kernels import CudaKernels, kernel_name
    from engines.native.launch.gemv import GEMV_WARPS_PER_BLOCK, gemv_team
    from engines.native.kernel_launch import KernelLauncher

    kernels = CudaKernels(0)
    stream = cp.cuda.Stream(non_blocking=True)
    device = cp.cuda.Device(0)
    launcher = KernelLauncher(cp)
    m, k, n = 1, 576, 576
    with device, stream:
        x = cp.ones((m, k), dtype=cp.float16)
        w = cp.ones((n, k), dtype=cp.float16)
        out = cp.empty((m, n), dtype=cp.float16)
        xs = cp.ones((512, k), dtype=cp.float16)
    team = gemv_team(n, k, 2)
    cols = GEMV_WARPS_PER_BLOCK // team
    function = kernels._functions[kernel_name("gemv_vec", cp.float16)]
    args = (x, w, out, np.int64(m), np.int64(k), np.int64(n), np.int64(k), np.int64(1),
            np.int32(1), np.int32(team))
    grid, block = ((n + cols - 1) // cols,), (32 * GEMV_WARPS_PER_BLOCK,)

    def cupy_call():
        function(grid, block, args, stream=stream)

    def ours():
        launcher.launch(function, grid, block, args, stream)

    cupy_call()
    ours()
    stream.synchronize()
    with device, stream:
        ref = kernels.gemv_rows(x, w, stream=stream)
    stream.synchronize()
    check = cp.empty_like(out)
    launcher.launch(function, grid, block, (x, w, check) + args[3:], stream)
    stream.synchronize()
    print(f"same result through both launches: {bool((check == ref).all())}")

    def empty_ctx():
        with device, stream:
            cp.empty((512, 576), dtype=cp.float16)

    def empty_bare():
        cp.empty((512, 576), dtype=cp.float16)

    def gemv_rows_prefill():
        kernels.gemv_rows(xs, w, stream=stream)

    with device, stream:
        rows = [("CuPy Function call, gemv_vec (10 arguments)", cupy_call),
                ("KernelLauncher.launch, the same launch", ours),
                ("cupy.empty inside `with device, stream`", empty_ctx),
                ("cupy.empty, device and stream already current", empty_bare),
                ("CudaKernels.gemv_rows, x [512, 576] (a tile launch and its output)",
                 gemv_rows_prefill)]
        for label, fn in rows:
            print(f"{per_call_us(fn, stream, calls=200 if 'gemv_rows' in label else CALLS):8.2f}"
                  f" us  {label}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
