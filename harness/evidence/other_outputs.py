"""JSON files the other lockstep commands write, told apart from evidence records by their
``"kind"``: one given where a record belongs is named for what it is and the command that
reads it, never called a damaged record for the user to delete."""
from __future__ import annotations

from typing import Any


# kind: (what the file is, the command that reads it, if one does). The kinds are the
# writers' own ``KIND`` constants (harness.bench, forward_bench, judge_bench, calibrate,
# forensics.explanation), written out because those modules read evidence themselves;
# suites/test_forensics.py checks that the two agree.
OUTPUTS: dict[str, tuple[str, str | None]] = {
    "lockstep-bench": ("a bench result (lockstep bench --json)", "lockstep report --bench"),
    "lockstep-bench-forward": ("a forward bench result (lockstep bench-forward --json)", None),
    "lockstep-bench-judge": ("a judge bench result (lockstep bench-judge --json)", None),
    "lockstep-calibrate": ("a calibration result (lockstep calibrate --json)", None),
    "lockstep-explanation": ("an explanation (lockstep explain --json)",
                             "lockstep report, from <evidence>/forensics/"),
}


def the_remedy(reader: str | None) -> str:
    """Where a record comes from, and where the file given reads instead."""
    return ("give a cell's record, <evidence>/<cell>.json as lockstep run wrote it" +
            (f"; this file is read by {reader}" if reader else ""))


def other_output(data: Any) -> tuple[str, str | None] | None:
    """(what the file is, the command that reads it) for parsed JSON another lockstep command
    wrote; None for anything else."""
    kind = data.get("kind") if isinstance(data, dict) else None
    return OUTPUTS.get(kind) if isinstance(kind, str) else None


__all__ = ["OUTPUTS", "other_output", "the_remedy"]
