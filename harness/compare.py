"""Comparators: token streams against the oracle (exact, margin-aware verdicts) and tensors
against a reference (the metrics of the one tolerance table)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from engines.tolerances import Tolerance, tolerance_for

NEAR_TIE = "near-tie"
DEFECT = "defect"


@dataclass(frozen=True)
class TokenDivergence:
    step: int  # index into the generated tokens
    reference_token: int | None  # None: the reference stopped earlier
    engine_token: int | None  # None: the engine stopped earlier
    margin: float  # the reference's top-2 logit margin at that step
    verdict: str  # near-tie | defect


def compare_tokens(reference: Sequence[int], margins: Sequence[float], tokens: Sequence[int],
                   near_tie_margin: float) -> TokenDivergence | None:
    """First step where ``tokens`` leaves ``reference``; tokens compare exactly.

    A divergence at a step whose reference margin is below ``near_tie_margin`` is a
    ``near-tie`` (two candidates the reference itself barely separates); anything else,
    a length mismatch included, is a ``defect``.
    """
    for step in range(max(len(reference), len(tokens))):
        ref = reference[step] if step < len(reference) else None
        got = tokens[step] if step < len(tokens) else None
        if ref == got:
            continue
        margin = float(margins[step]) if step < len(margins) else float("inf")
        tie = ref is not None and got is not None and margin < near_tie_margin
        return TokenDivergence(step, ref, got, margin, NEAR_TIE if tie else DEFECT)
    return None


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
