"""Claim ``concurrency_invariance``: a prompt decoded among N concurrent requests gives what
it gives alone.

A server batches what arrives together; a kernel that depends on the batch, a KV cache
shared across requests or a scheduler that mixes rows can make a prompt's stream depend on
its neighbours (vLLM #1464, #6735). With ``lockstep run --concurrency N`` each prompt of an
engine that declares ``concurrent`` is sent again among N-1 others of the matrix's prompts,
all in flight at once, and its stream there is compared with its stream alone:

* the same tokens at every step (a difference is a ``defect`` at the first step they part);
* before they part, the same log-probabilities within the dtype's logprob bound (2 x
  ``logits_max_abs``: two rows within the logits tolerance of each other cannot differ by
  more) for the emitted token and every id both top-k lists report (else ``drift``).

The concurrent stream is also judged against the oracle, so the record says which stream is
wrong when they part.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from engines.decode_result import DecodeResult
from engines.tolerances import Tolerance
from harness.judgement import DEFECT, DRIFT, IDENTICAL, StreamJudgement, first_difference
from harness.topk_audit import logprob_bound


@dataclass
class ConcurrencyCheck:
    """One prompt alone against the same prompt among ``requests`` in flight (its place
    among them: ``slot``)."""
    requests: int
    slot: int
    tokens: list[int]  # the stream among the others
    first_difference: int | None  # the first step the two streams part (None: they don't)
    steps_compared: int  # steps whose log-probabilities were compared
    max_logprob_delta: float | None  # the worst difference over those steps (None: no
    # log-probabilities: the engine reported none)
    worst_step: int | None
    bound: float
    judgement: StreamJudgement | None = None  # the concurrent stream against the oracle

    @property
    def within_bound(self) -> bool:
        d = self.max_logprob_delta
        return d is None or (not math.isnan(d) and d <= self.bound)

    @property
    def ok(self) -> bool:
        return self.first_difference is None and self.within_bound

    @property
    def status(self) -> str:
        if self.first_difference is not None:
            return DEFECT
        return IDENTICAL if self.within_bound else DRIFT

    def describe(self, alone: list[int]) -> str:
        """The finding in words, for the cell's reason (empty when the claim holds)."""
        among = f"among {self.requests} concurrent requests"
        if self.first_difference is not None:
            t = self.first_difference
            a = alone[t] if t < len(alone) else "end"
            b = self.tokens[t] if t < len(self.tokens) else "end"
            text = (f"concurrency: {among} the stream parts from the stream alone at step {t} "
                    f"(alone {a}, concurrent {b})")
            j = self.judgement
            if j is not None and j.defects:
                text += f"; the concurrent stream is wrong (oracle: defect at step {j.first.step})"
            elif j is not None:
                text += "; the concurrent stream is itself within tolerance of the oracle"
            return text
        if not self.within_bound:
            return (f"concurrency: {among} the log-probabilities move by "
                    f"{self.max_logprob_delta:.3g} at step {self.worst_step} (bound "
                    f"{self.bound:g})")
        return ""


def compare(alone: DecodeResult, among: DecodeResult, tol: Tolerance, requests: int,
            slot: int) -> ConcurrencyCheck:
    """The claim's measurement: streams, then log-probabilities before they part."""
    parted = first_difference(alone.tokens, among.tokens)
    steps = len(alone.tokens) if parted is None else parted
    worst, worst_step = None, None
    a_steps, b_steps = alone.top_logprobs, among.top_logprobs
    if a_steps is not None and b_steps is not None:
        worst = 0.0
        for t in range(min(steps, len(a_steps), len(b_steps))):
            a, b = a_steps[t], b_steps[t]
            a_top, b_top = dict(a.top), dict(b.top)
            a_top[a.token], b_top[b.token] = a.logprob, b.logprob
            for i in a_top.keys() & b_top.keys():
                d = abs(a_top[i] - b_top[i])
                if math.isnan(d) or d > worst:
                    worst, worst_step = d, t
                    if math.isnan(d):
                        break
            if worst is not None and math.isnan(worst):
                break
    return ConcurrencyCheck(requests, slot, list(among.tokens), parted, steps, worst,
                            worst_step, logprob_bound(tol))


__all__ = ["ConcurrencyCheck", "compare"]
