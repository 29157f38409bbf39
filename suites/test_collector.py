"""Python's collector around a bench's timed decodes (``harness/collector.py``): the heap is
collected and frozen before the block, and every collection inside it is counted on the
row."""
from __future__ import annotations

import gc
import weakref

from harness import bench as hb
from harness.collector import CollectorTime, collector_watched, thaw
from suites.test_bench import FAKE_BW, NEW, SMALL, logging_engine


class _Node:
    def __init__(self):
        self.me = self  # a cycle: only the collector frees it


def test_garbage_from_before_is_collected_and_the_rest_frozen_first():
    cycle = _Node()
    gone = weakref.ref(cycle)
    del cycle
    try:
        with collector_watched(CollectorTime()):
            assert gone() is None  # collected before the block
            assert gc.get_freeze_count() > 0
    finally:
        thaw()
    assert gc.get_freeze_count() == 0


def test_every_collection_inside_the_block_is_counted_with_its_time():
    spent = CollectorTime()
    callbacks = len(gc.callbacks)
    try:
        with collector_watched(spent):
            assert spent.collections == 0  # the collection before the block is not counted
            gc.collect()
            gc.collect(0)
        with collector_watched(spent):  # one accumulator over several blocks
            gc.collect()
    finally:
        thaw()
    assert spent.collections == 3 and spent.seconds > 0
    assert len(gc.callbacks) == callbacks  # the watch leaves with its block


def test_a_row_counts_the_collections_its_timed_decodes_ran_into():
    """Planted: an engine that forces a full collection in every forward is counted at least
    one a forward; the control, the same engine without it, fewer. The bench thaws the heap
    after."""
    class Collecting(logging_engine([], False)):
        name = "collecting"

        def run_component(self, component, feeds, phase=None):
            gc.collect()
            return super().run_component(component, feeds, phase=phase)

    rows = hb.bench([Collecting], [SMALL], repeats=2, max_new_tokens=NEW, bandwidth=FAKE_BW)
    (row,) = [r for r in rows if r.engine == "collecting"]
    forwards_per_pass = NEW * len(row.prompts)  # a prefill and NEW - 1 steps a prompt
    assert row.gc_collections >= 2 * forwards_per_pass and row.gc_ms > 0
    assert gc.get_freeze_count() == 0
    quiet = [r for r in hb.bench([logging_engine([], False)], [SMALL], repeats=2,
                                 max_new_tokens=NEW, bandwidth=FAKE_BW)
             if r.engine == "logged"]
    assert quiet[0].gc_collections < forwards_per_pass
