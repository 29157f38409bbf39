"""Resolve what a user names as a package: a built-in fixture or a folder of their own."""
from __future__ import annotations

from pathlib import Path

from engines.errors import PackageError
from engines.model_package import is_model_package
from engines.package import Package, load_package


def fixture_names() -> list[str]:
    from fixtures.catalog import list_fixtures

    return [f if isinstance(f, str) else f.name for f in list_fixtures()]


REAL_CHECKPOINTS = ("smollm2", "smollm2-selfspec")  # the second adds a layer-skip drafter


def resolve_package(ref: str | Path) -> Package:
    """A fixture name builds (or reuses) that fixture; ``smollm2`` converts (or reuses) the
    real SmolLM2 checkpoint, ``smollm2-selfspec`` the same with a layer-skip drafter;
    anything else must be a package folder."""
    text = str(ref)
    if text in fixture_names():
        from fixtures.catalog import build

        return load_package(build(text))
    if text in REAL_CHECKPOINTS:
        from harness.convert.smollm2 import smollm2_package, smollm2_selfspec_package

        return load_package(smollm2_selfspec_package() if text == "smollm2-selfspec"
                            else smollm2_package())
    path = Path(text).expanduser()
    if is_model_package(path):
        imported = imported_model_package(path)
        if len(imported) != 1:
            raise PackageError("the model package has several variants; name one",
                               field="package", value=text,
                               remedy=f"give one of the imported folders: "
                                      f"{', '.join(str(f) for f in imported)}")
        return load_package(imported[0])
    if path.exists():
        return _with_reference_checked(load_package(path))
    raise PackageError("no such package", field="package", value=text,
                       remedy=f"name a built-in fixture ({', '.join(fixture_names())}), a real "
                              f"checkpoint ({', '.join(REAL_CHECKPOINTS)}), a folder holding a "
                              f"package.yaml or an onnx-genai model package (manifest.json)")


def _with_reference_checked(package: Package) -> Package:
    """``package``, once the reference it declares (the package the oracle runs to judge it)
    is there and unchanged: a missing or changed reference is the package's fault, refused
    here in one line, not an ``error`` in every cell of the matrix."""
    if package.spec.reference is not None:
        from engines.oracle import reference_package

        reference_package(package)
    return package


def imported_model_package(folder: Path) -> list[Path]:
    """The lockstep packages of an onnx-genai model package's runnable variants, imported
    into the cache once per package content (``engines.model_package``)."""
    from engines.model_package import imported_variants
    from fixtures.cache import cache_root

    return list(imported_variants(folder, cache_root() / "imported").imported.values())


def expand_package_refs(refs: list[str]) -> list[str]:
    """``refs`` with each onnx-genai model package folder replaced by its imported
    variants' folders, so a run plans one package per variant."""
    out: list[str] = []
    for ref in refs:
        path = Path(ref).expanduser()
        if ref not in fixture_names() and is_model_package(path):
            out.extend(str(folder) for folder in imported_model_package(path))
        else:
            out.append(ref)
    return out
