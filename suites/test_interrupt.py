"""Ctrl-C ends every command with one line and exit status 130, never a traceback (issue
33): ``lockstep run`` says how many of its planned cells it recorded and that the run is
incomplete (its manifest stays unmarked, so ``lockstep report`` shows it INCOMPLETE);
``lockstep convert`` leaves no half-written package."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from harness.cli import main

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"lockstep: interrupted: (\d+) of (\d+) cells recorded; the run is incomplete")


def test_ctrl_c_during_a_run_is_one_line_with_the_cells_recorded(tmp_path):
    folder = tmp_path / "evidence"
    argv = [sys.executable, "-m", "harness.cli", "run", "--engines", "onnx-reference,ort-cpu",
            "--max-new-tokens", "32", "--evidence-dir", str(folder)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT),
                                                                   os.environ.get("PYTHONPATH")])))
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list(folder.glob("*.json")) and proc.poll() is None:
        assert time.monotonic() < deadline, "no record within 120 s"
        time.sleep(0.02)
    proc.send_signal(signal.SIGINT)  # as a terminal's Ctrl-C does
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    last = [line for line in err.splitlines() if line.strip()][-1]
    match = LINE.fullmatch(last)
    assert match, err
    done, planned = int(match[1]), int(match[2])
    recorded = len(list(folder.glob("*.json")))
    assert 0 < recorded < planned
    assert done in (recorded, recorded - 1)  # a record lands just before its count
    [manifest] = (folder / "runs").glob("*.json")
    assert json.loads(manifest.read_text())["complete"] is False
    assert len(json.loads(manifest.read_text())["planned"]) == planned


def test_every_command_ends_on_ctrl_c_with_one_line(tmp_path, capsys, monkeypatch):
    import harness.cli.cache as cache

    def interrupted(args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cache, "list_", interrupted)
    assert main(["cache", "list"]) == 130
    assert capsys.readouterr().err == "lockstep: interrupted\n"


def test_ctrl_c_during_a_conversion_leaves_nothing_half_written(tmp_path, capsys, monkeypatch):
    pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
    import harness.convert as convert
    from suites.convert_support import write_tiny_gguf

    gguf = write_tiny_gguf(tmp_path / "tiny.gguf")

    def ctrl_c(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(convert, "write_converted", ctrl_c)
    assert main(["convert", str(gguf), "-o", str(tmp_path / "out")]) == 130
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "lockstep: interrupted" and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.gguf"]
