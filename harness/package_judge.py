"""The judge of one package: its oracle (built on first use), the oracle's own streams, and
what judging cost.

One per package serves every engine, width and prompt of a run, so streams that agree share
their oracle rows (``engines.oracle``): in stream mode the first cell of a prompt pays one
forward over its stream, every later cell whose stream agrees pays nothing. The oracle's
failure (NaN rows, a reference engine that cannot load) is kept and becomes each cell's
``error`` (stage ``oracle``), and the matrix goes on.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import contextmanager

from engines.engine import Engine
from engines.oracle import STREAM, Oracle, OracleTrace, check_oracle_mode, oracle_for
from engines.tolerances import tolerance_for
from engines.workflow import greedy_decode
from harness.cells import CellError
from harness.judgement import (LogitsAudit, StreamJudgement, audit_forwards, audit_logits,
                               judge_stream)
from harness.oracle_choice import chosen_oracle
from harness.oracle_guesses import STREAMS
from harness.topk_audit import audit_top_logprobs


def guess_source(engine, component: str) -> tuple:
    """What a kept greedy stream was computed from: the engine class, the package content
    and the component (``harness.oracle_guesses``)."""
    return (type(engine).__module__, type(engine).__qualname__, engine.package.content_hash,
            component)


def with_guesser(oracle: Oracle) -> Oracle:
    """``oracle`` guessing its own stream by its engine's cached greedy decode (the
    interpreter's, which the oracle itself never runs): one decode and one verifying forward
    where an engine's stream left the oracle's, instead of a forward per step after it; a
    decode already made in this process for the same package content serves again."""
    engine = oracle.engine
    if oracle.component == "target" and isinstance(engine, Engine) and not engine.decodes_itself:
        def decode(ids: list[int], n: int) -> list[int]:
            return greedy_decode(engine, ids, n).tokens

        content = getattr(engine.package, "content_hash", None)
        if not content:  # nothing names what the decode was computed from: not kept
            oracle.guesser = decode
        else:  # kept across judges of this process (harness.oracle_guesses)
            source = guess_source(engine, oracle.component)
            eos = engine.package.spec.eos_id
            oracle.guesser = lambda ids, n: STREAMS.guess(source, ids, n, eos, decode)
    return oracle


class OracleFailed(Exception):
    """The oracle could not judge a prompt; ``error`` is the cell error it becomes."""

    def __init__(self, error: CellError):
        super().__init__(str(error))
        self.error = error


class PackageJudge:
    """The oracle of one package on ``oracle_engine`` (default ort-cpu) in ``oracle_mode``."""

    def __init__(self, package, oracle_engine: str | None = None, oracle_mode: str = STREAM):
        self.package = package
        self.tol = tolerance_for(package.spec.dtype)
        self.oracle_engine = oracle_engine
        self.oracle_mode = check_oracle_mode(oracle_mode, "--oracle-mode")
        self._oracle: Oracle | None = None
        self._traces: dict[str, OracleTrace | CellError] = {}
        self.agreement = None  # harness.oracle_choice.OracleAgreement, once vetted
        self.seconds = 0.0  # wall time spent judging (forwards, guesses and the verdicts)

    def choose(self, prompt: list[int]) -> None:
        """The oracle on ``oracle_engine``, vetted against ort-cpu's on ``prompt`` first (a
        disagreement raises: the run stops before any cell)."""
        oracle, self.agreement = chosen_oracle(self.package, self.oracle_engine, prompt,
                                               self.oracle_mode)
        self._oracle = with_guesser(oracle)

    @property
    def built(self) -> bool:
        return self._oracle is not None

    def spent(self) -> tuple[float, int, int]:
        """Judging seconds, oracle forwards and positions fed so far (to take differences)."""
        cost = self._oracle.cost if self._oracle is not None else None
        return (self.seconds, cost.forwards if cost else 0, cost.positions if cost else 0)

    @property
    def oracle(self) -> Oracle:
        if self._oracle is None:
            # a reduced package: its float32 twin
            self._oracle = with_guesser(oracle_for(self.package, self.oracle_engine,
                                                   mode=self.oracle_mode))
        return self._oracle

    @contextmanager
    def timed(self):
        """Count the wall time of the block as judging time."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds += time.perf_counter() - start

    def trace(self, name: str, prompt: list[int], max_new_tokens: int,
              hint: Sequence[int] = ()) -> OracleTrace:
        """The oracle's own stream for a prompt (``hint``: an engine's stream, scored first as
        the guess of it); its failure is kept and re-raised as ``OracleFailed``."""
        if name not in self._traces:
            try:
                oracle = self.oracle  # loading the reference is no part of judging a cell
                with self.timed():
                    self._traces[name] = oracle.decode(prompt, max_new_tokens, hint)
            except Exception as exc:
                self._traces[name] = CellError.of("oracle", exc)
        got = self._traces[name]
        if isinstance(got, CellError):
            raise OracleFailed(got)
        return got

    def judge_stream(self, prompt, tokens, max_new_tokens, rows=None,
                     tol=None) -> StreamJudgement:
        """``tol``: the row to judge by (a quantized scheme's band), else the package dtype's."""
        oracle = self.oracle
        with self.timed():
            return judge_stream(oracle, prompt, tokens, max_new_tokens, tol or self.tol, rows)

    def audit(self, prompt, tokens, rows, decode: str, tol=None) -> LogitsAudit:
        oracle = self.oracle
        with self.timed():
            return audit_logits(oracle, prompt, tokens, rows, tol or self.tol, decode)

    def audit_forwards(self, prompt, forwards, decode: str, tol=None) -> LogitsAudit:
        oracle = self.oracle
        with self.timed():
            return audit_forwards(oracle, prompt, forwards, tol or self.tol, decode)

    def audit_top_logprobs(self, prompt, tokens, steps, decode: str = "same", tol=None):
        """Claim 1b from a server's top-k log-probabilities (``harness.topk_audit``)."""
        oracle = self.oracle
        with self.timed():
            return audit_top_logprobs(oracle, prompt, tokens, steps, tol or self.tol, decode)

    def close(self) -> None:
        if self._oracle is not None:
            try:
                self._oracle.engine.close()
            except Exception:  # noqa: BLE001 - a close that fails must not hide verdicts
                pass


__all__ = ["OracleFailed", "PackageJudge", "guess_source", "with_guesser"]
