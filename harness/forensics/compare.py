"""Errors against the arbiter, and the noise floor each one is judged against.

A node's *error* is the largest absolute difference between a run's value and the
arbiter's (float64) value of the same node; a shape that differs, or a non-finite entry
where the other side is finite (or a different non-finite), is an infinite error.

A node's *noise floor* is measured, not assumed: the same node's error in two correct
float32 executions of the same step on the correct inputs, the arbiter's own float32
execution (the native executor without the float64 cast) and onnxruntime's CPU provider.
The floor is ``FACTOR`` times the larger of the two, and never below the per-op absolute
entry of the value's dtype in ``engines/tolerances.py`` (``max_abs``: 1e-4 for float32,
1e-2 float16, 5e-2 bfloat16); integer and boolean values (positions, masks, shapes) have
an absolute floor of 0: they must match exactly unless a correct run also differs. The
floor thus grows with depth exactly as rounding does in real executions, and a node is
*out of the floor* when its error exceeds it.
"""
from __future__ import annotations

import math

import numpy as np

from engines.tolerances import TABLE

FACTOR = 8.0


def max_abs_error(value, reference) -> tuple[float, str | None]:
    """(max |value - reference|, note); inf with a note for shape or non-finite mismatches."""
    x = np.asarray(value)
    ref = np.asarray(reference)
    if x.shape != ref.shape:
        return math.inf, f"shape {tuple(x.shape)} where the arbiter has {tuple(ref.shape)}"
    if x.size == 0:
        return 0.0, None
    xf = x.astype(np.float64)
    rf = ref.astype(np.float64)
    if x.dtype.kind in "biu" and ref.dtype.kind in "biu":
        return float(np.abs(xf - rf).max()), None
    fx, fr = np.isfinite(xf), np.isfinite(rf)
    both_nan = np.isnan(xf) & np.isnan(rf)
    same_inf = ~fx & ~fr & (xf == rf)
    bad = ~(fx & fr) & ~both_nan & ~same_inf
    if bad.any():
        n = int(bad.sum())
        return math.inf, f"{n} non-finite entr{'y' if n == 1 else 'ies'} where the arbiter " \
                         f"differs"
    ok = fx & fr
    if not ok.any():
        return 0.0, None
    return float(np.abs(xf[ok] - rf[ok]).max()), None


def scale_of(reference) -> float:
    ref = np.asarray(reference)
    if ref.size == 0:
        return 0.0
    rf = ref.astype(np.float64)
    rf = rf[np.isfinite(rf)]
    return float(np.abs(rf).max()) if rf.size else 0.0


def dtype_name(value) -> str:
    return np.asarray(value).dtype.name


def absolute_floor(dtype: str) -> float:
    """The per-dtype absolute floor: ``tolerances.TABLE[dtype].max_abs``; 0 for integers."""
    try:
        kind = np.dtype(dtype).kind
    except TypeError:  # a name numpy does not know without ml_dtypes: a float
        kind = "f"
    if kind in "biu":
        return 0.0
    row = TABLE.get(dtype)
    return row.max_abs if row is not None else TABLE["float32"].max_abs


def noise_floor(dtype: str, spreads, factor: float = FACTOR) -> float:
    """``factor`` x the larger measured spread, at least the dtype's absolute floor."""
    measured = [s for s in spreads if s is not None]
    spread = max(measured) if measured else 0.0
    return max(factor * spread, absolute_floor(dtype))
