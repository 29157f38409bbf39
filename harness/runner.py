"""The matrix runner: engines x packages x modes x prompts, each stream against the oracle.

The oracle is computed once per (package, prompt); every engine's stream is compared to it
exactly, divergences get a margin-aware verdict, and one evidence record is written per cell.
Mode ``greedy`` is one cell per (package, engine, prompt); mode ``speculative`` is one cell
per width as well, and each speculative stream is compared with that engine's greedy stream
AND with the oracle (claim 1: speculative == greedy == oracle, exactly).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from engines.engine import Engine
from engines.errors import EngineUnavailable, InputError, LockstepError
from engines.oracle import OracleTrace, oracle_decode
from engines.registry import REFERENCE_ENGINE, get_engine_class
from engines.tolerances import tolerance_for
from engines.workflow import DecodeResult, greedy_decode
from engines.workflow.speculative import SpeculativeResult, speculative_decode
from harness.compare import DEFECT, TokenDivergence, compare_tokens
from harness.packages import resolve_package

MODES = ("greedy", "speculative")
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
    mode: str = "greedy"  # greedy, or <kind>/w<width> for a speculative cell
    acceptance_per_round: list[int] = field(default_factory=list)
    tallies: dict[str, int] = field(default_factory=dict)

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


def expected_readback(result: DecodeResult | SpeculativeResult) -> tuple[int, str]:
    """Claim 4's exact budget for a decode, in bytes, and how it is made up."""
    if not isinstance(result, SpeculativeResult):
        return 4 * len(result.tokens), "exactly 4 bytes (one int32 token id) per generated token"
    ledger = result.ledger
    return ((4 * (1 + ledger.forwards["decode"] + sum(result.widths_per_round))
             + 8 * ledger.proposals),
            "4 bytes per proposer step (draft id), 8 per verification (accept count + bonus "
            "id), 4 per prefill or decode token")


def device_budgets(engine: Engine, result, guard=None):
    """Claims 3 and 4 on a device-resident engine, by its own ledger and, where the decode ran
    under it, by the independent transfer guard: zero staging, the exact readback budget."""
    from harness.evidence import BudgetCheck

    if engine.residency == "host":
        return [], {"zero_staging": "skip", "readback_budget": "skip"}
    expected, note = expected_readback(result)
    ledger = result.ledger
    measured = [("zero_staging", ledger.host_staging, "events (ledger)"),
                ("readback_budget", ledger.readback_total, "bytes (ledger)")]
    if guard is not None:
        measured += [("zero_staging", guard.staging_count, "events (transfer guard)"),
                     ("readback_budget", sum(guard.readback_bytes.values()), "bytes (transfer guard)")]
    checks = []
    for claim, value, unit in measured:
        budget = 0 if claim == "zero_staging" else expected
        checks.append(BudgetCheck(claim=claim, budget=budget, measured=value, unit=unit,
                                  verdict="pass" if value == budget else "fail",
                                  note=None if claim == "zero_staging" else note))
    verdicts = {claim: ("fail" if any(c.claim == claim and c.verdict == "fail" for c in checks)
                        else "pass") for claim in ("zero_staging", "readback_budget")}
    return checks, verdicts


def decode(engine: Engine, prompt, max_new_tokens: int, width: int | None):
    """One greedy (width None) or speculative decode; on a device engine under the transfer
    guard in count mode, so the evidence carries an independent account of every crossing."""
    def run():
        if width is None:
            return greedy_decode(engine, prompt, max_new_tokens)
        return speculative_decode(engine, prompt, max_new_tokens, width)

    if engine.residency == "host":
        return run(), None
    from harness.transfer_guard import transfer_guard

    with transfer_guard("count") as guard:
        result = run()
    return result, guard


def evidence_record(run_id, env, package, engine: Engine, prompt_name, result: DecodeResult,
                    oracle: OracleTrace, divergence: TokenDivergence | None,
                    greedy_divergence: TokenDivergence | None = None, guard=None):
    from engines.tokenizer import decode_each
    from harness import evidence as ev

    speculative = isinstance(result, SpeculativeResult)
    budgets, verdicts = device_budgets(engine, result, guard)
    first = divergence or greedy_divergence
    defect = any(d is not None and d.verdict == DEFECT for d in (divergence, greedy_divergence))
    verdicts["token_identity"] = "fail" if defect else "pass"
    mode = (ev.Mode(kind=result.kind, width=result.width) if speculative
            else ev.Mode(kind="greedy"))
    return ev.EvidenceRecord(
        run_id=run_id, environment=env,
        package=ev.PackageRef(name=package.spec.name, content_hash=package.content_hash,
                              path=str(package.root)),
        engine=engine.name, mode=mode,
        prompt=ev.PromptRef(name=prompt_name, ids=list(result.prompt),
                            text=decode_each(package, result.prompt, joined=True)),
        tokens=list(result.tokens), token_digest=ev.token_digest(result.tokens),
        tokens_text=decode_each(package, result.tokens),
        reference=ev.ReferenceRef(engine=f"oracle:{oracle.engine}", tokens=list(oracle.tokens),
                                  digest=ev.token_digest(oracle.tokens),
                                  margins=list(oracle.margins)),
        divergence=None if first is None else ev.Divergence(
            step=first.step, reference_token=first.reference_token,
            engine_token=first.engine_token,
            margin=first.margin if first.margin != float("inf") else None,
            verdict=first.verdict),
        ledger=result.ledger.to_dict(),
        acceptance_per_round=list(result.acceptance_per_round) if speculative else [],
        timings=ev.Timings(wall_s=result.wall_s, tokens_per_s=result.tokens_per_s,
                           phase_seconds=dict(result.ledger.phase_seconds)),
        budgets=budgets, verdicts=verdicts,
    )


def widths_for(package, mode: str, widths: Sequence[int] | str | None) -> list[int | None]:
    """The widths a package runs at: [None] for greedy; for speculative, ``"all"`` (or None)
    is 1..max_width, a list must lie within it (else ``InputError``)."""
    if mode not in MODES:
        raise InputError("unknown mode", field="--mode", value=mode,
                         remedy=f"use one of: {', '.join(MODES)}")
    if mode == "greedy":
        return [None]
    sp = package.spec.decoding.speculative
    if sp is None:
        raise InputError(f"package {package.spec.name!r} declares no speculative decoding",
                         field="--packages", value=package.spec.name,
                         remedy="drop it from --packages, or run it with --mode greedy")
    if widths is None or widths == "all":
        return list(range(1, sp.max_width + 1))
    for w in widths:
        if not 1 <= w <= sp.max_width:
            raise InputError(f"width {w} is outside 1..max_width {sp.max_width} of "
                             f"{package.spec.name!r}", field="--width", value=w,
                             remedy=f"use --width in 1..{sp.max_width}, or --width all")
    return list(widths)


def run_matrix(engines: Sequence[str], packages: Sequence[str], prompts: Sequence[Sequence[int]] | None,
               max_new_tokens: int, evidence_dir: Path | None = None,
               on_cell: Callable[[CellResult], None] | None = None, mode: str = "greedy",
               widths: Sequence[int] | str | None = None,
               max_prompts: int | None = None) -> RunSummary:
    """Run every engine on every package, width and prompt; never stops at the first failure.

    Bad requests (an unknown engine or mode, a width outside a package's range, a package
    without a speculative section in speculative mode) fail before anything runs."""
    from harness import evidence as ev

    classes = {name: get_engine_class(name) for name in engines}  # unknown names fail here
    resolved = [resolve_package(ref) for ref in packages]
    plan = [(package, widths_for(package, mode, widths)) for package in resolved]
    run_id = ev.new_run_id()
    env = ev.collect_environment()
    cells: list[CellResult] = []

    def emit(cell: CellResult) -> None:
        cells.append(cell)
        if on_cell:
            on_cell(cell)

    for package, package_widths in plan:
        sp = package.spec.decoding.speculative
        labels = {w: ("greedy" if w is None else f"{sp.kind}/w{w}") for w in package_widths}
        chosen = [list(p) for p in prompts] if prompts else [list(p) for p in package.spec.prompts]
        chosen = chosen[:max_prompts] if max_prompts else chosen
        named = [(f"p{i}", p) for i, p in enumerate(chosen)]
        near_tie = tolerance_for(package.spec.dtype).near_tie_margin
        oracles = {name: oracle_decode(package, p, max_new_tokens) for name, p in named}
        for engine_name, cls in classes.items():
            avail = cls.availability()
            if not avail.ok:
                for w in package_widths:
                    for name, p in named:
                        emit(CellResult(package.spec.name, engine_name, name, p, UNAVAILABLE,
                                        reason=avail.reason, mode=labels[w]))
                continue
            try:
                engine = cls(package)
            except EngineUnavailable as err:  # e.g. an engine that loads only some packages
                for w in package_widths:
                    for name, p in named:
                        emit(CellResult(package.spec.name, engine_name, name, p, UNAVAILABLE,
                                        reason=str(err), mode=labels[w]))
                continue
            except LockstepError as err:
                for w in package_widths:
                    for name, p in named:
                        emit(CellResult(package.spec.name, engine_name, name, p, ERROR,
                                        reason=str(err), mode=labels[w]))
                continue
            greedy_streams: dict[str, list[int] | LockstepError] = {}
            if mode == "speculative":
                for name, p in named:
                    try:
                        greedy_streams[name] = decode(engine, p, max_new_tokens, None)[0].tokens
                    except LockstepError as err:
                        greedy_streams[name] = err
            for w in package_widths:
                for name, p in named:
                    oracle = oracles[name]
                    greedy = greedy_streams.get(name)
                    try:
                        if isinstance(greedy, LockstepError):
                            raise greedy
                        result, guard = decode(engine, p, max_new_tokens, w)
                    except LockstepError as err:
                        emit(CellResult(package.spec.name, engine_name, name, p, ERROR,
                                        reason=str(err), mode=labels[w]))
                        continue
                    div = compare_tokens(oracle.tokens, oracle.margins, result.tokens, near_tie)
                    gdiv = None if greedy is None else compare_tokens(
                        greedy, oracle.margins, result.tokens, near_tie)
                    worst = div if div is not None else gdiv
                    cell = CellResult(package.spec.name, engine_name, name, p,
                                      IDENTICAL if worst is None else worst.verdict,
                                      list(result.tokens), list(oracle.tokens), worst,
                                      tokens_per_s=result.tokens_per_s, mode=labels[w])
                    if gdiv is not None and div is None:
                        cell.reason = "the speculative stream differs from greedy"
                    if isinstance(result, SpeculativeResult):
                        led = result.ledger
                        cell.acceptance_per_round = list(result.acceptance_per_round)
                        cell.tallies = {k: getattr(led, k) for k in (
                            "proposals", "accepted", "rejected", "rollbacks", "full_accepts",
                            "snapshots", "restores")}
                    if evidence_dir is not None:
                        record = evidence_record(run_id, env, package, engine, name, result,
                                                 oracle, div, gdiv, guard)
                        cell.record_path = ev.write_evidence(record, evidence_dir)
                        if not record.ok and cell.status == IDENTICAL:
                            cell.status, cell.reason = ERROR, "a budget failed: see the evidence"
                    emit(cell)
            engine.close()
    return RunSummary(cells, evidence_dir)


__all__ = ["MODES", "CellResult", "RunSummary", "run_matrix", "widths_for", "REFERENCE_ENGINE"]
