"""The one cell driver: runs planned cells one at a time and judges and records each.

Every way of running a matrix goes through ``CellRunner``: ``run_matrix`` in this process,
one shard of several machines (``--shard``), and each pytest-xdist worker of ``lockstep run
--devices`` (``harness.matrix_cells``). It keeps one engine alive at a time (closed when a cell
of another engine or package arrives, or at ``close``) and one judge per package (its oracle
rows serve every engine of the package). Whatever happens in a cell (an engine's constructor,
a forward, the oracle) becomes that cell's verdict, ``error`` with the exception, and the
caller goes on.

A cell decodes first, then is judged: the oracle scores the engine's stream in one forward
(stream mode) and finds its own stream from there (``PackageJudge.trace``); the judgement and
the logits audit read the same rows. A speculative cell judges its stream on its own prefix,
stores the same engine's greedy stream (judged too), says which path is wrong when they part,
and audits every row of every target forward that decided a token (the verification rows
included). On a device engine the audited rows come from a separate, labelled audit decode,
so the judged decode keeps its exact budget.
"""
from __future__ import annotations

import warnings
from pathlib import Path

from engines.decode_result import DecodeResult
from engines.engine import Availability, Engine
from engines.errors import EngineUnavailable, NonFiniteLogits
from engines.oracle import Oracle, STREAM
from engines.package import load_package
from engines.registry import REFERENCE_ENGINE, class_reference, get_engine_class
from engines.tokenizer import decode_each
from engines.tolerances import band_for
from engines.workflow import greedy_decode
from engines.workflow.speculative import speculative_decode
from harness import evidence as ev
from harness.budgets import budget_summary, device_budgets
from harness.cells import CellError, CellResult
from harness.claims import FAIL, SKIP, judge_claim
from harness.concurrency import compare
from harness.judgement import (BUDGET, DEFECT, DRIFT, ERROR, IDENTICAL, NEAR_TIE, NON_FINITE,
                               UNAVAILABLE, StepJudgement, band_statistics, first_difference, worst)
from harness.package_judge import OracleFailed, PackageJudge
from harness.packages import resolve_package
from harness.plan import CellSpec
from harness.quality import original_package, quality
from harness.records import cell_record
from harness.topk_audit import TopkAudit
from harness.transfer_guard import transfer_guard


def engine_provenance(engine) -> dict:
    """``Engine.provenance()`` for the record: an engine that builds its own model from the
    checkpoint says which conversion it ran. A failure to say is recorded, never raised: it
    is no reason to lose the cell."""
    try:
        return dict(engine.provenance())
    except Exception as exc:  # noqa: BLE001 - the cell goes on; the record says why
        return {"error": f"{type(exc).__name__}: {exc}"}


def decode(engine: Engine, prompt, max_new_tokens: int, width: int | None, audit: bool = False):
    """One greedy (width None) or speculative decode; on a device engine under the transfer
    guard in count mode, so the evidence carries an independent account of every crossing."""
    def run():
        if width is None:
            return greedy_decode(engine, prompt, max_new_tokens, audit=audit)
        return speculative_decode(engine, prompt, max_new_tokens, width, audit=audit)

    if engine.residency == "host":
        return run(), None
    with transfer_guard("count") as guard:
        result = run()
    # a guard that intercepted nothing (no CuPy here) measured nothing: it is no account
    return result, (guard if guard.intercepted else None)


def _failed_step(exc: BaseException) -> int | None:
    """The step a decode failed at: the token being decided (set by the interpreter)."""
    return getattr(exc, "decode_step", None)


def _describe(finding: StepJudgement) -> str:
    if finding.engine_token is None:
        return f"step {finding.step}: {finding.reason}"
    return (f"step {finding.step}: engine {finding.engine_token}, oracle "
            f"{finding.oracle_token} ({finding.reason})")


def _errored(cell: CellResult, error: CellError) -> CellResult:
    """The cell failed with ``error``; an all-NaN logits row (no token could be chosen,
    ``NonFiniteLogits``, detected on the engine's own residency) is ``non-finite``."""
    non_finite = error.type == NonFiniteLogits.__name__
    cell.status, cell.error = (NON_FINITE if non_finite else ERROR), error
    cell.reason = (f"an all-NaN logits row at step {error.step}: no token" if non_finite
                   else str(error))
    if non_finite:
        cell.verdicts["finite_logits"] = FAIL
    return cell


def _audit_decode(engine, cell: CellResult, max_new_tokens: int, width: int | None, result):
    """The audited rows of a cell's decode and how they were taken: from the judged decode on
    the host (``same``), else from a separate, labelled audit decode (``separate``) whose
    stream must equal the judged one (a finding is added to the judgement otherwise)."""
    caps = engine.capabilities()
    if engine.residency == "host" or not (caps.logits_audit or caps.logprobs_audit):
        return result, "same"
    if width is None and (result.logits is not None or result.top_logprobs is not None):
        return result, "same"  # a black box that returns its rows (or top-k) with the stream
    audit_run = (greedy_decode(engine, cell.prompt, max_new_tokens, audit=True) if width is None
                 else speculative_decode(engine, cell.prompt, max_new_tokens, width, audit=True))
    return audit_run, "separate"


def _nondeterminism(cell: CellResult, audit_tokens: list[int]) -> None:
    """The audit decode emitted another stream than the judged decode: a defect."""
    step = first_difference(audit_tokens, cell.tokens)
    if step is None:
        return
    cell.judgement.findings.append(StepJudgement(
        step, cell.tokens[step] if step < len(cell.tokens) else None,
        audit_tokens[step] if step < len(audit_tokens) else None, None, None, DEFECT,
        "the audit decode emitted another stream than the budgeted decode (nondeterminism)"))


def _greedy_cell(engine, judge: PackageJudge, cell: CellResult, max_new_tokens: int,
                 tol=None):
    """A greedy cell: the budgeted decode, its judgement, the logits audit, the budgets
    (``tol``: a quantized scheme's band row, else the package dtype's)."""
    host = engine.residency == "host"
    caps = engine.capabilities()
    auditable = caps.logits_audit or caps.logprobs_audit
    stage = "decode"
    try:
        result, guard = decode(engine, cell.prompt, max_new_tokens, None,
                               audit=host and auditable)
        cell.tokens, cell.tokens_per_s = list(result.tokens), result.tokens_per_s
        cell.ledger, cell.wall_s = result.ledger, result.wall_s
        cell.alone_top = result.top_logprobs
        stage = "audit"
        audited, how = (_audit_decode(engine, cell, max_new_tokens, None, result) if auditable
                        else (result, "same"))
    except Exception as exc:
        return _errored(cell, CellError.of(stage, exc, _failed_step(exc)))
    cell.budgets, cell.verdicts = device_budgets(engine, result, guard)
    try:
        judge.trace(cell.prompt_name, cell.prompt, max_new_tokens, hint=cell.tokens)
    except OracleFailed as failed:
        return _errored(cell, failed.error)
    rows = audited.logits if caps.logits_audit else None
    top = audited.top_logprobs if caps.logprobs_audit else None
    try:
        cell.judgement = judge.judge_stream(cell.prompt, cell.tokens, max_new_tokens, rows, tol)
        if rows is not None:
            cell.audit = judge.audit(cell.prompt, audited.tokens, rows, how, tol)
        elif top is not None:  # a server's top-k log-probabilities (harness.topk_audit)
            cell.audit = judge.audit_top_logprobs(cell.prompt, audited.tokens, top, how, tol)
        if cell.audit is not None:
            cell.audit.readback_bytes = (audited.ledger.readback_bytes.get("logits_audit", 0)
                                         if how == "separate" else 0)
            cell.logits = (list(audited.tokens), rows)  # for its quality (CellRunner.run)
    except Exception as exc:
        return _errored(cell, CellError.of("judge", exc))
    if how == "separate":
        _nondeterminism(cell, list(audited.tokens))
    notes = [] if auditable else ["logits not audited: the engine declares no logits audit"]
    _finish(cell, notes)
    return cell


def _finish(cell: CellResult, notes: list[str]) -> None:
    """Status and reason from the judgement, the audit and the budgets; every claim's verdict
    through the claims registry."""
    j, audit = cell.judgement, cell.audit
    statuses = [j.verdict if j else IDENTICAL]
    cell.verdicts["token_identity"] = judge_claim("token_identity", j) if j else SKIP
    if audit is not None:
        statuses.append(audit.verdict)
        cell.verdicts["finite_logits"] = judge_claim("finite_logits", audit)
        cell.verdicts["logits_within_tolerance"] = judge_claim("logits_within_tolerance", audit)
        if audit.non_finite_steps and isinstance(audit, TopkAudit):
            notes.insert(0, f"non-finite log-probabilities at {audit.describe_first()} "
                            f"({audit.non_finite_steps} step(s) in all)")
        elif audit.non_finite_steps:
            s = audit.first_non_finite
            where = f" ({s.where})" if s.where else ""
            notes.insert(0, f"non-finite logits at step {s.step}{where} ({s.non_finite} "
                            f"entries; {audit.non_finite_steps} row(s) in all)")
        elif not audit.within_tolerance and isinstance(audit, TopkAudit):
            notes.append(f"log-probabilities outside the {audit.dtype} bound {audit.bound:g} "
                         f"(top-{audit.k} audit) from {audit.describe_first()} "
                         f"({audit.out_of_tolerance_steps} step(s))")
        elif not audit.within_tolerance:
            s = audit.first_out_of_tolerance
            where = f" ({s.where})" if s.where else ""
            notes.append(f"logits outside the {audit.dtype} tolerance from step {s.step}{where} "
                         f"(max abs {s.max_abs:.3g}, NMSE {s.nmse:.3g}; "
                         f"{audit.out_of_tolerance_steps} row(s))")
    if any(b.verdict == FAIL for b in cell.budgets):
        statuses.append(BUDGET)
        notes.append("budget: " + budget_summary(cell.budgets))
    cell.status = worst(*statuses)
    cell.divergence = j.first if j else None
    if j is not None and j.defects:
        notes.insert(0, f"{j.defects} defect step(s), first at " + _describe(j.first))
    cell.reason = "; ".join([cell.reason] * bool(cell.reason) + notes)


def _greedy_for_speculation(engine, judge: PackageJudge, name: str, prompt,
                            max_new_tokens: int, tol=None):
    """The engine's greedy stream for a prompt, judged; a failure is kept as a CellError."""
    try:
        result, _ = decode(engine, prompt, max_new_tokens, None)
    except Exception as exc:
        return CellError.of("greedy", exc, _failed_step(exc))
    try:
        judge.trace(name, prompt, max_new_tokens, hint=result.tokens)
    except OracleFailed as failed:
        return failed.error
    try:
        return list(result.tokens), judge.judge_stream(prompt, result.tokens, max_new_tokens, None,
                                                tol)
    except Exception as exc:
        return CellError.of("judge", exc)


def _speculative_cell(engine, judge: PackageJudge, cell: CellResult, max_new_tokens: int,
                      width: int, greedy, tol=None):
    """A speculative cell: its stream judged on its own prefix, every deciding row audited,
    the greedy stream beside it, and a message that names the wrong path when they part."""
    if isinstance(greedy, CellError):
        return _errored(cell, greedy)
    greedy_tokens, greedy_judgement = greedy
    cell.greedy_tokens, cell.greedy_judgement = greedy_tokens, greedy_judgement
    auditable = engine.capabilities().logits_audit
    host = engine.residency == "host"
    stage = "decode"
    try:
        result, guard = decode(engine, cell.prompt, max_new_tokens, width,
                               audit=host and auditable)
        cell.tokens, cell.tokens_per_s = list(result.tokens), result.tokens_per_s
        cell.ledger, cell.wall_s = result.ledger, result.wall_s
        stage = "audit"
        audited, how = (_audit_decode(engine, cell, max_new_tokens, width, result) if auditable
                        else (result, "same"))
    except Exception as exc:
        return _errored(cell, CellError.of(stage, exc, _failed_step(exc)))
    led = result.ledger
    cell.acceptance_per_round = list(result.acceptance_per_round)
    cell.tallies = {k: getattr(led, k) for k in ("proposals", "accepted", "rejected",
                                                  "rollbacks", "full_accepts", "snapshots",
                                                  "restores")}
    cell.budgets, cell.verdicts = device_budgets(engine, result, guard)
    try:
        cell.judgement = judge.judge_stream(cell.prompt, cell.tokens, max_new_tokens, None, tol)
        if auditable and audited.audited is not None:
            cell.audit = judge.audit_forwards(cell.prompt, audited.audited, how, tol)
            cell.audit.readback_bytes = (audited.ledger.readback_bytes.get("logits_audit", 0)
                                         if how == "separate" else 0)
    except Exception as exc:
        return _errored(cell, CellError.of("judge", exc))
    if how == "separate":
        _nondeterminism(cell, list(audited.tokens))
    notes: list[str] = [] if auditable else ["logits not audited: the engine declares no "
                                             "logits audit"]
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
    if parted is None or engine.batch_invariant:
        cell.verdicts["spec_equals_greedy"] = judge_claim("spec_equals_greedy", cell.tokens,
                                                          greedy_tokens)
        if parted is not None and not (spec_bad or greedy_bad):
            notes.append(f"speculative and greedy part at step {parted}; both are within "
                         f"tolerance of the oracle, but this engine declares batch invariance")
    else:
        cell.verdicts["spec_equals_greedy"] = SKIP
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


def _concurrency_claim(engine, judge: PackageJudge, cell: CellResult, spec: CellSpec,
                       max_new_tokens: int, batches: dict, tol=None) -> None:
    """Claim concurrency_invariance for a judged greedy cell: the same prompt among
    ``len(spec.concurrent_with)`` requests in flight together (one batch serves each of its
    prompts' cells) against its stream alone. A failure to send the batch is the cell's
    ``error`` (stage ``concurrent``)."""
    if not engine.capabilities().concurrent:
        cell.verdicts["concurrency_invariance"] = SKIP
        note = (f"concurrency not judged: {engine.name} declares no concurrent decoding "
                f"(capabilities: concurrent false)")
        cell.reason = "; ".join([cell.reason] * bool(cell.reason) + [note])
        return
    group = tuple(tuple(int(t) for t in p) for p in spec.concurrent_with)
    if group not in batches:
        try:
            batches[group] = engine.generate_concurrent([list(p) for p in group],
                                                        max_new_tokens, audit=True)
        except Exception as exc:
            batches[group] = CellError.of("concurrent", exc, _failed_step(exc))
    got = batches[group]
    if isinstance(got, CellError):
        _errored(cell, got)
        return
    alone = DecodeResult(cell.engine, cell.prompt, cell.tokens, cell.ledger, cell.wall_s,
                         top_logprobs=cell.alone_top)
    check = compare(alone, got[spec.concurrent_slot], tol or judge.tol, len(group),
                    spec.concurrent_slot)
    try:
        if check.first_difference is not None:  # which stream is wrong
            check.judgement = judge.judge_stream(cell.prompt, check.tokens, max_new_tokens, None, tol)
    except Exception as exc:
        _errored(cell, CellError.of("judge", exc))
        return
    cell.concurrency = check
    cell.verdicts["concurrency_invariance"] = judge_claim("concurrency_invariance", check)
    note = check.describe(cell.tokens)
    if note:
        cell.reason = "; ".join([cell.reason] * bool(cell.reason) + [note])
        cell.status = worst(cell.status, check.status)


def _band_verdict(cell: CellResult, band) -> None:
    """Claim 1d: a quantized engine's stream statistics against its scheme's band; beyond it
    is ``drift`` (its tokens and rows were judged by the band's margin and bounds already)."""
    if cell.status in (ERROR, UNAVAILABLE) or cell.audit is None or cell.judgement is None:
        return
    stats = band_statistics(cell.audit, cell.judgement, band)
    cell.band = stats
    cell.verdicts["quantized_band"] = judge_claim("quantized_band", stats)
    notes = []
    if not stats.within:
        cell.status = worst(cell.status, DRIFT)
        notes.append(f"beyond the {band.scheme} band: " + "; ".join(stats.reasons))
    if isinstance(cell.audit, TopkAudit):  # no whole rows: no KL to measure
        notes.append(f"the {band.scheme} band's KL bounds are not checked: a top-k audit has "
                     f"no whole rows (flips and per-step log-probabilities are)")
    cell.reason = "; ".join([cell.reason] * bool(cell.reason) + notes)


class _Unavailable(str):
    """An engine that cannot run here (its reason), as ``CellRunner`` remembers it."""


class CellRunner:
    """Runs planned cells (``harness.plan.CellSpec``) one at a time, judges each and, with an
    evidence folder, records it. Cells must arrive in plan order within a package (package,
    engine, width, prompt) for each engine to be loaded once.

    ``packages``: resolved packages by reference (else each is resolved on first use);
    ``judges``: package judges by package name, already vetted (``--oracle-engine``), else one
    is made per package on ``oracle_engine`` in ``oracle_mode``; ``sources``: the text or chat
    each prompt was made of, by (package, prompt name), for the records; ``engine_classes``:
    engine classes by their ref, for classes handed over directly (a test's own engine);
    ``agreements``: how each package's moved oracle was vetted (by whoever planned the run)."""

    def __init__(self, run_id: str, mode: str, max_new_tokens: int,
                 evidence_dir: Path | None, env=None, *, oracle_engine: str | None = None,
                 oracle_mode: str = STREAM, packages: dict | None = None,
                 judges: dict[str, PackageJudge] | None = None, sources: dict | None = None,
                 engine_classes: dict[str, type[Engine]] | None = None,
                 agreements: dict | None = None):
        self.run_id, self.mode, self.max_new_tokens = run_id, mode, max_new_tokens
        self.evidence_dir = evidence_dir
        self.env = env if env is not None else ev.collect_environment()
        self.oracle_engine, self.oracle_mode = oracle_engine, oracle_mode
        self._packages = dict(packages or {})
        self._judges = dict(judges or {})
        self._sources = dict(sources or {})
        self._classes = dict(engine_classes or {})
        self._agreements = dict(agreements or {})
        self._package_ref: str | None = None
        self._package = None
        self._judge: PackageJudge | None = None
        self._engine_ref: str | None = None
        self._engine_name = ""
        self._engine_class: str | None = None  # records' engine_class
        self._engine: Engine | CellError | _Unavailable | None = None
        self._greedy: dict = {}
        self._batches: dict = {}  # --concurrency: each group's concurrent decodes
        self._scheme: str | None = None  # the engine's numeric scheme, and its band
        self._band = None
        self._ref_judges: dict[str, PackageJudge] = {}  # by an engine's reference package
        self._originals: dict = {}  # package name -> oracle over the original it declares

    def _close_engine(self) -> None:
        engine, self._engine, self._engine_ref, self._greedy = self._engine, None, None, {}
        self._batches = {}
        if isinstance(engine, Engine):
            try:
                engine.close()
            except Exception:  # noqa: BLE001
                pass  # a close that fails must not hide the cells' verdicts

    def close(self) -> None:
        self._close_engine()
        if self._judge is not None and self._judge.package.spec.name not in self._judges:
            self._judge.close()
        for judge in self._ref_judges.values():
            judge.close()
        self._ref_judges, self._originals = {}, {}
        self._package_ref = self._package = self._judge = None

    def _use_package(self, package_ref: str) -> None:
        if package_ref != self._package_ref:
            self.close()
            package = self._packages.get(package_ref)
            self._package = package if package is not None else resolve_package(package_ref)
            name = self._package.spec.name
            self._judge = self._judges.get(name)
            if self._judge is None:
                self._judge = PackageJudge(self._package, self.oracle_engine, self.oracle_mode)
                self._judge.agreement = self._agreements.get(name)
            self._package_ref = package_ref

    def _setup(self, cls: type[Engine]):
        """The engine (and the numeric scheme it declares, with its band), or why its cells
        cannot run."""
        engine = self._construct(cls)
        self._scheme = self._band = None
        if isinstance(engine, Engine):
            try:
                self._scheme = engine.numeric_scheme()
                self._band = band_for(self._scheme)
            except Exception as exc:  # a scheme it cannot state: its cells cannot be judged
                return CellError.of("constructor", exc)
        return engine

    def _construct(self, cls: type[Engine]):
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
            engine = cls(self._package)
        except EngineUnavailable as err:  # an engine that loads only some packages
            return _Unavailable(str(err))
        except Exception as exc:
            return CellError.of("constructor", exc)
        if self.evidence_dir is not None:
            try:
                engine.attach_evidence(Path(self.evidence_dir))
            except Exception as exc:  # noqa: BLE001 - a log not kept is no reason to lose cells
                warnings.warn(f"{cls.name}: its files are not kept with the evidence: "
                              f"{type(exc).__name__}: {exc}", stacklevel=2)
        return engine

    def run(self, spec: CellSpec) -> CellResult:
        """One cell, judged and (with an evidence folder) recorded."""
        self._use_package(spec.package_ref)
        if spec.engine_ref != self._engine_ref:
            self._close_engine()
            cls = self._classes.get(spec.engine_ref) or get_engine_class(spec.engine_ref)
            self._engine = self._setup(cls)
            self._engine_ref, self._engine_name = spec.engine_ref, cls.name
            self._engine_class = class_reference(cls)
        package, judge, state = self._package, self._judge, self._engine
        cell = CellResult(package.spec.name, self._engine_name, spec.prompt, list(spec.ids),
                          IDENTICAL, mode=spec.mode,
                          prompt_source=self._sources.get((package.spec.name, spec.prompt)),
                          engine_class=self._engine_class)
        if isinstance(state, _Unavailable):
            cell.status, cell.reason = UNAVAILABLE, str(state)
            return self._emit(cell, None)
        if isinstance(state, CellError):
            return self._emit(_errored(cell, state), judge)
        cell.provenance = engine_provenance(state)
        judge = self._judge_of(state)
        cell.scheme, band = self._scheme, self._band
        tol = band.tolerance if band is not None else None
        before = judge.spent()
        if spec.width is None:
            _greedy_cell(state, judge, cell, self.max_new_tokens, tol)
            if spec.concurrent_with and cell.status != ERROR and cell.status != NON_FINITE:
                _concurrency_claim(state, judge, cell, spec, self.max_new_tokens,
                                   self._batches, tol)
        else:
            if spec.prompt not in self._greedy:
                self._greedy[spec.prompt] = _greedy_for_speculation(
                    state, judge, spec.prompt, cell.prompt, self.max_new_tokens, tol)
            _speculative_cell(state, judge, cell, self.max_new_tokens, spec.width,
                              self._greedy[spec.prompt], tol)
        if band is not None:
            _band_verdict(cell, band)
        self._measure_quality(cell)
        if band is None and cell.scheme is not None:
            note = (f"no calibrated band for {cell.scheme} is checked in: judged by the "
                    f"{judge.tol.dtype} row (lockstep calibrate makes a band)")
            cell.reason = "; ".join([cell.reason] * bool(cell.reason) + [note])
        return self._emit(cell, judge, before)

    def _measure_quality(self, cell: CellResult) -> None:
        """Beside the verdict, never part of it: where the package declares the float model
        it was quantized from, the cell's rows against that model's on the same prefix
        (``harness.quality``); a failure to measure is a note, never the cell's verdict."""
        kept, cell.logits = cell.logits, None
        if kept is None or self._package.spec.original is None:
            return
        tokens, rows = kept
        try:
            name = self._package.spec.name
            if name not in self._originals:
                self._originals[name] = Oracle(original_package(self._package))
            reference = self._originals[name].stream_rows(cell.prompt, tokens)

            cell.quality = quality(rows, reference[:len(rows)], tokens[:len(rows)])
        except Exception as exc:  # noqa: BLE001 - information only
            note = f"quality against the original not measured ({type(exc).__name__}: {exc})"
            cell.reason = "; ".join([cell.reason] * bool(cell.reason) + [note])

    def _judge_of(self, engine: Engine) -> PackageJudge:
        """The judge of ``engine``'s cells: the package's, or for an engine that quantized the
        checkpoint itself the one over its own dequantized weights (its reference package)."""
        ref = engine.reference_package()
        if ref is None:
            return self._judge
        key = str(ref)
        if key not in self._ref_judges:
            self._ref_judges[key] = PackageJudge(load_package(ref), self.oracle_engine,
                                                 self.oracle_mode)
        return self._ref_judges[key]

    def failed(self, spec: CellSpec, error: CellError) -> CellResult:
        """The ``error`` record of a cell that could not be run as a cell: its process died
        while running it, or something outside the cell's own guards raised."""
        self._use_package(spec.package_ref)
        cell = CellResult(self._package.spec.name, spec.engine, spec.prompt, list(spec.ids),
                          IDENTICAL, mode=spec.mode)
        return self._emit(_errored(cell, error), None)

    def _emit(self, cell: CellResult, judge: PackageJudge | None,
              judged_since: tuple[float, int, int] | None = None) -> CellResult:
        """A finished cell's reference stream (an oracle failure makes it an ``error`` cell),
        what judging it cost (the judge's ``spent()`` since ``judged_since``) and, with an
        evidence folder, its record."""
        trace = None
        if judge is not None and cell.status != UNAVAILABLE:
            try:
                trace = judge.trace(cell.prompt_name, cell.prompt, self.max_new_tokens,
                                    hint=cell.tokens)
                cell.reference = list(trace.tokens)
            except OracleFailed as failed:
                _errored(cell, failed.error)
            if judged_since is not None:
                now = judge.spent()
                cell.judge_s = now[0] - judged_since[0]
                cell.oracle_forwards = now[1] - judged_since[1]
                cell.oracle_positions = now[2] - judged_since[2]
        source = cell.prompt_source
        if cell.tokens and source is not None and source.source.kind in ("text", "chat"):
            cell.text = decode_each(self._package, cell.tokens, joined=True)
        if self.evidence_dir is not None:
            ran = judge is not None and judge.built
            band = self._band if cell.band is not None else None
            tol = band.tolerance if band is not None else (judge.tol if judge else None)
            record = cell_record(self.run_id, self.env, self._package, cell, trace,
                                 judge.oracle.name if ran else REFERENCE_ENGINE, tol,
                                 judge.oracle.package if ran else None,
                                 oracle_check=judge.agreement if judge else None, band=band)
            cell.record_path = ev.write_evidence(record, self.evidence_dir)
        return cell


__all__ = ["CellRunner", "decode", "engine_provenance"]
