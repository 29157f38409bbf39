"""``dtype_name``: numpy's ``np.dtype(x).name`` for every way a launcher names a dtype,
remembered after the first ask (the eager native-cuda path asks thousands of times)."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from engines.native import dtype_names
from engines.native.dtype_names import dtype_name

KINDS = [np.dtype("float16"), "float32", np.float64, np.dtype(">f2"), np.dtype(np.int64),
         np.dtype(ml_dtypes.bfloat16), ml_dtypes.bfloat16, "bool"]


@pytest.mark.parametrize("kind", KINDS, ids=repr)
def test_the_name_is_numpys_and_is_remembered(kind):
    assert dtype_name(kind) == np.dtype(kind).name
    assert dtype_names._NAMES[kind] == np.dtype(kind).name
    assert dtype_name(kind) == np.dtype(kind).name  # from memory, the same


def test_a_structured_dtype_is_named_too_and_a_bad_one_is_numpys_error():
    pair = np.dtype([("a", "f4"), ("b", "i2")])
    assert dtype_name(pair) == pair.name
    with pytest.raises(TypeError):
        dtype_name("no-such-dtype")
    assert "no-such-dtype" not in dtype_names._NAMES
