"""What the runner, ``lockstep run --explain`` and the report call.

* ``explain_run(summary, engines)``: explain every failing greedy cell of a run that wrote a
  record, writing ``<evidence>/forensics/<record stem>.explain.json`` and ``.layers.svg``
  (and, with ``repro=True``, a repro pack ``<record stem>.repro/``); a cell that cannot be
  explained gets its reason, never an exception: explaining must not fail a run.
* ``explain_and_print(summary, engines, print_fn=console.print)``: the same, one line per
  cell: the one call ``lockstep run --explain`` needs.
* ``load_explanations(evidence_dir)`` and ``explanation_for(record, explained)``: those files
  by record file name and by the record's cell (``record_key``), for the report.
* ``explanation_html(entry, prefix)``: one defect's explanation as an HTML fragment (the
  summary, the first node out of the floor, the feeds that differ, the layer curve inline,
  and the link to its repro pack).
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from pathlib import Path

from engines import json_text
from harness.runner import resolve_engines

from .compare import FACTOR
from .explain import explain_record
from .plot import layer_curve_svg, save_layer_curve
from .repro import write_repro

FOLDER = "forensics"
EXPLAINED = ("defect", "drift", "non-finite", "error")  # statuses a forward can explain


@dataclass
class ExplainedCell:
    record: Path
    engine: str
    summary: str | None = None
    explanation: Path | None = None
    plot: Path | None = None
    repro: Path | None = None
    error: str | None = None


def _classes(engines) -> dict:
    if engines is None:
        return {}
    if isinstance(engines, dict):
        return dict(engines)
    return resolve_engines(list(engines))


def explain_run(summary, engines=None, *, repro: bool = False, out_dir: Path | None = None,
                factor: float = FACTOR, shrink: bool = True) -> list[ExplainedCell]:
    """Explain every failing greedy cell of ``summary`` (a ``RunSummary`` with records).

    ``engines``: the run's engine classes by name (``resolve_engines``' mapping) or the
    references the run was given; cells of other engines are resolved by name."""
    classes = _classes(engines)
    base = out_dir or (Path(summary.evidence_dir) / FOLDER if summary.evidence_dir else None)
    done: list[ExplainedCell] = []
    for cell in summary.cells:
        if cell.status not in EXPLAINED or cell.record_path is None or cell.mode != "greedy":
            continue
        record = Path(cell.record_path)
        entry = ExplainedCell(record, cell.engine)
        done.append(entry)
        if base is None:
            entry.error = "no evidence folder"
            continue
        stem = record.name[:-len(".json")] if record.name.endswith(".json") else record.name
        try:
            expl = explain_record(record, engine=classes.get(cell.engine), factor=factor)
            entry.summary = expl.summary
            entry.explanation = expl.write(base / f"{stem}.explain.json")
            if expl.layers:
                entry.plot = save_layer_curve(expl, base / f"{stem}.layers.svg")
            if repro:
                pack = write_repro(record, base / f"{stem}.repro",
                                   engine=classes.get(cell.engine), factor=factor,
                                   shrink=shrink)
                entry.repro = pack.folder
        except Exception as exc:  # explaining never fails the run
            entry.error = f"{type(exc).__name__}: {exc}"
    return done


def record_key(record) -> str:
    """An evidence record's cell identity, as ``Explanation.key`` writes it: run id, package,
    engine, mode and prompt name (the report holds records, not their file names)."""
    return "|".join([record.run_id, record.package.name, record.engine, record.mode.label,
                     record.prompt.name])


def explanation_for(record, explained: dict) -> dict | None:
    """The ``load_explanations`` entry of ``record`` (an ``EvidenceRecord``), if any."""
    return explained.get(record_key(record))


def load_explanations(evidence_dir) -> dict[str, dict]:
    """``{key: {"explanation": dict, "plot": path | None, "repro": path | None}}`` for every
    explanation written under ``<evidence_dir>/forensics``, keyed both by its record's file
    name and by ``record_key`` (``explanation_for(record, ...)``)."""
    folder = Path(evidence_dir) / FOLDER
    out: dict[str, dict] = {}
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.explain.json")):
        stem = path.name[:-len(".explain.json")]
        try:
            data = json_text.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):  # not an explanation: left out, as unreadable ones are
            continue
        plot = folder / f"{stem}.layers.svg"
        pack = folder / f"{stem}.repro"
        entry = {"explanation": data, "plot": plot if plot.is_file() else None,
                 "repro": pack if (pack / "repro.json").is_file() else None}
        out[f"{stem}.json"] = entry
        if data.get("key"):
            out[data["key"]] = entry
    return out


def explain_and_print(summary, engines=None, *, print_fn=print, repro: bool = False
                      ) -> list[ExplainedCell]:
    """``explain_run`` plus one line per explained cell (what ``lockstep run --explain``
    prints after its tables); never raises."""
    if summary.evidence_dir is None:
        print_fn("explain: nothing written (--no-evidence): explain needs the records")
        return []
    done = explain_run(summary, engines, repro=repro)
    for entry in done:
        if entry.error:
            print_fn(f"explain {entry.record.name}: not explained: {entry.error}")
        else:
            print_fn(f"explain: {entry.summary}")
            print_fn(f"  -> {entry.explanation}" + (f"; repro pack {entry.repro}"
                                                   if entry.repro else ""))
    return done


def explanation_html(entry: dict, prefix: str = "explain", repro_href: str | None = None
                     ) -> str:
    """One explanation as an HTML fragment (``entry``: a ``load_explanations`` value, or
    ``{"explanation": Explanation.to_dict()}``); the layer curve is inlined as SVG."""
    d = entry["explanation"]
    esc = html.escape
    parts = [f'<section class="explanation" id="{esc(prefix)}">',
             f"<p>{esc(d.get('summary', ''))}</p>"]
    fb = d.get("first_bad")
    if fb:
        parts.append("<table><tr><th>layer</th><th>node</th><th>op</th><th>value</th>"
                     "<th>error</th><th>noise floor</th></tr>"
                     f"<tr><td>{esc(str(fb['label']))}</td><td>{esc(fb['node'] or '-')}</td>"
                     f"<td>{esc(fb['op'])}</td><td>{esc(fb['name'])}</td>"
                     f"<td>{esc(str(fb['error']))}</td><td>{esc(str(fb['floor']))}</td></tr>"
                     "</table>")
    feeds = d.get("inputs") or []
    if feeds:
        parts.append("<ul>" + "".join(
            f"<li>feed {esc(f['name'])} ({esc(f['role'])}): error {esc(str(f['error']))}"
            + (f"; {esc(f['origin']['detail'])}" if f.get("origin") else "") + "</li>"
            for f in feeds) + "</ul>")
    if d.get("layers"):
        parts.append(f'<div class="plot">{layer_curve_svg(d, prefix=prefix)}</div>')
    href = repro_href or (str(entry["repro"]) if entry.get("repro") else None)
    if href:
        parts.append(f'<p>repro pack: <a href="{esc(href)}">{esc(href)}</a></p>')
    parts.append("</section>")
    return "\n".join(parts)
