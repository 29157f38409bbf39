"""No user file overwritten, and an output path checked before the work it would receive
(issue 33): every command that writes an output folder or file follows one rule
(``engines.output_paths``): a folder that holds anything, or a file lockstep did not write,
is refused without ``--force``, naming the option, the path and the remedy; a file lockstep
wrote (its report, bench JSON, explanation) is replaced; ``lockstep run --evidence-dir``
adds records beside whatever the folder holds and touches none of it."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

import pytest

from harness.cli import build_parser, main
from suites.support import one_line_error

USER_TEXT = "my notes, not lockstep's\n"


def _user_file(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(USER_TEXT)
    return path


def _untouched(*paths: Path) -> bool:
    return all(p.read_text() == USER_TEXT for p in paths)


def _never(*args, **kwargs):
    raise AssertionError("the work started although its output path is refused")


@pytest.fixture(scope="module")
def failing_record(tmp_path_factory) -> Path:
    """A defect record of a planted engine (position ids one too high from step 3)."""
    from harness.runner import run_matrix
    from suites.planted.engines import PositionOffByOne

    folder = tmp_path_factory.mktemp("evidence")
    summary = run_matrix([PositionOffByOne], ["tiny_llama"], None, 8, folder, max_prompts=1)
    [cell] = summary.cells
    assert cell.failed
    return cell.record_path


ENGINE = ["--engine", "suites.planted.engines:PositionOffByOne"]


# -- repro -o: the case ------------------------------------------------------------

def test_repro_refuses_a_folder_holding_a_user_file_before_any_work(
        failing_record, tmp_path, capsys, monkeypatch):
    import harness.forensics as forensics

    monkeypatch.setattr(forensics, "write_repro", _never)
    readme = _user_file(tmp_path / "pack" / "README.md")
    line = one_line_error(capsys, ["repro", str(failing_record), *ENGINE, "-o",
                                   str(tmp_path / "pack")])
    assert f"[field -o = '{tmp_path / 'pack'}']" in line and "README.md" in line
    assert "--force" in line and "remedy:" in line
    assert _untouched(readme) and sorted(os.listdir(tmp_path / "pack")) == ["README.md"]


def test_repro_with_force_writes_into_the_folder_and_keeps_other_files(
        failing_record, tmp_path, capsys):
    notes = _user_file(tmp_path / "pack" / "notes.txt")
    status = main(["repro", str(failing_record), *ENGINE, "-o", str(tmp_path / "pack"),
                   "--force", "--no-shrink"])
    assert status == 0, capsys.readouterr().err
    assert (tmp_path / "pack" / "repro.json").is_file() and _untouched(notes)


def test_repro_into_a_new_or_empty_folder_needs_no_force(failing_record, tmp_path, capsys,
                                                         monkeypatch):
    import harness.forensics as forensics
    from engines.errors import InputError

    def reached(evidence, out, **kwargs):
        raise InputError(f"reached with {out}")

    monkeypatch.setattr(forensics, "write_repro", reached)
    (tmp_path / "empty").mkdir()
    for folder in (tmp_path / "empty", tmp_path / "new" / "pack"):
        line = one_line_error(capsys, ["repro", str(failing_record), *ENGINE, "-o",
                                       str(folder)])
        assert line == f"lockstep: error: reached with {folder}"


# -- files: replaced only when lockstep wrote them -------------------------------------------

def test_report_replaces_its_own_report_and_refuses_any_other_file(failing_record, tmp_path,
                                                                   capsys):
    evidence = str(failing_record.parent)
    out = tmp_path / "report.html"
    assert main(["report", evidence, "-o", str(out)]) == 0
    first = out.read_text()
    assert main(["report", evidence, "-o", str(out), "--title", "again"]) == 0
    assert out.read_text() != first and "again" in out.read_text()

    mine = _user_file(tmp_path / "mine.html")
    line = one_line_error(capsys, ["report", evidence, "-o", str(mine)])
    assert f"[field -o = '{mine}']" in line and "lockstep did not write" in line
    assert "add --force" in line and _untouched(mine)
    assert main(["report", evidence, "-o", str(mine), "--force"]) == 0
    assert "lockstep parity report" in mine.read_text()


def test_a_file_that_only_mentions_the_marker_late_is_not_lockstep_s(tmp_path, capsys,
                                                                      failing_record):
    """The marker must sit in a file's first bytes, where lockstep's writers put it."""
    from engines.output_paths import HEAD_BYTES
    from reports.render import MARKER

    late = tmp_path / "late.html"
    late.write_text("x" * HEAD_BYTES + MARKER)
    line = one_line_error(capsys, ["report", str(failing_record.parent), "-o", str(late)])
    assert "lockstep did not write" in line


def test_bench_json_is_checked_before_the_bench_runs(tmp_path, capsys, monkeypatch):
    import harness.bench as hb

    monkeypatch.setattr(hb, "run_bench", _never)
    small = ["bench", "--engines", "native-host", "--packages", "lookup_chained",
             "--repeats", "1", "--max-new-tokens", "2"]
    mine = _user_file(tmp_path / "results.json")
    line = one_line_error(capsys, [*small, "--json", str(mine)])
    assert f"[field --json = '{mine}']" in line and "--force" in line and _untouched(mine)
    line = one_line_error(capsys, [*small, "--json", str(tmp_path)])
    assert "[field --json" in line and "names a folder" in line
    assert f"--json {tmp_path / 'bench.json'}" in line
    _user_file(tmp_path / "plain")
    line = one_line_error(capsys, [*small, "--json", str(tmp_path / "plain" / "b.json")])
    assert "[field --json" in line and f"{tmp_path / 'plain'} is a file, not a folder" in line


def test_bench_json_replaces_a_bench_json(tmp_path, capsys):
    import json

    import harness.bench as hb

    out = hb.write_json([], tmp_path / "bench.json")  # an earlier bench's file
    status = main(["bench", "--engines", "native-host", "--packages", "lookup_chained",
                   "--repeats", "1", "--warmup", "0", "--max-new-tokens", "2",
                   "--json", str(out)])
    assert status == 0, capsys.readouterr().err
    assert {r["engine"] for r in json.loads(out.read_text())["rows"]} == {"native-host",
                                                                         "ort-cpu"}


def test_bench_forward_json_is_checked_before_anything_is_timed(tmp_path, capsys,
                                                                 monkeypatch):
    import harness.forward_bench as fb

    monkeypatch.setattr(fb, "bench_forwards", _never)
    mine = _user_file(tmp_path / "forwards.json")
    line = one_line_error(capsys, ["bench-forward", "--engines", "native-host", "--packages",
                                   "tiny_llama", "--json", str(mine)])
    assert f"[field --json = '{mine}']" in line and _untouched(mine)


def test_calibrate_json_is_checked_before_anything_is_scored(tmp_path, capsys, monkeypatch):
    import harness.calibrate as cal

    monkeypatch.setattr(cal, "calibrate", _never)
    mine = _user_file(tmp_path / "calibration.json")
    line = one_line_error(capsys, ["calibrate", "--engine", "native-host", "--package",
                                   "tiny_llama", "--json", str(mine)])
    assert f"[field --json = '{mine}']" in line and "--force" in line and _untouched(mine)


def test_explain_outputs_are_checked_before_explaining_and_its_own_are_replaced(
        failing_record, tmp_path, capsys, monkeypatch):
    import harness.forensics as forensics

    mine = _user_file(tmp_path / "mine.json")
    plot = _user_file(tmp_path / "mine.svg")
    with monkeypatch.context() as m:
        m.setattr(forensics, "explain_record", _never)
        line = one_line_error(capsys, ["explain", str(failing_record), *ENGINE, "--json",
                                       str(mine)])
        assert f"[field --json = '{mine}']" in line
        line = one_line_error(capsys, ["explain", str(failing_record), *ENGINE, "--plot",
                                       str(plot)])
        assert f"[field --plot = '{plot}']" in line
    assert _untouched(mine, plot)
    out, svg = tmp_path / "e.json", tmp_path / "e.svg"
    for _ in range(2):  # the second run replaces the files the first wrote
        assert main(["explain", str(failing_record), *ENGINE, "--json", str(out),
                     "--plot", str(svg)]) == 0
    assert '"kind": "lockstep-explanation"' in out.read_text()
    assert "lockstep explain" in svg.read_text()[:4096]


def test_convert_refuses_a_folder_of_the_user_s_before_hashing(tmp_path, capsys, monkeypatch):
    pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
    import harness.convert.conversion as convert
    from suites.convert_support import write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setattr(convert, "checkpoint_hash", _never)
    notes = _user_file(tmp_path / "out" / "notes.txt")
    line = one_line_error(capsys, ["convert", str(gguf), "-o", str(tmp_path / "out")])
    assert "[field -o" in line and "notes.txt" in line and "--force" in line
    assert _untouched(notes)


def test_an_unwritable_folder_is_refused_before_the_work(failing_record, tmp_path, capsys,
                                                         monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: False if Path(p) == locked
                        else real(p, mode, **kw))
    line = one_line_error(capsys, ["report", str(failing_record.parent), "-o",
                                   str(locked / "sub" / "report.html")])
    assert f"the folder {locked} is not writable" in line and "[field -o" in line
    line = one_line_error(capsys, ["repro", str(failing_record), *ENGINE, "-o", str(locked)])
    assert "not writable" in line


# -- the evidence folder accumulates runs and touches nothing else ---------------------------

def test_runs_into_one_evidence_folder_never_touch_a_user_file(tmp_path, capsys):
    from harness.evidence.store import SUFFIX

    folder = tmp_path / "evidence"
    mine = [_user_file(folder / "README.md"), _user_file(folder / "notes.json"),
            _user_file(folder / "runs" / "mine.json"),
            _user_file(folder / "forensics" / "mine.explain.json")]
    before = {p: p.stat().st_mtime_ns for p in mine}
    argv = ["run", "--packages", "tiny_llama", "--max-prompts", "1", "--max-new-tokens", "6",
            "--evidence-dir", str(folder)]
    assert main([*argv, "--engines", "native-host"]) == 0
    assert main([*argv, "--engines", "suites.planted.engines:PositionOffByOne",
                 "--explain"]) == 1
    capsys.readouterr()
    assert _untouched(*mine) and all(p.stat().st_mtime_ns == t for p, t in before.items())
    records = [p for p in folder.iterdir() if p.suffix == SUFFIX and p.name != "notes.json"]
    assert len(records) == 2 and len(list((folder / "runs").iterdir())) == 3
    assert len(list((folder / "forensics").glob("*.explain.json"))) == 2


# -- every output option follows the rule ----------------------------------------------------

def _subparsers(parser, path=()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _subparsers(sub, (*path, name))


def test_every_command_with_an_output_option_takes_force():
    outputs = {"output", "json", "plot"}
    missing = []
    for path, parser in _subparsers(build_parser()):
        dests = {a.dest for a in parser._actions if a.option_strings}
        writes = {d for d in dests & outputs
                  if not any(a.dest == d and a.const is not None for a in parser._actions)}
        if writes and "force" not in dests:
            missing.append(" ".join(path))
    assert not missing


# -- written files follow the umask ----------------------------------------------------------

@pytest.mark.parametrize("umask, mode", [(0o022, 0o644), (0o027, 0o640)])
def test_records_and_manifests_follow_the_umask(tmp_path, capsys, umask, mode):
    """``mkstemp`` makes 0600 files; records renamed from them stayed unreadable to others."""
    folder = tmp_path / "evidence"
    old = os.umask(umask)
    try:
        assert main(["run", "--packages", "tiny_llama", "--engines", "native-host",
                     "--max-prompts", "1", "--max-new-tokens", "2",
                     "--evidence-dir", str(folder)]) == 0
    finally:
        os.umask(old)
    written = [*folder.glob("*.json"), *(folder / "runs").glob("*.json")]
    assert len(written) == 2
    assert {p.stat().st_mode & 0o777 for p in written} == {mode}
