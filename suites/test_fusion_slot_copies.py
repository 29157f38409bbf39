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
    assert list(slot._fed) == [("state_in", id(slot.outputs["state_out"]))]
    (kept, entry), = slot._fed.values()
    assert kept is slot.outputs["state_out"] and entry == h.device.entries_made[3 + 2]
    slot.reset()
    assert slot._fed == {}


def test_cells_alternating_between_the_slots_keep_their_copy_entries(monkeypatch):
    """A speculative decode alternates PRIMARY and VERIFY, each fed the other's outputs: after
    a cell's first sighting from either slot, neither asks the device for its copy entry or
    builds a signature again, and the answers are the component's own. A slot that
    drops its graph has the other forget its buffers (nothing keeps them allocated)."""
    import weakref

    from engines.native.graph_slots import Signature

    built = []
    real = Signature.of.__func__
    monkeypatch.setattr(Signature, "of", classmethod(
        lambda cls, component, feeds: built.append(component) or real(cls, component, feeds)))
    h = Harness(device=BatchingDevice())
    state = zeros_state()
    made = []  # copy entries asked for, forward by forward
    for step in range(8):
        slot = (GraphSlot.PRIMARY, GraphSlot.VERIFY)[step % 2]
        tokens = [step] if slot is GraphSlot.PRIMARY else [step, step + 1, step + 2]
        before = len(h.device.entries_made)
        want = toy(toy_feeds(tokens, step, state))  # before the replay overwrites the state
        out = h.run(slot, toy_feeds(tokens, step, state))
        made.append(len(h.device.entries_made) - before)
        for name in ("logits", "state_out"):
            np.testing.assert_array_equal(out[name], want[name])
        state = out["state_out"]
    # two captures; then tokens, positions and a cell from the eager run or a slot seen first;
    # then tokens and positions alone
    assert made == [0, 0, 3, 3, 3, 2, 2, 2]
    assert len(built) == 2  # the two captures' signatures
    verify = h.slots[GraphSlot.VERIFY]
    primary_out = h.slots[GraphSlot.PRIMARY].outputs["state_out"]
    assert ("state_in", id(primary_out)) in verify._fed
    gone = weakref.ref(primary_out)
    del primary_out, out, state
    h.slots.reset(GraphSlot.PRIMARY)
    assert verify._fed == {}  # it was only ever fed PRIMARY's outputs
    assert gone() is None


class AttributeReadingDevice(BatchingDevice):
    """``BatchingDevice`` whose checks read what ``CupyGraphDevice``'s read of an array (its
    size, flags, bytes and pointers) and whose copies and graphs do nothing, so a benchmark
    of the slots times the host's part of a replay with a decode's sixty kv cells."""

    def accepts(self, value):
        return isinstance(value, np.ndarray) and value.size > 0 and value.ctypes.data != 0

    def copy_entry(self, dst, src):
        if src.flags.c_contiguous and dst.flags.c_contiguous and src.nbytes == dst.nbytes:
            return super().copy_entry(dst, src)
        return None

    def copy_many(self, copies):
        self.events.append("copy_many")  # the timing is the slots': nothing is copied

    def launch(self, graph):
        self.launches += 1  # nor run


def test_benchmark_alternating_replays_with_sixty_cells(benchmark):
    """The host's part of a PRIMARY, VERIFY, PRIMARY ... sequence, each fed the other's
    outputs for 60 kv cells (``pytest --benchmark-enable -k alternating_replays``): after the
    first of each, a replay asks for the copy entries of its tokens and positions alone."""
    cells = [f"cell{i}" for i in range(60)]
    h = Harness(device=AttributeReadingDevice())

    def body(feeds):
        out = {f"{name}_out": feeds[name] for name in cells}
        return out | {"logits": feeds["tokens"].astype(np.float32)}

    state = {name: np.zeros((1, 3, 64, 64), np.float16) for name in cells}

    def forward(slot, m):
        feeds = dict(state, tokens=np.zeros((1, m), np.int64),
                     positions=np.zeros((1, m), np.int64))
        phase = "decode" if slot is GraphSlot.PRIMARY else "verify"
        out = h.slots.run("target", feeds, phase, body, lambda inputs: (body(inputs), []), m)
        for name in cells:
            state[name] = out[f"{name}_out"]

    def pair():
        forward(GraphSlot.PRIMARY, 1)
        forward(GraphSlot.VERIFY, 8)

    for _ in range(3):  # the captures, then each slot fed the other's outputs once
        pair()
    made = len(h.device.entries_made)
    benchmark(pair)
    rounds = h.counters(GraphSlot.PRIMARY).replays - 2
    assert len(h.device.entries_made) - made == 2 * 2 * rounds  # tokens and positions alone


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
