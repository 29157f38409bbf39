"""The D2D-vs-host snapshot comparison, per snapshot, across state sizes (claim 7's cost).

A snapshot plus restore of a recurrent state: on the device, two ``copy_into`` calls on the
engine's stream; the host variant, ``stage_to_host`` (counted as staging) and ``adopt`` back.
Both must restore the state byte for byte; their timings are a measurement kept as evidence
figures (``figures/snapshot_microbench.json``), not a bound asserted here.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from engines.ledger import Ledger
from suites.support import write_figure

pytestmark = [pytest.mark.gpu, pytest.mark.claim("snapshot_budget")]
SIZES = (16 * 2**10, 2**20, 16 * 2**20, 256 * 2**20)  # bytes of float32 state
REPEATS = 20


def test_device_and_host_snapshots_restore_exactly_and_are_timed(evidence_dir):
    import cupy as cp

    from engines.tensor_ops.cuda import CudaTensorOps

    stream = cp.cuda.Stream(non_blocking=True)
    ledger = Ledger()
    ops = CudaTensorOps(ledger, stream)
    rows = []
    for nbytes in SIZES:
        state = ops.adopt(np.random.default_rng(nbytes).standard_normal(nbytes // 4).astype(np.float32))
        arena, back = ops.zeros(state.shape, np.float32), ops.zeros(state.shape, np.float32)
        timings = {}
        for mode in ("device", "host"):
            for i in range(REPEATS + 1):  # the first round warms up
                if i == 1:
                    stream.synchronize()
                    start = time.perf_counter()
                if mode == "device":
                    ops.copy_into(arena, state)
                    ops.copy_into(back, arena)
                else:
                    back = ops.adopt(ops.stage_to_host(state, "snapshot-timing"))
            stream.synchronize()
            timings[mode] = (time.perf_counter() - start) / REPEATS
            with stream:
                assert bool((back == state).all()), f"{mode} restore differs at {nbytes} bytes"
        rows.append({"bytes": nbytes, "device_us": timings["device"] * 1e6,
                     "host_us": timings["host"] * 1e6,
                     "host_over_device": timings["host"] / timings["device"]})
    assert ledger.host_staging == len(SIZES) * (REPEATS + 1)  # the host variant, every time
    write_figure(evidence_dir, "snapshot_microbench", rows)
