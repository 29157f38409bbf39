"""The run manifest: the cells a run planned, written before the first cell and marked
complete after the last, so a run that was killed shows as incomplete, never as green.

Manifests live in ``<evidence dir>/runs/<run_id>.json``, beside the records (which
``evidence_files`` reads from the folder itself, not from ``runs/``).
"""
from __future__ import annotations

import os
import tempfile
from datetime import datetime
from pathlib import Path
from typing import Literal

from pydantic import (AwareDatetime, BaseModel, ConfigDict, Field, StrictBool, ValidationError,
                      ValidationInfo, field_validator)

from engines import json_text
from engines.errors import LockstepError
from harness.evidence.schema import run_time
from harness.evidence.store import file_mode, first_error

RUNS = "runs"


class PlannedCell(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    package: str
    engine: str
    mode: str
    prompt: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.package, self.engine, self.mode, self.prompt)


class LeftOutCells(BaseModel):
    """Cells a run did not plan for one engine, package and mode, and why
    (``harness.plan.LeftOut``): by the engine's ``declaration`` (outside the plan) or because
    this ``machine`` cannot run the engine (inside the plan, outside this run)."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    engine: str
    package: str
    mode: str
    reason: str
    cells: int = Field(ge=1)
    decided_by: Literal["declaration", "machine"]


class ShardShare(BaseModel):
    """A shard's share of a plan (``lockstep run --shard I/N``): cells ``start..end-1`` of the
    plan's ``plan_cells``, in plan order. The shards of one plan share its digest."""
    model_config = ConfigDict(extra="forbid", frozen=True)
    index: int = Field(ge=1)
    count: int = Field(ge=1)
    plan_cells: int = Field(ge=0)
    start: int = Field(ge=0)
    end: int = Field(ge=0)

    @property
    def label(self) -> str:
        return f"{self.index}/{self.count}"


class RunManifest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    run_id: str = Field(min_length=1)  # and the file's name (``manifest_path``)
    started: AwareDatetime
    command: list[str] = Field(default_factory=list)
    planned: list[PlannedCell]
    complete: StrictBool = False  # "yes" is a hand edit, not a run's word
    finished: AwareDatetime | None = None
    plan_digest: str | None = None  # what identifies the plan (harness.plan.plan_digest)
    shard: ShardShare | None = None  # this run's share, when the plan was sharded
    left_out: list[LeftOutCells] = Field(default_factory=list)  # what was not planned, why

    @field_validator("started", "finished")
    @classmethod
    def _written_by_a_run(cls, value: datetime | None, info: ValidationInfo):
        return value if value is None else run_time(value, info.field_name)

    @field_validator("finished")
    @classmethod
    def _finished_after_started(cls, value: datetime | None, info: ValidationInfo):
        started = info.data.get("started")
        if value is not None and started is not None and value < started:
            raise ValueError(f"the run finished ({value.isoformat()}) before it started "
                             f"({started.isoformat()})")
        return value


def manifest_path(folder: str | os.PathLike, run_id: str) -> Path:
    return Path(folder) / RUNS / f"{run_id}.json"


def write_manifest(folder: str | os.PathLike, manifest: RunManifest) -> Path:
    """Write (or rewrite) the manifest atomically: temp file, fsync, rename."""
    target = manifest_path(folder, manifest.run_id)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".", suffix=".tmp")
    try:
        os.fchmod(fd, file_mode())  # as any file the user's umask makes, not mkstemp's 0600
        with os.fdopen(fd, "wb") as handle:
            handle.write(manifest.model_dump_json(indent=1).encode())
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def read_manifests(folder: str | os.PathLike) -> list[RunManifest]:
    """Every manifest under ``folder/runs`` (none: an empty list), oldest first."""
    runs = Path(folder) / RUNS
    if runs.exists() and not runs.is_dir():  # the manifests are lost: coverage is unknown
        raise LockstepError(f"{RUNS} is a file, where the folder of run manifests belongs",
                            where=str(runs), field=RUNS,
                            remedy=f"move the file away; a run writes {RUNS}/<run id>.json")
    if not runs.is_dir():
        return []
    out = []
    for path in sorted(runs.glob("*.json")):
        try:
            data = json_text.loads(path.read_text())
        except ValueError as exc:  # not JSON at all, or cut short: the write was interrupted
            raise LockstepError(f"unreadable run manifest ({type(exc).__name__})",
                                where=str(path),
                                remedy="the run was interrupted while writing it; re-run "
                                       "or delete the file") from exc
        out.append(_validated(data, path))
    return sorted(out, key=lambda m: m.started)


def _validated(data: object, path: Path) -> RunManifest:
    """A manifest that is JSON but not a manifest was edited or damaged, not cut short: the
    line names pydantic's first error: its field, and the value found there (none when the
    field is missing or the whole file is the wrong shape)."""
    try:
        manifest = RunManifest.model_validate(data)
    except ValidationError as exc:
        message, loc, value = first_error(exc, shown=lambda value: value)
        raise LockstepError(f"invalid run manifest: {message}", field=loc or "<manifest>",
                            value=value, where=str(path),
                            remedy="fix or delete the file") from exc
    if manifest.run_id != path.stem:  # records find their run by it: another run's, or none
        raise LockstepError("invalid run manifest: run_id is not the file's name",
                            field="run_id", value=manifest.run_id, where=str(path),
                            remedy=f"a run writes {RUNS}/<run_id>.json; restore run_id "
                                   f"{path.stem!r} or delete the file")
    return manifest


def finish(folder: str | os.PathLike, manifest: RunManifest, when: datetime) -> Path:
    manifest.complete = True
    manifest.finished = when
    return write_manifest(folder, manifest)
