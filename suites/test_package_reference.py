"""Package format v1, the optional ``reference`` field: the package the recompute oracle runs
to judge this one (a reduced-precision package's float32 twin).

Facts: a package with a reference loads and round-trips, one without never mentions it; a
malformed reference (a path instead of a sibling folder name, a hash that is not one, an
unknown key) is refused at load with the field named; ``reference_package`` /
``oracle_for`` run the sibling when its bytes are the pinned ones and refuse, naming the
field, a reference that is missing, changed, of another vocabulary or context, or that
declares a reference of its own.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from engines.errors import PackageError
from engines.oracle import oracle_for, reference_package
from engines.package import PackageSpec, load_package, package_content_hash
from suites.test_package_format import Pkg

ZERO_HASH = "sha256:" + "0" * 64


def _pair(tmp_path: Path, **twin_doc) -> tuple[Path, Path]:
    """A package ``pkg`` and a sibling ``twin`` (the same graph; ``twin_doc`` edits its
    package.yaml); ``pkg`` declares the twin as its reference, pinned to its real hash."""
    twin = Pkg(tmp_path / "twin")
    twin.doc.update(twin_doc)
    twin.write()
    pkg = Pkg(tmp_path / "pkg")
    pkg.doc["reference"] = {"folder": "twin", "content_hash": package_content_hash(twin.folder)}
    return pkg.write(), twin.folder


def test_a_package_with_a_reference_loads_and_round_trips(tmp_path):
    root, twin = _pair(tmp_path)
    spec = load_package(root).spec
    assert spec.reference.folder == "twin"
    assert spec.reference.content_hash == package_content_hash(twin)
    assert PackageSpec.model_validate(yaml.safe_load(spec.to_yaml())) == spec


def test_a_package_without_a_reference_never_mentions_it(tmp_path):
    pkg = load_package(Pkg(tmp_path / "p").write())
    assert pkg.spec.reference is None
    assert "reference" not in yaml.safe_load(pkg.spec.to_yaml())
    assert reference_package(pkg) is pkg
    assert oracle_for(pkg).package is pkg


@pytest.mark.parametrize("reference,field,needle", [
    ({"folder": "../twin", "content_hash": ZERO_HASH}, "reference.folder",
     "contains characters a name may not hold"),
    ({"folder": "a/b", "content_hash": ZERO_HASH}, "reference.folder",
     "contains characters a name may not hold"),
    ({"folder": "twin", "content_hash": "sha256:abc"}, "reference.content_hash",
     "is not a package content hash"),
    ({"folder": "twin", "content_hash": ZERO_HASH.upper()}, "reference.content_hash",
     "is not a package content hash"),
    ({"folder": "twin"}, "reference.content_hash", "required field 'content_hash'"),
    ({"folder": "twin", "content_hash": ZERO_HASH, "dtype": "float32"}, "reference.dtype",
     "unknown field 'dtype'"),
])
def test_a_malformed_reference_is_refused_at_load(tmp_path, reference, field, needle):
    pkg = Pkg(tmp_path / "p")
    pkg.doc["reference"] = reference
    with pytest.raises(PackageError) as err:
        load_package(pkg.write())
    assert err.value.field == field, str(err.value)
    assert needle in str(err.value) and err.value.remedy
    assert "Input should be" not in str(err.value)


def test_oracle_runs_the_reference_when_its_bytes_are_the_pinned_ones(tmp_path):
    root, twin = _pair(tmp_path)
    pkg = load_package(root)
    assert reference_package(pkg).root == twin.resolve()
    oracle = oracle_for(pkg)
    assert oracle.package.root == twin.resolve() and oracle.name == "ort-cpu"
    assert oracle_for(pkg, "native-host").name == "native-host"


def _refused(root: Path, field: str, needle: str) -> None:
    with pytest.raises(PackageError) as err:
        oracle_for(load_package(root))
    assert err.value.field == field, str(err.value)
    assert needle in str(err.value) and err.value.remedy


def test_a_missing_or_changed_reference_is_refused(tmp_path):
    root, twin = _pair(tmp_path)
    (twin / "package.yaml").write_text((twin / "package.yaml").read_text() + "# edited\n")
    _refused(root, "reference.content_hash", "has changed")
    shutil.rmtree(twin)
    _refused(root, "reference.folder", "which is not in")


@pytest.mark.parametrize("twin_doc,field,needle", [
    ({"eos_id": 2}, "reference.folder", "has eos_id 2"),
    ({"max_context": 8}, "reference.folder", "holds 8 positions"),
    ({"reference": {"folder": "other", "content_hash": ZERO_HASH}}, "reference",
     "declares a reference of its own"),
])
def test_a_reference_that_cannot_judge_the_package_is_refused(tmp_path, twin_doc, field,
                                                              needle):
    root, _ = _pair(tmp_path, **twin_doc)
    _refused(root, field, needle)
