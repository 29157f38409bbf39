"""The matrix runner: engines x packages x modes x prompts, every cell judged and recorded.

One recompute oracle per package (``engines.oracle.Oracle``) judges every engine's stream
on the engine's own prefix (``harness.judge``); the logits audit compares each step's row
with the oracle's; device engines' budgets are judged by the claim registry whether or not
evidence is written. Whatever happens in a cell (an engine's constructor, a forward, the
oracle) becomes that cell's verdict, ``error`` with the exception, and the matrix goes on.
With an evidence folder a run manifest lists the planned cells first and is marked
complete last, and every cell, unavailable and error cells included, writes a record.

Speculative cells judge the speculative stream on its own prefix, store the same engine's
greedy stream (judged too), and say which path is wrong when they part.
"""
from __future__ import annotations

import sys
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path

from engines.engine import Availability, Engine
from engines.errors import EngineUnavailable, InputError, NonFiniteLogits
from engines.oracle import Oracle, OracleTrace, oracle_for
from engines.registry import REFERENCE_ENGINE, class_reference, get_engine_class
from engines.requests import check_count
from engines.tolerances import tolerance_for
from engines.workflow import greedy_decode
from engines.workflow.speculative import speculative_decode
from harness.budgets import budget_summary, device_budgets
from harness.judge import (BUDGET, DEFECT, ERROR, FAILING, IDENTICAL, NEAR_TIE, NON_FINITE,
                           UNAVAILABLE,
                           LogitsAudit, StepJudgement, StreamJudgement, audit_logits,
                           judge_stream, worst)
from harness.packages import resolve_package

MODES = ("greedy", "speculative")


@dataclass
class CellError:
    stage: str  # constructor | oracle | greedy | decode | audit | judge
    type: str
    message: str
    step: int | None = None
    traceback: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, stage: str, exc: BaseException, step: int | None = None) -> "CellError":
        frames = traceback.format_exception(type(exc), exc, exc.__traceback__)
        short = [line.rstrip() for chunk in frames[-6:] for line in chunk.splitlines()][-12:]
        return cls(stage, type(exc).__name__, str(exc), step, short)

    def __str__(self) -> str:
        where = f" at step {self.step}" if self.step is not None else ""
        return f"{self.stage}{where}: {self.type}: {self.message}"


def engine_provenance(engine) -> dict:
    """``Engine.provenance()`` for the record: an engine that builds its own model from the
    checkpoint says which conversion it ran. A failure to say is recorded, never raised: it
    is no reason to lose the cell."""
    try:
        return dict(engine.provenance())
    except Exception as exc:  # noqa: BLE001 - the cell goes on; the record says why
        return {"error": f"{type(exc).__name__}: {exc}"}


@dataclass
class CellResult:
    package: str
    engine: str
    prompt_name: str
    prompt: list[int]
    status: str  # identical | near-tie | drift | budget | defect | non-finite | error | unavailable
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

    @property
    def failed(self) -> bool:
        return self.status in FAILING

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.package, self.engine, self.mode, self.prompt_name)

    @property
    def first_step(self) -> int | None:
        """The first step anything failing was found at: a defect token (this stream's or,
        in a speculative cell, its greedy stream's), a bad logits row, an error."""
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
        return min(steps) if steps else None


@dataclass
class RunSummary:
    cells: list[CellResult]
    evidence_dir: Path | None
    run_id: str = ""
    planned: int = 0
    oracle_checks: dict = field(default_factory=dict)  # package -> OracleAgreement (vetted)

    @property
    def failed(self) -> bool:
        return any(c.failed for c in self.cells)


def decode(engine: Engine, prompt, max_new_tokens: int, width: int | None, audit: bool = False):
    """One greedy (width None) or speculative decode; on a device engine under the transfer
    guard in count mode, so the evidence carries an independent account of every crossing."""
    def run():
        if width is None:
            return greedy_decode(engine, prompt, max_new_tokens, audit=audit)
        return speculative_decode(engine, prompt, max_new_tokens, width)

    if engine.residency == "host":
        return run(), None
    from harness.transfer_guard import transfer_guard

    with transfer_guard("count") as guard:
        result = run()
    # a guard that intercepted nothing (no CuPy here) measured nothing: it is no account
    return result, (guard if guard.intercepted else None)


def _failed_step(exc: BaseException) -> int | None:
    """The step a decode failed at: the token being decided (set by the interpreter)."""
    return getattr(exc, "decode_step", None)


def widths_for(package, mode: str, widths: Sequence[int] | str | None) -> list[int | None]:
    """The widths a package runs at: [None] for greedy; for speculative, ``"all"`` (or None)
    is 1..max_width, a list must lie within it (else ``InputError``)."""
    if mode not in MODES:
        raise InputError("unknown mode", field="--mode", value=mode,
                         remedy=f"use one of: {', '.join(MODES)}")
    if mode == "greedy":
        return [None]
    from engines.workflow.speculative import speculative_widths  # the one width rule

    return list(speculative_widths(package.spec, widths, field="--width"))


@dataclass
class _PackagePlan:
    package: object
    widths: list[int | None]
    labels: dict[int | None, str]
    prompts: list[tuple[str, list[int]]]
    sources: dict = field(default_factory=dict)  # prompt name -> harness.prompts.ResolvedPrompt


def check_counts(max_prompts: int | None, max_new_tokens: int) -> None:
    """``max_prompts`` None (all) or >= 1 and ``max_new_tokens`` >= 1, else an ``InputError``
    naming the field: 0 prompts would otherwise mean all of them, -1 all but the last."""
    if max_prompts is not None:
        check_count(max_prompts, "max_prompts",
                    "pass max_prompts=N with N >= 1, or None for all of a package's prompts")
    check_count(max_new_tokens, "max_new_tokens", "ask for one or more new tokens")


def _plan(resolved, mode, widths, prompts, max_prompts, max_new_tokens) -> list[_PackagePlan]:
    """What runs where; a bad request (prompt, width, mode) is an ``InputError`` here,
    before any cell runs (exit 2), never an error cell."""
    from engines.requests import check_request
    from harness.prompts import PromptSource, resolve_all

    plans = []
    for package in resolved:
        package_widths = widths_for(package, mode, widths)
        sp = package.spec.decoding.speculative
        labels = {w: ("greedy" if w is None else f"{sp.kind}/w{w}") for w in package_widths}
        sources = {}
        if prompts and any(isinstance(p, PromptSource) for p in prompts):
            # text and chat prompts: through this package's tokenizer and chat template
            sources = dict(resolve_all(prompts, package, max_new_tokens))
            named = [(name, list(r.ids)) for name, r in sources.items()]
        else:
            chosen = [list(p) for p in prompts] if prompts else [list(p) for p in package.spec.prompts]
            named = [(f"p{i}", p) for i, p in enumerate(chosen)]
        named = named[:max_prompts] if max_prompts else named
        for _, p in named:
            check_request(package.spec, p, max_new_tokens)
        plans.append(_PackagePlan(package, package_widths, labels, named, sources))
    return plans


class _Judge:
    """The oracle of one package, built lazily; its failure becomes every cell's error."""

    def __init__(self, package, oracle_engine: str | None = None):
        self.package = package
        self.tol = tolerance_for(package.spec.dtype)
        self._oracle: Oracle | None = None
        self._traces: dict[str, OracleTrace | CellError] = {}
        self.oracle_engine = oracle_engine
        self.agreement = None  # harness.oracle_choice.OracleAgreement, once vetted

    def choose(self, prompt: list[int]) -> None:
        """The oracle on ``oracle_engine``, vetted against ort-cpu's on ``prompt`` first (a
        disagreement raises: the run stops before any cell)."""
        from harness.oracle_choice import chosen_oracle

        self._oracle, self.agreement = chosen_oracle(self.package, self.oracle_engine, prompt)

    @property
    def oracle(self) -> Oracle:
        if self._oracle is None:
            self._oracle = oracle_for(self.package)  # a reduced package: its float32 twin
        return self._oracle

    def trace(self, name: str, prompt: list[int], max_new_tokens: int) -> OracleTrace:
        """The oracle's own stream for a prompt; its failure is kept and re-raised."""
        if name not in self._traces:
            try:
                self._traces[name] = self.oracle.decode(prompt, max_new_tokens)
            except Exception as exc:
                self._traces[name] = CellError.of("oracle", exc)
        got = self._traces[name]
        if isinstance(got, CellError):
            raise _OracleFailed(got)
        return got

    def judge(self, prompt, tokens, max_new_tokens, rows=None) -> StreamJudgement:
        return judge_stream(self.oracle, prompt, tokens, max_new_tokens, self.tol, rows)


class _OracleFailed(Exception):
    def __init__(self, error: CellError):
        super().__init__(str(error))
        self.error = error


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """The first step where two streams part (a length difference included), else None."""
    for i in range(max(len(a), len(b))):
        if i >= len(a) or i >= len(b) or a[i] != b[i]:
            return i
    return None


def _describe(finding: StepJudgement) -> str:
    if finding.engine_token is None:
        return f"step {finding.step}: {finding.reason}"
    return (f"step {finding.step}: engine {finding.engine_token}, oracle "
            f"{finding.oracle_token} ({finding.reason})")


def _greedy_cell(engine, judge: _Judge, cell: CellResult, max_new_tokens: int):
    """A greedy cell: the budgeted decode, its judgement, the logits audit, the budgets."""
    host = engine.residency == "host"
    auditable = engine.capabilities().logits_audit
    stage = "decode"
    try:
        result, guard = decode(engine, cell.prompt, max_new_tokens, None,
                               audit=host and auditable)
        cell.tokens, cell.tokens_per_s = list(result.tokens), result.tokens_per_s
        cell.ledger, cell.wall_s = result.ledger, result.wall_s
        rows, how, audit_bytes, audit_tokens = result.logits, "same", 0, None
        if not host and auditable and result.logits is None:
            stage = "audit"  # a device engine: a separate, labelled audit decode
            audit_run = greedy_decode(engine, cell.prompt, max_new_tokens, audit=True)
            rows, how = audit_run.logits, "separate"
            audit_bytes = audit_run.ledger.readback_bytes.get("logits_audit", 0)
            audit_tokens = list(audit_run.tokens)
    except Exception as exc:
        return _errored(cell, CellError.of(stage, exc, _failed_step(exc)))
    cell.budgets, cell.verdicts = device_budgets(engine, result, guard)
    try:
        cell.judgement = judge.judge(cell.prompt, cell.tokens, max_new_tokens, rows)
        if rows is not None:
            cell.audit = audit_logits(judge.oracle, cell.prompt, cell.tokens, rows, judge.tol, how)
            cell.audit.readback_bytes = audit_bytes
    except Exception as exc:
        return _errored(cell, CellError.of("judge", exc))
    notes = [] if auditable else ["logits not audited: the engine declares no logits audit"]
    if audit_tokens is not None and audit_tokens != cell.tokens:
        step = first_difference(audit_tokens, cell.tokens)
        cell.judgement.findings.append(StepJudgement(
            step, cell.tokens[step] if step < len(cell.tokens) else None,
            audit_tokens[step] if step < len(audit_tokens) else None, None, None, DEFECT,
            "the audit decode emitted another stream than the budgeted decode "
            "(nondeterminism)"))
    _finish(cell, notes)
    return cell


def _finish(cell: CellResult, notes: list[str]) -> None:
    """Status and reason from the judgement, the audit and the budgets."""
    from harness.claims import judge

    j, audit = cell.judgement, cell.audit
    statuses = [j.verdict if j else IDENTICAL]
    cell.verdicts["token_identity"] = judge("token_identity", j) if j else "skip"
    if audit is not None:
        statuses.append(audit.verdict)
        cell.verdicts["finite_logits"] = judge("finite_logits", audit)
        cell.verdicts["logits_within_tolerance"] = judge("logits_within_tolerance", audit)
        if audit.non_finite_steps:
            s = audit.first_non_finite
            notes.insert(0, f"non-finite logits at step {s.step} ({s.non_finite} entries; "
                            f"{audit.non_finite_steps} step(s) in all)")
        elif not audit.within_tolerance:
            s = audit.first_out_of_tolerance
            notes.append(f"logits outside the {audit.dtype} tolerance from step {s.step} "
                         f"(max abs {s.max_abs:.3g}, NMSE {s.nmse:.3g}; "
                         f"{audit.out_of_tolerance_steps} step(s))")
    if any(b.verdict == "fail" for b in cell.budgets):
        statuses.append(BUDGET)
        notes.append("budget: " + budget_summary(cell.budgets))
    cell.status = worst(*statuses)
    cell.divergence = j.first if j else None
    if j is not None and j.defects:
        notes.insert(0, f"{j.defects} defect step(s), first at " + _describe(j.first))
    cell.reason = "; ".join([cell.reason] * bool(cell.reason) + notes)


def _speculative_cell(engine, judge: _Judge, cell: CellResult, max_new_tokens: int, width: int,
                      greedy):
    """A speculative cell: its stream judged on its own prefix, the greedy stream beside it,
    and a message that names the wrong path when they part."""
    if isinstance(greedy, CellError):
        return _errored(cell, greedy)
    greedy_tokens, greedy_judgement = greedy
    cell.greedy_tokens, cell.greedy_judgement = greedy_tokens, greedy_judgement
    try:
        result, guard = decode(engine, cell.prompt, max_new_tokens, width)
    except Exception as exc:
        return _errored(cell, CellError.of("decode", exc, _failed_step(exc)))
    cell.tokens, cell.tokens_per_s = list(result.tokens), result.tokens_per_s
    cell.ledger, cell.wall_s = result.ledger, result.wall_s
    led = result.ledger
    cell.acceptance_per_round = list(result.acceptance_per_round)
    cell.tallies = {k: getattr(led, k) for k in ("proposals", "accepted", "rejected",
                                                  "rollbacks", "full_accepts", "snapshots",
                                                  "restores")}
    cell.budgets, cell.verdicts = device_budgets(engine, result, guard)
    try:
        cell.judgement = judge.judge(cell.prompt, cell.tokens, max_new_tokens)
    except Exception as exc:
        return _errored(cell, CellError.of("judge", exc))
    notes: list[str] = []
    spec_bad = cell.judgement.defects > 0
    greedy_bad = greedy_judgement.defects > 0
    parted = first_difference(cell.tokens, greedy_tokens)
    if spec_bad:
        notes.append("the speculative path is wrong" + (
            " (so is the greedy path)" if greedy_bad else ""))
    elif greedy_bad:
        g = greedy_judgement.first
        notes.append(f"the greedy path is wrong at step {g.step} (engine {g.engine_token}, "
                     f"oracle {g.oracle_token}); the speculative stream agrees with the oracle")
    if parted is None:
        cell.verdicts["spec_equals_greedy"] = "pass"
    elif engine.batch_invariant:
        cell.verdicts["spec_equals_greedy"] = "fail"
        if not (spec_bad or greedy_bad):
            notes.append(f"speculative and greedy part at step {parted}; both are within "
                         f"tolerance of the oracle, but this engine declares batch invariance")
    else:
        cell.verdicts["spec_equals_greedy"] = "skip"
        if not (spec_bad or greedy_bad):
            notes.append(f"speculative and greedy part at step {parted}, both within the "
                         f"near-tie tolerance of the oracle (the engine is not batch-invariant)")
    _finish(cell, notes)
    if greedy_bad and not spec_bad:
        cell.status = worst(cell.status, DEFECT)
    elif parted is not None and engine.batch_invariant:
        cell.status = worst(cell.status, DEFECT)
    elif parted is not None:
        cell.status = worst(cell.status, NEAR_TIE)
    return cell


def _errored(cell: CellResult, error: CellError) -> CellResult:
    """The cell failed with ``error``; an all-NaN logits row (no token could be chosen,
    ``NonFiniteLogits``, detected on the engine's own residency) is ``non-finite``."""
    non_finite = error.type == NonFiniteLogits.__name__
    cell.status, cell.error = (NON_FINITE if non_finite else ERROR), error
    cell.reason = (f"an all-NaN logits row at step {error.step}: no token" if non_finite
                   else str(error))
    if non_finite:
        cell.verdicts["finite_logits"] = "fail"
    return cell


def _greedy_for_speculation(engine, judge: _Judge, prompt, max_new_tokens):
    """The engine's greedy stream for a prompt, judged; a failure is kept as a CellError."""
    try:
        result, _ = decode(engine, prompt, max_new_tokens, None)
    except Exception as exc:
        return CellError.of("greedy", exc, _failed_step(exc))
    try:
        return list(result.tokens), judge.judge(prompt, result.tokens, max_new_tokens)
    except Exception as exc:
        return CellError.of("judge", exc)


def resolve_engines(engines: Sequence[str | type[Engine]]) -> dict[str, type[Engine]]:
    """Engine names (or "module:Class", or classes) -> classes, keyed by the engine's name;
    an unknown or ill-defined engine, or one engine named twice (in one spelling or two),
    fails here, before anything runs (``engines.registry.resolve_engine_list``)."""
    from engines.registry import resolve_engine_list

    return resolve_engine_list(engines, field="engines")


def _record(cell: CellResult, package, judge: _Judge | None, *, run_id: str, env,
            evidence_dir: Path | None, max_new_tokens: int) -> CellResult:
    """A finished cell's reference stream (an oracle failure makes it an ``error`` cell) and,
    with an evidence folder, its record: what ``run_matrix`` emits for every cell (and
    ``CellRunner`` for a cell run on its own)."""
    from harness import evidence as ev
    from harness.records import cell_record

    trace = None
    if judge is not None:
        try:
            trace = judge.trace(cell.prompt_name, cell.prompt, max_new_tokens)
            cell.reference = list(trace.tokens)
        except _OracleFailed as failed:
            if cell.status != UNAVAILABLE:
                _errored(cell, failed.error)
    if evidence_dir is not None:
        ran = judge is not None and judge._oracle is not None
        record = cell_record(run_id, env, package, cell, trace,
                             judge.oracle.name if ran else REFERENCE_ENGINE,
                             judge.tol if judge else None,
                             judge.oracle.package if ran else None,
                             oracle_check=judge.agreement if judge else None)
        cell.record_path = ev.write_evidence(record, evidence_dir)
    return cell


def plan_manifest(run_id: str, plans, engine_names: Sequence[str],
                  command: Sequence[str] | None = None):
    """The run manifest of ``plans`` (``_plan``'s packages, widths and prompts) over the
    engines: every planned cell, in the order the runner runs them."""
    from harness.manifest import PlannedCell, RunManifest

    planned = [PlannedCell(package=pp.package.spec.name, engine=name, mode=pp.labels[w],
                           prompt=prompt_name)
               for pp in plans for name in engine_names for w in pp.widths
               for prompt_name, _ in pp.prompts]
    return RunManifest(run_id=run_id, started=datetime.now(timezone.utc),
                       command=list(command if command is not None else sys.argv),
                       planned=planned)


def run_matrix(engines: Sequence[str | type[Engine]], packages: Sequence[str],
               prompts: Sequence[Sequence[int]] | None, max_new_tokens: int,
               evidence_dir: Path | None = None,
               on_cell: Callable[[CellResult], None] | None = None, mode: str = "greedy",
               widths: Sequence[int] | str | None = None, max_prompts: int | None = None,
               on_plan: Callable[[int], None] | None = None,
               command: Sequence[str] | None = None,
               oracle_engine: str | None = None) -> RunSummary:
    """Run every engine on every package, width and prompt; never stops at a failure.

    ``prompts``: lists of ids, or ``harness.prompts.PromptSource`` (text, chat, ids) resolved
    per package. ``oracle_engine``: the engine the recompute oracle runs on (default
    ort-cpu), vetted against ort-cpu's oracle on each package's first prompt before anything
    runs (``harness.oracle_choice``).

    Bad requests (an unknown engine or mode, a width outside a package's range, a package
    without a speculative section in speculative mode, an oracle engine that disagrees)
    fail before anything runs, as do a ``max_prompts`` or ``max_new_tokens`` below 1."""
    from harness import evidence as ev
    from harness.manifest import finish, write_manifest

    check_counts(max_prompts, max_new_tokens)
    classes = resolve_engines(engines)
    references = {n: class_reference(c) for n, c in classes.items()}  # records' engine_class
    plans = _plan([resolve_package(ref) for ref in packages], mode, widths, prompts, max_prompts,
                  max_new_tokens)
    judges = [_Judge(pp.package, oracle_engine) for pp in plans]
    if oracle_engine is not None:
        for pp, judge in zip(plans, judges):
            judge.choose(pp.prompts[0][1])
    run_id = ev.new_run_id()
    env = ev.collect_environment()
    manifest = plan_manifest(run_id, plans, list(classes), command)
    planned = manifest.planned
    if evidence_dir is not None:
        write_manifest(evidence_dir, manifest)
    if on_plan:
        on_plan(len(planned))
    cells: list[CellResult] = []

    def emit(cell: CellResult, package, judge: _Judge | None) -> None:
        _record(cell, package, judge, run_id=run_id, env=env, evidence_dir=evidence_dir,
                max_new_tokens=max_new_tokens)
        cells.append(cell)
        if on_cell:
            on_cell(cell)

    for pp, judge in zip(plans, judges):
        package = pp.package
        name = package.spec.name

        def blank(engine_name, w, prompt_name, prompt, status=IDENTICAL, reason=""):
            return CellResult(name, engine_name, prompt_name, prompt, status, reason=reason,
                              mode=pp.labels[w], prompt_source=pp.sources.get(prompt_name),
                              engine_class=references[engine_name])

        for engine_name, cls in classes.items():
            try:
                avail = cls.availability()
            except Exception as exc:
                avail = None
                failure = CellError.of("availability", exc)
            if avail is not None and avail.ok and mode == "speculative" \
                    and not cls.capabilities().speculative:
                avail = Availability(False, f"{engine_name} declares no speculative decoding "
                                            f"(capabilities: speculative false)")
            if avail is not None and not avail.ok:
                for w in pp.widths:
                    for prompt_name, p in pp.prompts:
                        emit(blank(engine_name, w, prompt_name, p, UNAVAILABLE, avail.reason),
                             package, None)
                continue
            engine = None
            if avail is not None:
                try:
                    engine = cls(package)
                except EngineUnavailable as err:  # an engine that loads only some packages
                    for w in pp.widths:
                        for prompt_name, p in pp.prompts:
                            emit(blank(engine_name, w, prompt_name, p, UNAVAILABLE, str(err)),
                                 package, None)
                    continue
                except Exception as exc:
                    failure = CellError.of("constructor", exc)
            if engine is None:
                for w in pp.widths:
                    for prompt_name, p in pp.prompts:
                        emit(_errored(blank(engine_name, w, prompt_name, p), failure),
                             package, judge)
                continue
            provenance = engine_provenance(engine)
            try:
                greedy_streams = {}
                if mode == "speculative":
                    for prompt_name, p in pp.prompts:
                        greedy_streams[prompt_name] = _greedy_for_speculation(
                            engine, judge, p, max_new_tokens)
                for w in pp.widths:
                    for prompt_name, p in pp.prompts:
                        cell = blank(engine_name, w, prompt_name, p)
                        cell.provenance = provenance
                        try:
                            judge.trace(prompt_name, p, max_new_tokens)
                        except _OracleFailed as failed:
                            emit(_errored(cell, failed.error), package, judge)
                            continue
                        if w is None:
                            _greedy_cell(engine, judge, cell, max_new_tokens)
                        else:
                            _speculative_cell(engine, judge, cell, max_new_tokens, w,
                                              greedy_streams[prompt_name])
                        emit(cell, package, judge)
            finally:
                try:
                    engine.close()
                except Exception:
                    pass  # a close that fails must not hide the cells' verdicts
    if evidence_dir is not None:
        finish(evidence_dir, manifest, datetime.now(timezone.utc))
    return RunSummary(cells, evidence_dir, run_id, len(planned),
                      {pp.package.spec.name: j.agreement for pp, j in zip(plans, judges)
                       if j.agreement is not None})


class _Unavailable(str):
    """An engine that cannot run here (its reason), as ``CellRunner`` remembers it."""


class CellRunner:
    """Runs planned cells one at a time, as ``run_matrix``'s loop runs them, so that any process
    (a pytest-xdist worker of ``lockstep run --devices``) can run a share of a matrix and write
    the same records: the same availability, capability and constructor handling, one engine
    alive at a time (closed when a cell of another engine or package arrives, or at
    ``close``), one judge per package (its oracle cache serves every engine of the package),
    and before a package's first speculative cell of an engine, that engine's greedy streams
    for every planned prompt of the package. Cells must arrive in ``run_matrix``'s order within
    a package (package, engine, width, prompt). This mirrors ``run_matrix``: change the two
    together (``suites/test_distributed.py`` runs both and compares every record)."""

    def __init__(self, run_id: str, mode: str, max_new_tokens: int,
                 evidence_dir: Path | None, env=None):
        from harness import evidence as ev

        self.run_id, self.mode, self.max_new_tokens = run_id, mode, max_new_tokens
        self.evidence_dir = evidence_dir
        self.env = env if env is not None else ev.collect_environment()
        self._package_ref: str | None = None
        self._package = None
        self._judge: _Judge | None = None
        self._engine_ref: str | None = None
        self._engine_name = ""
        self._engine_class: str | None = None
        self._engine: Engine | CellError | _Unavailable | None = None
        self._greedy: dict | None = None

    def _close_engine(self) -> None:
        engine, self._engine, self._engine_ref, self._greedy = self._engine, None, None, None
        if isinstance(engine, Engine):
            try:
                engine.close()
            except Exception:
                pass  # a close that fails must not hide the cells' verdicts

    def close(self) -> None:
        self._close_engine()
        self._package_ref = self._package = self._judge = None

    def _use_package(self, package_ref: str) -> None:
        if package_ref != self._package_ref:
            self.close()
            self._package = resolve_package(package_ref)
            self._package_ref, self._judge = package_ref, _Judge(self._package)

    def _setup(self, cls: type[Engine]):
        """run_matrix's per-engine preamble: the engine, or why its cells cannot run."""
        try:
            avail = cls.availability()
        except Exception as exc:
            return CellError.of("availability", exc)
        if avail.ok and self.mode == "speculative" and not cls.capabilities().speculative:
            avail = Availability(False, f"{cls.name} declares no speculative decoding "
                                        f"(capabilities: speculative false)")
        if not avail.ok:
            return _Unavailable(avail.reason)
        try:
            return cls(self._package)
        except EngineUnavailable as err:  # an engine that loads only some packages
            return _Unavailable(str(err))
        except Exception as exc:
            return CellError.of("constructor", exc)

    def run(self, package_ref: str, engine_ref: str, label: str, width: int | None,
            prompt_name: str, prompt: list[int],
            package_prompts: Sequence[tuple[str, list[int]]]) -> CellResult:
        """One cell, judged and (with an evidence folder) recorded. ``package_prompts``: every
        planned prompt of the package, in plan order (a speculative cell's greedy streams)."""
        self._use_package(package_ref)
        if engine_ref != self._engine_ref:
            self._close_engine()
            cls = get_engine_class(engine_ref)
            self._engine = self._setup(cls)
            self._engine_ref, self._engine_name = engine_ref, cls.name
            self._engine_class = class_reference(cls)
        package, judge, state = self._package, self._judge, self._engine
        cell = CellResult(package.spec.name, self._engine_name, prompt_name, list(prompt),
                          IDENTICAL, mode=label, engine_class=self._engine_class)
        if isinstance(state, _Unavailable):
            cell.status, cell.reason = UNAVAILABLE, str(state)
            return self._emit(cell, None)
        if isinstance(state, CellError):
            return self._emit(_errored(cell, state), judge)
        cell.provenance = engine_provenance(state)
        if self.mode == "speculative" and self._greedy is None:
            self._greedy = {n: _greedy_for_speculation(state, judge, list(p),
                                                       self.max_new_tokens)
                            for n, p in package_prompts}
        try:
            judge.trace(prompt_name, cell.prompt, self.max_new_tokens)
        except _OracleFailed as failed:
            return self._emit(_errored(cell, failed.error), judge)
        if width is None:
            _greedy_cell(state, judge, cell, self.max_new_tokens)
        else:
            _speculative_cell(state, judge, cell, self.max_new_tokens, width,
                              self._greedy[prompt_name])
        return self._emit(cell, judge)

    def failed(self, package_ref: str, engine_name: str, label: str, prompt_name: str,
               prompt: list[int], error: CellError) -> CellResult:
        """The ``error`` record of a cell that could not be run as a cell: its process died
        while running it, or something outside the cell's own guards raised."""
        self._use_package(package_ref)
        cell = CellResult(self._package.spec.name, engine_name, prompt_name, list(prompt),
                          IDENTICAL, mode=label)
        return self._emit(_errored(cell, error), None)

    def _emit(self, cell: CellResult, judge: _Judge | None) -> CellResult:
        return _record(cell, self._package, judge, run_id=self.run_id, env=self.env,
                       evidence_dir=self.evidence_dir, max_new_tokens=self.max_new_tokens)


__all__ = ["MODES", "CellResult", "CellRunner", "RunSummary", "run_matrix", "widths_for",
           "REFERENCE_ENGINE"]
