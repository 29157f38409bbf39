"""Shared suite fixtures: the built-in packages, built once per session."""
from __future__ import annotations

import time

import pytest

from suites.support import fixture_names

_STARTED = time.time()


def pytest_sessionfinish(session, exitstatus):
    """On the controlling process, publish the catch matrix when every planted-bug case
    wrote its row in this session (a partial or filtered run publishes nothing)."""
    if hasattr(session.config, "workerinput"):
        return
    from suites.planted import catch_matrix
    from suites.planted.catalog import CASES

    matrix = catch_matrix.gather(_STARTED, [c.id for c in CASES])
    if matrix is not None:
        catch_matrix.publish(matrix)


@pytest.fixture(scope="session")
def packages():
    """Every built-in fixture package, built (or reused from the cache) and loaded."""
    from harness.packages import resolve_package

    return {name: resolve_package(name) for name in fixture_names()}


@pytest.fixture(scope="session")
def engine_cache():
    """One engine instance per (engine, package): loading is the slow part, decoding is not."""
    from engines.registry import get_engine_class

    made = {}

    def get(engine_name: str, package):
        key = (engine_name, package.spec.name, str(package.root))
        if key not in made:
            cls = get_engine_class(engine_name)
            avail = cls.availability()
            if not avail.ok:
                pytest.skip(f"{engine_name} unavailable: {avail.reason}")
            made[key] = cls(package)
        return made[key]

    yield get
    for engine in made.values():
        engine.close()


@pytest.fixture(scope="session")
def cp():
    """CuPy for the gpu tests; a skip naming the reason where CUDA is unavailable (which the
    plugin turns into a failure under --require-gpu)."""
    from engines.cuda_support import cuda_availability

    ok, reason = cuda_availability()
    if not ok:
        pytest.skip(f"CUDA unavailable: {reason}")
    import cupy

    return cupy


@pytest.fixture(scope="module")
def stream(cp):
    """A non-blocking stream of the test module's own, like an engine's."""
    return cp.cuda.Stream(non_blocking=True)
