"""``scripts/``: each script is named in docs/GPU.md, parses (``bash -n``, Python's parser),
and writes the evidence layout: records and logs, never a copy of a report."""
from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p for p in (ROOT / "scripts").iterdir() if p.suffix in (".sh", ".py"))


def test_every_script_is_named_in_the_gpu_page():
    page = (ROOT / "docs" / "GPU.md").read_text()
    assert SCRIPTS and not [p.name for p in SCRIPTS if f"scripts/{p.name}" not in page]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_the_script_parses(script):
    if script.suffix == ".sh":
        checked = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
        assert checked.returncode == 0, checked.stderr
    else:
        ast.parse(script.read_text(encoding="utf-8"), filename=str(script))


@pytest.mark.parametrize("script", [p for p in SCRIPTS if p.suffix == ".sh"],
                         ids=lambda p: p.name)
def test_no_script_renders_a_report(script):
    """A report is its records rendered: the scripts say the command, they do not run it."""
    runs = [line for line in script.read_text().splitlines()
            if re.search(r"(harness\.cli|lockstep) report\b", line)
            and not line.lstrip().startswith(("#", "echo"))]
    assert not runs, runs
