"""Every option of every subcommand, fed the bad values its kind admits (issue 33's sweep).

The options are read from the real parser (``harness.cli.build_parser``), so an option added
later is swept too: ``RULES`` must say what kind of value it takes, or
``test_every_option_has_a_rule`` fails naming it. Each kind has its bad values (``BAD``):
numbers get ``nan``, ``inf``, ``1e999``, a huge integer, a word, ``""`` and values out of
range; paths a missing file, a folder for a file and the other way round, an empty or
undecodable file, ``/proc``, the user's own file or folder as an output; lists empty items
and repeats; engine and package names unknown ones and ``module:Missing``.

Each bad value must end in one clear line (``check_case``: exit 2, no traceback, one
``lockstep: error:`` line naming the option and the value, with a remedy, the user's file
untouched, in bounded time), unless ``ALLOWED`` says why it is a valid value.

First run (main 66ee55b, before any fix): 548 cases over 86 options, 54 unclear (90.1%
clear), by category: a value starting with ``-`` and not a plain integer (``-inf``, ``-1e3``,
``-1/2``) read by argparse as an option, "expected one argument" without the value (23);
a list with a name left out (``a,,b``) taken as ``a,b``, or a repeat taken twice
(``bench-forward --engines``, ``--width 2,2``, ``--prompt 1,,2``) (13); a huge integer
(``9`` * 40) run for ever (``bench``/``bench-forward`` ``--repeats``/``--warmup``, 4) or taken
(``--max-prompts``, ``--top``, ``--max-runs``, ``--keep``, 4); ``""`` taken as the current
folder or as the option left out (report's ``EVIDENCE_DIR``, ``--package(s)``,
``--prompts-from``, ``bench --prompts``, ``bench-forward --rows``) (6); ``1e999`` quoted as
``inf``, not as typed (3); a huge ``--prompt`` id named ``prompt[0]`` (1). Beside them, the
calibrate base found a package without a tokenizer named as ``segments[0].file``.
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

import pytest

pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("tokenizers", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("safetensors", reason="the converter needs the 'real' extra (make real)")

from suites.test_bad_input_fresh import Case, check_case  # noqa: E402

HUGE = "9" * 40
PLANTED = "suites.planted.engines:PositionOffByOne"


class Sweep:
    """What the cases need: a few real inputs (made once) and the user's own files."""

    def __init__(self, root: Path):
        from fixtures.model_package import write_model_package
        from harness.cli import main
        from harness.convert.conversion import convert
        from suites.convert_support import write_tiny_gguf, write_tiny_hf
        from suites.test_import_genai import tiny_build

        self.root = root
        self.evidence = root / "evidence"
        assert main(["run", "--packages", "tiny_llama", "--engines", PLANTED,
                     "--max-new-tokens", "4", "--max-prompts", "1", "--evidence-dir",
                     str(self.evidence)]) == 1
        self.record = next(self.evidence.glob("*.json"))
        self.hf = write_tiny_hf(root / "hf")
        self.tokenized = convert(write_tiny_gguf(root / "tiny.gguf"), root / "pkg",
                                 max_context=32).folder  # a package with a tokenizer
        self.model_package = write_model_package(root / "model-package")
        self.build = tiny_build(root / "build", graph_outputs=(
            "logits", "present.0.key", "present.0.value"))
        self.tmp = root / "case"

    def fresh(self, key: str) -> Path:
        """An empty folder of this case's own, under which its user files lie."""
        import shutil

        self.tmp = self.root / "cases" / key.replace("/", "_")
        shutil.rmtree(self.tmp, ignore_errors=True)
        self.tmp.mkdir(parents=True)
        return self.tmp

    # the user's things, made on demand in the case's folder
    def user_file(self) -> str:
        path = self.tmp / "mine.txt"
        path.write_text("my own notes\n")
        return str(path)

    def user_folder(self) -> str:
        folder = self.tmp / "mine"
        folder.mkdir(exist_ok=True)
        (folder / "notes.txt").write_text("my own notes\n")
        return str(folder)

    def empty_file(self) -> str:
        path = self.tmp / "empty.json"
        path.write_bytes(b"")
        return str(path)

    def binary_file(self) -> str:
        path = self.tmp / "binary.json"
        path.write_bytes(b"\xff\xfe\x00garbage\xc3\x28")
        return str(path)

    def empty_folder(self) -> str:
        folder = self.tmp / "hollow"
        folder.mkdir(exist_ok=True)
        return str(folder)

    def missing(self) -> str:
        return str(self.tmp / "nowhere" / "missing.json")


# A bad value: the text typed (or a function of the materials giving it), and whether the line
# must quote it (a path's own name is enough where the folder differs per case).
Value = str | Callable[[Sweep], str]


def _int_values(parse) -> list[Value]:
    """An ``arguments.integer`` option's bad values, its range read from the parser."""
    cells = dict(zip(parse.__code__.co_freevars, (c.cell_contents for c in parse.__closure__)))
    low, high = cells.get("minimum"), cells.get("maximum")
    values = ["", "word", "1.5", "1e3", "nan", "inf", "-inf", HUGE, "0x10"]
    if low is not None:
        values.append(str(low - 1))
    if high is not None:
        values.append(str(high + 1))
    return values


def _number_values(parse) -> list[Value]:
    cells = dict(zip(parse.__code__.co_freevars, (c.cell_contents for c in parse.__closure__)))
    values = ["", "word", "nan", "inf", "-inf", "1e999", "1,5"]
    if cells.get("minimum") is not None:
        values.append(str(cells["minimum"] - 1))
    if cells.get("above") is not None:
        values.append(str(cells["above"]))
    return values


# What each kind of value may be given wrong.
BAD: dict[str, list[Value]] = {
    "engines": ["", ",", "native-host,native-host", "native-host,,ort-cpu", "no-such-engine",
                "no_such_module:Engine", "engines.registry:Missing", "json:dumps"],
    "engine": ["", "no-such-engine", "no_such_module:Engine", "engines.registry:Missing",
               "native-host,ort-cpu"],
    "packages": ["", ",", "tiny_llama,tiny_llama", "tiny_llama,,tied_llama", "no_such_package",
                 Sweep.missing, Sweep.user_file, Sweep.empty_folder],
    "package": ["", "no_such_package", "tiny_llama,tied_llama", Sweep.missing, Sweep.user_file,
                Sweep.empty_folder],
    "text": ["", "   "],
    "ids": ["", "a b", "-1", "1,,2", HUGE, "nan", "1.5"],
    "shard": ["", "0/0", "2/1", "1/0", "a/b", "1", "-1/2", "1.5/2", "0/2"],
    "devices": ["", "gpu0", "-1", "0,0", "0,,1", HUGE],
    "widths": ["", ",", "wide", "1,,2", "0", "-1", "nan", "2,2", HUGE],
    "lengths": ["", ",", "long", "4,,8", "0", "-1", "nan", "4,4", HUGE],
    "size": ["", "word", "-1", "nan", "inf", "1e999", "10XB", "5 G B"],
    "segments": ["", ",", "no_such_segment", "prose,,prose"],
    "prompt-sets": ["", ",", "no_such_set", "free,free", "free,,grounded"],
    "fixture-names": ["", "no_such_fixture", "tiny_llama,tiny_llama", "../up"],
    "name": ["", ".", "../up", "a/b", " "],
    "choice": ["", "no_such_choice"],
    "free-text": [],  # see ALLOWED: any title is the user's to choose
    "file-in": ["", Sweep.missing, Sweep.empty_folder, Sweep.empty_file, Sweep.binary_file],
    "folder-in": ["", Sweep.missing, Sweep.user_file, Sweep.empty_folder],
    "file-out": ["", "/proc/lockstep-sweep.json", Sweep.user_file, Sweep.user_folder,
                 lambda s: s.user_file() + "/under-a-file.json"],
    "folder-out": ["", "/proc/lockstep-sweep", Sweep.user_file, Sweep.user_folder,
                   lambda s: s.user_file() + "/under-a-file"],
    "checkpoint": ["", Sweep.missing, Sweep.empty_folder, Sweep.empty_file, Sweep.binary_file],
    "genai-build": ["", Sweep.missing, Sweep.empty_folder, Sweep.user_file],
    "evidence-file": ["", Sweep.missing, Sweep.empty_folder, Sweep.empty_file,
                      Sweep.binary_file],
    "evidence-folder": ["", Sweep.missing, Sweep.user_file, Sweep.empty_folder],
}

# The kind of value each option takes ("command option"; a positional by its metavar).
RULES: dict[str, str] = {
    "run --engines": "engines", "run --packages": "packages", "run --prompt": "ids",
    "run --text": "text", "run --chat": "text", "run --prompts": "file-in",
    "run --oracle-engine": "engine", "run --oracle-mode": "choice", "run --shard": "shard",
    "run --max-new-tokens": "int", "run --max-prompts": "int", "run --concurrency": "int",
    "run --mode": "choice", "run --width": "widths", "run --evidence-dir": "folder-out",
    "run --devices": "devices",
    "report EVIDENCE_DIR": "evidence-folder", "report --baseline": "evidence-folder",
    "report -o": "file-out", "report --title": "free-text", "report --bench": "file-in",
    "report --catch-matrix": "file-in",
    "bench --engines": "engines", "bench --packages": "packages", "bench --mode": "choice",
    "bench --prompts": "prompt-sets", "bench --width": "int", "bench --repeats": "int",
    "bench --warmup": "int", "bench --max-new-tokens": "int", "bench --warmup-steps": "int",
    "bench --baseline": "engine", "bench --compare-to": "engines", "bench --json": "file-out",
    "bench-forward --engines": "engines", "bench-forward --packages": "packages",
    "bench-forward --prefill": "lengths", "bench-forward --rows": "lengths",
    "bench-forward --prefix": "int", "bench-forward --repeats": "int",
    "bench-forward --warmup": "int", "bench-forward --json": "file-out",
    "bench-judge --engines": "engines", "bench-judge --packages": "package",
    "bench-judge --lengths": "lengths", "bench-judge --max-new-tokens": "int",
    "bench-judge --oracle-mode": "choice", "bench-judge --json": "file-out",
    "fixtures build NAME": "fixture-names",
    "convert CHECKPOINT": "checkpoint", "convert -o": "folder-out", "convert --cache": "choice",
    "convert --dtype": "choice", "convert --max-context": "int", "convert --draft-layers": "int",
    "convert --prompt-lookup": "int", "convert --name": "name", "convert --builder": "choice",
    "import-genai BUILD_FOLDER": "genai-build", "import-genai -o": "folder-out",
    "import-genai --prompts-from": "package", "import-genai --name": "name",
    "import-package DIR": "genai-build", "import-package -o": "folder-out",
    "cache prune --older-than": "number", "cache prune --max-size": "size",
    "cache prune --keep": "int",
    "explain EVIDENCE_FILE": "evidence-file", "explain --engine": "engine",
    "explain --package": "package", "explain --step": "int", "explain --factor": "number",
    "explain --json": "file-out", "explain --plot": "file-out", "explain --top": "int",
    "repro EVIDENCE_FILE": "evidence-file", "repro -o": "folder-out", "repro --engine": "engine",
    "repro --package": "package", "repro --max-runs": "int", "repro --factor": "number",
    "calibrate --engine": "engine", "calibrate --package": "package",
    "calibrate --corpus": "file-in", "calibrate --segments": "segments",
    "calibrate --bands": "file-in", "calibrate --json": "file-out",
}

# Values of a bad kind that are valid for one option, each with its reason.
ALLOWED: dict[tuple[str, str | Callable], str] = {
    # --prefill's default is "" (no prefill timed, only --rows): typing the default is no
    # mistake; "" for both --prefill and --rows is refused (nothing to time)
    ("bench-forward --prefill", ""): "the documented default: no prefill timed",
    # a bands table that does not exist yet is a scheme's first calibration (written with
    # --write); the value is still named where the table is read (test_calibrate.py)
    ("calibrate --bands", Sweep.missing): "a first calibration's table, not yet written",
}

# A valid, cheap command line for each command, without the option under test; ``{x}`` is a
# material of ``Sweep``.
BASE: dict[str, list[str]] = {
    "run": ["run", "--packages", "tiny_llama", "--engines", "native-host", "--max-new-tokens",
            "2", "--max-prompts", "1", "--no-evidence"],
    "report": ["report", "{evidence}", "-o", "{tmp}/r.html"],
    "bench": ["bench", "--engines", "native-host", "--packages", "tiny_llama", "--repeats",
              "1", "--warmup", "0", "--max-new-tokens", "2", "--baseline", "native-host"],
    "bench-forward": ["bench-forward", "--engines", "native-host", "--packages", "tiny_llama",
                      "--repeats", "1", "--warmup", "0", "--prefix", "1", "--rows", "1"],
    "bench-judge": ["bench-judge", "--engines", "native-host", "--packages", "tiny_llama",
                    "--lengths", "4", "--max-new-tokens", "2"],
    "fixtures build": ["fixtures", "build", "tiny_llama"],
    "convert": ["convert", "{hf}", "-o", "{tmp}/out"],
    "import-genai": ["import-genai", "{build}", "-o", "{tmp}/out"],
    "import-package": ["import-package", "{model_package}", "-o", "{tmp}/out"],
    "cache prune": ["cache", "prune", "--dry-run"],
    "explain": ["explain", "{record}"],
    "repro": ["repro", "{record}", "-o", "{tmp}/pack", "--max-runs", "1"],
    "calibrate": ["calibrate", "--engine", "native-host", "--package", "{tokenized}"],
}

# Options that only mean something beside others: what to add when sweeping them.
BESIDE: dict[str, list[str]] = {
    "run --width": ["--mode", "speculative", "--packages", "lookup_chained"],
    "bench --width": ["--mode", "speculative", "--packages", "lookup_chained"],
    "report --baseline": [], "explain --step": [],
}


def _options() -> dict[str, tuple[argparse.Action, str]]:
    """Every action that takes a value, as "command option" -> (action, the option's name)."""
    from harness.cli import build_parser

    found = {}

    def walk(parser, words):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*words, name])
            elif action.nargs != 0 and not isinstance(action, (argparse._HelpAction,
                                                              argparse._VersionAction)):
                name = action.option_strings[0] if action.option_strings else action.metavar
                found[" ".join([*words, name])] = (action, name)

    walk(build_parser(), [])
    return found


OPTIONS = _options()


def _kind_values(key: str) -> list[Value]:
    action, _ = OPTIONS[key]
    kind = RULES[key]
    if kind == "int":
        return _int_values(action.type)
    if kind == "number":
        return _number_values(action.type)
    return BAD[kind]


def test_every_option_has_a_rule():
    """A new option must say what kind of value it takes (``RULES``), so it is swept."""
    missing = sorted(set(OPTIONS) - set(RULES))
    assert not missing, f"options without a sweep rule in RULES: {missing}"
    stale = sorted(set(RULES) - set(OPTIONS))
    assert not stale, f"RULES names options the parser no longer has: {stale}"
    for key, kind in RULES.items():
        assert kind in BAD or kind in ("int", "number"), (key, kind)
        action = OPTIONS[key][0]
        if kind in ("int", "number"):
            assert getattr(action.type, "__qualname__", "").startswith(
                "integer" if kind == "int" else "number"), (
                f"{key} is ruled {kind} but its type is {action.type}")
        if kind == "choice":
            assert action.choices, f"{key} is ruled a choice but offers none"
    for key, value in ALLOWED:
        assert key in RULES and value in _kind_values(key), f"stale ALLOWED entry {key, value}"


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    return Sweep(tmp_path_factory.mktemp("sweep"))


def _argv(sweep: Sweep, key: str, text: str) -> list[str]:
    command = next(c for c in sorted(BASE, key=len, reverse=True) if key.startswith(c + " "))
    option = OPTIONS[key][1]
    base = [w.format(**vars(sweep)) for w in BASE[command]]
    extra = BESIDE.get(key, [])
    if option.startswith("-"):
        base = _without(base, [option, *extra[::2]])
        return [*base, *extra, option, text]
    # a positional: replace the base's own (the word after the command's words)
    words = len(command.split())
    return [*base[:words], text, *base[words + 1:]]


def _without(argv: list[str], options: list[str]) -> list[str]:
    out, skip = [], False
    for word in argv:
        if skip:
            skip = False
            continue
        if word in options:
            skip = True
            continue
        out.append(word)
    return out


def _outcome(sweep: Sweep, key: str, value: Value, capsys) -> str | None:
    """None when ``value`` for the option ``key`` ends in one clear line (``check_case``),
    else what went wrong."""
    sweep.fresh(key)
    text = value if isinstance(value, str) else value(sweep)
    option = OPTIONS[key][1]
    kept = None  # the user's file the value names (or the file in their folder)
    if text.startswith(str(sweep.tmp)) and os.path.exists(text):
        kept = Path(text) if os.path.isfile(text) else next(Path(text).glob("*.txt"), None)
    needles = (option,) if not text.strip() else (option, text)
    case = Case(key, lambda m: _argv(sweep, key, text), needles,
                kept=(lambda m: kept) if kept else None)
    try:
        check_case(case, sweep, capsys)
    except Exception as err:  # noqa: BLE001  (any way of failing is reported, per value)
        return f"{key} {text!r}: {type(err).__name__}: {(str(err) or '?').splitlines()[0][:300]}"
    return None


@pytest.mark.parametrize("key", sorted(RULES))
def test_bad_values_of_an_option_end_in_one_clear_line(key, sweep, capsys, monkeypatch):
    """Each bad value of the option ``key`` (all of them tried, the failures listed)."""
    monkeypatch.setenv("LOCKSTEP_HTTP_TIMEOUT", "2")
    if key.startswith("cache "):
        monkeypatch.setenv("LOCKSTEP_CACHE", str(sweep.root / "cache"))
    failures = [f for value in _kind_values(key) if (key, value) not in ALLOWED
                for f in [_outcome(sweep, key, value, capsys)] if f]
    assert not failures, "\n".join(failures)


def test_calibrate_names_a_package_without_a_tokenizer(capsys):
    """The corpus is text: a package without a tokenizer is named as ``--package``, not as
    the corpus's first segment (found by this sweep's calibrate base on a fixture)."""
    from suites.support import one_line_error

    line = one_line_error(capsys, ["calibrate", "--engine", "native-host", "--package",
                                   "tiny_llama"])
    assert "[field --package = 'tiny_llama']" in line and "tokenizer" in line, line
