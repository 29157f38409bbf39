"""Package files that loaded silently and should not: an absurd max_context, a state too
large to hold at max_context, a package.yaml that is a link to a file elsewhere."""
from __future__ import annotations

import os
import shutil

import pytest
import yaml

from engines.errors import PackageError
from engines.package import load_package, read_spec
from engines.package.schema import MAX_CONTEXT_LIMIT, MAX_STATE_BYTES
from harness.cli import main


@pytest.fixture
def tiny(packages, tmp_path):
    """A writable copy of tiny_llama (kv cells [1, 2, 0, 16] float32, four of them)."""
    folder = tmp_path / "tiny"
    shutil.copytree(packages["tiny_llama"].root, folder)
    return folder


def _edit(folder, **fields):
    path = folder / "package.yaml"
    doc = yaml.safe_load(path.read_text())
    doc.update(fields)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def test_max_context_above_the_hard_maximum(tiny):
    _edit(tiny, max_context=1_000_000_000_000)
    with pytest.raises(PackageError) as info:
        load_package(tiny)
    err = info.value
    assert err.field == "max_context" and err.value == 1_000_000_000_000
    assert str(MAX_CONTEXT_LIMIT) in err.remedy


def test_max_context_whose_state_cannot_be_held(tiny):
    """Under the hard maximum, but the kv cells at max_context need 2 TiB."""
    doc = yaml.safe_load((tiny / "package.yaml").read_text())
    state = {name: {**cell, "shape": [1, 64, 0, 1024]} for name, cell in doc["state"].items()}
    per_position = len(state) * 64 * 1024 * 4
    context = 2 * MAX_STATE_BYTES // per_position
    assert context <= MAX_CONTEXT_LIMIT
    _edit(tiny, state=state, max_context=context)
    with pytest.raises(PackageError) as info:
        read_spec(tiny)
    err = info.value
    assert err.field == "max_context" and err.value == context
    assert f"at most {MAX_STATE_BYTES // per_position}" in err.remedy
    _edit(tiny, max_context=MAX_STATE_BYTES // per_position)  # the largest that fits loads
    assert read_spec(tiny).max_context == MAX_STATE_BYTES // per_position


def test_package_yaml_linked_from_outside_the_folder(tiny, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tiny / "package.yaml").rename(elsewhere / "package.yaml")
    os.symlink(elsewhere / "package.yaml", tiny / "package.yaml")
    with pytest.raises(PackageError) as info:
        load_package(tiny)
    assert info.value.field == "package.yaml"
    assert info.value.value == str(elsewhere / "package.yaml")
    assert "copy" in info.value.remedy


def test_package_yaml_linked_inside_the_folder_loads(tiny):
    (tiny / "package.yaml").rename(tiny / "real.yaml")
    os.symlink("real.yaml", tiny / "package.yaml")
    assert load_package(tiny).spec.name == "tiny_llama"


def test_the_cli_reports_a_bad_package_in_one_line(tiny, capsys):
    _edit(tiny, max_context=1_000_000_000_000)
    status = main(["run", "--packages", str(tiny), "--engines", "native-host", "--no-evidence"])
    err = capsys.readouterr().err
    assert status == 2 and "Traceback" not in err
    assert "[field max_context = 1000000000000]" in err
