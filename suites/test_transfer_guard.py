"""The transfer guard (claim 3's independent witness).

Host half: the patch logic driven through a CuPy-shaped fake (its conversions funnel into
``get`` as CuPy's do), so CI checks counts, bytes, call sites, modes, restore and nesting.
GPU half: the same paths on real CuPy arrays, each counted with its bytes and call site.
"""
from __future__ import annotations

import io
import os
import pickle
import sys
import threading
from types import SimpleNamespace

import numpy as np
import pytest

from engines.cuda_support import sanctioned_readback
from harness.transfer_guard import (
    MEMCPY_DEFAULT,
    MEMCPY_DEVICE_TO_HOST,
    TransferGuardError,
    cupy_target,
    transfer_guard,
)

pytestmark = pytest.mark.claim("zero_staging")
HERE = os.path.abspath(__file__)


# -- a CuPy-shaped fake ----------------------------------------------------------------------
class FakeArray:
    """Host stand-in for cupy.ndarray: every conversion calls ``self.get()``."""

    def __init__(self, values):
        self._v = np.asarray(values)
        self.gets = 0

    shape = property(lambda self: self._v.shape)
    dtype = property(lambda self: self._v.dtype)
    size = property(lambda self: self._v.size)
    nbytes = property(lambda self: self._v.nbytes)

    def get(self, stream=None, order="C", out=None, blocking=True):
        self.gets += 1
        return self._v.copy()

    def item(self):
        return self.get().item()

    def tolist(self):
        return self.get().tolist()

    def tobytes(self, order="C"):
        return self.get().tobytes(order)

    def tofile(self, fid, sep="", format="%s"):
        self.get().tofile(fid, sep, format)

    def __int__(self):
        return int(self.get())

    def __float__(self):
        return float(self.get())

    def __complex__(self):
        return complex(self.get())

    def __bool__(self):
        return bool(self.get())

    def __index__(self):
        return int(self.get())

    def __bytes__(self):
        return self.get().tobytes()

    def __repr__(self):
        return repr(self.get())

    def __str__(self):
        return str(self.get())

    def __format__(self, spec):
        return format(self.get(), spec)

    def __reduce__(self):
        return np.asarray, (self.get(),)

    def __array__(self, dtype=None, copy=None):
        return self.get()

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if dl_device is not None and tuple(dl_device)[0] == 1:
            return self.get().__dlpack__()
        return "device-capsule"


DEVICE_PTR, HOST_PTR, UNKNOWN_PTR = 0x1000, 0x2000, 0x3000


def make_fake_cupy():
    copies = []

    def memcpy(dst, src, size, kind):
        copies.append((dst, src, size, kind))

    def memcpyAsync(dst, src, size, kind, stream):  # noqa: N802 - CuPy's name
        copies.append((dst, src, size, kind))

    def memcpy2D(dst, dpitch, src, spitch, width, height, kind):  # noqa: N802
        copies.append((dst, src, width * height, kind))

    def pointer_attributes(ptr):
        types = {DEVICE_PTR: 2, HOST_PTR: 1}
        if ptr not in types:
            raise RuntimeError("cudaErrorInvalidValue")
        return SimpleNamespace(type=types[ptr])

    runtime = SimpleNamespace(memcpy=memcpy, memcpyAsync=memcpyAsync, memcpy2D=memcpy2D,
                              pointerGetAttributes=pointer_attributes, copies=copies)

    def asnumpy(a, stream=None, order="C", out=None, *, blocking=True):
        return a.get(stream=stream) if isinstance(a, FakeArray) else np.asarray(a)

    return SimpleNamespace(ndarray=FakeArray, asnumpy=asnumpy,
                           cuda=SimpleNamespace(runtime=runtime))


@pytest.fixture
def fake():
    return make_fake_cupy()


def guard(fake, mode="count", **kw):
    return transfer_guard(mode, targets=[cupy_target(fake)], **kw)


def line_of(fn) -> int:
    return fn.__code__.co_firstlineno


def patched_state(fake):
    return (dict(vars(FakeArray)), dict(vars(fake)), dict(vars(fake.cuda.runtime)))


# (path, call(fake, x)) with x a 2x3 float32 FakeArray (24 bytes) or a 1-element one (4 bytes)
ARRAY_PATHS = [
    ("cupy.ndarray.get", lambda f, x, s: x.get(), 24),
    ("cupy.ndarray.item", lambda f, x, s: s.item(), 4),
    ("cupy.ndarray.tolist", lambda f, x, s: x.tolist(), 24),
    ("cupy.ndarray.tobytes", lambda f, x, s: x.tobytes(), 24),
    ("cupy.ndarray.tofile", lambda f, x, s: x.tofile(os.devnull), 24),
    ("cupy.ndarray.__int__", lambda f, x, s: int(s), 4),
    ("cupy.ndarray.__float__", lambda f, x, s: float(s), 4),
    ("cupy.ndarray.__complex__", lambda f, x, s: complex(s), 4),
    ("cupy.ndarray.__bool__", lambda f, x, s: bool(s), 4),
    ("cupy.ndarray.__index__", lambda f, x, s: [0, 1, 2][s], 4),
    ("cupy.ndarray.__bytes__", lambda f, x, s: bytes(x), 24),
    ("cupy.ndarray.__repr__", lambda f, x, s: repr(x), 24),
    ("cupy.ndarray.__str__", lambda f, x, s: str(x), 24),
    ("cupy.ndarray.__format__", lambda f, x, s: f"{s:.2f}", 4),
    ("cupy.ndarray.__reduce__", lambda f, x, s: pickle.dumps(x), 24),
    ("cupy.ndarray.__array__", lambda f, x, s: np.asarray(x), 24),
    ("cupy.ndarray.__dlpack__", lambda f, x, s: np.from_dlpack(x, device="cpu"), 24),
    ("cupy.asnumpy", lambda f, x, s: f.asnumpy(x), 24),
    ("cupy.cuda.runtime.memcpy", lambda f, x, s: f.cuda.runtime.memcpy(
        HOST_PTR, DEVICE_PTR, 40, MEMCPY_DEVICE_TO_HOST), 40),
    ("cupy.cuda.runtime.memcpyAsync", lambda f, x, s: f.cuda.runtime.memcpyAsync(
        HOST_PTR, DEVICE_PTR, 12, MEMCPY_DEVICE_TO_HOST, 0), 12),
    ("cupy.cuda.runtime.memcpy2D", lambda f, x, s: f.cuda.runtime.memcpy2D(
        HOST_PTR, 16, DEVICE_PTR, 32, 16, 3, MEMCPY_DEVICE_TO_HOST), 48),
]


@pytest.mark.parametrize("path,call,nbytes", ARRAY_PATHS, ids=[p[0] for p in ARRAY_PATHS])
def test_each_path_is_counted_once_with_bytes_and_call_site(fake, path, call, nbytes):
    x = FakeArray(np.zeros((2, 3), np.float32))
    s = FakeArray(np.ones((), np.float32))
    with guard(fake) as g:
        call(fake, x, s)
    assert [e.path for e in g.events] == [path]  # nested get() inside is not counted again
    (event,) = g.events
    assert event.nbytes == nbytes and event.kind == "staging" and event.purpose is None
    assert event.site.startswith(f"{HERE}:{line_of(call)} ")
    assert g.staging_count == 1 and g.staging_bytes == nbytes
    assert g.readback_bytes == {"token_id": 0, "accept_count": 0, "logits_audit": 0}


def test_not_a_transfer_is_not_counted(fake):
    rt = fake.cuda.runtime
    x = FakeArray(np.zeros(3, np.float32))
    with guard(fake) as g:
        rt.memcpy(DEVICE_PTR, HOST_PTR, 8, 1)                    # host to device
        rt.memcpy(DEVICE_PTR, DEVICE_PTR, 8, 3)                  # device to device
        rt.memcpy(DEVICE_PTR, HOST_PTR, 8, MEMCPY_DEFAULT)       # default kind, to the device
        fake.asnumpy(np.zeros(3))                                # already on the host
        assert x.__dlpack__() == "device-capsule"               # exported for the device
        len(x.shape)
    assert g.events == []
    assert len(rt.copies) == 3  # the calls themselves went through


def test_default_kind_is_classified_by_pointer_and_counted_when_unknown(fake):
    rt = fake.cuda.runtime
    with guard(fake) as g:
        rt.memcpy(HOST_PTR, DEVICE_PTR, 8, MEMCPY_DEFAULT)
        rt.memcpy(UNKNOWN_PTR, DEVICE_PTR, 16, MEMCPY_DEFAULT)
        rt.memcpy(HOST_PTR, DEVICE_PTR, size=4, kind=MEMCPY_DEVICE_TO_HOST)
    assert [e.nbytes for e in g.events] == [8, 16, 4]


def test_log_mode_prints_each_event(fake):
    out = io.StringIO()
    x = FakeArray(np.zeros(5, np.int64))
    with guard(fake, "log", stream=out) as g:
        x.get()
    text = out.getvalue()
    assert g.staging_count == 1
    assert "staging 40 B via cupy.ndarray.get" in text and f"{HERE}:" in text


def test_count_mode_prints_nothing(fake, capsys):
    with guard(fake):
        FakeArray(np.zeros(2)).get()
    assert capsys.readouterr().err == ""


def test_disallow_raises_naming_the_site_before_the_transfer(fake):
    x = FakeArray(np.zeros(4, np.float32))
    with guard(fake, "disallow") as g:
        planted_line = sys._getframe().f_lineno + 2
        with pytest.raises(TransferGuardError) as info:
            x.get()  # planted
    assert x.gets == 0, "the transfer must not happen"
    assert info.value.field == "site"
    assert f"{HERE}:{planted_line} " in str(info.value)
    assert "cupy.ndarray.get" in str(info.value) and "16 bytes" in str(info.value)
    assert g.staging_count == 1


@pytest.mark.claim("readback_budget")
def test_sanctioned_readback_counts_as_readback_and_passes_disallow(fake):
    x = FakeArray(np.zeros(3, np.int32))
    with guard(fake, "disallow") as g:
        with sanctioned_readback("token_id"):
            x.get()
        with sanctioned_readback("accept_count"):
            int(FakeArray(np.int32(2)))
    assert g.staging_count == 0
    assert g.readback_bytes == {"token_id": 12, "accept_count": 4, "logits_audit": 0}
    assert g.readback_count == {"token_id": 1, "accept_count": 1, "logits_audit": 0}
    assert [e.kind for e in g.events] == ["readback", "readback"]


@pytest.mark.claim("readback_budget")
def test_one_copy_of_two_purposes_is_split_evenly_and_an_uneven_one_kept_whole(fake):
    """The accept reads its count and bonus id in one 8-byte copy: one event a purpose, 4
    bytes each; a copy that does not split evenly stays one event, every byte counted."""
    with guard(fake, "disallow") as g:
        with sanctioned_readback("accept_count", "token_id"):
            FakeArray(np.zeros(2, np.int32)).get()
        with sanctioned_readback("accept_count", "token_id"):
            FakeArray(np.zeros(3, np.int8)).get()
    assert [(e.purpose, e.nbytes) for e in g.events] == [
        ("accept_count", 4), ("token_id", 4), ("accept_count", 3)]
    assert g.readback_bytes == {"token_id": 4, "accept_count": 7, "logits_audit": 0}
    assert g.staging_count == 0
    with pytest.raises(ValueError, match="'logits' is not sanctioned"):
        with sanctioned_readback("token_id", "logits"):
            pass


@pytest.mark.claim("readback_budget")
def test_sanctioned_readback_refuses_unknown_purposes():
    with pytest.raises(ValueError, match="not sanctioned"):
        with sanctioned_readback("logits"):
            pass


def test_patches_are_restored_on_exit_and_on_error(fake):
    before = patched_state(fake)
    with guard(fake) as g:
        assert vars(FakeArray)["get"] is not before[0]["get"]
        assert "cupy.ndarray.get" in g.intercepted and "cupy.cuda.runtime.memcpy" in g.intercepted
    assert patched_state(fake) == before
    with pytest.raises(ZeroDivisionError):
        with guard(fake, "disallow"):
            1 / 0
    assert patched_state(fake) == before
    x = FakeArray(np.zeros(2))
    x.get()  # no guard active: the original, uncounted
    assert x.gets == 1


def test_names_only_on_a_base_class_are_removed_not_left_behind(fake):
    class Sub(FakeArray):
        pass

    sub_fake = SimpleNamespace(ndarray=Sub)
    assert "get" not in vars(Sub)
    with transfer_guard(targets=[cupy_target(sub_fake)]) as g:
        Sub(np.zeros(2)).get()
        assert "get" in vars(Sub)
    assert "get" not in vars(Sub) and g.staging_count == 1


def test_nested_guards_count_separately_and_restore_once_all_exit(fake):
    before = patched_state(fake)
    x = FakeArray(np.zeros(2, np.float32))
    with guard(fake) as outer:
        x.get()
        with guard(fake) as inner:
            x.tolist()
        assert patched_state(fake) != before  # the outer guard still holds the patches
        x.tobytes()
    assert patched_state(fake) == before
    assert [e.path for e in outer.events] == ["cupy.ndarray.get", "cupy.ndarray.tolist",
                                              "cupy.ndarray.tobytes"]
    assert [e.path for e in inner.events] == ["cupy.ndarray.tolist"]


def test_an_inner_disallow_guard_refuses_and_both_record(fake):
    x = FakeArray(np.zeros(2, np.float32))
    with guard(fake) as outer:
        with guard(fake, "disallow") as inner:
            with pytest.raises(TransferGuardError):
                x.get()
        x.get()  # the disallowing guard is gone: allowed again
    assert outer.staging_count == 2 and inner.staging_count == 1
    assert x.gets == 1


def test_events_from_other_threads_are_counted(fake):
    x = FakeArray(np.zeros(8, np.uint8))
    with guard(fake) as g:
        t = threading.Thread(target=x.get)
        t.start()
        t.join()
    assert g.staging_bytes == 8


def test_a_guard_is_single_use_and_checks_its_mode(fake):
    with pytest.raises(ValueError, match="mode"):
        transfer_guard("warn")
    g = guard(fake)
    with g:
        pass
    with pytest.raises(RuntimeError):
        with g:
            pass


def test_to_dict_is_evidence_ready(fake):
    with guard(fake) as g:
        FakeArray(np.zeros(2, np.float32)).get()
    d = g.to_dict()
    assert d["staging_count"] == 1 and d["staging_bytes"] == 8
    assert d["events"][0]["path"] == "cupy.ndarray.get"


# -- real CuPy: what gets patched, and that it comes off ---------------------------------------
# Needs only CuPy's import, but CuPy is installed only where a GPU is: marked gpu so that the
# nightly GPU run (--require-gpu) runs it instead of letting it skip.
@pytest.mark.gpu
def test_real_cupy_patch_list_and_exact_restore(cp):
    cupy = cp
    target = cupy_target(cupy)
    paths = {p.path for p in target.points}
    for name in ("get", "item", "tolist", "tobytes", "__int__", "__float__", "__bool__",
                 "__complex__", "__repr__", "__str__", "__format__", "__reduce__",
                 "__array__", "__dlpack__"):
        assert f"cupy.ndarray.{name}" in paths
    assert {"cupy.asnumpy", "cupy.cuda.runtime.memcpy", "cupy.cuda.runtime.memcpyAsync"} <= paths
    before = (dict(vars(cupy.ndarray)), cupy.asnumpy, cupy.cuda.runtime.memcpy)
    with transfer_guard() as g:
        assert g.refused_patches == []
        assert vars(cupy.ndarray)["get"].__lockstep_intercepted__
    assert (dict(vars(cupy.ndarray)), cupy.asnumpy, cupy.cuda.runtime.memcpy) == before


# -- real CuPy on a GPU ------------------------------------------------------------------------


GPU_PATHS = [
    ("cupy.ndarray.get", lambda cp, x, s: x.get(), 24),
    ("cupy.ndarray.get", lambda cp, x, s: x.get(stream=cp.cuda.Stream(), blocking=False), 24),
    ("cupy.asnumpy", lambda cp, x, s: cp.asnumpy(x), 24),
    ("cupy.ndarray.item", lambda cp, x, s: s.item(), 4),
    ("cupy.ndarray.tolist", lambda cp, x, s: x.tolist(), 24),
    ("cupy.ndarray.tobytes", lambda cp, x, s: x.tobytes(), 24),
    ("cupy.ndarray.__int__", lambda cp, x, s: int(s), 4),
    ("cupy.ndarray.__float__", lambda cp, x, s: float(s), 4),
    ("cupy.ndarray.__complex__", lambda cp, x, s: complex(s), 4),
    ("cupy.ndarray.__bool__", lambda cp, x, s: bool(s), 4),
    ("cupy.ndarray.__repr__", lambda cp, x, s: repr(x), 24),
    ("cupy.ndarray.__str__", lambda cp, x, s: str(x), 24),
    ("cupy.ndarray.__format__", lambda cp, x, s: f"{s:.2f}", 4),
    ("cupy.ndarray.__reduce__", lambda cp, x, s: pickle.dumps(x), 24),
    ("cupy.ndarray.__dlpack__", lambda cp, x, s: np.from_dlpack(x, device="cpu"), 24),
    ("cupy.cuda.runtime.memcpy", lambda cp, x, s: cp.cuda.runtime.memcpy(
        np.empty(6, np.float32).ctypes.data, x.data.ptr, 24, MEMCPY_DEVICE_TO_HOST), 24),
    ("cupy.cuda.runtime.memcpyAsync", lambda cp, x, s: cp.cuda.runtime.memcpyAsync(
        np.empty(6, np.float32).ctypes.data, x.data.ptr, 24, MEMCPY_DEVICE_TO_HOST, 0), 24),
    ("cupy.cuda.runtime.memcpy", lambda cp, x, s: cp.cuda.runtime.memcpy(
        np.empty(6, np.float32).ctypes.data, x.data.ptr, 24, MEMCPY_DEFAULT), 24),
]


@pytest.mark.gpu
@pytest.mark.parametrize("path,call,nbytes", GPU_PATHS, ids=[f"{i}-{p[0]}" for i, p in
                                                             enumerate(GPU_PATHS)])
def test_gpu_each_path_counted_with_bytes_and_site(cp, path, call, nbytes):
    x = cp.arange(6, dtype=cp.float32).reshape(2, 3)
    s = cp.ones((), dtype=cp.float32)
    cp.cuda.Device().synchronize()
    with transfer_guard() as g:
        call(cp, x, s)
    cp.cuda.Device().synchronize()
    assert [e.path for e in g.events] == [path]
    assert g.events[0].nbytes == nbytes
    assert g.events[0].site.startswith(f"{HERE}:{line_of(call)} ")


@pytest.mark.gpu
def test_gpu_device_work_is_not_counted(cp):
    with transfer_guard("disallow") as g:
        x = cp.arange(1000, dtype=cp.float32)
        y = (x * 2).sum()
        z = cp.asarray(np.ones(3))  # host to device is not a readback
        x[2:5] = z
        cp.cuda.runtime.memcpy(x.data.ptr, z.data.ptr, 8, 3)  # device to device
        y.copy()
    assert g.events == []


@pytest.mark.gpu
def test_gpu_planted_get_is_caught_naming_the_site(cp):
    x = cp.ones(4, dtype=cp.float32)
    with transfer_guard("disallow"):
        line = sys._getframe().f_lineno + 2
        with pytest.raises(TransferGuardError) as info:
            x.get()  # planted
    assert f"{HERE}:{line} " in str(info.value)


@pytest.mark.gpu
def test_gpu_cupy_internal_readbacks_are_seen(cp):
    """CuPy code that reads a device value itself (boolean-mask indexing learns its output
    size from the device) goes through ``get`` and is counted as staging."""
    x = cp.arange(10, dtype=cp.float32)
    with transfer_guard() as g:
        x[x > 4]
    assert g.staging_count >= 1, "boolean-mask indexing reads its size back"


@pytest.mark.claim("readback_budget")
@pytest.mark.gpu
def test_gpu_sanctioned_readback_is_readback(cp):
    ids = cp.arange(3, dtype=cp.int32)
    with transfer_guard("disallow") as g:
        with sanctioned_readback("token_id"):
            ids.get()
    assert g.readback_bytes["token_id"] == 12 and g.staging_count == 0
