"""``lockstep report`` checks the records against the runs that planned them: a record copied
under a second name is flagged and counted once, a run whose records outnumber its plan is
named with both counts, and a run killed before its first record is INCOMPLETE, not an
empty folder."""
from __future__ import annotations

import shutil
from datetime import datetime, timezone

import pytest

from harness import evidence as ev
from harness.cli import main
from harness.manifest import PlannedCell, RunManifest, write_manifest
from harness.run_coverage import drop_duplicates
from reports import render as render_module
from suites.test_report import finding, make_record, parse

PROMPTS = [f"p{i}" for i in range(6)]


@pytest.fixture(autouse=True)
def no_catch_matrix(tmp_path, monkeypatch):
    monkeypatch.setattr(render_module, "DEFAULT_CATCH_MATRIX", tmp_path / "none.json")


def _run(folder, *, records=True, complete=True):
    """Six planned cells of run-1 (one engine, six prompts) and, with ``records``, their
    records; returns the record files by prompt."""
    write_manifest(folder, RunManifest(
        run_id="run-1", started=datetime(2026, 1, 2, tzinfo=timezone.utc), complete=complete,
        planned=[PlannedCell(package="tiny_llama", engine="native-host", mode="greedy",
                             prompt=p) for p in PROMPTS]))
    folder.mkdir(exist_ok=True)
    return {p: ev.write_evidence(make_record(prompt=p), folder) for p in PROMPTS} if records \
        else {}


def _report(folder, capsys):
    out = folder.parent / "report.html"
    status = main(["report", str(folder), "-o", str(out)])
    captured = capsys.readouterr()
    return status, captured.out + captured.err, parse(out.read_text(encoding="utf-8"))


def test_a_record_copied_under_a_second_name_is_flagged_and_counted_once(tmp_path, capsys):
    folder = tmp_path / "ev"
    files = _run(folder)
    copy = folder / "copy-of-p3.json"
    shutil.copy(files["p3"], copy)
    status, out, dom = _report(folder, capsys)
    assert status == 0
    assert "report of 6 record(s) (0 not ok)" in out
    (dup,) = [ln for ln in out.splitlines() if "DUPLICATE" in ln]
    assert "run run-1: tiny_llama · native-host · greedy · p3 recorded 2 times" in dup
    assert str(files["p3"]) in dup and str(copy) in dup and "counted once" in dup
    assert "lockstep: run run-1 has 7 record(s) for 6 planned cell(s): 1 duplicate(s)" in out
    banner = dom.by_id("duplicates")
    assert banner.attrs["data-count"] == "1" and "copy-of-p3.json" in banner.text()
    mismatch = dom.by_id("mismatch-0")
    assert (mismatch.attrs["data-planned"], mismatch.attrs["data-records"],
            mismatch.attrs["data-duplicates"]) == ("6", "7", "1")
    assert dom.by_id("headline").attrs["data-judged"] == "6"


def test_more_records_than_planned_cells_are_flagged(tmp_path, capsys):
    folder = tmp_path / "ev"
    _run(folder)
    ev.write_evidence(make_record(prompt="p9"), folder)  # a cell run-1 never planned
    status, out, dom = _report(folder, capsys)
    assert status == 0
    assert ("lockstep: run run-1 has 7 record(s) for 6 planned cell(s): 1 record(s) of cell(s) "
            "it did not plan") in out
    mismatch = dom.by_id("mismatch-0")
    assert (mismatch.attrs["data-records"], mismatch.attrs["data-unplanned"]) == ("7", "1")
    assert "RECORDS DO NOT MATCH THE PLAN" in mismatch.text()


def test_a_run_that_matches_its_plan_has_no_such_flag(tmp_path, capsys):
    folder = tmp_path / "ev"
    _run(folder)
    status, out, dom = _report(folder, capsys)
    assert status == 0 and "DUPLICATE" not in out and "planned cell(s):" not in out
    assert not dom.by_class("div", "mismatch") and not dom.by_class("div", "duplicates")


def test_copies_that_disagree_keep_the_worst_one():
    good = make_record(prompt="p0")
    bad = make_record(prompt="p0", tokens=[5, 9, 66, 7, 30, 2],
                      reference=[5, 9, 12, 7, 30, 2], findings=[finding(2, 66, 12)])
    assert bad.status == "defect"
    for order in ([good, bad], [bad, good]):
        kept, (dup,) = drop_duplicates(order, ["a.json", "b.json"])
        assert kept == [bad] and dup.files == ("a.json", "b.json")
    other_run = make_record(prompt="p0", run_id="run-2")
    assert drop_duplicates([good, other_run]) == ([good, other_run], [])


def test_a_run_killed_before_its_first_record_is_incomplete_not_an_empty_folder(
        tmp_path, capsys):
    folder = tmp_path / "ev"
    _run(folder, records=False, complete=False)
    status, out, dom = _report(folder, capsys)
    assert status == 0 and "no evidence files" not in out
    assert ("lockstep: run run-1 is INCOMPLETE: 0 of 6 planned cell(s) recorded; its manifest "
            "was never marked complete") in out
    banner = dom.by_id("incomplete-0")
    assert (banner.attrs["data-planned"], banner.attrs["data-recorded"]) == ("6", "0")
    assert dom.by_id("headline").attrs["data-judged"] == "0"
    # a folder with neither records nor a manifest is still refused, naming itself
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["report", str(empty), "-o", str(tmp_path / "x.html")]) == 2
    err = capsys.readouterr().err
    assert "no evidence files" in err and str(empty) in err


@pytest.mark.parametrize("text, said, remedy", [
    ('{"run_id": "run-1", "star', "JSONDecodeError", "interrupted while writing it"),
    ('{"run_id": "run-1", "started": "2026-01-02T00:00:00Z", "planned": "all"}',
     "[field planned = 'all']", "remedy: fix or delete the file"),
    ('{"started": "2026-01-02T00:00:00Z", "planned": []}', "[field run_id]",
     "remedy: fix or delete the file"),
])
def test_a_damaged_manifest_names_its_field_and_blames_an_interruption_only_when_cut_short(
        tmp_path, text, said, remedy):
    from engines.errors import LockstepError
    from harness.manifest import read_manifests

    (tmp_path / "runs").mkdir()
    (tmp_path / "runs" / "run-1.json").write_text(text)
    with pytest.raises(LockstepError) as caught:
        read_manifests(tmp_path)
    line = str(caught.value)
    assert said in line and remedy in line and "\n" not in line
    assert ("interrupted" in line) == (remedy == "interrupted while writing it")
