"""``lockstep calibrate``: measure a quantized engine's band on the teacher-forced corpus,
validate it with the engine's planted bugs, and compare it with the band checked in for its
scheme (``harness.calibrate``, ``docs/QUANTIZED.md``).

Without ``--write`` it prints the row and whether it reproduces the checked-in one (exit 1
where it does not); with ``--write`` it updates the bands table, unless a mutation is not
caught tenfold or the corpus is too short (exit 1, nothing written).
"""
from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness.cli.arguments import json_output, name_list


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="measure a quantized engine's band (its scheme's "
                                         "tolerance row) and check it against the checked-in "
                                         "one")
    p.add_argument("--engine", default="llama-cpp",
                   help="the quantized engine (default: llama-cpp; also ort-genai-int4)")
    p.add_argument("--package", default="smollm2",
                   help="the package it runs: a fixture, smollm2, or a folder (default: "
                        "smollm2)")
    p.add_argument("--corpus", type=Path, default=None, metavar="YAML",
                   help="the corpus manifest (default: harness/texts/calibration/"
                        "corpus.yaml)")
    p.add_argument("--segments", default=None, metavar="NAME,...",
                   help="score only these segments of the corpus (a band is written from "
                        "1,500 positions or more)")
    p.add_argument("--bands", type=Path, default=None, metavar="JSON",
                   help="the bands table to compare with and write (default: "
                        "engines/quantized_bands.json)")
    p.add_argument("--write", action="store_true",
                   help="write the row into the bands table (refused unless every mutation is "
                        "caught tenfold)")
    json_output(p, "the row, the observations and the comparison")
    p.set_defaults(func=run, fields={"engine": "--engine", "package": "--package"})


def _g(value) -> str:
    return "–" if value is None else f"{value:.4g}"


def _bounds_table(cal, old) -> Table:
    from harness.calibrate import BOUNDS

    table = Table(title=f"band for {cal.band.scheme} ({cal.corpus.positions} positions, "
                        f"{cal.observed['rows']} rows)")
    for col in ("bound", "observed worst", "where", "this run's bound", "checked in"):
        table.add_column(col, justify="left" if col in ("bound", "where") else "right")
    for key in BOUNDS:
        table.add_row(key, _g(cal.observed[key]), cal.observed.get(f"{key}_at") or "",
                      _g(getattr(cal.band, key)), _g(getattr(old, key, None)))
    return table


def _mutations_table(cal) -> Table:
    table = Table(title="mutations (planted bugs) against this run's band")
    for col in ("engine", "farthest beyond", "times the bound", "caught (>= 10x)"):
        table.add_column(col, justify="left" if col in ("engine", "farthest beyond")
                         else "right")
    for m in cal.mutations:
        table.add_row(m["engine"], m["metric"], f"{m['ratio']:.3g}x",
                      "yes" if m["caught"] else "NO")
    return table


def _reproduction_table(rep) -> Table:
    table = Table(title="against the checked-in band")
    for col in ("observed", "checked in", "now", "change", "within"):
        table.add_column(col, justify="left" if col == "observed" else "right")
    for name, before, now, change, ok in rep.metrics:
        table.add_row(name, _g(before), _g(now), f"{change:+.1%}", "yes" if ok else "NO")
    return table


def run(args: argparse.Namespace) -> int:
    from engines.errors import InputError
    from engines.output_paths import check_output_file
    from engines.registry import get_engine_class
    from engines.tokenizer import package_tokenizer
    from engines.tolerances import BANDS_FILE, bands
    from harness import calibrate as cal_mod
    from harness.mutations import check_plantable, mutations_for
    from harness.packages import resolve_package

    path = args.bands or BANDS_FILE
    if args.json is not None:  # before the minutes of scoring whose results it would receive
        if args.json.expanduser().resolve() == Path(path).expanduser().resolve():
            raise InputError(f"--json and --bands name one file: the calibration's JSON would "
                             f"replace the bands table it is compared with", field="--json",
                             value=str(args.json),
                             remedy="give --json a file of its own, such as calibration.json")
        check_output_file(args.json, "--json", marker=cal_mod.MARKER, force=args.force,
                          example="calibration.json")
    console = Console(width=shutil.get_terminal_size((160, 24)).columns)
    checked_in = bands(path, "--bands")  # before the minutes of scoring it is compared with
    if args.write:  # and the table they would be written into (replacing it is --write's job)
        check_output_file(path, "--bands", marker="", force=True, example="bands.json")
    cls = get_engine_class(args.engine)
    found = cls.availability()
    if not found.ok:
        raise InputError(f"{args.engine} cannot run here: {found.reason}", field="--engine",
                         value=args.engine, remedy="install what it needs, or calibrate "
                                                   "another engine")
    package = resolve_package(args.package)
    supported = cls.supports(package)
    if not supported.ok:
        raise InputError(f"{args.engine} cannot run {args.package}: {supported.reason}",
                         field="--package", value=args.package,
                         remedy=f"calibrate {args.engine} on a package it runs (the default, "
                                f"smollm2, is one)")
    if package_tokenizer(package) is None:  # the corpus is text: a fixture has no tokenizer
        raise InputError(f"{args.package} has no tokenizer, so the corpus text cannot be "
                         f"encoded", field="--package", value=args.package,
                         remedy="calibrate on a package converted with its tokenizer (the "
                                "default, smollm2, is one)")
    corpus = cal_mod.load_corpus(package, args.corpus or cal_mod.CORPUS_FILE,
                                 name_list(args.segments, "--segments"))
    mutations = mutations_for(cls.name)
    engine = cls(package)
    try:
        check_plantable(mutations, engine, args.package)  # before the minutes of scoring
        reference = engine.reference_package()
        if reference is not None:
            from engines.package import load_package

            reference = load_package(reference)
        result = cal_mod.calibrate(engine, package, corpus, mutations, reference,
                                   on_step=lambda text: console.print(f"[dim]{text}[/dim]"))
    finally:
        engine.close()
    old = checked_in.get(result.band.scheme)
    console.print(_bounds_table(result, old))
    console.print(_mutations_table(result))
    for pair, entry in result.self_consistency.items():
        console.print(f"engine against itself, {pair}: {entry['positions']} positions, max abs "
                      f"{entry['max_abs']:.4g}, worst KL {entry['kl_max']:.3g}, same argmax "
                      f"{entry['same_argmax']:.1%}")
    status = 0
    rep = None
    if old is None:
        console.print(f"no band for {result.band.scheme} is checked in at {path}")
    else:
        rep = cal_mod.reproduce(result, old)
        console.print(_reproduction_table(rep))
        console.print("reproduces the checked-in band" if rep.reproduced
                      else "does NOT reproduce the checked-in band: " + "; ".join(rep.problems))
        status = 0 if rep.reproduced else 1
    refused = result.refused
    if args.write:
        if refused:
            console.print("not written: " + "; ".join(refused))
            status = 1
        else:
            cal_mod.write_band(result.band, path)
            console.print(f"written: {result.band.scheme} into {path}")
            status = 0
    elif refused:
        console.print("this row could not be written: " + "; ".join(refused))
    if args.json is not None:
        args.json.write_text(json.dumps({
            "kind": cal_mod.KIND, "band": result.band.to_dict(), "refused": refused,
            "reproduction": None if rep is None else {
                "reproduced": rep.reproduced, "problems": rep.problems,
                "metrics": rep.metrics, "mutations": rep.mutations, "bounds": rep.bounds}},
            indent=1, default=str))
        console.print(f"written: {args.json.resolve()}")
    return status


__all__ = ["register", "run"]
