"""What a run produces: one ``CellResult`` per planned cell, and the run's ``RunSummary``.

A cell is one engine decoding one prompt of one package in one mode (greedy, or speculative
at one width). Whatever happens in it becomes its verdict: ``CellError`` holds an exception's
stage, type, message and short traceback for an ``error`` cell.
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from harness.judgement import FAILING, LogitsAudit, Status, StepJudgement, StreamJudgement

# where in a cell an exception was raised
Stage = Literal["availability", "constructor", "oracle", "greedy", "decode", "audit", "judge",
                "runner", "worker"]


@dataclass
class CellError:
    stage: Stage
    type: str
    message: str
    step: int | None = None
    traceback: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, stage: Stage, exc: BaseException, step: int | None = None) -> "CellError":
        frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
        short = [line.rstrip() for chunk in frames[-6:] for line in chunk.splitlines()][-12:]
        return cls(stage, type(exc).__name__, str(exc), step, short)

    def __str__(self) -> str:
        where = f" at step {self.step}" if self.step is not None else ""
        return f"{self.stage}{where}: {self.type}: {self.message}"


@dataclass
class CellResult:
    package: str
    engine: str
    prompt_name: str
    prompt: list[int]
    status: Status
    tokens: list[int] = field(default_factory=list)
    reference: list[int] = field(default_factory=list)  # the oracle's own stream
    divergence: StepJudgement | None = None  # first defect, else first near-tie
    reason: str = ""
    tokens_per_s: float | None = None
    record_path: Path | None = None
    mode: str = "greedy"  # greedy, or <kind>/w<width> for a speculative cell
    acceptance_per_round: list[int] = field(default_factory=list)
    tallies: dict[str, int] = field(default_factory=dict)
    judgement: StreamJudgement | None = None
    audit: LogitsAudit | None = None
    greedy_tokens: list[int] | None = None  # a speculative cell's own greedy stream
    greedy_judgement: StreamJudgement | None = None
    budgets: list = field(default_factory=list)
    verdicts: dict[str, str] = field(default_factory=dict)
    error: CellError | None = None
    ledger: object | None = None  # the judged decode's ledger
    wall_s: float = 0.0
    prompt_source: object | None = None  # harness.prompts.ResolvedPrompt: text, chat, template
    provenance: dict = field(default_factory=dict)  # Engine.provenance(): what it really ran
    engine_class: str | None = None  # module:Class of an engine not registered by its name
    judge_s: float = 0.0  # wall time the judge spent on this cell (oracle forwards included)
    oracle_forwards: int = 0  # forwards the oracle ran for this cell (0: rows it had already)
    oracle_positions: int = 0  # positions those forwards fed
    text: str | None = None  # what a text or chat prompt's cell generated, decoded
    scheme: str | None = None  # Engine.numeric_scheme(): a quantized engine's scheme
    band: object | None = None  # harness.judgement.BandStatistics, where its scheme has a band
    # --concurrency N: this prompt among N in flight against it alone
    # (harness.concurrency.ConcurrencyCheck); None where not asked or not judged
    concurrency: object | None = None
    alone_top: list | None = None  # the judged decode's top-k log-probabilities (servers)
    # beside the verdict: harness.quality.Quality against the float model the package declares
    quality: object | None = None
    # (tokens, rows) of the audited decode, kept only until its quality is measured
    logits: tuple | None = field(default=None, repr=False)

    @property
    def failed(self) -> bool:
        return self.status in FAILING

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.package, self.engine, self.mode, self.prompt_name)

    @property
    def first_step(self) -> int | None:
        """The first step anything failing was found at: a defect token (this stream's or,
        in a speculative cell, its greedy stream's), a bad logits row (beyond the dtype's
        tolerance or a quantized band's per-step bounds), an error."""
        steps = []
        if self.error is not None and self.error.step is not None:
            steps.append(self.error.step)
        for judgement in (self.judgement, self.greedy_judgement):
            if judgement is not None and judgement.defects:
                steps.append(judgement.first.step)
        if self.audit is not None:
            bad = self.audit.first_non_finite or self.audit.first_out_of_tolerance
            if bad is not None:
                steps.append(bad.step)
        if self.band is not None and self.band.first_step is not None:
            steps.append(self.band.first_step)  # a quantized band's per-step KL bound
        return min(steps) if steps else None


@dataclass
class RunSummary:
    cells: list[CellResult]
    evidence_dir: Path | None
    run_id: str = ""
    planned: int = 0
    oracle_checks: dict = field(default_factory=dict)  # package -> OracleAgreement (vetted)
    left_out: list = field(default_factory=list)  # harness.plan.LeftOut: not planned, and why

    @property
    def failed(self) -> bool:
        return any(c.failed for c in self.cells)


__all__ = ["CellError", "CellResult", "RunSummary"]
