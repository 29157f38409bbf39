"""pytest-benchmark: greedy decode speed of every host engine on a small fixture.

In the default run (``--benchmark-disable`` in pyproject's addopts) each benchmark runs its
body once, as a test: the decode must still equal the oracle. Timed for real with
``pytest suites/benchmarks --benchmark-enable`` (no ``-n``: xdist turns timing off).
"""
from __future__ import annotations

import pytest

from suites.support import HOST_ENGINES

PACKAGE = "tiny_llama"
NEW_TOKENS = 16


@pytest.fixture(scope="module")
def package():
    from harness.packages import resolve_package

    return resolve_package(PACKAGE)


@pytest.fixture(scope="module")
def oracle_tokens(package):
    from engines.oracle import oracle_decode

    return oracle_decode(package, package.spec.prompts[0], NEW_TOKENS).tokens


@pytest.mark.parametrize("engine_name", HOST_ENGINES)
def test_greedy_decode(benchmark, engine_cache, package, oracle_tokens, engine_name):
    from engines.workflow import greedy_decode

    engine = engine_cache(engine_name, package)
    prompt = list(package.spec.prompts[0])
    greedy_decode(engine, prompt, NEW_TOKENS)  # warm-up: first-run allocations, caches
    benchmark.group = f"greedy {PACKAGE} {NEW_TOKENS} tokens"
    benchmark.extra_info.update(engine=engine_name, package=PACKAGE, new_tokens=NEW_TOKENS)
    result = benchmark(greedy_decode, engine, prompt, NEW_TOKENS)
    assert result.tokens == oracle_tokens
    assert result.ledger.forwards["decode"] == NEW_TOKENS - 1
