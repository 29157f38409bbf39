"""Claim 1 on the host: every fixture x every host engine equals the oracle, exactly."""
from __future__ import annotations

import pytest

from engines.oracle import oracle_decode
from engines.workflow import greedy_decode
from suites.support import HOST_ENGINES, fixture_names

pytestmark = pytest.mark.claim("token_identity")
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
    """The fixture's conditioned margin clears the near-tie margin at every step: the top-2
    margin, or for a fixture that ties its top ``tie_group`` logits on purpose (tied_llama),
    the margin from that exactly tied group to the best logit outside it."""
    from engines.tolerances import tolerance_for
    from harness.catalog.builtin import get_fixture
    from harness.catalog.conditioning import oracle_trajectory

    package = packages[package_name]
    floor = tolerance_for(package.spec.dtype).near_tie_margin
    tie_group = get_fixture(package_name).tie_group
    for i, prompt in enumerate(package.spec.prompts):
        oracle = oracles[(package_name, i)]
        if tie_group == 1:
            assert oracle.min_margin >= floor
            continue
        assert oracle.min_margin == 0.0  # the tie is there on purpose
        conditioned = oracle_trajectory(package.root, prompt, NEW_TOKENS, tie_group)
        assert conditioned.tokens == oracle.tokens
        assert conditioned.tied_steps == len(oracle.tokens)
        assert conditioned.min_margin >= floor
