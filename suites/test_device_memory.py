"""The counting allocator behind claim 5 (flat device memory).

Host half: the counting logic with a fake pool and fake CuPy memory classes (a release is
the death of the last object that references the allocation, slices included).
GPU half: real CuPy arrays allocated through the allocator, counted exactly.
"""
from __future__ import annotations

import contextlib
import gc
from types import SimpleNamespace

import numpy as np
import pytest

from engines.device_memory import CountingAllocator, MemoryTally, driver_free_bytes
from engines.ledger import Ledger

pytestmark = pytest.mark.claim("flat_memory")


class FakePooled:
    def __init__(self, pool, ptr, size):
        self.pool, self.ptr, self.size = pool, ptr, size

    def __del__(self):
        self.pool.freed.append(self.ptr)


class FakePool:
    def __init__(self):
        self.next_ptr, self.freed, self.sizes = 0x1000, [], []

    def malloc(self, size):
        self.next_ptr += 0x100
        self.sizes.append(size)
        return FakePooled(self, self.next_ptr, size)


class FakeUnownedMemory:
    def __init__(self, ptr, size, owner, device_id):
        self.ptr, self.size, self.owner, self.device_id = ptr, size, owner, device_id


class FakeMemoryPointer:
    """Like CuPy's: holds the memory; ``+ offset`` makes a new pointer to the same memory."""
    def __init__(self, mem, offset):
        self.mem, self.ptr = mem, mem.ptr + offset

    def __add__(self, offset):
        return FakeMemoryPointer(self.mem, self.ptr - self.mem.ptr + offset)


class FakeCuda:
    def __init__(self):
        self.allocator = "default"
        self.local = []

    def get_allocator(self):
        return self.allocator

    def set_allocator(self, fn):
        self.allocator = fn

    @contextlib.contextmanager
    def using_allocator(self, fn):
        self.local.append(fn)
        try:
            yield
        finally:
            self.local.pop()


@pytest.fixture
def alloc():
    memory = SimpleNamespace(UnownedMemory=FakeUnownedMemory, MemoryPointer=FakeMemoryPointer)
    return CountingAllocator(FakePool(), memory=memory, cuda=FakeCuda(), device_id=0)


def test_counts_follow_the_last_reference_not_the_first_pointer(alloc):
    a = alloc.malloc(100)
    b = alloc(28)
    assert alloc.snapshot() == {"live_allocations": 2, "live_bytes": 128, "total_allocations": 2}
    view = a + 16  # a slice: a new pointer, the same memory
    del a
    gc.collect()
    assert alloc.live_allocations == 2, "the slice still uses the memory"
    assert alloc.pool.freed == []
    del view
    gc.collect()
    assert alloc.snapshot() == {"live_allocations": 1, "live_bytes": 28, "total_allocations": 2}
    assert len(alloc.pool.freed) == 1, "the pooled block went back to the pool"
    del b
    gc.collect()
    assert alloc.live_allocations == 0 and alloc.live_bytes == 0
    assert alloc.pool.sizes == [100, 28]


def test_memory_wraps_the_pooled_block(alloc):
    p = alloc.malloc(64)
    assert p.mem.ptr == p.ptr and p.mem.size == 64 and p.mem.device_id == 0
    assert p.mem.owner.pooled.ptr == p.ptr


def test_a_steady_loop_is_flat(alloc):
    keep = [alloc.malloc(8)]
    for _ in range(50):
        tmp = [alloc.malloc(n) for n in (4, 16, 256)]
        del tmp
    gc.collect()
    assert alloc.live_allocations == 1 and alloc.live_bytes == 8
    assert alloc.total_allocations == 151
    del keep


def test_install_uninstall_restores_the_previous_allocator(alloc):
    cuda = alloc._cuda
    alloc.install()
    assert cuda.allocator == alloc.malloc
    alloc.uninstall()
    assert cuda.allocator == "default"
    with pytest.raises(RuntimeError, match="install"):
        alloc.uninstall()


def test_scope_uses_the_thread_local_switch(alloc):
    cuda = alloc._cuda
    with alloc.scope() as a:
        assert a is alloc and cuda.local == [alloc.malloc]
    assert cuda.local == [] and cuda.allocator == "default"


def _tallied(tally):
    memory = SimpleNamespace(UnownedMemory=FakeUnownedMemory, MemoryPointer=FakeMemoryPointer)
    return CountingAllocator(FakePool(), memory=memory, cuda=FakeCuda(), tally=tally)


def test_a_tally_is_the_sum_of_its_allocators_counts():
    # a device's graph pools (one per capture) add to one tally, read without visiting them
    tally = MemoryTally()
    pools = [_tallied(tally) for _ in range(3)]
    untallied = _tallied(None)
    held = [pools[i % 3].malloc(8 * (i + 1)) for i in range(7)] + [untallied.malloc(1000)]

    def summed():
        snaps = [a.snapshot() for a in pools]
        return (sum(s["live_allocations"] for s in snaps), sum(s["live_bytes"] for s in snaps))

    assert tally.counts() == summed() == (7, 8 * 28)
    view = held[2] + 4  # a slice keeps its allocation live
    del held[1:4]
    gc.collect()
    assert tally.counts() == summed() == (5, 8 * (28 - 2 - 4))
    del view, held
    gc.collect()
    assert tally.counts() == summed() == (0, 0)
    assert untallied.live_allocations == 0


def test_publish_writes_the_ledger(alloc):
    ledger = Ledger()
    p = alloc.malloc(10)
    alloc.publish(ledger)
    assert ledger.live_allocations == 1 and ledger.live_bytes == 10
    del p


# -- GPU ---------------------------------------------------------------------------------------


@pytest.mark.gpu
def test_gpu_live_counts_are_exact(cp):
    alloc = CountingAllocator()
    with alloc.scope():
        a = cp.zeros((1000,), dtype=cp.float32)
        b = cp.ones((3, 5), dtype=cp.int64)
        view = a[10:20]
    assert alloc.live_allocations == 2 and alloc.live_bytes == 4000 + 120
    assert alloc.pool.used_bytes() >= 4120
    del a
    gc.collect()
    assert alloc.live_allocations == 2, "the view keeps the allocation alive"
    assert float(view.sum().get()) == 0.0
    del view, b
    gc.collect()
    assert alloc.live_allocations == 0 and alloc.live_bytes == 0
    assert alloc.pool.used_bytes() == 0


@pytest.mark.gpu
def test_gpu_a_steady_loop_is_flat_and_outside_the_scope_is_not_counted(cp):
    alloc = CountingAllocator()
    outside = cp.empty(16, dtype=cp.float32)
    with alloc.scope():
        state = cp.zeros((4, 64), dtype=cp.float32)
        for _ in range(20):
            state = state + 1  # one new buffer each step, the old one released
        cp.cuda.Device().synchronize()
    gc.collect()
    assert alloc.live_allocations == 1 and alloc.total_allocations == 21
    assert float(state[0, 0].get()) == 20.0
    del outside


@pytest.mark.gpu
def test_gpu_install_is_process_wide_and_restored(cp):
    before = cp.cuda.get_allocator()
    alloc = CountingAllocator()
    alloc.install()
    try:
        x = cp.arange(7)
        assert alloc.live_allocations == 1
    finally:
        alloc.uninstall()
    assert cp.cuda.get_allocator() == before
    del x


@pytest.mark.gpu
def test_gpu_driver_free_bytes_sees_a_large_allocation(cp):
    cp.get_default_memory_pool().free_all_blocks()
    free0 = driver_free_bytes()
    pool = cp.cuda.MemoryPool()
    alloc = CountingAllocator(pool)
    with alloc.scope():
        big = cp.empty(256 * 2**20, dtype=np.uint8)
    free1 = driver_free_bytes()
    assert free0 - free1 >= 256 * 2**20
    del big
    pool.free_all_blocks()
    assert driver_free_bytes() > free1
