"""``lockstep bench``: decode speed per engine and package, timed side by side in one run:
prefill and steady decode apart, a floor from the weight bytes and the copy bandwidth
measured in the same run, and each engine as a ratio to a baseline engine from the same run
(``docs/PERFORMANCE.md``)."""
from __future__ import annotations

import argparse
import shutil

from rich.console import Console
from rich.table import Table

from engines.errors import InputError
from engines.output_paths import check_output_file
from engines.registry import REFERENCE_ENGINE, engine_names
from harness.cli.arguments import engine_list, integer, json_output, name_list
from harness.cli.progress import CellProgress
from harness.cli.tables import print_table

WARMUP_STEPS = 2  # harness.bench.WARMUP_STEPS (not imported here: the CLI loads every command)

STYLE = {"ok": "", "unavailable": "dim", "error": "bold red"}
SHORT = {"unavailable": "n/a", "error": "error"}  # the ratio cell of a row not measured


def _num(value: float | None, fmt: str) -> str:
    return "–" if value is None else format(value, fmt)


def _ms(value: float | None) -> str:
    """Milliseconds: three decimals, or two significant digits below 0.01 (a floor on a tiny
    fixture is microseconds)."""
    if value is None:
        return "–"
    return f"{value:.3f}" if value >= 0.01 else f"{value:.2g}"


def _times(value: float | None) -> str:
    if value is None:
        return "–"
    return f"{value:.0f}x" if value >= 100 else f"{value:.1f}x"


def _ratio(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}x"


def _share(value: float | None) -> str:
    return "–" if value is None else f"{value:.0%}"


def _same(value: bool | None) -> str:
    return "–" if value is None else ("yes" if value else "NO")


def bench_table(rows, plan) -> Table:
    """One line per (engine, package, prompts, mode): the dtype it computed in, median
    tokens/s of the whole decode and its spread over the repeats ((max - min) / median), the
    prefill, the steady decode (ms a token and tokens/s), the floor and how far above it,
    and the ratio to the baseline's median tokens/s (and to each ``--compare-to`` engine's, a
    column each); in speculative mode also the tokens a round (or plain step), the accept
    rate, the speed over the same engine's greedy row and whether the tokens are the greedy
    ones. Reasons are printed below the table."""
    speculative = plan.mode == "speculative"
    sets = any(t.prompt_set != "first" for t in plan.targets)
    eos = ", eos ignored" if plan.ignore_eos else ""
    eos += ", pipelined" if plan.pipelined else ""
    eos += ", packages interleaved" if plan.interleave else ""
    steps = plan.warmup_steps
    table = Table(title=f"lockstep bench: {plan.mode}, {plan.max_new_tokens} new tokens{eos}, "
                        f"median of {plan.repeats}, steady decode after {steps} warm-up "
                        f"step{'s' if steps != 1 else ''}, ratio to "
                        f"{', '.join((plan.baseline, *plan.compare_to))} in this run")
    names = ["engine", "package"] + (["prompts"] if sets else []) + ["mode", "dtype"]
    columns = names + ["tok/s", "spread", "prefill ms", "decode ms/tok", "decode tok/s"]
    columns += ["tok/step", "accept", "x greedy", "same"] if speculative else []
    columns += ["floor ms/tok", "x floor", "ratio"] + [f"x {name}" for name in plan.compare_to]
    for i, col in enumerate(columns):
        # the package name folds on a narrow terminal; names and numbers never break
        table.add_column(col, justify="left" if i < len(names) else "right",
                         no_wrap=col != "package",
                         overflow="fold" if col == "package" else "ellipsis")
    for r in rows:
        own = [r.engine, r.package] + ([r.prompt_set] if sets else []) + \
            [r.mode, r.compute_dtype or "–"]
        if r.measured:
            spread = (r.tokens_per_s_max - r.tokens_per_s_min) / r.tokens_per_s_median
            cells = [_num(r.tokens_per_s_median, ".1f"), f"{spread:.0%}", _ms(r.prefill_ms),
                     _ms(r.decode_ms), _num(r.decode_tokens_per_s, ".1f")]
            if speculative:
                cells += [_num(r.tokens_per_step, ".2f"), _share(r.accept_rate),
                          _ratio(r.greedy_ratio),
                          _same(r.same_tokens)]
            cells += [_ms(r.floor_ms), _times(r.x_floor), _ratio(r.ratio)]
            cells += [_ratio(r.ratios.get(name)) for name in plan.compare_to]
        else:  # every ratio cell says why there is none
            ratios = 1 + len(plan.compare_to)
            cells = ["–"] * (len(columns) - len(own) - ratios) \
                + [SHORT.get(r.status, r.status)] * ratios
        table.add_row(*own, *cells, style=STYLE.get(r.status) or None)
    return table


def floor_lines(rows) -> list[str]:
    """What the floor column was computed from: each residency's copy bandwidth measured in
    this run, and each package's weight bytes."""
    from harness.bench import bandwidths_of

    lines = []
    for bw in bandwidths_of(rows):
        value = "–" if bw["gb_per_s"] is None else f"{bw['gb_per_s']:.1f} GB/s"
        lines.append(f"[dim]bandwidth {bw['residency']}: {value} ({bw['how']})[/]")
    sizes = dict.fromkeys((r.package, r.weight_bytes) for r in rows
                          if r.measured and r.weight_bytes is not None)
    for package, nbytes in sizes:
        lines.append(f"[dim]weights {package}: {nbytes / 1e6:.3f} MB a decode step (the "
                     f"target's initializers)[/]")
    return lines


def notes(rows) -> list[str]:
    """One line per distinct reason (an unavailable engine, an error, a missing ratio)."""
    seen = dict.fromkeys(f"[{STYLE.get(r.status) or 'dim'}]{r.engine} ({r.package}): "
                         f"{r.status if not r.measured else 'note'}: {r.reason}[/]"
                         for r in rows if r.reason)
    return list(seen)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="decode speed per engine and package, side by side, as "
                                     "ratios to a baseline engine timed in the same run")
    p.add_argument("--engines", help="comma list (default: every registered engine)")
    p.add_argument("--packages", help="comma list of fixture names or package folders (default: "
                                      "every built-in fixture; in speculative mode every "
                                      "speculative fixture)")
    p.add_argument("--mode", choices=("greedy", "speculative"), default="greedy",
                   help="time greedy decoding, or speculative decoding at --width beside "
                        "greedy on the same prompts (default: greedy)")
    p.add_argument("--prompts", metavar="SETS",
                   help="comma list of prompt sets, each its own rows: grounded (repeat, edit "
                        "or summarise a given text or code), free (open questions), or a "
                        "JSONL file as lockstep run --prompts takes (default: each "
                        "package's first prompt)")
    p.add_argument("--width", metavar="N", type=integer("--width"),
                   help="speculative width (default: each package's max_width)")
    p.add_argument("--repeats", type=integer("--repeats"), default=5,
                   help="timed decodes per engine (default 5)")
    p.add_argument("--warmup", type=integer("--warmup", minimum=0), default=1,
                   help="untimed greedy decodes per engine first (default 1)")
    p.add_argument("--max-new-tokens", type=integer("--max-new-tokens"), default=32, metavar="N",
                   help="tokens each timed decode generates (default: 32)")
    p.add_argument("--ignore-eos", action="store_true",
                   help="for timing: every decode, greedy or speculative, goes on past eos "
                        "and produces exactly --max-new-tokens tokens (a decode that stops "
                        "short is an error row); parity runs never ignore eos")
    p.add_argument("--pipelined", action="store_true",
                   help="greedy decodes queue each next forward before the last token id is "
                        "read back (the same tokens; where an engine's tensor ops keep a "
                        "device feed), to time the host work hidden behind the device's; in "
                        "speculative mode, on a device, a prompt-lookup decode's plain steps "
                        "too, its rounds shifted onto the forward queued before them (a round "
                        "reads its accept count before the next)")
    p.add_argument("--interleave", action="store_true",
                   help="load every package's engines at once and time them all in one "
                        "rotation, so ratios across packages (dtypes, caches) are measured "
                        "side by side too (default: one package at a time)")
    p.add_argument("--profile", action="store_true",
                   help="after timing, decode once more (greedy, untimed) under cProfile and "
                        "show where the time went: the host functions, and for an engine that "
                        "replays a CUDA graph, one forward's device time beside the steady "
                        "step and its kernels (torch's profiler, where torch is importable)")
    p.add_argument("--warmup-steps", type=integer("--warmup-steps", minimum=0), metavar="K",
                   help=f"decode steps at the start of every timed decode left out of the "
                        f"steady decode median (default {WARMUP_STEPS}, fewer where the decode "
                        f"is shorter); must leave at least one of the --max-new-tokens - 1 "
                        f"decode steps")
    p.add_argument("--baseline", default=REFERENCE_ENGINE,
                   help=f"the engine every ratio is taken against (default {REFERENCE_ENGINE}); "
                        f"it joins --engines when missing")
    p.add_argument("--compare-to", metavar="ENGINES",
                   help="comma list of further engines each row is divided by too, a column "
                        "each beside the baseline's ratio (e.g. the baseline hf-cuda, "
                        "--compare-to ort-cuda: both ratios from one table); each joins "
                        "--engines when missing")
    json_output(p, "the rows")
    # library names -> options (harness.cli.main); --engines is checked before the bench
    p.set_defaults(func=run, fields={"package": "--packages", "engine": "--baseline",
                                     "baseline": "--baseline", "width": "--width",
                                     "compare_to": "--compare-to",
                                     "max_new_tokens": "--max-new-tokens",
                                     "prompt_sets": "--prompts"})


def _check_warmup_steps(steps: int | None, new_tokens: int) -> None:
    """A decode of N tokens has at most N - 1 decode steps (the prefill makes the first): the
    K given must leave one for the steady median, which would otherwise time a step it was
    told to leave out (the default shrinks to fit, silently)."""
    if steps and steps >= new_tokens - 1:
        fewer = f"give --warmup-steps {new_tokens - 2} or fewer, or " if new_tokens > 2 else ""
        raise InputError(f"--warmup-steps {steps} leaves no decode step of --max-new-tokens "
                         f"{new_tokens} to time (the prefill makes the first token: "
                         f"{new_tokens - 1} decode step(s) at most)", field="--warmup-steps",
                         value=steps, remedy=f"{fewer}raise --max-new-tokens to {steps + 2} "
                                             f"or more")


def run(args: argparse.Namespace) -> int:
    from harness.bench import MARKER, plan_bench, run_bench, write_json
    from harness.decode_profile import DecodeProfile
    from harness.packages import fixture_names

    if args.json is not None:  # before the minutes of timing whose rows it would receive
        check_output_file(args.json, "--json", marker=MARKER, force=args.force,
                          example="bench.json")

    console = Console(width=shutil.get_terminal_size((160, 24)).columns)
    width = args.width
    if width is not None and args.mode != "speculative":
        raise InputError("--width applies to speculative decoding only", field="--width",
                         value=args.width, remedy="add --mode speculative, or drop --width")
    _check_warmup_steps(args.warmup_steps, args.max_new_tokens)
    engines = engine_list(args.engines, "--engines") or engine_names()
    if args.packages is not None:
        packages = name_list(args.packages, "--packages")
    elif args.mode == "speculative":
        from harness.catalog.builtin import speculative_fixtures

        packages = list(speculative_fixtures())
    else:
        packages = fixture_names()
    plan = plan_bench(engines, packages, mode=args.mode, width=width, repeats=args.repeats,
                      max_new_tokens=args.max_new_tokens, baseline=args.baseline,
                      warmup=args.warmup, ignore_eos=args.ignore_eos,
                      warmup_steps=WARMUP_STEPS if args.warmup_steps is None
                      else args.warmup_steps, pipelined=args.pipelined,
                      interleave=args.interleave, profile=args.profile,
                      prompt_sets=name_list(args.prompts, "--prompts") if args.prompts is not None
                      else None,
                      compare_to=engine_list(args.compare_to, "--compare-to") or ())

    with CellProgress("bench", unit="decodes") as progress:  # on stderr; plain lines in CI
        progress.plan(plan.total_decodes)

        rows = run_bench(plan, lambda n, text: progress.advance(text, n))

    print_table(console, bench_table(rows, plan))
    for line in floor_lines(rows) + notes(rows):
        console.print(line, highlight=False)
    for r in rows:
        if r.profile is not None:
            text = DecodeProfile.from_dict(r.profile).text(f"{r.engine} on {r.package}")
            console.print(text, highlight=False, markup=False)
    if args.json is not None:
        console.print(f"json: {write_json(rows, args.json, plan).resolve()}")
    return 1 if any(r.status == "error" for r in rows) else 0
