"""The HTML parity report, read back as a DOM: planted verdicts, divergences, budget breaches
and regressions must show where they belong; evidence strings stay inert; nothing is fetched."""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from html.parser import HTMLParser

import pytest

from harness import evidence as ev
from harness.cli import main as cli_main
from reports import NOISE_BAND, find_regressions, render_report
from suites.test_evidence import make_record

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


# -- a planted matrix ------------------------------------------------------------------------

PACKAGES = ("tiny_llama", "tiny_mamba")
ENGINES = ("native-cuda", "native-host", "ort-cpu")
MODES = (("greedy", None), ("draft", 3))
REF = [5, 9, 12, 7, 30, 2, 44, 8]
TEXT = ["The", " cat", " sat", " on", " the", " mat", ".", "\n"]
DEFECT_CELL = ("tiny_llama", "native-host", "greedy")
BREACH_CELL = ("tiny_mamba", "native-cuda", "draft/w3")
TIE_CELL = ("tiny_mamba", "native-host", "greedy")
MISSING_CELL = ("tiny_llama", "ort-cpu", "draft/w3")


def _label(kind, width):
    return kind if width is None else f"{kind}/w{width}"


def planted_records() -> list[ev.EvidenceRecord]:
    records = []
    for package in PACKAGES:
        for engine in ENGINES:
            for kind, width in MODES:
                cell = (package, engine, _label(kind, width))
                if cell == MISSING_CELL:
                    continue
                kwargs = dict(package=package, engine=engine, mode=(kind, width),
                              reference=REF, tokens=REF, tokens_text=TEXT,
                              acceptance=[3, 2, 3] if kind == "draft" else [])
                if cell == DEFECT_CELL:
                    tokens = REF[:3] + [66] + REF[4:]
                    kwargs.update(tokens=tokens, tokens_text=TEXT[:3] + [" flew"] + TEXT[4:],
                                  reference_text=TEXT,
                                  divergence=ev.Divergence(step=3, reference_token=7,
                                                           engine_token=66, margin=0.8125,
                                                           verdict="defect"),
                                  verdicts={"token_identity": "fail"})
                if cell == TIE_CELL:
                    tokens = REF[:5] + [31] + REF[6:]
                    kwargs.update(tokens=tokens, tokens_text=None,
                                  divergence=ev.Divergence(step=5, reference_token=2,
                                                           engine_token=31, margin=0.0025,
                                                           verdict="near-tie"))
                if engine == "native-cuda":
                    breach = cell == BREACH_CELL
                    kwargs["budgets"] = [
                        ev.BudgetCheck(claim="zero_staging", budget=0, measured=0,
                                       unit="events", verdict="pass"),
                        ev.BudgetCheck(claim="readback_budget", budget=32,
                                       measured=4128 if breach else 32, unit="bytes",
                                       verdict="fail" if breach else "pass"),
                    ]
                    kwargs["memory"] = [(40, 2**33), (40, 2**33), (40, 2**33)]
                records.append(make_record(**kwargs))
    return records


@pytest.fixture(scope="module")
def planted_dom() -> Node:
    return parse(render_report(planted_records()))


def test_matrix_cells_carry_the_planted_verdicts(planted_dom):
    matrix = planted_dom.by_id("matrix")
    assert matrix.tag == "table"
    cells = {(td.attrs["data-package"], td.attrs["data-engine"], td.attrs["data-mode"]): td
             for td in matrix.find_all("td") if "data-verdict" in td.attrs}
    assert len(cells) == len(PACKAGES) * len(ENGINES) * len(MODES)
    expected = {cell: "pass" for cell in cells}
    expected.update({DEFECT_CELL: "fail", BREACH_CELL: "fail", TIE_CELL: "near-tie",
                     MISSING_CELL: "missing"})
    got = {cell: td.attrs["data-verdict"] for cell, td in cells.items()}
    assert got == expected
    for cell, td in cells.items():
        assert f"verdict-{expected[cell]}" in td.classes
        shown = td.text().split()
        assert shown[0] == ("—" if expected[cell] == "missing" else expected[cell])


def _divergence_articles(dom: Node) -> dict[tuple, Node]:
    section = dom.by_id("divergences")
    out = {}
    for article in section.find_all("article"):
        heading = article.find_all("h3")[0].text()
        package, engine, mode = (part.strip() for part in heading.split("·")[:3])
        out[(package, engine, mode)] = article
    return out


def test_planted_divergence_is_highlighted_with_both_streams_and_margin(planted_dom):
    articles = _divergence_articles(planted_dom)
    assert set(articles) == {DEFECT_CELL, TIE_CELL}
    defect = articles[DEFECT_CELL]
    assert defect.attrs["data-verdict"] == "defect"
    rows = [tr for tr in defect.find_all("tr") if "data-step" in tr.attrs]
    assert [int(tr.attrs["data-step"]) for tr in rows] == list(range(len(REF)))
    highlighted = [tr for tr in rows if "diverged" in tr.classes]
    assert len(highlighted) == 1 and highlighted[0].attrs["data-step"] == "3"
    step, ref_cell, eng_cell, margin_cell = highlighted[0].find_all("td")
    assert ref_cell.text().split()[0] == "7" and "on" in ref_cell.text()
    assert eng_cell.text().split()[0] == "66" and "flew" in eng_cell.text()
    assert all("same" in tr.classes for tr in rows if tr.attrs["data-step"] != "3")
    assert defect.find_all("b", class_="margin")[0].text() == "0.8125"
    marks = {pre.attrs["class"]: [m.text() for m in pre.find_all("mark")]
             for pre in defect.find_all("pre")}
    assert marks == {"reference-text": [" on"], "engine-text": [" flew"]}
    tie = articles[TIE_CELL]
    assert tie.attrs["data-verdict"] == "near-tie"
    assert [tr.attrs["data-step"] for tr in tie.find_all("tr") if "diverged" in tr.classes] == ["5"]
    assert tie.find_all("b", class_="margin")[0].text() == "0.0025"


def test_budget_table_shows_the_planted_breach_and_only_it(planted_dom):
    table = planted_dom.by_id("budgets")
    budget_rows = [tr for tr in table.find_all("tr") if "data-verdict" in tr.attrs]
    assert len(budget_rows) == 2 * len(PACKAGES) * len(MODES)  # native-cuda cells, 2 budgets
    failing = [tr for tr in budget_rows if tr.attrs["data-verdict"] == "fail"]
    assert len(failing) == 1 and "verdict-fail" in failing[0].classes
    cells = [td.text().strip() for td in failing[0].find_all("td")]
    assert cells[:9] == ["tiny_mamba", "native-cuda", "draft/w3", "p0", "readback_budget", "32",
                         "4128", "bytes", "fail"]


def test_graph_slots_plots_and_summary_are_present(planted_dom):
    summary = {div.text().replace(div.find_all("b")[0].text(), "", 1).strip():
               div.find_all("b")[0].text() for div in planted_dom.by_id("summary").children
               if isinstance(div, Node)}
    assert summary == {"records ok": "9 / 11", "defect divergences": "1",
                       "near-ties (shown, not failing)": "1", "budget breaches": "1"}
    memory = planted_dom.by_id("plot-memory")
    assert len(memory.find_all("svg")) == 1 and memory.find_all("path")
    assert len(planted_dom.by_id("plot-acceptance").find_all("svg")) == 1
    assert len(planted_dom.by_id("plot-throughput").find_all("svg")) == 1
    ids = [n.attrs["id"] for n in planted_dom.iter() if "id" in n.attrs]
    assert len(ids) == len(set(ids)), "duplicate element ids across inline SVGs"


def test_graph_slot_counters_are_tabulated():
    record = make_record(engine="native-cuda")
    record.ledger.graph_slots["PRIMARY"] = ev.GraphSlotRecord(captures=1, replays=31)
    record.ledger.graph_slots["VERIFY"] = ev.GraphSlotRecord(captures=2, replays=9, fallbacks=1)
    table = parse(render_report([record])).by_id("graph-slots")
    rows = {tr.attrs["data-slot"]: [td.text() for td in tr.find_all("td")][4:]
            for tr in table.find_all("tr") if "data-slot" in tr.attrs}
    assert rows == {"PRIMARY": ["PRIMARY", "1", "31", "0", "0", "0"],
                    "VERIFY": ["VERIFY", "2", "9", "1", "0", "0"]}


def test_report_is_self_contained(planted_dom):
    html = render_report(planted_records())
    assert not re.search(r"(?i)\b(?:https?|ftp|wss?):|//[a-z0-9.-]+\.[a-z]{2,}/", html)
    tags = {n.tag for n in planted_dom.iter()}
    assert not tags & {"script", "link", "iframe", "img", "object", "embed", "base"}
    for node in planted_dom.iter():
        for name in ("href", "src", "xlink:href", "action", "srcset", "data"):
            value = node.attrs.get(name)
            assert value is None or value.startswith("#"), (node.tag, name, value)
        style = node.attrs.get("style") or ""
        assert "url(" not in style.replace("url(#", "")
    css = "".join(n.text() for n in planted_dom.find_all("style"))
    assert "@import" not in css and "url(" not in css


HOSTILE = '<script>alert("x")</script><img src=x onerror=alert(1)>'


def test_strings_from_evidence_are_rendered_inert():
    tie = ev.Divergence(step=1, reference_token=9, engine_token=10, margin=0.5, verdict="defect")
    record = make_record(package="pkg" + HOSTILE, engine="eng" + HOSTILE, prompt=HOSTILE,
                         tokens=[5, 10], reference=[5, 9], divergence=tie,
                         tokens_text=["$x$ " + HOSTILE, "</pre>" + HOSTILE],
                         reference_text=["a", "--><script>alert(2)</script><!--"],
                         acceptance=[1, 2], memory=[(1, 10)],
                         budgets=[ev.BudgetCheck(claim="zero_staging", budget=0, measured=1,
                                                 verdict="fail", note=HOSTILE)])
    html = render_report([record], baseline=[make_record(package="pkg" + HOSTILE,
                                                         engine="eng" + HOSTILE, prompt=HOSTILE)])
    dom = parse(html)
    assert not dom.find_all("script")
    assert not dom.find_all("img")
    handlers = [(n.tag, k) for n in dom.iter() for k in n.attrs if k.startswith("on")]
    assert handlers == []
    # The strings are still there, as text the reader can see.
    text = dom.text()
    assert "eng" + HOSTILE in text and "</pre>" + HOSTILE in text
    assert "--><script>alert(2)</script><!--" in text


def test_regressions_against_a_baseline_are_listed_first():
    band = NOISE_BAND
    baseline = [
        make_record(engine="e-div"), make_record(engine="e-budget"),
        make_record(engine="e-slow", tokens_per_s=100.0),
        make_record(engine="e-noisy", tokens_per_s=100.0),
        make_record(engine="e-accept", mode=("draft", 3), acceptance=[3, 3, 3, 3]),
        make_record(engine="e-gone"),
    ]
    div = ev.Divergence(step=2, reference_token=12, engine_token=13, margin=0.9, verdict="defect")
    breach = ev.BudgetCheck(claim="zero_staging", budget=0, measured=3, unit="events",
                            verdict="fail")
    current = [
        make_record(engine="e-div", tokens=[5, 9, 13, 7, 30, 2], reference=[5, 9, 12, 7, 30, 2],
                    divergence=div),
        make_record(engine="e-budget", budgets=[breach]),
        make_record(engine="e-slow", tokens_per_s=100.0 * (1 - band) - 5),
        make_record(engine="e-noisy", tokens_per_s=100.0 * (1 - band) + 1),
        make_record(engine="e-accept", mode=("draft", 3), acceptance=[2, 2, 3, 2]),
        make_record(engine="e-new"),
    ]
    found = {(r.kind, r.cell[1]) for r in find_regressions(current, baseline)}
    assert found == {("new-divergence", "e-div"), ("budget-breach", "e-budget"),
                     ("throughput", "e-slow"), ("acceptance", "e-accept"),
                     ("missing-cell", "e-gone")}
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

def test_cli_writes_the_report(tmp_path, capsys):
    current, base = tmp_path / "now", tmp_path / "base"
    for record in planted_records():
        ev.write_evidence(record, current)
    ev.write_evidence(make_record(package="tiny_llama", engine="native-host",
                                  reference=REF, tokens=REF), base)
    out = tmp_path / "out" / "report.html"
    status = cli_main(["report", str(current), "--baseline", str(base), "-o", str(out)])
    assert status == 0
    assert str(out) in capsys.readouterr().out
    dom = parse(out.read_text(encoding="utf-8"))
    rows = [tr.attrs["data-kind"] for tr in dom.by_id("regressions").find_all("tr")
            if "data-kind" in tr.attrs]
    assert rows == ["new-divergence", "claim-failing"]  # token_identity fails too
    assert dom.by_id("matrix").find_all("td", data_verdict="fail")


def test_cli_names_a_bad_evidence_file_and_exits_2(tmp_path, capsys):
    ev.write_evidence(make_record(), tmp_path)
    bad = tmp_path / "broken.json"
    bad.write_text('{"schema_version": 1, "run_id": "r", "tok')
    assert cli_main(["report", str(tmp_path), "-o", str(tmp_path / "r.html")]) == 2
    err = capsys.readouterr().err
    assert str(bad) in err and "Traceback" not in err
    assert not (tmp_path / "r.html").exists()
    assert cli_main(["report", str(tmp_path / "absent"), "-o", str(tmp_path / "r.html")]) == 2
