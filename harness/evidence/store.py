"""Writing and reading evidence files: atomic, collision-free, and loud about bad files.

A run killed mid-write must never leave half a record where a report would read it, and
parallel workers (pytest-xdist, several machines on one share) write into one folder. So
each record goes to a hidden temp file in the target folder, is fsynced, then renamed onto
a name that carries a random fragment. Readers skip hidden files.
"""
from __future__ import annotations

import errno
import json
import os
import re
import tempfile
import uuid
from pathlib import Path

from pydantic import ValidationError

from engines import json_text
from engines.errors import LockstepError

from .other_outputs import other_output, the_remedy
from .schema import FROM_FILE, SCHEMA_VERSION, EvidenceRecord

SUFFIX = ".json"
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


class EvidenceError(LockstepError):
    """An evidence file or folder cannot be read as evidence of this schema version."""


def _slug(text: str) -> str:
    return _UNSAFE.sub("-", text).strip("-.")[:48] or "x"


def evidence_file_name(record: EvidenceRecord) -> str:
    """run_id + package + engine + mode + prompt + a uuid fragment: unique in one folder."""
    parts = (record.run_id, record.package.name, record.engine, record.mode.label,
             record.prompt.name, uuid.uuid4().hex[:12])
    return "__".join(_slug(p) for p in parts) + SUFFIX


_WHY = {errno.ENOSPC: ("the disk is full", "free space there"),
        errno.EDQUOT: ("the disk quota is exhausted", "free space there"),
        errno.EACCES: ("the folder is not writable", "fix its permissions"),
        errno.EPERM: ("the folder is not writable", "fix its permissions"),
        errno.EROFS: ("the folder is on a read-only file system", "use a writable disk"),
        errno.ENOTDIR: ("a part of the path is a file, not a folder", "use a folder path"),
        errno.EEXIST: ("the path is a file, not a folder", "use a folder path"),
        errno.ENOENT: ("a parent folder is missing and cannot be created",
                       "create the parent first")}


class EvidenceWriteError(EvidenceError, OSError):
    """The evidence folder refused a write (full disk, permissions, a file in the way): a
    one-line ``LockstepError`` for the CLI, and still the ``OSError`` it was (same errno)."""

    def __str__(self) -> str:  # OSError's own form would drop the field and the remedy
        return self.render()


def evidence_write_error(exc: OSError, folder: Path, field: str = "--evidence-dir"
                         ) -> EvidenceWriteError:
    """An ``OSError`` met while writing evidence, as one line naming the folder, what the
    system said and what to do (the run stops: a record that cannot be written is lost)."""
    what, fix = _WHY.get(exc.errno, (exc.strerror or str(exc), "check the folder"))
    err = EvidenceWriteError(f"cannot write evidence: {what} ({exc.strerror or exc})",
                             field=field, value=str(folder),
                             remedy=f"{fix}, pass another {field}, or run with --no-evidence")
    err.errno, err.strerror, err.filename = exc.errno, exc.strerror, exc.filename
    return err


def prepare_evidence_dir(folder: str | os.PathLike, field: str = "--evidence-dir") -> Path:
    """Create ``folder`` (with its parents) and prove a file can be created in it, so a bad
    evidence folder fails before the first cell runs, not after the first verdict."""
    folder = Path(folder)
    try:
        if folder.exists() and not folder.is_dir():
            raise FileExistsError(errno.EEXIST, "File exists", str(folder))
        folder.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=folder, prefix=".", suffix=".probe")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise evidence_write_error(exc, folder, field) from exc
    return folder


def file_mode() -> int:
    """The mode the umask gives a new file (0644 typically): ``mkstemp`` makes its temp file
    0600, and evidence renamed from it would stay unreadable to anyone else."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def _write_all(fd: int, payload: bytes) -> None:
    """Write every byte and make it durable (a full disk raises here, often at fsync)."""
    os.fchmod(fd, file_mode())
    with os.fdopen(fd, "wb") as handle:
        handle.write(payload)
        handle.flush()
        os.fsync(handle.fileno())


def write_evidence(record: EvidenceRecord, folder: str | os.PathLike) -> Path:
    """Write ``record`` atomically into ``folder`` (created if missing); return its path.
    A folder that cannot take it (full, unwritable, a file) is an ``EvidenceError``."""
    folder = Path(folder)
    payload = record.model_dump_json(indent=2).encode("utf-8")
    target = folder / evidence_file_name(record)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(dir=folder, prefix=".", suffix=".tmp")
    except OSError as exc:
        raise evidence_write_error(exc, folder) from exc
    try:
        _write_all(fd, payload)
        if target.exists():  # a uuid collision: astronomically unlikely, never overwrite
            raise FileExistsError(target)
        os.replace(tmp_name, target)
    except BaseException as exc:
        try:
            os.unlink(tmp_name)
        except FileNotFoundError:
            pass
        if isinstance(exc, OSError) and not isinstance(exc, FileExistsError):
            raise evidence_write_error(exc, folder) from exc
        raise
    _fsync_dir(folder)
    return target


def _fsync_dir(folder: Path) -> None:
    """Make the rename durable; not every platform can open a directory, which is fine."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def first_error(exc: ValidationError, shown=_short) -> tuple[str, str, object]:
    """pydantic's first error as (message, the field's dotted path, the value found there as
    ``shown`` gives it): a consistency check between fields names the field it is about
    (``ctx['field']``) and no value; a missing field, no value either."""
    first = exc.errors()[0]
    loc = ".".join(str(p) for p in first["loc"])
    named = (first.get("ctx") or {}).get("field")
    if named:
        loc = f"{loc}.{named}" if loc and not named.startswith(loc) else named
    value = None if not loc or named or first["type"] == "missing" else shown(first.get("input"))
    more = f" (and {exc.error_count() - 1} more)" if exc.error_count() > 1 else ""
    return first["msg"] + more, loc, value


def read_evidence(path: str | os.PathLike) -> EvidenceRecord:
    """Read one evidence file; any defect is an EvidenceError naming the file and field."""
    path = Path(path)
    where = str(path)
    if path.is_dir():
        raise EvidenceError("a folder where an evidence file belongs", where=where,
                            remedy="move it out of the evidence folder (a record is a file)")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise EvidenceError(f"cannot read evidence file ({exc.strerror or exc})", where=where,
                            remedy="check the path and permissions") from exc
    try:
        data = json_text.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise EvidenceError(f"not UTF-8 text (byte {exc.start})", where=where,
                            remedy="the file is corrupted; re-run the cell or delete it") from exc
    except json.JSONDecodeError as exc:
        what = "truncated (ends mid-record)" if exc.pos >= len(raw.rstrip()) else "not valid JSON"
        raise EvidenceError(f"{what}: {exc.msg} at line {exc.lineno} column {exc.colno}",
                            where=where,
                            remedy="the file is partial or corrupted; re-run the cell "
                                   "or delete it") from exc
    if not isinstance(data, dict):
        raise EvidenceError(f"top level is a JSON {type(data).__name__}, not an object",
                            where=where, remedy="an evidence file holds one JSON object")
    other = other_output(data)
    if other is not None:
        raise EvidenceError(f"{other[0]}, not an evidence record", where=where,
                            remedy=the_remedy(other[1]))
    missing = [] if "schema_version" in data else [
        name for name, f in EvidenceRecord.model_fields.items()
        if f.is_required() and name not in data]
    if missing:  # no version and no record's fields: not a record at all, of any version
        raise EvidenceError(f"not an evidence record: the required fields "
                            f"{', '.join(missing[:4])}{' ...' if len(missing) > 4 else ''} "
                            f"are missing", field=missing[0], where=where,
                            remedy="an evidence file holds one record as lockstep run wrote "
                                   "it; re-run the cell or delete the file")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise EvidenceError("unsupported evidence schema version", field="schema_version",
                            value=version, where=where,
                            remedy=f"this lockstep reads schema_version {SCHEMA_VERSION}; "
                                   "use the lockstep version that wrote the file")
    try:
        return EvidenceRecord.model_validate(data, context=FROM_FILE)
    except ValidationError as exc:
        message, loc, value = first_error(exc)
        raise EvidenceError(f"invalid evidence: {message}", field=loc or "<record>",
                            value=value, where=where,
                            remedy="fix or delete the file; the schema is "
                                   "harness.evidence.evidence_json_schema()") from exc


def evidence_files(folder: str | os.PathLike) -> list[Path]:
    """The evidence files in ``folder`` (not recursive; hidden temp files skipped), sorted:
    every ``*.json`` entry, so that one that cannot be read (a folder, a broken link) is
    named by ``read_evidence`` instead of missing from the count."""
    folder = Path(folder)
    if not folder.is_dir():
        raise EvidenceError("evidence folder does not exist or is not a folder",
                            where=str(folder), remedy="pass the folder given to --evidence-dir")
    return sorted(p for p in folder.iterdir()
                  if p.suffix == SUFFIX and not p.name.startswith("."))


def load_evidence_files(folder: str | os.PathLike, *, allow_empty: bool = False
                        ) -> list[tuple[Path, EvidenceRecord]]:
    """Every record in ``folder`` with its file; the first bad file raises, naming itself."""
    files = evidence_files(folder)
    if not files and not allow_empty:
        raise EvidenceError(f"no evidence files (*{SUFFIX}) in the folder", where=str(folder),
                            remedy="run `pytest --evidence-dir DIR` or `lockstep run` first")
    return [(p, read_evidence(p)) for p in files]


def load_evidence_dir(folder: str | os.PathLike, *, allow_empty: bool = False
                      ) -> list[EvidenceRecord]:
    """Every record in ``folder``; the first bad file raises, naming itself."""
    return [record for _, record in load_evidence_files(folder, allow_empty=allow_empty)]
