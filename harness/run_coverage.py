"""Do the records of a run match the manifest that planned it?

A report counts each (run id, cell) once. A record copied under a second name (a
duplicate: the same run id, package, engine, mode and prompt) is flagged and counted once;
a run whose records do not match its plan (planned cells without a record, records of cells
it never planned, cells recorded twice) is named, with its counts. ``harness.shards`` asks
the same question of the shards of one plan.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from harness.evidence import EvidenceRecord
from harness.judge import SEVERITY
from harness.manifest import PlannedCell, RunManifest

CellKey = tuple[str, str, str, str]  # package, engine, mode label, prompt name


def record_key(record: EvidenceRecord) -> CellKey:
    return (record.package.name, record.engine, record.mode.label, record.prompt.name)


@dataclass(frozen=True)
class Duplicate:
    """One cell of one run recorded more than once; ``files`` as found ("" where unknown)."""
    run_id: str
    cell: CellKey
    files: tuple[str, ...]

    @property
    def extra(self) -> int:
        return len(self.files) - 1

    def describe(self) -> str:
        named = [f for f in self.files if f]
        return (f"run {self.run_id}: {' · '.join(self.cell)} recorded {len(self.files)} times"
                + (f" ({', '.join(named)})" if named else "") + ", counted once")


def drop_duplicates(records: Sequence[EvidenceRecord],
                    paths: Sequence[str | Path] | None = None
                    ) -> tuple[list[EvidenceRecord], list[Duplicate]]:
    """One record per (run id, cell), in the order given, and the cells recorded more than
    once. Of copies that disagree the worst status is kept: a duplicate never hides a
    failure. ``paths``: each record's file, to name them."""
    names = [str(p) for p in paths] if paths is not None else [""] * len(records)
    groups: dict[tuple[str, CellKey], list[int]] = defaultdict(list)
    for i, record in enumerate(records):
        groups[(record.run_id, record_key(record))].append(i)
    kept, duplicates = set(), []
    for (run_id, cell), members in groups.items():
        kept.add(min(members, key=lambda i: (SEVERITY.index(records[i].status), i)))
        if len(members) > 1:
            duplicates.append(Duplicate(run_id, cell, tuple(names[i] for i in members)))
    return [r for i, r in enumerate(records) if i in kept], duplicates


@dataclass
class RunCoverage:
    """One manifest against the records of its run (duplicates already dropped)."""
    manifest: RunManifest
    missing: list[PlannedCell] = field(default_factory=list)  # planned, no record
    unplanned: list[CellKey] = field(default_factory=list)  # recorded, never planned
    duplicates: int = 0  # extra copies of cells recorded more than once

    @property
    def planned(self) -> int:
        return len(self.manifest.planned)

    @property
    def recorded(self) -> int:
        """Planned cells that have a record."""
        return self.planned - len(self.missing)

    @property
    def records(self) -> int:
        """Record files of this run, copies included."""
        return self.recorded + len(self.unplanned) + self.duplicates

    @property
    def incomplete(self) -> bool:
        return not self.manifest.complete or bool(self.missing)

    @property
    def mismatched(self) -> bool:
        """More records than the plan has cells for: copies, or cells it never planned."""
        return bool(self.unplanned or self.duplicates)

    def describe(self) -> str:
        """What does not match, to follow "run RUN_ID" (empty when the run matches its plan):
        "is INCOMPLETE: ..." and/or "has 7 record(s) for 6 planned cell(s): ..."."""
        parts = []
        if self.incomplete:
            parts.append(f"is INCOMPLETE: {self.recorded} of {self.planned} planned cell(s) "
                         f"recorded" + ("" if self.manifest.complete else
                                        "; its manifest was never marked complete"))
        if self.mismatched:
            why = ([f"{self.duplicates} duplicate(s)"] * bool(self.duplicates)
                   + [f"{len(self.unplanned)} record(s) of cell(s) it did not plan"]
                   * bool(self.unplanned))
            parts.append(f"has {self.records} record(s) for {self.planned} planned cell(s): "
                         + ", ".join(why))
        return "; and ".join(parts)


def run_coverage(records: Sequence[EvidenceRecord], manifests: Sequence[RunManifest],
                 duplicates: Sequence[Duplicate] = ()) -> list[RunCoverage]:
    """Each manifest's coverage by ``records`` (one per run and cell: ``drop_duplicates``),
    in the manifests' order; ``duplicates`` are counted against their run."""
    have: dict[str, set[CellKey]] = defaultdict(set)
    for r in records:
        have[r.run_id].add(record_key(r))
    copies: dict[str, int] = defaultdict(int)
    for d in duplicates:
        copies[d.run_id] += d.extra
    out = []
    for m in manifests:
        planned = {c.key for c in m.planned}
        out.append(RunCoverage(m, [c for c in m.planned if c.key not in have[m.run_id]],
                               sorted(have[m.run_id] - planned), copies[m.run_id]))
    return out


__all__ = ["CellKey", "Duplicate", "RunCoverage", "drop_duplicates", "record_key",
           "run_coverage"]
