"""``lockstep bench-forward``: single forwards timed engine beside engine, a prefill of L
tokens and a forward of M rows after a prefix (a verification's shape) against M = 1
(``harness/forward_bench.py``, ``docs/PERFORMANCE.md``)."""
from __future__ import annotations

import argparse
import shutil

from rich.console import Console
from rich.table import Table

from engines.errors import InputError
from engines.output_paths import check_output_file
from harness.cli.arguments import engine_list, integer, integer_list, json_output, name_list
from harness.cli.tables import print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-forward", help="single forwards per engine, side by side: a "
                                             "prefill of L tokens, and M rows after a prefix "
                                             "as a ratio to M=1")
    p.add_argument("--engines", required=True, help="comma list; the first is the prefill "
                                                    "ratios' baseline")
    p.add_argument("--packages", required=True,
                   help="comma list of fixture names or package folders")
    p.add_argument("--prefill", default="", metavar="L,...",
                   help="prompt lengths timed as one forward from position 0 (e.g. 512)")
    p.add_argument("--rows", default="1,2,3,4,5", metavar="M,...",
                   help="rows per forward timed after the prefix (default 1,2,3,4,5; "
                        "M=1 is the decode forward every ratio is taken against)")
    p.add_argument("--prefix", type=integer("--prefix", minimum=0), default=64,
                   help="positions in the cache before a rows forward (default 64)")
    p.add_argument("--repeats", type=integer("--repeats"), default=10,
                   help="timed forwards per shape (default 10)")
    p.add_argument("--warmup", type=integer("--warmup", minimum=0), default=2,
                   help="untimed forwards per shape first: graph captures, step memos "
                        "(default 2); the first is the table's 'first ms'")
    json_output(p, "the rows")
    p.set_defaults(func=run, fields={"package": "--packages", "engine": "--engines",
                                     "prefill": "--prefill", "prefix": "--prefix"})


def _table(rows) -> Table:
    table = Table(title="single forwards (median ms, its token on the host)")
    numbers = ("prefix", "ms", "spread", "ratio", "first ms")
    for col in ("package", "engine", "forward", "prefix", "ms", "spread", "ratio", "first ms",
                "note"):
        table.add_column(col, justify="right" if col in numbers else "left")
    for r in rows:
        shape = f"prefill {r.tokens}" if r.kind == "prefill" else f"M={r.tokens}"
        ratio = "" if r.ratio is None else (f"{r.ratio:.2f}x vs M=1" if r.kind == "rows"
                                            else f"{r.ratio:.2f}x vs first engine")
        table.add_row(r.package, r.engine, shape, str(r.prefix),
                      "" if r.ms is None else f"{r.ms:.3f}",
                      "" if r.spread is None else f"{r.spread:.0%}", ratio,
                      "" if r.first_ms is None else f"{r.first_ms:.3f}",
                      r.reason if r.status != "ok" else "")
    return table


def run(args: argparse.Namespace) -> int:
    from harness.forward_bench import MARKER, bench_forwards, write_json

    if args.json is not None:
        check_output_file(args.json, "--json", marker=MARKER, force=args.force,
                          example="forwards.json")

    engines = engine_list(args.engines, "--engines")
    packages = name_list(args.packages, "--packages")
    prefill = integer_list(args.prefill, "--prefill", "128,512") if args.prefill else []
    rows = integer_list(args.rows, "--rows", "1,2,3,4,5") if args.rows else []
    if not prefill and not rows:  # --rows "" without --prefill: nothing would be timed
        raise InputError("--rows names no rows and --prefill no lengths: nothing to time",
                         field="--rows", value=args.rows,
                         remedy="give --rows 1,2,3,4,5, or --prefill lengths to time")
    if rows and 1 not in rows:
        rows = [1, *rows]  # the ratio's denominator
    console = Console(width=shutil.get_terminal_size((160, 24)).columns)
    result = bench_forwards(engines, packages, prefill=prefill, rows=rows, prefix=args.prefix,
                            repeats=args.repeats, warmup=args.warmup,
                            on_step=lambda text: console.print(text, highlight=False))
    print_table(console, _table(result))
    if args.json is not None:
        settings = {"engines": engines, "packages": packages, "prefill": prefill, "rows": rows,
                    "prefix": args.prefix, "repeats": args.repeats, "warmup": args.warmup}
        console.print(f"json: {write_json(result, args.json, settings).resolve()}")
    return 1 if any(r.status == "error" for r in result) else 0
