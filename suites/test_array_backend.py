"""The host executor's matmul is the reduction order it states, whatever path computes it.

``NumpyArrayBackend.matmul`` promises element (i, j) = 0 + a[i,0]b[0,j] + a[i,1]b[1,j] + ...
in index order, in the accumulation dtype (float32 for the 16-bit floats). Small outputs are
computed with every product formed at once and one ``add.reduce`` over K; larger ones with one
rank-1 update per k. Both must equal the stated order bit for bit, NaN bits included, over
shapes, dtypes, batch broadcasting and the values that expose an order (negative zeros,
infinities, NaN, large cancellations): one M-row forward takes one path and an M=1 forward
may take the other, so batch invariance is only as good as this.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from engines.native.array_backend import _WIDEN, NumpyArrayBackend, matmul_shapes

BE = NumpyArrayBackend()
DTYPES = [np.dtype(np.float32), np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16),
          np.dtype(np.int64)]


def stated_order(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The specification, written out: a running sum from 0, one rank-1 update per k in
    order (elementwise, so each element's sum is its own; NaN sign and payload as the
    vector units propagate them in that order)."""
    out_dtype = np.result_type(a.dtype, b.dtype)
    acc_dtype = _WIDEN.get(out_dtype, out_dtype)
    a2 = (a[None, :] if a.ndim == 1 else a).astype(acc_dtype)
    b2 = (b[:, None] if b.ndim == 1 else b).astype(acc_dtype)
    batch = np.broadcast_shapes(a2.shape[:-2], b2.shape[:-2])
    out = np.zeros(batch + (a2.shape[-2], b2.shape[-1]), acc_dtype)
    with np.errstate(all="ignore"):
        for k in range(a2.shape[-1]):
            out += a2[..., :, k:k + 1] * b2[..., k:k + 1, :]
        return out.reshape(matmul_shapes(a.shape, b.shape)).astype(out_dtype)


SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan, 1e30, -1e30, 3.0, -3.0]


@st.composite
def operands(draw):
    dtype = draw(st.sampled_from(DTYPES))
    m, k, n = draw(st.integers(1, 5)), draw(st.integers(0, 40)), draw(st.integers(1, 6))
    batch = tuple(draw(st.lists(st.integers(1, 3), max_size=3)))
    # b's batch: a's, a suffix of it, or a's with some axes broadcast (size 1): a broadcast
    # operand changes the products' memory layout, which must not change the order
    b_batch = draw(st.sampled_from([batch, batch[1:], (),
                                    tuple(1 if draw(st.booleans()) else d for d in batch)]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))

    def values(shape):
        if dtype.kind == "i":
            return rng.integers(-50, 50, shape).astype(dtype)
        x = rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)
        if x.size and draw(st.booleans()):
            where = rng.integers(0, x.size, max(1, x.size // 4))
            x.flat[where] = rng.choice(SPECIAL, where.size)
        with np.errstate(over="ignore"):  # 1e30 is an infinity in the 16-bit floats
            return x.astype(dtype)

    a = values(batch + (m, k))
    b = values(b_batch + (k, n))
    # operands as the executor meets them: often views of another layout (a transposed q, k)
    a, b = (np.ascontiguousarray(np.moveaxis(x, -2, 0)).swapaxes(0, -2)
            if x.ndim > 1 and draw(st.booleans()) else x for x in (a, b))
    if draw(st.booleans()) and k:  # vector operands: ONNX MatMul's 1-d rules
        a = a.reshape(-1)[:k] if not batch and m == 1 else a
    return a, b


@settings(max_examples=150)  # cheap: thorough in CI too
@given(operands())
def test_matmul_is_its_stated_order_bit_for_bit(pair):
    a, b = pair
    with np.errstate(all="ignore"):
        got = BE.matmul(a, b)
    want = stated_order(a, b)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def test_both_paths_are_taken_and_agree_on_a_decode_step_shape():
    """A SmolLM2-sized GEMV (one row, 576 x 1536) takes the products-at-once path, the head
    (49,152 columns) the loop; each against the other's order on the same operands."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1, 576)).astype(np.float32)
    for n in (1536, 49152):
        b = rng.standard_normal((576, n)).astype(np.float32)
        got = BE.matmul(a, b)
        running = np.zeros((1, n), np.float32)
        for k in range(576):
            running += a[:, k:k + 1] * b[k:k + 1, :]
        assert got.tobytes() == running.tobytes()


def test_a_sum_of_negative_zeros_is_positive_zero_as_the_running_sum_gives():
    a = -np.zeros((2, 8), np.float32)
    b = np.ones((8, 3), np.float32)
    got = BE.matmul(a, b)
    assert not np.signbit(got).any()


def stated_sum(x: np.ndarray, axis: int) -> np.ndarray:
    """The specification of ``sum``: from +0, one slice of the axis at a time, in order."""
    acc_dtype = _WIDEN.get(x.dtype, x.dtype)
    shape = list(x.shape)
    shape[axis] = 1
    acc = np.zeros(shape, acc_dtype)
    with np.errstate(all="ignore"):
        for k in range(x.shape[axis]):
            acc += np.take(x, [k], axis=axis).astype(acc_dtype)
        return acc.reshape([s for i, s in enumerate(x.shape) if i != axis]).astype(x.dtype)


@st.composite
def summed(draw):
    dtype = draw(st.sampled_from(DTYPES[:3]))
    shape = tuple(draw(st.lists(st.integers(1, 9), min_size=1, max_size=4)))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 16)))
    x = rng.standard_normal(shape) * 10.0 ** rng.integers(-3, 4, shape)
    if draw(st.booleans()):
        where = rng.integers(0, x.size, max(1, x.size // 3))
        x.flat[where] = rng.choice(SPECIAL, where.size)
    with np.errstate(over="ignore"):
        return x.astype(dtype), draw(st.integers(0, len(shape) - 1))


@settings(max_examples=150)
@given(summed())
def test_sum_is_its_stated_order_bit_for_bit(case):
    x, axis = case
    with np.errstate(all="ignore"):
        got = BE.sum(x, axis)
    want = stated_sum(x, axis)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert got.tobytes() == want.tobytes()


def test_an_attention_shaped_product_of_transposed_views_keeps_the_order():
    """Seen on a fixture: scores = q @ k^T with q a [B, S, H, G, D] buffer viewed as
    [B, H, G, S, D] and k^T a transposed view broadcast over the query groups; numpy laid the
    products out with K innermost, where add.reduce sums pairwise (logits moved by 1e-5)."""
    rng = np.random.default_rng(3)
    a = rng.standard_normal((1, 5, 2, 2, 16)).astype(np.float32).transpose(0, 2, 3, 1, 4)
    b = rng.standard_normal((1, 2, 1, 5, 16)).astype(np.float32).swapaxes(-1, -2)
    assert a.strides[1:] == (128, 64, 256, 4) and b.strides[1:] == (320, 320, 4, 64)
    assert BE.matmul(a, b).tobytes() == stated_order(a, b).tobytes()


def test_a_kept_constant_is_widened_once_and_gives_the_same_bits(monkeypatch):
    """A float16 or bfloat16 constant (``keep_constant``) is widened at its first matmul and
    that float32 copy serves every later one, bit for bit what widening each time gives; a
    value not kept (an activation of the same dtype) is widened at every use, and past
    WIDENED_BYTES a kept constant is too."""
    from engines.native import array_backend

    rng = np.random.default_rng(3)
    for dtype in (np.float16, ml_dtypes.bfloat16):
        be, plain = NumpyArrayBackend(), NumpyArrayBackend()
        w = be.keep_constant(rng.standard_normal((64, 48)).astype(dtype))
        x = rng.standard_normal((3, 64)).astype(dtype)
        first = be.matmul(x, w)
        (entry,) = be._constants.values()
        assert entry[0] is w and entry[1].dtype == np.float32
        assert be._widened(w, np.dtype(np.float32)) is entry[1]  # kept, not made again
        assert be._widened(x, np.dtype(np.float32)) is not be._widened(x, np.dtype(np.float32))
        for _ in range(2):
            assert be.matmul(x, w).tobytes() == first.tobytes() == plain.matmul(x, w).tobytes()
    monkeypatch.setattr(array_backend, "WIDENED_BYTES", 100)
    be = NumpyArrayBackend()
    w = be.keep_constant(rng.standard_normal((64, 48)).astype(np.float16))
    be.matmul(rng.standard_normal((1, 64)).astype(np.float16), w)
    assert [entry[1] for entry in be._constants.values()] == [None] and be._widened_bytes == 0


def test_both_backends_implement_every_method_the_plan_calls():
    """The plan calls the protocol's methods on any backend without a fallback, so the device
    backend (importable without CuPy) must define each of them too."""
    import inspect

    from engines.native.array_backend import ArrayBackend
    from engines.native.cupy_array_backend import CupyArrayBackend

    methods = [name for name, _ in inspect.getmembers(ArrayBackend, inspect.isfunction)
               if not name.startswith("_")]
    assert "keep_constant" in methods and "matmul" in methods
    for cls in (NumpyArrayBackend, CupyArrayBackend):
        missing = [name for name in methods if not callable(getattr(cls, name, None))]
        assert not missing, (cls.__name__, missing)
