"""``manifest.json``: onnxruntime's model-package manifest (schema 1.x), read as onnx-genai
reads it.

A package is a folder: ``manifest.json`` names components, each with variants (a folder,
an execution provider, a device, executor info). A variant's executor info comes from
``executor_info.nxrt`` or ``executor_info.ort``, inline or as a JSON file beside the
variant, and names its ``model_file`` and optionally ``inference_metadata``,
``genai_config`` and a ``tokenizer`` folder. A reference is relative to its base and must
stay inside the package (``layout: installed`` is not trusted from the manifest alone), or
is a shared asset, ``sha256:<64 hex>[/tail]`` under ``shared_assets/sha256-<digest>/``
unless ``shared_assets`` maps the digest elsewhere inside the package. Unknown fields are
kept out of the way, as a 1.x reader must; an unsupported major version is refused.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from engines.errors import PackageError

MANIFEST_FILE = "manifest.json"
COMPONENT_FILE = "component.json"
METADATA_FILES = ("inference_metadata.yaml", "inference_metadata.yml", "inference_metadata.json")
MAX_JSON_BYTES = 4 << 20
_DIGEST = re.compile(r"[0-9a-f]{64}")


class _Loose(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)


class VariantEntry(_Loose):
    variant_directory: str
    ep: str | None = None
    device: str | None = None
    compatibility_string: str | None = None
    executor_info: dict[str, Any] = {}
    additional_metadata: dict[str, Any] = {}


class ComponentEntry(_Loose):
    component_name: str
    variants: dict[str, VariantEntry]


class ManifestEntry(_Loose):
    schema_version: str
    package_name: str | None = None
    components: dict[str, ComponentEntry | str]
    shared_assets: dict[str, str] = {}


class ExecutorInfo(_Loose):
    schema_version: str | None = None
    model_file: str
    genai_config: str | None = None
    inference_metadata: str | None = None
    tokenizer: str | None = None


@dataclass(frozen=True)
class Variant:
    """One variant of one component, its files resolved inside the package."""
    component: str
    name: str
    folder: Path
    ep: str | None
    device: str | None
    precision: str | None
    model: Path
    metadata: Path | None
    genai_config: Path | None
    tokenizer: Path | None  # a folder

    @property
    def label(self) -> str:
        return f"{self.component}/{self.name}"


def is_model_package(folder: Path) -> bool:
    """A folder holding a manifest.json with schema_version and components (and no
    package.yaml: a lockstep package is never taken for one)."""
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file() or (Path(folder) / "package.yaml").exists():
        return False
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(data, dict) and "schema_version" in data and "components" in data


def _json(path: Path, field: str) -> Any:
    if not path.is_file():
        raise PackageError(f"{path.name} is missing", field=field, value=str(path),
                           remedy="give the package folder as it was written, every file "
                                  "the manifest names included")
    if path.stat().st_size > MAX_JSON_BYTES:
        raise PackageError(f"{path.name} is larger than {MAX_JSON_BYTES} bytes", field=field,
                           value=path.stat().st_size, remedy="a manifest is a small JSON file",
                           where=str(path))
    try:
        return json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise PackageError(f"{path.name} is not JSON ({err})", field=field, value=str(path),
                           remedy="rewrite it as JSON", where=str(path)) from None


def _validated(model: type[BaseModel], data: Any, path: Path, prefix: str):
    try:
        return model.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        loc = ".".join(str(p) for p in (prefix, *first["loc"]) if p != "")
        raise PackageError(first["msg"].lower(), field=loc,
                           value=first.get("input") if first["type"] != "missing" else None,
                           remedy="write the field as onnxruntime's model-package schema 1.x "
                                  "defines it", where=str(path)) from None


def _check_version(version: str, path: Path, field: str) -> None:
    match = re.fullmatch(r"(\d+)\.(\d+)", version)
    if match is None:
        raise PackageError("schema_version is not '<major>.<minor>'", field=field,
                           value=version, remedy='write it as "1.0"', where=str(path))
    if int(match[1]) != 1:
        raise PackageError(f"schema major version {match[1]} is not supported", field=field,
                           value=version, remedy="lockstep reads model-package schema 1.x",
                           where=str(path))


class ModelPackage:
    """A model package folder, its manifest read and checked."""

    def __init__(self, root: Path):
        self.root = Path(root).expanduser().resolve()
        self.manifest_path = self.root / MANIFEST_FILE
        data = _json(self.manifest_path, MANIFEST_FILE)
        self.manifest = _validated(ManifestEntry, data, self.manifest_path, "")
        _check_version(self.manifest.schema_version, self.manifest_path, "schema_version")
        if not self.manifest.components:
            raise PackageError("the manifest declares no components", field="components",
                               value={}, remedy="declare at least one component",
                               where=str(self.manifest_path))

    @property
    def name(self) -> str:
        return self.manifest.package_name or self.root.name

    # -- references -------------------------------------------------------------------------

    def resolve(self, base: Path, ref: str, field: str) -> Path:
        """``ref`` from ``base`` (or a ``sha256:`` shared asset), confined to the package."""
        if ref.startswith("sha256:"):
            digest, _, tail = ref[len("sha256:"):].partition("/")
            if not _DIGEST.fullmatch(digest):
                raise PackageError("a shared-asset reference needs 64 lowercase hex digits",
                                   field=field, value=ref, remedy="write sha256:<64 hex>[/tail]",
                                   where=str(self.manifest_path))
            mapped = (self.manifest.shared_assets.get(f"sha256:{digest}")
                      or self.manifest.shared_assets.get(digest))
            folder = (self._inside(self.root, mapped, f"shared_assets[{digest[:12]}...]")
                      if mapped else self.root / "shared_assets" / f"sha256-{digest}")
            path = folder / tail if tail else folder
        else:
            path = self._inside(base, ref, field)
        real = path.resolve()
        if not real.is_relative_to(self.root):
            raise PackageError("the reference leaves the package folder", field=field,
                               value=ref, remedy="keep every file inside the package (a "
                                                 "symbolic link out of it is refused too)",
                               where=str(self.manifest_path))
        if not real.exists():
            raise PackageError("the referenced file does not exist", field=field, value=ref,
                               remedy="give the package folder with every file it names",
                               where=str(self.manifest_path))
        return real

    def _inside(self, base: Path, ref: str, field: str) -> Path:
        parts = PurePosixPath(ref.replace("\\", "/"))
        if not ref or parts.is_absolute() or ".." in parts.parts:
            raise PackageError("a portable package's reference must stay below its base",
                               field=field, value=ref, remedy="use a relative path without "
                                                              "'..' (layout: installed is not "
                                                              "trusted)",
                               where=str(self.manifest_path))
        return base / parts

    # -- components and variants ------------------------------------------------------------

    def component(self, name: str) -> ComponentEntry:
        entry = self.manifest.components[name]
        if isinstance(entry, str):  # an external component: a JSON file or a folder of one
            path = self.resolve(self.root, entry, f"components.{name}")
            if path.is_dir():
                path = self.resolve(path, COMPONENT_FILE, f"components.{name}")
            entry = _validated(ComponentEntry, _json(path, f"components.{name}"), path, "")
        if entry.component_name != name:
            raise PackageError("component_name differs from the component's key",
                               field=f"components.{name}.component_name",
                               value=entry.component_name, remedy=f"set it to {name!r}",
                               where=str(self.manifest_path))
        return entry

    def variants(self) -> list[Variant]:
        """Every variant of every component, in manifest order, its files resolved."""
        return [self.variant(c, v) for c in self.manifest.components
                for v in self.component(c).variants]

    def variant(self, component: str, name: str) -> Variant:
        entry = self.component(component).variants[name]
        base = f"components.{component}.variants.{name}"
        folder = self.resolve(self.root, entry.variant_directory, f"{base}.variant_directory")
        if not folder.is_dir():
            raise PackageError("variant_directory is not a folder",
                               field=f"{base}.variant_directory", value=entry.variant_directory,
                               remedy="point it at the variant's folder",
                               where=str(self.manifest_path))
        key = next((k for k in ("nxrt", "ort") if k in entry.executor_info), None)
        if key is None:
            raise PackageError("the variant has no executor_info.nxrt or executor_info.ort",
                               field=f"{base}.executor_info", value=sorted(entry.executor_info),
                               remedy="name the model file under executor_info.nxrt (inline or "
                                      "as a JSON file)", where=str(self.manifest_path))
        raw, source = entry.executor_info[key], self.manifest_path
        field = f"{base}.executor_info.{key}"
        if isinstance(raw, str):
            source = self.resolve(folder, raw, field)
            raw = _json(source, field)
        if not isinstance(raw, dict):
            raise PackageError("executor info must be an object or a JSON file's name",
                               field=field, value=raw, remedy="write {\"model_file\": ...}",
                               where=str(self.manifest_path))
        info = _validated(ExecutorInfo, raw, source, field if source == self.manifest_path
                          else "")
        if info.schema_version is not None:
            _check_version(info.schema_version, source, f"{field}.schema_version")

        def optional(ref: str | None, what: str) -> Path | None:
            return None if ref is None else self.resolve(folder, ref, f"{field}.{what}")
        metadata = optional(info.inference_metadata, "inference_metadata")
        if metadata is None:  # found by name beside the model, as onnx-genai looks for it
            metadata = next((folder / n for n in METADATA_FILES if (folder / n).is_file()), None)
        tokenizer = optional(info.tokenizer, "tokenizer")
        if tokenizer is None and (folder / "tokenizer.json").is_file():
            tokenizer = folder
        if tokenizer is not None and not tokenizer.is_dir():
            raise PackageError("the tokenizer reference is not a folder",
                               field=f"{field}.tokenizer", value=info.tokenizer,
                               remedy="name the folder holding tokenizer.json",
                               where=str(source))
        precision = entry.additional_metadata.get("precision")
        return Variant(component, name, folder, entry.ep, entry.device,
                       precision if isinstance(precision, str) else None,
                       self.resolve(folder, info.model_file, f"{field}.model_file"), metadata,
                       optional(info.genai_config, "genai_config"), tokenizer)
