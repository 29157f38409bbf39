"""Comparators: tensors against a reference, by the metrics of the one tolerance table.

Token streams are judged by ``harness.judgement.judge_stream`` (every token on the engine's own
prefix), not here."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from engines.tolerances import Tolerance, tolerance_for


@dataclass(frozen=True)
class TensorComparison:
    max_abs: float
    max_rel: float
    nmse: float
    ok: bool
    reason: str = ""


def compare_tensors(actual, expected, dtype=None, tol: Tolerance | None = None) -> TensorComparison:
    """Compare by the table's metrics: NaN never passes; infinities must match in sign."""
    a = np.asarray(actual)
    b = np.asarray(expected)
    tol = tol or tolerance_for(dtype or b.dtype)
    if a.shape != b.shape:
        return TensorComparison(np.inf, np.inf, np.inf, False, f"shape {a.shape} != {b.shape}")
    a = a.astype(np.float64)
    b = b.astype(np.float64)
    if np.isnan(a).any() or np.isnan(b).any():
        return TensorComparison(np.nan, np.nan, np.nan, False, "NaN present")
    inf_a, inf_b = np.isinf(a), np.isinf(b)
    if (inf_a != inf_b).any() or (np.sign(a[inf_a]) != np.sign(b[inf_b])).any():
        return TensorComparison(np.inf, np.inf, np.inf, False, "infinities differ")
    fin = ~inf_a
    diff = np.abs(a[fin] - b[fin])
    ref = np.abs(b[fin])
    max_abs = float(diff.max()) if diff.size else 0.0
    max_rel = float((diff / np.maximum(ref, np.finfo(np.float64).tiny)).max()) if diff.size else 0.0
    power = float((b[fin] ** 2).sum())
    nmse = float((diff ** 2).sum() / power) if power > 0 else float((diff ** 2).sum())
    # Elementwise |a - b| <= max_abs + max_rel * |b| (allclose), and NMSE over the tensor.
    close = bool((diff <= tol.max_abs + tol.max_rel * ref).all())
    ok = close and nmse <= tol.nmse
    reason = "" if ok else (f"nmse {nmse:.3g} (budget {tol.nmse:g}); elementwise |a-b| <= "
                            f"{tol.max_abs:g} + {tol.max_rel:g}*|b| {'holds' if close else 'fails'} "
                            f"(max_abs {max_abs:.3g}, max_rel {max_rel:.3g})")
    return TensorComparison(max_abs, max_rel, nmse, ok, reason)
