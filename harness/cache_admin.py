"""What lockstep keeps on disk (fixture builds, checkpoint conversions, onnxruntime-genai's
builds and their wrapped packages, transformers' GGUF loads for the hf engine, staging folders
a killed build left) and how to prune it.

Every edit to the converter changes the conversion key, so each converter version converts
the same checkpoint again (~0.5 GB, twice that with a drafter) and the old one stays. Prune
picks conversions only (fixtures are small and rebuild in seconds), plus every stale staging
folder; a conversion that a kept one names as its ``reference`` twin is kept with it, since
the kept package cannot be judged without it. A conversion's age is the time since it was
written (its ``checkpoint.json``). Without ``$LOCKSTEP_CACHE`` the folders of the older
layout (``.lockstep/`` and ``.lockstep/converted/``) are listed and pruned the same way.
"""
from __future__ import annotations

import os
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

from engines.errors import InputError

KINDS = ("conversion", "fixture", "genai build", "genai package", "gguf load", "staging")
_KEY_SUFFIX = re.compile(r"-[0-9a-f]{12}$")
_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


@dataclass
class CacheEntry:
    path: Path
    kind: str  # conversion | fixture | staging
    size: int  # bytes
    age_s: float
    variant: str  # conversions: the folder name without its key (same checkpoint + options)
    reference: str | None = None  # a conversion's twin folder name
    stale: bool = False  # staging only: its owner is gone

    @property
    def name(self) -> str:
        return self.path.name


def folder_size(path: Path) -> int:
    total = 0
    for p in path.rglob("*"):
        try:
            if p.is_file() and not p.is_symlink():
                total += p.stat().st_size
        except OSError:
            pass
    return total


def _reference_of(folder: Path) -> str | None:
    try:
        spec = yaml.safe_load((folder / "package.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    ref = spec.get("reference") if isinstance(spec, dict) else None
    return ref.get("folder") if isinstance(ref, dict) else None


def cache_entries(now: float | None = None) -> list[CacheEntry]:
    """Everything under the caches, oldest first: each folder of a cache that holds its
    kind's marker file (whose time is the folder's age)."""
    from engines.backends.genai_build import BUILD_FILE, cache_folder
    from engines.backends.hf import gguf_load_folder
    from fixtures.cache import CACHE_ENV, REPO_ROOT, cache_root
    from fixtures.staging import find_staging
    from harness.convert.cache import converted_root
    from harness.convert.writer import SIDECAR

    now = time.time() if now is None else now
    out: list[CacheEntry] = []
    staged = [cache_root(), converted_root()]  # where builds stage beside their folders
    roots = [(cache_root(), "fixture", "package.yaml"), (converted_root(), "conversion", SIDECAR),
             (cache_folder(), "genai build", BUILD_FILE),
             (cache_folder(), "genai package", "package.yaml"),
             (gguf_load_folder(), "gguf load", "model.safetensors")]
    if not os.environ.get(CACHE_ENV):  # the layout before .lockstep/fixtures: still on disk
        legacy = REPO_ROOT / ".lockstep"
        staged += [legacy, legacy / "converted"]
        roots += [(legacy, "fixture", "package.yaml"),
                  (legacy / "converted", "conversion", SIDECAR)]
    for root in staged:
        for found in find_staging(root, now):
            out.append(CacheEntry(found.path, "staging", folder_size(found.path), found.age_s,
                                  found.name, stale=found.stale))
    for root, kind, marker in roots:
        if not root.is_dir():
            continue
        for folder in sorted(root.iterdir()):
            stamp = folder / marker
            if folder.name.startswith(".") or not stamp.is_file() or \
                    (kind == "conversion" and not (folder / "package.yaml").is_file()):
                continue
            try:
                age = now - stamp.stat().st_mtime
            except OSError:
                continue
            out.append(CacheEntry(folder, kind, folder_size(folder), age,
                                  _KEY_SUFFIX.sub("", folder.name),
                                  _reference_of(folder) if kind == "conversion" else None))
    return sorted(out, key=lambda e: -e.age_s)


def parse_size(text: str, option: str = "--max-size") -> int:
    """``"2G"``, ``"500M"``, ``"1.5T"``, ``"1000"`` (bytes) -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text or "", re.IGNORECASE)
    if m is None:
        raise InputError("not a size", field=option, value=text,
                         remedy="write a number with an optional unit K, M, G or T: 500M, 2G")
    return int(float(m[1]) * _UNITS[m[2].upper()])


def select_prune(entries: list[CacheEntry], *, older_than_s: float | None = None,
                 max_bytes: int | None = None, keep: int | None = None) -> list[CacheEntry]:
    """The entries to remove: stale staging folders always; conversions older than
    ``older_than_s``, beyond the newest ``keep`` of each variant, and then the oldest until
    the conversions fit in ``max_bytes``. A reference twin of a kept conversion stays."""
    if older_than_s is None and max_bytes is None and keep is None:
        raise InputError("prune needs a rule", field="--older-than|--max-size|--keep", value=None,
                         remedy="pass --older-than DAYS, --max-size SIZE or --keep N")
    if keep is not None and keep < 0:
        raise InputError("--keep must be 0 or more", field="--keep", value=keep,
                         remedy="pass --keep N with N >= 0")
    if older_than_s is not None and older_than_s < 0:
        raise InputError("--older-than must be 0 or more", field="--older-than",
                         value=older_than_s / 86400, remedy="pass --older-than DAYS, DAYS >= 0")
    conversions = sorted((e for e in entries if e.kind == "conversion"), key=lambda e: e.age_s)
    doomed = {e.path for e in conversions if older_than_s is not None and e.age_s > older_than_s}
    if keep is not None:
        seen: dict[str, int] = {}
        for e in conversions:  # newest first
            seen[e.variant] = seen.get(e.variant, 0) + 1
            if seen[e.variant] > keep:
                doomed.add(e.path)
    by_name = {e.name: e for e in conversions}

    def needed(twin: CacheEntry) -> bool:  # the reference of a package that stays
        return any(e.reference == twin.name and e.path not in doomed for e in conversions)

    if max_bytes is not None:
        total = sum(e.size for e in conversions if e.path not in doomed or needed(e))
        for e in reversed(conversions):  # oldest first
            if total <= max_bytes:
                break
            if e.path not in doomed and not needed(e):
                doomed.add(e.path)
                total -= e.size
    for e in conversions:  # a kept package keeps its twin
        if e.path not in doomed and e.reference in by_name:
            doomed.discard(by_name[e.reference].path)
    chosen = [e for e in entries if e.kind == "staging" and e.stale]
    return chosen + [e for e in conversions if e.path in doomed]


def remove(entries: list[CacheEntry]) -> int:
    """Delete the entries' folders; return the bytes freed."""
    freed = 0
    for e in entries:
        shutil.rmtree(e.path, ignore_errors=True)
        if not e.path.exists():
            freed += e.size
    return freed


def human_size(n: int) -> str:
    unit = max((u for u in ("K", "M", "G", "T") if n >= _UNITS[u]), key=_UNITS.get, default="")
    return f"{n}B" if not unit else f"{n / _UNITS[unit]:.1f}{unit}"


def human_age(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"
