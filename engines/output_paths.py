"""Output paths, checked before the work they would receive, so that no user file is lost.

One rule for every command that writes an output (``repro -o``, ``convert -o``,
``import-genai -o``, ``report -o``, ``bench --json``, ``explain --json/--plot``): a folder is
written only when it is new or empty, a file is replaced only when lockstep itself wrote it
(its writer's marker in its first bytes); anything else is refused unless the user adds
``--force``. The path must also be one that can be written: not a folder where a file is
asked for (or the other way round), under a writable folder. Each refusal is one
``InputError`` naming the option, the path and the remedy, raised before any work starts.
"""
from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from engines.errors import InputError

HEAD_BYTES = 4096  # a writer's marker must sit in a file's first bytes


def lockstep_wrote(path: Path, marker: str) -> bool:
    """Whether ``path`` is a file whose first ``HEAD_BYTES`` hold ``marker``."""
    try:
        with open(path, "rb") as fh:
            return marker.encode() in fh.read(HEAD_BYTES)
    except OSError:
        return False


def _writable_ancestor(path: Path, option: str, start: Path) -> None:
    """The nearest existing folder from ``start`` up must be a writable folder (the folders
    between are created when the output is written)."""
    for above in (start, *start.parents):
        if not above.exists():
            continue
        if not above.is_dir():
            raise InputError(f"{option}: {above} is a file, not a folder", field=option,
                             value=str(path), remedy="choose a path under a folder")
        refused = None if os.access(above, os.W_OK | os.X_OK) else "permission denied"
        if refused is None:
            try:  # root passes os.access everywhere, even where the file system refuses
                # (/proc, a read-only mount): a file made there answers for it
                with tempfile.TemporaryFile(dir=above):
                    pass
            except OSError as exc:
                refused = exc.strerror or str(exc)
        if refused is not None:
            raise InputError(f"{option}: the folder {above} is not writable ({refused})",
                             field=option, value=str(path),
                             remedy="choose a path in a folder you can write to")
        return


def check_output_file(path: str | os.PathLike, option: str, *, marker: str,
                      force: bool = False, example: str = "output") -> Path:
    """``path`` may receive a file: it is not a folder, its folder can be written, and it is
    new, or a file lockstep wrote (``marker`` in its first bytes), or ``force``.
    ``example``: a file name for the remedy when ``path`` is a folder."""
    path = Path(path).expanduser()
    if path.is_dir():
        raise InputError(f"{option} names a folder, not a file", field=option,
                         value=str(path), remedy=f"name a file, e.g. {option} "
                                                 f"{path / example}")
    _writable_ancestor(path, option, path.parent)
    if path.exists() and not force and not lockstep_wrote(path, marker):
        raise InputError(f"{option} names an existing file that lockstep did not write; it "
                         f"would be overwritten", field=option, value=str(path),
                         remedy=f"choose another path, or add --force to replace it")
    return path


def check_output_folder(path: str | os.PathLike, option: str, *, force: bool = False,
                        ours: Callable[[Path], bool] | None = None,
                        forced: str = "replace it") -> Path:
    """``path`` may receive a folder: it is not a file, its parent can be written, and it is
    new, or empty, or one lockstep wrote (``ours(path)``), or ``force`` (``forced`` says
    what --force then does, for the remedy)."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise InputError(f"{option} names a file, not a folder", field=option,
                         value=str(path), remedy=f"name a new or empty folder for {option}")
    _writable_ancestor(path, option, path)
    if path.is_dir() and not force and not (ours is not None and ours(path)):
        held = sorted(p.name for p in path.iterdir())
        if held:
            shown = ", ".join(held[:3]) + (f" and {len(held) - 3} more" if len(held) > 3
                                           else "")
            raise InputError(f"{option} names a folder that already holds {shown}; they "
                             f"could be overwritten", field=option, value=str(path),
                             remedy=f"choose a new or empty folder, or add --force to "
                                    f"{forced}")
    return path


def check_apart(path: str | os.PathLike, source: str | os.PathLike, option: str,
                what: str) -> None:
    """An output ``path`` is not the ``source`` it is made from (``what``: "checkpoint",
    "build"), nor a folder holding it, nor inside it: even with ``--force``, replacing it
    would remove the user's input (or write into it)."""
    path, source = Path(path).expanduser().resolve(), Path(source).expanduser().resolve()
    relation = ("is" if path == source else "holds" if path in source.parents else
                "lies inside" if source in path.parents else None)
    if relation is not None:
        raise InputError(f"{option} {relation} the {what} it would be written from",
                         field=option, value=str(path),
                         remedy=f"write to a folder outside {source}")


__all__ = ["HEAD_BYTES", "check_apart", "check_output_file", "check_output_folder",
           "lockstep_wrote"]
