"""Bad command lines and bad output paths: one line on stderr, exit 2, no traceback; and
option values argparse would accept that mean something the user did not ask for."""
from __future__ import annotations

import errno
import os

import pytest

from harness.cli import main
from suites.support import one_line_error

SMALL = ["--packages", "lookup_chained", "--engines", "native-host", "--max-new-tokens", "2",
         "--max-prompts", "1"]


# -- option values that today mean something else ---------------------------------------------

@pytest.mark.parametrize("argv, field, value", [
    (["run", "--engines", "", "--packages", "lookup_chained"], "--engines", "''"),
    (["run", "--engines", " , ", "--packages", "lookup_chained"], "--engines", "' , '"),
    (["run", "--packages", "", "--engines", "native-host"], "--packages", "''"),
    (["run", "--packages", "", "--engines", "native-host", "--mode", "speculative"],
     "--packages", "''"),
    (["run", "--max-prompts", "0", "--packages", "lookup_chained", "--engines", "native-host"],
     "--max-prompts", "'0'"),
    (["run", "--max-prompts", "-1", "--packages", "lookup_chained", "--engines", "native-host"],
     "--max-prompts", "'-1'"),
    (["run", "--max-new-tokens", "0", "--packages", "lookup_chained", "--engines",
      "native-host"], "--max-new-tokens", "'0'"),
    (["run", "--packages", "lookup_chained,lookup_chained", "--engines", "native-host"],
     "--packages", "'lookup_chained,lookup_chained'"),
    (["run", "--engines", "native-host,ort-cpu,native-host", "--packages", "lookup_chained"],
     "--engines", "'native-host,ort-cpu,native-host'"),
    (["bench", "--engines", "", "--packages", "lookup_chained"], "--engines", "''"),
    (["bench", "--packages", "lookup_chained,lookup_chained"], "--packages",
     "'lookup_chained,lookup_chained'"),
    (["run", *SMALL, "--mode", "speculative", "--width", "2,"], "--width", "'2,'"),
    (["run", *SMALL, "--prompt", ","], "--prompt", "','"),
    (["run", *SMALL, "--evidence-dir", " "], "--evidence-dir", "' '"),
    (["convert", "nowhere.gguf", "--name", "."], "--name", "'.'"),
    (["convert", "nowhere.gguf", "--name", "a/b"], "--name", "'a/b'"),
    (["import-genai", "nowhere", "--name", ".."], "--name", "'..'"),
])
def test_empty_repeated_or_nonpositive_options_are_refused(capsys, argv, field, value):
    line = one_line_error(capsys, argv + ["--no-evidence"] if argv[0] == "run" else argv)
    assert f"[field {field} = {value}]" in line
    assert "remedy:" in line


@pytest.mark.parametrize("command", ["run", "bench"])
@pytest.mark.parametrize("engines, first, second", [
    ("native-host,engines.backends.native_host:NativeHostEngine", "native-host",
     "engines.backends.native_host:NativeHostEngine"),
    ("engines.backends.ort_cpu:OrtCpuEngine,native-host,ort-cpu",
     "engines.backends.ort_cpu:OrtCpuEngine", "ort-cpu"),
])
def test_one_engine_in_two_spellings_is_refused(capsys, tmp_path, command, engines, first,
                                                second):
    """A registered name and a ``module:Class`` reference to the same class: keyed by the
    class's name, ``run`` would run it once (dropping one), ``bench`` would time it twice.
    Refused as the same spelling twice is, naming both spellings and the class."""
    argv = [command, "--engines", engines, "--packages", "lookup_chained"]
    argv += ["--evidence-dir", str(tmp_path / "evidence")] if command == "run" else \
        ["--repeats", "1", "--json", str(tmp_path / "bench.json")]
    line = one_line_error(capsys, argv)
    assert f"[field --engines = {engines!r}]" in line
    assert f"twice: as {first!r} and as {second!r}" in line
    cls = second if ":" in second else first
    assert cls.replace(":", ".") in line
    assert "remedy:" in line
    assert not (tmp_path / "evidence").exists() and not (tmp_path / "bench.json").exists()


# -- the evidence folder ----------------------------------------------------------------------

def _run(evidence_dir) -> list[str]:
    return ["run", *SMALL, "--evidence-dir", str(evidence_dir)]


def test_evidence_folder_that_is_a_file(capsys, tmp_path):
    target = tmp_path / "evidence"
    target.write_text("not a folder")
    line = one_line_error(capsys, _run(target))
    assert "[field --evidence-dir" in line and str(target) in line
    assert "--no-evidence" in line


def test_evidence_folder_whose_parent_is_a_file(capsys, tmp_path):
    (tmp_path / "parent").write_text("a file")
    line = one_line_error(capsys, _run(tmp_path / "parent" / "evidence"))
    assert "[field --evidence-dir" in line and "not a folder" in line


def test_evidence_folder_whose_missing_parent_cannot_be_created(capsys, tmp_path, monkeypatch):
    from pathlib import Path

    real_mkdir = Path.mkdir

    def refuse(self, *args, **kwargs):  # the parent's parent is not ours to write
        if self == tmp_path / "gone":
            raise FileNotFoundError(errno.ENOENT, "No such file or directory", str(self))
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", refuse)
    line = one_line_error(capsys, _run(tmp_path / "gone" / "evidence"))
    assert "parent folder is missing" in line and "[field --evidence-dir" in line


def test_unwritable_evidence_folder(capsys, tmp_path, monkeypatch):
    folder = tmp_path / "locked"
    folder.mkdir()
    if os.geteuid() != 0:
        folder.chmod(0o500)
    else:  # root writes anywhere: refuse the file creation the way a read-only folder does
        import harness.evidence.store as store

        def denied(*args, **kwargs):
            raise PermissionError(errno.EACCES, "Permission denied", str(folder))

        monkeypatch.setattr(store.tempfile, "mkstemp", denied)
    try:
        line = one_line_error(capsys, _run(folder))
    finally:
        folder.chmod(0o700)
    assert "not writable" in line and str(folder) in line


def test_full_disk_while_writing_a_record(capsys, tmp_path, monkeypatch):
    import harness.evidence.store as store

    def full(fd, payload):
        os.close(fd)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(store, "_write_all", full)
    line = one_line_error(capsys, _run(tmp_path / "evidence"))
    assert "disk is full" in line and "[field --evidence-dir" in line
    assert not [p for p in (tmp_path / "evidence").iterdir() if p.name.endswith(".tmp")]


def test_any_os_error_at_the_top_is_one_line(capsys, tmp_path, monkeypatch):
    """The manifest, a cache, a forensics file: whatever the machine refuses, no traceback."""
    import harness.manifest as manifest

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "evidence"))

    monkeypatch.setattr(manifest, "write_manifest", full)
    status = main(_run(tmp_path / "evidence"))
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert "No space left on device" in err and str(tmp_path / "evidence") in err


# -- report -o --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def evidence(tmp_path_factory):
    folder = tmp_path_factory.mktemp("evidence")
    assert main(_run(folder)) == 0
    return folder


def test_report_output_that_is_a_folder(capsys, evidence, tmp_path):
    line = one_line_error(capsys, ["report", str(evidence), "-o", str(tmp_path)])
    assert "[field -o" in line and "names a folder" in line


def test_report_output_under_a_file(capsys, evidence, tmp_path):
    (tmp_path / "plain").write_text("x")
    line = one_line_error(capsys, ["report", str(evidence), "-o",
                                   str(tmp_path / "plain" / "report.html")])
    assert "[field -o" in line and f"{tmp_path / 'plain'} is a file, not a folder" in line


def test_report_output_on_a_full_disk(capsys, evidence, tmp_path, monkeypatch):
    from pathlib import Path

    def full(self, *args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full)
    line = one_line_error(capsys, ["report", str(evidence), "-o", str(tmp_path / "r.html")])
    assert "No space left" in line and "[field -o" in line
    assert not list(tmp_path.iterdir())


# -- argparse's own errors: one line, the argument named, the help to read --------------------

@pytest.mark.parametrize("argv, needles", [
    (["reprot", "evidence"], ("[field COMMAND = 'reprot']", "did you mean repro or report?",
                              "see lockstep --help")),
    (["engines", "--jsno"], ("unrecognized arguments: --jsno", "see lockstep engines --help")),
    (["cache", "prune", "--bogus"], ("[field --bogus]", "see lockstep cache prune --help")),
    (["cache", "prnue"], ("[field ACTION = 'prnue']", "did you mean prune?")),
    (["run", "--mode", "greedyy"], ("[field --mode = 'greedyy']", "did you mean greedy?",
                                    "see lockstep run --help")),
    (["run", "--max-new-tokens"], ("[field --max-new-tokens]", "expected one argument")),
    (["bench-forward"], ("required: --engines, --packages", "see lockstep bench-forward")),
    ([], ("required: COMMAND", "see lockstep --help")),
])
def test_an_argparse_error_is_one_line_without_the_usage_block(capsys, argv, needles):
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2 and len(err.strip().splitlines()) == 1, err
    assert err.startswith("lockstep: error: ") and "usage:" not in err
    assert all(needle in err for needle in needles), err


# -- help -------------------------------------------------------------------------------------

def _parsers(parser, path=()):
    import argparse

    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*path, name))


def test_every_option_of_every_subcommand_has_help():
    import argparse

    from harness.cli import build_parser

    missing = [(" ".join(path) or "lockstep", action.option_strings or action.dest)
               for path, parser in _parsers(build_parser()) for action in parser._actions
               if not isinstance(action, argparse._SubParsersAction)
               and (not action.help or action.help == argparse.SUPPRESS)]
    assert not missing


def test_every_listed_subcommand_exists_and_the_description_says_what_lockstep_is():
    import argparse

    from harness.cli import SUBCOMMANDS, build_parser

    parser = build_parser()
    registered = {name for action in parser._actions
                  if isinstance(action, argparse._SubParsersAction) for name in action.choices}
    assert {name.replace("_", "-") for name in SUBCOMMANDS} <= registered
    assert "inference engines" in parser.description
    assert "subcommand" not in parser.description


def test_fixtures_list_names_smollm2_and_whether_it_is_converted(tmp_path, monkeypatch, capsys):
    pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
    pytest.importorskip("tokenizers", reason="the converter needs the 'real' extra (make real)")
    import harness.cli.fixtures as real
    from harness.cli.fixtures import real_checkpoint_rows
    from harness.convert.conversion import convert
    from suites.convert_support import write_tiny_gguf

    monkeypatch.setenv("LOCKSTEP_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(real, "smollm2_path", lambda: None)
    assert [(n, b) for n, b, _ in real_checkpoint_rows()] == \
        [("smollm2", "not installed"), ("smollm2-selfspec", "not installed")]
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")  # stands in for the shipped GGUF
    monkeypatch.setattr(real, "smollm2_path", lambda: gguf)
    rows = {n: (b, what) for n, b, what in real_checkpoint_rows()}
    assert rows["smollm2"][0] == "no" and "lockstep convert smollm2" in rows["smollm2"][1]
    convert(gguf)
    rows = {n: b for n, b, _ in real_checkpoint_rows()}
    assert rows == {"smollm2": "converted", "smollm2-selfspec": "no"}
    capsys.readouterr()
    assert main(["fixtures", "list"]) == 0
    listed = {line.split("│")[1].strip(): line.split("│")[3].strip()
              for line in capsys.readouterr().out.splitlines() if line.count("│") > 3}
    assert listed["smollm2"] == "converted" and listed["smollm2-selfspec"] == "no"


@pytest.mark.parametrize("widths, field, value", [
    ([0], "--width", 0), ([5], "--width", 5), ([2, 9], "--width", 9), ([True], "--width", True),
])
def test_one_width_rule_for_the_runner_and_the_interpreter(packages, widths, field, value):
    """``widths_for`` (the runner) and ``check_width`` (the interpreter) refuse the same
    widths with the same error, because the runner asks the interpreter's rule."""
    from engines.errors import InputError
    from engines.workflow.speculative import check_width
    from harness.runner import widths_for

    spec = packages["lookup_chained"].spec
    assert widths_for(packages["lookup_chained"], "speculative", "all") == \
        list(range(1, spec.decoding.speculative.max_width + 1))
    with pytest.raises(InputError) as runner:
        widths_for(packages["lookup_chained"], "speculative", widths)
    with pytest.raises(InputError) as interpreter:
        check_width(spec, value, field="--width")
    assert (runner.value.field, runner.value.value) == (field, value)
    assert str(runner.value) == str(interpreter.value)
    with pytest.raises(InputError) as greedy_only:
        widths_for(packages["tiny_llama"], "speculative", None)
    assert greedy_only.value.field == "decoding.speculative"
