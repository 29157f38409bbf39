"""Numeric options checked before any work starts, and errors that name the option or the
variable the user gave (issue 33). ``explain --factor nan`` once concluded "every node within
its noise floor" with exit 0, ``--factor 0`` silently meant 8, ``--top -1`` dropped the
list, ``--step 9999`` explained an engine error as the finding and ``--step -1`` was a
traceback; every numeric option of every subcommand now goes through one argparse type
(``harness.cli.arguments.integer`` / ``number``): finite, in range, an integer where it must
be, refused in one line naming the option before anything runs."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from harness.cli import build_parser, main
from suites.support import one_line_error


def _never(*args, **kwargs):
    raise AssertionError("the work started although an option was refused")


@pytest.fixture(scope="module")
def failing_record(tmp_path_factory) -> Path:
    from harness.runner import run_matrix
    from suites.planted.engines import PositionOffByOne

    folder = tmp_path_factory.mktemp("evidence")
    summary = run_matrix([PositionOffByOne], ["tiny_llama"], None, 8, folder, max_prompts=1)
    [cell] = summary.cells
    return cell.record_path


ENGINE = ["--engine", "suites.planted.engines:PositionOffByOne"]


@pytest.mark.parametrize("option, value", [
    ("--factor", "nan"), ("--factor", "-1"), ("--factor", "0"), ("--factor", "inf"),
    ("--factor", "eight"), ("--top", "-1"), ("--top", "0"), ("--top", "1.5"),
    ("--step", "-1"), ("--step", "x"),
])
def test_explain_refuses_a_bad_number_before_explaining(failing_record, capsys, monkeypatch,
                                                         option, value):
    import harness.forensics as forensics

    monkeypatch.setattr(forensics, "explain_record", _never)
    line = one_line_error(capsys, ["explain", str(failing_record), *ENGINE, option, value])
    assert f"[field {option} = " in line and value in line and "remedy:" in line


def test_explain_step_beyond_the_record_names_its_range(failing_record, capsys):
    line = one_line_error(capsys, ["explain", str(failing_record), *ENGINE, "--step", "9999"])
    assert "[field --step = 9999]" in line and "steps 0 to 7" in line
    assert "--step from 0 to 7" in line
    assert main(["explain", str(failing_record), *ENGINE, "--step", "7"]) == 0
    assert "step 7 (requested)" in capsys.readouterr().out


def test_explain_factor_is_used_as_given(failing_record, capsys):
    """``--factor 2`` is a floor of twice the spread (not the default 8, which ``0`` and any
    falsy value used to become)."""
    assert main(["explain", str(failing_record), *ENGINE, "--factor", "2"]) == 0
    assert "floor      2 x max(" in capsys.readouterr().out


@pytest.mark.parametrize("argv, option", [
    (["run", "--max-new-tokens", "1e3"], "--max-new-tokens"),
    (["run", "--max-new-tokens", "-4"], "--max-new-tokens"),
    (["run", "--max-prompts", "two"], "--max-prompts"),
    (["bench", "--repeats", "0"], "--repeats"),
    (["bench", "--warmup", "-1"], "--warmup"),
    (["bench", "--warmup-steps", "nan"], "--warmup-steps"),
    (["bench", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["bench", "--mode", "speculative", "--width", "0"], "--width"),
    (["bench-forward", "--engines", "native-host", "--packages", "tiny_llama", "--prefix",
      "-1"], "--prefix"),
    (["bench-forward", "--engines", "native-host", "--packages", "tiny_llama", "--repeats",
      "0"], "--repeats"),
    (["bench-forward", "--engines", "native-host", "--packages", "tiny_llama", "--warmup",
      "-2"], "--warmup"),
    (["cache", "prune", "--older-than", "nan", "--dry-run"], "--older-than"),
    (["cache", "prune", "--older-than", "-1", "--dry-run"], "--older-than"),
    (["cache", "prune", "--keep", "-1", "--dry-run"], "--keep"),
    (["convert", "smollm2", "--max-context", "100000000"], "--max-context"),
    (["convert", "smollm2", "--max-context", "1"], "--max-context"),
    (["convert", "smollm2", "--draft-layers", "0"], "--draft-layers"),
])
def test_every_numeric_option_is_refused_out_of_range(capsys, monkeypatch, argv, option):
    import harness.bench as hb
    import harness.cache_admin as admin
    import harness.convert as convert
    import harness.forward_bench as fb
    import harness.runner as runner

    for module, name in ((runner, "run_matrix"), (hb, "plan_bench"), (fb, "bench_forwards"),
                         (admin, "cache_entries"), (convert, "convert")):
        monkeypatch.setattr(module, name, _never)
    line = one_line_error(capsys, argv)
    assert f"[field {option} = " in line and "remedy:" in line


@pytest.mark.parametrize("argv, option", [
    (["repro", "--factor", "nan"], "--factor"), (["repro", "--max-runs", "0"], "--max-runs"),
])
def test_repro_refuses_a_bad_number(failing_record, tmp_path, capsys, argv, option):
    line = one_line_error(capsys, [argv[0], str(failing_record), *ENGINE, "-o",
                                   str(tmp_path / "pack"), *argv[1:]])
    assert f"[field {option} = " in line and not (tmp_path / "pack").exists()


def _parsers(parser, path=()):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_no_numeric_option_is_a_bare_int_or_float():
    """argparse's own ``int``/``float`` accept 0, negatives, nan and inf: every numeric
    option goes through ``integer`` or ``number``, which state a range."""
    bare = [(" ".join(path), a.option_strings) for path, parser in _parsers(build_parser())
            for a in parser._actions if a.type in (int, float)]
    assert not bare


# -- messages name the option or the variable ------------------------------------------------

@pytest.mark.parametrize("argv, field", [
    (["run", "--packages", "no_such", "--engines", "native-host", "--no-evidence"],
     "--packages"),
    (["run", "--packages", "tiny_llama", "--engines", "no_such", "--no-evidence"], "--engines"),
    (["run", "--packages", "tiny_llama", "--engines", "native-host", "--oracle-engine",
      "no_such", "--no-evidence"], "--oracle-engine"),
    (["run", "--packages", "tiny_llama", "--engines", "native-host", "--max-new-tokens",
      "100000", "--no-evidence"], "--max-new-tokens"),
    (["bench", "--packages", "tiny_llama", "--engines", "native-host", "--baseline",
      "no_such"], "--baseline"),
    (["bench", "--packages", "no_such", "--engines", "native-host"], "--packages"),
    (["report", "no_such_folder"], "EVIDENCE_DIR"),
    (["explain", "no_such.json"], "EVIDENCE_FILE"),
    (["fixtures", "build", "no_such"], "NAME"),
])
def test_errors_name_the_option_the_user_gave(capsys, argv, field):
    line = one_line_error(capsys, argv)
    assert f"[field {field} = " in line


def test_explain_engine_and_package_errors_name_their_options(failing_record, capsys):
    line = one_line_error(capsys, ["explain", str(failing_record), "--engine", "no_such"])
    assert "[field --engine = 'no_such']" in line
    line = one_line_error(capsys, ["explain", str(failing_record), *ENGINE, "--package",
                                   "no_such"])
    assert "[field --package = 'no_such']" in line


@pytest.mark.parametrize("where", ["file", "under a file"])
def test_a_cache_variable_naming_a_file_is_named(tmp_path, capsys, monkeypatch, where):
    (tmp_path / "plain").write_text("x")
    value = tmp_path / "plain" if where == "file" else tmp_path / "plain" / "cache"
    monkeypatch.setenv("LOCKSTEP_CACHE", str(value))
    for argv in (["run", "--packages", "tiny_llama", "--engines", "native-host",
                  "--no-evidence"], ["cache", "list"], ["fixtures", "build", "tiny_llama"]):
        line = one_line_error(capsys, argv)
        assert f"[field LOCKSTEP_CACHE = '{value}']" in line
        assert f"{tmp_path / 'plain'} is a file" in line and "remedy: set LOCKSTEP_CACHE" in line


def test_a_write_the_machine_refuses_in_the_cache_names_the_variable(tmp_path, capsys,
                                                                      monkeypatch):
    import errno

    import fixtures.catalog as catalog

    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path / "cache"))

    def denied(name, force=False):
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "cache" / name))

    monkeypatch.setattr(catalog, "build", denied)
    line = one_line_error(capsys, ["fixtures", "build", "tiny_llama"])
    assert "Permission denied" in line
    assert f"[field LOCKSTEP_CACHE = '{tmp_path / 'cache'}']" in line
    assert "remedy: set LOCKSTEP_CACHE to a writable folder" in line


@pytest.mark.parametrize("to", ["-o", "the cache"])
def test_no_room_for_a_conversion_names_what_chose_its_folder(tmp_path, capsys, monkeypatch,
                                                              to):
    pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
    import collections

    from harness.convert import disk_room
    from suites.convert_support import write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path / "cache"))
    usage = collections.namedtuple("usage", "total used free")
    monkeypatch.setattr(disk_room.shutil, "disk_usage", lambda path: usage(1, 0, 1))
    argv = ["convert", str(gguf)] + (["-o", str(tmp_path / "out")] if to == "-o" else [])
    line = one_line_error(capsys, argv)
    assert ("[field -o = " if to == "-o" else "[field LOCKSTEP_CACHE = ") in line
    assert "MB free" in line
