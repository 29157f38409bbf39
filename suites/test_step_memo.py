"""``StepMemo`` on the host, with a fake CuPy: a signature is recorded the second time it is
seen and replayed from the third; a replay re-bases every recorded pointer on this call's
operands and allocations and packs the recorded scalars; anything the memo cannot replay
exactly (an allocation that is not the kernel families', a launch the launcher hands to
CuPy) is never memoised; a new signature starts over. The GPU suites run every native-cuda
forward through it."""
from __future__ import annotations

import contextlib
import ctypes
import struct

import numpy as np
import pytest

from engines.native.kernel_launch import KernelLauncher, note_allocation
from engines.native.step_memo import StepMemo


class _Pointer:
    def __init__(self, ptr, device_id=0):
        self.ptr = ptr
        self.device_id = device_id

    def __add__(self, offset):
        return _Pointer(self.ptr + offset, self.device_id)


class _Flags:
    def __init__(self, c_contiguous):
        self.c_contiguous = c_contiguous


class FakeArray:
    """Metadata of a device array at an address (nothing is stored)."""

    def __init__(self, shape, dtype=np.float32, memptr=None, strides=None, ptr=None):
        self.shape = tuple(shape)
        self.dtype = np.dtype(dtype)
        self.itemsize = self.dtype.itemsize
        if strides is None:
            strides, step = [], self.itemsize
            for extent in reversed(self.shape):
                strides.insert(0, step)
                step *= extent
        self.strides = tuple(strides)
        self.data = memptr if memptr is not None else _Pointer(ptr)
        self.nbytes = self.itemsize * int(np.prod(self.shape))
        contiguous_strides = []
        step = self.itemsize
        for extent in reversed(self.shape):
            contiguous_strides.insert(0, step)
            step *= extent
        self.flags = _Flags(tuple(contiguous_strides) == self.strides)

    def reshape(self, *shape):
        return FakeArray(shape, self.dtype, memptr=self.data)


class FakeDriver:
    def __init__(self):
        self.launches = []

    def launchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        table = (ctypes.c_void_p * 3).from_address(params)
        raw = [ctypes.string_at(table[i], w) for i, w in enumerate((8, 8, 4))]
        self.launches.append((f, (gx, gy, gz), smem, stream,
                              struct.unpack("<Q", raw[0])[0], struct.unpack("<Q", raw[1])[0],
                              struct.unpack("<i", raw[2])[0]))


class FakeStream:
    ptr = 42

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


class FakeCupy:
    ndarray = FakeArray

    def __init__(self):
        self.next_ptr = 0x10_0000
        self.allocations = 0
        cuda = type("cuda", (), {})()
        cuda.driver = FakeDriver()
        cuda.get_current_stream = lambda: STREAM
        self._allocator = self._malloc
        cuda.get_allocator = lambda: self._allocator
        cuda.using_allocator = self._using
        cuda.Device = lambda device_id=0: contextlib.nullcontext()
        cuda.runtime = type("runtime", (), {"getDevice": staticmethod(lambda: 0)})()
        self.cuda = cuda

    def _malloc(self, nbytes):
        self.allocations += 1
        ptr = self.next_ptr
        self.next_ptr += (nbytes + 255) // 256 * 256 + 256
        return _Pointer(ptr)

    @contextlib.contextmanager
    def _using(self, allocator):
        previous, self._allocator = self._allocator, allocator
        try:
            yield
        finally:
            self._allocator = previous

    def empty(self, shape, dtype):
        shape = (shape,) if isinstance(shape, int) else tuple(shape)
        nbytes = np.dtype(dtype).itemsize * int(np.prod(shape))
        return FakeArray(shape, dtype, memptr=self._allocator(nbytes))


STREAM = FakeStream()


class Function:
    ptr = 0xF00D


class Kernels:
    """A kernel family: its own allocations and one launch through the launcher."""

    def __init__(self, cupy):
        self.cupy = cupy
        self.launcher = KernelLauncher(cupy)
        self.function = Function()

    def empty(self, shape, dtype):
        return note_allocation(self.cupy.empty(shape, dtype), STREAM)

    def double(self, x):
        """out = f(x) into a fresh [rows, n] output; returns a [1, rows, n] view of it."""
        out = self.empty(x.shape, x.dtype)
        self.launcher.launch(self.function, (x.shape[0],), (128,),
                             (x, out, np.int32(x.shape[1])), STREAM)
        return [out.reshape(1, *out.shape)]


def test_a_replay_rebases_pointers_and_keeps_the_scalars():
    cupy = FakeCupy()
    kernels = Kernels(cupy)
    memo = StepMemo(cupy, frozenset())
    seen = FakeArray((4, 8), ptr=0x6F00_0000)
    memo.run(lambda: kernels.double(seen), [seen])  # seen once: a plain call
    first = FakeArray((4, 8), ptr=0x7000_0000)
    recorded = memo.run(lambda: kernels.double(first), [first])  # recorded
    second = FakeArray((4, 8), ptr=0x7100_0000)
    replayed = memo.run(lambda: pytest.fail("a replay must not call the step"), [second])
    launches = cupy.cuda.driver.launches
    assert len(launches) == 3
    f, grid, smem, stream, x_ptr, out_ptr, n = launches[2]
    assert (f, grid, smem, stream, n) == (0xF00D, (4, 1, 1), 0, 42, 8)
    assert x_ptr == 0x7100_0000  # this call's operand
    (view,) = replayed
    assert out_ptr == view.data.ptr and out_ptr != recorded[0].data.ptr  # a fresh output
    assert view.shape == (1, 4, 8) and view.strides == recorded[0].strides


def test_an_operand_view_keeps_its_offset():
    cupy = FakeCupy()
    kernels = Kernels(cupy)
    memo = StepMemo(cupy, frozenset())

    def call(base):
        row = FakeArray((2, 8), memptr=base.data + 64)  # rows 2 and 3 of base
        return kernels.double(row)

    for ptr in (0x6F00_0000, 0x7000_0000):
        a = FakeArray((4, 8), ptr=ptr)
        memo.run(lambda a=a: call(a), [a])
    b = FakeArray((4, 8), ptr=0x7200_0000)
    memo.run(lambda: pytest.fail("replayed"), [b])
    assert cupy.cuda.driver.launches[2][4] == 0x7200_0000 + 64


def test_a_foreign_allocation_refuses_the_memo():
    cupy = FakeCupy()
    kernels = Kernels(cupy)
    memo = StepMemo(cupy, frozenset())
    calls = []

    def call(x):
        calls.append(x)
        cupy.empty((1,), np.float32)  # a CuPy operation's own output: not replayable
        return kernels.double(x)

    for ptr in (0x7000_0000, 0x7100_0000, 0x7200_0000, 0x7300_0000):
        x = FakeArray((4, 8), ptr=ptr)
        memo.run(lambda x=x: call(x), [x])
    assert len(calls) == 4  # every call ran the step


def test_a_launch_through_cupy_refuses_the_memo():
    cupy = FakeCupy()
    kernels = Kernels(cupy)
    spied = []
    kernels.function = lambda *a, **k: spied.append(a)  # no compiled function: CuPy's call
    memo = StepMemo(cupy, frozenset())
    for ptr in (0x7000_0000, 0x7100_0000, 0x7200_0000):
        x = FakeArray((4, 8), ptr=ptr)
        memo.run(lambda x=x: kernels.double(x), [x])
    assert len(spied) == 3


def test_a_new_signature_records_again_and_host_values_are_never_keyed():
    cupy = FakeCupy()
    kernels = Kernels(cupy)
    memo = StepMemo(cupy, frozenset())
    calls = []

    def call(x):
        calls.append(x.shape)
        return kernels.double(x)

    for shape, ptr in (((4, 8), 0x7000_0000), ((4, 8), 0x7100_0000), ((4, 8), 0x7180_0000),
                       ((5, 8), 0x7200_0000), ((4, 8), 0x7300_0004)):  # 4: another alignment
        x = FakeArray(shape, ptr=ptr)
        memo.run(lambda x=x: call(x), [x])
    assert calls == [(4, 8), (4, 8), (5, 8), (4, 8)]  # seen, recorded, replayed; new; new
    host = np.zeros(3)
    memo.run(lambda: calls.append("host"), [host])
    memo.run(lambda: calls.append("host"), [host])
    assert calls[-2:] == ["host", "host"]


def test_a_bench_of_two_prompt_sets_replays_every_prefill_from_its_third_pass():
    """A step keeps the signatures a bench cycles through: two prompt sets' ten prefill
    lengths, M = 1 and a verification with its re-advances (1..8 rows). Each is called
    plain, then recorded, then replayed; eight kept signatures replayed none of them. Past
    ``KEYS_PER_STEP`` the least recently used is forgotten."""
    from engines.native.step_memo import KEYS_PER_STEP

    cupy = FakeCupy()
    kernels = Kernels(cupy)
    memo = StepMemo(cupy, frozenset())
    calls = []

    def call(x):
        calls.append(x.shape[0])
        return kernels.double(x)

    # the grounded set's five prompt lengths, the free set's four (two of its prompts are 43
    # tokens long), then one to eight rows (M = 1, the verification and its re-advances)
    lengths = [132, 119, 99, 127, 124, 46, 37, 43, 48, *range(1, 9)]
    assert len(lengths) == len(set(lengths)) == 17
    passes = []
    for _ in range(4):
        calls.clear()
        for m in lengths:
            x = FakeArray((m, 8), ptr=0x7000_0000 + 0x10_0000 * m)
            memo.run(lambda x=x: call(x), [x])
        passes.append(list(calls))
    assert passes == [lengths, lengths, [], []]  # seen, recorded, then only replays

    many = [1000 + i for i in range(KEYS_PER_STEP + 1)]  # one more than a step keeps
    for _ in range(3):
        calls.clear()
        for m in many:
            x = FakeArray((m, 8), ptr=0x7000_0000)
            memo.run(lambda x=x: call(x), [x])
    assert calls == many  # each forgotten before it came round again: never replayed


def test_constants_are_keyed_by_identity():
    cupy = FakeCupy()
    kernels = Kernels(cupy)
    memo = StepMemo(cupy, frozenset({0}))
    calls = []

    def call(x):
        calls.append(x)
        return kernels.double(x)

    w1 = FakeArray((4, 8), ptr=0x7000_0000)
    w2 = FakeArray((4, 8), ptr=0x7000_0000)  # same metadata, another object
    for w in (w1, w1, w1, w2):
        memo.run(lambda w=w: call(w), [w])
    assert calls == [w1, w1, w2]  # seen, recorded, replayed; then another constant
