"""The documented path for a third-party engine, exercised as a user would take it.

``examples/lockstep-example-engine`` is a separate distribution with entry points in
``lockstep.engines``; ``make`` installs it into the venv (the ``$(STAMP)`` step). Here
``lockstep run`` finds it by its entry point name (not ``module:Class``), ``lockstep
engines`` lists it with its distribution and version, and its own test suite passes under
lockstep's pytest plugin in a separate pytest process.

If the example is not installed these tests fail, naming the command that installs it: a
skip would hide a broken documented path. ``LOCKSTEP_ALLOW_MISSING_EXAMPLE=1`` turns that
failure into a skip, for a bare checkout only (CI never sets it).
"""
from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "lockstep-example-engine"
DISTRIBUTION = "lockstep-example-engine"
ENGINE = "example-ort-optimized"
ALLOW_MISSING = "LOCKSTEP_ALLOW_MISSING_EXAMPLE"
INSTALL = f"{sys.executable} -m pip install -e {EXAMPLE.relative_to(REPO)}  (what `make` does)"


@pytest.fixture(scope="module")
def example_installed() -> str:
    """The installed example's version; a clear failure (or, with the env var, a skip)."""
    try:
        version = importlib.metadata.version(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        message = (f"the example engine package {DISTRIBUTION!r} is not installed in this "
                   f"environment, so the documented third-party path is untested; install "
                   f"it: {INSTALL}")
        if os.environ.get(ALLOW_MISSING) == "1":
            pytest.skip(message + f" ({ALLOW_MISSING}=1)")
        pytest.fail(message, pytrace=False)
    return version


def _lockstep() -> list[str]:
    script = Path(sys.executable).with_name("lockstep")
    return [str(script)] if script.exists() else [sys.executable, "-m", "harness.cli"]


def _clean_env() -> dict[str, str]:
    """The environment without this pytest run's own settings (xdist worker, addopts)."""
    return {k: v for k, v in os.environ.items()
            if not (k.startswith("PYTEST_") or k.startswith("PYTEST_XDIST"))}


def test_lockstep_run_finds_the_example_by_its_entry_point(example_installed, tmp_path):
    proc = subprocess.run(
        _lockstep() + ["run", "--engines", ENGINE, "--packages", "tiny_llama",
                       "--max-new-tokens", "12", "--evidence-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=REPO, env=_clean_env())
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert ENGINE in proc.stdout
    records = [json.loads(p.read_text()) for p in tmp_path.glob(f"*__{ENGINE}__*.json")]
    assert records and all(r["engine"] == ENGINE and r["status"] == "identical"
                           for r in records), [(r["engine"], r["status"]) for r in records]


def test_lockstep_engines_lists_the_example(example_installed):
    proc = subprocess.run(_lockstep() + ["engines", "--json"], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=_clean_env())
    assert proc.returncode == 0, proc.stderr
    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    row = rows[ENGINE]
    assert (row["source"], row["distribution"], row["version"]) == \
        ("entry point", DISTRIBUTION, example_installed)
    assert row["available"] and row["problem"] is None
    assert row["capabilities"]["residency"] == "host"


def test_the_examples_own_suite_passes_under_the_plugin(example_installed):
    """Its tests use lockstep's pytest plugin from the installed entry point (the example's
    folder has its own pytest configuration; this checkout's conftest is not involved)."""
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:benchmark",
         "--packages", "tiny_llama,tiny_llama_pair"],
        capture_output=True, text=True, timeout=900, cwd=EXAMPLE, env=_clean_env())
    tail = (proc.stdout + proc.stderr)[-4000:]
    assert proc.returncode == 0, tail
    assert " passed" in proc.stdout and "failed" not in proc.stdout, tail
