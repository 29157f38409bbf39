"""What each speculative loop runs on SmolLM2's prompt sets, counted on the CPU.

``engines.workflow.speculative`` has two loops for a prompt-lookup decode: the classic one
(``pipelined=False``: each plain step reads its id before the next forward is launched) and the
shifted one (the default on a device: plain steps pipelined, the round after one judged partly
by the forward queued before it). Both must give the same tokens; they differ in what the target
runs. This decodes every prompt of each set both ways on ``ort-cpu`` (its ids counted as read
asynchronously, as a device's, so the shifted loop runs there; SmolLM2 float32 with its
prompt-lookup section, eos stopping as in the bench and the parity runs), checks the streams
against each other and greedy's, and counts per loop: the target's forwards by kind (plain
reads, head forwards of shifted rounds, forwards undone past eos), shifted and classic rounds,
accepted drafts. CPU wall times are not what a GPU would see; the counts are.

``--costs`` prices the counts with a device's measured costs (ms: a decode forward, a
verification, the host's time a plain step and a round leave the device idle), a model of
each loop's time against greedy's over the same tokens (``modeled``); ``--min-ngram N``
asks what the counts would be if the proposer drafted only on a match of at least N tokens
(the package's section is replaced in this process; its tokens must stay greedy's).

Usage: .venv/bin/python scripts/spec_loop_counts.py [--width 7] [--tokens 128] [--json OUT]
       [--min-ngram N] [--costs forward=0.743,verify=1.2,plain_host=0.114,round_host=1.06]
"""
from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from engines.package import load_package  # noqa: E402
from engines.registry import get_engine_class  # noqa: E402
from engines.tensor_ops.host import HostTensorOps  # noqa: E402
from engines.workflow import greedy_decode  # noqa: E402
from engines.workflow.speculative import speculative_decode  # noqa: E402
from harness.convert.smollm2 import smollm2_lookup_package  # noqa: E402
from harness.prompts import prompt_set_file, read_prompts_file, resolve  # noqa: E402


def counts(results) -> dict:
    """Summed over one set's decodes."""
    led = [r.ledger for r in results]
    decode = sum(x.forwards["decode"] for x in led)
    shifted = sum(x.shifted_verifications for x in led)
    return {"tokens": sum(len(r.tokens) for r in results),
            "verify": sum(x.forwards["verify"] for x in led),
            "decode": decode, "shifted_rounds": shifted,
            "classic_rounds": sum(x.proposals for x in led) - shifted,
            "plain_reads": decode - shifted - sum(x.discarded_forwards for x in led),
            "discarded": sum(x.discarded_forwards for x in led),
            "accepted": sum(x.accepted for x in led),
            "drafted": sum(sum(r.widths_per_round) for r in results),
            "cpu_wall_s": round(sum(r.wall_s for r in results), 3)}


COSTS = ("forward", "verify", "plain_host", "round_host")


def parse_costs(text: str) -> dict[str, float]:
    """``forward=...,verify=...,plain_host=...,round_host=...`` (ms), every one given."""
    costs = dict(item.split("=", 1) for item in text.split(",") if item)
    if sorted(costs) != sorted(COSTS):
        raise SystemExit(f"--costs needs exactly {', '.join(COSTS)} (ms each), got {text!r}")
    return {name: float(value) for name, value in costs.items()}


def modeled(loop: dict, greedy_steps: int, costs: dict[str, float]) -> dict:
    """A loop's counts priced: its decode forwards and verifications at their device cost,
    each plain read and each round at the host time it leaves the device idle; greedy is
    every token after a prompt's first as one forward and one plain read."""
    rounds = loop["shifted_rounds"] + loop["classic_rounds"]
    ms = (loop["decode"] * costs["forward"] + loop["verify"] * costs["verify"]
          + loop["plain_reads"] * costs["plain_host"] + rounds * costs["round_host"])
    greedy = greedy_steps * (costs["forward"] + costs["plain_host"])
    return {"ms": round(ms, 3), "greedy_ms": round(greedy, 3), "x_greedy": round(greedy / ms, 3)}


def with_min_ngram(package, n: int):
    """``package`` whose prompt-lookup section drafts only on matches of at least ``n``
    tokens (1 to its max_ngram)."""
    sp = package.spec.decoding.speculative
    if not 1 <= n <= sp.max_ngram:
        raise SystemExit(f"--min-ngram {n} is outside 1..{sp.max_ngram} (the package's "
                         f"max_ngram)")
    decoding = package.spec.decoding.model_copy(
        update={"speculative": sp.model_copy(update={"min_ngram": n})})
    package.spec = package.spec.model_copy(update={"decoding": decoding})
    return package


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--width", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--sets", default="grounded,free")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--min-ngram", type=int)
    ap.add_argument("--costs", type=parse_costs)
    args = ap.parse_args()
    # ort-cpu's host ops read ids at once, so a decode there keeps the classic loop; counted
    # as a device reads them, the shifted loop runs (the same tokens are asserted below)
    HostTensorOps.asynchronous_ids = True
    package = load_package(smollm2_lookup_package())
    if args.min_ngram is not None:
        package = with_min_ngram(package, args.min_ngram)
    engine = get_engine_class("ort-cpu")(package)
    import numpy
    import onnxruntime

    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True, cwd=Path(__file__).parent).stdout.strip()
    report = {"commit": commit or "unknown", "python": platform.python_version(),
              "onnxruntime": onnxruntime.__version__, "numpy": numpy.__version__,
              "package": package.spec.name, "engine": "ort-cpu", "width": args.width,
              "max_new_tokens": args.tokens,
              "min_ngram": package.spec.decoding.speculative.min_ngram,
              "costs_ms": args.costs, "sets": {}}
    for name in args.sets.split(","):
        greedy, loops = [], {"classic": [], "shifted": []}
        for source in read_prompts_file(prompt_set_file(name)):
            ids = list(resolve(source, package, args.tokens).ids)
            greedy.append(greedy_decode(engine, ids, args.tokens).tokens)
            for loop, pipelined in (("classic", False), ("shifted", True)):
                loops[loop].append(speculative_decode(engine, ids, args.tokens, args.width,
                                                      pipelined=pipelined))
        same = all(c.tokens == s.tokens == g for c, s, g in
                   zip(loops["classic"], loops["shifted"], greedy))
        report["sets"][name] = {"same_tokens": same,
                                **{loop: counts(r) for loop, r in loops.items()}}
        if args.costs:
            steps = sum(len(g) - 1 for g in greedy)
            for loop in loops:
                report["sets"][name][loop]["modeled"] = modeled(report["sets"][name][loop],
                                                               steps, args.costs)
        print(name, json.dumps(report["sets"][name]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")
    return 0 if all(s["same_tokens"] for s in report["sets"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
