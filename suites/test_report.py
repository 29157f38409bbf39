"""The HTML parity report, read back as a DOM: planted statuses, findings, errors, unavailable
engines, incomplete runs, budget breaches, the catch matrix and regressions must show where
they belong; evidence strings stay inert; nothing is fetched."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from html.parser import HTMLParser

import pytest

from engines.errors import LockstepError
from engines.ledger import Ledger
from harness import evidence as ev
from harness.cli import main as cli_main
from harness.judgement import FAILING, SEVERITY
from harness.manifest import PlannedCell, RunManifest, write_manifest
from reports import NOISE_BAND, find_regressions, render_report
from reports import render as render_module

VOID = {"area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "source",
        "track", "wbr"}


@dataclass
class Node:
    tag: str
    attrs: dict[str, str | None]
    children: list["Node | str"] = field(default_factory=list)
    parent: "Node | None" = None

    def iter(self):
        yield self
        for child in self.children:
            if isinstance(child, Node):
                yield from child.iter()

    def find_all(self, tag=None, **attrs) -> list["Node"]:
        return [n for n in self.iter() if (tag is None or n.tag == tag)
                and all(n.attrs.get(k.rstrip("_").replace("_", "-")) == v
                        for k, v in attrs.items())]

    def by_class(self, tag: str | None, cls: str) -> list["Node"]:
        """Elements of ``tag`` (any: None) whose class list holds ``cls``."""
        return [n for n in self.iter() if (tag is None or n.tag == tag) and cls in n.classes]

    def by_id(self, ident: str) -> "Node":
        found = [n for n in self.iter() if n.attrs.get("id") == ident]
        assert len(found) == 1, f"expected one element with id={ident!r}, found {len(found)}"
        return found[0]

    @property
    def classes(self) -> set[str]:
        return set((self.attrs.get("class") or "").split())

    def text(self) -> str:
        return "".join(c if isinstance(c, str) else c.text() for c in self.children)


class _TreeBuilder(HTMLParser):
    """A small DOM from the standard library's HTML tokenizer (closes tags leniently)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.root = Node("#document", {})
        self.stack = [self.root]

    def handle_starttag(self, tag, attrs):
        node = Node(tag, dict(attrs), parent=self.stack[-1])
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_startendtag(self, tag, attrs):
        self.stack[-1].children.append(Node(tag, dict(attrs), parent=self.stack[-1]))

    def handle_endtag(self, tag):
        for depth in range(len(self.stack) - 1, 0, -1):
            if self.stack[depth].tag == tag:
                del self.stack[depth:]
                return

    def handle_data(self, data):
        self.stack[-1].children.append(data)


def parse(html: str) -> Node:
    builder = _TreeBuilder()
    builder.feed(html)
    builder.close()
    return builder.root


# -- a v2 record factory -----------------------------------------------------------------------

SAME = object()  # reference=SAME: the oracle's stream equals the engine's


def make_record(*, package="tiny_llama", engine="native-host", mode=("greedy", None),
                prompt="p0", tokens=(5, 9, 12, 7, 30, 2), reference=SAME, margins=None,
                status=None, reason=None, error=None, divergence=None, findings=(),
                audit=None, greedy=None, budgets=(), verdicts=None, tokens_text=None,
                reference_text=None, tokens_per_s=100.0, timings=True, acceptance=(),
                memory=(), ledger=None, run_id="run-1") -> ev.EvidenceRecord:
    """A valid schema-v2 record with the digests computed; tests override what they plant.
    ``reference=None``: the oracle failed (no reference stream); ``findings``: the judged
    steps (``ev.StepFinding``), which make the judgement; ``status`` None: derived from what
    the record holds (a written one must agree with it)."""
    tokens = list(tokens)
    ref = None
    if reference is not None:
        ref_tokens = list(tokens if reference is SAME else reference)
        if margins is None:
            margins = [0.5 + 0.1 * i for i in range(len(ref_tokens))]
        ref = ev.ReferenceRef(engine="oracle:ort-cpu", tokens=ref_tokens,
                              digest=ev.token_digest(ref_tokens), margins=list(margins),
                              tokens_text=reference_text)
    findings = list(findings)
    judgement = None
    if status != "unavailable" and error is None:
        judgement = ev.Judgement(
            oracle="oracle:ort-cpu", near_tie_margin=0.01, steps_judged=len(tokens),
            defects=sum(f.verdict == "defect" for f in findings),
            near_ties=sum(f.verdict == "near-tie" for f in findings), findings=findings)
    if verdicts is None:
        verdicts = {} if status in ("unavailable", "error") else {"token_identity": "pass"}
    written = {} if status is None else {"status": status}
    return ev.EvidenceRecord(
        run_id=run_id,
        environment=ev.Environment(host="ci-host", platform="Linux", python="3.11.7",
                                   numpy="2.4.6"),
        package=ev.PackageRef(name=package, content_hash="sha256:" + "ab" * 32,
                              path=f"/pk/{package}"),
        engine=engine, mode=ev.Mode(kind=mode[0], width=mode[1]),
        prompt=ev.PromptRef(name=prompt, ids=[1, 17, 42]),
        **written, reason=reason, error=error,
        tokens=tokens, tokens_text=tokens_text, token_digest=ev.token_digest(tokens),
        reference=ref, divergence=divergence, judgement=judgement, logits_audit=audit,
        greedy=greedy, ledger=ledger if ledger is not None else Ledger(),
        memory_series=[ev.MemorySample(iteration=i, live_allocations=a, free_bytes=f)
                       for i, (a, f) in enumerate(memory)],
        acceptance_per_round=list(acceptance),
        timings=(ev.Timings(wall_s=0.25, tokens_per_s=tokens_per_s,
                            phase_seconds={"prefill": 0.05, "decode": 0.2})
                 if timings else None),
        budgets=list(budgets), verdicts=dict(verdicts),
    )


def finding(step, engine_token, oracle_token, *, verdict="defect", rank=4, gap=0.8125,
            reason="the engine's token is ranked 4th by the oracle on the engine's prefix",
            oracle_top=None, engine_top=None) -> ev.StepFinding:
    return ev.StepFinding(step=step, engine_token=engine_token, oracle_token=oracle_token,
                          rank=rank, gap=gap, verdict=verdict, reason=reason,
                          oracle_top=oracle_top or [(oracle_token, 3.5), (engine_token, 3.5 - gap)],
                          engine_top=engine_top)


def audit(*, non_finite=0, out=0, decode="same", worst_abs=2.5e-5) -> ev.LogitsAuditRecord:
    steps = [ev.StepAuditRecord(step=i, max_abs=None if i < non_finite else worst_abs,
                                max_rel=1e-4, nmse=1e-12, non_finite=3 if i < non_finite else 0,
                                ok=i >= non_finite + out) for i in range(6)]
    return ev.LogitsAuditRecord(dtype="float32", tolerance={"logits_max_abs": 1e-3,
                                                            "logits_nmse": 1e-8},
                                decode=decode, steps=steps, non_finite_steps=non_finite,
                                out_of_tolerance_steps=out, worst_max_abs=worst_abs,
                                worst_nmse=1e-12)


# -- a planted matrix ------------------------------------------------------------------------

PACKAGES = ("tiny_llama", "tiny_mamba")
ENGINES = ("hf", "native-cuda", "native-host", "ort-cpu")
MODES = (("greedy", None), ("draft", 3))
REF = [5, 9, 12, 7, 30, 2, 44, 8]
TEXT = ["The", " cat", " sat", " on", " the", " mat", ".", "\n"]
DEFECT_CELL = ("tiny_llama", "native-host", "greedy")
BREACH_CELL = ("tiny_mamba", "native-cuda", "draft/w3")
TIE_CELL = ("tiny_mamba", "native-host", "greedy")
ERROR_CELL = ("tiny_mamba", "ort-cpu", "draft/w3")
MISSING_CELL = ("tiny_llama", "ort-cpu", "draft/w3")
UNAVAILABLE_ENGINE = "hf"
UNAVAILABLE_REASON = "transformers is not installed (pip install 'lockstep[hf]')"
ORACLE_TOP = [(7, 3.5), (12, 3.25), (30, 3.0), (66, 2.6875), (2, 2.5)]
ENGINE_TOP = [(66, 4.0), (7, 3.875), (12, 3.0), (30, 2.0), (2, 1.5)]
ERROR = ev.ErrorInfo(stage="decode", type="ExecutionError",
                     message="MatMul: shapes (1, 64) and (32, 64) do not align", step=4,
                     traceback=['File "engines/native/executor.py", line 88, in run',
                                "    out = kernel(*args)",
                                "ExecutionError: MatMul: shapes (1, 64) and (32, 64) do not align"])


def _label(kind, width):
    return kind if width is None else f"{kind}/w{width}"


def planted_cells():
    return [(package, engine, kind, width) for package in PACKAGES for engine in ENGINES
            for kind, width in MODES]


def planted_records() -> list[ev.EvidenceRecord]:
    records = []
    for package, engine, kind, width in planted_cells():
        cell = (package, engine, _label(kind, width))
        if cell == MISSING_CELL:
            continue
        kwargs = dict(package=package, engine=engine, mode=(kind, width),
                      reference=REF, tokens=REF, tokens_text=TEXT,
                      acceptance=[3, 2, 3] if kind == "draft" else [], audit=audit())
        if engine == UNAVAILABLE_ENGINE:
            kwargs.update(tokens=[], tokens_text=None, reference=None, audit=None,
                          acceptance=[], status="unavailable", reason=UNAVAILABLE_REASON,
                          timings=False)
        if cell == DEFECT_CELL:
            tokens = REF[:3] + [66] + REF[4:]
            kwargs.update(tokens=tokens, tokens_text=TEXT[:3] + [" flew"] + TEXT[4:],
                          reference_text=TEXT, status="defect",
                          reason="defect at step 3: engine 66, oracle 7",
                          findings=[finding(3, 66, 7, oracle_top=ORACLE_TOP,
                                            engine_top=ENGINE_TOP),
                                    finding(5, 2, 31, rank=2, gap=0.25),
                                    finding(6, 44, 45, verdict="near-tie", rank=2,
                                            gap=0.004, reason="within the near-tie margin")],
                          divergence=ev.Divergence(step=3, reference_token=7,
                                                   engine_token=66, margin=0.8125,
                                                   verdict="defect", rank=4, gap=0.8125),
                          verdicts={"token_identity": "fail"})
        if cell == TIE_CELL:
            tokens = REF[:5] + [31] + REF[6:]
            kwargs.update(tokens=tokens, tokens_text=None, status="near-tie",
                          findings=[finding(5, 31, 2, verdict="near-tie", rank=2,
                                            gap=0.0025, reason="within the near-tie margin")],
                          divergence=ev.Divergence(step=5, reference_token=2,
                                                   engine_token=31, margin=0.0025,
                                                   verdict="near-tie", rank=2, gap=0.0025))
        if cell == ERROR_CELL:
            kwargs.update(tokens=REF[:4], tokens_text=TEXT[:4], status="error", error=ERROR,
                          reason="decode at step 4: ExecutionError", audit=None,
                          acceptance=[3], timings=False)
        if engine == "native-cuda":
            breach = cell == BREACH_CELL
            kwargs["budgets"] = [
                ev.BudgetCheck(claim="zero_staging", budget=0, measured=0,
                               unit="events", verdict="pass"),
                ev.BudgetCheck(claim="readback_budget", budget=32,
                               measured=4128 if breach else 32, unit="bytes",
                               verdict="fail" if breach else "pass"),
            ]
            kwargs["audit"] = audit(decode="separate")
            kwargs["memory"] = [(40, 2**33), (40, 2**33), (40, 2**33)]
            if breach:
                kwargs.update(status="budget", verdicts={"token_identity": "pass",
                                                         "readback_budget": "fail"})
        records.append(make_record(**kwargs))
    return records


def planted_manifest(*, complete=True, run_id="run-1", missing_extra=()) -> RunManifest:
    planned = [PlannedCell(package=p, engine=e, mode=_label(k, w), prompt="p0")
               for p, e, k, w in planted_cells()]
    planned += [PlannedCell(package=p, engine=e, mode=m, prompt=pr)
                for p, e, m, pr in missing_extra]
    started = datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc)
    return RunManifest(run_id=run_id, started=started, command=["lockstep", "run"],
                       planned=planned, complete=complete,
                       finished=started + timedelta(minutes=3) if complete else None)


@pytest.fixture(scope="module")
def planted_dom() -> Node:
    return parse(render_report(planted_records(), manifests=[planted_manifest()]))


def _matrix_cells(dom: Node) -> dict[tuple, Node]:
    matrix = dom.by_id("matrix")
    assert matrix.tag == "table"
    return {(td.attrs["data-package"], td.attrs["data-engine"], td.attrs["data-mode"]): td
            for td in matrix.find_all("td") if "data-verdict" in td.attrs}


def test_matrix_cells_carry_the_worst_status_of_their_records(planted_dom):
    cells = _matrix_cells(planted_dom)
    assert len(cells) == len(PACKAGES) * len(ENGINES) * len(MODES)
    expected = {cell: "unavailable" if cell[1] == UNAVAILABLE_ENGINE else "identical"
                for cell in cells}
    expected.update({DEFECT_CELL: "defect", BREACH_CELL: "budget", TIE_CELL: "near-tie",
                     ERROR_CELL: "error", MISSING_CELL: "missing"})
    got = {cell: td.attrs["data-verdict"] for cell, td in cells.items()}
    assert got == expected
    for cell, td in cells.items():
        assert f"verdict-{expected[cell]}" in td.classes
        assert td.text().split()[0] == expected[cell]
    # the unavailable reason is on the cell (tooltip) and visible in it
    hf = cells[("tiny_llama", UNAVAILABLE_ENGINE, "greedy")]
    assert UNAVAILABLE_REASON in hf.attrs["title"]
    assert "transformers is not installed" in hf.text()
    assert "ExecutionError" in cells[ERROR_CELL].attrs["title"]
    assert cells[MISSING_CELL].attrs["data-missing"] == "1"


def holding(status: str) -> ev.EvidenceRecord:
    """A record whose content stands for ``status`` (its status derived from it)."""
    fail = ev.BudgetCheck(claim="zero_staging", budget=0, measured=1, verdict="fail")
    content = {"error": dict(error=ERROR), "non-finite": dict(audit=audit(non_finite=1)),
               "defect": dict(findings=[finding(1, 9, 10)]), "budget": dict(budgets=[fail]),
               "drift": dict(audit=audit(out=1)),
               "near-tie": dict(findings=[finding(1, 9, 10, verdict="near-tie")]),
               "identical": {}, "unavailable": dict(status="unavailable")}[status]
    return make_record(verdicts={}, **content)


def test_cell_verdict_follows_harness_severity():
    records = {s: holding(s) for s in SEVERITY}
    assert {s: r.status for s, r in records.items()} == {s: s for s in SEVERITY}
    for i, a in enumerate(SEVERITY):
        for b in SEVERITY[i:]:
            assert render_module.cell_verdict([records[b], records[a]]) == a
    assert render_module.cell_verdict([]) == "missing"
    # a planned prompt without a record: a passing cell is not shown as passing
    assert render_module.cell_verdict([records["identical"]], missing=1) == "missing"
    assert render_module.cell_verdict([records["defect"]], missing=1) == "defect"
    # a record built without the check (model_copy) still reads as what it holds
    stale = holding("defect").model_copy(update={"status": "identical"})
    assert render_module.cell_verdict([stale]) == "defect"


def test_summary_counts_records_by_status(planted_dom):
    summary = {div.attrs["data-key"]: div.find_all("b")[0].text()
               for div in planted_dom.by_id("summary").children
               if isinstance(div, Node) and "data-key" in div.attrs}
    assert summary == {"errors": "1", "non-finite": "0", "defects": "1", "budget": "1",
                       "drift": "0", "near-ties": "1", "missing": "1"}


def test_the_first_screen_says_how_many_cells_were_judged_and_failed_then_the_matrix(
        planted_dom):
    headline = planted_dom.by_id("headline")
    n = len(planted_cells()) - 1  # one planned cell has no record
    judged = n - 4  # 4 unavailable records are not judged
    assert (headline.attrs["data-judged"], headline.attrs["data-failed"]) == (str(judged), "3")
    text = " ".join(headline.text().split())
    assert text.startswith(f"{judged} cell(s) judged: 3 failed, 1 near-tie")
    assert "1 planned cell(s) without a record" in text
    assert f"/ {n}" not in text  # no "ok / records" ratio that reads like a pass rate
    # the header holds the headline, the counts and one line per unavailable engine; the
    # matrix is the first section after it
    header = headline.parent
    assert header.tag == "header" and planted_dom.by_id("unavailable").parent is header
    body = next(n for n in planted_dom.iter() if n.tag == "body")
    after = [c for c in body.children if isinstance(c, Node)]
    assert after[after.index(header) + 1].find_all(id="matrix")


def test_unavailable_engines_fold_into_one_line_each(planted_dom):
    lines = planted_dom.by_id("unavailable").find_all("li")
    assert [li.attrs["data-engine"] for li in lines] == [UNAVAILABLE_ENGINE]
    text = " ".join(lines[0].text().split())
    assert text == f"{UNAVAILABLE_ENGINE}: {UNAVAILABLE_REASON}, 4 cell(s) not run"
    assert lines[0].attrs["title"] == f"tiny_llama, tiny_mamba\n{UNAVAILABLE_REASON}"


def test_cells_left_out_of_a_plan_fold_with_unavailable_records_per_engine():
    from harness.manifest import LeftOutCells

    manifest = planted_manifest()
    manifest.left_out = [
        LeftOutCells(engine=e, package=p, mode="greedy", reason=why, cells=3, decided_by=by)
        for e, why, by in (("ort-genai", "no checkpoint.json", "declaration"),
                           ("native-cuda", "not available here: no CuPy", "machine"))
        for p in ("tiny_llama", "tiny_mamba", "tied_llama")]
    dom = parse(render_report(planted_records(), manifests=[manifest]))
    lines = {li.attrs["data-engine"]: " ".join(li.text().split())
             for li in dom.by_id("unavailable").find_all("li")}
    assert lines == {
        "ort-genai": "ort-genai: no checkpoint.json, 9 cell(s) not run",
        "native-cuda": "native-cuda: not available here: no CuPy, 9 cell(s) not run",
        UNAVAILABLE_ENGINE: f"{UNAVAILABLE_ENGINE}: {UNAVAILABLE_REASON}, 4 cell(s) not run"}
    # a line names two reasons at most; every reason is in its title
    many = [make_record(engine="picky", package=f"pk{i}", status="unavailable", verdicts={},
                        reason=f"pk{i} is not for picky") for i in range(4)]
    (line,) = [li for li in parse(render_report(many)).by_id("unavailable").find_all("li")]
    assert " ".join(line.text().split()) == ("picky: pk0 is not for picky; pk1 is not for "
                                             "picky (and 2 other reason(s)), 4 cell(s) not run")
    assert line.attrs["title"].splitlines() == ["pk0, pk1, pk2, pk3"] + [
        f"pk{i} is not for picky" for i in range(4)]
    # left-out cells were never planned: they are neither judged nor missing
    headline = dom.by_id("headline")
    assert headline.attrs["data-judged"] == str(len(planted_cells()) - 1 - 4)
    assert "1 planned cell(s) without a record" in " ".join(headline.text().split())


def test_error_record_shows_stage_type_message_step_and_traceback(planted_dom):
    article = _articles(planted_dom)[ERROR_CELL]
    assert article.attrs["data-status"] == "error" and "failing" in article.classes
    assert article.by_class("td", "error-stage")[0].text() == "decode"
    assert article.by_class("td", "error-type")[0].text() == "ExecutionError"
    assert article.by_class("td", "error-message")[0].text() == ERROR.message
    assert article.by_class("td", "error-step")[0].text() == "4"
    tb = article.by_class("pre", "traceback")[0].text()
    assert tb.splitlines() == ERROR.traceback
    # it counts as failing: in the summary and in the claims table
    assert ERROR_CELL not in {k for k, td in _matrix_cells(planted_dom).items()
                              if td.attrs["data-verdict"] not in FAILING}


def test_error_record_without_reference_shows_the_engine_stream_alone():
    record = make_record(status="error", reference=None, tokens=[5, 9, 12],
                         tokens_text=["a", "b", "c"], timings=False,
                         error=ev.ErrorInfo(stage="oracle", type="RuntimeError",
                                            message="oracle ran out of memory"))
    dom = parse(render_report([record]))
    article = dom.by_id("findings").find_all("article")[0]
    assert article.by_class("p", "no-reference")
    assert not article.by_class("pre", "reference-text")
    assert article.by_class("pre", "engine-text")[0].text() == "abc"
    header = [th.text() for th in article.by_class("table", "streams")[0].find_all("th")]
    assert header == ["step", "engine token"]
    rows = [tr for tr in article.find_all("tr") if "data-step" in tr.attrs]
    assert [tr.find_all("td")[1].text().split()[0] for tr in rows] == ["5", "9", "12"]
    assert dom.by_id("summary").find_all("div", data_key="errors")[0].find_all("b")[0].text() == "1"


def _articles(dom: Node) -> dict[tuple, Node]:
    section = dom.by_id("findings")
    return {(a.attrs["data-package"], a.attrs["data-engine"], a.attrs["data-mode"]): a
            for a in section.find_all("article")}


def test_findings_list_each_failing_record_and_only_those(planted_dom):
    assert set(_articles(planted_dom)) == {DEFECT_CELL, TIE_CELL, ERROR_CELL, BREACH_CELL}


def test_first_finding_shows_rank_gap_reason_and_both_top5_lists(planted_dom):
    defect = _articles(planted_dom)[DEFECT_CELL]
    first = defect.by_class("div", "first-finding")[0]
    assert first.attrs["data-step"] == "3" and first.attrs["data-verdict"] == "defect"
    assert first.by_class("td", "engine-token")[0].text().split()[0] == "66"
    assert "flew" in first.by_class("td", "engine-token")[0].text()
    assert first.by_class("td", "oracle-token")[0].text().split()[0] == "7"
    assert first.by_class("td", "rank")[0].text() == "4"
    assert first.by_class("td", "gap")[0].text() == "0.8125"
    assert "ranked 4th" in first.by_class("td", "finding-reason")[0].text()
    assert first.by_class("b", "margin")[0].text() == "0.8125"
    oracle = first.by_class("table", "oracle-top")[0]
    engine = first.by_class("table", "engine-top")[0]
    ids = lambda t: [int(tr.attrs["data-id"]) for tr in t.find_all("tr") if "data-id" in tr.attrs]
    assert ids(oracle) == [t for t, _ in ORACLE_TOP]
    assert ids(engine) == [t for t, _ in ENGINE_TOP]
    marked = [tr.attrs["data-id"] for tr in oracle.find_all("tr") if "engine-token" in tr.classes]
    assert marked == ["66"]
    # both lists side by side in one container
    assert oracle.parent.parent is engine.parent.parent
    further = defect.by_class("ul", "further-findings")[0]
    assert [li.attrs["data-step"] for li in further.find_all("li")] == ["5", "6"]
    assert "r2" in further.find_all("li")[0].text()


def test_planted_divergence_is_highlighted_with_both_streams_and_margin(planted_dom):
    articles = _articles(planted_dom)
    defect = articles[DEFECT_CELL]
    rows = [tr for tr in defect.find_all("tr") if "data-step" in tr.attrs]
    assert [int(tr.attrs["data-step"]) for tr in rows] == list(range(len(REF)))
    highlighted = [tr for tr in rows if "diverged" in tr.classes]
    assert len(highlighted) == 1 and highlighted[0].attrs["data-step"] == "3"
    step, ref_cell, eng_cell, margin_cell = highlighted[0].find_all("td")
    assert ref_cell.text().split()[0] == "7" and "on" in ref_cell.text()
    assert eng_cell.text().split()[0] == "66" and "flew" in eng_cell.text()
    assert [tr.attrs["data-step"] for tr in rows if "finding" in tr.classes] == ["3", "5", "6"]
    assert all("same" in tr.classes for tr in rows if tr.attrs["data-step"] != "3")
    marks = {pre.attrs["class"]: [m.text() for m in pre.find_all("mark")]
             for pre in defect.find_all("pre")}
    assert marks == {"reference-text": [" on"], "engine-text": [" flew"]}
    tie = articles[TIE_CELL]
    assert tie.attrs["data-status"] == "near-tie" and "failing" not in tie.classes
    assert [tr.attrs["data-step"] for tr in tie.find_all("tr") if "diverged" in tr.classes] == ["5"]
    assert tie.by_class("b", "margin")[0].text() == "0.0025"
    assert not tie.by_class("table", "engine-top")  # not recorded: said so
    assert "not recorded" in tie.by_class("div", "tops")[0].text()


def _speculative(greedy_verdict, agrees, first_difference, spec_findings=()):
    spec = [5, 9, 12, 7, 30, 2]
    greedy = list(spec) if agrees else spec[:2] + [13] + spec[3:]
    first = None
    if greedy_verdict != "identical":
        first = ev.Divergence(step=2, reference_token=12, engine_token=13, margin=0.7,
                              verdict=greedy_verdict, rank=3, gap=0.7)
    return make_record(
        engine="native-host", mode=("draft", 3), tokens=spec, acceptance=[3, 2],
        status="defect" if greedy_verdict == "defect" or spec_findings else "identical",
        reason="the greedy path is wrong at step 2" if greedy_verdict == "defect" else None,
        findings=spec_findings,
        greedy=ev.GreedyRef(tokens=greedy, digest=ev.token_digest(greedy),
                            verdict=greedy_verdict, first_finding=first,
                            agrees_with_speculative=agrees, first_difference=first_difference),
        verdicts={"token_identity": "pass",
                  "spec_equals_greedy": "pass" if agrees else "fail"})


def test_speculative_record_with_a_wrong_greedy_path_says_so():
    record = _speculative("defect", agrees=False, first_difference=2)
    dom = parse(render_report([record]))
    article = dom.by_id("findings").find_all("article")[0]
    note = article.by_class("p", "greedy-path")[0]
    assert note.attrs["data-wrong"] == "greedy"
    assert "the greedy path is wrong at step 2" in note.text()
    assert note.by_class("b", "greedy-verdict")[0].text() == "defect"
    assert note.by_class("b", "spec-verdict")[0].text() == "identical"
    assert note.by_class("b", "greedy-agrees")[0].text() == "no"
    assert note.by_class("b", "greedy-first-difference")[0].text() == "2"
    header = [th.text() for th in article.by_class("table", "streams")[0].find_all("th")]
    assert header == ["step", "reference (oracle) token", "greedy token (same engine)",
                      "speculative token", "reference margin"]
    row2 = [tr for tr in article.find_all("tr") if tr.attrs.get("data-step") == "2"][0]
    greedy_cell = row2.by_class("td", "greedy")[0]
    assert greedy_cell.text() == "13" and "greedy-differs" in greedy_cell.classes
    # the other way round: the speculative path is the wrong one
    spec_bad = _speculative("identical", agrees=False, first_difference=2,
                            spec_findings=[finding(2, 13, 12)])
    note = parse(render_report([spec_bad])).by_class("p", "greedy-path")[0]
    assert note.attrs["data-wrong"] == "speculative"
    assert "the speculative path is wrong" in note.text()


def test_logits_audit_is_summarised_per_record():
    records = [make_record(engine="ort-cpu", audit=audit()),
               make_record(engine="native-cuda", audit=audit(decode="separate")),
               make_record(engine="bad-nan", status="non-finite", audit=audit(non_finite=2),
                           verdicts={"finite_logits": "fail"})]
    dom = parse(render_report(records))
    table = dom.by_id("logits-audit")
    rows = {tr.attrs["data-engine"]: tr for tr in table.find_all("tr") if "data-engine" in tr.attrs}
    assert set(rows) == {"ort-cpu", "native-cuda", "bad-nan"}
    cells = lambda e: [td.text() for td in rows[e].find_all("td")]
    assert cells("native-cuda")[5] == "separate" and cells("ort-cpu")[5] == "same"
    assert cells("ort-cpu")[7] == "2.5e-05"
    assert cells("bad-nan")[9] == "2" and "verdict-non-finite" in rows["bad-nan"].classes
    assert _matrix_cells(dom)[("tiny_llama", "bad-nan", "greedy")].attrs["data-verdict"] == \
        "non-finite"


def test_budgets_are_aggregated_per_engine_and_claim_failures_first():
    records = []
    for i in range(150):
        fail = i in (7, 90, 140)
        records.append(make_record(engine="native-cuda", prompt=f"p{i}", budgets=[
            ev.BudgetCheck(claim="zero_staging", budget=0, measured=0, unit="events",
                           verdict="pass"),
            ev.BudgetCheck(claim="readback_budget", budget=128, measured=132 if fail else 128,
                           unit="bytes", verdict="fail" if fail else "pass")],
            status="budget" if fail else "identical"))
    dom = parse(render_report(records))
    table = dom.by_id("budgets")
    rows = [tr for tr in table.find_all("tr") if "data-claim" in tr.attrs]
    assert [(tr.attrs["data-engine"], tr.attrs["data-claim"], tr.attrs["data-checks"],
             tr.attrs["data-failures"]) for tr in rows] == [
        ("native-cuda", "readback_budget", "150", "3"),
        ("native-cuda", "zero_staging", "150", "0")]
    assert "verdict-fail" in rows[0].classes and "verdict-pass" in rows[1].classes
    assert rows[0].by_class("td", "first-failure")[0].text() == "132 vs 128 bytes"
    details = dom.by_id("budget-checks-details")
    assert details.tag == "details" and "open" not in details.attrs
    checks = [tr for tr in dom.by_id("budget-checks").find_all("tr") if "data-verdict" in tr.attrs]
    assert len(checks) == 300
    assert [tr.attrs["data-verdict"] for tr in checks[:4]] == ["fail", "fail", "fail", "pass"]


def test_budget_breach_of_the_planted_matrix(planted_dom):
    rows = [tr for tr in planted_dom.by_id("budgets").find_all("tr") if "data-claim" in tr.attrs]
    assert [(tr.attrs["data-claim"], tr.attrs["data-checks"], tr.attrs["data-failures"])
            for tr in rows] == [("readback_budget", "4", "1"), ("zero_staging", "4", "0")]
    cells = [td.text().strip() for td in rows[0].find_all("td")]
    assert cells[-2:] == ["4128 vs 32 bytes", "tiny_mamba · draft/w3 · p0"]


# -- completeness ----------------------------------------------------------------------------

def test_incomplete_run_is_named_in_a_red_banner_with_the_missing_cell(planted_dom):
    banners = [n for n in planted_dom.iter() if "banner" in n.classes]
    assert len(banners) == 1
    banner = banners[0]
    assert banner.parent.tag == "header"
    assert "INCOMPLETE" in banner.text() and "run-1" in banner.text()
    n = len(planted_cells())
    assert (banner.attrs["data-planned"], banner.attrs["data-recorded"]) == (str(n), str(n - 1))
    missing = [li.text() for li in banner.find_all("li")]
    assert missing == [" · ".join(MISSING_CELL + ("p0",))]
    runs = [tr for tr in planted_dom.by_id("runs-table").find_all("tr") if "data-run" in tr.attrs]
    assert [(tr.attrs["data-run"], tr.attrs["data-complete"]) for tr in runs] == [("run-1", "no")]


def test_complete_run_has_no_banner_and_an_unfinished_one_does():
    records = [r for r in planted_records()]
    cells = {(r.package.name, r.engine, r.mode.label) for r in records}
    manifest = planted_manifest()
    manifest.planned = [c for c in manifest.planned if (c.package, c.engine, c.mode) in cells]
    dom = parse(render_report(records, manifests=[manifest]))
    assert not [n for n in dom.iter() if "banner" in n.classes]
    assert "missing" not in {td.attrs["data-verdict"] for td in _matrix_cells(dom).values()}
    assert not [n for n in dom.iter() if n.attrs.get("id") == "no-manifest"]
    manifest.complete, manifest.finished = False, None
    dom = parse(render_report(records, manifests=[manifest]))
    banner = [n for n in dom.iter() if "banner" in n.classes][0]
    assert "INCOMPLETE" in banner.text() and "never marked complete" in banner.text()


def test_banner_names_only_the_first_20_missing_cells():
    extra = [("tiny_llama", "native-host", "greedy", f"q{i:02}") for i in range(30)]
    dom = parse(render_report(planted_records(),
                              manifests=[planted_manifest(missing_extra=extra)]))
    banner = [n for n in dom.iter() if "banner" in n.classes][0]
    items = banner.find_all("li")
    assert len(items) == 21 and "11 more" in items[-1].text()  # 31 missing: 20 named
    cell = _matrix_cells(dom)[("tiny_llama", "native-host", "greedy")]
    assert cell.attrs["data-verdict"] == "defect"  # failing outranks missing
    assert cell.attrs["data-missing"] == "30"


def test_a_later_run_that_records_the_missing_cell_fills_the_matrix_not_the_banner():
    rerun = make_record(package=MISSING_CELL[0], engine=MISSING_CELL[1], mode=("draft", 3),
                        run_id="run-2")
    later = RunManifest(run_id="run-2", started=datetime(2026, 1, 3, tzinfo=timezone.utc),
                        planned=[PlannedCell(package=MISSING_CELL[0], engine=MISSING_CELL[1],
                                             mode=MISSING_CELL[2], prompt="p0")], complete=True)
    dom = parse(render_report(planted_records() + [rerun],
                              manifests=[planted_manifest(), later]))
    assert _matrix_cells(dom)[MISSING_CELL].attrs["data-verdict"] == "identical"
    banners = [n for n in dom.iter() if "banner" in n.classes]
    assert [b.attrs["data-run"] for b in banners] == ["run-1"]


def test_evidence_without_a_manifest_renders_with_a_muted_note():
    dom = parse(render_report(planted_records()))
    note = dom.by_id("no-manifest")
    assert "muted" in note.classes and "no run manifest" in note.text()
    assert not [n for n in dom.iter() if "banner" in n.classes]
    verdicts = {k: td.attrs["data-verdict"] for k, td in _matrix_cells(dom).items()}
    assert verdicts[MISSING_CELL] == "not-run"  # no plan: a hole, not a missing record


# -- catch matrix ----------------------------------------------------------------------------

CATCH = {
    "generated": "2026-01-02T03:04:05Z",
    "rows": [
        {"bug": "kv_drop_append", "description": "the KV append at step 3 is dropped",
         "package": "tiny_llama", "mode": "greedy", "expected": {"status": "defect", "step": 3},
         "observed": {"status": "defect", "step": 3}, "caught": True},
        {"bug": "kv_drop_append", "description": "the KV append at step 3 is dropped",
         "package": "tiny_mamba", "mode": "greedy", "expected": {"status": "defect", "step": 3},
         "observed": {"status": "drift", "step": 3}, "caught": False},
        {"bug": "nan_row", "description": "NaN in one logits row",
         "package": "tiny_llama", "mode": "greedy",
         "expected": {"status": "non-finite", "step": 2},
         "observed": {"status": "non-finite", "step": 2}, "caught": True},
    ],
    "control": [
        {"bug": "control", "description": "harmless", "package": "tiny_llama", "mode": "greedy",
         "expected": {"status": "identical", "step": None},
         "observed": {"status": "identical", "step": None}, "caught": True},
    ],
}


def test_catch_matrix_renders_caught_and_not_caught_rows():
    dom = parse(render_report(planted_records(), catch_matrix=CATCH))
    section = dom.by_id("catch-matrix")
    assert "Planted bugs: catch matrix" in section.find_all("h2")[0].text()
    cells = {(td.attrs["data-bug"], td.attrs["data-package"]): td
             for td in section.find_all("td") if "data-caught" in td.attrs}
    assert {k: td.attrs["data-caught"] for k, td in cells.items()} == {
        ("kv_drop_append", "tiny_llama"): "yes", ("kv_drop_append", "tiny_mamba"): "no",
        ("nan_row", "tiny_llama"): "yes", ("control", "tiny_llama"): "yes"}
    assert "caught" in cells[("kv_drop_append", "tiny_llama")].classes
    assert "not-caught" in cells[("kv_drop_append", "tiny_mamba")].classes
    assert cells[("kv_drop_append", "tiny_mamba")].text().split()[:4] == ["drift", "@", "step", "3"]
    assert "expected defect @ 3" in cells[("kv_drop_append", "tiny_mamba")].text()
    control = cells[("control", "tiny_llama")]
    assert control.find_all("div")[0].attrs["data-observed"] == "identical"
    assert [tr.attrs["data-bug"] for tr in section.by_class("tr", "control")] == ["control"]
    assert dom.by_id("catch-count").text() == "2 / 3"
    assert "kv_drop_append · tiny_mamba" in section.text()
    # it is the planted-bug suite's result, not this run's, and says so before its count
    source = dom.by_id("catch-source")
    assert section.children.index(source) < section.children.index(
        dom.by_id("catch-count").parent)
    assert "Not from the runs in this report" in source.text()
    assert "suites/test_planted_bugs.py" in source.text()
    # a control that is not identical is red
    noisy = json.loads(json.dumps(CATCH))
    noisy["control"][0]["observed"] = {"status": "near-tie", "step": 4}
    cell = [td for td in parse(render_report([], catch_matrix=noisy)).by_id("catch-matrix")
            .find_all("td") if td.attrs.get("data-bug") == "control"][0]
    assert "not-caught" in cell.classes
    assert not [n for n in parse(render_report([])).iter()
                if n.attrs.get("id") == "catch-matrix"]


def test_catch_matrix_file_given_explicitly_must_be_readable(tmp_path):
    with pytest.raises(LockstepError) as info:
        render_module.load_catch_matrix(tmp_path / "absent.json")
    assert info.value.field == "--catch-matrix" and info.value.remedy
    bad = tmp_path / "bad.json"
    bad.write_text('{"rows": [{"bug": 1}]}')
    with pytest.raises(LockstepError) as info:
        render_module.load_catch_matrix(bad)
    assert info.value.field == "--catch-matrix" and "rows[0]" in info.value.message
    bad.write_text("{not json")
    with pytest.raises(LockstepError, match="not valid JSON"):
        render_module.load_catch_matrix(bad)


# -- safety and self-containment ---------------------------------------------------------------

def test_graph_slot_counters_are_tabulated():
    record = make_record(engine="native-cuda")
    record.ledger.graph_slots["PRIMARY"] = ev.GraphSlotRecord(captures=1, replays=31)
    record.ledger.graph_slots["VERIFY"] = ev.GraphSlotRecord(captures=2, replays=9, fallbacks=1)
    table = parse(render_report([record])).by_id("graph-slots")
    rows = {tr.attrs["data-slot"]: [td.text() for td in tr.find_all("td")][4:]
            for tr in table.find_all("tr") if "data-slot" in tr.attrs}
    assert rows == {"PRIMARY": ["PRIMARY", "1", "31", "0", "0", "0"],
                    "VERIFY": ["VERIFY", "2", "9", "1", "0", "0"]}


def test_plots_are_present_with_unique_ids(planted_dom):
    memory = planted_dom.by_id("plot-memory")
    assert len(memory.find_all("svg")) == 1 and memory.find_all("path")
    assert len(planted_dom.by_id("plot-acceptance").find_all("svg")) == 1
    assert len(planted_dom.by_id("plot-throughput").find_all("svg")) == 1
    ids = [n.attrs["id"] for n in planted_dom.iter() if "id" in n.attrs]
    assert len(ids) == len(set(ids)), "duplicate element ids"


def test_wide_tables_scroll_in_their_own_box(planted_dom):
    assert planted_dom.by_id("matrix").parent.attrs.get("id") == "matrix-box"
    assert "scroll" in planted_dom.by_id("matrix-box").classes
    css = "".join(n.text() for n in planted_dom.find_all("style"))
    assert re.search(r"\.scroll\s*\{[^}]*overflow-x:\s*auto", css)


def test_report_is_self_contained(planted_dom):
    html = render_report(planted_records(), manifests=[planted_manifest()], catch_matrix=CATCH)
    assert not re.search(r"(?i)\b(?:https?|ftp|wss?):|//[a-z0-9.-]+\.[a-z]{2,}/", html)
    assert "Content-Security-Policy" in html and "default-src 'none'" in html
    dom = parse(html)
    tags = {n.tag for n in dom.iter()}
    assert not tags & {"script", "link", "iframe", "img", "object", "embed", "base"}
    for node in dom.iter():
        for name in ("href", "src", "xlink:href", "action", "srcset", "data"):
            value = node.attrs.get(name)
            assert value is None or value.startswith("#"), (node.tag, name, value)
        style = node.attrs.get("style") or ""
        assert "url(" not in style.replace("url(#", "")
    css = "".join(n.text() for n in dom.find_all("style"))
    assert "@import" not in css and "url(" not in css


HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'
ATTR_BREAK = '" onmouseover="alert(3)" x="'


def test_strings_from_evidence_are_rendered_inert():
    tie = ev.Divergence(step=1, reference_token=9, engine_token=10, margin=0.5, verdict="defect")
    record = make_record(package="pkg" + HOSTILE, engine="eng" + HOSTILE, prompt=HOSTILE,
                         tokens=[5, 10], reference=[5, 9], divergence=tie, status="defect",
                         reason="reason" + HOSTILE + ATTR_BREAK,
                         findings=[finding(1, 10, 9, reason="why" + HOSTILE + ATTR_BREAK),
                                   finding(1, 10, 9, reason=ATTR_BREAK + HOSTILE)],
                         tokens_text=["$x$ " + HOSTILE, "</pre>" + HOSTILE],
                         reference_text=["a", "--><script>alert(2)</script><!--"],
                         acceptance=[1, 2], memory=[(1, 10)],
                         budgets=[ev.BudgetCheck(claim="zero_staging", budget=0, measured=1,
                                                 verdict="fail", note=HOSTILE)])
    errored = make_record(engine="err" + HOSTILE, status="error", reason=ATTR_BREAK + HOSTILE,
                          error=ev.ErrorInfo(stage="decode" + HOSTILE, type="T" + HOSTILE,
                                             message="msg" + HOSTILE + ATTR_BREAK,
                                             traceback=["tb" + HOSTILE, "</pre>" + HOSTILE]))
    gone = make_record(engine="gone" + HOSTILE, status="unavailable", tokens=[],
                       reference=None, reason="why" + HOSTILE + ATTR_BREAK, timings=False)
    manifest = RunManifest(run_id="run-1", started=datetime.now(timezone.utc), planned=[
        PlannedCell(package="p" + HOSTILE, engine="e" + ATTR_BREAK, mode="greedy",
                    prompt=HOSTILE)])
    catch = {"rows": [{"bug": "b" + HOSTILE, "description": "d" + HOSTILE + ATTR_BREAK,
                       "package": "p" + ATTR_BREAK, "mode": HOSTILE,
                       "observed": {"status": HOSTILE, "step": 1}, "caught": False}]}
    html = render_report([record, errored, gone],
                         baseline=[make_record(package="pkg" + HOSTILE,
                                               engine="eng" + HOSTILE, prompt=HOSTILE)],
                         manifests=[manifest], catch_matrix=catch)
    dom = parse(html)
    assert not dom.find_all("script")
    assert not dom.find_all("img")
    handlers = [(n.tag, k) for n in dom.iter() for k in n.attrs if k.startswith("on")]
    assert handlers == []
    # The strings are still there, as text the reader can see.
    text = dom.text()
    assert "eng" + HOSTILE in text and "</pre>" + HOSTILE in text
    assert "--><script>alert(2)</script><!--" in text
    assert "msg" + HOSTILE + ATTR_BREAK in text and "tb" + HOSTILE in text
    assert "why" + HOSTILE + ATTR_BREAK in text and "d" + HOSTILE + ATTR_BREAK in text
    titles = [n.attrs["title"] for n in dom.iter() if n.attrs.get("title")]
    assert any(ATTR_BREAK + HOSTILE in t for t in titles)  # an attribute, intact and inert


# -- regressions -------------------------------------------------------------------------------

def test_regressions_against_a_baseline_are_listed_first():
    band = NOISE_BAND
    baseline = [
        make_record(engine="e-div"), make_record(engine="e-budget"),
        make_record(engine="e-slow", tokens_per_s=100.0),
        make_record(engine="e-noisy", tokens_per_s=100.0),
        make_record(engine="e-accept", mode=("draft", 3), acceptance=[3, 3, 3, 3]),
        make_record(engine="e-gone"), make_record(engine="e-error"),
    ]
    div = ev.Divergence(step=2, reference_token=12, engine_token=13, margin=0.9, verdict="defect")
    breach = ev.BudgetCheck(claim="zero_staging", budget=0, measured=3, unit="events",
                            verdict="fail")
    current = [
        make_record(engine="e-div", tokens=[5, 9, 13, 7, 30, 2], reference=[5, 9, 12, 7, 30, 2],
                    divergence=div, status="defect", findings=[finding(2, 13, 12)]),
        make_record(engine="e-budget", budgets=[breach], status="budget"),
        make_record(engine="e-slow", tokens_per_s=100.0 * (1 - band) - 5),
        make_record(engine="e-noisy", tokens_per_s=100.0 * (1 - band) + 1),
        make_record(engine="e-accept", mode=("draft", 3), acceptance=[2, 2, 3, 2]),
        make_record(engine="e-new"),
        make_record(engine="e-error", status="error", error=ERROR, timings=False),
    ]
    found = {(r.kind, r.cell[1]) for r in find_regressions(current, baseline)}
    assert found == {("new-divergence", "e-div"), ("budget-breach", "e-budget"),
                     ("throughput", "e-slow"), ("acceptance", "e-accept"),
                     ("missing-cell", "e-gone"), ("status", "e-error")}
    dom = parse(render_report(current, baseline))
    section = dom.by_id("regressions")
    body = dom.find_all("body")[0]
    sections = [n for n in body.iter() if n.tag == "section"]
    assert sections[0] is section, "regressions must come before every other section"
    rows = [(tr.attrs["data-kind"], tr.find_all("td")[2].text())
            for tr in section.find_all("tr") if "data-kind" in tr.attrs]
    assert set(rows) == found and rows[0] == ("new-divergence", "e-div")
    assert dom.by_id("noise-band").text() == f"{100 * band:g}%"


def test_identical_baseline_reports_nothing_regressed():
    records = planted_records()
    assert find_regressions(records, records) == []
    section = parse(render_report(records, records)).by_id("regressions")
    assert "clean" in section.classes
    assert not [tr for tr in section.find_all("tr") if "data-kind" in tr.attrs]


def test_no_baseline_no_regression_section(planted_dom):
    assert not [n for n in planted_dom.iter() if n.attrs.get("id") == "regressions"]


def test_empty_evidence_renders_a_report_that_says_so():
    dom = parse(render_report([]))
    assert "nothing ran" in dom.by_id("matrix").text()


# -- the CLI ---------------------------------------------------------------------------------

def test_cli_writes_the_report(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(render_module, "DEFAULT_CATCH_MATRIX", tmp_path / "none.json")
    current, base = tmp_path / "now", tmp_path / "base"
    for record in planted_records():
        ev.write_evidence(record, current)
    write_manifest(current, planted_manifest())
    ev.write_evidence(make_record(package="tiny_llama", engine="native-host",
                                  reference=REF, tokens=REF), base)
    out = tmp_path / "out" / "report.html"
    status = cli_main(["report", str(current), "--baseline", str(base), "-o", str(out)])
    assert status == 0
    printed = capsys.readouterr().out
    assert str(out) in printed and "run-1 is INCOMPLETE" in printed
    dom = parse(out.read_text(encoding="utf-8"))
    rows = [tr.attrs["data-kind"] for tr in dom.by_id("regressions").find_all("tr")
            if "data-kind" in tr.attrs]
    assert rows == ["new-divergence", "claim-failing"]  # token_identity fails too
    verdicts = {k: td.attrs["data-verdict"] for k, td in _matrix_cells(dom).items()}
    assert verdicts[DEFECT_CELL] == "defect" and verdicts[MISSING_CELL] == "missing"
    assert [n for n in dom.iter() if "banner" in n.classes]
    assert not [n for n in dom.iter() if n.attrs.get("id") == "catch-matrix"]


def test_cli_catch_matrix_default_explicit_and_off(tmp_path, capsys, monkeypatch):
    ev.write_evidence(make_record(), tmp_path / "ev")
    default = tmp_path / "docs" / "catch_matrix.json"
    default.parent.mkdir()
    default.write_text(json.dumps(CATCH))
    monkeypatch.setattr(render_module, "DEFAULT_CATCH_MATRIX", default)
    out = tmp_path / "r.html"

    def has_section(*extra):
        assert cli_main(["report", str(tmp_path / "ev"), "-o", str(out), *extra]) == 0
        return any(n.attrs.get("id") == "catch-matrix"
                   for n in parse(out.read_text(encoding="utf-8")).iter())

    assert has_section()  # the default file exists: rendered
    source = parse(out.read_text(encoding="utf-8")).by_id("catch-source").text()
    assert str(default) in source and "Not from the runs in this report" in source
    assert not has_section("--no-catch-matrix")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"rows": CATCH["rows"][:1]}))
    assert has_section("--catch-matrix", str(other))
    capsys.readouterr()
    assert cli_main(["report", str(tmp_path / "ev"), "-o", str(tmp_path / "x.html"),
                     "--catch-matrix", str(tmp_path / "absent.json")]) == 2
    err = capsys.readouterr().err
    assert "--catch-matrix" in err and "absent.json" in err and "remedy" in err
    assert "Traceback" not in err and not (tmp_path / "x.html").exists()


def test_cli_names_a_bad_evidence_file_and_exits_2(tmp_path, capsys):
    ev.write_evidence(make_record(), tmp_path)
    bad = tmp_path / "broken.json"
    bad.write_text('{"schema_version": 2, "run_id": "r", "tok')
    assert cli_main(["report", str(tmp_path), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err
    assert not (tmp_path / "r.html").exists()
    assert cli_main(["report", str(tmp_path / "absent"), "-o", str(tmp_path / "r.html")]) == 2


def test_cli_refuses_the_evidence_as_its_own_baseline(tmp_path, capsys):
    """The evidence compared with itself could never regress: refused, not an empty list."""
    ev.write_evidence(make_record(), tmp_path / "ev")
    same = tmp_path / "ev" / ".." / "ev"  # another spelling of the same folder
    assert cli_main(["report", str(tmp_path / "ev"), "-o", str(tmp_path / "r.html"),
                     "--baseline", str(same)]) == 2
    err = capsys.readouterr().err
    assert "--baseline" in err and "compared with itself" in err and "Traceback" not in err
    assert not (tmp_path / "r.html").exists()


def test_cli_names_a_package_given_as_the_evidence_folder(tmp_path, capsys):
    """A package's JSON files are not damaged records to delete: the folder is named as a
    package, under the argument it was given as."""
    from harness.catalog import builtin

    package = Path(builtin.build("tiny_llama"))
    ev.write_evidence(make_record(), tmp_path / "ev")
    for argv, option in ((["report", str(package)], "EVIDENCE_DIR"),
                         (["report", str(tmp_path / "ev"), "--baseline", str(package)],
                          "--baseline")):
        assert cli_main([*argv, "-o", str(tmp_path / "r.html")]) == 2
        err = capsys.readouterr().err
        assert f"[field {option} = " in err and "is a package" in err, err
        assert "delete" not in err and "Traceback" not in err
