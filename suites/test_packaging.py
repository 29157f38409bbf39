"""The project's packaging metadata: setuptools applies both pyproject files (lockstep's and
the example engine's) without a warning, so ``make demo``'s installs print none (the licence
as a TOML table was deprecated in setuptools 77, and warned at each of its four installs)."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("pyproject", [ROOT / "pyproject.toml",
                                       ROOT / "examples/lockstep-example-engine/pyproject.toml"],
                         ids=["lockstep", "example-engine"])
def test_setuptools_applies_the_metadata_without_a_warning(pyproject, monkeypatch):
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(pyproject.parent)  # the readme and packages are found from there
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), pyproject)
    assert not [str(w.message).splitlines()[0] for w in caught]
    assert dist.metadata.license_expression == "Apache-2.0"
