"""Prefills replayed as captured graphs, one per signature seen twice (issue 37).

An eager prefill on native-cuda is host-bound: on the H200 a 120-token SmolLM2 prefill
returned after 9-18 ms of Python (403 plan steps, 272 launches) while its kernels took at
most 4.45 ms; the same prefill captured and replayed took 4.4-4.7 ms, bit for bit the eager
logits (docs/evidence/2026-12-04-h200-kernels/). A prompt length that comes back (a bench's
repeats, a judge re-running its prompts, a server's templated requests) can replay.

Each signature (the component and every feed's shape and dtype: for a prefill, its length)
gets a ``SlotState`` of its own, named ``PREFILL`` in the ledger, with the two slots'
lifecycle: static inputs and outputs in the graph's own pool, capture after an eager run,
fallback when a capture fails. What differs is when a graph is made and how many stay:

- the first prefill of a signature runs eagerly and captures nothing (a prompt length seen
  once would pay a capture, about an eager forward more, for nothing); the second runs
  eagerly and captures; every later one replays;
- at most ``KEEP`` graphs stay, the least recently used dropped first, and fewer while
  their pools together hold more than the budget (``budget_for``: 4 GiB, or a sixteenth of
  the device; a graph's static kv inputs and outputs are each a whole cache: about 100 MB
  for SmolLM2 at 2,048 slots);
- a prefill of more than ``MAX_ROWS`` positions always runs eagerly: its kernels' time
  outgrows the host's, so there is little to win and a large pool to hold.

The outputs of a replay are the graph's static buffers, as a slot's are: the caller consumes
them (the decode state copies them into the next forward's inputs) before the next prefill
of the same length.
"""
from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

from engines.ledger import GraphSlotCounters
from engines.native.graph_slots import (CaptureBody, EagerRun, Outputs, Signature, SlotState,
                                        SlotStatus)

NAME = "PREFILL"
# a bench cycles ten prompt lengths through two loops (the step memos thrashed at eight
# signatures a step: docs/PERFORMANCE.md, commit 08eb71e)
KEEP = 32
BUDGET_BYTES = 4 << 30  # and at most a sixteenth of the device's memory (``budget_for``)
MAX_ROWS = 512
_SEEN_KEPT = 256  # signatures seen once, remembered for their second sighting


def budget_for(total_bytes: int) -> int:
    """The pools' byte budget on a device of ``total_bytes``: ``BUDGET_BYTES``, or a
    sixteenth of the device where that is less (a 24 GB card keeps 1.5 GB of graphs)."""
    return min(BUDGET_BYTES, int(total_bytes) // 16)


class PrefillGraphs:
    """Captured prefills by signature, on one device (see the module doc)."""

    def __init__(self, device: Any, ledger: Callable[[], Any], *,
                 poison_outputs: bool = False, keep: int = KEEP,
                 budget_bytes: int = BUDGET_BYTES, max_rows: int = MAX_ROWS):
        self.device = device
        self._counters: Callable[[], GraphSlotCounters] = lambda: ledger().slot(NAME)
        self.poison_outputs = poison_outputs
        self.keep, self.budget_bytes, self.max_rows = keep, budget_bytes, max_rows
        self.graphs: OrderedDict[Signature, SlotState] = OrderedDict()
        self._seen: OrderedDict[Signature, None] = OrderedDict()
        self.dropped: list[SlotState] = []  # evicted states: their outputs may still live

    def run(self, component: str, feeds: Mapping[str, Any], positions: int | None,
            eager: EagerRun, capture_body: CaptureBody) -> tuple[Outputs, bool]:
        """A prefill's outputs, and whether they came from a replay."""
        if positions is None or positions > self.max_rows \
                or not all(self.device.accepts(v) for v in feeds.values()):
            return eager(feeds), False
        signature = Signature.of(component, feeds)
        state = self.graphs.get(signature)
        if state is None:
            if signature not in self._seen:
                self._seen[signature] = None
                if len(self._seen) > _SEEN_KEPT:
                    self._seen.popitem(last=False)
                return eager(feeds), False
            del self._seen[signature]
            state = SlotState(NAME, self.device, self._counters,
                              poison_outputs=self.poison_outputs)
            out = state.run(signature, feeds, eager, capture_body)  # eager, then the capture
            self.graphs[signature] = state
            self._evict(keep=signature)
            return out, False
        self.graphs.move_to_end(signature)
        if state.status is SlotStatus.CAPTURED:
            return state.replay(feeds), True
        return state.run(signature, feeds, eager, capture_body), False  # a fallback

    def _evict(self, keep: Signature) -> None:
        """Least recently used first, never ``keep``, down to ``self.keep`` graphs and
        ``self.budget_bytes`` of pool."""
        while len(self.graphs) > 1 and (len(self.graphs) > self.keep
                                        or self._held() > self.budget_bytes):
            oldest = next(iter(self.graphs))
            if oldest == keep:
                break
            state = self.graphs.pop(oldest)
            state.close()
            self._counters().invalidations += 1
            self.dropped.append(state)
        self.dropped = [s for s in self.dropped if s.live()[0]]

    def _held(self) -> int:
        return sum(state.live()[1] for state in self.graphs.values())

    def reset(self) -> None:
        """Drop every graph (counted as resets) and forget the signatures seen."""
        for state in self.graphs.values():
            state.reset()
            self.dropped.append(state)
        self.graphs.clear()
        self._seen.clear()
        self.dropped = [s for s in self.dropped if s.live()[0]]

    def close(self) -> None:
        for state in self.graphs.values():
            state.close()
        self.graphs.clear()
        self._seen.clear()
        self.dropped = []

    def live(self) -> tuple[int, int]:
        """(allocations, bytes) still live from every prefill graph's pool, evicted ones'
        included while a cell holds their outputs."""
        count = size = 0
        for state in [*self.graphs.values(), *self.dropped]:
            c, s = state.live()
            count += c
            size += s
        return count, size
