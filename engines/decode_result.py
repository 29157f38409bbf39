"""What one decode returns, whoever decoded: the workflow interpreter or an engine that
decodes by itself (``Engine.generate``).

Below the workflow so that a backend can build one without importing the interpreter;
``engines.workflow`` re-exports it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from engines.ledger import Ledger


@dataclass(frozen=True)
class AuditedForward:
    """The logits rows of one forward that decided tokens, for the logits audit (claim 1b):
    row ``j`` follows the prompt + ``before`` + ``fed[:j]``. A prefill or a plain decode step
    has one row and nothing ``fed``; a verification has W+1 rows over its W drafts."""
    before: tuple[int, ...]  # generated tokens before this forward's first row
    fed: tuple[int, ...]  # the drafts a verification fed after them
    rows: np.ndarray  # [len(fed) + 1, vocab], host float64
    label: str  # prefill | decode | verify r<round>


@dataclass(frozen=True)
class StepLogprobs:
    """What an engine that cannot return whole rows says about one step (a server's top-k
    log-probabilities): the emitted token's log-probability and the k best ``(id,
    logprob)`` pairs, best first, as the engine reported them (values as sent: a NaN or an
    infinity is kept for the audit to find)."""
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...]


@dataclass
class DecodeResult:
    """One greedy decode of one prompt.

    ``tokens`` are the generated ids only (not the prompt), at most ``max_new_tokens`` and
    ending early only after the package's eos. ``ledger`` is the decode's own (fresh) ledger.
    ``wall_s`` is the decode's wall time, ``step_s`` each step's (the prefill first).
    ``logits``: with an audit, each generated step's logits row as a host float64 vector of
    ``vocab_size`` entries (row i decided ``tokens[i]``); None when no audit was asked for or
    the engine cannot return them. ``top_logprobs``: with an audit, from an engine that
    declares ``logprobs_audit`` instead, each generated step's ``StepLogprobs``."""

    engine: str
    prompt: list[int]
    tokens: list[int]
    ledger: Ledger
    wall_s: float
    step_s: list[float] = field(default_factory=list)
    # each step's logits row (host float64), where the decode was asked to audit them
    logits: list[np.ndarray] | None = None
    # each step's top-k log-probabilities (a server's), where whole rows are not available
    top_logprobs: list[StepLogprobs] | None = None

    @property
    def tokens_per_s(self) -> float:
        return len(self.tokens) / self.wall_s if self.wall_s > 0 else 0.0


__all__ = ["AuditedForward", "DecodeResult", "StepLogprobs"]
