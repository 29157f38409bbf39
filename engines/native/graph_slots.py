"""CUDA graph slots: PRIMARY (M=1 decode) and VERIFY (M=W+1 verification), claim 6.
(Prefills replay from graphs of their own, one per length: ``prefill_graphs.py``.)

A slot is one CUDA-graph lifecycle on the engine's stream. The first forward of a
*signature* (the component plus every feed's name, shape and dtype) runs eagerly (its
result is that step's answer, and it compiles every kernel and caches every host-resolved
value on the device), then the same forward is captured into a graph that reads the slot's
static input buffers and writes its static output buffers, all allocated from the slot's
own memory pool. Every later forward with that signature copies its feeds into the static
inputs (device to device, on the stream), launches the graph and returns the static
outputs. A new signature invalidates the graph and captures again; ``reset()`` drops it; a
capture that fails (an op that cannot be captured) leaves the slot in *fallback*: that
signature runs eagerly from then on, still correct, and is not retried every step.

Aliasing: the graph's outputs are always buffers allocated during the capture (an output
that would be a constant, a static input or anything else is copied inside the graph), so
no static output is ever a static input. The caller may feed a static output straight back
(a state cell): the copy into the static input is queued on the stream before the launch
that overwrites the output, so it reads the value the caller saw. The caller must consume
the outputs before the next forward in the same slot; the two slots never share buffers.

The counters live in the session ledger (``ledger.slot(name)``): ``captures`` (capture
steps that succeeded), ``replays``, ``fallbacks`` (forwards that ran eagerly because the
signature's capture failed, the failing one included), ``invalidations`` (graphs dropped
for a new signature) and ``resets``. Every slot forward is exactly one capture, replay or
fallback.

The CUDA side (``CupyGraphDevice``) is injected, so the lifecycle is tested on the host
with a fake device (``suites/test_graph_slots_host.py``).
"""
from __future__ import annotations

import enum
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from engines.cuda_support import import_cupy
from engines.device_memory import CountingAllocator, MemoryTally
from engines.ledger import GraphSlotCounters
from engines.native.batched_copy import BatchedCopy


class GraphSlot(enum.Enum):
    PRIMARY = "PRIMARY"  # M=1 decode
    VERIFY = "VERIFY"    # M=W+1 verification


SLOT_FOR_PHASE: dict[str, GraphSlot] = {"decode": GraphSlot.PRIMARY,
                                        "propose": GraphSlot.PRIMARY,
                                        "verify": GraphSlot.VERIFY}


def slot_for_phase(phase: str | None, positions: int | None = None) -> GraphSlot | None:
    """The slot a forward of ``phase`` replays in; None (eager) for every other phase.

    PRIMARY is the M=1 slot: a decode step, or a proposer step (in speculative decoding the
    proposer's single-position forwards are the M=1 work). A multi-position forward in those
    phases (a draft model catching up on committed tokens) runs eagerly rather than
    invalidating the captured M=1 graph every round."""
    slot = SLOT_FOR_PHASE.get(phase) if phase is not None else None
    if slot is GraphSlot.PRIMARY and positions not in (None, 1):
        return None
    return slot


def forward_positions(component_spec, feeds: Mapping[str, Any]) -> int | None:
    """M, the positions a forward covers, read from the shape of its tokens, positions or
    embeddings feed (axis 1 of the component contract's [1, M, ...] inputs)."""
    for role in ("tokens", "positions", "embeddings"):
        name = component_spec.inputs.get(role)
        if name is not None and name in feeds:
            return int(feeds[name].shape[1])
    return None


def graphs_default(spec, capacity_cells=frozenset()) -> bool:
    """Whether every forward keeps one shape per phase, so each slot captures once: every kv
    cell is ``static``, or ``append`` but run as a capacity buffer by the engine
    (``capacity_cells``: ``engines/native/capacity_cache.py``), and no proposer borrows an
    ``append`` cell (its input would grow every step). native-cuda turns graphs on by default
    where this holds without capacity cells (static packages); ``graphs=True`` adds them."""
    kv = {name: cell for name, cell in spec.state.items() if cell.kind == "kv"}
    if not all(getattr(cell, "update", None) == "static" or name in capacity_cells
               for name, cell in kv.items()):
        return False
    speculative = spec.decoding.speculative
    borrowed = speculative.borrows.values() if speculative is not None else ()
    return not any(getattr(kv.get(cell), "update", None) == "append" for cell in borrowed)


@dataclass(frozen=True)
class Signature:
    """What a captured graph is valid for: the component and each feed's shape and dtype."""
    component: str
    feeds: tuple[tuple[str, tuple[int, ...], str], ...]

    @classmethod
    def of(cls, component: str, feeds: Mapping[str, Any]) -> Signature:
        # every decode step computes this over every feed (a kv cell each): kept lean
        return cls(component, tuple(sorted(
            (name, tuple(v.shape), np.dtype(v.dtype).str) for name, v in feeds.items())))


class SlotStatus(enum.Enum):
    EMPTY = "empty"        # no signature
    CAPTURED = "captured"  # a graph replays the signature
    FALLBACK = "fallback"  # the signature's capture failed: it runs eagerly


class CaptureError(RuntimeError):
    """A capture that cannot be used (the slot falls back)."""


Outputs = dict[str, Any]
EagerRun = Callable[[Mapping[str, Any]], Outputs]
# (static inputs) -> (outputs, values the graph reads that the slot must keep alive)
CaptureBody = Callable[[Mapping[str, Any]], tuple[Outputs, list[Any]]]


class SlotState:
    """One slot's lifecycle, buffers, pool and graph (see the module doc)."""

    def __init__(self, slot: GraphSlot | str, device: Any,
                 counters: Callable[[], GraphSlotCounters], *, poison_outputs: bool = False):
        self.slot = slot
        self.device = device
        self._counters = counters
        self.poison_outputs = poison_outputs
        self.status = SlotStatus.EMPTY
        self.signature: Signature | None = None
        self.failure: str | None = None  # why the last capture failed
        self.capture_attempts = 0
        self.graph: Any = None
        self.inputs: dict[str, Any] = {}
        self.outputs: dict[str, Any] = {}
        self.allocator: Any = None
        self._keep: list[Any] = []
        # feeds that were a slot's static output buffers (a state cell fed back from this
        # slot or from the other one), by (name, id), with the device's copy entry for each
        # into this slot's static input (None where the device has none): alive while their
        # slot is (``forget`` drops a slot's when it drops them), so identity stands for
        # shape, dtype and pointers, and a replay whose cells come from either slot (a
        # speculative decode alternates them) computes no copy argument and reads no array
        # attribute again
        self._fed: dict[tuple[str, int], tuple[Any, Any]] = {}
        self._own: set[int] = set()  # ids of the output buffers
        # ids of every slot's output buffers, this one's included (``GraphSlots`` shares
        # one set among its slots; a slot alone keeps its own)
        self.static_outputs: set[int] = self._own
        # called with this slot's output ids when it drops them (``GraphSlots``: the other
        # slots forget their entries for them)
        self.on_drop: Callable[[set[int]], None] | None = None
        # every pool this slot made, while any allocation from it lives (cells may still
        # hold the outputs of a dropped graph)
        self._allocators: weakref.WeakSet = weakref.WeakSet()

    @property
    def counters(self) -> GraphSlotCounters:
        return self._counters()

    # -- the forward -------------------------------------------------------------------------
    def holds(self, component: str, feeds: Mapping[str, Any]) -> bool:
        """Whether ``feeds`` has the captured graph's signature, decided without building
        one (a decode step asks with a feed per kv cell): the same names, each feed a slot's
        output buffer a replay of this graph was fed under that name, or a device array of
        its static input's shape and dtype (the static inputs were made from the
        signature's feeds)."""
        if self.status is not SlotStatus.CAPTURED or self.signature.component != component:
            return False
        inputs, fed = self.inputs, self._fed
        if len(feeds) != len(inputs):
            return False
        for name, value in feeds.items():
            if (name, id(value)) in fed:  # held, so the id is that array's
                continue
            buffer = inputs.get(name)
            if (buffer is None or not self.device.accepts(value)
                    or value.shape != buffer.shape or value.dtype != buffer.dtype):
                return False
        return True

    def run(self, signature: Signature, feeds: Mapping[str, Any], eager: EagerRun,
            capture_body: CaptureBody) -> Outputs:
        """One forward through the slot: capture, replay or fallback."""
        if signature != self.signature:
            if self.status is not SlotStatus.EMPTY:
                self.counters.invalidations += 1
                self._drop()
            return self._first_use(signature, feeds, eager, capture_body)
        if self.status is SlotStatus.FALLBACK:
            self.counters.fallbacks += 1
            return eager(feeds)
        return self.replay(feeds)

    def _first_use(self, signature: Signature, feeds: Mapping[str, Any], eager: EagerRun,
                   capture_body: CaptureBody) -> Outputs:
        allocator = self.device.new_allocator()
        self._allocators.add(allocator)
        try:
            inputs = {name: self.device.empty_like(v, allocator) for name, v in feeds.items()}
            for name, buffer in inputs.items():
                self.device.copy(buffer, feeds[name])
            # The eager run reads the very buffers the capture will read (same strides, so
            # the same kernels, compiled now, not during the capture); bad feeds raise here
            # and the slot stays empty.
            result = eager(inputs)
        except BaseException:
            self.device.release(allocator)
            raise
        self.signature = signature
        self.capture_attempts += 1
        try:
            graph, outputs, keep = self.device.capture(lambda: capture_body(inputs), allocator)
        except Exception as exc:  # noqa: BLE001 - any failure to capture is a fallback
            self.status = SlotStatus.FALLBACK
            self.failure = f"{type(exc).__name__}: {exc}"
            self.counters.fallbacks += 1
            self.device.release(allocator)
            return result
        self.graph, self.inputs, self.outputs = graph, inputs, dict(outputs)
        self._own.update(id(buffer) for buffer in self.outputs.values())  # empty till now
        self.static_outputs.update(self._own)
        self.allocator, self._keep = allocator, list(keep)
        self.status = SlotStatus.CAPTURED
        self.failure = None
        self.counters.captures += 1
        return result

    def replay(self, feeds: Mapping[str, Any]) -> Outputs:
        """Copy ``feeds`` into the static inputs and launch the graph (the signature is the
        caller's to check: ``run`` or ``holds``)."""
        static, kept = self.static_outputs, self._fed
        entry_of = getattr(self.device, "copy_entry", None)
        copies = []
        for name, buffer in self.inputs.items():
            source = feeds[name]
            if source is buffer:
                continue  # a feed that is the static buffer is already in place
            key = (name, id(source))
            hit = kept.get(key)
            if hit is not None:
                entry = hit[1]
            else:
                entry = entry_of(buffer, source) if entry_of is not None else None
                if key[1] in static:  # a state cell fed back: alive while its slot is
                    kept[key] = (source, entry)
            copies.append((buffer, source, entry))
        if entry_of is not None:  # one launch for all of them (a decode feeds every kv cell)
            self.device.copy_many(copies)
        else:
            for buffer, source, _ in copies:
                self.device.copy(buffer, source)
        if self.poison_outputs:
            seen: set[int] = set()
            for buffer in self.outputs.values():
                if id(buffer) not in seen:
                    seen.add(id(buffer))
                    self.device.poison(buffer)
        self.device.launch(self.graph)
        self.counters.replays += 1
        return dict(self.outputs)

    def forget(self, ids: set[int]) -> None:
        """Drop the copy entries kept for the buffers ``ids`` (another slot's outputs that
        slot has just dropped), so nothing here keeps them allocated."""
        self._fed = {key: hit for key, hit in self._fed.items() if key[1] not in ids}

    # -- lifecycle ---------------------------------------------------------------------------
    def reset(self) -> None:
        """Drop the graph and its buffers (counted when there was something to drop); the
        next forward captures again. The other slot is untouched."""
        if self.status is not SlotStatus.EMPTY:
            self.counters.resets += 1
        self._drop()

    def close(self) -> None:
        """Drop everything without counting a reset (the engine's close)."""
        self._drop()

    def _drop(self) -> None:
        if self.status is SlotStatus.CAPTURED:
            self.device.synchronize()  # no queued replay may still read these buffers
        self.graph = None
        self.inputs, self.outputs, self._keep = {}, {}, []
        dropped = set(self._own)
        self.static_outputs.difference_update(dropped)
        self._own.clear()
        self._fed = {}
        if dropped and self.on_drop is not None:
            self.on_drop(dropped)
        allocator, self.allocator = self.allocator, None
        if allocator is not None:
            self.device.release(allocator)
        self.status = SlotStatus.EMPTY
        self.signature = None
        self.failure = None

    def live(self) -> tuple[int, int]:
        """(allocations, bytes) still live from this slot's pools, dropped graphs' included."""
        count = size = 0
        for allocator in list(self._allocators):
            snap = allocator.snapshot()
            count += snap["live_allocations"]
            size += snap["live_bytes"]
        return count, size

    def describe(self) -> dict[str, Any]:
        return {"slot": getattr(self.slot, "value", self.slot), "status": self.status.value,
                "component": self.signature.component if self.signature else None,
                "capture_attempts": self.capture_attempts, "failure": self.failure}


class GraphSlots:
    """An engine's two slots on one device (its stream), and the routing of a forward:
    ``decode`` to PRIMARY, ``verify`` to VERIFY, ``prefill`` to ``prefill`` where one is
    given (``PrefillGraphs``: a graph per prompt length seen twice), anything else (or
    graphs off, or a feed the device cannot copy) eagerly."""

    def __init__(self, device: Any, ledger: Callable[[], Any], *, enabled: bool,
                 poison_outputs: bool = False, prefill: Any = None):
        self.device = device
        self.enabled = bool(enabled)
        self.states = {slot: SlotState(slot, device,
                                       lambda name=slot.value: ledger().slot(name),
                                       poison_outputs=poison_outputs)
                       for slot in GraphSlot}
        # a state cell may come from either slot (a speculative decode alternates them):
        # each slot knows every slot's output buffers, and forgets another's when it drops
        shared: set[int] = set()
        for state in self.states.values():
            state.static_outputs = shared
            state.on_drop = lambda ids, me=state: self._dropped(me, ids)
        self.prefill = prefill
        # whether the last forward was a replay: its outputs are then a slot's own buffers,
        # the same objects every replay until the slot captures again or is reset
        self.replayed = False

    def _dropped(self, slot: SlotState, ids: set[int]) -> None:
        for state in self.states.values():
            if state is not slot:
                state.forget(ids)

    def __getitem__(self, slot: GraphSlot | str) -> SlotState:
        return self.states[slot if isinstance(slot, GraphSlot) else GraphSlot(slot)]

    def values(self):
        return self.states.values()

    def run(self, component: str, feeds: Mapping[str, Any], phase: str | None,
            eager: EagerRun, capture_body: CaptureBody, positions: int | None = None) -> Outputs:
        self.replayed = False
        if phase == "prefill" and self.enabled and self.prefill is not None:
            out, self.replayed = self.prefill.run(component, feeds, positions, eager,
                                                  capture_body)
            return out
        slot = slot_for_phase(phase, positions) if self.enabled else None
        if slot is None:
            return eager(feeds)
        state = self.states[slot]
        if state.holds(component, feeds):  # a replay, known without building a signature
            self.replayed = True
            return state.replay(feeds)
        if not all(self.device.accepts(v) for v in feeds.values()):
            return eager(feeds)
        replays = state.counters.replays
        out = state.run(Signature.of(component, feeds), feeds, eager, capture_body)
        self.replayed = state.counters.replays != replays
        return out

    def reset(self, slot: GraphSlot | str | None = None) -> None:
        """Reset one slot, or ``"PREFILL"`` (every prefill graph), or all of them; the
        others keep their graphs."""
        if self.prefill is not None and slot in (None, "PREFILL"):
            self.prefill.reset()
            if slot is not None:
                return
        for state in ([self[slot]] if slot is not None else self.states.values()):
            state.reset()

    def close(self) -> None:
        for state in self.states.values():
            state.close()
        if self.prefill is not None:
            self.prefill.close()

    def live(self) -> tuple[int, int]:
        """(allocations, bytes) live from every pool of the slots and the prefill graphs:
        the device's tally where it keeps one and makes the prefill graphs' pools too
        (every pool it makes adds to it), else the sum over the pools."""
        tally = getattr(self.device, "tally", None)
        if tally is not None and getattr(self.prefill, "device", self.device) is self.device:
            return tally.counts()
        pairs = [state.live() for state in self.states.values()]
        if self.prefill is not None:
            pairs.append(self.prefill.live())
        return sum(p[0] for p in pairs), sum(p[1] for p in pairs)


# dtypes whose bits are moved as another dtype of the same width (CuPy may lack kernels)
_BITS_AS = {"float16": np.uint16, "bfloat16": np.uint16, "bool": np.uint8}
# NaN bit patterns for poisoning floating buffers, by dtype name
_NAN_BITS = {"float16": (np.uint16, 0x7E00), "bfloat16": (np.uint16, 0x7FC0),
             "float32": (np.uint32, 0x7FC00000), "float64": (np.uint64, 0x7FF8000000000000)}


class CupyGraphDevice:
    """The CUDA half of a slot: buffers, copies, poison, capture and launch, every one on
    the engine's stream. Pools are ``CountingAllocator``s over private ``MemoryPool``s."""

    def __init__(self, stream: Any, device_id: int = 0):
        self.cp = import_cupy()
        self.stream = stream
        self.device_id = int(device_id)
        self._device = self.cp.cuda.Device(self.device_id)
        self.tally = MemoryTally()  # every pool new_allocator makes adds to it

    def accepts(self, value: Any) -> bool:
        """Only non-empty arrays on this device can be copied into a static buffer."""
        # ``data.device_id``, not ``device.id``: the latter builds a Device per call
        return (isinstance(value, self.cp.ndarray) and value.size > 0
                and value.data.device_id == self.device_id)

    def new_allocator(self):
        with self._device:
            return CountingAllocator(pool=self.cp.cuda.MemoryPool(), device_id=self.device_id,
                                     tally=self.tally)

    def empty_like(self, value: Any, allocator: Any):
        with self._device, self.stream, allocator.scope():
            return self.cp.empty(tuple(value.shape), dtype=value.dtype)

    def _bits(self, x):
        as_ = _BITS_AS.get(x.dtype.name)
        return x.view(as_) if as_ is not None else x

    def copy(self, dst: Any, src: Any) -> None:
        """``dst[...] = src``, device to device, queued on the stream."""
        cp = self.cp
        with self._device, self.stream:
            if src.flags.c_contiguous and dst.flags.c_contiguous:
                cp.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes,
                                            cp.cuda.runtime.memcpyDeviceToDevice,
                                            self.stream.ptr)
            else:
                self._bits(dst)[...] = self._bits(src)

    def copy_entry(self, dst: Any, src: Any) -> tuple[int, int, int] | None:
        """``(dst pointer, src pointer, nbytes)`` where one batched launch can copy ``src``
        into ``dst`` (both C-contiguous, the same size), else None (``copy`` does it)."""
        if src.flags.c_contiguous and dst.flags.c_contiguous and src.nbytes == dst.nbytes:
            return int(dst.data.ptr), int(src.data.ptr), int(src.nbytes)
        return None

    def copy_many(self, copies: list[tuple[Any, Any, tuple[int, int, int] | None]]) -> None:
        """Every ``dst[...] = src`` of ``copies`` (``(dst, src, copy_entry(dst, src))``),
        queued on the stream: those with an entry in one kernel launch (``batched_copy``:
        its arguments are cached while the pointers stay the same), any other by ``copy``."""
        entries = []
        for dst, src, entry in copies:
            if entry is None:
                self.copy(dst, src)
            else:
                entries.append(entry)
        if entries:
            if getattr(self, "_batched", None) is None:
                self._batched = BatchedCopy(self.device_id)
            self._batched.copy(entries, self.stream)

    def poison(self, buffer: Any) -> None:
        """NaN in every element of a floating buffer, the most negative value in an integer
        one, True in a bool one: a replay that does not write it cannot pass for one that
        did."""
        with self._device, self.stream:
            name = buffer.dtype.name
            if name in _NAN_BITS:
                as_, bits = _NAN_BITS[name]
                buffer.view(as_).fill(as_(bits))
            elif buffer.dtype.kind in "iu":
                buffer.fill(np.iinfo(buffer.dtype).min)
            elif buffer.dtype.kind == "b":
                buffer.view(np.uint8).fill(1)
            else:
                raise CaptureError(f"no poison for dtype {name}")

    def capture(self, body: Callable[[], tuple[Outputs, list[Any]]], allocator: Any):
        """Capture ``body`` on the stream with every allocation from ``allocator``; returns
        (graph, outputs, keep). Outputs not allocated during the capture are copied inside
        the graph, so every output is a buffer of this slot's pool and none is an input."""
        cp = self.cp
        ranges: list[tuple[int, int]] = []

        def malloc(nbytes: int):
            pointer = allocator.malloc(nbytes)
            ranges.append((int(pointer.ptr), int(nbytes)))
            return pointer

        def owned(value: Any) -> bool:
            ptr = int(value.data.ptr)
            return value.size > 0 and any(p <= ptr < p + n for p, n in ranges)

        with self._device, self.stream, cp.cuda.using_allocator(malloc):
            self.stream.begin_capture()
            try:
                outputs, keep = body()
                fixed = {}
                for name, value in outputs.items():
                    if not isinstance(value, cp.ndarray):
                        raise CaptureError(f"output {name!r} is a {type(value).__name__}, "
                                           "not a device array")
                    fixed[name] = (value if owned(value) else
                                   self._bits(value).copy(order="C").view(value.dtype))
            except BaseException:
                self._abort()
                raise
            graph = self.stream.end_capture()  # raises if the capture was invalidated
        return graph, fixed, keep

    def _abort(self) -> None:
        try:
            self.stream.end_capture()
        except Exception:  # noqa: BLE001 - an invalidated capture ends with an error
            pass

    def launch(self, graph: Any) -> None:
        with self._device:
            graph.launch(self.stream)

    def synchronize(self) -> None:
        self.stream.synchronize()

    def release(self, allocator: Any) -> None:
        """Give the pool's free blocks back to the driver (blocks still held by live
        arrays, a cell holding a dropped graph's output, stay until they are released)."""
        with self._device:
            allocator.pool.free_all_blocks()
