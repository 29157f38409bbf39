"""NumpyArrayBackend's reductions are batch-invariant, bit for bit.

Row i of an M-row matmul or sum equals the 1-row result for every M, the sum over K runs
in one fixed sequential order (checked against a scalar loop), and appending zero columns
to a sum (what masked attention does) never changes it.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from engines.native.array_backend import NumpyArrayBackend

pytestmark = pytest.mark.claim("batch_invariance")
BE = NumpyArrayBackend()
DTYPES = (np.float32, np.float16)
_UINT = {np.dtype(np.float32): np.uint32, np.dtype(np.float16): np.uint16}


def bits(x: np.ndarray) -> np.ndarray:
    """The raw bit patterns, so -0.0 != +0.0 and NaN payloads count."""
    return np.ascontiguousarray(x).view(_UINT[x.dtype])


def floats_of(dtype, shape):
    half = np.dtype(dtype) == np.float16
    bound = 8 if half else 64  # float16 sums of up to 64 * 8 * 8 stay finite
    elements = st.floats(-bound, bound, width=16 if half else 32, allow_nan=False,
                         allow_infinity=False)
    return arrays(dtype, shape, elements=elements)


@st.composite
def matmul_operands(draw):
    dtype = draw(st.sampled_from(DTYPES))
    m = draw(st.integers(1, 9))
    k = draw(st.integers(1, 64))
    n = draw(st.integers(1, 8))
    batch = draw(st.sampled_from([(), (2,)]))
    a = draw(floats_of(dtype, batch + (m, k)))
    b = draw(floats_of(dtype, (k, n)))
    return a, b


@given(matmul_operands())
def test_matmul_row_equals_single_row_result(operands):
    a, b = operands
    full = BE.matmul(a, b)
    assert full.dtype == a.dtype and full.shape == a.shape[:-1] + b.shape[-1:]
    for i in range(a.shape[-2]):
        single = BE.matmul(a[..., i:i + 1, :], b)
        np.testing.assert_array_equal(bits(full[..., i, :]), bits(single[..., 0, :]))


@given(matmul_operands())
def test_matmul_reduces_over_k_in_sequential_order(operands):
    a, b = operands
    full = BE.matmul(a, b)
    acc_type = np.float32  # float16 accumulates in float32, rounded once at the end
    a2, b2 = a.reshape(-1, a.shape[-1]), b
    flat = full.reshape(-1, b.shape[-1])
    for i in (0, a2.shape[0] - 1):
        for j in (0, b2.shape[1] - 1):
            acc = acc_type(0)
            for k in range(a2.shape[1]):
                acc = acc_type(acc + acc_type(acc_type(a2[i, k]) * acc_type(b2[k, j])))
            assert bits(np.array([acc], dtype=a.dtype))[0] == bits(flat[i:i + 1, j])[0]


@st.composite
def sum_operands(draw):
    dtype = draw(st.sampled_from(DTYPES))
    m = draw(st.integers(1, 9))
    k = draw(st.integers(0, 300))
    pad = draw(st.integers(1, 200))
    x = draw(floats_of(dtype, (m, k)))
    return x, pad


@given(sum_operands())
def test_sum_row_equals_single_row_result(operands):
    x, _ = operands
    full = BE.sum(x, axis=-1)
    assert full.dtype == x.dtype and full.shape == x.shape[:1]
    for i in range(x.shape[0]):
        np.testing.assert_array_equal(bits(full[i:i + 1]), bits(BE.sum(x[i:i + 1], axis=1)))


@given(sum_operands())
def test_sum_adds_in_sequential_order(operands):
    x, _ = operands
    full = BE.sum(x, axis=1)
    for i in (0, x.shape[0] - 1):
        acc = np.float32(0)  # float16 accumulates in float32, rounded once at the end
        for k in range(x.shape[1]):
            acc = np.float32(acc + np.float32(x[i, k]))
        assert bits(np.array([acc], dtype=x.dtype))[0] == bits(full[i:i + 1])[0]


@given(sum_operands())
def test_sum_ignores_appended_zero_columns(operands):
    x, pad = operands
    padded = np.concatenate([x, np.zeros((x.shape[0], pad), dtype=x.dtype)], axis=1)
    np.testing.assert_array_equal(bits(BE.sum(padded, axis=1, keepdims=True)),
                                  bits(BE.sum(x, axis=1, keepdims=True)))


@given(sum_operands())
def test_sum_along_rows_ignores_appended_zero_rows(operands):
    x, pad = operands
    padded = np.concatenate([x, np.zeros((pad, x.shape[1]), dtype=x.dtype)], axis=0)
    np.testing.assert_array_equal(bits(BE.sum(padded, axis=0)), bits(BE.sum(x, axis=0)))
