"""JSON files the other lockstep commands write, told apart from evidence records by their
``"kind"``: one given where a record belongs is named for what it is and the command that
reads it, never called a damaged record for the user to delete."""
from __future__ import annotations

from typing import Any


def _outputs() -> dict[str, tuple[str, str | None]]:
    """kind: (what the file is, the command that reads it, if one does); imported late, as
    these modules read evidence themselves."""
    from harness import bench, calibrate, forward_bench, judge_bench
    from harness.forensics import explanation

    return {bench.KIND: ("a bench result (lockstep bench --json)", "lockstep report --bench"),
            forward_bench.KIND: ("a forward bench result (lockstep bench-forward --json)", None),
            judge_bench.KIND: ("a judge bench result (lockstep bench-judge --json)", None),
            calibrate.KIND: ("a calibration result (lockstep calibrate --json)", None),
            explanation.KIND: ("an explanation (lockstep explain --json)",
                               "lockstep report, from <evidence>/forensics/")}


def the_remedy(reader: str | None) -> str:
    """Where a record comes from, and where the file given reads instead."""
    return ("give a cell's record, <evidence>/<cell>.json as lockstep run wrote it" +
            (f"; this file is read by {reader}" if reader else ""))


def other_output(data: Any) -> tuple[str, str | None] | None:
    """(what the file is, the command that reads it) for parsed JSON another lockstep command
    wrote; None for anything else."""
    kind = data.get("kind") if isinstance(data, dict) else None
    return _outputs().get(kind) if isinstance(kind, str) else None


__all__ = ["other_output", "the_remedy"]
