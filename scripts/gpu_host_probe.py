"""What one eager plan step costs the host, taken apart (issue 12's prefill is host-bound):
each hot op of a prefill called alone, many times, with the forward's own operands; then the
pieces it is built from (an allocation, a launch, a context switch, a reshape). Diagnostic
only: no profiler hooks, so no call is inflated by one.

Usage (repo root, on a CUDA machine): python scripts/gpu_host_probe.py PACKAGE
Environment: PREFILL (default 512), CALLS (default 200).
"""
from __future__ import annotations

import os
import statistics
import sys
import time

PREFILL = int(os.environ.get("PREFILL", "512"))
CALLS = int(os.environ.get("CALLS", "200"))
HOT = ("NormMatMul", "RotaryKVAttention", "SwiGLUMatMul", "MatMul", "AddRMSNorm", "Reshape",
       "Transpose", "Gather")


def timed(call, sync, calls: int = CALLS) -> float:
    """Median host microseconds of ``call()`` (the stream drained every 20 calls, so the
    launch queue never fills and blocks)."""
    samples = []
    for i in range(calls):
        if i % 20 == 0:
            sync()
        t0 = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - t0)
    sync()
    return statistics.median(samples) / 1e3


def main(path: str) -> int:
    os.environ["LOCKSTEP_NATIVE_CUDA_GRAPHS"] = "off"
    import numpy as np

    from engines.native import kernel_launch
    from engines.native import plan as plan_module
    from engines.package import load_package
    from engines.registry import get_engine_class
    from engines.workflow.session import DecodeSession

    package = load_package(path)
    engine = get_engine_class("native-cuda")(package)
    vocab = package.spec.vocab_size
    tokens = [(7 * i + 3) % vocab for i in range(PREFILL)]
    DecodeSession(engine).forward(tokens, "prefill")  # compile, cache
    seen: dict[str, tuple] = {}
    launches: list[tuple] = []
    original_call = plan_module.Plan._call
    original_launch = kernel_launch.KernelLauncher.launch

    def recording_call(kernel, be, args, label):
        seen.setdefault(type(kernel).__name__, (kernel, be, list(args)))
        return original_call(kernel, be, args, label)

    def recording_launch(self, function, grid, block, args, stream, shared_mem=0):
        launches.append((self, function, grid, block, args, stream, shared_mem))
        return original_launch(self, function, grid, block, args, stream, shared_mem)

    plan_module.Plan._call = staticmethod(recording_call)
    kernel_launch.KernelLauncher.launch = recording_launch
    DecodeSession(engine).forward(tokens, "prefill")
    plan_module.Plan._call = staticmethod(original_call)
    kernel_launch.KernelLauncher.launch = original_launch
    engine.synchronize()

    cupy = engine._cupy
    sync = engine.synchronize
    print(f"host probe: prefill of {PREFILL}, median us of {CALLS} calls each")
    with engine._device, engine.stream, engine.allocator.scope():
        for name in HOT:
            if name in seen:
                kernel, be, args = seen[name]
                print(f"  step {name:20s} {timed(lambda: kernel(be, *args), sync):8.1f}")
        print(f"  launches a prefill: {len(launches)}")
        launcher, function, grid, block, args, stream, smem = launches[len(launches) // 2]
        print(f"  launch (recorded, {len(args)} args)      "
              f"{timed(lambda: launcher.launch(function, grid, block, args, stream, smem), sync):8.1f}")
        fk = engine.backend.fused_kernels()
        shape = (PREFILL, 576)
        print(f"  cupy.empty {shape} float16       "
              f"{timed(lambda: cupy.empty(shape, dtype=np.float16), sync):8.1f}")
        print(f"  FusedKernels._empty (device+stream) "
              f"{timed(lambda: fk._empty(shape, np.float16, engine.stream), sync):8.1f}")
        x = cupy.empty(shape, dtype=np.float16)
        print(f"  ndarray.reshape                    "
              f"{timed(lambda: x.reshape(1, PREFILL, 576), sync):8.1f}")
        device = engine._device
        stream = engine.stream

        def enter_exit():
            with device, stream:
                pass
        print(f"  with device, stream: (enter/exit)  {timed(enter_exit, sync):8.1f}")
        print(f"  x.data.ptr                         {timed(lambda: x.data.ptr, sync):8.1f}")
        print(f"  x.flags.c_contiguous               "
              f"{timed(lambda: x.flags.c_contiguous, sync):8.1f}")
    engine.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
