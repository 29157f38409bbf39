"""The matrix runner: engines x packages x prompts, each greedy stream against the oracle.

The oracle is computed once per (package, prompt); every engine's stream is compared to it
exactly, divergences get a margin-aware verdict, and one evidence record is written per cell.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engines.engine import Engine
from engines.errors import LockstepError
from engines.oracle import OracleTrace, oracle_decode
from engines.registry import REFERENCE_ENGINE, get_engine_class
from engines.tolerances import tolerance_for
from engines.workflow import DecodeResult, greedy_decode
from harness.compare import DEFECT, TokenDivergence, compare_tokens
from harness.packages import resolve_package

IDENTICAL = "identical"
UNAVAILABLE = "unavailable"
ERROR = "error"


@dataclass
class CellResult:
    package: str
    engine: str
    prompt_name: str
    prompt: list[int]
    status: str  # identical | near-tie | defect | unavailable | error
    tokens: list[int] = field(default_factory=list)
    reference: list[int] = field(default_factory=list)
    divergence: TokenDivergence | None = None
    reason: str = ""
    tokens_per_s: float | None = None
    record_path: Path | None = None

    @property
    def failed(self) -> bool:
        return self.status in (DEFECT, ERROR)


@dataclass
class RunSummary:
    cells: list[CellResult]
    evidence_dir: Path | None

    @property
    def failed(self) -> bool:
        return any(c.failed for c in self.cells)


def budgets_for(engine: Engine, result: DecodeResult):
    """Claims 3 and 4 for a device-resident engine: zero staging, 4 bytes per token exactly."""
    from harness.evidence import BudgetCheck

    if engine.residency == "host":
        return [], {"zero_staging": "skip", "readback_budget": "skip"}
    ledger = result.ledger
    expected = 4 * len(result.tokens)
    measured = ledger.readback_bytes["token_id"] + ledger.readback_bytes["accept_count"]
    staging = BudgetCheck(claim="zero_staging", budget=0, measured=ledger.host_staging,
                          unit="events", verdict="pass" if ledger.host_staging == 0 else "fail")
    readback = BudgetCheck(claim="readback_budget", budget=expected, measured=measured,
                           unit="bytes", verdict="pass" if measured == expected else "fail",
                           note="exactly 4 bytes (one int32 token id) per generated token")
    return [staging, readback], {"zero_staging": staging.verdict, "readback_budget": readback.verdict}


def evidence_record(run_id, env, package, engine: Engine, prompt_name, result: DecodeResult,
                    oracle: OracleTrace, divergence: TokenDivergence | None):
    from harness import evidence as ev

    budgets, verdicts = budgets_for(engine, result)
    verdicts["token_identity"] = "fail" if divergence and divergence.verdict == DEFECT else "pass"
    return ev.EvidenceRecord(
        run_id=run_id, environment=env,
        package=ev.PackageRef(name=package.spec.name, content_hash=package.content_hash,
                              path=str(package.root)),
        engine=engine.name, mode=ev.Mode(kind="greedy"),
        prompt=ev.PromptRef(name=prompt_name, ids=list(result.prompt)),
        tokens=list(result.tokens), token_digest=ev.token_digest(result.tokens),
        reference=ev.ReferenceRef(engine=f"oracle:{oracle.engine}", tokens=list(oracle.tokens),
                                  digest=ev.token_digest(oracle.tokens),
                                  margins=list(oracle.margins)),
        divergence=None if divergence is None else ev.Divergence(
            step=divergence.step, reference_token=divergence.reference_token,
            engine_token=divergence.engine_token,
            margin=divergence.margin if divergence.margin != float("inf") else None,
            verdict=divergence.verdict),
        ledger=result.ledger.to_dict(),
        timings=ev.Timings(wall_s=result.wall_s, tokens_per_s=result.tokens_per_s,
                           phase_seconds=dict(result.ledger.phase_seconds)),
        budgets=budgets, verdicts=verdicts,
    )


def run_matrix(engines: Sequence[str], packages: Sequence[str], prompts: Sequence[Sequence[int]] | None,
               max_new_tokens: int, evidence_dir: Path | None = None,
               on_cell: Callable[[CellResult], None] | None = None) -> RunSummary:
    """Run every engine on every package and prompt; never stops at the first failure."""
    from harness import evidence as ev

    classes = {name: get_engine_class(name) for name in engines}  # unknown names fail here
    run_id = ev.new_run_id()
    env = ev.collect_environment()
    cells: list[CellResult] = []

    def emit(cell: CellResult) -> None:
        cells.append(cell)
        if on_cell:
            on_cell(cell)

    for ref in packages:
        package = resolve_package(ref)
        chosen = [list(p) for p in prompts] if prompts else [list(p) for p in package.spec.prompts]
        named = [(f"p{i}", p) for i, p in enumerate(chosen)]
        near_tie = tolerance_for(package.spec.dtype).near_tie_margin
        oracles = {name: oracle_decode(package, p, max_new_tokens) for name, p in named}
        for engine_name, cls in classes.items():
            avail = cls.availability()
            if not avail.ok:
                for name, p in named:
                    emit(CellResult(package.spec.name, engine_name, name, p, UNAVAILABLE,
                                    reason=avail.reason))
                continue
            try:
                engine = cls(package)
            except LockstepError as err:
                for name, p in named:
                    emit(CellResult(package.spec.name, engine_name, name, p, ERROR, reason=str(err)))
                continue
            for name, p in named:
                oracle = oracles[name]
                try:
                    result = greedy_decode(engine, p, max_new_tokens)
                except LockstepError as err:
                    emit(CellResult(package.spec.name, engine_name, name, p, ERROR, reason=str(err)))
                    continue
                div = compare_tokens(oracle.tokens, oracle.margins, result.tokens, near_tie)
                cell = CellResult(package.spec.name, engine_name, name, p,
                                  IDENTICAL if div is None else div.verdict, list(result.tokens),
                                  list(oracle.tokens), div, tokens_per_s=result.tokens_per_s)
                if evidence_dir is not None:
                    record = evidence_record(run_id, env, package, engine, name, result, oracle, div)
                    cell.record_path = ev.write_evidence(record, evidence_dir)
                    if not record.ok and cell.status == IDENTICAL:
                        cell.status, cell.reason = ERROR, "a budget failed: see the evidence"
                emit(cell)
            engine.close()
    return RunSummary(cells, evidence_dir)


__all__ = ["CellResult", "RunSummary", "run_matrix", "REFERENCE_ENGINE"]
