"""Graph-slot logic on the host (claim 6's bookkeeping), with a fake device whose "graph"
re-runs the captured body against the static buffers, as a CUDA graph replays its kernels
against the addresses it recorded.

What is checked: signatures, the capture/replay/fallback/invalidate/reset lifecycle and its
counters, the two slots' independence, the aliasing of a state cell fed back from a static
output, poisoning (and two sabotaged replays it or the eager comparison must catch), the
plan's device cache of host-resolved values, and the tensor ops' device feed on the host.
The same lifecycle on CUDA is ``suites/test_graph_slots.py`` (marker ``gpu``).
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper

from engines.backends.native_host import NativeHostEngine
from engines.device_memory import MemoryTally
from engines.errors import InputError
from engines.ledger import Ledger
from engines.native.array_backend import NumpyArrayBackend
from engines.native.graph_slots import (
    SLOT_FOR_PHASE, GraphSlot, GraphSlots, Signature, SlotStatus, forward_positions,
    graphs_default, slot_for_phase)
from engines.native.plan import HOST_VALUE_CACHE_PER_VALUE, Plan
from engines.tensor_ops.host import HostTensorOps

# -- the fake device ---------------------------------------------------------------------------


class FakeAllocator:
    def __init__(self):
        self.pool = self
        self.allocated = 0
        self.freed_blocks = 0

    def snapshot(self):
        return {"live_allocations": self.allocated, "live_bytes": 0, "total_allocations": 0}


class FakeGraph:
    """Replays the captured body: reads the static inputs as they are at launch, writes the
    static outputs in place."""

    def __init__(self, body, outputs, broken: bool = False):
        self.body = body
        self.outputs = outputs
        self.broken = broken  # a graph whose kernels write nothing

    def run(self):
        if self.broken:
            return
        fresh, _keep = self.body()
        for name, buffer in self.outputs.items():
            np.copyto(buffer, fresh[name])


class FakeDevice:
    def __init__(self, fail_capture: bool = False, broken_graphs: bool = False):
        self.fail_capture = fail_capture
        self.broken_graphs = broken_graphs
        self.captures = 0
        self.launches = 0
        self.syncs = 0
        self.released = 0
        self.events: list[str] = []

    def accepts(self, value):
        return isinstance(value, np.ndarray) and value.size > 0

    def new_allocator(self):
        return FakeAllocator()

    def empty_like(self, value, allocator):
        allocator.allocated += 1
        return np.empty_like(value)

    def copy(self, dst, src):
        self.events.append("copy")
        np.copyto(dst, src)

    def poison(self, buffer):
        self.events.append("poison")
        if buffer.dtype.kind == "f":
            buffer.fill(np.nan)
        else:
            buffer.fill(np.iinfo(buffer.dtype).min)

    def capture(self, body, allocator):
        self.captures += 1
        if self.fail_capture:
            raise NotImplementedError("calling cuBLAS API during stream capture is unsupported")
        outputs, keep = body()
        owned = {name: np.array(v, copy=True) for name, v in outputs.items()}  # slot buffers
        return FakeGraph(body, owned, self.broken_graphs), owned, keep

    def launch(self, graph):
        self.events.append("launch")
        self.launches += 1
        graph.run()

    def synchronize(self):
        self.syncs += 1

    def release(self, allocator):
        self.released += 1


# -- a toy stateful component ------------------------------------------------------------------

def toy(feeds):
    """logits depend on the tokens, positions and state; the state accumulates."""
    tokens, positions, state = feeds["tokens"], feeds["positions"], feeds["state_in"]
    logits = (state[:, None, :] * 0.5 + tokens[..., None] + positions[..., None] * 0.25)
    return {"logits": logits.astype(np.float32),
            "state_out": (state + tokens.sum() + positions.sum()).astype(np.float32)}


def toy_feeds(tokens, start, state):
    m = len(tokens)
    return {"tokens": np.asarray(tokens, np.int64).reshape(1, m),
            "positions": np.arange(start, start + m, dtype=np.int64).reshape(1, m),
            "state_in": state}


class Harness:
    """Both slots over the fake device, routed by phase, with the eager calls counted."""

    def __init__(self, device=None, poison=False, enabled=True):
        self.device = device or FakeDevice()
        self.ledger = Ledger()
        self.eager_calls = 0
        self.slots = GraphSlots(self.device, lambda: self.ledger, enabled=enabled,
                                poison_outputs=poison)

    def eager(self, feeds):
        self.eager_calls += 1
        return toy(feeds)

    def run(self, slot, feeds, component="target"):
        phase = {GraphSlot.PRIMARY: "decode", GraphSlot.VERIFY: "verify"}.get(slot, slot)
        return self.slots.run(component, feeds, phase, self.eager,
                              lambda inputs: (toy(inputs), ["kept"]))

    def counters(self, slot):
        return self.ledger.slot(slot.value)


def zeros_state():
    return np.zeros((1, 4), np.float32)


class TalliedDevice(FakeDevice):
    """A device whose pools add every buffer to one tally, as CupyGraphDevice's do."""

    def __init__(self):
        super().__init__()
        self.tally = MemoryTally()

    def empty_like(self, value, allocator):
        self.tally.add(1, 0)
        return super().empty_like(value, allocator)


def test_the_slots_live_counts_are_the_devices_tally_where_it_keeps_one():
    # read in constant time on every forward: the same counts the sum over the pools gives
    tallied, summed = Harness(TalliedDevice()), Harness()
    for harness in (tallied, summed):
        harness.run(GraphSlot.PRIMARY, toy_feeds([1], 0, zeros_state()))
        harness.run(GraphSlot.VERIFY, toy_feeds([1, 2], 1, zeros_state()))
    assert tallied.slots.live() == tallied.device.tally.counts() == summed.slots.live()
    assert tallied.slots.live()[0] == 6  # three feeds a capture, two captures
    tallied.device.tally.add(2, 64)  # read from the tally, not summed over the pools
    assert tallied.slots.live() == (8, 64)
    # prefill graphs on another device add pools the tally does not hold: summed instead
    tallied.slots.prefill = SimpleNamespace(device=FakeDevice(), live=lambda: (5, 0))
    assert tallied.slots.live() == (11, 0)


# -- signatures and phases ---------------------------------------------------------------------

@pytest.mark.claim("graph_replay")
def test_signature_is_component_plus_feed_shapes_and_dtypes():
    a = toy_feeds([1], 0, zeros_state())
    b = toy_feeds([9], 7, np.ones((1, 4), np.float32))  # other values, same shapes
    assert Signature.of("target", a) == Signature.of("target", b)
    assert Signature.of("target", a) == Signature.of("target", dict(reversed(list(a.items()))))
    assert Signature.of("target", a) != Signature.of("drafter", a)
    assert Signature.of("target", a) != Signature.of("target", toy_feeds([1, 2], 0, zeros_state()))
    c = dict(a, state_in=a["state_in"].astype(np.float64))
    assert Signature.of("target", a) != Signature.of("target", c)


@pytest.mark.claim("graph_replay")
def test_phases_map_to_slots_and_every_other_phase_is_eager():
    assert slot_for_phase("decode") is GraphSlot.PRIMARY
    assert slot_for_phase("propose") is GraphSlot.PRIMARY  # a proposer step is M=1 work
    assert slot_for_phase("verify") is GraphSlot.VERIFY
    assert slot_for_phase("verify", 5) is GraphSlot.VERIFY
    for phase in ("prefill", "readvance", None, "nonsense"):
        assert slot_for_phase(phase) is None
    # PRIMARY is the single-position slot: a multi-position decode/propose runs eagerly
    assert slot_for_phase("decode", 1) is GraphSlot.PRIMARY
    assert slot_for_phase("propose", 2) is None and slot_for_phase("decode", 3) is None
    assert set(SLOT_FOR_PHASE.values()) == set(GraphSlot)


@pytest.mark.claim("graph_replay")
def test_graphs_are_on_by_default_only_where_every_kv_cell_is_static(packages):
    assert graphs_default(packages["tiny_llama_static"].spec)
    assert graphs_default(packages["tiny_llama_pair_static"].spec)
    assert not graphs_default(packages["tiny_llama"].spec)
    assert not graphs_default(packages["tiny_llama_pair"].spec)
    assert not graphs_default(packages["lookup_chained"].spec)


@pytest.mark.claim("graph_replay")
def test_routing_other_phases_graphs_off_and_host_empties_run_eagerly():
    feeds = toy_feeds([1], 0, zeros_state())
    h = Harness()
    for phase in ("prefill", "readvance", None):
        h.run(phase, feeds)
    h.slots.run("target", toy_feeds([1, 2], 0, zeros_state()), "propose", h.eager, None,
                positions=2)
    empty = dict(feeds, state_in=np.zeros((1, 0), np.float32))
    h.slots.run("target", empty, "decode", lambda f: {"ok": True}, None)
    off = Harness(enabled=False)
    off.run(GraphSlot.PRIMARY, feeds)
    off.run(GraphSlot.VERIFY, toy_feeds([1, 2], 0, zeros_state()))
    for harness in (h, off):
        assert harness.device.captures == 0 and harness.ledger.graph_slots == {}
        assert all(state.status is SlotStatus.EMPTY for state in harness.slots.values())
    assert h.eager_calls == 4 and off.eager_calls == 2  # 3 phases, the catch-up, the empty
    assert h.slots["PRIMARY"] is h.slots[GraphSlot.PRIMARY]


# -- lifecycle ---------------------------------------------------------------------------------

@pytest.mark.claim("graph_replay")
def test_first_use_captures_then_replays_with_static_buffers():
    h = Harness()
    feeds = toy_feeds([3], 4, zeros_state())
    first = h.run(GraphSlot.PRIMARY, feeds)
    slot = h.slots[GraphSlot.PRIMARY]
    assert slot.status is SlotStatus.CAPTURED and h.eager_calls == 1
    assert vars(h.counters(GraphSlot.PRIMARY)) == dict(captures=1, replays=0, fallbacks=0,
                                                       invalidations=0, resets=0)
    for name, value in toy(feeds).items():
        np.testing.assert_array_equal(first[name], value)
    seconds = [h.run(GraphSlot.PRIMARY, toy_feeds([t], 5 + t, zeros_state())) for t in range(3)]
    assert h.eager_calls == 1 and h.device.launches == 3
    assert h.counters(GraphSlot.PRIMARY).replays == 3
    for name in first:  # the same static output buffers every replay, none an input
        assert len({id(s[name]) for s in seconds}) == 1
        assert all(seconds[0][name] is not buf for buf in slot.inputs.values())
    np.testing.assert_array_equal(seconds[-1]["logits"],
                                  toy(toy_feeds([2], 7, zeros_state()))["logits"])
    assert slot._keep == ["kept"]  # what the graph reads is held while it lives


@pytest.mark.claim("graph_replay")
def test_a_state_cell_fed_back_from_a_static_output_reads_the_value_it_saw():
    """The interpreter's loop: the cell's next feed IS last replay's output buffer; the
    copy into the static input happens before the launch that overwrites that buffer."""
    h = Harness()
    state = zeros_state()
    ref_state = zeros_state()
    for step in range(12):
        feeds = toy_feeds([step % 5], step, state)
        out = h.run(GraphSlot.PRIMARY, feeds)
        ref = toy(toy_feeds([step % 5], step, ref_state))
        np.testing.assert_array_equal(out["logits"], ref["logits"])
        np.testing.assert_array_equal(out["state_out"], ref["state_out"])
        state, ref_state = out["state_out"], ref["state_out"]
    events = h.device.events
    assert events.index("copy") < events.index("launch")
    assert h.counters(GraphSlot.PRIMARY).replays == 11


@pytest.mark.claim("graph_replay")
def test_a_steady_replay_is_known_without_building_a_signature(monkeypatch):
    """A decode step feeds a state cell per kv cell: a cell fed back from the slot's own
    output is recognised by identity, a new feed of the captured shape by its shape and
    dtype; anything else (an output buffer under another input's name, another shape)
    still goes through the signature and recaptures."""
    built = []
    real = Signature.of.__func__
    monkeypatch.setattr(Signature, "of", classmethod(
        lambda cls, component, feeds: built.append(component) or real(cls, component, feeds)))
    h = Harness()
    state = zeros_state()
    for step in range(6):
        want = toy(toy_feeds([step], step, state))  # before the replay overwrites the state
        out = h.run(GraphSlot.PRIMARY, toy_feeds([step], step, state))
        np.testing.assert_array_equal(out["logits"], want["logits"])
        np.testing.assert_array_equal(out["state_out"], want["state_out"])
        state = out["state_out"]
    slot = h.slots[GraphSlot.PRIMARY]
    c = h.counters(GraphSlot.PRIMARY)
    assert (c.captures, c.replays) == (1, 5) and len(built) == 1  # the capture's alone
    assert h.slots.replayed  # the outputs are the slot's own buffers
    assert set(slot._fed) == {("state_in", id(slot.outputs["state_out"]))}
    (kept, entry), = slot._fed.values()
    assert kept is slot.outputs["state_out"] and entry is None  # this device makes no entries
    logits = slot.outputs["logits"]  # [1, 1, 4] under the [1, 4] state's name
    swapped = h.run(GraphSlot.PRIMARY, toy_feeds([1], 6, logits))
    assert c.invalidations == 1 and len(built) == 2 and swapped["state_out"].shape == (1, 1, 4)
    assert not h.slots.replayed  # a capture's eager result
    h.run("prefill", toy_feeds([1], 7, zeros_state()))
    assert not h.slots.replayed
    h.run(GraphSlot.PRIMARY, toy_feeds([1], 8, zeros_state()))
    assert c.invalidations == 2 and len(built) == 3


@pytest.mark.claim("graph_replay")
def replay_fed_its_static_input(h: Harness):
    """A PRIMARY replay whose ``state_in`` feed is the slot's own static input (holding 3.0),
    the device's events cleared just before it: its outputs, and what it should compute."""
    h.run(GraphSlot.PRIMARY, toy_feeds([1], 0, zeros_state()))
    slot = h.slots[GraphSlot.PRIMARY]
    feeds = toy_feeds([2], 1, zeros_state())
    feeds["state_in"] = slot.inputs["state_in"]
    slot.inputs["state_in"][...] = 3.0
    h.device.events.clear()
    return h.run(GraphSlot.PRIMARY, feeds), np.full((1, 4), 3.0 + 2 + 1, np.float32)


@pytest.mark.claim("graph_replay")
def test_a_feed_that_is_the_static_input_is_not_copied():
    h = Harness()
    out, want = replay_fed_its_static_input(h)
    assert h.device.events == ["copy", "copy", "launch"]  # tokens, positions; not state_in
    np.testing.assert_array_equal(out["state_out"], want)


@pytest.mark.claim("graph_replay")
def test_a_new_signature_invalidates_and_recaptures():
    h = Harness()
    h.run(GraphSlot.VERIFY, toy_feeds([1, 2, 3], 0, zeros_state()))
    h.run(GraphSlot.VERIFY, toy_feeds([4, 5, 6], 3, zeros_state()))
    syncs = h.device.syncs
    out = h.run(GraphSlot.VERIFY, toy_feeds([4, 5], 3, zeros_state()))  # width shrank
    c = h.counters(GraphSlot.VERIFY)
    assert (c.captures, c.replays, c.invalidations) == (2, 1, 1)
    assert h.device.syncs == syncs + 1  # no queued replay may read the dropped buffers
    np.testing.assert_array_equal(out["logits"], toy(toy_feeds([4, 5], 3, zeros_state()))["logits"])
    h.run(GraphSlot.VERIFY, toy_feeds([4, 5], 3, zeros_state()))
    assert h.counters(GraphSlot.VERIFY).replays == 2


@pytest.mark.claim("graph_replay")
def test_reset_drops_one_slot_and_the_other_keeps_replaying():
    h = Harness()
    p, v = GraphSlot.PRIMARY, GraphSlot.VERIFY
    h.run(p, toy_feeds([1], 0, zeros_state()))
    h.run(v, toy_feeds([1, 2], 0, zeros_state()))
    h.slots[p].reset()
    assert h.slots[p].status is SlotStatus.EMPTY and h.slots[v].status is SlotStatus.CAPTURED
    out = h.run(v, toy_feeds([3, 4], 2, zeros_state()))
    np.testing.assert_array_equal(out["logits"], toy(toy_feeds([3, 4], 2, zeros_state()))["logits"])
    assert h.counters(v).replays == 1 and h.counters(v).captures == 1
    h.run(p, toy_feeds([1], 0, zeros_state()))  # retargeted after its reset: captures again
    assert h.counters(p).captures == 2 and h.counters(p).resets == 1
    assert h.counters(p).invalidations == 0
    h.slots[p].reset()
    h.slots[p].reset()  # nothing left to drop: not counted
    assert h.counters(p).resets == 2


@pytest.mark.claim("graph_replay")
def test_a_failed_capture_falls_back_once_per_signature_and_stays_correct():
    device = FakeDevice(fail_capture=True)
    h = Harness(device)
    state = zeros_state()
    for step in range(5):
        out = h.run(GraphSlot.PRIMARY, toy_feeds([step], step, state))
        np.testing.assert_array_equal(out["logits"],
                                      toy(toy_feeds([step], step, state))["logits"])
        state = out["state_out"]
    slot = h.slots[GraphSlot.PRIMARY]
    assert slot.status is SlotStatus.FALLBACK and "cuBLAS" in slot.failure
    assert device.captures == 1 == slot.capture_attempts  # not retried every step
    c = h.counters(GraphSlot.PRIMARY)
    assert (c.captures, c.replays, c.fallbacks) == (0, 0, 5)
    assert h.eager_calls == 5 and device.released == 1
    h.run(GraphSlot.PRIMARY, toy_feeds([1, 2], 0, zeros_state()))  # a new signature retries
    assert device.captures == 2 and c.invalidations == 1 and c.fallbacks == 6


@pytest.mark.claim("graph_replay")
def test_bad_feeds_at_first_use_raise_and_leave_the_slot_empty():
    h = Harness()

    def broken(feeds):
        raise InputError("feed has the wrong dtype", field="feeds['tokens'].dtype")

    slot = h.slots[GraphSlot.PRIMARY]
    feeds = toy_feeds([1], 0, zeros_state())
    with pytest.raises(InputError):
        slot.run(Signature.of("target", feeds), feeds, broken, lambda i: (toy(i), []))
    assert slot.status is SlotStatus.EMPTY and slot.signature is None
    assert h.device.captures == 0 and h.device.released == 1


# -- poison and sabotage -------------------------------------------------------------------------

@pytest.mark.claim("graph_replay")
def test_poison_fills_the_outputs_before_every_replay():
    h = Harness(poison=True)
    h.run(GraphSlot.PRIMARY, toy_feeds([1], 0, zeros_state()))
    h.device.events.clear()
    out = h.run(GraphSlot.PRIMARY, toy_feeds([2], 1, zeros_state()))
    assert h.device.events == ["copy"] * 3 + ["poison"] * 2 + ["launch"]
    assert np.isfinite(out["logits"]).all()  # a working replay overwrites the poison


@pytest.mark.claim("graph_replay")
def test_a_replay_that_writes_nothing_is_caught_by_the_poison():
    h = Harness(FakeDevice(broken_graphs=True), poison=True)
    h.run(GraphSlot.PRIMARY, toy_feeds([1], 0, zeros_state()))
    out = h.run(GraphSlot.PRIMARY, toy_feeds([2], 1, zeros_state()))
    assert np.isnan(out["logits"]).all()
    assert (out["state_out"] != out["state_out"]).all()


@pytest.mark.claim("graph_replay")
def test_a_replay_reading_a_stale_input_differs_from_eager():
    """Negative control: the graph keeps reading the buffer it captured while the slot
    copies the feed elsewhere; comparing with the eager forward catches it."""
    h = Harness(poison=True)
    h.run(GraphSlot.PRIMARY, toy_feeds([1], 0, zeros_state()))
    slot = h.slots[GraphSlot.PRIMARY]
    slot.inputs = dict(slot.inputs, tokens=np.empty_like(slot.inputs["tokens"]))
    feeds = toy_feeds([7], 1, zeros_state())
    out = h.run(GraphSlot.PRIMARY, feeds)
    assert np.isfinite(out["logits"]).all()  # it wrote its outputs...
    assert not np.array_equal(out["logits"], toy(feeds)["logits"])  # ...from a stale token


# -- a random program of forwards and resets ---------------------------------------------------

OPS = st.lists(st.tuples(st.sampled_from(["PRIMARY", "VERIFY", "reset PRIMARY", "reset VERIFY"]),
                         st.integers(1, 3)), min_size=1, max_size=30)


@pytest.mark.claim("graph_replay")
@given(program=OPS, fail=st.booleans())
def test_every_slot_forward_is_one_capture_replay_or_fallback_and_equals_eager(program, fail):
    h = Harness(FakeDevice(fail_capture=fail), poison=True)
    forwards = {s: 0 for s in GraphSlot}
    state = zeros_state()
    position = 0
    for op, width in program:
        if op.startswith("reset"):
            h.slots[GraphSlot[op.split()[1]]].reset()
            continue
        slot = GraphSlot[op]
        m = 1 if slot is GraphSlot.PRIMARY else width + 1
        tokens = [(position + i) % 7 for i in range(m)]
        feeds = toy_feeds(tokens, position, state)
        expected = toy(toy_feeds(tokens, position, state.copy()))
        out = h.run(slot, feeds)
        for name in expected:
            np.testing.assert_array_equal(out[name], expected[name])
        state, position = out["state_out"], position + m
        forwards[slot] += 1
    for slot in GraphSlot:
        c = h.counters(slot)
        assert c.captures + c.replays + c.fallbacks == forwards[slot]
        assert (c.captures == 0) if fail else (c.fallbacks == 0)


# -- the plan's device cache of host-resolved values -------------------------------------------

class CountingDeviceBackend(NumpyArrayBackend):
    """numpy standing in for a device: a residency other than host (the plan's residency
    check is pointed at it by ``fake_device``), adoptions counted."""

    residency = "fake:0"

    def __init__(self):
        super().__init__()
        self.adopted = 0

    def adopt(self, host_array):
        self.adopted += 1
        return np.array(host_array, order="C", copy=True)


def _ones_like_model():
    """y = x + ConstantOfShape(Shape(x)): a run-time host value feeding a device kernel;
    the same host value is also a graph output."""
    one = helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])
    nodes = [helper.make_node("Shape", ["x"], ["s"]),
             helper.make_node("ConstantOfShape", ["s"], ["ones"], value=one),
             helper.make_node("Add", ["x", "ones"], ["y"])]
    graph = helper.make_graph(
        nodes, "ones", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None),
         helper.make_tensor_value_info("ones", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.fixture
def fake_device(monkeypatch):
    monkeypatch.setattr("engines.native.plan.residency_of", lambda value: "fake:0")


def test_host_values_cross_once_per_distinct_value_on_a_device_backend(fake_device):
    be = CountingDeviceBackend()
    plan = Plan(_ones_like_model(), be)
    assert "ones" in plan.host_resolved
    base = be.adopted
    x3 = np.arange(3, dtype=np.float32)
    first = plan.run({"x": x3})
    assert be.adopted == base + 1  # "ones" for N=3, once (the output is a device copy)
    for _ in range(3):
        out = plan.run({"x": x3})
        np.testing.assert_array_equal(out["y"], x3 + 1)
    assert be.adopted == base + 1  # a fixed signature moves nothing from the host
    out["ones"][...] = 7.0  # a caller writing into an output does not touch the cache
    np.testing.assert_array_equal(plan.run({"x": x3})["y"], x3 + 1)
    assert out["ones"] is not first["ones"]
    plan.run({"x": np.zeros(5, np.float32)})
    assert be.adopted == base + 2
    assert len(plan.cached_device_values()) == 2


def test_the_host_value_cache_is_bounded_per_value(fake_device):
    be = CountingDeviceBackend()
    plan = Plan(_ones_like_model(), be)
    for n in range(1, HOST_VALUE_CACHE_PER_VALUE + 4):
        plan.run({"x": np.zeros(n, np.float32)})
    assert len(plan.cached_device_values()) == HOST_VALUE_CACHE_PER_VALUE


def test_a_host_backend_adopts_as_before():
    class HostCounting(CountingDeviceBackend):
        residency = "host"

    be = HostCounting()
    plan = Plan(_ones_like_model(), be)
    base = be.adopted
    for _ in range(3):
        plan.run({"x": np.zeros(3, np.float32)})
    assert be.adopted == base + 6 and plan.cached_device_values() == []


# -- the device feed on the host tensor ops ------------------------------------------------------

@pytest.mark.claim("tensor_ops")
def test_next_token_feed_keeps_the_argmax_as_an_int64_feed():
    ops = HostTensorOps(Ledger())
    assert ops.supports_device_feed
    logits = np.array([[0.5, 3.0, np.nan, 3.0, -1.0]], np.float32)
    token, feed = ops.next_token_feed(logits)
    assert token == 1 and token == ops.argmax_rows(logits, 1)[0]
    assert feed.dtype == np.int64 and feed.shape == (1, 1) and int(feed[0, 0]) == 1
    with pytest.raises(InputError, match="all NaN"):
        ops.next_token_feed(np.full((1, 3), np.nan, np.float32))
    with pytest.raises(InputError) as err:
        ops.next_token_feed(np.zeros((2, 3), np.float32))
    assert err.value.field == "logits2d"


@pytest.mark.claim("tensor_ops")
def test_advance_positions_continues_from_the_last_position():
    ops = HostTensorOps(Ledger())
    nxt = ops.advance_positions(np.arange(4, 9, dtype=np.int64).reshape(1, 5))
    assert nxt.dtype == np.int64 and nxt.tolist() == [[9]]
    assert ops.advance_positions(nxt, 3).tolist() == [[12]]
    with pytest.raises(InputError) as err:
        ops.advance_positions(np.zeros((1, 2), np.int32))
    assert err.value.field == "positions.dtype"
    with pytest.raises(InputError):
        ops.advance_positions(np.zeros((1, 0), np.int64))


@pytest.mark.claim("tensor_ops")
def test_a_forward_adopts_its_ids_and_positions_together_under_its_component():
    """``DecodeSession.forward`` hands its token ids and positions to ``adopt_feeds`` in one
    call keyed by its component (a device stages them in one copy), and the accept's drafts
    are the tokens feed it keeps."""
    from engines.workflow.session import DecodeSession

    calls = []

    class Engine:
        tensor_ops = HostTensorOps(Ledger())
        ledger = tensor_ops.ledger

        def run_component(self, component, feeds, phase=None):
            return {"logits": np.zeros((1, len(feeds["ids"][0]), 4), np.float32)}

    ops = Engine.tensor_ops
    adopt_feeds = ops.adopt_feeds
    ops.adopt_feeds = lambda arrays, key: calls.append(
        (key, [a.tolist() for a in arrays])) or adopt_feeds(arrays, key)
    session = DecodeSession.__new__(DecodeSession)
    session.engine, session.component = Engine(), "target"
    session.inputs, session.outputs = {"tokens": "ids", "positions": "pos"}, {"logits": "logits"}
    session._positions, session.tokens_fed = None, None
    session.state = type("S", (), {"position": 3, "feeds": lambda self: {},
                                   "absorb": lambda self, out, m: None})()
    session.forward([7, 8, 9], "verify")
    assert calls == [("target", [[[7, 8, 9]], [[3, 4, 5]]])]
    assert session.tokens_fed.tolist() == [[7, 8, 9]]


@pytest.mark.claim("tensor_ops")
def test_device_feed_takes_arrays_only():
    ops = HostTensorOps(Ledger())
    with pytest.raises(InputError) as err:
        ops.next_token_feed([[1.0, 2.0]])
    assert err.value.field == "logits2d"


# -- the interpreter, the routing and the slots on real static packages ---------------------------

class SlottedHostEngine(NativeHostEngine):
    """native-host routed through GraphSlots over the fake device, wired as native-cuda
    wires them: a decode or verify forward replays, its outputs are the static buffers."""

    def __init__(self, package, device=None, poison=True):
        super().__init__(package)
        self.device = device or FakeDevice()
        self.slots = GraphSlots(self.device, lambda: self.ledger,
                                enabled=graphs_default(package.spec), poison_outputs=poison)

    def run_component(self, component, feeds, phase=None):
        plan = self._plans[component]
        return self.slots.run(component, feeds, phase, plan.run,
                              lambda inputs: (plan.run(inputs), []),
                              forward_positions(self.package.spec.components[component], feeds))


@pytest.mark.claim("graph_replay")
@pytest.mark.parametrize("package_name", ["tiny_llama_static", "tiny_llama_pair_static"])
def test_greedy_through_the_slots_captures_once_and_equals_native_host(packages, engine_cache,
                                                                       package_name):
    from engines.workflow import greedy_decode

    package = packages[package_name]
    plain = engine_cache("native-host", package)
    engine = SlottedHostEngine(package)
    prompt = list(package.spec.prompts[1])
    want = greedy_decode(plain, prompt, 12)
    result = greedy_decode(engine, prompt, 12)
    assert result.tokens == want.tokens
    steps = result.ledger.forwards["decode"]
    c = result.ledger.slot("PRIMARY")
    assert (c.captures, c.replays, c.fallbacks, c.invalidations) == (1, steps - 1, 0, 0)
    assert engine.device.launches == steps - 1
    again = greedy_decode(engine, prompt, 12)  # the graph outlives the session
    assert again.tokens == want.tokens
    assert again.ledger.slot("PRIMARY").captures == 0
    assert again.ledger.slot("PRIMARY").replays == steps


@pytest.mark.claim("graph_replay", "spec_equals_greedy")
def test_speculative_through_the_slots_equals_greedy(packages, engine_cache):
    """VERIFY replays feed static outputs back through truncation and rollback."""
    from engines.workflow import greedy_decode
    from engines.workflow.speculative import speculative_decode

    package = packages["tiny_llama_pair_static"]
    prompt = list(package.spec.prompts[0])
    want = greedy_decode(engine_cache("native-host", package), prompt, 12).tokens
    engine = SlottedHostEngine(package)
    result = speculative_decode(engine, prompt, 12, 2)
    assert result.tokens == want
    led = result.ledger
    verify = led.slot("VERIFY")
    assert verify.captures + verify.replays + verify.fallbacks == led.forwards["verify"]
    assert verify.replays >= 1 and verify.fallbacks == 0
    # The draft model's single-position steps replay in PRIMARY; its multi-position catch-up
    # forwards run eagerly instead of invalidating that graph.
    primary = led.slot("PRIMARY")
    assert primary.replays >= 1 and primary.fallbacks == 0
    assert primary.invalidations <= 1  # at most once, for a last plain decode of the target


def test_the_interpreter_tells_every_forward_its_phase(packages):
    """``phase`` is part of ``Engine.run_component``'s declared signature: the interpreter
    always passes it, by keyword, to every engine (no signature probing)."""
    from engines.workflow import greedy_decode
    from engines.workflow.speculative import speculative_decode

    seen = []

    class PhaseLog(NativeHostEngine):
        name = "phase-log"

        def run_component(self, component, feeds, phase=None):
            seen.append((component, phase))
            return super().run_component(component, feeds, phase=phase)

    package = packages["tiny_llama_pair"]
    engine = PhaseLog(package)
    greedy_decode(engine, list(package.spec.prompts[0]), 4)
    assert [p for _, p in seen] == ["prefill", "decode", "decode", "decode"]
    seen.clear()
    speculative_decode(engine, list(package.spec.prompts[0]), 6, 2)
    phases = {p for _, p in seen}
    assert None not in phases and {"prefill", "propose", "verify"} <= phases


@pytest.mark.claim("token_identity", "tensor_ops")
def test_greedy_feeds_each_next_token_and_position_from_the_tensor_ops(packages, engine_cache,
                                                                      monkeypatch):
    """One interpreter for every engine: on the host too, after the prompt nothing is
    adopted; the id and the position come from next_token_feed and advance_positions."""
    from engines.oracle import oracle_decode
    from engines.workflow import greedy_decode

    package = packages["tiny_llama"]
    engine = engine_cache("native-host", package)
    calls = {"adopt": 0, "advance": 0, "feed": 0}

    def counted(name, real):
        def wrapper(self, *args, **kwargs):
            calls[name] += 1
            return real(self, *args, **kwargs)
        return wrapper

    # the crossing primitive under adopt and adopt_feeds alike
    monkeypatch.setattr(HostTensorOps, "_adopt", counted("adopt", HostTensorOps._adopt))
    monkeypatch.setattr(HostTensorOps, "advance_positions",
                        counted("advance", HostTensorOps.advance_positions))
    monkeypatch.setattr(HostTensorOps, "next_token_feed",
                        counted("feed", HostTensorOps.next_token_feed))
    prompt = list(package.spec.prompts[0])
    result = greedy_decode(engine, prompt, 6)
    assert result.tokens == oracle_decode(package, prompt, 6).tokens
    assert calls == {"adopt": 2, "advance": 5, "feed": 6}  # prompt ids + positions only
