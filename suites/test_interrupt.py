"""Ctrl-C ends every command with one line and exit status 130, never a traceback (issue
33): ``lockstep run`` says how many of its planned cells it recorded and that the run is
incomplete (its manifest stays unmarked, so ``lockstep report`` shows it INCOMPLETE);
``lockstep convert`` leaves no half-written package."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _sigint_as_from_a_terminal() -> None:
    """In the child before it starts: SIGINT delivered and default, as a shell gives it. A
    child inherits an ignored or blocked SIGINT from the process that starts it. In two
    full runs (worksteal order) an xdist worker held one, left by something an earlier
    test ran (not yet found): the run never saw the signal and the test waited out its
    60 s. Either state, set on purpose, fails the test without this and passes with it."""
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_during_a_run_is_one_line_with_the_cells_recorded(tmp_path):
    """A real run sent SIGINT, as a terminal's Ctrl-C sends it, while its engine stalls in
    its fourth cell (``suites.test_run_cli.Stalls``: three cells of lookup_chained done)."""
    folder = tmp_path / "evidence"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", "--engines", "suites.test_run_cli:Stalls",
         "--packages", "lookup_chained,tiny_llama", "--max-new-tokens", "6",
         "--evidence-dir", str(folder)], cwd=ROOT, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, preexec_fn=_sigint_as_from_a_terminal)
    try:
        deadline = time.monotonic() + 120
        while len(list(folder.glob("*.json"))) < 3:
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        time.sleep(0.5)  # into the stall
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert [line for line in err.splitlines() if line.strip()][-1] == \
        "lockstep: interrupted: 3 of 6 cells recorded; the run is incomplete"
    assert len(list(folder.glob("*.json"))) == 3
    [manifest] = (folder / "runs").glob("*.json")
    assert json.loads(manifest.read_text())["complete"] is False


def test_every_command_ends_on_ctrl_c_with_one_line(tmp_path, capsys, monkeypatch):
    import harness.cli.cache as cache

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache, "list_", interrupted)
    assert main(["cache", "list"]) == 130
    assert capsys.readouterr().err == "lockstep: interrupted\n"


def test_ctrl_c_during_a_conversion_leaves_nothing_half_written(tmp_path, capsys, monkeypatch):
    pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
    import harness.convert.conversion as convert
    from suites.convert_support import write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(convert, "write_converted", ctrl_c)
    assert main(["convert", str(gguf), "-o", str(tmp_path / "out")]) == 130
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "lockstep: interrupted" and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]
