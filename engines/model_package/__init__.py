"""onnx-genai's model packages (onnxruntime's model-package manifest, onnx-genai's
inference metadata) imported as lockstep packages, one per variant this machine can run.

``import_model_package(root, out)`` writes ``out/<variant>`` for every variant whose
execution provider onnxruntime offers here (a CPU variant everywhere, a CUDA one on a GPU
machine) and says why it left out each other variant; ``imported_variants(root)`` keeps
the imports in lockstep's cache, keyed by the package's content hash and this code, for
``lockstep run --packages DIR``. The manifest is ``manifest.py``, the metadata
``metadata.py``, the per-variant wrapping ``wrap.py``.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import shutil
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from engines.errors import InputError, PackageError
from engines.model_package.manifest import ModelPackage, Variant, is_model_package
from engines.model_package.wrap import folder_name, wrap_variant

HERE = Path(__file__).resolve().parent
IMPORT_FILE = "import.json"


@dataclass
class ImportReport:
    """What an import wrote and what it left out, with why."""
    source: Path
    content_hash: str
    imported: dict[str, Path] = field(default_factory=dict)  # variant label -> folder
    skipped: dict[str, str] = field(default_factory=dict)  # variant label -> reason


def available_providers() -> list[str]:
    """The execution providers onnxruntime offers here (CPU when it is not installed)."""
    try:
        import onnxruntime
    except ImportError:
        return ["CPUExecutionProvider"]
    return list(onnxruntime.get_available_providers())


def runnable(variant: Variant, providers: list[str]) -> str | None:
    """None when this machine can run ``variant``, else why not."""
    if variant.ep is None or variant.ep.lower() in {p.lower() for p in providers}:
        return None
    return (f"its execution provider {variant.ep} is not offered here (onnxruntime offers "
            f"{', '.join(providers)})")


def import_model_package(root: str | Path, out: str | Path,
                         providers: list[str] | None = None) -> ImportReport:
    """Write every runnable variant of the package at ``root`` under ``out`` (a new or
    empty folder): ``out/<package>-<variant>`` (``<package>-<component>-<variant>`` when
    there are several components). A variant this machine cannot run is left out with its
    reason; one it could run but whose declarations lockstep cannot honour refuses the whole
    import (a ``PackageError`` naming the file, field, value and remedy), nothing written;
    no runnable variant at all is an error naming each reason."""
    from engines.package.hashing import package_content_hash

    package = ModelPackage(Path(root))
    out = Path(out).expanduser().resolve()
    if out.exists() and any(out.iterdir()):
        raise InputError(f"{out} exists and is not empty", field="--output", value=str(out),
                         remedy="choose a new output folder, or add --force to replace it")
    providers = available_providers() if providers is None else providers
    report = ImportReport(package.root, package_content_hash(package.root))
    single = len(package.manifest.components) == 1
    # a private sibling renamed into place, so no reader (nor a parallel import of the same
    # package into the cache) sees half an import
    staged = out.parent / f".{out.name}.importing-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    staged.mkdir(parents=True)
    try:
        for variant in package.variants():
            reason = runnable(variant, providers)
            if reason is not None:
                report.skipped[variant.label] = reason
                continue
            label = variant.name if single else f"{variant.component}-{variant.name}"
            name = folder_name(f"{package.name}-{label}")
            origin = {"package": package.name, "source": str(package.root),
                      "content_hash": report.content_hash}
            wrap_variant(variant, staged / name, name, origin)
            report.imported[variant.label] = out / name
        if not report.imported:
            raise PackageError("no variant of the package can run here",
                               field="components", value=report.skipped,
                               remedy="add a variant this machine can run (a CPU one), or "
                                      "fix the reason given for each", where=str(package.root))
        (staged / IMPORT_FILE).write_text(json.dumps(
            {"source": str(package.root), "content_hash": report.content_hash,
             "importer": importer_digest(),
             "imported": {k: v.name for k, v in report.imported.items()},
             "skipped": report.skipped}, indent=2, sort_keys=True) + "\n")
        if out.exists() and not any(out.iterdir()):
            out.rmdir()
        try:
            staged.rename(out)
        except OSError:
            if not (out / IMPORT_FILE).is_file():
                raise
            shutil.rmtree(staged)  # the same import, published meanwhile by another process
    except BaseException:
        shutil.rmtree(staged, ignore_errors=True)
        raise
    return report


@functools.cache
def importer_digest() -> str:
    """A sha256 over this package's sources and the wrappers it calls."""
    from engines.backends import genai_package

    digest = hashlib.sha256()
    for path in [*sorted(HERE.glob("*.py")), Path(genai_package.__file__)]:
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def imported_variants(root: str | Path, cache: Path) -> ImportReport:
    """The package at ``root`` imported under ``cache`` (reused while the package's bytes
    and this code are unchanged)."""
    from engines.package.hashing import package_content_hash

    root = Path(root).expanduser().resolve()
    content = package_content_hash(root)
    key = hashlib.sha256(f"{content}\0{importer_digest()}".encode()).hexdigest()[:16]
    folder = Path(cache) / f"{folder_name(root.name)}-{key}"
    if not (folder / IMPORT_FILE).is_file():
        import_model_package(root, folder)
    data = json.loads((folder / IMPORT_FILE).read_text())
    return ImportReport(root, content, {k: folder / v for k, v in data["imported"].items()},
                        dict(data["skipped"]))


__all__ = ["ImportReport", "ModelPackage", "Variant", "available_providers",
           "import_model_package", "imported_variants", "is_model_package", "runnable"]
