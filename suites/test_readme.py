"""README.md is a front page: it starts with the two commands, names every built-in engine,
and stays short (the rest lives in docs/, which it links)."""
from __future__ import annotations

import re
from pathlib import Path

from engines.registry import BUILTIN

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()


def test_the_readme_starts_with_the_two_commands():
    first_block = README.split("```")[1]
    commands = [line.split("#")[0].strip() for line in first_block.splitlines()[1:]]
    assert README.startswith("# lockstep\n") and commands == ["make demo", "make test"]


def test_the_readme_is_a_front_page():
    assert len(README.splitlines()) <= 150


def test_the_readme_names_every_built_in_engine():
    rows = set(re.findall(r"^\| `([\w-]+)` \|", README, re.M))
    assert set(BUILTIN) <= rows
