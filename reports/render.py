"""Evidence records -> one self-contained HTML parity report.

Everything is inline (CSS, SVG plots) and nothing is fetched, so the file opens offline
and can be attached to a CI run. The template is rendered with autoescape on: every
string from evidence (token text, names, paths) arrives escaped; only the SVG produced
here from numbers is marked safe.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from harness.evidence import CLAIMS, EvidenceRecord

from . import plots
from .regressions import NOISE_BAND, find_regressions

STREAM_CONTEXT = 12  # rows shown on each side of a divergence when a stream is long
STREAM_FULL_MAX = 64  # streams up to this many steps are shown whole

_MODE_ORDER = {"greedy": 0, "draft": 1, "chained": 2, "mtp": 3}


def _env() -> Environment:
    env = Environment(loader=PackageLoader("reports", "templates"), autoescape=True,
                      undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True)
    env.filters["visible"] = visible_text
    return env


def visible_text(piece: str | None) -> str:
    """A token's text with whitespace and control characters made visible (still unescaped:
    the template escapes it)."""
    if piece is None:
        return ""
    return repr(piece)[1:-1] if piece else "∅"


def _mode_sort(label: str) -> tuple:
    kind, _, width = label.partition("/w")
    return (_MODE_ORDER.get(kind, 9), int(width) if width.isdigit() else 0, label)


def cell_verdict(records: Sequence[EvidenceRecord]) -> str:
    """fail (any defect, failed budget or failed claim) > near-tie > pass; none: missing."""
    if not records:
        return "missing"
    if any(not r.ok for r in records):
        return "fail"
    if any(r.divergence is not None for r in records):
        return "near-tie"
    return "pass"


@dataclass
class StreamRow:
    step: int
    reference: int | None
    reference_text: str | None
    engine: int | None
    engine_text: str | None
    margin: float | None
    same: bool
    diverged: bool


@dataclass
class DivergenceView:
    anchor: str
    record: EvidenceRecord
    rows: list[StreamRow]
    skipped_before: int
    skipped_after: int
    reference_segments: list[tuple[str, bool]] = field(default_factory=list)
    engine_segments: list[tuple[str, bool]] = field(default_factory=list)


def _piece(texts: list[str] | None, step: int) -> str | None:
    return texts[step] if texts is not None and step < len(texts) else None


def _divergence_view(index: int, record: EvidenceRecord) -> DivergenceView:
    div = record.divergence
    assert div is not None
    ref, eng = record.reference.tokens, record.tokens
    ref_text, eng_text = record.reference.tokens_text, record.tokens_text
    n = max(len(ref), len(eng))
    lo, hi = (0, n) if n <= STREAM_FULL_MAX else (max(0, div.step - STREAM_CONTEXT),
                                                   min(n, div.step + STREAM_CONTEXT + 1))
    rows = []
    for step in range(lo, hi):
        r = ref[step] if step < len(ref) else None
        e = eng[step] if step < len(eng) else None
        rt = _piece(ref_text, step)
        et = _piece(eng_text, step)
        if rt is None and r is not None and r == e:
            rt = et  # same id, same text: the engine's decoding serves both columns
        margins = record.reference.margins
        rows.append(StreamRow(step, r, rt, e, et, margins[step] if step < len(margins) else None,
                              same=(r == e), diverged=(step == div.step)))
    view = DivergenceView(f"divergence-{index}", record, rows, lo, n - hi)
    if eng_text is not None:
        view.engine_segments = [(t, i == div.step) for i, t in enumerate(eng_text)]
        ref_pieces = [(_piece(ref_text, i) if ref_text is not None
                       else (eng_text[i] if i < len(eng) and i < len(eng_text) and ref[i] == eng[i]
                             else None)) for i in range(len(ref))]
        if all(p is not None for p in ref_pieces):
            view.reference_segments = [(t, i == div.step) for i, t in enumerate(ref_pieces)]
    return view


@dataclass
class MatrixView:
    engines: list[str]
    rows: list[tuple[str, str, list[dict]]]  # package, mode, cells (one per engine)


def _matrix(records: Sequence[EvidenceRecord], anchors: dict[int, str]) -> MatrixView:
    groups: dict[tuple[str, str, str], list[EvidenceRecord]] = defaultdict(list)
    for record in records:
        groups[record.cell].append(record)
    engines = sorted({r.engine for r in records})
    pairs = sorted({(r.package.name, r.mode.label) for r in records},
                   key=lambda pm: (pm[0], _mode_sort(pm[1])))
    rows = []
    for package, mode in pairs:
        cells = []
        for engine in engines:
            members = groups.get((package, engine, mode), [])
            verdict = cell_verdict(members)
            first = members[0] if members else None
            anchor = anchors.get(id(first), "") if first is not None else ""
            cells.append({"engine": engine, "verdict": verdict, "count": len(members),
                          "ok": sum(r.ok for r in members),
                          "near_ties": sum(1 for r in members if r.divergence is not None
                                           and r.divergence.verdict == "near-tie"),
                          "anchor": anchor})
        rows.append((package, mode, cells))
    return MatrixView(engines, rows)


def _environments(records: Sequence[EvidenceRecord]) -> list[dict]:
    seen: dict[str, dict] = {}
    for record in records:
        dumped = record.environment.model_dump()
        seen.setdefault(repr(sorted(dumped.items())), dumped)
    return list(seen.values())


def render_report(records: Sequence[EvidenceRecord],
                  baseline: Sequence[EvidenceRecord] | None = None, *,
                  title: str = "lockstep parity report",
                  generated: datetime | None = None) -> str:
    """The whole report as one HTML string (UTF-8 text, no external reference)."""
    records = sorted(records, key=lambda r: (r.package.name, _mode_sort(r.mode.label),
                                             r.engine, r.prompt.name, r.created))
    anchors = {id(r): f"cell-{i}" for i, r in enumerate(records)}
    divergences = [_divergence_view(i, r)
                   for i, r in enumerate(r for r in records if r.divergence is not None)]
    regressions = find_regressions(records, baseline) if baseline is not None else None
    svg = {
        "memory": plots.memory_plot(records),
        "acceptance": plots.acceptance_plot(records),
        "throughput": plots.throughput_plot(records, baseline),
    }
    context = {
        "title": title,
        "generated": (generated or datetime.now(timezone.utc)).isoformat(timespec="seconds"),
        "cells": [(anchors[id(r)], r) for r in records],
        "summary": {
            "records": len(records),
            "ok": sum(r.ok for r in records),
            "defects": sum(1 for r in records if r.divergence is not None
                           and r.divergence.verdict == "defect"),
            "near_ties": sum(1 for r in records if r.divergence is not None
                             and r.divergence.verdict == "near-tie"),
            "budget_failures": sum(1 for r in records for b in r.budgets if b.verdict == "fail"),
            "run_ids": sorted({r.run_id for r in records}),
        },
        "matrix": _matrix(records, anchors),
        "divergences": divergences,
        "budgets": [(r, b) for r in records for b in r.budgets],
        "claims": CLAIMS,
        "slots": [(r, name, counters) for r in records
                  for name, counters in sorted(r.ledger.graph_slots.items())],
        "regressions": regressions,
        "baseline_count": len(baseline) if baseline is not None else 0,
        "noise_band_pct": f"{100 * NOISE_BAND:g}",
        "plots": {k: Markup(v) if v is not None else None for k, v in svg.items()},
        "throughput": plots.engine_throughput(records),
        "environments": _environments(records),
    }
    return _env().get_template("report.html.j2").render(**context)
