"""``broadcast_element_strides`` (the fused rotary launches' table strides, from metadata)
against numpy's own ``broadcast_to`` on the same shapes: equal element strides, 0 on every
axis of extent 1, and None exactly where numpy refuses."""
from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from engines.native.launch.rotary import broadcast_element_strides

dims = st.integers(min_value=1, max_value=5)


@st.composite
def table_and_shape(draw):
    shape = tuple(draw(st.lists(dims, min_size=1, max_size=4)))
    rank = draw(st.integers(min_value=1, max_value=len(shape) + 1))
    own = []
    for axis in range(rank):
        j = axis - (rank - len(shape))
        target = shape[j] if 0 <= j < len(shape) else 2
        own.append(draw(st.sampled_from([1, target, target + 1])))
    transpose = draw(st.booleans())
    return tuple(own), shape, transpose


@given(table_and_shape(), st.sampled_from([np.float16, np.float32]))
def test_strides_match_numpys_broadcast(case, dtype):
    own, shape, transpose = case
    table = np.zeros(own[::-1] if transpose else own, dtype=dtype)
    table = table.T if transpose else table  # strided, not C-contiguous
    got = broadcast_element_strides(tuple(table.shape), tuple(table.strides), table.itemsize,
                                    shape)
    try:
        view = np.broadcast_to(table, shape)
    except ValueError:
        assert got is None
        return
    assert got == tuple(0 if extent == 1 else s // view.itemsize
                        for extent, s in zip(shape, view.strides))
