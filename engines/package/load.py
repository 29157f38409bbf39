"""``load_package``: a folder checked end to end, from package.yaml down to each graph's ports.

Loading is where a malformed package must fail, once, with the file, the field path, the
bad value and the remedy; every engine can then trust ``Package`` without rechecking.
Paths are confined to the package folder (no ``..``, no absolute paths, no symlink that
leads out) so a package cannot make an engine read arbitrary files.
"""
from __future__ import annotations

import math
import os
import threading
from pathlib import Path, PurePosixPath, PureWindowsPath

import onnx
from onnx.external_data_helper import ExternalDataInfo, uses_external_data
from pydantic import ValidationError

from engines.errors import InputError, PackageError
from engines.package.hashing import package_content_hash
from engines.package.messages import did_you_mean, package_error_from, yaml_kind
from engines.package.ports import ComponentCheck, graph_inputs, graph_outputs
from engines.package.speculative_ports import SpeculativeCheck
from engines.package.schema import (FORMAT_VERSION, PACKAGE_FILE, PackageSpec, StateCellSpec,
                                    field_path)
from engines.package.yaml_source import YamlSource, read_yaml


class Package:
    """A validated package: its folder, its spec, its content hash and its components."""

    def __init__(self, root: Path, spec: PackageSpec, content_hash: str,
                 paths: dict[str, Path], models: dict[str, onnx.ModelProto]):
        self.root = root
        self.spec = spec
        self.content_hash = content_hash
        self._paths = paths
        self._models = models  # parsed at load; external data attached on first request
        self._complete: set[str] = set()
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Package({self.spec.name!r}, root={str(self.root)!r}, {self.content_hash})"

    @property
    def yaml_path(self) -> Path:
        return self.root / PACKAGE_FILE

    @property
    def component_names(self) -> tuple[str, ...]:
        return tuple(self.spec.components)

    def _known(self, name: str) -> None:
        if name not in self._paths:
            raise InputError(
                f"package {self.spec.name!r} has no component {name!r}"
                f"{did_you_mean(name, self._paths)}", field="component", value=name,
                remedy=f"use one of: {', '.join(self._paths)}", where=str(self.yaml_path))

    def component_path(self, name: str) -> Path:
        """Absolute path of the component's ONNX file (inside ``root``)."""
        self._known(name)
        return self._paths[name]

    def component_model(self, name: str) -> onnx.ModelProto:
        """The component's ModelProto, loaded once, external data attached.

        The same object is returned to every caller: treat it as read-only.
        """
        self._known(name)
        with self._lock:
            model = self._models[name]
            if name not in self._complete:
                if _external_tensors(model):
                    onnx.load_external_data_for_model(model, str(self._paths[name].parent))
                self._complete.add(name)
            return model

    def graph_inputs(self, name: str) -> tuple[str, ...]:
        """Names of the graph inputs a caller feeds (initializers excluded), in graph order."""
        self._known(name)
        return tuple(graph_inputs(self._models[name]))

    def graph_outputs(self, name: str) -> tuple[str, ...]:
        self._known(name)
        return tuple(graph_outputs(self._models[name]))

    def state_of(self, name: str) -> dict[str, StateCellSpec]:
        """The state cells the component owns, in declaration order."""
        self._known(name)
        return self.spec.state_of(name)

    @property
    def tokenizer_path(self) -> Path | None:
        tok = self.spec.tokenizer
        return None if tok is None else (self.root / tok.path).resolve()


def locate(path: str | os.PathLike) -> Path:
    """The package.yaml for ``path``, which may be the folder or the package.yaml itself;
    one that is a symbolic link to a file outside its folder is refused, like a component
    path that leaves the folder (the package is its folder, and its hash covers only that)."""
    yaml_path = _find_manifest(path)
    if yaml_path.is_symlink():
        target = yaml_path.resolve()
        if not target.is_relative_to(yaml_path.parent.resolve()):
            raise PackageError(
                f"{PACKAGE_FILE} is a symbolic link to {target}, outside the package folder",
                field=PACKAGE_FILE, value=str(target),
                remedy=f"copy that file into {yaml_path.parent} instead of linking it",
                where=str(yaml_path))
    return yaml_path


def _find_manifest(path: str | os.PathLike) -> Path:
    given = Path(path).expanduser()
    if given.is_dir():
        yaml_path = given / PACKAGE_FILE
        if not yaml_path.is_file():
            present = sorted(p.name for p in given.iterdir())[:12]
            raise PackageError(
                f"{given} is not a package: it has no {PACKAGE_FILE}", value=str(given),
                remedy=f"point at a folder that holds {PACKAGE_FILE} (this one holds: "
                       f"{', '.join(present) or 'nothing'})", where=str(yaml_path))
        return yaml_path
    if given.is_file():
        if given.name != PACKAGE_FILE:
            raise PackageError(
                f"{given.name} is not a package manifest; a package is a folder with a "
                f"{PACKAGE_FILE}", value=str(given),
                remedy=f"pass the package folder or its {PACKAGE_FILE}", where=str(given))
        return given
    if given.name == PACKAGE_FILE and given.parent.is_dir():
        raise PackageError(f"{given.parent} is not a package: it has no {PACKAGE_FILE}",
                           value=str(given), remedy=f"create {PACKAGE_FILE} there, or point "
                                                    f"at the right folder", where=str(given))
    raise PackageError(f"package folder {given} does not exist", value=str(given),
                       remedy="check the path (a package is a folder holding package.yaml)",
                       where=str(given))


def read_spec(path: str | os.PathLike) -> PackageSpec:
    """package.yaml parsed and schema-checked, without opening any ONNX file.

    For tools that inspect or write packages; ``load_package`` is what engines use.
    """
    return _read_spec(locate(path))[0]


def _read_spec(yaml_path: Path) -> tuple[PackageSpec, YamlSource]:
    source = read_yaml(yaml_path)
    data = source.data
    if not isinstance(data, dict):
        raise PackageError(
            f"{yaml_path.name} must be a mapping of fields (format, name, components, ...), "
            f"but it holds {yaml_kind(data)}" + (" (the file is empty)" if data is None else ""),
            value=None if data is None else data,
            remedy="start from the example in docs/ARCHITECTURE.md (Package format v1)",
            where=str(yaml_path))
    version = data.get("format")
    if version != FORMAT_VERSION or isinstance(version, bool):
        # a different format would fail on every field below: say the one thing that matters
        if "format" not in data:
            message = f"{yaml_path.name} does not say its format"
        elif isinstance(version, (bool, str)):
            message = (f"format must be the integer {FORMAT_VERSION}, not {yaml_kind(version)} "
                       f"{version!r}")
        else:
            message = (f"unsupported package format {version!r}; this lockstep reads format "
                       f"{FORMAT_VERSION}")
        raise PackageError(message, field="format", value=version,
                           remedy=f"add format: {FORMAT_VERSION} (as an integer) at the top",
                           where=source.where(("format",)))
    try:
        spec = PackageSpec.model_validate(data)
    except ValidationError as exc:
        raise package_error_from(exc, source) from None
    return spec, source


def _is_absolute(text: str) -> bool:
    return PurePosixPath(text).is_absolute() or bool(PureWindowsPath(text).anchor)


def resolve_inside(root: Path, text: str, loc: tuple, source: YamlSource, what: str,
                   suffix: str | None = None) -> Path:
    """``root / text``, refused unless it stays inside ``root`` and names an existing file."""
    field, where = field_path(loc), source.where(loc)
    example = PurePosixPath(text.replace("\\", "/")).name or "model.onnx"
    if _is_absolute(text):
        raise PackageError(
            f"{what} path {text!r} is absolute; package paths are relative to the package "
            f"folder, so a package can be moved and hashed as a whole", field=field, value=text,
            remedy=f"copy the file into {root} and write its relative path (e.g. {example})",
            where=where)
    candidate = root / text
    resolved = candidate.resolve()
    if not resolved.is_relative_to(root):
        lexical = os.path.normpath(text.replace("\\", "/"))
        how = ("climbs out with '..'" if lexical == ".." or lexical.startswith("../")
               else f"leads through a symbolic link to {resolved}")
        raise PackageError(
            f"{what} path {text!r} {how}, outside the package folder {root}", field=field,
            value=text, remedy=f"copy the file into the package folder and write its relative "
                               f"path (e.g. {example})", where=where)
    if not resolved.exists():
        present = sorted(p.relative_to(root).as_posix() for p in root.rglob(f"*{suffix or ''}")
                         if p.is_file())[:12]
        kind = f"{suffix} files" if suffix else "files"
        listing = f"{kind} present: {', '.join(present)}" if present else f"there are no {kind}"
        raise PackageError(
            f"{what} file {text!r} does not exist in {root}{did_you_mean(text, present)}",
            field=field, value=text,
            remedy=f"put {text} in the package folder or fix the path ({listing})",
            where=where)
    if not resolved.is_file():
        raise PackageError(f"{what} path {text!r} is a folder, not a file", field=field,
                           value=text, remedy="point at the file itself", where=where)
    return resolved


def _external_tensors(model: onnx.ModelProto) -> list[onnx.TensorProto]:
    found = []

    def walk(graph: onnx.GraphProto) -> None:
        found.extend(t for t in graph.initializer if uses_external_data(t))
        for node in graph.node:
            for attr in node.attribute:
                if attr.HasField("t") and uses_external_data(attr.t):
                    found.append(attr.t)
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    walk(sub)

    walk(model.graph)
    return found


def _parse_onnx(path: Path, loc: tuple, source: YamlSource, root: Path) -> onnx.ModelProto:
    rel = path.relative_to(root).as_posix()
    remedy = f"re-export {rel} (the file may be truncated, or not an ONNX model at all)"
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf DecodeError and onnx's own parse errors alike
        raise PackageError(f"{rel} is not a readable ONNX model: {exc}", field=field_path(loc),
                           value=rel, remedy=remedy, where=str(path)) from None
    if model.ir_version == 0 or not model.graph.output:
        raise PackageError(f"{rel} parses, but holds no ONNX graph (ir_version "
                           f"{model.ir_version}, {len(model.graph.output)} outputs)",
                           field=field_path(loc), value=rel, remedy=remedy, where=str(path))
    sizes: dict[Path, int] = {}
    for tensor in _external_tensors(model):
        info = ExternalDataInfo(tensor)
        location = info.location
        target = (path.parent / location).resolve()
        if _is_absolute(location) or not target.is_relative_to(root):
            raise PackageError(
                f"{rel} keeps tensor {tensor.name!r} in external file {location!r}, outside the "
                f"package folder", field=field_path(loc), value=location,
                remedy="save the external data beside the model inside the package folder",
                where=str(path))
        if not target.is_file():
            raise PackageError(
                f"{rel} keeps tensor {tensor.name!r} in external file {location!r}, which does "
                f"not exist", field=field_path(loc), value=location,
                remedy=f"copy {location} next to {rel}", where=str(path))
        if target not in sizes:
            sizes[target] = target.stat().st_size
        end = (info.offset or 0) + (_data_bytes(tensor) if info.length is None else info.length)
        if end > sizes[target]:
            raise PackageError(
                f"{rel} keeps tensor {tensor.name!r} in bytes {info.offset or 0}..{end} of "
                f"{location!r}, but that file holds {sizes[target]} bytes: it is truncated",
                field=field_path(loc), value=location,
                remedy=f"copy {location} again in full from where the package was made (or "
                       f"rebuild the package)", where=str(path))
    return model


# element types packed two to a byte: their extent is not count * itemsize
_PACKED = {getattr(onnx.TensorProto, name) for name in ("INT4", "UINT4", "FLOAT4E2M1")
           if hasattr(onnx.TensorProto, name)}


def _data_bytes(tensor: onnx.TensorProto) -> int:
    """The bytes an external tensor's dims and type take; 0 when that cannot be told (a
    packed or unknown type): without a declared length, only its offset is checked then."""
    if tensor.data_type in _PACKED:
        return 0
    try:
        itemsize = onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize
    except (KeyError, TypeError, ValueError):
        return 0
    return math.prod(tensor.dims) * itemsize


def load_package(path: str | os.PathLike) -> Package:
    """Load and validate the package at ``path`` (its folder or its package.yaml).

    Raises ``PackageError`` naming file, field path, value and remedy at the first problem.
    """
    yaml_path = locate(path)
    root = yaml_path.parent.resolve()
    spec, source = _read_spec(yaml_path)
    paths: dict[str, Path] = {}
    models: dict[str, onnx.ModelProto] = {}
    for name, comp in spec.components.items():
        loc = ("components", name, "path")
        paths[name] = resolve_inside(root, comp.path, loc, source, f"component {name!r}",
                                     suffix=".onnx")
        models[name] = _parse_onnx(paths[name], loc, source, root)
    for name in spec.components:
        ComponentCheck(spec, name, models[name], paths[name].relative_to(root).as_posix(),
                       source.where).run()
    SpeculativeCheck(spec, models, {n: paths[n].relative_to(root).as_posix() for n in paths},
                     source.where).run()
    if spec.tokenizer is not None:
        resolve_inside(root, spec.tokenizer.path, ("tokenizer", "path"), source, "tokenizer",
                       suffix=".json")
    return Package(root, spec, package_content_hash(root), paths, models)
