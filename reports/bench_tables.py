"""``lockstep bench --json`` files as the report's speed section: each file one table, as the
bench printed it (every row of a table timed in one process, ratios taken within it).

The file is read through a pydantic schema of the fields the section shows, so a file that is
not a bench file, or one from a newer layout, is refused with the field that is wrong."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from engines import json_text
from engines.errors import LockstepError
from harness.bench import FORMAT


class BenchRowFile(BaseModel):
    """One row of a bench file (the fields the report shows; the rest are kept in the file)."""
    model_config = ConfigDict(extra="ignore")
    engine: str
    package: str
    mode: str
    status: str
    reason: str | None = None
    prompt_set: str = ""  # layout 3: the prompts the row was timed on
    compute_dtype: str = ""  # layout 3: what the engine computed in
    tokens_per_s_median: float | None = None
    prefill_ms: float | None = None
    decode_ms: float | None = None
    decode_tokens_per_s: float | None = None
    tokens_per_step: float | None = None
    floor_ms: float | None = None
    x_floor: float | None = None
    ratio: float | None = None
    decode_ratio: float | None = None
    baseline: str | None = None
    ratios: dict[str, float] = {}  # to the baseline and each compared engine (--compare-to)
    accept_rate: float | None = None  # speculative rows (layout 3)
    greedy_ratio: float | None = None
    same_tokens: bool | None = None


class BenchFile(BaseModel):
    model_config = ConfigDict(extra="ignore")
    format: int
    kind: Literal["lockstep-bench"]
    environment: dict[str, Any] = {}
    settings: dict[str, Any] | None = None
    rows: list[BenchRowFile]


class BenchTable(BaseModel):
    """One file as the report shows it."""
    name: str
    caption: str
    machine: str
    rows: list[BenchRowFile]
    compare_to: list[str] = []  # the engines beside the baseline, a ratio column each


def load_bench(path: str | os.PathLike) -> BenchTable:
    """A bench JSON file as one table; a file that is not one is a ``LockstepError`` naming
    the file and the field."""
    path = Path(path)
    remedy = "pass a file written by lockstep bench --json"
    try:
        data = json_text.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise LockstepError(f"cannot read the bench file ({exc.strerror or exc})",
                            field="--bench", value=str(path), remedy=remedy) from exc
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise LockstepError(f"the bench file is not JSON ({exc})", field="--bench",
                            value=str(path), remedy=remedy) from exc
    try:
        parsed = BenchFile.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "(top level)"
        raise LockstepError(f"{path.name} is not a lockstep bench file: {where}: "
                            f"{first['msg']}", field=f"--bench {where}",
                            value=str(first.get("input"))[:80], remedy=remedy) from exc
    if parsed.format > FORMAT:
        raise LockstepError(f"{path.name} has bench layout {parsed.format}; this lockstep "
                            f"reads up to {FORMAT}", field="--bench format",
                            value=parsed.format, remedy="render it with a newer lockstep")
    compare = [str(name) for name in (parsed.settings or {}).get("compare_to") or ()]
    return BenchTable(name=path.name, caption=_caption(parsed.settings),
                      machine=_machine(parsed.environment), rows=parsed.rows,
                      compare_to=compare)


def _caption(settings: dict[str, Any] | None) -> str:
    """What the bench printed above its table, from the file's settings."""
    if not settings:
        return "settings not recorded"
    parts = [str(settings.get("mode", "greedy")),
             f"{settings.get('max_new_tokens')} new tokens"]
    if settings.get("ignore_eos"):
        parts.append("eos ignored")
    if settings.get("pipelined"):
        parts.append("pipelined")
    parts.append(f"median of {settings.get('repeats')}")
    if settings.get("warmup_steps") is not None:
        parts.append(f"steady decode after {settings['warmup_steps']} warm-up steps")
    if settings.get("baseline"):
        to = ", ".join([settings["baseline"], *(settings.get("compare_to") or ())])
        parts.append(f"ratio to {to} in this run")
    return ", ".join(parts)


def _machine(environment: dict[str, Any]) -> str:
    gpu = environment.get("gpu_name")
    commit = environment.get("git_commit")
    return " · ".join(x for x in (gpu or environment.get("platform"),
                                  f"commit {commit}" if commit else None) if x)


__all__ = ["BenchFile", "BenchRowFile", "BenchTable", "load_bench"]
