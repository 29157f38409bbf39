"""The package content hash: one sha256 over every file of the folder, the same on every machine.

Evidence records carry it so two runs can be shown to have used byte-identical packages.
It depends only on relative paths (POSIX form, UTF-8, sorted bytewise) and file bytes, never
on creation order, timestamps, permissions or the folder's own location. Each path and each
content is length-prefixed, so no two different folders can feed sha256 the same stream.
A symbolic link is hashed as a link (its target text), never followed: a link cannot pull in
bytes from outside the folder, and a loop cannot hang the walk.

A folder's hash is remembered by the identity of each of its files (``file_identity``): a
run loads the same package for the oracle, each engine and each record, and hashing a real
checkpoint's package reads hundreds of megabytes.
"""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from engines.package.file_identity import IdentityMemo, identity

_CHUNK = 1 << 20
_HASHES = IdentityMemo()


def _entries(folder: Path) -> list[tuple[bytes, Path]]:
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        base = Path(dirpath)
        # a symlink to a directory is listed in dirnames and never descended into
        for name in [*filenames, *(d for d in dirnames if (base / d).is_symlink())]:
            full = base / name
            rel = full.relative_to(folder).as_posix().encode("utf-8", "surrogateescape")
            found.append((rel, full))
    found.sort(key=lambda item: item[0])
    return found


def _frame(h: "hashlib._Hash", tag: bytes, payload_len: int) -> None:
    h.update(tag + payload_len.to_bytes(8, "big"))


def package_content_hash(folder: str | os.PathLike) -> str:
    """``"sha256:<hex>"`` over the sorted relative paths and bytes of every file in ``folder``."""
    folder = Path(folder)
    if not folder.is_dir():
        raise NotADirectoryError(f"package_content_hash needs a folder, got {folder}")
    entries = [(rel, full, os.lstat(full)) for rel, full in _entries(folder)]
    key = ("folder", str(folder.resolve()), tuple((rel, identity(st)) for rel, _, st in entries))
    return _HASHES.get(key, lambda: _folder_hash(entries))


def _folder_hash(entries: list[tuple[bytes, Path, os.stat_result]]) -> str:
    h = hashlib.sha256()
    h.update(b"lockstep-package-v1\0")
    for rel, full, st in entries:
        mode = st.st_mode
        if stat.S_ISLNK(mode):
            target = os.readlink(full).encode("utf-8", "surrogateescape")
            _frame(h, b"L", len(rel))
            h.update(rel)
            _frame(h, b"T", len(target))
            h.update(target)
        elif stat.S_ISREG(mode):
            _frame(h, b"F", len(rel))
            h.update(rel)
            with open(full, "rb") as f:
                _frame(h, b"C", os.fstat(f.fileno()).st_size)
                while chunk := f.read(_CHUNK):
                    h.update(chunk)
        # sockets, fifos and devices hold no package content: skipped
    return f"sha256:{h.hexdigest()}"


def checkpoint_hash(path: str | os.PathLike) -> str:
    """``"sha256:<hex>"`` of a checkpoint: a file's bytes (a GGUF), or a folder's files as
    :func:`package_content_hash` hashes them (a Hugging Face folder). The converter records
    it; engines that build from the checkpoint find the file again by it."""
    path = Path(path)
    if path.is_dir():
        return package_content_hash(path)
    key = ("file", str(path.resolve()), identity(path.stat()))
    return _HASHES.get(key, lambda: _file_hash(path))


def _file_hash(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return f"sha256:{digest.hexdigest()}"
