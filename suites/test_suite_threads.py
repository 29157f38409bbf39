"""The suite's own set-up: under pytest-xdist every worker's numerical libraries run one
thread (the root conftest), so two workers on two cores do not start four spinning BLAS
threads."""
from __future__ import annotations

import os

import pytest


@pytest.mark.skipif(not os.environ.get("LOCKSTEP_SUITE_ONE_THREAD"), reason="runs in an xdist "
                    "worker whose thread variables the suite set (make test); otherwise the "
                    "user's settings or the libraries' defaults stand")
def test_an_xdist_worker_computes_on_one_thread():
    from conftest import THREAD_VARIABLES

    assert os.environ.get("PYTEST_XDIST_WORKER")
    assert {os.environ.get(name) for name in THREAD_VARIABLES} == {"1"}
    torch = pytest.importorskip("torch")
    assert torch.get_num_threads() == 1  # read from OMP_NUM_THREADS as torch loaded
