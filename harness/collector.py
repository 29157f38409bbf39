"""Python's garbage collector around a bench's timed decodes (``harness/bench.py``).

A full collection scans every object the collector tracks: with a bench's packages, torch and
transformers loaded, about 200,000 objects and 62 ms on a 2-core host, charged to whichever
timed decode allocates past the collector's threshold. A speculative round allocates more than
a greedy step, so it runs into more of them. Before each timed decode the heap is collected
and what survives is frozen (``gc.freeze``): a collection inside the decode then scans only
what came after. Every collection inside a timed decode is still counted with its time
(``gc.callbacks``), so a row says what the collector took from it.
"""
from __future__ import annotations

import gc
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator


@dataclass
class CollectorTime:
    """Collections that ran inside timed decodes, and their summed wall seconds."""
    collections: int = 0
    seconds: float = 0.0


@contextmanager
def collector_watched(spent: CollectorTime) -> Iterator[CollectorTime]:
    """Collect and freeze the heap, then add every collection run inside the block to
    ``spent``."""
    gc.collect()
    gc.freeze()
    started: list[float] = []

    def watch(phase: str, info: dict) -> None:
        if phase == "start":
            started.append(time.perf_counter())
        elif started:
            spent.seconds += time.perf_counter() - started.pop()
            spent.collections += 1

    gc.callbacks.append(watch)
    try:
        yield spent
    finally:
        gc.callbacks.remove(watch)


def thaw() -> None:
    """Give the frozen heap back to the collector (after a bench)."""
    gc.unfreeze()
