"""Verdicts on a decoded stream: every token judged on the engine's own prefix (claim 1),
its logits audited against the oracle's on the same prefix (claim 1b).

At step t the oracle evaluates the prefix the engine produced (prompt + the engine's tokens
before t), so a token is judged by what the oracle would emit *there*, not by where the
oracle's own stream went. A token passes if it is the oracle's argmax (lowest index on an
exact tie) or if its oracle logit is within the dtype's ``near_tie_margin`` of the best
(``near-tie``); anything else is a ``defect``. The top-2 margin alone never excuses a
token. Where the engine's own logits are known, its token must also be the lowest-index
argmax of its own row: a tie broken the other way, or a token the engine did not rank
first, is a defect whatever the oracle says. Judging never stops at the first finding.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engines.tolerances import Tolerance
from harness.compare import compare_tensors

IDENTICAL = "identical"
NEAR_TIE = "near-tie"
DEFECT = "defect"
NON_FINITE = "non-finite"
DRIFT = "drift"  # tokens pass, logits outside the dtype's tolerance of the oracle's
BUDGET = "budget"  # a device budget failed (claims 3, 4): staging or readback
ERROR = "error"
UNAVAILABLE = "unavailable"
# worst first: a cell's status is the worst of what was found in it
SEVERITY = (ERROR, NON_FINITE, DEFECT, BUDGET, DRIFT, NEAR_TIE, IDENTICAL, UNAVAILABLE)
FAILING = frozenset({ERROR, NON_FINITE, DEFECT, BUDGET, DRIFT})
TOP_K = 5


def worst(*statuses: str) -> str:
    """The most severe of ``statuses`` (``identical`` when none is given)."""
    present = [s for s in statuses if s]
    return min(present, key=SEVERITY.index) if present else IDENTICAL


def lowest_argmax(row: np.ndarray) -> int:
    """Index of the largest non-NaN value, lowest index on ties; -1 for an all-NaN row."""
    keys = np.where(np.isnan(row), -np.inf, row)
    if np.isnan(row).all():
        return -1
    return int(np.flatnonzero(keys == keys.max())[0])


def top_k(row: np.ndarray, k: int = TOP_K) -> list[tuple[int, float]]:
    """The k best (id, logit) pairs, best first, lowest index first among equals."""
    keys = np.where(np.isnan(row), -np.inf, row)
    order = np.lexsort((np.arange(keys.size), -keys))[:k]
    return [(int(i), float(row[i])) for i in order]


def rank_of(row: np.ndarray, token: int) -> int:
    """1-based rank of ``token`` in ``row`` under the lowest-index-on-ties order."""
    value = row[token]
    return int((row > value).sum() + (row[:token] == value).sum()) + 1


@dataclass(frozen=True)
class StepJudgement:
    """One step that is not a plain match: what the engine emitted against the oracle."""
    step: int
    engine_token: int | None  # None: the engine's stream ended before this step
    oracle_token: int | None  # the oracle's argmax on the engine's prefix
    rank: int | None  # rank of the engine's token in the oracle's row (1 = argmax)
    gap: float | None  # oracle best logit minus the oracle logit of the engine's token
    verdict: str  # near-tie | defect
    reason: str
    oracle_top: list[tuple[int, float]] = field(default_factory=list)
    engine_top: list[tuple[int, float]] | None = None


@dataclass
class StreamJudgement:
    """Every step judged; ``findings`` holds each step that is not a plain match."""
    steps_judged: int
    findings: list[StepJudgement]

    @property
    def defects(self) -> int:
        return sum(f.verdict == DEFECT for f in self.findings)

    @property
    def near_ties(self) -> int:
        return sum(f.verdict == NEAR_TIE for f in self.findings)

    @property
    def first(self) -> StepJudgement | None:
        """The first defect, else the first near-tie, else None."""
        for f in self.findings:
            if f.verdict == DEFECT:
                return f
        return self.findings[0] if self.findings else None

    @property
    def verdict(self) -> str:
        if self.defects:
            return DEFECT
        return NEAR_TIE if self.findings else IDENTICAL


def _finding(step, token, row, best, tol, reason, engine_row=None, verdict=None):
    gap = float(row[best] - row[token])
    rank = rank_of(row, token)
    if verdict is None:
        verdict = NEAR_TIE if gap <= tol.near_tie_margin else DEFECT
        reason = reason or (f"oracle's rank-{rank} token, {gap:.4g} below its best "
                            f"({'within' if verdict == NEAR_TIE else 'beyond'} the "
                            f"{tol.dtype} near-tie margin {tol.near_tie_margin:g})")
    return StepJudgement(step, token, best, rank, gap, verdict, reason, top_k(row),
                         None if engine_row is None else top_k(engine_row))


def judge_stream(oracle, prompt: Sequence[int], tokens: Sequence[int], max_new_tokens: int,
                 tol: Tolerance, engine_rows: Sequence[np.ndarray] | None = None
                 ) -> StreamJudgement:
    """Judge every token of ``tokens`` on its own prefix (see the module docstring)."""
    vocab = oracle.spec.vocab_size
    eos = oracle.spec.eos_id
    prefix = list(prompt)
    findings: list[StepJudgement] = []
    judged = 0
    ended = False
    unjudgeable = False  # an id outside the vocabulary: no prefix after it can be judged
    for step, token in enumerate(tokens):
        token = int(token)
        if ended or step >= max_new_tokens:
            why = "past eos" if ended else f"past max_new_tokens {max_new_tokens}"
            findings.append(StepJudgement(step, token, None, None, None, DEFECT,
                                          f"the engine emitted a token {why}"))
            break
        row = oracle.row(prefix)
        best = lowest_argmax(row)
        judged += 1
        engine_row = None
        if engine_rows is not None and step < len(engine_rows):
            engine_row = np.asarray(engine_rows[step], dtype=np.float64)
        if not 0 <= token < vocab:
            findings.append(StepJudgement(step, token, best, None, None, DEFECT,
                                          f"token id {token} is outside the vocabulary "
                                          f"[0, {vocab})", top_k(row)))
            unjudgeable = True
            break
        own = lowest_argmax(engine_row) if engine_row is not None else token
        if own not in (-1, token):
            findings.append(_finding(step, token, row, best, tol,
                                     f"not the engine's own argmax: its logits rank {own} "
                                     f"first (lowest index on ties)", engine_row, DEFECT))
        elif token != best:
            findings.append(_finding(step, token, row, best, tol, "", engine_row))
        prefix.append(token)
        ended = eos is not None and token == eos
    if not ended and not unjudgeable and len(tokens) < max_new_tokens:
        row = oracle.row(prefix)
        best = lowest_argmax(row)
        findings.append(StepJudgement(len(tokens), None, best, None, None, DEFECT,
                                      f"the stream ended after {len(tokens)} tokens without "
                                      f"eos (max_new_tokens {max_new_tokens})", top_k(row)))
    return StreamJudgement(judged, findings)


@dataclass(frozen=True)
class StepAudit:
    step: int
    max_abs: float
    max_rel: float
    nmse: float
    non_finite: int  # NaN or infinite entries in the engine's row
    ok: bool


@dataclass
class LogitsAudit:
    """Each step's engine logits against the oracle's row on the same prefix."""
    dtype: str
    steps: list[StepAudit]
    decode: str  # "same": rows recorded in the judged decode; "separate": an audit decode

    @property
    def non_finite_steps(self) -> int:
        return sum(s.non_finite > 0 for s in self.steps)

    @property
    def out_of_tolerance_steps(self) -> int:
        return sum(not s.ok and s.non_finite == 0 for s in self.steps)

    @property
    def within_tolerance(self) -> bool:
        return self.out_of_tolerance_steps == 0

    @property
    def first_non_finite(self) -> StepAudit | None:
        return next((s for s in self.steps if s.non_finite), None)

    @property
    def first_out_of_tolerance(self) -> StepAudit | None:
        return next((s for s in self.steps if not s.ok and not s.non_finite), None)

    @property
    def worst_max_abs(self) -> float:
        finite = [s.max_abs for s in self.steps if not s.non_finite]
        return max(finite, default=0.0)

    @property
    def worst_nmse(self) -> float:
        finite = [s.nmse for s in self.steps if not s.non_finite]
        return max(finite, default=0.0)

    @property
    def verdict(self) -> str:
        if self.non_finite_steps:
            return NON_FINITE
        return IDENTICAL if self.within_tolerance else DRIFT


def audit_logits(oracle, prompt: Sequence[int], tokens: Sequence[int],
                 engine_rows: Sequence[np.ndarray], tol: Tolerance, decode: str = "same"
                 ) -> LogitsAudit:
    """Claim 1b: per step, the engine's row against the oracle's on the engine's prefix."""
    prefix = list(prompt)
    steps = []
    for step, engine_row in enumerate(engine_rows):
        engine_row = np.asarray(engine_row)
        reference = oracle.row(prefix)
        bad = int((~np.isfinite(engine_row.astype(np.float64))).sum())
        if bad:
            steps.append(StepAudit(step, float("nan"), float("nan"), float("nan"), bad, False))
        else:
            cmp = compare_tensors(engine_row.astype(np.float64), reference, tol=tol.logits)
            steps.append(StepAudit(step, cmp.max_abs, cmp.max_rel, cmp.nmse, 0, cmp.ok))
        if step >= len(tokens):
            break
        prefix.append(int(tokens[step]))
    return LogitsAudit(tol.dtype, steps, decode)
