"""Programmatic dependent launch on the host (``engines/native/dependent_launch.py``): every
kernel of both CUDA modules waits for its predecessor before it reads anything another
kernel writes, the launch path is taken only inside a capture, and arguments are marshalled
as CuPy marshals them. That PDL launches really happen and change no bit is checked on the
GPU (``suites/test_graph_slots.py``)."""
from __future__ import annotations

import ctypes
import re

import numpy as np
import pytest

from engines.native import dependent_launch as dl
from engines.native.cuda_kernels import KERNEL_NAMES, KERNEL_SOURCE
from engines.native.fused_kernels import FUSED_NAMES, FUSED_SOURCE

# What a kernel may do before its wait: declare shared memory and constants, point into
# shared memory, and ask L2 for weight rows (which no kernel writes).
_BEFORE_WAIT = [re.compile(p) for p in (
    r"extern __shared__ .*", r"__shared__ .*", r"constexpr .*",
    r"\$?\w+\* xs = reinterpret_cast<\w+\*>\(lk_prologue_smem\)",
    r"(if \(vec\) )?lk_gemv3?_prefetch_\w+\([^;]*\)")]


def _bodies(source: str):
    heads = list(re.finditer(r'extern "C" __global__ void (\w+)\(', source))
    for head, after in zip(heads, heads[1:] + [None]):
        body = source[source.index("{", head.end()) + 1:
                      after.start() if after is not None else len(source)]
        yield head.group(1), body


def _statements_before_wait(body: str) -> list[str]:
    head = body[:body.index(dl.WAIT_CALL)]
    head = re.sub(r"//[^\n]*", "", head)
    return [" ".join(s.split()) for s in head.split(";") if s.strip()]


@pytest.mark.parametrize("source,names", [(KERNEL_SOURCE, KERNEL_NAMES),
                                          (FUSED_SOURCE, FUSED_NAMES)],
                         ids=["cuda_kernels", "fused_kernels"])
def test_every_kernel_waits_before_it_reads_another_kernels_output(source, names):
    assert dl.waits(source) == frozenset(names)
    prefetching = 0
    for name, body in _bodies(source):
        assert body.count(dl.WAIT_CALL) == 1, name
        for statement in _statements_before_wait(body):
            assert any(p.fullmatch(statement) for p in _BEFORE_WAIT), (name, statement)
            prefetching += "prefetch" in statement
    assert prefetching > 0  # the GEMVs ask for their weights before they wait


def test_with_waits_inserts_once_and_keeps_a_placed_wait():
    source = ('extern "C" __global__ void a(int* x) {\n    x[0] = 1;\n}\n'
              'extern "C" __global__ void b(const float* w, int* x) {\n'
              '    lk_gemv_prefetch_f16(w, 1, 1, 1, 0);\n    lk_dependent_wait();\n'
              '    x[0] = 2;\n}\n')
    once = dl.with_waits(source)
    assert dl.with_waits(once) == once
    bodies = dict(_bodies(once))
    assert bodies["a"].lstrip().startswith(dl.WAIT_CALL)
    assert _statements_before_wait(bodies["b"]) == ["lk_gemv_prefetch_f16(w, 1, 1, 1, 0)"]
    planted = source.replace("    lk_dependent_wait();\n", "")  # a kernel that never waits
    assert dl.waits(planted) == frozenset()


class _Function:
    def __init__(self):
        self.calls = []

    def __call__(self, grid, block, args, stream=None, shared_mem=0):
        self.calls.append((grid, block, args, stream, shared_mem))


def test_launches_are_plain_outside_a_capture_and_for_kernels_that_do_not_wait(monkeypatch):
    def refuse(*_args):
        raise AssertionError("the driver was called")

    monkeypatch.setattr(dl, "_driver", lambda: (refuse, ""))
    waiting, plain = _Function(), _Function()
    kernels = {"w": dl.Launcher(waiting, True), "p": dl.Launcher(plain, False)}
    kernels["w"]((1,), (32,), (np.int64(3),), stream="s")
    with dl.capturing():
        kernels["p"]((2,), (64,), (), stream="s", shared_mem=16)
    monkeypatch.setenv(dl.ENV, "off")
    with dl.capturing():
        kernels["w"]((1,), (32,), (), stream="s")
    assert len(waiting.calls) == 2 and plain.calls == [((2,), (64,), (), "s", 16)]


def test_a_capture_launches_through_the_driver_with_the_attribute_and_cupys_arguments(
        monkeypatch):
    seen = {}

    def launch(config, function, params, extra):
        cfg = ctypes.cast(config, ctypes.POINTER(dl._Config)).contents
        seen["grid"], seen["block"] = tuple(cfg.grid), tuple(cfg.block)
        seen["shared"], seen["stream"] = cfg.shared, cfg.stream
        attr = cfg.attrs[0]
        seen["attr"] = (cfg.count, attr.id, attr.value.allowed)
        seen["function"] = function.value
        raw = [ctypes.cast(params[i], ctypes.POINTER(ctypes.c_char * 8)).contents.raw
               for i in range(5)]
        seen["args"] = (int.from_bytes(raw[0], "little"), raw[1][:4], raw[2][:4],
                        int.from_bytes(raw[3], "little", signed=True),
                        np.frombuffer(raw[4], np.float64)[0])
        return 0

    class Pointer:
        ptr = 0xABC000

    class DeviceArray:
        data = Pointer()

    class Stream:
        ptr = 0x77

    class Kernel(_Function):
        ptr = 0x1234

    monkeypatch.delenv(dl.ENV, raising=False)
    monkeypatch.setattr(dl, "_driver", lambda: (launch, ""))
    before = dl.Launcher.dependent_launches
    kernel = Kernel()
    with dl.capturing():
        dl.Launcher(kernel, True)((5,), (128,), (DeviceArray(), np.int32(7), np.float32(1.5),
                                                 -3, 2.25), stream=Stream(), shared_mem=4096)
    assert kernel.calls == [] and dl.Launcher.dependent_launches == before + 1
    assert seen["grid"] == (5, 1, 1) and seen["block"] == (128, 1, 1)
    assert seen["shared"] == 4096 and seen["stream"] == 0x77 and seen["function"] == 0x1234
    assert seen["attr"] == (1, 6, 1)  # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    assert seen["args"] == (0xABC000, np.int32(7).tobytes(), np.float32(1.5).tobytes(), -3,
                            2.25)


def test_a_failed_driver_launch_raises_so_the_capture_falls_back(monkeypatch):
    monkeypatch.setattr(dl, "_driver", lambda: (lambda *a: 1, ""))

    class Stream:
        ptr = 1

    class Kernel(_Function):
        ptr = 2

    with dl.capturing(), pytest.raises(RuntimeError, match="CUresult 1"):
        dl.Launcher(Kernel(), True)((1,), (1,), (), stream=Stream())


def test_availability_names_the_reason():
    on, why = dl.available(80)
    assert not on and "8.0" in why
    assert dl._Config.stream.offset == 32 and ctypes.sizeof(dl._Attribute) == 72
