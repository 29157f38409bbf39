"""Prefill graphs on the host (``engines/native/prefill_graphs.py``), with the graph slots'
fake device: a length's first prefill runs eagerly, its second captures, later ones replay;
every result is the eager forward's; the kept graphs are bounded by count and bytes; a long
prefill and a failed capture stay eager. The same on CUDA: ``suites/test_graph_slots.py``.
"""
from __future__ import annotations

import numpy as np
import pytest

from engines.native.prefill_graphs import BUDGET_BYTES, NAME, PrefillGraphs, budget_for
from suites.test_graph_slots_host import FakeAllocator, FakeDevice, Harness, toy, toy_feeds


def _harness(device=None, **limits) -> Harness:
    harness = Harness(device=device)
    harness.slots.prefill = PrefillGraphs(harness.device, lambda: harness.ledger, **limits)
    return harness


def _prefill(harness: Harness, tokens, state=None):
    feeds = toy_feeds(tokens, 0, np.zeros((1, 4), np.float32) if state is None else state)
    want = toy({k: v.copy() for k, v in feeds.items()})
    got = harness.slots.run("target", feeds, "prefill", harness.eager,
                            lambda inputs: (toy(inputs), []), positions=len(tokens))
    for name, value in want.items():
        assert got[name].tobytes() == value.tobytes(), name
    return got


def _counters(harness):
    c = harness.ledger.slot(NAME)
    return c.captures, c.replays, c.fallbacks, c.invalidations


@pytest.mark.claim("graph_replay")
def test_a_length_runs_eagerly_then_captures_then_replays():
    h = _harness()
    _prefill(h, [3, 1, 4])
    assert h.device.captures == 0 and not h.slots.replayed and h.eager_calls == 1
    _prefill(h, [2, 7, 1])  # the same length, other tokens: captured now
    assert h.device.captures == 1 and not h.slots.replayed and h.eager_calls == 2
    for tokens in ([5, 9, 2], [6, 5, 3], [1, 1, 1]):
        _prefill(h, tokens)
        assert h.slots.replayed
    assert h.eager_calls == 2 and h.device.launches == 3
    assert _counters(h) == (1, 3, 0, 0)


@pytest.mark.claim("graph_replay")
def test_lengths_keep_graphs_of_their_own():
    h = _harness()
    for _ in range(3):
        for m in (2, 5, 3):
            _prefill(h, list(range(1, m + 1)))
    assert h.device.captures == 3 and len(h.slots.prefill.graphs) == 3
    assert _counters(h) == (3, 3, 0, 0)


@pytest.mark.claim("graph_replay")
def test_the_least_recently_used_graph_goes_first():
    h = _harness(keep=2)
    for m in (2, 3, 2, 3):
        _prefill(h, [1] * m)  # both captured
    _prefill(h, [1] * 2)      # 2 is now the most recent
    _prefill(h, [1] * 4)
    _prefill(h, [1] * 4)      # a third graph: 3 is dropped
    graphs = h.slots.prefill.graphs
    assert [{n: shape for n, shape, _ in sig.feeds}["tokens"][1] for sig in graphs] == [2, 4]
    assert _counters(h)[3] == 1
    _prefill(h, [1] * 2)
    assert h.slots.replayed  # the kept one still replays


class _SizedAllocator(FakeAllocator):
    def snapshot(self):
        return {"live_allocations": self.allocated, "live_bytes": 100 * self.allocated,
                "total_allocations": 0}


class _SizedDevice(FakeDevice):
    def new_allocator(self):
        return _SizedAllocator()


@pytest.mark.claim("graph_replay")
def test_graphs_over_the_byte_budget_are_dropped_but_never_the_new_one():
    h = _harness(device=_SizedDevice(), budget_bytes=350)  # one graph: 3 inputs, 300 bytes
    for m in (2, 2, 3, 3):
        _prefill(h, [1] * m)
    assert len(h.slots.prefill.graphs) == 1 and _counters(h)[3] == 1
    _prefill(h, [1] * 3)
    assert h.slots.replayed


@pytest.mark.claim("graph_replay")
def test_a_long_prefill_is_never_captured():
    h = _harness(max_rows=4)
    for _ in range(3):
        _prefill(h, [1] * 5)
    assert h.device.captures == 0 and h.eager_calls == 3 and not h.slots.replayed


@pytest.mark.claim("graph_replay")
def test_a_failed_capture_stays_eager_and_is_not_retried():
    h = _harness(device=FakeDevice(fail_capture=True))
    for _ in range(4):
        _prefill(h, [1, 2])
    assert h.device.captures == 1 and h.eager_calls == 4
    assert _counters(h)[2] == 3  # the failing capture's forward and the two after it


@pytest.mark.claim("graph_replay")
def test_reset_drops_every_prefill_graph_and_forgets_what_it_saw():
    h = _harness()
    for _ in range(3):
        _prefill(h, [1, 2])
    h.slots.reset("PREFILL")
    assert not h.slots.prefill.graphs and h.ledger.slot(NAME).resets == 1
    _prefill(h, [1, 2])
    assert not h.slots.replayed and h.device.captures == 1  # seen once again: eager


@pytest.mark.claim("graph_replay")
def test_graphs_off_means_every_prefill_is_eager():
    h = _harness()
    h.slots.enabled = False
    for _ in range(3):
        _prefill(h, [1, 2])
    assert h.device.captures == 0 and h.eager_calls == 3


@pytest.mark.claim("graph_replay")
def test_a_replay_that_writes_nothing_is_caught_by_the_eager_values():
    """Planted: the graph's kernels write nothing, so a replay returns the capture's values
    (the second sighting's); the third prefill's tokens differ, and the comparison with the
    eager forward fails."""
    h = _harness(device=FakeDevice(broken_graphs=True))
    _prefill(h, [1, 2])
    _prefill(h, [3, 4])
    with pytest.raises(AssertionError):
        _prefill(h, [5, 6])


def test_the_byte_budget_is_four_gib_or_a_sixteenth_of_the_device():
    assert budget_for(141 * 10**9) == BUDGET_BYTES == 4 << 30
    assert budget_for(24 * 2**30) == 1536 * 2**20
