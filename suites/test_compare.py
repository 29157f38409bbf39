"""The comparators: exact tokens with margin-aware verdicts, tensors by the tolerance table."""
from __future__ import annotations

import numpy as np
import pytest

from engines.tolerances import TABLE, tolerance_for
from harness.compare import DEFECT, NEAR_TIE, compare_tensors, compare_tokens


def test_identical_streams_have_no_divergence():
    assert compare_tokens([1, 2, 3], [0.5, 0.5, 0.5], [1, 2, 3], 0.01) is None


@pytest.mark.parametrize("margin, verdict", [(0.001, NEAR_TIE), (0.5, DEFECT), (0.01, DEFECT)])
def test_verdict_follows_the_reference_margin_at_the_step(margin, verdict):
    div = compare_tokens([1, 2, 3, 4], [1.0, 1.0, margin, 1.0], [1, 2, 9, 4], 0.01)
    assert (div.step, div.reference_token, div.engine_token, div.verdict) == (2, 3, 9, verdict)
    assert div.margin == margin


def test_first_divergence_wins_even_if_later_steps_agree():
    div = compare_tokens([1, 2, 3], [1.0, 0.001, 1.0], [1, 7, 8], 0.01)
    assert div.step == 1 and div.verdict == NEAR_TIE


@pytest.mark.parametrize("ref, got", [([1, 2, 3], [1, 2]), ([1, 2], [1, 2, 3])])
def test_a_length_mismatch_is_a_defect(ref, got):
    div = compare_tokens(ref, [0.001] * len(ref), got, 0.01)
    assert div.step == 2 and div.verdict == DEFECT


def test_every_float_dtype_has_one_row_with_every_metric():
    for name, row in TABLE.items():
        assert row.dtype == name
        assert 0 < row.max_abs and 0 < row.max_rel and 0 < row.nmse and 0 < row.near_tie_margin
    with pytest.raises(KeyError, match="no tolerance row"):
        tolerance_for("int8")


def test_tensors_within_tolerance_pass_and_outside_fail():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(1000).astype(np.float32)
    tol = tolerance_for("float32")
    assert compare_tensors(ref + tol.max_abs / 10, ref).ok
    bad = ref.copy()
    bad[17] += 1.0
    result = compare_tensors(bad, ref)
    assert not result.ok and result.max_abs == pytest.approx(1.0, rel=1e-6)
    assert "nmse" in result.reason


def test_nan_never_passes_and_infinities_must_match_in_sign():
    ref = np.array([1.0, np.inf, -np.inf], dtype=np.float32)
    assert compare_tensors(ref.copy(), ref).ok
    assert not compare_tensors(np.array([1.0, np.inf, np.inf], np.float32), ref).ok
    nan = np.array([np.nan, 1.0], np.float32)
    assert not compare_tensors(nan, nan).ok
    assert not compare_tensors(np.ones(3, np.float32), np.ones(2, np.float32)).ok
