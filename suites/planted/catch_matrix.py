"""The catch matrix (bug x package -> verdict, step): each planted-bug test writes its row,
the session's end gathers them into ``docs/catch_matrix.json`` and ``docs/CATCH_MATRIX.md``
(no timestamps: the files change only when a verdict does). ``lockstep report`` shows it."""
from __future__ import annotations

import json
import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ROWS = ROOT / ".lockstep" / "catch"
JSON_OUT = ROOT / "docs" / "catch_matrix.json"
MD_OUT = ROOT / "docs" / "CATCH_MATRIX.md"
PASSING = ("identical", "near-tie")  # what a control (a harmless change, an honest engine) gets


def observed_step(cells) -> int | None:
    """The first step anything was found at, lowest over the cells (prompts)."""
    steps = [c.first_step for c in cells if c.first_step is not None]
    return min(steps) if steps else None


def observed_status(cells) -> str:
    from harness.judgement import worst

    return worst(*(c.status for c in cells))


def observed_beyond(cells) -> dict | None:
    """For a quantized engine judged by its band: the metric its stream is farthest beyond
    the band on and how many times the bound (the farthest over the cells; whole times from
    10 on, tenths below); None where no cell has a band."""
    found = [c.band.farthest for c in cells if c.band is not None and c.band.farthest]
    if not found:
        return None
    metric, ratio = max(found, key=lambda f: f[1])
    return {"metric": metric, "ratio": int(ratio) if ratio >= 10 else round(ratio, 1)}


def write_row(case, status: str, step: int | None, expected_step: int | None,
              beyond: dict | None = None) -> None:
    ROWS.mkdir(parents=True, exist_ok=True)
    far_enough = case.min_ratio is None or (beyond is not None
                                            and beyond["ratio"] >= case.min_ratio)
    row = {"bug": case.bug.name.removeprefix("planted-"),
           "description": " ".join((case.bug.__doc__ or case.bug.description).split()),
           "package": case.package, "mode": case.mode if case.width is None
           else f"{case.mode}/w{case.width}",
           "expected": {"status": case.status, "step": expected_step},
           "observed": {"status": status, "step": step},
           "caught": status == case.status and step == expected_step and far_enough}
    if beyond is not None:
        row["beyond"] = beyond
    if case.prompts:  # a quantized case: what it was decoded on
        row["prompts"] = [f"{kind}: {text}" for kind, text in case.prompts]
    (ROWS / f"{case.id}.json").write_text(json.dumps(row, indent=1))


def gather(since: float, expected_ids: list[str]) -> dict | None:
    """Every row written since ``since``; None unless each expected case wrote one."""
    if not ROWS.is_dir():
        return None
    fresh = {p.stem: json.loads(p.read_text()) for p in ROWS.glob("*.json")
             if p.stat().st_mtime >= since}
    if set(expected_ids) - set(fresh):
        return None
    rows = [fresh[i] for i in expected_ids]
    return {"rows": [r for r in rows if r["expected"]["status"] not in PASSING],
            "control": [r for r in rows if r["expected"]["status"] in PASSING]}


def markdown(matrix: dict) -> str:
    lines = ["# Catch matrix: planted bugs", "",
             "Written by `suites/test_planted_bugs.py` (`make test`). Each planted bug is a thin",
             "wrapper over `native-host` that breaks one thing (`suites/planted/engines.py`), or",
             "over a quantized engine (`llama-cpp`, `ort-genai-int4`: `harness/mutations.py`),",
             "judged by its scheme's band (`docs/QUANTIZED.md`); `step` is the first step",
             "anything was found at, lowest over the package's prompts; `beyond the band` is",
             "the metric a quantized bug's stream is farthest beyond its band on, in times the",
             "bound (at least 10 to count as caught). The controls are harmless changes, and",
             "the honest quantized engines, that must pass.", "",
             "| bug | package | mode | expected | observed | beyond the band | caught |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for row in matrix["rows"] + matrix["control"]:
        exp, obs = row["expected"], row["observed"]
        fmt = lambda v: v["status"] + ("" if v["step"] is None else f" @ {v['step']}")  # noqa: E731
        far = row.get("beyond")
        far = f"{far['metric']} {far['ratio']}x" if far else ""
        lines.append(f"| {row['bug']} | {row['package']} | {row['mode']} | {fmt(exp)} | "
                     f"{fmt(obs)} | {far} | {'yes' if row['caught'] else '**NO**'} |")
    workloads: dict[tuple, list[str]] = {}
    for row in matrix["rows"] + matrix["control"]:
        if row.get("prompts"):
            names = workloads.setdefault(tuple(row["prompts"]), [])
            if row["bug"] not in names:
                names.append(row["bug"])
    for prompts, bugs in workloads.items():
        shown = ", ".join("`" + p.replace("\n", "\\n") + "`" for p in prompts)
        lines += ["", f"{', '.join(bugs)}: decoded on {shown}."]
    lines += ["", "What each bug does:", ""]
    seen = set()
    for row in matrix["rows"] + matrix["control"]:
        if row["bug"] not in seen:
            seen.add(row["bug"])
            lines.append(f"- `{row['bug']}`: {row['description']}")
    return "\n".join(lines) + "\n"


def publish(matrix: dict) -> bool:
    """Write the two docs files when their content changed; True when written."""
    text = json.dumps(matrix, indent=1) + "\n"
    md = markdown(matrix)
    changed = False
    for path, content in ((JSON_OUT, text), (MD_OUT, md)):
        if not path.exists() or path.read_text() != content:
            tmp = path.with_suffix(path.suffix + ".tmp")
            tmp.write_text(content)
            os.replace(tmp, path)
            changed = True
    return changed
