"""The report says exactly what it counts, and its budgets table stays one screen long
however many checks a nightly run makes."""
from __future__ import annotations

from harness import evidence as ev
from reports import render_report
from suites.test_report import make_record, parse


def test_the_headline_counts_judged_cells_not_unavailable_ones():
    records = [make_record(prompt="p0"), make_record(prompt="p1", status="unavailable",
                                                     reason="no GPU", timings=False)]
    headline = parse(render_report(records)).by_id("headline")
    assert (headline.attrs["data-judged"], headline.attrs["data-failed"]) == ("1", "0")
    text = " ".join(headline.text().split())
    assert text.startswith("1 cell(s) judged: 0 failed") and "1 / 2" not in text


def test_budgets_table_rows_are_bounded_by_engines_times_claims_not_by_checks():
    engines = ("native-cuda", "ort-cuda")
    claims = ("zero_staging", "readback_budget", "flat_memory")
    records = []
    for engine in engines:
        for i in range(25):  # a nightly run: many prompts and widths per engine
            checks = [ev.BudgetCheck(claim=c, budget=0, measured=int(i == 7 and c == "flat_memory"),
                                     unit="bytes", verdict="fail" if i == 7 and c == "flat_memory"
                                     else "pass") for c in claims]
            records.append(make_record(engine=engine, prompt=f"p{i}", budgets=checks,
                                       status="budget" if i == 7 else "identical"))
    dom = parse(render_report(records))
    rows = [tr for tr in dom.by_id("budgets").find_all("tr") if "data-claim" in tr.attrs]
    assert len(rows) == len(engines) * len(claims)  # not 150 checks
    assert {(r.attrs["data-engine"], r.attrs["data-claim"]) for r in rows} == \
        {(e, c) for e in engines for c in claims}
    assert sum(int(r.attrs["data-checks"]) for r in rows) == 150
    failing = [r for r in rows if r.attrs["data-verdict"] == "fail"]
    assert [(r.attrs["data-engine"], r.attrs["data-claim"]) for r in failing] == \
        [(e, "flat_memory") for e in engines]
    assert rows[:2] == failing  # failures first
