"""Claim 1b for engines that report only the top-k log-probabilities of each step (servers).

A server does not return whole logits rows; it returns, per generated token, that token's
log-probability and the k best ``(id, logprob)`` pairs. This audit checks what those numbers
can prove against the oracle's log-softmax on the engine's own prefix, with one bound derived
from the dtype's tolerance row:

    logprob bound = 2 x logits_max_abs

If every logit of a row were within ``logits_max_abs`` (a) of the oracle's, the log-sum-exp
would move by at most a, so every log-probability by at most 2a. Hence a row within
tolerance never fails these checks, and a failure proves some logit left the tolerance:

1. the emitted token's log-probability is within the bound of the oracle's;
2. every reported top-k id's log-probability is within the bound of the oracle's;
3. no id is missing from the top-k: an id the oracle puts more than the bound above the
   k-th reported value would, within tolerance, have beaten it;
4. the emitted token is the server's own top-1 (greedy), unless it ties it;
5. no reported value is NaN or +infinity (``non-finite``).

What it cannot see (``UNSEEN``, in every such record): the tail of each row beyond the top-k
(a NaN or infinity there shows only if it poisons the normaliser), whole-row max-abs and NMSE,
a constant shift of every logit (log-probabilities do not change), and the prompt's rows.
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from engines.decode_result import StepLogprobs
from engines.tolerances import Tolerance
from harness.judgement import LogitsAudit, StepAudit, _in_vocabulary
from harness.row_compare import log_softmax

FACTOR = 2.0  # logprob bound = FACTOR x logits_max_abs (see the module docstring)
UNSEEN = ("entries outside each step's top-k (a row's tail: their values, and a NaN or "
          "infinity there unless it poisons the normaliser), whole-row max-abs and NMSE, a "
          "shift of every logit by one constant (log-probabilities do not change), and the "
          "prompt's own rows")


def logprob_bound(tol: Tolerance) -> float:
    """The largest log-probability difference a row within ``tol`` can show."""
    return FACTOR * tol.logits_max_abs


@dataclass
class TopkAudit(LogitsAudit):
    """A top-k audit: ``steps`` as in a full audit (``max_abs`` is the worst log-probability
    difference at the step, ``nmse`` and ``max_rel`` are not measured), each failing step's
    reason in ``reasons`` (by step), the ``k`` asked for and the ``bound`` used."""
    k: int = 0
    bound: float = 0.0
    reasons: dict[int, str] = field(default_factory=dict)
    unseen: str = UNSEEN

    def describe_first(self) -> str | None:
        """The first failing step in words (non-finite first), for the cell's reason."""
        bad = self.first_non_finite or self.first_out_of_tolerance
        if bad is None:
            return None
        return f"step {bad.step}: {self.reasons.get(bad.step, '')}"


def audit_step(step: int, got: StepLogprobs, reference: np.ndarray, bound: float,
               vocab: int) -> tuple[StepAudit, str]:
    """One step's reported log-probabilities against the oracle's row (see the module); k is
    what the engine reported at this step."""
    lsm = log_softmax(reference)
    pairs = [(got.token, got.logprob), *got.top]
    values = [v for _, v in pairs]
    non_finite = sum(1 for v in values if math.isnan(v) or v == math.inf)
    if non_finite:
        return (StepAudit(step, math.nan, math.nan, math.nan, non_finite, False),
                f"{non_finite} reported log-probabilities are NaN or +infinity")
    outside = [i for i, _ in pairs if not 0 <= i < vocab]
    if outside:
        return (StepAudit(step, math.inf, math.nan, math.nan, 0, False),
                f"id {outside[0]} is outside the vocabulary [0, {vocab})")
    deltas = [(abs(v - lsm[i]), i, v) for i, v in pairs]
    worst, worst_id, worst_value = max(deltas)
    reasons = []
    if worst > bound:
        reasons.append(f"id {worst_id}'s log-probability {worst_value:.4g} is {worst:.3g} from "
                       f"the oracle's {lsm[worst_id]:.4g} (bound {bound:g})")
    top = sorted(got.top, key=lambda p: -p[1])
    k = len(top)
    if k:
        kth = top[-1][1]
        reported = {i for i, _ in top}
        above = np.flatnonzero(lsm > kth + bound)
        missing = [int(i) for i in above if int(i) not in reported]
        if missing:
            m = missing[0]
            reasons.append(f"id {m} is missing from the top-{k} (the oracle's log-probability "
                           f"{lsm[m]:.4g} is more than {bound:g} above the k-th reported "
                           f"{kth:.4g}; {len(missing)} such id(s))")
    if top and top[0][0] != got.token and top[0][1] > got.logprob:
        reasons.append(f"the emitted token {got.token} is not the server's own top-1 "
                       f"({top[0][0]}, {top[0][1]:.4g} > {got.logprob:.4g})")
    return StepAudit(step, worst, math.nan, math.nan, 0, not reasons), "; ".join(reasons)


def audit_top_logprobs(oracle, prompt: Sequence[int], tokens: Sequence[int],
                       steps: Sequence[StepLogprobs], tol: Tolerance,
                       decode: str = "same") -> TopkAudit:
    """Every step's reported top-k against the oracle's row on the engine's prefix (the rows
    of the same ``stream_rows`` the judge reads)."""
    bound = logprob_bound(tol)
    audit = TopkAudit(tol.dtype, [], decode, k=max((len(s.top) for s in steps), default=0),
                      bound=bound)
    if not steps:
        return audit
    vocab = oracle.spec.vocab_size
    fed = _in_vocabulary(list(tokens)[:len(steps) - 1], vocab)
    references = oracle.stream_rows(prompt, fed)
    for step, (got, ref) in enumerate(zip(steps, references)):
        result, reason = audit_step(step, got, ref, bound, vocab)
        audit.steps.append(result)
        if reason:
            audit.reasons[step] = reason
    return audit


__all__ = ["FACTOR", "TopkAudit", "UNSEEN", "audit_step", "audit_top_logprobs", "log_softmax",
           "logprob_bound"]
