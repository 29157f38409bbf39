"""A replay's feed copies as one batched launch (``CupyGraphDevice.copy_many``,
``engines/native/batched_copy.py``), checked on the host: the slot hands the device every
copy at once, the static buffers it skips, before the poison and the launch, with the same
answers and counters as copy by copy; the launch arguments' table layout; the kernel
source compiles. The device's copies themselves: ``suites/test_fused_kernels_cuda.py``.
"""
from __future__ import annotations

import numpy as np
import pytest

from engines.native import batched_copy
from engines.native.graph_slots import GraphSlot
from suites.nvcc_check import NVCC, compile_module, entry_instances
from suites.test_graph_slots_host import (FakeDevice, Harness, replay_fed_its_static_input,
                                         toy, toy_feeds, zeros_state)


class BatchingDevice(FakeDevice):
    """The fake device with a batched copy: one event per call, the pairs recorded, and each
    copy entry it was asked for (a pair's addresses, as the CUDA device's are)."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.batches: list[list[tuple[np.ndarray, int]]] = []  # (dst, id of src)
        self.entries_made: list[tuple[int, int]] = []

    def copy_entry(self, dst, src):
        entry = (dst.ctypes.data, src.ctypes.data)
        self.entries_made.append(entry)
        return entry

    def copy_many(self, copies):
        self.events.append("copy_many")
        self.batches.append([(dst, id(src)) for dst, src, _entry in copies])
        for dst, src, entry in copies:
            assert entry == (dst.ctypes.data, src.ctypes.data)  # a kept entry still holds
            np.copyto(dst, src)


def test_a_replay_copies_its_feeds_in_one_batch_before_the_launch():
    h = Harness(device=BatchingDevice())
    plain = Harness()
    state, ref_state = zeros_state(), zeros_state()
    for step in range(6):
        out = h.run(GraphSlot.PRIMARY, toy_feeds([step % 3], step, state))
        ref = plain.run(GraphSlot.PRIMARY, toy_feeds([step % 3], step, ref_state))
        np.testing.assert_array_equal(out["logits"], ref["logits"])
        np.testing.assert_array_equal(out["state_out"], ref["state_out"])
        state, ref_state = out["state_out"], ref["state_out"]
    # the first forward captures (its copies are the capture's own); five replays, one batch each
    assert h.device.events.count("copy_many") == 5 and h.device.events.count("launch") == 5
    assert "copy" not in h.device.events[h.device.events.index("copy_many"):]
    assert all(len(batch) == 3 for batch in h.device.batches)  # tokens, positions, state_in
    assert h.counters(GraphSlot.PRIMARY).replays == plain.counters(GraphSlot.PRIMARY).replays == 5
    assert h.counters(GraphSlot.PRIMARY).captures == 1


def test_a_state_cell_fed_back_keeps_its_copy_entry_and_nothing_else_is_held():
    """A steady replay asks the device for no copy entry of a state cell fed back from the
    slot's own output (its addresses cannot change while the slot holds it); a new feed
    (tokens, positions, a state made elsewhere) gets a fresh entry every time, and the slot
    keeps no reference to it past its replay (a kept array would stay allocated)."""
    import weakref

    h = Harness(device=BatchingDevice())
    eager_state = zeros_state()
    out = h.run(GraphSlot.PRIMARY, toy_feeds([1], 0, eager_state))
    state = out["state_out"]  # the capture's eager result: not the slot's buffer
    out = h.run(GraphSlot.PRIMARY, toy_feeds([2], 1, state))
    assert len(h.device.entries_made) == 3  # tokens, positions, that state
    gone = weakref.ref(state)
    del state
    assert gone() is None  # the slot let it go after its replay
    for step in range(2, 6):
        out = h.run(GraphSlot.PRIMARY, toy_feeds([step], step, out["state_out"]))
    assert len(h.device.entries_made) == 3 + 3 + 2 * 3  # the cell's once, then tokens, positions
    slot = h.slots[GraphSlot.PRIMARY]
    assert list(slot._fed) == ["state_in"]
    kept, entry = slot._fed["state_in"]
    assert kept is slot.outputs["state_out"] and entry == h.device.entries_made[3 + 2]
    slot.reset()
    assert slot._fed == {}


def test_a_feed_that_is_the_static_input_is_left_out_of_the_batch():
    h = Harness(device=BatchingDevice())
    out, want = replay_fed_its_static_input(h)
    assert h.device.events == ["copy_many", "launch"]
    (batch,) = h.device.batches
    slot = h.slots[GraphSlot.PRIMARY]
    assert [dst is slot.inputs[name] for (dst, _), name in zip(batch, ("tokens", "positions"))] \
        == [True, True] and len(batch) == 2
    np.testing.assert_array_equal(out["state_out"], want)


def test_poison_still_follows_the_batched_copy():
    h = Harness(device=BatchingDevice(), poison=True)
    h.run(GraphSlot.PRIMARY, toy_feeds([1], 0, zeros_state()))
    h.device.events.clear()
    out = h.run(GraphSlot.PRIMARY, toy_feeds([2], 1, zeros_state()))
    assert h.device.events == ["copy_many"] + ["poison"] * 2 + ["launch"]
    np.testing.assert_array_equal(out["logits"], toy(toy_feeds([2], 1, zeros_state()))["logits"])


def test_the_launch_table_holds_each_copy_and_splits_at_the_argument_limit():
    n = batched_copy.MAX_ENTRIES + 5
    entries = [(4096 * (i + 1), 8192 * (i + 1) + 16, 100 + i) for i in range(n)]
    built = batched_copy.BatchedCopy._build(entries)
    assert [count for *_rest, count in built] == [batched_copy.MAX_ENTRIES, 5]
    for (params, (table, count), blocks, _n), at in zip(built, (0, batched_copy.MAX_ENTRIES)):
        part = entries[at:at + batched_copy.MAX_ENTRIES]
        assert table.shape == (3, batched_copy.MAX_ENTRIES) and table.dtype == np.uint64
        assert [tuple(int(v) for v in table[:, i]) for i in range(len(part))] == part
        assert not table[:, len(part):].any()  # unused slots are zero
        assert int(count[0]) == len(part)
        # the launch's argument array points at the table and the count
        assert [int(p) for p in params] == [table.ctypes.data, count.ctypes.data]
        assert blocks == 1  # every copy here fits one block's 16-byte words
    # 3 arrays of MAX_ENTRIES 8-byte words plus the count stay under CUDA's 4 KiB of arguments
    assert 3 * 8 * batched_copy.MAX_ENTRIES + 4 <= 4096
    wide = batched_copy.BatchedCopy._build([(16, 32, 10 ** 9)])
    assert wide[0][2] == batched_copy.MAX_BLOCKS_PER_COPY


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_batched_copy_kernel_compiles_with_nvcc(tmp_path):
    """The kernel is there, and its table argument is MAX_ENTRIES copies wide."""
    ptx = compile_module(batched_copy.MODULE, "sm_90", tmp_path)
    entry = entry_instances(ptx, batched_copy.MODULE)[batched_copy.KERNEL_NAME]
    assert f"{entry}_param_0[{3 * 8 * batched_copy.MAX_ENTRIES}]" in ptx


def test_overlapping_copies_are_not_batched():
    disjoint = batched_copy.disjoint
    assert disjoint([(0, 1000, 100), (200, 1100, 100), (400, 1200, 50)])
    assert disjoint([(0, 1000, 100), (100, 1100, 100)])  # ranges that only touch
    assert disjoint([(0, 1000, 100), (200, 1000, 100)])  # one source read twice
    assert not disjoint([(0, 1000, 100), (200, 50, 100)])  # a source inside a destination
    assert not disjoint([(0, 1000, 100), (40, 2000, 10)])  # two destinations overlap
    # a source inside a destination, with another range sorted between the two
    assert not disjoint([(0, 100, 500), (5000, 200, 10)])
    assert disjoint([(0, 1000, 0), (0, 2000, 100)])  # an empty copy overlaps nothing
