"""Prompt lookup on ``native-cuda`` (claims 1, 2, 3, 4, 6 on the device), on the static
fixture with a prompt-lookup section (``suites/lookup_support.py``).

Marked ``gpu``: without CUDA these skip (a failure under ``--require-gpu``). The budgets,
exact: nothing staged (the ledger and the transfer guard); 4 bytes for the prefill's token
and each plain step (none for one whose row a shifted round judged), 8 per verification,
none for a proposer that drafts on the host. Shifted and classic loops give greedy's tokens.
Every verification of a decode with room is W + 1 wide, so VERIFY captures once and every
later verification of the same width replays, whatever the prompt: no recapture at a
decode's end.
"""
from __future__ import annotations

import pytest

from engines.oracle import oracle_decode
from engines.workflow import greedy_decode
from engines.workflow.speculative import speculative_decode
from harness.budgets import expected_readback
from harness.packages import resolve_package
from suites.lookup_support import with_prompt_lookup

pytestmark = pytest.mark.gpu
NEW_TOKENS = 24
WIDTH = 6


@pytest.fixture(scope="module")
def lookup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lookup-cuda") / "pkg"
    return with_prompt_lookup(resolve_package("tiny_llama_static").root, folder, WIDTH)


@pytest.fixture(scope="module")
def engine(cp, lookup):
    from engines.backends.native_cuda import NativeCudaEngine

    engine = NativeCudaEngine(lookup)
    yield engine
    engine.close()


@pytest.mark.claim("spec_equals_greedy", "token_identity", "zero_staging", "readback_budget")
@pytest.mark.parametrize("width", range(1, WIDTH + 1))
def test_prompt_lookup_on_the_device_equals_greedy_with_an_exact_budget(lookup, engine, width):
    from harness.transfer_guard import transfer_guard

    shifted = 0
    for prompt in lookup.spec.prompts:
        greedy = greedy_decode(engine, prompt, NEW_TOKENS)
        assert greedy.tokens == oracle_decode(lookup, prompt, NEW_TOKENS).tokens
        with transfer_guard("disallow") as guard:
            result = speculative_decode(engine, prompt, NEW_TOKENS, width)
        assert result.tokens == greedy.tokens
        classic = speculative_decode(engine, prompt, NEW_TOKENS, width, pipelined=False)
        assert classic.tokens == greedy.tokens and not any(classic.shifted_per_round)
        led = result.ledger
        assert led.host_staging == 0 and guard.staging_count == 0, guard.staging_sites
        # a decode forward whose row a shifted round judged has no id read of its own
        assert led.shifted_verifications == sum(result.shifted_per_round)
        shifted += led.shifted_verifications
        want = {"token_id": 4 * (1 + led.forwards["decode"] - led.shifted_verifications
                                 - led.discarded_forwards + led.proposals),
                "accept_count": 4 * led.proposals, "logits_audit": 0}
        assert dict(led.readback_bytes) == want
        assert {p: guard.readback_bytes[p] for p in want} == want
        assert expected_readback(result)[0] == led.readback_total
    assert shifted, "no round was shifted: the pipelined loop went untested"


@pytest.mark.claim("graph_replay")
def test_verify_captures_once_and_replays_for_every_prompt(lookup, engine):
    """After one decode at width W, every verification of every prompt at W replays the
    captured VERIFY graph: none captures, falls back or invalidates (the last round of a
    decode is W wide too, cut after verification)."""
    prompts = lookup.spec.prompts
    speculative_decode(engine, prompts[0], NEW_TOKENS, WIDTH)  # captures
    for prompt in prompts:
        result = speculative_decode(engine, prompt, NEW_TOKENS, WIDTH)
        verify = result.ledger.slot("VERIFY")
        assert result.ledger.proposals > 0
        assert (verify.captures, verify.fallbacks, verify.invalidations) == (0, 0, 0), vars(verify)
        assert verify.replays == result.ledger.forwards["verify"] == result.ledger.proposals
