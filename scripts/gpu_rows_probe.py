"""Where a decode-shaped launch's device time goes as its rows grow (issue 12: a 5-row
verification forward costs 1.45x the 1-row one on the H200, and the GEMVs with a prologue
grow most). For M = 1..ROWS rows of SmolLM2's float16 shapes, each launch kind alone, and
each half of a fused one alone:

- ``norm_gemv`` over q/k/v and over gate/up; ``add_rms_norm`` alone; ``gemv_many`` over rows
  already normalised (so the prologue's cost is the difference);
- ``swiglu_gemv`` (down projection); ``swiglu`` alone; ``gemv_rows`` over its output;
- ``gemv_rows`` for the o projection; ``norm_glu`` where the tree has it.

Each is launched LAUNCHES times back to back under torch's profiler (CUPTI sees CuPy's
kernels), plain launches first, then dependent ones (whose figure includes each kernel's
wait on the one before). The figure is the mean device time of one launch, in microseconds.
Diagnostic only; the issue's figures come from ``lockstep bench`` and ``bench-forward``.

Usage (repo root, on a CUDA machine): python scripts/gpu_rows_probe.py
Environment: ROWS (default 8), LAUNCHES (default 50).
"""
from __future__ import annotations

import contextlib
import os
import sys

import numpy as np

ROWS = int(os.environ.get("ROWS", "8"))
LAUNCHES = int(os.environ.get("LAUNCHES", "50"))
HIDDEN, KV, FFN, EPS = 576, 192, 1536, 1e-5  # SmolLM2-135M


def device_us(calls, sync) -> dict[str, float]:
    """Mean device microseconds a launch, by kernel name, of LAUNCHES rounds of ``calls``."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    for _ in range(5):
        calls()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(LAUNCHES):
            calls()
        sync()
    torch.cuda.synchronize()
    out = {}
    for event in prof.key_averages():
        total = getattr(event, "device_time_total", None)
        if total is None:
            total = getattr(event, "cuda_time_total", 0.0)
        if total and event.count and not event.key.startswith("cuda"):
            out[event.key] = total / event.count
    return out


def main() -> int:
    import cupy as cp

    from engines.native.cuda_kernels import get_kernels
    from engines.native.fused_kernels import get_fused_kernels
    from engines.native.kernel_launch import plain_launches

    rng = np.random.default_rng(0)
    stream = cp.cuda.Stream(non_blocking=True)
    ck, fk = get_kernels(0), get_fused_kernels(0)

    def dev(shape, dtype, scale=0.05):
        with stream:
            return cp.asarray((rng.standard_normal(shape) * scale).astype(dtype))

    f16, f32 = np.float16, np.float32
    wq, wk, wv, wo = (dev((n, HIDDEN), f16) for n in (HIDDEN, KV, KV, HIDDEN))
    wg, wu = dev((FFN, HIDDEN), f16), dev((FFN, HIDDEN), f16)
    wd = dev((HIDDEN, FFN), f16)
    gain = dev((HIDDEN,), f32, 1.0)

    def kinds(m):
        res, delta = dev((m, HIDDEN), f32, 1.0), dev((m, HIDDEN), f16, 1.0)
        normed = dev((m, HIDDEN), f16, 1.0)
        gate, up = dev((m, FFN), f16, 1.0), dev((m, FFN), f16, 1.0)
        glu = dev((m, FFN), f16, 1.0)
        found = {
            "norm_gemv qkv": lambda: fk.norm_gemv(res, delta, gain, EPS, f16, [wq, wk, wv],
                                                  stream=stream),
            "add_rms_norm": lambda: fk.add_rms_norm(res, delta, gain, EPS, f16, stream=stream),
            "gemv_many qkv": lambda: ck.gemv_many(normed, [wq, wk, wv], stream=stream),
            "norm_gemv gate/up": lambda: fk.norm_gemv(res, delta, gain, EPS, f16, [wg, wu],
                                                      stream=stream),
            "gemv_many gate/up": lambda: ck.gemv_many(normed, [wg, wu], stream=stream),
            "swiglu_gemv down": lambda: fk.swiglu_gemv(gate, up, f32, f16, wd, stream=stream),
            "swiglu": lambda: fk.swiglu(gate, up, f32, f16, stream=stream),
            "gemv_rows down": lambda: ck.gemv_rows(glu, wd, stream=stream),
            "gemv_rows o": lambda: ck.gemv_rows(normed, wo, stream=stream),
        }
        if hasattr(fk, "norm_glu"):
            found["norm_glu gate/up"] = lambda: fk.norm_glu(res, delta, gain, EPS, f16,
                                                            [wg, wu], f32, f16, stream=stream)
        return found

    names = list(kinds(1))
    for mode in ("plain", "dependent"):
        print(f"=== {mode} launches: mean device us a launch ({LAUNCHES} launches each)")
        print(f"{'rows':>4}  " + "  ".join(f"{n:>18}" for n in names))
        for m in range(1, ROWS + 1):
            cells = []
            for name, call in kinds(m).items():
                with plain_launches() if mode == "plain" else contextlib.nullcontext():
                    times = device_us(call, stream.synchronize)
                if not times:
                    cells.append(f"{'declined':>18}")
                    continue
                kernels = ", ".join(f"{k} {v:.2f}" for k, v in sorted(times.items()))
                cells.append(f"{sum(times.values()):>18.2f}")
                if m == 1 and mode == "plain":
                    print(f"      {name}: {kernels}", file=sys.stderr)
            print(f"{m:>4}  " + "  ".join(cells), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
