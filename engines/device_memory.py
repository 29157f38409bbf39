"""A counting allocator for the engine's own device allocations (claim 5, flat memory).

``CountingAllocator`` serves CuPy allocations from a private ``cupy.cuda.MemoryPool`` and
counts live allocations and bytes exactly. Each block the pool hands out is wrapped in an
``UnownedMemory`` whose owner is a small ``_Lease`` object: every CuPy view, slice or
``MemoryPointer`` derived from the allocation keeps that ``UnownedMemory`` (and so the
lease) alive, and when the last one goes the lease's finalizer decrements the counts and
drops the pooled block back to the pool. A finalizer on the returned ``MemoryPointer`` would
be wrong: slices make new pointers while the memory is still in use.

Scope it to the engine: ``with allocator.scope():`` (CuPy's thread-local
``using_allocator``) or ``install()`` / ``uninstall()`` (process-wide ``set_allocator``,
restoring the previous allocator). ``driver_free_bytes()`` reads the driver's free memory
(``cudaMemGetInfo``) for the looser half of the claim.

The CuPy pieces (pool, memory classes, the allocator switches) are injectable, so the
counting logic is tested on the host with fakes.
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

from engines.cuda_support import import_cupy
from engines.ledger import Ledger


class _Lease:
    """Owner of one pooled block; its death is the allocation's release (``__del__``, not a
    ``weakref.finalize``: an eager 512-token prefill allocates about 500 times, and a
    finalizer's registration cost as much as the pool's own malloc)."""
    __slots__ = ("pooled", "size", "owner")

    def __init__(self, pooled: Any, size: int, owner: CountingAllocator):
        self.pooled = pooled
        self.size = size
        self.owner = owner

    def __del__(self) -> None:
        self.owner._release(self.size)


class MemoryTally:
    """Live allocations and bytes summed over many ``CountingAllocator``s (a device's graph
    pools, one per capture): read in constant time on every forward, where a sum over the
    pools took a snapshot of each (about 0.1 ms a forward with a few prefill graphs, on the
    host path of every speculative round)."""
    __slots__ = ("_lock", "live_allocations", "live_bytes")

    def __init__(self):
        self._lock = threading.Lock()
        self.live_allocations = 0
        self.live_bytes = 0

    def add(self, count: int, size: int) -> None:
        with self._lock:
            self.live_allocations += count
            self.live_bytes += size

    def counts(self) -> tuple[int, int]:
        """(live allocations, live bytes) of every allocator that adds to this tally."""
        with self._lock:
            return self.live_allocations, self.live_bytes


class CountingAllocator:
    """Counts the live allocations and bytes served from a private pool (and adds them to
    ``tally`` where one is given)."""

    def __init__(self, pool: Any = None, *, memory: Any = None, device_id: int = 0,
                 cuda: Any = None, tally: MemoryTally | None = None):
        if pool is None or memory is None or cuda is None:
            cp = import_cupy()
            pool = pool if pool is not None else cp.cuda.MemoryPool()
            memory = memory if memory is not None else cp.cuda.memory
            cuda = cuda if cuda is not None else cp.cuda
        self.pool = pool
        self._memory = memory  # provides UnownedMemory and MemoryPointer
        self._cuda = cuda      # provides set_allocator, get_allocator, using_allocator
        self.device_id = int(device_id)
        self._lock = threading.Lock()
        self.live_allocations = 0
        self.live_bytes = 0
        self.total_allocations = 0
        self.tally = tally
        self._previous: list[Any] = []

    # -- the allocator -----------------------------------------------------------------------
    def malloc(self, nbytes: int):
        """CuPy allocator interface: ``size -> MemoryPointer``."""
        size = int(nbytes)
        pooled = self.pool.malloc(size)
        with self._lock:  # counted before the lease exists: its death uncounts it
            self.live_allocations += 1
            self.live_bytes += size
            self.total_allocations += 1
        if self.tally is not None:
            self.tally.add(1, size)
        mem = self._memory.UnownedMemory(pooled.ptr, size, _Lease(pooled, size, self),
                                         self.device_id)
        return self._memory.MemoryPointer(mem, 0)

    __call__ = malloc

    def _release(self, size: int) -> None:
        with self._lock:
            self.live_allocations -= 1
            self.live_bytes -= size
        if self.tally is not None:
            self.tally.add(-1, -size)

    # -- scoping -----------------------------------------------------------------------------
    @contextlib.contextmanager
    def scope(self) -> Iterator[CountingAllocator]:
        """This thread's CuPy allocations come from this allocator inside the block."""
        with self._cuda.using_allocator(self.malloc):
            yield self

    def install(self) -> None:
        """Process-wide: ``cupy.cuda.set_allocator(self.malloc)``; ``uninstall()`` restores."""
        self._previous.append(self._cuda.get_allocator())
        self._cuda.set_allocator(self.malloc)

    def uninstall(self) -> None:
        if not self._previous:
            raise RuntimeError("uninstall() without a matching install()")
        self._cuda.set_allocator(self._previous.pop())

    # -- reporting ---------------------------------------------------------------------------
    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return {"live_allocations": self.live_allocations, "live_bytes": self.live_bytes,
                    "total_allocations": self.total_allocations}

    def publish(self, ledger: Ledger) -> None:
        """Copy the live counts into the session ledger's ``live_allocations``/``live_bytes``."""
        snap = self.snapshot()
        ledger.live_allocations = snap["live_allocations"]
        ledger.live_bytes = snap["live_bytes"]


def driver_free_bytes(device_id: int = 0) -> int:
    """Free device memory as the driver reports it (``cudaMemGetInfo``), in bytes."""
    cp = import_cupy()
    with cp.cuda.Device(device_id):
        free, _total = cp.cuda.runtime.memGetInfo()
    return int(free)
