"""Evidence records -> one self-contained HTML parity report.

Everything is inline (CSS, SVG plots) and nothing is fetched, so the file opens offline
and can be attached to a CI run. The template is rendered with autoescape on: every
string from evidence (token text, names, paths, reasons, error messages, tracebacks)
arrives escaped; only the SVG produced here from numbers is marked safe.

What the report says, top to bottom: runs that are incomplete (a manifest not marked
complete, or planned cells without a record), records that do not match their run's plan
and duplicate records (counted once), each in a red banner; how many cells were judged and
how many failed, and the counts by status; one line per engine whose cells did not run
(left out of the plan, or unavailable) and why; regressions against a baseline; the matrix
(each cell the worst status of its records, ``missing`` where a planned cell has none); runs,
planned against recorded; the planted-bug catch matrix (the committed
result of the planted-bug suite, not of these runs); one article per record with
findings or an error (the first finding with both top-5 lists, the further finding steps,
the error with its traceback, which path of a speculative cell is wrong, the streams side
by side); the logits audit; budgets per engine and claim; claims; graph slots; ledger;
plots; the GPUs; environment.

GPUs: every record names the GPU it ran on (``environment.gpu_index`` and ``gpu_uuid``); the
claims table shows it per record, the GPUs section counts records per GPU, and a cell recorded
on several GPUs that fails on one and passes on another is flagged "differs between GPUs" (a
red box in the header, and on its matrix cell).
"""
from __future__ import annotations

import functools
import json
import os
from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from engines import json_text
from engines.errors import LockstepError
from harness.evidence import CLAIMS, EvidenceRecord
from harness.forensics import explanation_for, explanation_html
from harness.judgement import (BUDGET, DEFECT, DRIFT, ERROR, FAILING, IDENTICAL, NEAR_TIE,
                               NON_FINITE, SEVERITY, UNAVAILABLE, worst)
from harness.manifest import PlannedCell, RunManifest
from harness.plan import NotRun, fold_not_run
from harness.run_coverage import Duplicate, drop_duplicates, run_coverage
from harness.shards import shard_coverage
from reports.bench_tables import load_bench

from . import plots
from .bands import band_section
from .regressions import NOISE_BAND, find_regressions, record_status

STREAM_CONTEXT = 12  # rows shown on each side of the first finding when a stream is long
STREAM_FULL_MAX = 64  # streams up to this many steps are shown whole
MISSING_SHOWN = 20  # missing cells named in an incomplete run's banner
FURTHER_SHOWN = 200  # further finding steps listed per record
# in every report's <head>: `lockstep report -o` replaces a file holding it, and no other
MARKER = '<meta name="generator" content="lockstep report">'
MISSING = "missing"  # a planned cell without a record
NOT_RUN = "not-run"  # a hole in the matrix that no manifest planned
# where ``lockstep report`` looks for the planted-bug catch matrix by default
DEFAULT_CATCH_MATRIX = Path(__file__).resolve().parent.parent / "docs" / "catch_matrix.json"

_MODE_ORDER = {"greedy": 0, "draft": 1, "chained": 2, "mtp": 3, "prompt-lookup": 4}


@functools.cache
def _env() -> Environment:
    """One environment a process: it keeps each template compiled (a render of a small
    report compiled them again each time, about 0.2 s)."""
    env = Environment(loader=PackageLoader("reports", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["visible"] = visible_text
    env.filters["num"] = _num
    env.filters["gpu"] = gpu_label
    return env


def visible_text(piece: str | None) -> str:
    """A token's text with whitespace and control characters made visible (still unescaped:
    the template escapes it)."""
    if piece is None:
        return ""
    return repr(piece)[1:-1] if piece else "∅"


def _num(value: float | None, spec: str = "%.4g") -> str:
    return "" if value is None else spec % value


def _mode_sort(label: str) -> tuple:
    kind, _, width = label.partition("/w")
    return (_MODE_ORDER.get(kind, 9), int(width) if width.isdigit() else 0, label)


def cell_verdict(records: Sequence[EvidenceRecord], missing: int = 0) -> str:
    """The worst status of the cell's records (``harness.judgement.SEVERITY``). A planned prompt
    without a record makes an otherwise passing cell ``missing``: it was not shown to pass.
    No record at all: ``missing``."""
    if not records:
        return MISSING
    status = worst(*(record_status(r) for r in records))
    if missing and status not in FAILING:
        return MISSING
    return status


def _is_ok(status: str) -> bool:
    return status in (IDENTICAL, NEAR_TIE)


# -- findings ----------------------------------------------------------------------------------

@dataclass
class StreamRow:
    step: int
    reference: int | None
    reference_text: str | None
    engine: int | None
    engine_text: str | None
    greedy: int | None
    margin: float | None
    same: bool
    finding: str | None  # verdict of a judged finding at this step
    diverged: bool  # the first finding's step


@dataclass
class FirstFinding:
    step: int
    engine_token: int | None
    oracle_token: int | None
    rank: int | None
    gap: float | None
    verdict: str
    reason: str | None
    margin: float | None
    oracle_top: list[dict]
    engine_top: list[dict] | None
    engine_text: str | None
    oracle_text: str | None


@dataclass
class GreedyView:
    verdict: str  # the greedy stream's own verdict against the oracle
    speculative: str  # the speculative stream's own verdict against the oracle
    agrees: bool
    first_difference: int | None
    wrong: Literal["greedy", "speculative", "both", "neither", "none"]
    sentence: str
    first_finding: Any  # Divergence | None


@dataclass
class FindingView:
    anchor: str
    record: EvidenceRecord
    status: str
    first: FirstFinding | None
    further: list[Any]
    further_hidden: int
    rows: list[StreamRow]
    skipped_before: int
    skipped_after: int
    has_reference: bool
    greedy: GreedyView | None
    failed_budgets: list[Any]
    traceback: str
    reference_segments: list[tuple[str, bool]] = field(default_factory=list)
    engine_segments: list[tuple[str, bool]] = field(default_factory=list)
    explanation: Any = None  # lockstep explain's fragment (first bad node, layer curve, repro)


def _piece(texts: list[str] | None, step: int) -> str | None:
    return texts[step] if texts is not None and step < len(texts) else None


def _token_texts(record: EvidenceRecord) -> dict[int, str]:
    """id -> decoded piece, from whichever stream of the record carries text."""
    known: dict[int, str] = {}
    if record.tokens_text is not None:
        known.update(zip(record.tokens, record.tokens_text))
    if record.reference is not None and record.reference.tokens_text is not None:
        for tok, text in zip(record.reference.tokens, record.reference.tokens_text):
            known.setdefault(tok, text)
    return known


def _top(pairs, texts: dict[int, str], engine_token, oracle_token) -> list[dict]:
    best = pairs[0][1] if pairs else None
    return [{"rank": i + 1, "id": tok, "logit": logit, "text": texts.get(tok),
             "delta": (best - logit) if best is not None else None,
             "engine": tok == engine_token, "oracle": tok == oracle_token}
            for i, (tok, logit) in enumerate(pairs)]


def _stream_verdict(record: EvidenceRecord) -> str:
    """The verdict of the record's own stream against the oracle (claim 1)."""
    j = record.judgement
    if j is not None:
        return DEFECT if j.defects else NEAR_TIE if j.near_ties else IDENTICAL
    if record.divergence is not None:
        return record.divergence.verdict
    return IDENTICAL


def _greedy_view(record: EvidenceRecord) -> GreedyView | None:
    g = record.greedy
    if g is None:
        return None
    spec = _stream_verdict(record)
    greedy_bad, spec_bad = g.verdict == DEFECT, spec == DEFECT
    parted = ("" if g.first_difference is None
              else f"; the two streams part at step {g.first_difference}")
    if greedy_bad and spec_bad:
        wrong, sentence = "both", "both paths are wrong: the greedy and the speculative " \
                                  "stream each have a defect against the oracle" + parted
    elif greedy_bad:
        step = f" at step {g.first_finding.step}" if g.first_finding is not None else ""
        wrong, sentence = "greedy", (f"the greedy path is wrong{step}; the speculative "
                                     f"stream agrees with the oracle" + parted)
    elif spec_bad:
        wrong, sentence = "speculative", ("the speculative path is wrong; the greedy stream "
                                          "agrees with the oracle" + parted)
    elif not g.agrees_with_speculative:
        wrong, sentence = "neither", ("speculative and greedy part at step "
                                      f"{g.first_difference}, each within tolerance of the "
                                      "oracle on its own prefix (spec_equals_greedy decides)")
    else:
        wrong, sentence = "none", "greedy and speculative streams are identical"
    return GreedyView(g.verdict, spec, g.agrees_with_speculative, g.first_difference, wrong,
                      sentence, g.first_finding)


def _first_finding(record: EvidenceRecord, texts: dict[int, str]
                   ) -> tuple[FirstFinding | None, list[Any]]:
    """The first finding (the divergence's step where the judgement has it, else the first
    judged step) and every further one, in step order."""
    findings = sorted(record.judgement.findings, key=lambda f: f.step) \
        if record.judgement is not None else []
    div = record.divergence
    first = None
    if findings:
        first = next((f for f in findings if div is not None and f.step == div.step),
                     findings[0])
    margins = record.reference.margins if record.reference is not None else []
    if first is not None:
        margin = div.margin if div is not None and div.step == first.step else (
            margins[first.step] if first.step < len(margins) else None)
        view = FirstFinding(
            first.step, first.engine_token, first.oracle_token, first.rank, first.gap,
            first.verdict, first.reason, margin,
            _top(first.oracle_top, texts, first.engine_token, first.oracle_token),
            None if first.engine_top is None
            else _top(first.engine_top, texts, first.engine_token, first.oracle_token),
            texts.get(first.engine_token), texts.get(first.oracle_token))
        return view, [f for f in findings if f is not first]
    if div is not None:
        return FirstFinding(div.step, div.engine_token, div.reference_token, div.rank, div.gap,
                            div.verdict, div.reason, div.margin, [], None,
                            texts.get(div.engine_token), texts.get(div.reference_token)), []
    return None, []


def _traceback(record: EvidenceRecord) -> str:
    if record.error is None:
        return ""
    return "".join(line if line.endswith("\n") else line + "\n"
                   for line in record.error.traceback)


def _needs_article(record: EvidenceRecord, status: str) -> bool:
    if status == UNAVAILABLE and record.error is None:
        return False  # listed in the unavailable box
    return (status != IDENTICAL or record.error is not None or record.divergence is not None
            or (record.judgement is not None and bool(record.judgement.findings))
            or (record.greedy is not None and (record.greedy.verdict != IDENTICAL
                                               or not record.greedy.agrees_with_speculative)))


def _finding_view(anchor: str, record: EvidenceRecord, status: str) -> FindingView:
    texts = _token_texts(record)
    first, further = _first_finding(record, texts)
    greedy = _greedy_view(record)
    ref = record.reference
    ref_tokens = ref.tokens if ref is not None else []
    ref_text = ref.tokens_text if ref is not None else None
    margins = ref.margins if ref is not None else []
    eng, eng_text = record.tokens, record.tokens_text
    greedy_tokens = record.greedy.tokens if record.greedy is not None else []
    finding_steps = {}
    if record.judgement is not None:
        for f in record.judgement.findings:
            finding_steps[f.step] = worst(finding_steps.get(f.step, ""), f.verdict)
    focus = (first.step if first is not None
             else record.error.step if record.error is not None and record.error.step is not None
             else greedy.first_difference if greedy is not None and greedy.first_difference
             is not None else 0)
    n = max(len(ref_tokens), len(eng), len(greedy_tokens))
    lo, hi = (0, n) if n <= STREAM_FULL_MAX else (max(0, focus - STREAM_CONTEXT),
                                                   min(n, focus + STREAM_CONTEXT + 1))
    rows = []
    for step in range(lo, hi):
        r = ref_tokens[step] if step < len(ref_tokens) else None
        e = eng[step] if step < len(eng) else None
        g = greedy_tokens[step] if step < len(greedy_tokens) else None
        rt, et = _piece(ref_text, step), _piece(eng_text, step)
        if rt is None and r is not None and r == e:
            rt = et  # same id, same text: the engine's decoding serves both columns
        rows.append(StreamRow(step, r, rt, e, et, g,
                              margins[step] if step < len(margins) else None,
                              same=(ref is None or r == e),
                              finding=finding_steps.get(step),
                              diverged=first is not None and step == first.step))
    view = FindingView(anchor, record, status, first, further[:FURTHER_SHOWN],
                       max(0, len(further) - FURTHER_SHOWN), rows, lo, n - hi, ref is not None,
                       greedy, [b for b in record.budgets if b.verdict == "fail"],
                       _traceback(record))
    mark = first.step if first is not None else -1
    if eng_text is not None:
        view.engine_segments = [(t, i == mark) for i, t in enumerate(eng_text)]
        if ref is not None:
            ref_pieces = [(_piece(ref_text, i) if ref_text is not None
                           else (eng_text[i] if i < len(eng) and i < len(eng_text)
                                 and ref_tokens[i] == eng[i] else None))
                          for i in range(len(ref_tokens))]
            if all(p is not None for p in ref_pieces):
                view.reference_segments = [(t, i == mark) for i, t in enumerate(ref_pieces)]
    return view


# -- matrix --------------------------------------------------------------------------------

@dataclass
class MatrixView:
    engines: list[str]
    rows: list[tuple[str, str, list[dict]]]  # package, mode, cells (one per engine)


def _short(text: str, limit: int = 48) -> str:
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _matrix(records: Sequence[EvidenceRecord], statuses: dict[int, str],
            anchors: dict[int, str], missing: dict[tuple[str, str, str], list[PlannedCell]],
            differs: frozenset[tuple[str, str, str]] | set = frozenset()) -> MatrixView:
    groups: dict[tuple[str, str, str], list[EvidenceRecord]] = defaultdict(list)
    for record in records:
        groups[record.cell].append(record)
    engines = sorted({r.engine for r in records} | {k[1] for k in missing})
    pairs = sorted({(r.package.name, r.mode.label) for r in records}
                   | {(k[0], k[2]) for k in missing},
                   key=lambda pm: (pm[0], _mode_sort(pm[1])))
    rows = []
    for package, mode in pairs:
        cells = []
        for engine in engines:
            members = groups.get((package, engine, mode), [])
            absent = missing.get((package, engine, mode), [])
            if not members and not absent:
                cells.append({"engine": engine, "verdict": NOT_RUN, "count": 0, "ok": 0,
                              "near_ties": 0, "missing": 0, "anchor": "", "title": "not run",
                              "note": "", "differs_gpus": False})
                continue
            verdict = cell_verdict(members, len(absent))
            member_status = [statuses[id(r)] for r in members]
            # link to the worst record: its finding article where it has one
            target = min(members, key=lambda r: SEVERITY.index(statuses[id(r)]), default=None)
            anchor = anchors.get(id(target), "") if target is not None else ""
            reasons = []
            for r in members:
                st = statuses[id(r)]
                why = r.reason or (f"{r.error.type}: {r.error.message}" if r.error else "")
                if st != IDENTICAL and why:
                    line = f"{st} ({r.prompt.name}): {why}"
                    if line not in reasons:
                        reasons.append(line)
            if absent:
                reasons.append(f"missing: {len(absent)} planned prompt(s) without a record ("
                               + ", ".join(sorted(c.prompt for c in absent)) + ")")
            note = ""
            if verdict == UNAVAILABLE:
                note = _short(next((r.reason for r in members if r.reason), "") or "")
            split = (package, engine, mode) in differs
            if split:
                reasons.insert(0, "differs between GPUs: fails on one GPU, passes on another")
            cells.append({
                "engine": engine, "verdict": verdict, "count": len(members),
                "ok": sum(_is_ok(s) for s in member_status),
                "near_ties": member_status.count(NEAR_TIE), "missing": len(absent),
                "anchor": anchor, "title": "\n".join(reasons) or verdict, "note": note,
                "differs_gpus": split})
        rows.append((package, mode, cells))
    return MatrixView(engines, rows)


# -- completeness --------------------------------------------------------------------------

@dataclass
class RunView:
    run_id: str
    started: str
    finished: str | None
    complete: bool  # the manifest was marked complete
    planned: int
    recorded: int  # planned cells with at least one record of this run
    extra: int  # records of this run that no planned cell names
    duplicates: int  # extra copies of cells of this run recorded more than once
    records: int  # record files of this run, copies included
    missing: list[str]  # first MISSING_SHOWN missing cells, "package · engine · mode · prompt"
    missing_total: int

    @property
    def incomplete(self) -> bool:
        return not self.complete or self.missing_total > 0

    @property
    def mismatched(self) -> bool:
        return bool(self.extra or self.duplicates)


def _completeness(records: Sequence[EvidenceRecord], manifests: Sequence[RunManifest],
                  duplicates: Sequence[Duplicate] = ()
                  ) -> tuple[list[RunView], dict[tuple[str, str, str], list[PlannedCell]]]:
    anywhere = {(r.package.name, r.engine, r.mode.label, r.prompt.name) for r in records}
    runs, missing, seen = [], defaultdict(list), set()
    for cov in run_coverage(records, manifests, duplicates):
        m = cov.manifest
        for c in cov.missing:
            # the matrix shows a cell missing only where no run recorded it; the banner
            # still names the run that left it out
            if c.key not in anywhere and c.key not in seen:
                seen.add(c.key)
                missing[(c.package, c.engine, c.mode)].append(c)
        runs.append(RunView(
            m.run_id, m.started.isoformat(timespec="seconds"),
            m.finished.isoformat(timespec="seconds") if m.finished else None, m.complete,
            cov.planned, cov.recorded, len(cov.unplanned), cov.duplicates, cov.records,
            [" · ".join(c.key) for c in cov.missing[:MISSING_SHOWN]], len(cov.missing)))
    return runs, dict(missing)


# -- budgets -------------------------------------------------------------------------------

@dataclass
class BudgetGroup:
    engine: str
    claim: str
    checks: int = 0
    failures: int = 0
    first_failure: tuple[EvidenceRecord, Any] | None = None
    budgets: set = field(default_factory=set)
    units: set = field(default_factory=set)

    @property
    def budget_text(self) -> str:
        values = sorted(self.budgets)
        unit = f" {next(iter(self.units))}" if len(self.units) == 1 else ""
        if not values:
            return ""
        if len(values) == 1:
            return f"{values[0]:g}{unit}"
        return f"{values[0]:g} … {values[-1]:g}{unit}"


def _budgets(records: Sequence[EvidenceRecord]) -> tuple[list[BudgetGroup], list[tuple]]:
    groups: dict[tuple[str, str], BudgetGroup] = {}
    checks = []
    for r in records:
        for b in r.budgets:
            g = groups.setdefault((r.engine, b.claim), BudgetGroup(r.engine, b.claim))
            g.checks += 1
            g.budgets.add(b.budget)
            if b.unit:
                g.units.add(b.unit)
            if b.verdict == "fail":
                g.failures += 1
                if g.first_failure is None:
                    g.first_failure = (r, b)
            checks.append((r, b))
    ordered = sorted(groups.values(), key=lambda g: (g.failures == 0, g.engine, g.claim))
    checks.sort(key=lambda rb: rb[1].verdict != "fail")  # stable: failures first
    return ordered, checks


# -- catch matrix ----------------------------------------------------------------------------

def _catch_error(message: str, path: str | None, remedy: str) -> LockstepError:
    return LockstepError(message, field="--catch-matrix", value=path, remedy=remedy)


def load_catch_matrix(path: str | os.PathLike) -> dict:
    """Read the planted-bug catch matrix JSON; a missing or malformed file is an error
    naming the option and the remedy."""
    path = Path(path)
    try:
        data = json_text.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise _catch_error("catch matrix file does not exist", str(path),
                           "pass the JSON written by the planted-bug suite, or "
                           "--no-catch-matrix to leave the section out") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise _catch_error(f"catch matrix file cannot be read ({exc})", str(path),
                           "check the path and permissions, or pass --no-catch-matrix") from exc
    except json.JSONDecodeError as exc:
        raise _catch_error(f"catch matrix is not valid JSON: {exc.msg} at line {exc.lineno}",
                           str(path), "regenerate the file, or pass --no-catch-matrix") from exc
    _check_catch_matrix(data, str(path))
    return data


def _check_catch_matrix(data: Any, where: str | None) -> None:
    remedy = ('expected {"generated": ..., "rows": [{"bug", "package", "mode", "expected", '
              '"observed", "caught"}, ...], "control": [...]}; regenerate the file, or pass '
              "--no-catch-matrix")
    if not isinstance(data, Mapping):
        raise _catch_error(f"catch matrix is a JSON {type(data).__name__}, not an object",
                           where, remedy)
    for key in ("rows", "control"):
        rows = data.get(key, [])
        if not isinstance(rows, list):
            raise _catch_error(f"catch matrix {key!r} is not a list", where, remedy)
        for i, row in enumerate(rows):
            if not isinstance(row, Mapping) or not isinstance(row.get("bug"), str) \
                    or not isinstance(row.get("package"), str):
                raise _catch_error(f"catch matrix {key}[{i}] is not an object with string "
                                   "'bug' and 'package'", where, remedy)
            for side in ("expected", "observed"):
                if row.get(side) is not None and not isinstance(row[side], Mapping):
                    raise _catch_error(f"catch matrix {key}[{i}].{side} is not an object",
                                       where, remedy)
    if "rows" not in data:
        raise _catch_error("catch matrix has no 'rows'", where, remedy)


@dataclass
class CatchView:
    generated: str
    packages: list[str]
    rows: list[dict]  # {bug, description, control, cells: {package: {entries, ok}}}
    caught: int
    total: int
    not_caught: list[str]
    control_ok: bool


def _catch_entry(row: Mapping, control: bool) -> dict:
    expected = row.get("expected") or {}
    observed = row.get("observed") or {}
    status = observed.get("status")
    # a control (a harmless change, an honest quantized engine) passes with what it expects
    ok = status == (expected.get("status") or IDENTICAL) if control else bool(row.get("caught"))
    return {"mode": row.get("mode"), "observed": status, "observed_step": observed.get("step"),
            "expected": expected.get("status"), "expected_step": expected.get("step"),
            "ok": ok, "beyond": row.get("beyond")}


def _catch_view(data: Mapping) -> CatchView:
    _check_catch_matrix(data, None)
    packages = sorted({r["package"] for key in ("rows", "control") for r in data.get(key, [])})
    rows: list[dict] = []
    caught = total = 0
    not_caught: list[str] = []
    for key, control in (("rows", False), ("control", True)):
        by_bug: dict[str, dict] = {}
        for row in data.get(key, []):
            view = by_bug.setdefault(row["bug"], {"bug": row["bug"], "control": control,
                                                  "description": row.get("description") or "",
                                                  "cells": {}})
            cell = view["cells"].setdefault(row["package"], {"entries": [], "ok": True})
            entry = _catch_entry(row, control)
            cell["entries"].append(entry)
            cell["ok"] = cell["ok"] and entry["ok"]
            if not control:
                total += 1
                caught += entry["ok"]
                if not entry["ok"]:
                    mode = f" ({entry['mode']})" if entry["mode"] else ""
                    not_caught.append(f"{row['bug']} · {row['package']}{mode}")
        rows.extend(by_bug.values())
    control_ok = all(c["ok"] for r in rows if r["control"] for c in r["cells"].values())
    return CatchView(str(data.get("generated") or ""), packages, rows, caught, total,
                     not_caught, control_ok)


# -- the report ------------------------------------------------------------------------------

PROMPT_SHOWN = 600  # characters of a prompt's text shown before "show all"


def _prompts(records: Sequence[EvidenceRecord]) -> list[dict]:
    """One row per package and prompt: how it was given (ids, text, chat and its template),
    its length and text, and the oracle(s) that judged it (with the pre-run agreement check
    where the oracle was moved to another engine)."""
    rows: dict[tuple, dict] = {}
    for r in records:
        p = r.prompt
        key = (r.package.name, p.name, tuple(p.ids))
        row = rows.setdefault(key, {
            "package": r.package.name, "name": p.name, "source": p.source, "tokens": len(p.ids),
            "text": p.source_text if p.source_text is not None else p.text,
            "messages": [(m.role, m.content) for m in p.messages or []],
            "template": p.chat_template, "oracles": {}})
        j = r.judgement
        if j is not None:
            check = j.oracle_check
            row["oracles"][j.oracle] = (None if check is None else
                                        f"agreed with {check.against} on a {check.prefix_tokens}"
                                        f"-token prefix and {check.steps} step(s): max abs "
                                        f"{check.max_abs:.3g}, NMSE {check.nmse:.3g}")
    for row in rows.values():
        text = row["text"]
        row["short"] = None if text is None or len(text) <= PROMPT_SHOWN else \
            text[:PROMPT_SHOWN]
    return list(rows.values())


def _provenances(records: Sequence[EvidenceRecord]) -> list[dict]:
    """One row per engine and package whose engine ran a conversion of its own (its
    ``engine_provenance``: builder or loader, version, precision, checkpoint hash), with
    the oracle(s) it was judged against: two conversions of the same weights, side by side."""
    rows: dict[tuple, dict] = {}
    for r in records:
        if not r.engine_provenance:
            continue
        key = (r.engine, r.package.name)
        row = rows.setdefault(key, {"engine": r.engine, "package": r.package.name,
                                    "ran": sorted((str(k), str(v)) for k, v in
                                                  r.engine_provenance.items()),
                                    "oracles": set()})
        if r.judgement is not None:
            row["oracles"].add(r.judgement.oracle)
    return [dict(row, oracles=sorted(row["oracles"])) for row in rows.values()]


def _environments(records: Sequence[EvidenceRecord]) -> list[dict]:
    seen: dict[str, dict] = {}
    for record in records:
        dumped = record.environment.model_dump()
        seen.setdefault(repr(sorted(dumped.items())), dumped)
    return list(seen.values())


# -- GPUs -------------------------------------------------------------------------------------

def gpu_key(record: EvidenceRecord) -> str | None:
    """Which GPU produced a record: its UUID (the identity: two GPUs of one host may report
    the same PCI bus id), else its index; None for a record that names no GPU."""
    env = record.environment
    if env.gpu_uuid:
        return env.gpu_uuid
    return f"GPU {env.gpu_index}" if env.gpu_index is not None else None


def gpu_label(record: EvidenceRecord) -> str:
    """``GPU 1 · GPU-5f1c2b1e`` (index and the UUID's first group), or "" without a GPU."""
    env = record.environment
    parts = []
    if env.gpu_index is not None:
        parts.append(f"GPU {env.gpu_index}")
    if env.gpu_uuid:
        parts.append(env.gpu_uuid[:12])
    return " · ".join(parts)


@dataclass
class GpuView:
    key: str
    label: str
    index: int | None
    uuid: str | None
    name: str | None
    host: str
    records: int = 0
    ok: int = 0
    failing: int = 0


@dataclass
class GpuDifference:
    """A cell (package, engine, mode, prompt) that fails on one GPU and passes on another."""
    cell: tuple[str, str, str, str]
    verdicts: list[tuple[str, str]]  # (GPU label, worst status of its records there)
    failing_on: list[str]
    passing_on: list[str]


def _gpus(records: Sequence[EvidenceRecord], statuses: dict[int, str]) -> list[GpuView]:
    views: dict[str, GpuView] = {}
    for r in records:
        key = gpu_key(r)
        if key is None:
            continue
        env = r.environment
        v = views.setdefault(key, GpuView(key, gpu_label(r), env.gpu_index, env.gpu_uuid,
                                          env.gpu_name, env.host))
        v.records += 1
        v.ok += _is_ok(statuses[id(r)])
        v.failing += statuses[id(r)] in FAILING
    return sorted(views.values(), key=lambda v: (v.host, v.index is None, v.index or 0, v.key))


def gpu_differences(records: Sequence[EvidenceRecord],
                    statuses: dict[int, str] | None = None) -> list[GpuDifference]:
    """Cells recorded on two or more GPUs whose worst status is failing on one GPU and
    passing (identical or near-tie) on another: "differs between GPUs"."""
    if statuses is None:
        statuses = {id(r): record_status(r) for r in records}
    cells: dict[tuple[str, str, str, str], dict[str, list[EvidenceRecord]]] = defaultdict(
        lambda: defaultdict(list))
    for r in records:
        key = gpu_key(r)
        if key is not None:
            cells[(r.package.name, r.engine, r.mode.label, r.prompt.name)][key].append(r)
    out = []
    for cell, by_gpu in cells.items():
        if len(by_gpu) < 2:
            continue
        verdicts = []
        for members in by_gpu.values():
            verdicts.append((gpu_label(members[0]) or gpu_key(members[0]),
                             worst(*(statuses[id(m)] for m in members))))
        failing = [label for label, v in verdicts if v in FAILING]
        passing = [label for label, v in verdicts if _is_ok(v)]
        if failing and passing:
            out.append(GpuDifference(cell, sorted(verdicts), sorted(failing), sorted(passing)))
    return sorted(out, key=lambda d: (d.cell[0], _mode_sort(d.cell[2]), d.cell[1], d.cell[3]))


def _not_run(records: Sequence[EvidenceRecord], statuses: dict[int, str],
             manifests: Sequence[RunManifest]) -> list[NotRun]:
    """One line per engine whose cells did not run: left out of a run's plan (its manifest's
    ``left_out``) or recorded ``unavailable``, with the reasons and the cell count."""
    return fold_not_run(
        [(lo.engine, lo.package, lo.reason, lo.cells) for m in manifests for lo in m.left_out]
        + [(r.engine, r.package.name, r.reason or "no reason recorded", 1) for r in records
           if statuses[id(r)] == UNAVAILABLE])


def render_report(records: Sequence[EvidenceRecord],
                  baseline: Sequence[EvidenceRecord] | None = None, *,
                  title: str = "lockstep parity report",
                  generated: datetime | None = None,
                  manifests: Sequence[RunManifest] | None = None,
                  catch_matrix: Mapping | str | os.PathLike | None = None,
                  explanations: Mapping | None = None,
                  bench: Sequence[str | os.PathLike] = (),
                  duplicates: Sequence[Duplicate] | None = None) -> str:
    """The whole report as one HTML string (UTF-8 text, no external reference).

    ``manifests`` (``harness.manifest.read_manifests``) make completeness visible: planned
    cells without a record show as ``missing`` and an unfinished run as INCOMPLETE.
    ``catch_matrix`` (the parsed JSON, or a path to it) adds the planted-bug section.
    ``explanations`` (``harness.forensics.load_explanations``) put each explained finding's
    first bad node, layer curve and repro-pack link into its article. ``bench`` (paths of
    ``lockstep bench --json`` files) adds the speed section, a table a file. A cell of one
    run recorded twice counts once and is flagged: ``duplicates`` as the caller found them
    (``harness.run_coverage.drop_duplicates`` over the files, naming them), else found here."""
    bench_tables = [load_bench(path) for path in bench]  # a bad file fails before rendering
    catch_source = None
    if catch_matrix is not None and not isinstance(catch_matrix, Mapping):
        catch_source = str(catch_matrix)
        catch_matrix = load_catch_matrix(catch_matrix)
    if duplicates is None:
        records, duplicates = drop_duplicates(records)
    records = sorted(records, key=lambda r: (r.package.name, _mode_sort(r.mode.label),
                                             r.engine, r.prompt.name, r.created))
    statuses = {id(r): record_status(r) for r in records}
    findings = []
    anchors: dict[int, str] = {}
    for i, r in enumerate(records):
        anchors[id(r)] = f"cell-{i}"
        if _needs_article(r, statuses[id(r)]):
            view = _finding_view(f"finding-{len(findings)}", r, statuses[id(r)])
            if explanations:
                entry = explanation_for(r, explanations)
                if entry is not None:  # the fragment escapes every string it holds
                    view.explanation = Markup(explanation_html(entry, f"{view.anchor}-explain"))
            findings.append(view)
            anchors[id(r)] = view.anchor
    rows_anchor = {id(r): f"cell-{i}" for i, r in enumerate(records)}
    runs, missing = _completeness(records, manifests or [], duplicates)
    manifest_ids = {m.run_id for m in manifests or []}
    regressions = find_regressions(records, baseline) if baseline is not None else None
    budget_groups, budget_checks = _budgets(records)
    svg = {
        "memory": plots.memory_plot(records),
        "acceptance": plots.acceptance_plot(records),
        "throughput": plots.throughput_plot(records, baseline),
    }
    counts = {s: 0 for s in SEVERITY}
    for s in statuses.values():
        counts[s] += 1
    judged = len(records) - counts[UNAVAILABLE]
    differences = gpu_differences(records, statuses)
    differs = {d.cell[:3] for d in differences}
    context = {
        "title": title,
        "generated": (generated or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        "cells": [(rows_anchor[id(r)], r, statuses[id(r)]) for r in records],
        "summary": {
            "records": len(records),
            "judged": judged,
            "failed": sum(counts[s] for s in FAILING),
            "identical": counts[IDENTICAL],
            "near_ties": counts[NEAR_TIE],
            "boxes": [("errors", "errors", ERROR, counts[ERROR]),
                      ("non-finite", "non-finite", NON_FINITE, counts[NON_FINITE]),
                      ("defects", "defects", DEFECT, counts[DEFECT]),
                      ("budget", "budget failures", BUDGET, counts[BUDGET]),
                      ("drift", "drift", DRIFT, counts[DRIFT]),
                      ("near-ties", "near-ties (shown, not failing)", NEAR_TIE,
                       counts[NEAR_TIE])],
            "missing": sum(len(v) for v in missing.values()) if manifests else None,
            "run_ids": sorted({r.run_id for r in records} | manifest_ids),
        },
        "runs": runs,
        "incomplete": [run for run in runs if run.incomplete],
        "mismatched": [run for run in runs if run.mismatched],
        "duplicates": duplicates,
        "shards": [c for c in shard_coverage(manifests or []) if not c.complete],
        "has_manifests": bool(manifests),
        "unmanifested": sorted({r.run_id for r in records} - manifest_ids) if manifests else [],
        "not_run": _not_run(records, statuses, manifests or []),
        "matrix": _matrix(records, statuses, anchors, missing, differs),
        "gpus": _gpus(records, statuses),
        "gpu_differences": differences,
        "findings": findings,
        "audits": [(rows_anchor[id(r)], r) for r in records if r.logits_audit is not None],
        "bands": band_section(records, statuses, anchors),
        "budget_groups": budget_groups,
        "budget_checks": budget_checks,
        "claims": CLAIMS,
        "slots": [(r, name, counters) for r in records
                  for name, counters in sorted(r.ledger.graph_slots.items())],
        "regressions": regressions,
        "baseline_count": len(baseline) if baseline is not None else 0,
        "noise_band_pct": f"{100 * NOISE_BAND:g}",
        "plots": {k: Markup(v) if v is not None else None for k, v in svg.items()},
        "throughput": plots.engine_throughput(records),
        "environments": _environments(records),
        "prompts": _prompts(records),
        "provenances": _provenances(records),
        "catch": _catch_view(catch_matrix) if catch_matrix is not None else None,
        "catch_source": catch_source,
        "bench": bench_tables,
        "failing": FAILING,
    }
    return _env().get_template("report.html.j2").render(**context)
