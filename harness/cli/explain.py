"""``lockstep explain EVIDENCE``: where inside the forward an engine parts from the arbiter.

Rebuilds the record's first failing step as the engine ran it (its own decode: positions,
state cells, and every intermediate of its executor where it can be seen) and as it should
have run (the same tokens at their true positions, state recomputed from zero over the
prefix), compares node by node with the native executor in float64, each node against a
noise floor measured on two correct float32 runs, and prints the first value out of it: its
layer, op, name and error, the feeds that differ and where they went wrong, and the per-layer
error curve. ``harness.forensics.explain_record`` is the same as a function.
"""
from __future__ import annotations

import argparse
import sys

from engines.output_paths import check_output_file
from harness.cli.arguments import existing, integer, number, path_option


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("explain", help="name the layer and node where a failing record's "
                                       "engine parts from the float64 arbiter")
    p.add_argument("evidence", type=existing("EVIDENCE_FILE"), metavar="EVIDENCE_FILE",
                   help="an evidence record (one JSON file of an evidence folder)")
    p.add_argument("--engine", metavar="REF",
                   help="the engine, if the record's engine name is not registered here: a "
                        "name or package.module:Class")
    p.add_argument("--package", metavar="REF",
                   help="the package (fixture name or folder), if the record's path moved")
    p.add_argument("--step", type=integer("--step", minimum=0), default=None,
                   help="the step to explain (default: the first failing step)")
    p.add_argument("--factor", type=number("--factor", above=0), default=None,
                   help="noise floor = FACTOR x the larger correct float32 spread (default 8)")
    p.add_argument("--json", metavar="PATH",
                   help="also write the explanation as JSON (- for stdout, instead of text)")
    p.add_argument("--plot", metavar="PATH", type=path_option("--plot", "file"),
                   help="write the per-layer error curve (.svg or .png)")
    p.add_argument("--top", type=integer("--top"), default=8,
                   help="list the first N values out of the floor (default 8)")
    p.add_argument("--force", action="store_true",
                   help="replace a --json or --plot file that lockstep did not write")
    p.set_defaults(func=run, fields={"engine": "--engine", "package": "--package"})


def run(args: argparse.Namespace) -> int:
    from harness.forensics import FACTOR, explain_record, save_layer_curve
    from harness.forensics.explanation import MARKER
    from harness.forensics.plot import PLOT_MARKER, plot_format

    if args.json not in (None, "-"):
        check_output_file(args.json, "--json", marker=MARKER, force=args.force,
                          example="explanation.json")
    if args.plot is not None:
        plot_format(args.plot)
        check_output_file(args.plot, "--plot", marker=PLOT_MARKER, force=args.force,
                          example="layers.svg")
    expl = explain_record(args.evidence, engine=args.engine, package=args.package,
                          step=args.step, factor=FACTOR if args.factor is None else args.factor)
    if args.json == "-":
        sys.stdout.write(expl.to_json() + "\n")
    else:
        print(expl.text(top=args.top))
        if args.json:
            print(f"\nexplanation: {expl.write(args.json)}")
    if args.plot:
        path = save_layer_curve(expl, args.plot)
        if args.json != "-":
            print(f"plot: {path}")
    return 0
