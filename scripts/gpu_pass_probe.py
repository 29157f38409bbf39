"""Where the bench's speculative pass spends what its forwards do not (issue 37, point 2).

The round probe (``gpu_round_probe.py``) times one self-repeating prompt, rounds after rounds;
the bench's grounded set mixes plain steps, shifted and classic rounds, and on the H200
(2026-12-05) its passes were 20 to 35 ms longer than their forwards' device time, by the
probe's own costs. This runs the bench's pass on a converted package with prompt lookup
(``PACKAGE``, default the bench's float16 conversion): every prompt of ``PROMPTS`` (default
grounded), eos stopping as in the bench, pipelined as the bench runs it, after one warm-up
of each. Timed, in ``TURNS`` alternating turns: the greedy and the speculative pass (wall,
prefills, tokens). Then one speculative pass with every piece of a round wrapped
(``install_timers``), its forwards counted by kind from the ledgers, and the PRIMARY and
VERIFY replays' device time after the first prompt's prefill: ``unaccounted_ms`` is the pass's wall
after its prefills less its forwards at those costs, what the host leaves the device idle.
Printed, and written to ``$OUT/pass_probe.json``. Usage (repo root, GPU image): python
scripts/gpu_pass_probe.py [WIDTH]; ``ENGINE=native-host TOKENS=8 MAX_PROMPTS=1
PACKAGE=...`` dry-runs it on a CPU (not a figure).
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.gpu_round_probe import SPENT, device_ms, install_timers  # noqa: E402
from scripts.spec_loop_counts import counts  # noqa: E402

PACKAGE = os.environ.get("PACKAGE", "/tmp/lockstep-lookup/smollm2-static-float16-lookup7")
TOKENS = int(os.environ.get("TOKENS", 128))
TURNS = int(os.environ.get("TURNS", 3))


def passes(engine, prompts: dict, width: int, speculative: bool) -> dict:
    """One pass over ``prompts`` as the bench times it: (wall ms, prefill ms, tokens, the
    decodes' results)."""
    from engines.workflow import greedy_decode
    from engines.workflow import speculative as spec_mod

    engine.synchronize()
    t0 = time.perf_counter()
    runs = [spec_mod.speculative_decode(engine, ids, TOKENS, width) if speculative
            else greedy_decode(engine, ids, TOKENS, pipelined=True) for ids in prompts.values()]
    engine.synchronize()
    wall = 1e3 * (time.perf_counter() - t0)
    return {"wall_ms": wall, "prefill_ms": sum(1e3 * r.step_s[0] for r in runs),
            "tokens": sum(len(r.tokens) for r in runs), "runs": runs}


def main(width: int = 7) -> dict:
    from engines.package import load_package
    from engines.registry import get_engine_class
    from engines.workflow.session import DecodeSession
    from harness.prompts import prompt_set_file, read_prompts_file, resolve_all

    package = load_package(PACKAGE)
    chosen = list(resolve_all(read_prompts_file(prompt_set_file(
        os.environ.get("PROMPTS", "grounded"))), package))
    prompts = {name: r.ids for name, r in chosen[:int(os.environ.get("MAX_PROMPTS", 99))]}
    engine = get_engine_class(os.environ.get("ENGINE", "native-cuda"))(package)
    sync = engine.synchronize
    out: dict = {"package": package.spec.name, "width": width, "tokens": TOKENS,
                 "prompts": list(prompts), "turns": TURNS}
    try:
        for speculative in (False, True):  # the bench's warm-up
            passes(engine, prompts, width, speculative)
        turns: dict[str, list[dict]] = {"greedy": [], "speculative": []}
        for _ in range(TURNS):
            for kind in turns:
                found = passes(engine, prompts, width, kind == "speculative")
                found.pop("runs")
                turns[kind].append(found)
        for kind, rows in turns.items():
            out[kind] = {key: statistics.median(r[key] for r in rows)
                         for key in ("wall_ms", "prefill_ms", "tokens")}
            out[kind]["walls_ms"] = [round(r["wall_ms"], 3) for r in rows]
        out["x_greedy"] = out["greedy"]["wall_ms"] / out["speculative"]["wall_ms"]
        install_timers(engine, sync)
        probed = passes(engine, prompts, width, True)
        kinds = counts(probed.pop("runs"))  # the target's forwards by kind, summed
        rounds = kinds["shifted_rounds"] + kinds["classic_rounds"]
        pieces = {k: (round(v[0] / 1e6, 3), v[1]) for k, v in sorted(SPENT.items())}
        session = DecodeSession(engine)  # its forwards are timed too: after the snapshot
        session.forward(next(iter(prompts.values())), "prefill")
        primary = device_ms(sync, session, [5], "decode")
        verify = device_ms(sync, session, [5] * (width + 1), "verify")
        device = kinds["decode"] * primary + kinds["verify"] * verify
        after_prefills = probed["wall_ms"] - probed["prefill_ms"]
        out["probed_pass"] = {
            **{k: round(v, 3) for k, v in probed.items()}, **kinds, "rounds": rounds,
            "device_ms_primary": primary, "device_ms_verify": verify,
            "forwards_device_ms": device, "after_prefills_ms": after_prefills,
            "unaccounted_ms": after_prefills - device,
            "unaccounted_ms_per_round": (after_prefills - device) / max(rounds, 1),
            "pieces_ms": {k: v[0] for k, v in pieces.items()},
            "pieces_calls": {k: v[1] for k, v in pieces.items()}}
    finally:
        engine.close()
    return out


if __name__ == "__main__":
    found = main(*[int(a) for a in sys.argv[1:]])
    text = json.dumps(found, indent=1)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "pass_probe.json").write_text(text)
