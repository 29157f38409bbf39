"""The multi-GPU acceptance measurement: the same matrix on one GPU and on every GPU.

``scripts/gpu_run.sh --timing`` runs the matrix twice (``--devices 0``, then ``--devices
all``), timing each run and sampling ``nvidia-smi`` every 0.5 s, then calls

    python -m harness.gpu_timing --one DIR --two DIR --times FILE \
        [--util-one CSV] [--util-two CSV] [--json OUT.json]

which prints the summary (wall times and their ratio, per-GPU utilization and cells, the
cell-for-cell verdict comparison), writes it as JSON, and exits 1 when an acceptance check
fails: the verdicts differ, a GPU was idle during the every-GPU run, or the every-GPU run took
more than ``--max-ratio`` (0.6) of the one-GPU run's wall time.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path

from harness.evidence import load_evidence_dir
from reports.regressions import record_status

MAX_RATIO = 0.6
BUSY_MEAN = 5.0   # % mean utilization during a run for a GPU to count as busy
BUSY_SHARE = 0.25  # and at least this share of the cells' decode time ran on it


def _records(folder: Path):
    return load_evidence_dir(folder)


def cell_key(record) -> str:
    return " · ".join((record.package.name, record.engine, record.mode.label, record.prompt.name))


def compare_verdicts(one: Sequence, two: Sequence) -> dict:
    """Cell for cell: the status (and the token stream) of each cell in both runs."""
    a = {cell_key(r): r for r in one}
    b = {cell_key(r): r for r in two}
    differ = [{"cell": k, "one": record_status(a[k]), "two": record_status(b[k])}
              for k in sorted(a.keys() & b.keys()) if record_status(a[k]) != record_status(b[k])]
    tokens = [k for k in sorted(a.keys() & b.keys()) if a[k].token_digest != b[k].token_digest]
    statuses: dict[str, int] = defaultdict(int)
    for r in one:
        statuses[record_status(r)] += 1
    return {"cells_one": len(a), "cells_two": len(b), "compared": len(a.keys() & b.keys()),
            "only_one": sorted(a.keys() - b.keys()), "only_two": sorted(b.keys() - a.keys()),
            "status_differs": differ, "tokens_differ": tokens, "statuses": dict(statuses),
            "identical": not differ and a.keys() == b.keys()}


def per_gpu(records: Iterable) -> list[dict]:
    """Cells and decode seconds per GPU (by UUID, else index) of one run's records."""
    groups: dict[str, dict] = {}
    for r in records:
        env = r.environment
        key = env.gpu_uuid or (f"GPU {env.gpu_index}" if env.gpu_index is not None else "none")
        g = groups.setdefault(key, {"gpu": key, "index": env.gpu_index, "name": env.gpu_name,
                                    "cells": 0, "decode_s": 0.0})
        g["cells"] += 1
        g["decode_s"] += r.timings.wall_s if r.timings is not None else 0.0
    total = sum(g["decode_s"] for g in groups.values()) or 1.0
    for g in groups.values():
        g["decode_share"] = g["decode_s"] / total
    return sorted(groups.values(), key=lambda g: (g["index"] is None, g["index"], g["gpu"]))


def utilization(path: Path | None) -> list[dict]:
    """Per GPU index from ``nvidia-smi --query-gpu=timestamp,index,uuid,utilization.gpu,
    memory.used --format=csv,noheader,nounits`` samples: count, mean, max, share of samples
    with any kernel running, peak memory (MiB)."""
    if path is None or not Path(path).exists():
        return []
    samples: dict[int, list[tuple[float, float]]] = defaultdict(list)
    uuids: dict[int, str] = {}
    for line in Path(path).read_text(errors="replace").splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 5 or not parts[1].isdigit():
            continue
        try:
            util, mem = float(parts[3]), float(parts[4])
        except ValueError:
            continue
        samples[int(parts[1])].append((util, mem))
        uuids[int(parts[1])] = parts[2]
    out = []
    for index in sorted(samples):
        utils = [u for u, _ in samples[index]]
        out.append({"index": index, "uuid": uuids[index], "samples": len(utils),
                    "mean_util": sum(utils) / len(utils), "max_util": max(utils),
                    "busy_share": sum(u > 0 for u in utils) / len(utils),
                    "peak_memory_mib": max(m for _, m in samples[index])})
    return out


def read_times(path: Path) -> dict[str, dict[str, float]]:
    """``<label> <part>_ns=<n> ...`` lines (written by gpu_run.sh) -> seconds per part."""
    times: dict[str, dict[str, float]] = {}
    for line in Path(path).read_text().splitlines():
        label, *fields = line.split()
        for field in fields:
            name, _, value = field.partition("=")
            if name.endswith("_ns") and value.lstrip("-").isdigit():
                times.setdefault(label, {})[name[:-3]] = int(value) / 1e9
            elif name.endswith("_exit") and value.lstrip("-").isdigit():
                times.setdefault(label, {})[name] = int(value)
    return times


def summarize(one: Path, two: Path, times: Path, util_one: Path | None = None,
              util_two: Path | None = None, max_ratio: float = MAX_RATIO) -> dict:
    rec_one, rec_two = _records(one), _records(two)
    t = read_times(times)
    wall = {label: sum(v for k, v in parts.items() if not k.endswith("_exit"))
            for label, parts in t.items()}
    ratio = wall["two"] / wall["one"] if wall.get("one") and "two" in wall else None
    gpus_two = per_gpu(rec_two)
    util2 = utilization(util_two)
    busy = {}
    for g in gpus_two:
        u = next((x for x in util2 if x["index"] == g["index"]), None)
        busy[g["gpu"]] = (g["decode_share"] >= BUSY_SHARE
                          and (u is None or u["mean_util"] >= BUSY_MEAN))
    verdicts = compare_verdicts(rec_one, rec_two)
    checks = {
        "verdicts identical cell for cell": verdicts["identical"],
        "every GPU busy in the every-GPU run": len(gpus_two) >= 2 and all(busy.values()),
        f"wall time on every GPU at most {max_ratio:g}x one GPU":
            ratio is not None and ratio <= max_ratio,
        "every run exited 0": all(v == 0 for parts in t.values()
                                  for k, v in parts.items() if k.endswith("_exit")),
    }
    return {"times_s": t, "wall_s": wall, "ratio": ratio, "max_ratio": max_ratio,
            "per_gpu_one": per_gpu(rec_one), "per_gpu_two": gpus_two,
            "utilization_one": utilization(util_one), "utilization_two": util2,
            "busy": busy, "verdicts": verdicts, "checks": checks,
            "accepted": all(checks.values())}


def render(summary: dict) -> str:
    lines = ["lockstep multi-GPU timing: the same matrix on one GPU and on every GPU", ""]
    for label, parts in summary["times_s"].items():
        shown = ", ".join(f"{k} {v:.1f} s" for k, v in parts.items() if not k.endswith("_exit"))
        exits = ", ".join(f"{k} {v}" for k, v in parts.items() if k.endswith("_exit"))
        lines.append(f"{label:>4}: {summary['wall_s'][label]:.1f} s ({shown}; {exits})")
    if summary["ratio"] is not None:
        lines.append(f"ratio every-GPU / one-GPU: {summary['ratio']:.3f} "
                     f"(acceptance: at most {summary['max_ratio']:g})")
    for label in ("one", "two"):
        lines += ["", f"cells per GPU ({label}):"]
        for g in summary[f"per_gpu_{label}"]:
            lines.append(f"  {g['gpu']} (index {g['index']}, {g['name']}): {g['cells']} cells, "
                         f"{g['decode_s']:.1f} s decoding ({g['decode_share']:.0%})")
        util = summary[f"utilization_{label}"]
        if util:
            lines.append(f"  nvidia-smi every 0.5 s ({label}):")
        for u in util:
            lines.append(f"    GPU {u['index']} {u['uuid']}: {u['samples']} samples, mean "
                         f"{u['mean_util']:.1f} %, max {u['max_util']:.0f} %, kernels running "
                         f"in {u['busy_share']:.0%} of samples, peak {u['peak_memory_mib']:.0f} MiB")
    v = summary["verdicts"]
    lines += ["", f"verdicts: {v['compared']} cells compared ({v['cells_one']} / {v['cells_two']}"
                  f" recorded), {len(v['status_differs'])} differ, token streams differ in "
                  f"{len(v['tokens_differ'])}; statuses (one GPU): "
                  + ", ".join(f"{n} {s}" for s, n in sorted(v["statuses"].items()))]
    for d in v["status_differs"][:20]:
        lines.append(f"  DIFFERS {d['cell']}: one GPU {d['one']}, every GPU {d['two']}")
    for k in (v["only_one"] + v["only_two"])[:20]:
        lines.append(f"  ONLY IN ONE RUN {k}")
    lines += ["", "acceptance:"]
    lines += [f"  [{'x' if ok else ' '}] {name}" for name, ok in summary["checks"].items()]
    lines.append("ACCEPTED" if summary["accepted"] else "NOT ACCEPTED")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m harness.gpu_timing", description=__doc__)
    parser.add_argument("--one", type=Path, required=True, help="evidence of the one-GPU run")
    parser.add_argument("--two", type=Path, required=True, help="evidence of the every-GPU run")
    parser.add_argument("--times", type=Path, required=True, help="the wall times file")
    parser.add_argument("--util-one", type=Path, default=None)
    parser.add_argument("--util-two", type=Path, default=None)
    parser.add_argument("--max-ratio", type=float, default=MAX_RATIO)
    parser.add_argument("--json", type=Path, default=None, help="write the summary as JSON")
    args = parser.parse_args(argv)
    summary = summarize(args.one, args.two, args.times, args.util_one, args.util_two,
                        args.max_ratio)
    print(render(summary))
    if args.json is not None:
        args.json.write_text(json.dumps(summary, indent=1, default=str))
    return 0 if summary["accepted"] else 1


if __name__ == "__main__":
    sys.exit(main())
