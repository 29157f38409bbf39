"""Shifted rounds (``engines.workflow.speculative``): a prompt-lookup decode pipelines its
plain steps as greedy's pipelined loop does, and the forward queued before a round judges the
round's first draft, so it is never wasted.

Shifting pays only where ids come back asynchronously (a device): a host engine keeps the
classic loop, and the tests below run native-host's ops as a device's (``as_on_a_device``) or
a simulated device. Claims here, on native-host (batch-invariant: exact): the streams
are the classic loop's, greedy's and the oracle's at every width, with shifted rounds,
classic rounds and plain steps all seen; a shifted round verifies W + 1 drafts over W + 1
positions (the classic round's shape); the readback is exact and its formula the one
``harness.budgets`` states; a forward queued past eos is undone, never read; ``accept_drafts``
with a head row is the accept over the rows joined, and refuses a head it cannot use. Planted:
an accept that drops the head row changes tokens (the verdict: defect), one that reads the
head's id apart breaks the readback budget; their controls pass.
"""
from __future__ import annotations

import numpy as np
import pytest

from engines.errors import InputError
from engines.ledger import Ledger
from engines.oracle import oracle_decode
from engines.tensor_ops.host import HostTensorOps
from engines.workflow import greedy_decode
from engines.workflow.speculative import speculative_decode
from harness.budgets import expected_readback
from harness.packages import resolve_package
from harness.runner import run_matrix
from suites.lookup_support import with_prompt_lookup
from suites.planted import engines as pe
from suites.support import accept_case
from suites.test_prompt_lookup import check_rounds
from suites.test_speculative_ignore_eos import SimulatedDevice, with_eos

NEW_TOKENS = 32
WIDTH = 6
FIXTURES = {"tiny_llama_static": range(1, WIDTH + 1), "hybrid_mtp": (WIDTH,)}


@pytest.fixture(scope="module")
def lookup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("shifted")
    return {name: with_prompt_lookup(resolve_package(name).root, folder / name, WIDTH)
            for name in FIXTURES}


def plain_reads(result) -> list[int]:
    """The indices of the tokens a plain step's own id decided (not the prefill's, not a
    round's): where an eos makes the loop undo a queued forward."""
    offset = len(result.prompt)  # token i sits at position offset + i
    from_rounds = set()
    for start, n in zip(result.start_per_round, result.acceptance_per_round):
        first = start - offset + 1  # the pending token sits at position start
        from_rounds.update(range(first, first + n + 1))
    return [i for i in range(1, len(result.tokens)) if i not in from_rounds]


@pytest.fixture
def as_on_a_device(monkeypatch):
    """Host ops whose ids count as read back asynchronously: the loops a device runs."""
    monkeypatch.setattr(HostTensorOps, "asynchronous_ids", True)


def test_a_host_engine_keeps_the_classic_loop(lookup, engine_cache):
    """On the host an id is read before anything else runs: shifting would only add head
    forwards, so the default loop is the classic one there."""
    package = lookup["tiny_llama_static"]
    engine = engine_cache("native-host", package)
    assert not engine.tensor_ops.asynchronous_ids
    for prompt in package.spec.prompts:
        result = speculative_decode(engine, prompt, NEW_TOKENS, WIDTH)
        assert result.ledger.proposals and not any(result.shifted_per_round)


@pytest.mark.claim("spec_equals_greedy", "token_identity")
@pytest.mark.parametrize("package_name", FIXTURES)
def test_shifted_rounds_give_the_classic_loop_s_greedy_s_and_the_oracle_s_tokens(
        lookup, engine_cache, as_on_a_device, package_name):
    package = lookup[package_name]
    engine = engine_cache("native-host", package)
    seen = {"shifted": 0, "classic": 0, "plain": 0, "rejected": 0, "restores": 0}
    for prompt in package.spec.prompts:
        greedy = greedy_decode(engine, prompt, NEW_TOKENS).tokens
        assert greedy == oracle_decode(package, prompt, NEW_TOKENS).tokens
        for width in FIXTURES[package_name]:
            classic = speculative_decode(engine, prompt, NEW_TOKENS, width, pipelined=False)
            assert not any(classic.shifted_per_round)
            result = speculative_decode(engine, prompt, NEW_TOKENS, width)
            assert result.tokens == classic.tokens == greedy, (package_name, prompt, width)
            check_rounds(result, package, width)
            led = result.ledger
            seen["shifted"] += led.shifted_verifications
            seen["classic"] += led.proposals - led.shifted_verifications
            seen["plain"] += len(plain_reads(result))
            seen["rejected"] += led.rejected
            seen["restores"] += led.restores
    wanted = {k for k in seen if k != "restores" or package.spec.decoding.speculative.snapshot}
    assert all(seen[k] for k in wanted), seen


@pytest.mark.claim("readback_budget")
def test_a_shifted_decode_reads_back_what_the_budget_states(lookup):
    """On a simulated device (host ops accounting crossings as a device does): 4 bytes for
    the prefill's token and each plain step whose id is read, none for a decode forward a
    shifted round judged, 8 per verification; ``harness.budgets`` states exactly that."""
    engine = SimulatedDevice(lookup["tiny_llama_static"])
    total = 0
    for prompt in engine.package.spec.prompts:
        result = speculative_decode(engine, prompt, NEW_TOKENS, WIDTH)
        led = result.ledger
        reads = 1 + led.forwards["decode"] - led.shifted_verifications - led.discarded_forwards
        assert dict(led.readback_bytes) == {"token_id": 4 * (reads + led.proposals),
                                            "accept_count": 4 * led.proposals,
                                            "logits_audit": 0}
        assert expected_readback(result)[0] == led.readback_total
        total += led.shifted_verifications
    assert total, "no round was shifted"


@pytest.mark.claim("spec_equals_greedy", "readback_budget")
def test_a_forward_queued_past_eos_is_undone_and_never_read(lookup, engine_cache, tmp_path):
    """eos placed at a token a plain step's read decides: the loop had queued the next
    forward on it, undoes it (``discarded_forwards``), stops as greedy does, and the budget
    counts no id for it."""
    base = lookup["tiny_llama_static"]
    prompt, eos = None, None
    for candidate in base.spec.prompts:
        free = speculative_decode(SimulatedDevice(base), candidate, NEW_TOKENS, WIDTH)
        fresh = [i for i in plain_reads(free) if free.tokens[i] not in free.tokens[:i]]
        if fresh:
            prompt, eos = list(candidate), free.tokens[fresh[0]]
            stop = fresh[0]
            break
    assert prompt is not None, "no plain step decided a fresh token: pick other prompts"
    package = with_eos(base, tmp_path / "eos", eos)
    stopped = speculative_decode(SimulatedDevice(package), prompt, NEW_TOKENS, WIDTH)
    assert stopped.tokens == free.tokens[:stop + 1]
    assert stopped.tokens == greedy_decode(engine_cache("native-host", package), prompt,
                                           NEW_TOKENS).tokens
    led = stopped.ledger
    assert led.discarded_forwards == 1
    assert expected_readback(stopped)[0] == led.readback_total


def test_the_accept_with_a_head_row_is_the_accept_over_the_rows_joined():
    ops = HostTensorOps(Ledger())
    rng = np.random.default_rng(3)
    for width in (1, 2, 5, 7):
        for _ in range(8):
            rows, drafts, agreed = accept_case(rng, width, 40)
            want = ops.accept_drafts(rows, drafts)
            assert want[0] == agreed
            fed = np.array([drafts], np.int64)
            assert ops.accept_drafts(rows[1:], drafts, fed=fed, head=rows[:1]) == want


@pytest.mark.parametrize("head, rows, fed, field", [
    (np.zeros((2, 8), np.float32), 2, None, "head"),  # two rows
    (np.zeros((1, 8), np.float16), 2, None, "head"),  # another dtype
    (np.zeros((1, 7), np.float32), 2, None, "head"),  # another vocabulary
    (np.zeros((1, 8), np.float32), 1, None, "drafts"),  # a row short
    (np.zeros((1, 8), np.float32), 2, np.zeros((1, 3), np.int64), "fed"),  # pending + drafts
])
def test_an_accept_refuses_a_head_it_cannot_use(head, rows, fed, field):
    ops = HostTensorOps(Ledger())
    with pytest.raises(InputError) as caught:
        ops.accept_drafts(np.zeros((rows, 8), np.float32), [1, 2], fed=fed, head=head)
    assert caught.value.field == field


# -- planted: broken in exactly one way, and a control ---------------------------------------

class _HeadDropped(HostTensorOps):
    asynchronous_ids = True  # the loops a device runs

    def _accept(self, logits2d, drafts, fed=None, head=None):
        if head is not None:  # the bug: the verification's first row judges d1
            return super()._accept(np.concatenate([logits2d[:1], logits2d]), drafts)
        return super()._accept(logits2d, drafts, fed)


class HeadDropped(pe.Planted):
    """A shifted round's accept that ignores the head row: d1 is judged by the row after it."""
    name = "planted-shift-head-dropped"

    def make_tensor_ops(self):
        return _HeadDropped(self.ledger)


class _HeadCopied(HostTensorOps):
    asynchronous_ids = True

    def _accept(self, logits2d, drafts, fed=None, head=None):
        if head is not None:  # harmless: the same row, copied first
            head = np.array(head, copy=True)
        return super()._accept(logits2d, drafts, fed, head)


class HeadCopied(pe.Planted):
    """Control: the head row copied before the accept; nothing changes."""
    name = "planted-shift-head-copied"

    def make_tensor_ops(self):
        return _HeadCopied(self.ledger)


class _HeadReadApart(pe._SimulatedDeviceOps):
    def _accept(self, logits2d, drafts, fed=None, head=None):
        if head is not None:  # the bug: the head's id read back on its own first
            self.ledger.record_readback("token_id", 4)
        return super()._accept(logits2d, drafts, fed, head)


class HeadReadApart(pe.SimulatedDevice):
    """A shifted round that reads the queued forward's id before its accept: 4 bytes more a
    shifted round, every token right."""
    name = "planted-shift-head-read-apart"

    def make_tensor_ops(self):
        return _HeadReadApart(self.ledger)


@pytest.mark.claim("token_identity", "readback_budget")
@pytest.mark.parametrize("bug, status, claim, verdict", [
    (HeadDropped, "defect", None, None),
    (HeadCopied, "identical", None, None),
    (HeadReadApart, "budget", "readback_budget", "fail"),
    (pe.SimulatedDevice, "identical", "readback_budget", "pass"),
], ids=lambda v: getattr(v, "name", v))
def test_the_run_catches_a_broken_shifted_round_and_passes_its_controls(lookup, bug, status,
                                                                         claim, verdict):
    package = lookup["tiny_llama_static"]
    summary = run_matrix([bug], [str(package.root)], None, NEW_TOKENS, mode="speculative",
                         widths=[WIDTH])
    cells = summary.cells
    assert cells and {c.mode for c in cells} == {f"prompt-lookup/w{WIDTH}"}
    statuses = {c.status for c in cells}
    if status == "identical":
        assert statuses == {"identical"}, [(c.prompt_name, c.status, c.reason) for c in cells]
    else:
        assert status in statuses, [(c.prompt_name, c.status, c.reason) for c in cells]
    if claim is not None:
        assert {c.verdicts.get(claim) for c in cells} == {verdict}
