"""Resolve what a user names as a package: a built-in fixture or a folder of their own."""
from __future__ import annotations

from pathlib import Path

from engines.backends.genai_package import is_genai_build
from engines.cache_root import cache_root
from engines.errors import PackageError
from engines.gguf_header import MAGIC
from engines.model_package import imported_variants, is_model_package
from engines.oracle import reference_package
from engines.package import PACKAGE_FILE, Package, load_package
from harness.catalog.builtin import build, list_fixtures
from harness.convert.smollm2 import smollm2_package, smollm2_selfspec_package


def fixture_names() -> list[str]:
    return [f if isinstance(f, str) else f.name for f in list_fixtures()]


REAL_CHECKPOINTS = ("smollm2", "smollm2-selfspec")  # the second adds a layer-skip drafter


def resolve_package(ref: str | Path) -> Package:
    """A fixture name builds (or reuses) that fixture; ``smollm2`` converts (or reuses) the
    real SmolLM2 checkpoint, ``smollm2-selfspec`` the same with a layer-skip drafter;
    anything else must be a package folder."""
    text = str(ref)
    if not text.strip():  # Path("") would be the current folder
        raise PackageError("names no package", field="package", value=text,
                           remedy=f"name a built-in fixture ({', '.join(fixture_names())}), a "
                                  f"real checkpoint ({', '.join(REAL_CHECKPOINTS)}) or a "
                                  f"package folder")
    if text in fixture_names():
        return load_package(build(text))
    if text in REAL_CHECKPOINTS:
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
    if is_genai_build(path):
        raise PackageError("an onnxruntime-genai build, not a package: it is wrapped into one "
                           "first", field="package", value=text,
                           remedy=f"lockstep import-genai {text} -o PACKAGE, then name PACKAGE")
    if _is_checkpoint(path):
        raise PackageError("a checkpoint, not a package: it converts to one first",
                           field="package", value=text,
                           remedy=f"lockstep convert {text} -o PACKAGE, then name PACKAGE")
    if path.exists():
        return _with_reference_checked(load_package(path))
    raise PackageError("no such package", field="package", value=text,
                       remedy=f"name a built-in fixture ({', '.join(fixture_names())}), a real "
                              f"checkpoint ({', '.join(REAL_CHECKPOINTS)}), a folder holding a "
                              f"package.yaml or an onnx-genai model package (manifest.json)")


def _is_checkpoint(path: Path) -> bool:
    """A GGUF file, or a Hugging Face folder (config.json, no package.yaml): what
    ``lockstep convert`` reads, named where a package was expected."""
    if path.is_dir():
        return (path / "config.json").is_file() and not (path / PACKAGE_FILE).exists()
    try:
        with open(path, "rb") as fh:
            return fh.read(len(MAGIC)) == MAGIC
    except OSError:
        return False


def _with_reference_checked(package: Package) -> Package:
    """``package``, once the reference it declares (the package the oracle runs to judge it)
    is there and unchanged: a missing or changed reference is the package's fault, refused
    here in one line, not an ``error`` in every cell of the matrix."""
    if package.spec.reference is not None:
        reference_package(package)
    return package


def imported_model_package(folder: Path) -> list[Path]:
    """The lockstep packages of an onnx-genai model package's runnable variants, imported
    into the cache once per package content (``engines.model_package``)."""
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
