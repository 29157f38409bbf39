"""The one tolerance table: tensors per dtype with the metric named; tokens are exact.

``near_tie_margin`` is how far below the oracle's best logit (on the engine's own prefix) an
engine's token may be and still pass as a ``near-tie`` rather than a ``defect``. Fixture
builders reject any seed whose oracle margin falls below it, so on fixtures token identity
is a hard claim.

``logits_max_abs`` and ``logits_nmse`` bound a whole model's logits row against the
oracle's (the logits audit, claim 1b): unlike a single op's output they carry the rounding
of every layer, so they have their own row entries. float32: native-host against ort-cpu
on SmolLM2 (30 layers) differs by up to 2e-4 absolute, NMSE 4e-10; a logits row rounded
through float16 differs by about 8e-3 at |logit| 16 and NMSE about 1e-7, so both bounds
separate the two. The float16 and bfloat16 logits entries are a few ulps of a logit of
magnitude 30 in that dtype, not yet measured on a real checkpoint.
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
    near_tie_margin: float  # metric: oracle's best logit minus the engine token's logit
    logits_max_abs: float  # metric, a logits row: max |engine - oracle| (no relative part)
    logits_nmse: float  # metric, a logits row: sum((a-b)^2) / sum(b^2)

    @property
    def logits(self) -> "Tolerance":
        """This row's logits bounds as a tensor tolerance (``compare_tensors`` takes it)."""
        return Tolerance(self.dtype, self.logits_max_abs, 0.0, self.logits_nmse,
                         self.near_tie_margin, self.logits_max_abs, self.logits_nmse)


TABLE: dict[str, Tolerance] = {
    "float64": Tolerance("float64", max_abs=1e-9, max_rel=1e-9, nmse=1e-18, near_tie_margin=1e-6,
                         logits_max_abs=1e-9, logits_nmse=1e-18),
    "float32": Tolerance("float32", max_abs=1e-4, max_rel=1e-3, nmse=1e-8, near_tie_margin=1e-2,
                         logits_max_abs=1e-3, logits_nmse=1e-8),
    "float16": Tolerance("float16", max_abs=1e-2, max_rel=1e-2, nmse=1e-4, near_tie_margin=5e-2,
                         logits_max_abs=1e-1, logits_nmse=1e-4),
    "bfloat16": Tolerance("bfloat16", max_abs=5e-2, max_rel=5e-2, nmse=1e-3, near_tie_margin=1e-1,
                          logits_max_abs=5e-1, logits_nmse=1e-3),
}

TOKENS = "exact"


def tolerance_for(dtype) -> Tolerance:
    """The row for a dtype name or numpy dtype; an unknown dtype is an error, never a default."""
    name = dtype if isinstance(dtype, str) else np.dtype(dtype).name
    try:
        return TABLE[name]
    except KeyError:
        raise KeyError(f"no tolerance row for dtype {name!r}; rows: {', '.join(TABLE)}") from None
