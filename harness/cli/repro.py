"""``lockstep repro EVIDENCE -o DIR``: the smallest package that still shows a defect.

Shrinks the record's prompt (chunks, then single ids, then smaller ids, while the engine
still fails the same way against the oracle), explains the shrunk record, and cuts the first
value out of the noise floor with its producer into a package of its own: the step's correct
inputs (``inputs.npz``), the arbiter's outputs (``expected.npz``), the engine and its version
(``repro.json``) and a generated pytest file that fails on the engine and passes on a
correct one (``LOCKSTEP_REPRO_ENGINE=native-host python -m pytest DIR``).
``harness.forensics.write_repro`` is the same as a function.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from engines.errors import InputError
from engines.output_paths import check_output_folder
from harness.cli.arguments import existing, integer, number

MAX_RUNS = 64  # candidate prompts run while shrinking, by default


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("repro", help="write a repro pack (a cut-out subgraph, its inputs and "
                                     "a pytest file) for a failing record")
    p.add_argument("evidence", type=existing("EVIDENCE_FILE"), metavar="EVIDENCE_FILE",
                   help="an evidence record (one JSON file of an evidence folder)")
    p.add_argument("-o", "--output", type=Path, required=True, metavar="DIR",
                   help="the folder to write the pack into (created; a folder that already "
                        "holds files is refused without --force)")
    p.add_argument("--force", action="store_true",
                   help="write into an -o folder that already holds files (files of the "
                        "pack's names are replaced)")
    p.add_argument("--engine", metavar="REF",
                   help="the engine, if the record's engine name is not registered here: a "
                        "name or package.module:Class")
    p.add_argument("--package", metavar="REF",
                   help="the package (fixture name or folder), if the record's path moved")
    p.add_argument("--no-shrink", action="store_true", help="keep the record's prompt")
    p.add_argument("--max-runs", type=integer("--max-runs"), default=None,
                   help="at most this many candidate prompts are run while shrinking (default "
                        f"{MAX_RUNS}; not with --no-shrink)")
    p.add_argument("--factor", type=number("--factor", above=0), default=None,
                   help="noise floor = FACTOR x the larger correct float32 spread (default 8)")
    p.set_defaults(func=run, fields={"engine": "--engine", "package": "--package"})


def self_check_line(engine: str, check: dict) -> str:
    """What the pack's tests did on ``engine`` (``write_repro``'s self-check): the pack's
    outcome, then each test's; a cut that passes where the decode fails is said to miss."""
    if check["outcome"] == "error":
        return f"self-check on {engine}: error: {check['detail']}"
    line = (f"self-check on {engine}: {check['outcome']} (the cut value: {check['cut']}; the "
            f"whole decode of the shrunk prompt: {check['decode']})")
    if check["cut"] == "passes" and check["decode"] == "fails":
        line += (f": the cut does not reproduce the defect ({check['decode_verdict']}); "
                 f"test_shrunk_prompt shows it")
    return line


def run(args: argparse.Namespace) -> int:
    from harness.forensics import FACTOR, write_repro

    if args.no_shrink and args.max_runs is not None:  # a bound on a search that never runs
        raise InputError("--max-runs bounds the prompt shrinking that --no-shrink turns off",
                         field="--max-runs", value=args.max_runs,
                         remedy="drop --no-shrink to shrink within --max-runs, or drop "
                                "--max-runs to keep the record's prompt")
    check_output_folder(args.output, "-o", force=args.force, forced="write into it")
    pack = write_repro(args.evidence, args.output, engine=args.engine, package=args.package,
                       shrink=not args.no_shrink,
                       max_runs=MAX_RUNS if args.max_runs is None else args.max_runs,
                       factor=FACTOR if args.factor is None else args.factor)
    m = pack.manifest
    print(m["explanation"])
    print(f"cut: {m['why']}")
    if m["subgraph"]:
        s = m["subgraph"]
        print(f"subgraph: {s['label']}, {s['op']} {s['node'] or ''} -> {s['value']!r} "
              f"({len(s['nodes'])} node(s), {len(s['stored'])} stored input(s)) at step "
              f"{m['step']['index']} ({m['step']['phase']})")
    p = m["prompt"]
    print(f"prompt: {p['original']} -> {p['shrunk']} ({p['runs']} run(s); {p['status']})")
    for engine, check in (m.get("self_check") or {}).items():
        print(self_check_line(engine, check))
    print(f"pack: {pack.folder.resolve()}")
    print(f"run it: python -m pytest {pack.folder}   (LOCKSTEP_REPRO_ENGINE=native-host: "
          f"must pass)")
    return 0
