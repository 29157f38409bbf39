"""Programmatic dependent launch on the host (``engines/native/dependent_launch.py``).

What the driver reads through ``cuLaunchKernelEx``'s config is the launch's grid, block,
shared memory and stream with one attribute, programmatic serialization on; a launcher made
``dependent`` sends every packed launch (and a step memo's replay) that way; the switch and
the device's generation decide whether it is on. Above all, every kernel of the two modules
so launched waits (``lk_grid_wait``) before anything but shared declarations, L2
prefetches (weights, an old cache) and weight runs loaded into registers (no kernel writes a
weight): a kernel that read or wrote anything else first would race the kernel ahead of it.
The GPU suite (``test_dependent_launch_cuda.py``) checks the bits on the device."""
from __future__ import annotations

import ctypes
import re
import struct
from pathlib import Path

import numpy as np
import pytest

from engines.native import dependent_launch
from engines.native.cuda_kernels import CudaKernels
from engines.native.dependent_launch import DependentLaunch, dependent_launch_for, requested
from engines.native.fused_kernels import FusedKernels
from engines.native.kernel_launch import KernelLauncher


class FakeEntry:
    """Stands for ``cuLaunchKernelEx``: records what the driver would read."""

    def __init__(self, status=0):
        self.status = status
        self.calls = []

    def __call__(self, config, function, params, extra):
        raw = ctypes.string_at(config, 56)
        grid_block_smem = struct.unpack_from("@7I", raw, 0)
        stream, attrs, count = struct.unpack_from("@QQI", raw, 32)
        attr_id, allowed = struct.unpack_from("@I4xi", ctypes.string_at(attrs, 72), 0)
        self.calls.append(dict(grid=grid_block_smem[:3], block=grid_block_smem[3:6],
                               smem=grid_block_smem[6], stream=stream, count=count,
                               attr=(attr_id, allowed), function=function, params=params,
                               extra=extra))
        return self.status


def test_the_config_is_laid_out_as_the_driver_reads_it():
    # CUlaunchConfig: 7 x uint32, the stream at 32, the attributes at 40, their count at 48
    assert dependent_launch._CONFIG.size == 56
    # CUlaunchAttribute: an 8-byte id slot and a 64-byte value union
    assert dependent_launch._ATTRIBUTE.size == 72
    entry = FakeEntry()
    DependentLaunch(entry).launch(0xBEEF, (5, 2, 1), (128, 1, 1), 4096, 0x5EED, 0x1234)
    (call,) = entry.calls
    assert call == dict(grid=(5, 2, 1), block=(128, 1, 1), smem=4096, stream=0x5EED, count=1,
                        attr=(6, 1), function=0xBEEF, params=0x1234, extra=None)


def test_a_failed_launch_names_the_status_and_the_switch():
    from engines.errors import ExecutionError

    with pytest.raises(ExecutionError) as info:
        DependentLaunch(FakeEntry(status=1)).launch(1, (1, 1, 1), (32, 1, 1), 0, 2, 3)
    assert "CUresult 1" in str(info.value)
    assert dependent_launch.ENV in info.value.remedy


@pytest.mark.parametrize("value, on", [(None, True), ("on", True), ("off", False),
                                       ("0", False), ("OFF", False), ("1", True)])
def test_the_switch(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv(dependent_launch.ENV, raising=False)
    else:
        monkeypatch.setenv(dependent_launch.ENV, value)
    assert requested() is on


class _Device:
    capability = "90"

    def __init__(self, device_id):
        self.compute_capability = _Device.capability


class _Cupy:
    def __init__(self, capability):
        _Device.capability = capability
        self.cuda = type("cuda", (), {"Device": _Device})()


@pytest.mark.parametrize("capability, switch, on", [("90", "on", True), ("100", "on", True),
                                                    ("89", "on", False), ("80", "on", False),
                                                    ("90", "off", False)])
def test_on_from_sm90_where_the_switch_allows(monkeypatch, capability, switch, on):
    monkeypatch.setenv(dependent_launch.ENV, switch)
    monkeypatch.setattr(dependent_launch, "_driver_entry", lambda: FakeEntry())
    assert (dependent_launch_for(_Cupy(capability), 0) is not None) is on


def test_off_where_the_driver_lacks_the_entry(monkeypatch):
    monkeypatch.setenv(dependent_launch.ENV, "on")
    monkeypatch.setattr(dependent_launch, "_driver_entry", lambda: None)
    assert dependent_launch_for(_Cupy("90"), 0) is None


class _Array:
    def __init__(self, ptr):
        self.data = type("data", (), {"ptr": ptr})()


class _Stream:
    ptr = 0x77


class _LauncherCupy(_Cupy):
    ndarray = _Array

    def __init__(self):
        super().__init__("90")
        self.cuda.driver = type("driver", (), {"launchKernel": self._plain})()
        self.cuda.get_current_stream = lambda: _Stream()
        self.plain = []

    def _plain(self, *args):
        self.plain.append(args)


class _Function:
    ptr = 0xF00D


@pytest.fixture
def dependent(monkeypatch):
    """(the fake entry, the fake CuPy, a dependent launcher on them)."""
    entry = FakeEntry()
    monkeypatch.setenv(dependent_launch.ENV, "on")
    monkeypatch.setattr(dependent_launch, "_driver_entry", lambda: entry)
    cupy = _LauncherCupy()
    return entry, cupy, KernelLauncher(cupy, 0, dependent=True)


def test_a_dependent_launcher_sends_every_packed_launch_through_the_entry(dependent):
    entry, cupy, launcher = dependent
    launcher.launch(_Function(), (3,), (64,), (_Array(0xA0), np.int64(7)), _Stream(), 16)
    launcher.launch_packed(0xF00D, (1, 1, 1), (32, 1, 1), "q", [5], _Stream(), 0)  # a memo's
    assert [c["grid"] for c in entry.calls] == [(3, 1, 1), (1, 1, 1)]
    assert entry.calls[0]["smem"] == 16 and entry.calls[0]["stream"] == 0x77
    table = (ctypes.c_void_p * 2).from_address(entry.calls[0]["params"])
    assert struct.unpack("@Q", ctypes.string_at(table[0], 8))[0] == 0xA0
    assert not cupy.plain
    # the same launcher not made dependent (or a plain one): the driver's cuLaunchKernel
    plain = KernelLauncher(cupy, 0)
    plain.launch(_Function(), (3,), (64,), (_Array(0xA0),), _Stream())
    assert len(cupy.plain) == 1 and len(entry.calls) == 2


# -- every kernel launched dependent waits before it touches memory --------------------------

_BEFORE_WAIT = re.compile(r"^\s*(extern __shared__|__shared__|LK_DYNAMIC_SHARED\(|constexpr |"
                          r"\w+\* xs = "
                          r"reinterpret_cast<[^>]+>\(lk_\w+_smem\);|"
                          r"lk_(rka_)?preloaded(<\w+>)? \w+;|"
                          r"(if \([\w &=!]+\) )?"
                          r"lk_(gemv3?|glu|kv|rka)_(prefetch|preload)(<[\w, ]+>)?\()")
PLANTED = Path(__file__).resolve().parent / "kernels" / "planted_waits.cu"


def kernels_waiting_late(source: str, kernels) -> list[str]:
    """The kernels named (defined in ``source`` as ``void NAME(``) whose body does something
    before ``lk_grid_wait();`` other than declaring shared memory, asking L2 for weights or
    loading weight runs (or, in attention, the old caches' runs: no kernel of a forward
    writes those) into registers, never calls it, or is not there."""
    late = []
    for name in kernels:
        match = re.search(rf"\bvoid {name}\(", source)
        if match is None:
            late.append(name)
            continue
        depth, j = 0, match.end() - 1
        while True:  # the parameter list's closing parenthesis
            depth += {"(": 1, ")": -1}.get(source[j], 0)
            if depth == 0:
                break
            j += 1
        body = source[source.index("{", j) + 1:]
        head, found, _ = body.partition("lk_grid_wait();")
        head = re.sub(r"//[^\n]*", "", head)
        statements = [s for s in head.split(";") if s.strip() and "}" not in s]
        if not found or "}" in head or not all(_BEFORE_WAIT.match(s.strip() + ";")
                                               for s in statements):
            late.append(name)
    return late


@pytest.mark.parametrize("module", CudaKernels.modules() + FusedKernels.modules(),
                         ids=lambda m: m.file)
def test_every_kernel_of_the_dependent_modules_waits_first(module):
    kernels = {name.split("<")[0] for name in module.instances}
    assert kernels and kernels_waiting_late(module.text(), sorted(kernels)) == []


@pytest.mark.parametrize("planted", ["early", "never", "absent"])
def test_a_kernel_that_touches_memory_before_waiting_is_named(planted):
    source = PLANTED.read_text()
    assert kernels_waiting_late(source, ["fine"]) == []
    assert kernels_waiting_late(source, ["fine", planted]) == [planted]


def test_plain_launches_inside_the_context_and_dependent_again_after(dependent):
    from engines.native.kernel_launch import plain_launches

    entry, cupy, launcher = dependent
    with plain_launches():
        with plain_launches():  # nested: still plain, and plain after the inner one
            launcher.launch(_Function(), (1,), (32,), (np.int64(1),), _Stream())
        launcher.launch_packed(0xF00D, (1, 1, 1), (32, 1, 1), "q", [5], _Stream(), 0)
    assert len(cupy.plain) == 2 and not entry.calls
    launcher.launch(_Function(), (1,), (32,), (np.int64(1),), _Stream())
    assert len(cupy.plain) == 2 and len(entry.calls) == 1
