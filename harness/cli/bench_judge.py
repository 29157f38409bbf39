"""``lockstep bench-judge``: the judge's seconds beside the engine's own, per cell, as the
prompt grows from 32 to 2,048 tokens, and how the judge's cost grows with length
(``harness.judge_bench``, ``docs/PERFORMANCE.md``)."""
from __future__ import annotations

import argparse
import json
import shutil

from rich.console import Console
from rich.table import Table

from engines.output_paths import check_output_file
from harness.cli.arguments import engine_list, integer, integer_list, json_output
from harness.cli.progress import CellProgress
from harness.cli.tables import print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench-judge", help="time the judge beside the engine at growing "
                                           "prompt lengths")
    p.add_argument("--engines", default="ort-cpu",
                   help="comma list of engines to judge (default: ort-cpu)")
    p.add_argument("--packages", default="smollm2", metavar="PACKAGE",
                   help="one package: a fixture, smollm2, or a folder (default: smollm2)")
    p.add_argument("--lengths", metavar="N,N,...",
                   help="prompt lengths in tokens, increasing (default: 32,128,512,2048)")
    p.add_argument("--max-new-tokens", type=integer("--max-new-tokens"), default=64, metavar="N",
                   help="tokens each decode generates (default: 64)")
    p.add_argument("--oracle-mode", choices=("stream", "recompute"), default="stream",
                   help="the oracle's mode (recompute: to show what one forward per prefix "
                        "costs; keep its lengths short)")
    json_output(p, "every row and the growth exponents")
    p.set_defaults(func=run, fields={"package": "--packages"})


def _table(bench) -> Table:
    table = Table(title=f"lockstep bench-judge: {bench.package}, {bench.max_new_tokens} new "
                        f"tokens, oracle mode {bench.oracle_mode}")
    for col in ("engine", "prompt tokens", "new tokens", "status", "engine s", "judge s",
                "judge / engine", "oracle forwards", "judge growth"):
        table.add_column(col, justify="left" if col in ("engine", "status") else "right",
                         no_wrap=True)
    for engine in dict.fromkeys(r.engine for r in bench.rows):
        steps, fit = bench.growth(engine)
        rows = sorted((r for r in bench.rows if r.engine == engine),
                      key=lambda r: r.prompt_tokens)
        for r, step in zip(rows, steps + [None] * len(rows)):
            table.add_row(engine, str(r.prompt_tokens), str(r.new_tokens), r.status,
                          f"{r.engine_s:.2f}", f"{r.judge_s:.2f}",
                          "–" if r.ratio is None else f"{r.ratio:.2f}x",
                          str(r.oracle_forwards),
                          "–" if step is None else f"n^{step:.2f}")
        if fit is not None:
            table.add_row(engine, "", "", "", "", "", "", "", f"fit n^{fit:.2f}")
    return table


def run(args: argparse.Namespace) -> int:
    from harness.judge_bench import DEFAULT_LENGTHS, MARKER, bench_judge

    if args.json is not None:
        check_output_file(args.json, "--json", marker=MARKER, force=args.force,
                          example="judge.json")
    engines = engine_list(args.engines, "--engines")
    lengths = list(DEFAULT_LENGTHS) if args.lengths is None else \
        integer_list(args.lengths, "--lengths", "32,128,512,2048", increasing=True)
    console = Console(width=shutil.get_terminal_size((160, 24)).columns)
    with CellProgress("judge bench") as progress:
        progress.plan(len(lengths) * len(engines))
        bench = bench_judge(engines, args.packages, lengths, args.max_new_tokens,
                            args.oracle_mode,
                            on_cell=lambda r: progress.advance(f"{r.engine} · "
                                                               f"{r.prompt_tokens} tokens"))
    print_table(console, _table(bench))
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(bench.to_dict(), indent=1))
        console.print(f"written: {args.json.resolve()}")
    return 1 if any(r.status not in ("identical", "near-tie") for r in bench.rows) else 0
