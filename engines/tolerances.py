"""The one tolerance table: tensors per dtype with the metric named; tokens are exact.

``near_tie_margin`` is the top-2 logit margin under which a divergence from the oracle is a
``near-tie`` rather than a ``defect``. Fixture builders reject any seed whose oracle margin
falls below it, so on fixtures token identity is a hard claim.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Tolerance:
    dtype: str
    max_abs: float  # metric, elementwise: |a - b| <= max_abs + max_rel * |b|  (allclose)
    max_rel: float  # (the relative part of the same elementwise bound)
    nmse: float  # metric, whole tensor: sum((a-b)^2) / sum(b^2)
    near_tie_margin: float  # metric: top-2 logit margin of the reference


TABLE: dict[str, Tolerance] = {
    "float64": Tolerance("float64", max_abs=1e-9, max_rel=1e-9, nmse=1e-18, near_tie_margin=1e-6),
    "float32": Tolerance("float32", max_abs=1e-4, max_rel=1e-3, nmse=1e-8, near_tie_margin=1e-2),
    "float16": Tolerance("float16", max_abs=1e-2, max_rel=1e-2, nmse=1e-4, near_tie_margin=5e-2),
    "bfloat16": Tolerance("bfloat16", max_abs=5e-2, max_rel=5e-2, nmse=1e-3, near_tie_margin=1e-1),
}

TOKENS = "exact"


def tolerance_for(dtype) -> Tolerance:
    """The row for a dtype name or numpy dtype; an unknown dtype is an error, never a default."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    try:
        return TABLE[name]
    except KeyError:
        raise KeyError(f"no tolerance row for dtype {name!r}; rows: {', '.join(TABLE)}") from None
