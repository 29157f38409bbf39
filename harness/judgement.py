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

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, get_args

import numpy as np

from engines.tolerances import Tolerance
from harness.compare import compare_tensors
from harness.row_compare import log_softmax

# a cell's status, worst first: a cell's status is the worst of what was found in it
Status = Literal["error", "non-finite", "defect", "budget", "drift", "near-tie", "identical",
                 "unavailable"]
StepVerdict = Literal["near-tie", "defect"]  # a step that is not a plain match
IDENTICAL = "identical"
NEAR_TIE = "near-tie"
DEFECT = "defect"
NON_FINITE = "non-finite"
DRIFT = "drift"  # tokens pass, logits outside the dtype's tolerance of the oracle's
BUDGET = "budget"  # a device budget failed (claims 3, 4): staging or readback
ERROR = "error"
UNAVAILABLE = "unavailable"
SEVERITY: tuple[Status, ...] = get_args(Status)
FAILING = frozenset({ERROR, NON_FINITE, DEFECT, BUDGET, DRIFT})
TOP_K = 5
# a quantized stream's flips are drift when this unlikely at its band's flip rate (binomial)
FLIP_ALPHA = 1e-3


def worst(*statuses: str) -> str:
    """The most severe of ``statuses`` (``identical`` when none is given)."""
    present = [s for s in statuses if s]
    return min(present, key=SEVERITY.index) if present else IDENTICAL


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first step where two streams part (a length difference included), else None."""
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b) or a[i] != b[i]:
            return i
    return None


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
    verdict: StepVerdict
    reason: str
    oracle_top: list[tuple[int, float]] = field(default_factory=list)
    engine_top: list[tuple[int, float]] | None = None


@dataclass
class StreamJudgement:
    """Every step judged; ``findings`` holds each step that is not a plain match."""
    steps_judged: int
    findings: list[StepJudgement]
    oracle_mode: str | None = None  # the oracle mode whose rows judged (engines.oracle)

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


def judged_prefix(tokens: Sequence[int], max_new_tokens: int, vocab: int,
                  eos: int | None) -> tuple[int, str]:
    """How many of ``tokens`` are judged on their prefix, and why the walk stops there:
    ``end`` (the stream's end; it is judged too when it ends without eos before
    ``max_new_tokens``), ``past eos`` / ``past max_new_tokens ...`` (the next token is a
    defect by itself), ``vocabulary`` (the last judged token is outside the vocabulary: no
    prefix after it can be judged)."""
    for step, token in enumerate(tokens):
        if step and eos is not None and int(tokens[step - 1]) == eos:
            return step, "past eos"
        if step >= max_new_tokens:
            return step, f"past max_new_tokens {max_new_tokens}"
        if not 0 <= int(token) < vocab:
            return step + 1, "vocabulary"
    return len(tokens), "end"


def judge_stream(oracle, prompt: Sequence[int], tokens: Sequence[int], max_new_tokens: int,
                 tol: Tolerance, engine_rows: Sequence[np.ndarray] | None = None
                 ) -> StreamJudgement:
    """Judge every token of ``tokens`` on its own prefix (see the module docstring). The
    oracle's rows for the whole stream come from ``oracle.stream_rows`` (one forward in
    stream mode)."""
    vocab = oracle.spec.vocab_size
    eos = oracle.spec.eos_id
    judged, stop = judged_prefix(tokens, max_new_tokens, vocab, eos)
    ended = bool(tokens) and eos is not None and int(tokens[-1]) == eos
    end_judged = stop == "end" and not ended and len(tokens) < max_new_tokens
    n_rows = judged + end_judged
    rows = oracle.stream_rows(prompt, [int(t) for t in tokens[:n_rows - 1]]) if n_rows else []
    findings: list[StepJudgement] = []
    for step in range(judged):
        token, row = int(tokens[step]), rows[step]
        best = lowest_argmax(row)
        engine_row = None
        if engine_rows is not None and step < len(engine_rows):
            engine_row = np.asarray(engine_rows[step], dtype=np.float64)
        if not 0 <= token < vocab:
            findings.append(StepJudgement(step, token, best, None, None, DEFECT,
                                          f"token id {token} is outside the vocabulary "
                                          f"[0, {vocab})", top_k(row)))
            break
        own = lowest_argmax(engine_row) if engine_row is not None else token
        if own not in (-1, token):
            findings.append(_finding(step, token, row, best, tol,
                                     f"not the engine's own argmax: its logits rank {own} "
                                     f"first (lowest index on ties)", engine_row, DEFECT))
        elif token != best:
            findings.append(_finding(step, token, row, best, tol, "", engine_row))
    if stop.startswith("past"):
        findings.append(StepJudgement(judged, int(tokens[judged]), None, None, None, DEFECT,
                                      f"the engine emitted a token {stop}"))
    if end_judged:
        row = rows[len(tokens)]
        findings.append(StepJudgement(len(tokens), None, lowest_argmax(row), None, None,
                                      DEFECT, f"the stream ended after {len(tokens)} tokens "
                                              f"without eos (max_new_tokens {max_new_tokens})",
                                      top_k(row)))
    return StreamJudgement(judged, findings, oracle.mode)


@dataclass(frozen=True)
class StepAudit:
    step: int
    max_abs: float
    max_rel: float
    nmse: float
    non_finite: int  # NaN or infinite entries in the engine's row
    ok: bool
    where: str = ""  # in a speculative decode: the forward and row ("verify r3 row 1")
    kl: float = float("nan")  # KL(oracle || engine) of the two rows' softmaxes, nats


def kl_divergence(reference: np.ndarray, engine_row: np.ndarray) -> float:
    """KL(P || Q) in nats, P the oracle's softmax, Q the engine's: what
    ``llama-perplexity --kl-divergence`` reports per position (float64 throughout)."""
    log_p, log_q = log_softmax(reference), log_softmax(engine_row)
    return float(max(np.sum(np.exp(log_p) * (log_p - log_q)), 0.0))


def audit_step(step: int, engine_row, reference: np.ndarray, tol: Tolerance,
               where: str = "") -> StepAudit:
    """One engine row against the oracle's on the same prefix: non-finite, or the metrics."""
    engine_row = np.asarray(engine_row).astype(np.float64)
    bad = int((~np.isfinite(engine_row)).sum())
    if bad:
        return StepAudit(step, float("nan"), float("nan"), float("nan"), bad, False, where)
    cmp = compare_tensors(engine_row, reference, tol=tol.logits)
    return StepAudit(step, cmp.max_abs, cmp.max_rel, cmp.nmse, 0, cmp.ok, where,
                     kl_divergence(reference, engine_row))


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


def _in_vocabulary(tokens: Sequence[int], vocab: int) -> list[int]:
    """``tokens`` up to the first id outside the vocabulary (no prefix after it has a row)."""
    fed = []
    for token in tokens:
        if not 0 <= int(token) < vocab:
            break
        fed.append(int(token))
    return fed


def audit_logits(oracle, prompt: Sequence[int], tokens: Sequence[int],
                 engine_rows: Sequence[np.ndarray], tol: Tolerance, decode: str = "same"
                 ) -> LogitsAudit:
    """Claim 1b: per step, the engine's row against the oracle's on the engine's prefix (the
    rows of the same ``stream_rows`` the judge reads; a prefix holding an id outside the
    vocabulary has no row: the judge already calls that token a defect)."""
    if not engine_rows:
        return LogitsAudit(tol.dtype, [], decode)
    fed = _in_vocabulary(tokens[:len(engine_rows) - 1], oracle.spec.vocab_size)
    references = oracle.stream_rows(prompt, fed)
    steps = [audit_step(step, row, ref, tol)
             for step, (row, ref) in enumerate(zip(engine_rows, references))]
    return LogitsAudit(tol.dtype, steps, decode)


def audit_forwards(oracle, prompt: Sequence[int], forwards, tol: Tolerance,
                   decode: str = "same") -> LogitsAudit:
    """Claim 1b in a speculative decode: every row of every target forward that decided
    tokens (``engines.decode_result.AuditedForward``: the prefill, each verification's W+1
    rows, plain decode steps) against the oracle's row on the same prefix. A verification's
    rejected drafts are a prefix no stream took: the oracle scores that branch in one forward
    (stream mode), the accepted ones are the stream's own rows."""
    steps = []
    vocab = oracle.spec.vocab_size
    for forward in forwards:
        context = _in_vocabulary(list(forward.before) + list(forward.fed), vocab)
        if len(context) < len(forward.before):
            continue  # the stream itself left the vocabulary before this forward
        references = oracle.stream_rows(prompt, context)[len(forward.before):]
        for j, (row, ref) in enumerate(zip(forward.rows, references)):
            where = forward.label if len(forward.rows) == 1 else f"{forward.label} row {j}"
            steps.append(audit_step(len(forward.before) + j, row, ref, tol, where))
    return LogitsAudit(tol.dtype, steps, decode)


# -- claim 1d: a quantized engine's stream against its scheme's band ---------------------------

def binomial_tail(k: int, n: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): how likely ``k`` or more flips are in ``n`` steps for
    an engine whose steps flip with probability ``p``."""
    if k <= 0:
        return 1.0
    if p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1)
            + i * math.log(p) + (n - i) * math.log1p(-p) for i in range(k, n + 1)]
    top = max(logs)
    return float(min(1.0, math.exp(top) * sum(math.exp(x - top) for x in logs)))


def fewest_unlikely(n: int, p: float, alpha: float = FLIP_ALPHA) -> int:
    """The fewest flips in ``n`` steps less likely than ``alpha`` at rate ``p`` (``n + 1``
    where even ``n`` are not)."""
    return next((k for k in range(n + 1) if binomial_tail(k, n, p) < alpha), n + 1)


@dataclass
class BandStatistics:
    """A stream's statistics against its scheme's band (``engines.tolerances.Band``): the
    mean and 99th-percentile per-step KL (on streams of at least ``band.window`` steps), the
    flips (steps whose token is not the oracle's argmax on the engine's prefix) with how likely
    that many are at the band's flip rate, every step's KL against ``band.step_kl``; ``worst``
    holds the stream's value of each bounded metric and ``ratios`` each over its bound (how far
    beyond the band a stream is; for flips, their count over the fewest that would be drift in
    this many steps); ``first_step`` is the first step beyond a per-step bound."""
    scheme: str
    steps: int
    mean_kl: float | None  # None: no step's KL was measured (a top-k audit sees no
    p99_kl: float | None   # whole distribution), so only flips and margins are bounded
    flips: int
    flip_p: float  # P(at least this many flips | the band's flip rate)
    reasons: list[str]
    worst: dict[str, float] = field(default_factory=dict)
    ratios: dict[str, float] = field(default_factory=dict)
    first_step: int | None = None

    @property
    def within(self) -> bool:
        return not self.reasons

    @property
    def verdict(self) -> str:
        return IDENTICAL if self.within else DRIFT

    @property
    def farthest(self) -> tuple[str, float] | None:
        """The metric this stream is farthest beyond the band on, and how many times it."""
        if not self.ratios:
            return None
        metric = max(self.ratios, key=self.ratios.__getitem__)
        return metric, self.ratios[metric]


def band_statistics(audit: LogitsAudit, judgement: StreamJudgement, band,
                    alpha: float = FLIP_ALPHA) -> BandStatistics:
    """Claim 1d's stream statistics for one cell; ``reasons`` names each one beyond the band."""
    rows = [s for s in audit.steps if s.non_finite == 0]
    finite = [s for s in rows if math.isfinite(s.kl)]  # steps whose KL was measured
    kls = [s.kl for s in finite]
    mean_kl = float(np.mean(kls)) if kls else None
    p99_kl = float(np.percentile(kls, 99)) if kls else None
    flipped = [f for f in judgement.findings if f.engine_token is not None
               and f.oracle_token is not None and f.engine_token != f.oracle_token]
    flips = len(flipped)
    steps = judgement.steps_judged
    flip_p = binomial_tail(flips, steps, band.flip_rate)
    reasons = []
    long_enough = len(kls) >= band.window
    if long_enough and mean_kl > band.mean_kl:
        reasons.append(f"mean KL {mean_kl:.3g} over the band's {band.mean_kl:.3g}")
    if long_enough and p99_kl > band.p99_kl:
        reasons.append(f"p99 KL {p99_kl:.3g} over the band's {band.p99_kl:.3g}")
    over = [s for s in finite if s.kl > band.step_kl]
    if over:
        top = max(over, key=lambda s: s.kl)
        reasons.append(f"{len(over)} step(s) over the band's step KL {band.step_kl:.3g}, "
                       f"first at step {over[0].step} (worst {top.kl:.3g} at step {top.step})")
    if flip_p < alpha:
        reasons.append(f"{flips} of {steps} steps flipped (P = {flip_p:.2g} at the band's "
                       f"flip rate {band.flip_rate:.3g}, below {alpha:g})")
    worst = {"step_max_abs": max((s.max_abs for s in rows), default=0.0),
             "near_tie_margin": max((f.gap for f in flipped if f.gap is not None),
                                    default=0.0),
             "flip_rate": flips / steps if steps else 0.0}
    if kls:  # full rows: their KL and NMSE (a top-k audit measures neither)
        worst.update(step_kl=max(kls), step_nmse=max(s.nmse for s in finite))
    if long_enough:
        worst.update(mean_kl=mean_kl, p99_kl=p99_kl)
    ratios = {k: v / getattr(band, k) for k, v in worst.items()
              if k != "flip_rate" and getattr(band, k) > 0}
    # flips against the fewest that would be drift here: 1 or more is beyond the band
    ratios["flip_rate"] = flips / fewest_unlikely(steps, band.flip_rate, alpha)
    beyond = [s.step for s in over] + [s.step for s in rows if not s.ok]
    return BandStatistics(band.scheme, steps, mean_kl, p99_kl, flips, flip_p, reasons, worst,
                          ratios, min(beyond, default=None))
