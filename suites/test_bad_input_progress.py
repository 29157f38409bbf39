"""Long commands say what they are doing: off a terminal (a CI log) a plain line at least
every few seconds, on a terminal a bar whose count is known before the first cell ends."""
from __future__ import annotations

import io
import re
import time
from pathlib import Path

from rich.console import Console
from rich.progress import Progress

from harness.cli import main
from harness.cli.progress import INTERVAL, CellProgress, CountColumn

REPO = Path(__file__).resolve().parents[1]


def plain_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False, width=200), out


def test_plain_progress_never_goes_silent_for_an_interval():
    console, out = plain_console()
    interval = 0.2
    stamps = []
    with CellProgress("matrix", interval=interval, console=console) as progress:
        progress.plan(3)
        progress.advance("a · greedy · native-host · p0")
        for _ in range(8):  # a slow cell: nothing happens for 1.2 s
            time.sleep(0.15)
            stamps.append((time.monotonic(), out.getvalue().count("\n")))
    lines = out.getvalue().splitlines()
    assert lines[0] == "matrix: planning" and lines[1] == "matrix: 3 cells planned"
    heartbeats = [line for line in lines if "still running" in line]
    assert len(heartbeats) >= 3
    assert all("1/3 cells done" in line and "p0" in line for line in heartbeats)
    counts = [n for _, n in stamps]  # a new line at least every interval + polling slack
    assert all(b > a for a, b in zip(counts[::3], counts[3::3]))


def test_a_ci_interval_is_well_under_thirty_seconds():
    assert INTERVAL <= 15


def test_run_off_a_terminal_prints_plan_and_count_on_stderr(capsys):
    status = main(["run", "--packages", "lookup_chained", "--engines", "native-host",
                   "--max-new-tokens", "2", "--max-prompts", "2", "--no-evidence"])
    captured = capsys.readouterr()
    assert status == 0
    assert "parity matrix: 2 cells planned" in captured.err
    assert re.search(r"parity matrix: 2/2 cells done, \d+ s elapsed", captured.err)
    assert "parity matrix:" not in captured.out  # stdout keeps the results


def test_the_count_is_never_a_question_mark():
    progress = Progress(CountColumn(), console=plain_console()[0])
    task = progress.add_task("x", total=None)
    column = CountColumn()
    assert "?" not in column.render(progress.tasks[task]).plain
    progress.update(task, total=48)
    assert column.render(progress.tasks[task]).plain == "0/48"


def test_terminal_progress_knows_its_total_once_planned():
    console = Console(file=io.StringIO(), force_terminal=True, width=120)
    with CellProgress("matrix", console=console) as progress:
        assert not progress.plain
        progress.plan(5)
        progress.advance("p0")
        task = progress._progress.tasks[0]
        assert (task.total, task.completed) == (5, 1)


def test_long_installs_show_pip_progress():
    """The heavy pip installs (the test extras, torch, the SmolLM2 wheel, CuPy) are not -q."""
    text = (REPO / "Makefile").read_text()
    installs = [line for line in text.splitlines() if "pip install" in line]
    heavy = [line for line in installs if re.search(r"\.\[[^]]*(test|real|hf|cuda)|SMOLLM2", line)]
    assert heavy and not [line for line in heavy if " -q" in line]


def test_convert_prints_each_step_off_a_terminal(tmp_path, capsys):
    import pytest

    pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
    pytest.importorskip("tokenizers", reason="the converter needs the 'real' extra (make real)")
    from suites.convert_support import write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")
    assert main(["convert", str(gguf), "-o", str(tmp_path / "pkg")]) == 0
    err = capsys.readouterr().err
    steps = [line for line in err.splitlines() if line.startswith("converting tiny.gguf: ")]
    said = " | ".join(steps)
    for what in ("hashing tiny.gguf", "reading tiny.gguf", "converting the target weights",
                 "writing target.onnx", "checking the package"):
        assert what in said
    assert all(re.search(r"\(\d+ s\)$", line) for line in steps)
