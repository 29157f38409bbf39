"""``lockstep run``: the parity matrix, a rich table, evidence, and an exit status for CI."""
from __future__ import annotations

import argparse
import re
import shutil
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from engines.errors import InputError
from engines.registry import engine_names
from harness.cli.arguments import (LARGEST, engine_list, integer, integer_list, name_list,
                                   path_option)
from harness.cli.interrupt import counted
from harness.cli.progress import CellProgress
from harness.cli.tables import print_table
from harness.judgement import SEVERITY

STYLE = {"identical": "green", "near-tie": "yellow", "drift": "bold red", "budget": "bold red",
         "defect": "bold red", "non-finite": "bold red", "error": "bold red",
         "unavailable": "bold yellow"}
RANK = {s: i for i, s in enumerate(reversed(SEVERITY))}  # higher: worse
SETUP_STAGES = ("availability", "constructor")  # an engine that failed there ran no cell


def parse_prompt(text: str) -> list[int]:
    """``"1 5 7"`` or ``"1,5,7"`` -> [1, 5, 7]."""
    parts = [p.strip() for p in re.split(r"\s*,\s*|\s+", text.strip())]
    ids = [int(p) if re.fullmatch(r"-?\d+", p) else None for p in parts]
    if None in ids:  # a word, an id left out ("1,,2") or nothing at all: no prompt to run
        raise InputError("a prompt is a list of integer token ids", field="--prompt", value=text,
                         remedy='write it as "1 5 7" or "1,5,7"')
    if max(ids) > LARGEST:  # of any package: no vocabulary is that large
        raise InputError(f"token id {max(ids)} is past any vocabulary", field="--prompt",
                         value=text, remedy="give token ids below the package's vocab_size")
    if min(ids) < 0:  # of any package
        raise InputError(f"token id {min(ids)} is negative", field="--prompt", value=text,
                         remedy="give token ids of 0 or more (below the package's vocab_size)")
    return ids


def _prompts(args: argparse.Namespace):
    """The run's prompts: None (each package's own), lists of ids (``--prompt`` alone), or
    ``harness.prompts.PromptSource`` in the order --prompt, --text, --chat, --prompts."""
    ids = [parse_prompt(p) for p in args.prompts] if args.prompts else []
    texts, chats = getattr(args, "texts", None) or [], getattr(args, "chats", None) or []
    file = getattr(args, "prompts_file", None)
    if not (texts or chats or file):
        return ids or None
    from harness.prompts import chat_prompt, ids_prompt, read_prompts_file, text_prompt

    return ([ids_prompt(p, "--prompt") for p in ids] + [text_prompt(t) for t in texts]
            + [chat_prompt([{"role": "user", "content": c}]) for c in chats]
            + (read_prompts_file(file) if file else []))


def parse_widths(text: str | None) -> list[int] | str | None:
    """``--width``: ``all``, ``3`` or ``1,3``; None when not given."""
    if text is None or text.strip() == "all":
        return None if text is None else "all"
    return integer_list(text, "--width", '2, --width "1,3" or --width all')


def matrix_table(summary, max_new_tokens: int, mode: str = "greedy") -> Table:
    """Packages (and widths) down, engines across; a cell counts its prompts by verdict."""
    engines = list(dict.fromkeys(c.engine for c in summary.cells))
    rows = list(dict.fromkeys((c.package, c.mode) for c in summary.cells))
    against = "greedy and the oracle" if mode == "speculative" else "the oracle"
    table = Table(title=f"lockstep parity: {mode}, {max_new_tokens} new tokens, vs {against}")
    table.add_column("package")
    if mode == "speculative":
        table.add_column("mode")
    for engine in engines:
        table.add_column(engine, justify="center")
    for package, label in rows:
        row = [package] + ([label] if mode == "speculative" else [])
        for engine in engines:
            cells = [c for c in summary.cells if c.package == package and c.engine == engine
                     and c.mode == label]
            worst = max((c.status for c in cells), key=lambda s: RANK[s], default="unavailable")
            same = sum(c.status == worst for c in cells)
            text = worst if worst == "unavailable" else f"{worst} {same}/{len(cells)}"
            accepted = sum(c.tallies.get("accepted", 0) for c in cells)
            proposed = accepted + sum(c.tallies.get("rejected", 0) for c in cells)
            if proposed:
                text += f" ({accepted / proposed:.0%} accepted)"
            row.append(f"[{STYLE[worst]}]{text}[/]")
        table.add_row(*row)
    return table


def details_table(cells) -> Table:
    """One row per cell that is not identical: what was found, where, and why."""
    table = Table(title="cells that are not identical")
    for col in ("package", "mode", "engine", "prompt", "verdict", "finding"):
        table.add_column(col)
    for c in cells:
        div = c.divergence
        where = c.reason
        if div is not None and c.status == "near-tie":
            where = (f"step {div.step}: engine {div.engine_token} is the oracle's rank-"
                     f"{div.rank} token, {div.gap:.3g} below oracle {div.oracle_token}"
                     + (f"; {c.reason}" if c.reason else ""))
        table.add_row(c.package, c.mode, c.engine, c.prompt_name,
                      f"[{STYLE[c.status]}]{c.status}[/]", where, style=None)
    return table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("run", help="run the parity matrix (engines x packages x prompts)")
    p.add_argument("--engines", help="comma list of engine names or module:Class "
                                     "(default: every registered engine)")
    p.add_argument("--packages", help="comma list of fixture names or package folders; an "
                                      "onnx-genai model package (manifest.json) runs every "
                                      "variant this machine can (default: every built-in "
                                      "fixture)")
    p.add_argument("--prompt", action="append", dest="prompts", metavar="IDS",
                   help='a prompt as token ids, "1 5 7"; repeatable (default: the package\'s prompts)')
    p.add_argument("--text", action="append", dest="texts", metavar="TEXT",
                   help="a prompt as text, encoded by each package's tokenizer (with its own "
                        "special tokens, as transformers encodes text); repeatable")
    p.add_argument("--chat", action="append", dest="chats", metavar="TEXT",
                   help="a user message, rendered by each package's own chat template (the "
                        "checkpoint's, with the assistant's turn opened) and encoded; repeatable")
    p.add_argument("--prompts", dest="prompts_file", type=Path, metavar="FILE",
                   help='a JSONL file of prompts, one a line: {"text": ...}, {"chat": [{"role": '
                        '..., "content": ...}]} or {"ids": [...]}, each with an optional "name", '
                        "or a built-in set: grounded (repeat, edit or summarise a given text or "
                        "code), free (open questions); prompts run in the order --prompt, "
                        "--text, --chat, then the file")
    p.add_argument("--oracle-engine", metavar="ENGINE",
                   help="run the recompute oracle on this engine instead of ort-cpu (e.g. "
                        "ort-cuda for long contexts), float32 packages only; it must first "
                        "agree with ort-cpu's oracle on a short prefix, else the run stops")
    p.add_argument("--oracle-mode", choices=("stream", "recompute"), default="stream",
                   help="how the oracle computes its rows from zero state: stream (one forward "
                        "over prompt + stream gives every step's row; the default) or "
                        "recompute (one forward per prefix, cost growing with the square of "
                        "the length: to audit the oracle itself)")
    p.add_argument("--shard", metavar="I/N",
                   help="run only shard I of N: a deterministic, contiguous share of the "
                        "planned cells (a CI matrix job, a Slurm array task, a Kubernetes "
                        "indexed job each take one); lockstep report over the N evidence "
                        "folders checks that the shards cover the plan exactly once")
    p.add_argument("--max-new-tokens", type=integer("--max-new-tokens"), default=32, metavar="N",
                   help="tokens each decode generates after the prompt, each judged against "
                        "the oracle (default: 32)")
    p.add_argument("--max-prompts", type=integer("--max-prompts"), default=None, metavar="N",
                   help="only the first N of each package's default prompts")
    p.add_argument("--concurrency", type=integer("--concurrency"), default=1, metavar="N",
                   help="also send each package's prompts N at a time to engines that serve "
                        "concurrent requests (servers: --engines http:...) and judge each "
                        "prompt's stream among them against its stream alone (claim "
                        "concurrency_invariance; default 1: alone only)")
    p.add_argument("--mode", choices=("greedy", "speculative"), default="greedy",
                   help="greedy (vs the oracle), or speculative: every width, each stream vs "
                        "the engine's greedy stream and the oracle (default: greedy)")
    p.add_argument("--width", metavar="N|all",
                   help='speculative widths: N, "1,3" or all (default: all, 1..max_width)')
    p.add_argument("--evidence-dir", type=path_option("--evidence-dir"), default=None,
                   help="where one JSON evidence record per cell is written (default: ./evidence)")
    p.add_argument("--no-evidence", action="store_true",
                   help="write no evidence (verdicts and budgets are judged all the same)")
    p.add_argument("--strict", action="store_true",
                   help="an engine that cannot run here (or a cell found unavailable), or "
                        "an engine named in --engines that runs no cell, fails the run "
                        "instead of being reported (cells an engine's declarations leave out, "
                        "such as hf on a fixture without a checkpoint, do not)")
    p.add_argument("--explain", action="store_true",
                   help="explain every failing greedy cell: the first node whose error leaves "
                        "the noise floor and a repro pack, written to <evidence dir>/forensics/ "
                        "and shown in the report (lockstep explain, lockstep repro)")
    p.add_argument("--devices", metavar="all|0,1",
                   help="run the cells on these GPUs with pytest-xdist, one worker pinned to "
                        "each (all: every visible GPU; indices as nvidia-smi numbers them); "
                        "without it the matrix runs in this process")
    # library names -> options (harness.cli.main); --engines is checked before the run
    p.set_defaults(func=run, fields={"package": "--packages", "engine": "--oracle-engine",
                                     "max_new_tokens": "--max-new-tokens"})


def run(args: argparse.Namespace) -> int:
    from harness.packages import fixture_names
    from harness.runner import resolve_engines, run_matrix

    console = Console(width=shutil.get_terminal_size((160, 24)).columns)
    engines = engine_list(args.engines, "--engines") or engine_names()
    concurrency = getattr(args, "concurrency", 1)
    if concurrency > 1 and args.mode != "greedy":
        raise InputError("--concurrency applies to greedy cells only", field="--concurrency",
                         value=concurrency, remedy="drop --mode speculative, or drop "
                                                   "--concurrency")
    if concurrency > 1 and not any(c.concurrent for c in resolve_engines(engines).values()):
        raise InputError("--concurrency sends prompts at once to an engine that serves "
                         "concurrent requests; none of --engines does", field="--concurrency",
                         value=concurrency, remedy="add a server (--engines http:...) or "
                                                   "vllm, or drop --concurrency")
    if args.no_evidence and args.evidence_dir is not None:
        raise InputError("--no-evidence writes no evidence, so it has no --evidence-dir",
                         field="--evidence-dir", value=str(args.evidence_dir),
                         remedy="drop one of --no-evidence and --evidence-dir")
    if args.no_evidence and args.explain:
        raise InputError("--explain explains the records and writes into the evidence folder; "
                         "--no-evidence writes neither", field="--explain", value="--no-evidence",
                         remedy="drop --no-evidence (explanations go to <evidence dir>/forensics/"
                                "), or drop --explain")
    widths = parse_widths(args.width)
    if widths is not None and args.mode != "speculative":
        raise InputError("--width applies to speculative decoding only", field="--width",
                         value=args.width, remedy="add --mode speculative, or drop --width")
    if args.mode == "speculative" and args.packages is None:
        from harness.catalog.builtin import speculative_fixtures

        packages = list(speculative_fixtures())
    else:
        from harness.packages import expand_package_refs

        packages = expand_package_refs(name_list(args.packages, "--packages") or fixture_names())
    prompts = _prompts(args)
    oracle_engine = getattr(args, "oracle_engine", None)
    devices = None
    if getattr(args, "devices", None) is not None:
        moved = [flag for flag, given in (("--text", args.texts), ("--chat", args.chats),
                                          ("--prompts", args.prompts_file)) if given]
        if moved:
            raise InputError(f"{moved[0]} is not carried to the --devices workers yet",
                             field=moved[0], value=args.devices,
                             remedy=f"drop --devices (run in this process), or drop {moved[0]}")
        from harness.distributed import parse_devices, require_xdist, visible_gpus

        devices = parse_devices(args.devices, visible_gpus())
        require_xdist()
    from harness.plan import parse_shard

    shard = parse_shard(getattr(args, "shard", None))
    oracle_mode = getattr(args, "oracle_mode", "stream")
    evidence_dir = None if args.no_evidence else args.evidence_dir or Path("evidence")
    if evidence_dir is not None:
        from harness.evidence import prepare_evidence_dir

        prepare_evidence_dir(evidence_dir)

    with CellProgress("parity matrix") as progress, counted(progress):  # on stderr
        def on_cell(cell):
            progress.advance(f"{cell.package} · {cell.mode} · {cell.engine} · "
                             f"{cell.prompt_name}")

        if devices is None:
            summary = run_matrix(engines, packages, prompts, args.max_new_tokens, evidence_dir,
                                 on_cell, mode=args.mode, widths=widths,
                                 max_prompts=args.max_prompts,
                                 on_plan=progress.plan,
                                 oracle_engine=oracle_engine, oracle_mode=oracle_mode,
                                 shard=shard, concurrency=concurrency)
        else:
            if concurrency > 1:
                raise InputError("--concurrency is not carried to the --devices workers",
                                 field="--concurrency", value=concurrency,
                                 remedy="drop --devices (servers run in this process)")
            from harness.distributed import run_matrix_on_devices

            label = f"parity matrix on {len(devices)} GPU(s) ({','.join(devices)})"
            progress.describe(label)
            summary = run_matrix_on_devices(
                engines, packages, prompts, args.max_new_tokens, evidence_dir, devices,
                mode=args.mode, widths=widths, max_prompts=args.max_prompts,
                on_plan=progress.plan, on_progress=progress.set_completed,
                oracle_engine=oracle_engine, oracle_mode=oracle_mode, shard=shard)

    print_table(console, matrix_table(summary, args.max_new_tokens, args.mode))
    for package, check in summary.oracle_checks.items():
        console.print(f"oracle for {package}: {check.engine}, agreeing with {check.against}'s "
                      f"on a {check.prefix_tokens}-token prefix and {check.steps} step(s) (max "
                      f"abs {check.max_abs:.3g}, NMSE {check.nmse:.3g})")
    from harness.cli.generated_text import generated_lines

    for line in generated_lines(summary):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    details = [c for c in summary.cells if c.status not in ("identical", "unavailable")]
    if details:
        print_table(console, details_table(details))
    asked = set(resolve_engines(engines)) if args.engines is not None else set()
    ran = {c.engine for c in summary.cells if c.status != "unavailable"}
    for row in not_run(summary):
        idle = row.engine in asked and row.engine not in ran
        note = " (asked for by name, and it ran no cell)" if idle else ""
        console.print(f"[{'bold yellow' if idle else 'yellow'}]{escape(row.line())}{note}[/]",
                      highlight=False)
    counts = {}
    for c in summary.cells:
        counts[c.status] = counts.get(c.status, 0) + 1
    console.print(", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    if evidence_dir is not None:
        console.print(f"evidence: {evidence_dir.resolve()} "
                      f"({sum(1 for c in summary.cells if c.record_path)} records, "
                      f"run {summary.run_id})")
    if devices is not None:
        console.print(f"devices: {len(devices)} GPU(s) ({','.join(devices)}), one pytest-xdist "
                      f"worker pinned to each")
    if args.explain and summary.failed:
        from harness.forensics import explain_and_print

        explain_and_print(summary, engines, print_fn=print, repro=True)
    # --strict: an engine that cannot run here, a cell found unavailable, or an engine asked
    # for by name that ran nothing fails the run (what declarations leave out does not)
    unavailable = ({c.engine for c in summary.cells if c.status == "unavailable"}
                   | {lo.engine for lo in summary.left_out if lo.decided_by == "machine"}
                   | (asked - ran))
    for line in failure_lines(summary, unavailable if args.strict else set()):
        print(f"lockstep: error: {line}", file=sys.stderr)
    return 1 if summary.failed or (args.strict and unavailable) else 0


def failure_lines(summary, strict_failed: set[str]) -> list[str]:
    """Why a run fails without a verdict, one line per engine (the cells table wraps a
    reason over rows): an engine that could not be set up (its availability check or
    constructor raised, so each of its cells is an error), and under ``--strict`` each
    engine in ``strict_failed`` (not run here, or asked for and running no cell)."""
    from harness.plan import fold_not_run

    broken = fold_not_run([(c.engine, c.package, str(c.error), 1) for c in summary.cells
                           if c.error is not None and c.error.stage in SETUP_STAGES])
    strict = [row for row in not_run(summary) if row.engine in strict_failed]
    return ([_with_remedy(row.line(), "see the cells table and the engine's record")
             for row in broken]
            + [_with_remedy(f"--strict: {row.line()}", "make the engine runnable here, or "
                            "drop --strict to report it without failing the run")
               for row in strict])


def _with_remedy(line: str, remedy: str) -> str:
    return line if "remedy:" in line else f"{line}; remedy: {remedy}"


def not_run(summary):
    """One ``harness.plan.NotRun`` per engine with cells left out of the plan or found
    unavailable when tried, with their reasons."""
    from harness.plan import fold_not_run

    return fold_not_run([(lo.engine, lo.package, lo.reason, lo.cells) for lo in summary.left_out]
                        + [(c.engine, c.package, c.reason, 1) for c in summary.cells
                           if c.status == "unavailable"])
