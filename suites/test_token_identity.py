"""Claim 1 on the host: every fixture x every host engine equals the oracle, exactly."""
from __future__ import annotations

import pytest

from engines.oracle import oracle_decode
from engines.workflow import greedy_decode
from suites.support import HOST_ENGINES, fixture_names

NEW_TOKENS = 32


@pytest.fixture(scope="module")
def oracles(packages):
    return {(name, i): oracle_decode(pkg, prompt, NEW_TOKENS)
            for name, pkg in packages.items() for i, prompt in enumerate(pkg.spec.prompts)}


@pytest.mark.parametrize("package_name", fixture_names())
@pytest.mark.parametrize("engine_name", HOST_ENGINES)
def test_greedy_equals_oracle(packages, oracles, engine_cache, package_name, engine_name):
    package = packages[package_name]
    engine = engine_cache(engine_name, package)
    assert package.spec.prompts, "every fixture declares default prompts"
    for i, prompt in enumerate(package.spec.prompts):
        oracle = oracles[(package_name, i)]
        result = greedy_decode(engine, prompt, NEW_TOKENS)
        assert len(result.tokens) == NEW_TOKENS or result.tokens[-1] == package.spec.eos_id
        assert result.tokens == oracle.tokens, (
            f"{engine_name} on {package_name} prompt {i} diverged from the oracle")
        # Greedy's forward budget: one prefill, then one decode forward per further token.
        assert result.ledger.forwards["prefill"] == 1
        assert result.ledger.forwards["decode"] == len(result.tokens) - 1


@pytest.mark.parametrize("package_name", fixture_names())
def test_fixture_streams_are_not_degenerate(oracles, packages, package_name):
    """A fixture whose stream repeats one token would let a stale-state bug pass."""
    for i, _ in enumerate(packages[package_name].spec.prompts):
        assert len(set(oracles[(package_name, i)].tokens)) >= 4


@pytest.mark.parametrize("package_name", fixture_names())
def test_fixtures_are_well_conditioned(oracles, packages, package_name):
    from engines.tolerances import tolerance_for

    package = packages[package_name]
    floor = tolerance_for(package.spec.dtype).near_tie_margin
    for i, _ in enumerate(package.spec.prompts):
        assert oracles[(package_name, i)].min_margin >= floor
