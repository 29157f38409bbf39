"""``KernelLauncher`` on the host: what the driver would read through each parameter pointer
is each argument at the width CuPy passes it, in order; anything else goes through CuPy's
own call. The GPU suites launch every kernel through it (native-cuda's forwards)."""
from __future__ import annotations

import ctypes
import struct
import threading

import numpy as np
import pytest

from engines.native.kernel_launch import KernelLauncher


class _Data:
    def __init__(self, ptr):
        self.ptr = ptr


class FakeArray:
    def __init__(self, ptr):
        self.data = _Data(ptr)


class FakeStream:
    def __init__(self, ptr):
        self.ptr = ptr


class FakeDriver:
    def __init__(self, widths):
        self.widths = widths  # each parameter's byte width, as the kernel declares them
        self.launches = []

    def launchKernel(self, f, gx, gy, gz, bx, by, bz, smem, stream, params, extra):
        table = (ctypes.c_void_p * len(self.widths)).from_address(params)
        raw = [ctypes.string_at(table[i], w) for i, w in enumerate(self.widths)]
        self.launches.append(dict(f=f, grid=(gx, gy, gz), block=(bx, by, bz), smem=smem,
                                  stream=stream, extra=extra, raw=raw))


class FakeCupy:
    ndarray = FakeArray

    def __init__(self, widths, current=77):
        self.cuda = type("cuda", (), {})()
        self.cuda.driver = FakeDriver(widths)
        self.cuda.get_current_stream = lambda: FakeStream(current)


class FakeFunction:
    ptr = 0xF00D

    def __init__(self):
        self.calls = []

    def __call__(self, grid, block, args, stream=None, shared_mem=0):
        self.calls.append((grid, block, args, stream, shared_mem))


def test_each_parameter_reads_its_argument_at_its_width():
    args = (FakeArray(0x7F00_0000_1000), np.int32(-3), np.int64(1 << 40), np.float32(1.5),
            np.uint64(0), 12, FakeArray(0x7F00_0000_2010), np.int32(7))
    widths = [8, 4, 8, 4, 8, 8, 8, 4]
    fake = FakeCupy(widths)
    function = FakeFunction()
    KernelLauncher(fake).launch(function, (5, 2), (128,), args, FakeStream(42), 4096)
    (launch,) = fake.cuda.driver.launches
    assert function.calls == []  # the driver's launch, not CuPy's call
    assert launch["f"] == FakeFunction.ptr and launch["extra"] == 0
    assert launch["grid"] == (5, 2, 1) and launch["block"] == (128, 1, 1)
    assert launch["smem"] == 4096 and launch["stream"] == 42
    expected = [struct.pack("<Q", 0x7F00_0000_1000), struct.pack("<i", -3),
                struct.pack("<q", 1 << 40), struct.pack("<f", 1.5), struct.pack("<Q", 0),
                struct.pack("<q", 12), struct.pack("<Q", 0x7F00_0000_2010),
                struct.pack("<i", 7)]
    assert launch["raw"] == expected


def test_parameters_are_aligned_as_c_lays_them_out():
    fake = FakeCupy([4, 8, 4, 4, 8])
    KernelLauncher(fake).launch(FakeFunction(), (1,), (32,),
                                (np.int32(1), np.int64(2), np.float32(3.0), np.int32(4),
                                 FakeArray(5)), FakeStream(1))
    driver = fake.cuda.driver
    assert [int.from_bytes(r, "little") for r in driver.launches[0]["raw"][::4]] == [1, 5]
    launcher = KernelLauncher(fake)
    frame = launcher._frame("iqfiQ")
    table = frame.params[0]
    base = ctypes.addressof(frame.buffer)
    assert [table[i] - base for i in range(5)] == [0, 8, 16, 20, 24]


def test_a_reused_format_is_rewritten_by_the_next_launch():
    fake = FakeCupy([8, 4])
    launcher = KernelLauncher(fake)
    for value in (1, 2):
        launcher.launch(FakeFunction(), (1,), (1,), (FakeArray(value), np.int32(value)),
                        FakeStream(1))
    raws = [launch["raw"] for launch in fake.cuda.driver.launches]
    assert raws == [[struct.pack("<Q", 1), struct.pack("<i", 1)],
                    [struct.pack("<Q", 2), struct.pack("<i", 2)]]


def test_no_stream_means_the_current_stream():
    fake = FakeCupy([4], current=99)
    KernelLauncher(fake).launch(FakeFunction(), (1,), (1,), (np.int32(0),), None)
    assert fake.cuda.driver.launches[0]["stream"] == 99


@pytest.mark.parametrize("odd", [True, 1.5, "text", np.bool_(True)], ids=repr)
def test_an_argument_of_another_kind_goes_through_cupys_call(odd):
    fake = FakeCupy([8, 8])
    function = FakeFunction()
    stream = FakeStream(3)
    args = (FakeArray(1), odd)
    KernelLauncher(fake).launch(function, (2,), (64,), args, stream, 16)
    assert fake.cuda.driver.launches == []
    assert function.calls == [((2,), (64,), args, stream, 16)]


def test_threads_pack_into_their_own_buffers():
    fake = FakeCupy([8])
    launcher = KernelLauncher(fake)
    frames = {}

    def grab(name):
        frames[name] = launcher._frame("Q")

    threads = [threading.Thread(target=grab, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert frames[0] is not frames[1]
    assert launcher._frame("Q") is launcher._frame("Q")


class FakeRawKernel(FakeFunction):
    """CuPy's ``RawKernel``: the compiled function (and its pointer) is its ``kernel``."""

    ptr = None

    def __init__(self, ptr):
        super().__init__()
        self.kernel = type("Function", (), {"ptr": ptr})()


def test_a_raw_kernel_launches_through_its_compiled_function():
    fake = FakeCupy([4])
    raw = FakeRawKernel(0xBEEF)
    KernelLauncher(fake).launch(raw, (1,), (1,), (np.int32(5),), FakeStream(1))
    assert raw.calls == [] and fake.cuda.driver.launches[0]["f"] == 0xBEEF


def test_a_callable_that_is_no_compiled_kernel_is_called_as_cupy_calls_it():
    fake = FakeCupy([4])
    seen = []

    def spy(grid, block, args, stream=None, shared_mem=0):
        seen.append((grid, block, args, stream, shared_mem))

    stream = FakeStream(1)
    KernelLauncher(fake).launch(spy, (3,), (32,), (np.int32(5),), stream, 8)
    assert fake.cuda.driver.launches == [] and seen == [((3,), (32,), (np.int32(5),), stream, 8)]
