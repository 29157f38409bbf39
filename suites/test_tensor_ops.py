"""Claim 8, host half: HostTensorOps equals a straightforward numpy reference.

The cases (strategies, how each op is applied, the reference) and the error table are
defined once here; ``test_tensor_ops_cuda.py`` imports them and compares CudaTensorOps with
HostTensorOps element for element over the same draws.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from engines.errors import InputError, LockstepError, ResidencyError
from engines.ledger import Ledger
from engines.tensor_ops import SUPPORTED_DTYPES, HostTensorOps, TensorOps

pytestmark = pytest.mark.claim("tensor_ops")
DTYPE_NAMES = tuple(SUPPORTED_DTYPES)
LAYOUTS = ("contiguous", "step2", "transposed", "reversed")
_FLOAT_POOL = np.array([0.0, -0.0, 1.0, -1.0, 0.5, 2.0, 2.0, 3.0, np.inf, -np.inf, np.nan,
                        np.nan, 1e-3, -65504.0, 6e-8], dtype=np.float32)
_INT_POOL = {"int32": np.array([0, 1, -1, 2, 2, 7, -8, 2**31 - 1, -2**31], dtype=np.int64),
             "int64": np.array([0, 1, -1, 2, 2, 7, -8, 2**40, -2**62, 2**63 - 1], dtype=np.int64)}


def make_values(shape: tuple[int, ...], name: str, seed: int) -> np.ndarray:
    """Values drawn from a small pool (ties are common) with NaN, +-inf and signed zeros."""
    rng = np.random.default_rng(seed)
    dtype = SUPPORTED_DTYPES[name]
    if name == "bool":
        return rng.integers(0, 2, size=shape).astype(dtype)
    pool = _INT_POOL.get(name, _FLOAT_POOL)
    return rng.choice(pool, size=shape).astype(dtype)


@dataclass(frozen=True)
class ArraySpec:
    """An input array: its logical values and the memory layout it is presented in."""
    values: np.ndarray
    layout: str

    def base(self) -> np.ndarray:
        """A host buffer whose ``view`` equals ``values`` (gaps hold junk, never read)."""
        v = self.values
        if self.layout == "step2":
            junk = np.full((2 * v.shape[0],) + v.shape[1:], 7, dtype=np.int64).astype(v.dtype)
            junk[::2] = v
            return junk
        if self.layout == "transposed":
            return np.ascontiguousarray(v.T)
        if self.layout == "reversed":
            return np.ascontiguousarray(v[::-1])
        return v.copy()

    def view(self, base: Any) -> Any:
        """The same view operation on a numpy or CuPy buffer."""
        if self.layout == "step2":
            return base[::2]
        if self.layout == "transposed":
            return base.T
        if self.layout == "reversed":
            return base[::-1]
        return base

    def host(self) -> np.ndarray:
        return self.view(self.base())

    def on(self, ops: TensorOps) -> Any:
        """The array as ``ops`` holds it: the base adopted, then viewed."""
        return self.view(ops.adopt(self.base()))


@st.composite
def array_specs(draw, min_rank: int = 1, max_rank: int = 5, dtype: str | None = None,
                shape: tuple[int, ...] | None = None, max_extent: int = 9) -> ArraySpec:
    if shape is None:
        rank = draw(st.integers(min_rank, max_rank))
        shape = tuple(draw(st.lists(st.integers(0, max_extent), min_size=rank, max_size=rank)))
    name = dtype or draw(st.sampled_from(DTYPE_NAMES))
    seed = draw(st.integers(0, 2**32 - 1))
    return ArraySpec(make_values(shape, name, seed), draw(st.sampled_from(LAYOUTS)))


def outcome(fn: Callable[[], Any]) -> tuple[str, Any]:
    """("ok", result) or (error class, field): what both backends must agree on."""
    try:
        return "ok", fn()
    except LockstepError as err:
        return type(err).__name__, err.field


# -- the cases: draw inputs, apply an op, and the numpy reference -----------------------------
@dataclass(frozen=True)
class OpCase:
    name: str
    draw: Callable[[Any], dict]              # Hypothesis data -> inputs (ArraySpecs + scalars)
    apply: Callable[[TensorOps, dict], Any]  # ops, materialized inputs -> result
    reference: Callable[[dict], Any]         # host inputs -> expected result


def materialize(inputs: dict, ops: TensorOps) -> dict:
    return {k: (v.on(ops) if isinstance(v, ArraySpec) else v) for k, v in inputs.items()}


def host_inputs(inputs: dict) -> dict:
    return {k: (v.host() if isinstance(v, ArraySpec) else v) for k, v in inputs.items()}


def _window(v: np.ndarray, axis: int, start: int, length: int) -> np.ndarray:
    return v[(slice(None),) * (axis % v.ndim) + (slice(start, start + length),)]


def draw_slice(data) -> dict:
    spec = data.draw(array_specs())
    rank = spec.values.ndim
    axis = data.draw(st.integers(-rank, rank - 1))
    n = spec.values.shape[axis]
    start = data.draw(st.integers(0, n))
    return {"v": spec, "axis": axis, "start": start,
            "length": data.draw(st.integers(0, n - start))}


def draw_last(data) -> dict:
    spec = data.draw(array_specs())
    axes = [a for a, n in enumerate(spec.values.shape) if n > 0]
    assume(axes)
    return {"v": spec, "axis": data.draw(st.sampled_from(axes))}


def draw_truncate(data) -> dict:
    spec = data.draw(array_specs())
    axis = data.draw(st.integers(0, spec.values.ndim - 1))
    return {"v": spec, "axis": axis,
            "length": data.draw(st.integers(0, spec.values.shape[axis]))}


def draw_gather(data) -> dict:
    table = data.draw(array_specs(min_rank=1, max_rank=3))
    rows = table.values.shape[0]
    ids = data.draw(st.lists(st.integers(0, rows - 1), max_size=12)) if rows else []
    as_array = data.draw(st.booleans())
    return {"table": table, "ids": np.asarray(ids, dtype=np.int64) if as_array else ids}


def draw_scatter(data) -> dict:
    dst = data.draw(array_specs(min_rank=1, max_rank=4))
    name = dst.values.dtype.name
    width = data.draw(st.integers(0, dst.values.shape[-1]))
    src = data.draw(array_specs(dtype=name, shape=dst.values.shape[:-1] + (width,)))
    offset = data.draw(st.integers(0, dst.values.shape[-1] - width))
    return {"dst": dst, "offset": offset, "src": src}


def ref_scatter(i: dict) -> np.ndarray:
    out = i["dst"].copy()
    out[..., i["offset"]:i["offset"] + i["src"].shape[-1]] = i["src"]
    return out


def draw_zeros(data) -> dict:
    rank = data.draw(st.integers(0, 5))
    shape = tuple(data.draw(st.lists(st.integers(0, 9), min_size=rank, max_size=rank)))
    return {"shape": shape, "dtype": data.draw(st.sampled_from(DTYPE_NAMES))}


def draw_argmax(data) -> dict:
    r = data.draw(st.integers(1, 9))
    vocab = data.draw(st.sampled_from([1, 2, 3, 7, 64, 255, 256, 257, 600]))
    spec = data.draw(array_specs(shape=(r, vocab)))
    return {"logits2d": spec, "rows": data.draw(st.integers(0, r))}


def ref_argmax(i: dict) -> tuple[str, Any]:
    """A plain loop: first index of the largest non-NaN value; an all-NaN row is an error."""
    x, out = i["logits2d"], []
    for r in range(i["rows"]):
        best, best_j = None, -1
        for j in range(x.shape[1]):
            v = x[r, j].item() if x.dtype.kind in "iub" else float(x[r, j])
            if v != v:
                continue
            if best_j < 0 or v > best:
                best, best_j = v, j
        if best_j < 0:
            return "InputError", "logits2d"
        out.append(best_j)
    return "ok", out


def draw_adopt(data) -> dict:
    return {"host_array": data.draw(array_specs()).host()}


def draw_copy_into(data) -> dict:
    dst = data.draw(array_specs(max_rank=4))
    src = data.draw(array_specs(dtype=dst.values.dtype.name, shape=dst.values.shape))
    return {"dst": dst, "src": src}


def draw_accept(data) -> dict:
    """Logits rows and drafts that agree with the rows' argmax for a drawn prefix."""
    inputs = draw_argmax(data)
    rows, vocab = inputs["logits2d"].values.shape
    width = data.draw(st.integers(0, rows - 1))
    status, best = ref_argmax({"logits2d": inputs["logits2d"].values, "rows": rows})
    agree = data.draw(st.integers(0, width))
    drafts = data.draw(st.lists(st.integers(0, vocab - 1), min_size=width, max_size=width))
    if status == "ok":
        drafts[:agree] = best[:agree]
    return {"logits2d": inputs["logits2d"], "drafts": drafts}


def ref_accept(i: dict) -> tuple[str, Any]:
    """The agreeing prefix of row argmaxes and drafts, and the next row's argmax."""
    drafts = i["drafts"]
    n = 0
    while True:
        status, best = ref_argmax({"logits2d": i["logits2d"][n:n + 1], "rows": 1})
        if status != "ok":
            return status, best
        if n == len(drafts) or best[0] != drafts[n]:
            return "ok", (n, best[0])
        n += 1


CASES: dict[str, OpCase] = {c.name: c for c in [
    OpCase("slice_axis", draw_slice,
           lambda o, i: o.slice_axis(i["v"], i["axis"], i["start"], i["length"]),
           lambda i: _window(i["v"], i["axis"], i["start"], i["length"])),
    OpCase("last_along_axis", draw_last,
           lambda o, i: o.last_along_axis(i["v"], i["axis"]),
           lambda i: _window(i["v"], i["axis"], i["v"].shape[i["axis"]] - 1, 1)),
    OpCase("truncate_axis", draw_truncate,
           lambda o, i: o.truncate_axis(i["v"], i["axis"], i["length"]),
           lambda i: _window(i["v"], i["axis"], 0, i["length"])),
    OpCase("gather_rows", draw_gather,
           lambda o, i: o.gather_rows(i["table"], i["ids"]),
           lambda i: i["table"][np.asarray(i["ids"], dtype=np.int64).reshape(-1)]),
    OpCase("scatter_into_last_axis", draw_scatter,
           lambda o, i: o.scatter_into_last_axis(i["dst"], i["offset"], i["src"]),
           ref_scatter),
    OpCase("zeros", draw_zeros, lambda o, i: o.zeros(i["shape"], i["dtype"]),
           lambda i: np.zeros(i["shape"], SUPPORTED_DTYPES[i["dtype"]])),
    OpCase("argmax_rows", draw_argmax,
           lambda o, i: outcome(lambda: o.argmax_rows(i["logits2d"], i["rows"])), ref_argmax),
    OpCase("adopt", draw_adopt, lambda o, i: o.adopt(i["host_array"]),
           lambda i: i["host_array"]),
    OpCase("copy_into", draw_copy_into, lambda o, i: o.copy_into(i["dst"], i["src"]),
           lambda i: i["src"]),
    OpCase("accept_drafts", draw_accept,
           lambda o, i: outcome(lambda: o.accept_drafts(i["logits2d"], i["drafts"])),
           ref_accept),
]}


def assert_same_array(actual: Any, expected: np.ndarray) -> None:
    """Same type (host numpy), shape, dtype and bits."""
    assert isinstance(actual, np.ndarray), type(actual)
    assert actual.shape == expected.shape
    assert actual.dtype == expected.dtype
    assert np.ascontiguousarray(actual).tobytes() == np.ascontiguousarray(expected).tobytes()


def assert_same(actual: Any, expected: Any) -> None:
    if isinstance(expected, np.ndarray):
        assert_same_array(actual, expected)
    else:
        assert actual == expected


@pytest.fixture
def host_ops() -> HostTensorOps:
    return HostTensorOps(Ledger())


@pytest.mark.parametrize("name", list(CASES))
@given(data=st.data())
def test_host_ops_equal_numpy_reference(name, data):
    case = CASES[name]
    inputs = case.draw(data)
    ops = HostTensorOps(Ledger())
    result = case.apply(ops, materialize(inputs, ops))
    assert_same(result, case.reference(host_inputs(inputs)))
    assert ops.ledger.h2d_bytes == 0 and ops.ledger.readback_total == 0  # nothing crosses


# -- the view-or-copy rule and the empty rule -------------------------------------------------
@given(data=st.data())
def test_slice_is_a_view_exactly_when_leading_extents_are_one(data):
    inputs = draw_slice(data)
    ops = HostTensorOps(Ledger())
    v = inputs["v"].host()
    out = ops.slice_axis(v, inputs["axis"], inputs["start"], inputs["length"])
    axis = inputs["axis"] % v.ndim
    if out.size == 0:
        assert not np.shares_memory(out, v)
    elif math.prod(v.shape[:axis]) == 1:
        assert np.shares_memory(out, v)
    else:
        assert not np.shares_memory(out, v) and out.flags.c_contiguous


def test_view_and_copy_examples(host_ops):
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4)
    view = host_ops.slice_axis(x[:1], 1, 1, 2)
    assert np.shares_memory(view, x)
    copy = host_ops.slice_axis(x, 1, 1, 2)
    assert not np.shares_memory(copy, x)
    copy_full = host_ops.slice_axis(x, 2, 0, 4)  # a full window is still a copy
    assert not np.shares_memory(copy_full, x) and np.array_equal(copy_full, x)


def test_empty_results_are_host_empty_numpy(host_ops):
    x = np.ones((3, 4), dtype=np.float16)
    for out in (host_ops.slice_axis(x, 1, 2, 0), host_ops.truncate_axis(x, 0, 0),
                host_ops.gather_rows(x, []), host_ops.zeros((0, 5), "bfloat16")):
        assert isinstance(out, np.ndarray) and out.size == 0
    assert host_ops.zeros((0, 5), "bfloat16").dtype == ml_dtypes.bfloat16
    assert host_ops.argmax_rows(x, 0) == []


def test_scatter_is_in_place_and_returns_dst(host_ops):
    dst = np.zeros((2, 6), dtype=np.int32)
    out = host_ops.scatter_into_last_axis(dst, 2, np.arange(6, dtype=np.int32).reshape(2, 3))
    assert out is dst
    assert dst.tolist() == [[0, 0, 0, 1, 2, 0], [0, 0, 3, 4, 5, 0]]


def test_argmax_ties_nan_and_infinities(host_ops):
    nan, inf = np.nan, np.inf
    x = np.array([[1, 3, 3, 2], [nan, -inf, -inf, nan], [-0.0, 0.0, nan, -1],
                  [inf, nan, inf, 5], [nan, nan, nan, 2]], dtype=np.float32)
    for name in ("float32", "float16", "bfloat16"):
        assert host_ops.argmax_rows(x.astype(SUPPORTED_DTYPES[name]), 5) == [1, 1, 0, 0, 3]
    assert host_ops.argmax_rows(np.array([[False, True, True]]), 1) == [1]
    assert host_ops.argmax_rows(np.array([[2**62, 2**62 + 1, 7]], dtype=np.int64), 1) == [1]


# -- every error rule -------------------------------------------------------------------------
class FakeDeviceArray:
    """Looks like a CuPy array to ``residency_of`` (module under ``cupy``), holds nothing."""
    __module__ = "cupy._lockstep_test_double"

    def __init__(self, shape=(2, 3), dtype=np.float32):
        self.shape, self.dtype, self.ndim = shape, np.dtype(dtype), len(shape)
        self.size = math.prod(shape)
        self.device = type("Device", (), {"id": 0})()


# (name, call(ops, make), error class, field). ``make`` turns a host array into the ops' own.
ERROR_CASES: list[tuple[str, Callable[[TensorOps, Callable], Any], type, str]] = [
    ("slice negative start", lambda o, m: o.slice_axis(m(np.ones((2, 3), np.float32)), 1, -1, 1),
     InputError, "start"),
    ("slice negative length", lambda o, m: o.slice_axis(m(np.ones((2, 3), np.float32)), 1, 0, -1),
     InputError, "length"),
    ("slice past the end", lambda o, m: o.slice_axis(m(np.ones((2, 3), np.float32)), 1, 2, 2),
     InputError, "length"),
    ("slice axis out of range", lambda o, m: o.slice_axis(m(np.ones((2, 3), np.float32)), 2, 0, 1),
     InputError, "axis"),
    ("slice axis not an int", lambda o, m: o.slice_axis(m(np.ones((2, 3), np.float32)), 1.0, 0, 1),
     InputError, "axis"),
    ("slice start a bool", lambda o, m: o.slice_axis(m(np.ones((2, 3), np.float32)), 1, True, 1),
     InputError, "start"),
    ("last of an empty axis", lambda o, m: o.last_along_axis(m(np.ones((2, 0), np.float32)), 1),
     InputError, "axis"),
    ("truncate beyond extent", lambda o, m: o.truncate_axis(m(np.ones((2, 3), np.float32)), 0, 3),
     InputError, "length"),
    ("gather id == rows", lambda o, m: o.gather_rows(m(np.ones((4, 2), np.float32)), [0, 4]),
     InputError, "ids"),
    ("gather negative id", lambda o, m: o.gather_rows(m(np.ones((4, 2), np.float32)), [-1]),
     InputError, "ids"),
    ("gather huge id", lambda o, m: o.gather_rows(m(np.ones((4, 2), np.float32)), [2**70]),
     InputError, "ids"),
    ("gather uint64 id too big", lambda o, m: o.gather_rows(
        m(np.ones((4, 2), np.float32)), np.array([2**63 + 1], dtype=np.uint64)), InputError, "ids"),
    ("gather float ids", lambda o, m: o.gather_rows(
        m(np.ones((4, 2), np.float32)), np.array([1.0])),
     InputError, "ids"),
    ("gather float in list", lambda o, m: o.gather_rows(m(np.ones((4, 2), np.float32)), [1.5]),
     InputError, "ids"),
    ("gather bool ids", lambda o, m: o.gather_rows(m(np.ones((4, 2), np.float32)), [True]),
     InputError, "ids"),
    ("gather 2-D ids", lambda o, m: o.gather_rows(
        m(np.ones((4, 2), np.float32)), np.zeros((1, 1), int)),
     InputError, "ids"),
    ("gather from an empty table", lambda o, m: o.gather_rows(m(np.ones((0, 2), np.float32)), [0]),
     InputError, "ids"),
    ("scatter dtype mismatch", lambda o, m: o.scatter_into_last_axis(
        m(np.zeros((2, 4), np.float32)), 0, m(np.ones((2, 2), np.float16))),
     InputError, "src.dtype"),
    ("scatter row mismatch", lambda o, m: o.scatter_into_last_axis(
        m(np.zeros((2, 4), np.float32)), 0, m(np.ones((3, 2), np.float32))),
     InputError, "src.shape"),
    ("scatter rank mismatch", lambda o, m: o.scatter_into_last_axis(
        m(np.zeros((2, 4), np.float32)), 0, m(np.ones((2,), np.float32))),
     InputError, "src.shape"),
    ("scatter too wide", lambda o, m: o.scatter_into_last_axis(
        m(np.zeros((2, 4), np.float32)), 3, m(np.ones((2, 2), np.float32))),
     InputError, "offset"),
    ("scatter negative offset", lambda o, m: o.scatter_into_last_axis(
        m(np.zeros((2, 4), np.float32)), -1, m(np.ones((2, 2), np.float32))),
     InputError, "offset"),
    ("zeros unsupported dtype", lambda o, m: o.zeros((2,), "float64"), InputError, "dtype"),
    ("zeros negative extent", lambda o, m: o.zeros((2, -1), "int32"), InputError, "shape"),
    ("adopt unsupported dtype", lambda o, m: o.adopt(np.ones(2, np.complex64)),
     InputError, "dtype"),
    ("adopt a list", lambda o, m: o.adopt([1, 2]), InputError, "host_array"),
    ("argmax all-NaN row", lambda o, m: o.argmax_rows(
        m(np.array([[1, 2], [np.nan, np.nan]], np.float32)), 2), InputError, "logits2d"),
    ("argmax rows too many", lambda o, m: o.argmax_rows(m(np.ones((2, 3), np.float32)), 3),
     InputError, "rows"),
    ("argmax negative rows", lambda o, m: o.argmax_rows(m(np.ones((2, 3), np.float32)), -1),
     InputError, "rows"),
    ("argmax 3-D", lambda o, m: o.argmax_rows(m(np.ones((1, 2, 3), np.float32)), 1),
     InputError, "logits2d"),
    ("argmax zero vocab", lambda o, m: o.argmax_rows(m(np.ones((2, 0), np.float32)), 1),
     InputError, "logits2d"),
    ("argmax float64", lambda o, m: o.argmax_rows(m(np.ones((2, 3), np.float32)).astype(
        np.float64), 1), InputError, "dtype"),
    ("copy_into shape mismatch", lambda o, m: o.copy_into(
        m(np.zeros((2, 4), np.float32)), m(np.ones((2, 3), np.float32))), InputError, "src.shape"),
    ("copy_into dtype mismatch", lambda o, m: o.copy_into(
        m(np.zeros((2, 4), np.float32)), m(np.ones((2, 4), np.float16))), InputError, "src.dtype"),
    ("accept too few rows", lambda o, m: o.accept_drafts(
        m(np.ones((2, 3), np.float32)), [0, 1]), InputError, "drafts"),
    ("accept draft out of range", lambda o, m: o.accept_drafts(
        m(np.ones((3, 3), np.float32)), [0, 3]), InputError, "ids"),
    ("accept 3-D logits", lambda o, m: o.accept_drafts(
        m(np.ones((1, 2, 3), np.float32)), [0]), InputError, "logits2d"),
    ("accept all-NaN bonus row", lambda o, m: o.accept_drafts(
        m(np.array([[1, 2], [np.nan, np.nan]], np.float32)), [1]), InputError, "logits2d"),
    ("adopt_feeds of a list", lambda o, m: o.adopt_feeds([np.ones(2, np.int64), [1, 2]], "t"),
     InputError, "host_array"),
    ("adopt_feeds unsupported dtype", lambda o, m: o.adopt_feeds(
        [np.ones(2, np.complex64)], "t"), InputError, "dtype"),
    ("accept feed without the pending token", lambda o, m: o.accept_drafts(
        m(np.ones((3, 3), np.float32)), [0, 1], fed=m(np.array([[0, 1]], np.int64))),
     InputError, "fed"),
    ("accept int32 feed", lambda o, m: o.accept_drafts(
        m(np.ones((3, 3), np.float32)), [0, 1], fed=m(np.array([[2, 0, 1]], np.int32))),
     InputError, "fed"),
]


@pytest.mark.parametrize("name,call,error,field", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_host_error_rules(host_ops, name, call, error, field):
    with pytest.raises(error) as info:
        call(host_ops, lambda a: a)
    assert info.value.field == field
    assert field in str(info.value)


def test_out_of_range_ids_are_never_clamped_and_named(host_ops):
    with pytest.raises(InputError) as info:
        host_ops.gather_rows(np.ones((4, 2)), [1, 2, 9, 11])
    assert info.value.value == 9 and "2 id(s)" in str(info.value)
    assert "never clamped" in str(info.value)


def test_all_nan_error_names_the_row(host_ops):
    with pytest.raises(InputError, match="row 1 is all NaN"):
        host_ops.argmax_rows(np.array([[1, 2], [np.nan, np.nan]], dtype=np.float16), 2)


@pytest.mark.parametrize("call", [
    lambda o, d: o.slice_axis(d, 0, 0, 1),
    lambda o, d: o.last_along_axis(d, 0),
    lambda o, d: o.gather_rows(d, [0]),
    lambda o, d: o.gather_rows(np.ones((2, 3), np.float32), d),
    lambda o, d: o.scatter_into_last_axis(d, 0, np.ones((2, 1), np.float32)),
    lambda o, d: o.scatter_into_last_axis(np.ones((2, 3), np.float32), 0, d),
    lambda o, d: o.argmax_rows(d, 1),
    lambda o, d: o.adopt(d),
    lambda o, d: o.adopt_feeds([np.zeros((1, 2), np.int64), d], "target"),
])
def test_host_ops_refuse_device_values_naming_both_remedies(host_ops, call):
    with pytest.raises(ResidencyError) as info:
        call(host_ops, FakeDeviceArray())
    text = str(info.value)
    assert "cuda:0" in text
    assert "adopt" in text and "readback" in text and "host tensor ops" in text


def test_tensor_ops_need_a_ledger():
    with pytest.raises(InputError, match="Ledger"):
        HostTensorOps(ledger={})
