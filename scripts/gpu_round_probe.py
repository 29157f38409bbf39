"""Where a speculative round's time goes on native-cuda (issue 37, point 2): host time of each
piece of a round against the device time of the forwards it queues.

A random SmolLM2-shaped float16 package (static cache) with a prompt-lookup section, a prompt
that repeats itself so the proposer finds matches. Each piece of a round is wrapped with a
``perf_counter_ns`` accumulator (no profiler); the verification's remaining device time is
measured by synchronising the stream before the accept (``wait``), so the accept's own figure
is its kernels and readback alone; the prefill is left out. The device time of one VERIFY (M = W + 1) and one PRIMARY
(M = 1) replay is timed apart, back to back with nothing else queued; the classic and the
shifted speculative loops are timed side by side first (``spec_ms_per_token_by_loop``,
medians of 3 alternating turns). Printed, and written
as JSON to ``$OUT/round_probe.json``. Usage (repo root, GPU image): python
scripts/gpu_round_probe.py [WIDTH] [TOKENS]; ENGINE=native-host (and LAYERS=2) runs it on the
host: a dry run of the script, not a figure.
"""
from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

SHAPE = dict(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=49152,
             tied=True, cache="static", max_context=512)
PHRASE = [(37 * i + 11) % 49000 + 50 for i in range(40)]  # the prompt: this, three times


def shape_package(folder: Path, layers: int | None = None) -> Path:
    """The probes' random SmolLM2-shaped float16 package (mixed precision, static cache, a
    prompt that repeats itself) at ``folder``; ``layers`` (default SHAPE's) for a dry run."""
    from harness.convert.llama_graph import LlamaConfig, build_llama

    shape = dict(SHAPE, layers=layers or SHAPE["layers"])
    return build_llama(folder, LlamaConfig(**shape, dtype="float16", precision="mixed"),
                       [PHRASE * 3], name="smollm2_shape_float16")


SPENT: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # label -> [ns, calls]
PREFILL: list[bool] = []  # non-empty while a prefill forward runs


def timed(owner, name: str, label: str | None = None) -> None:
    """Wrap ``owner.name`` so its calls add their wall time to ``SPENT[label]``; while the
    prefill runs (eager, a whole prompt) nothing is counted, so the figures are the rounds'."""
    inner = getattr(owner, name, None)
    if inner is None:  # native-host (a dry run) has no graph slots
        return
    label = label or f"{getattr(owner, '__name__', type(owner).__name__)}.{name}"

    def wrapper(*args, **kwargs):
        if PREFILL:
            return inner(*args, **kwargs)
        t0 = time.perf_counter_ns()
        try:
            return inner(*args, **kwargs)
        finally:
            entry = SPENT[label]
            entry[0] += time.perf_counter_ns() - t0
            entry[1] += 1
    setattr(owner, name, wrapper)


def device_ms(sync, session, tokens, phase: str, repeats: int = 50) -> float:
    start = session.position
    for _ in range(3):
        session.position = start
        session.forward(tokens, phase)
    sync()
    t0 = time.perf_counter()
    for _ in range(repeats):
        session.position = start
        session.forward(tokens, phase)
    sync()
    session.position = start
    return 1e3 * (time.perf_counter() - t0) / repeats


def install_timers(engine, sync) -> None:
    """Wrap each piece of a round with ``timed`` (the prefill's calls left out), and time
    how long the accept waits for the verification's device work before it starts."""
    from engines.native import graph_slots
    from engines.workflow.prompt_lookup import PromptLookupProposer
    from engines.workflow.session import DecodeSession
    from engines.workflow.state import DecodeState

    ops = type(engine.tensor_ops)  # made again for every decode (reset_ledger)
    timed(DecodeSession, "forward")
    forward = DecodeSession.forward  # the timed one, called with PREFILL set for a prefill

    def forward_of_phase(self, tokens, phase):
        if phase == "prefill":
            PREFILL.append(True)
            try:
                return forward(self, tokens, phase)
            finally:
                PREFILL.clear()
        return forward(self, tokens, phase)
    DecodeSession.forward = forward_of_phase
    timed(DecodeSession, "_run")
    timed(DecodeSession, "rollback")
    timed(DecodeState, "absorb")
    timed(DecodeState, "feeds")
    timed(PromptLookupProposer, "propose")
    timed(PromptLookupProposer, "after_round")
    timed(engine, "run_component", "engine.run_component")
    timed(graph_slots.GraphSlots, "run", "slots.run")
    timed(graph_slots.SlotState, "holds", "slot.holds")
    timed(graph_slots.SlotState, "replay", "slot.replay")
    timed(graph_slots.SlotState, "run", "slot.run (not held: signature, capture, eager)")
    timed(graph_slots.CupyGraphDevice, "copy_many", "device.copy_many")
    timed(graph_slots.CupyGraphDevice, "launch", "device.launch (graph)")
    timed(type(engine), "publish_memory", "engine.publish_memory")
    timed(type(engine), "_device_empties", "engine._device_empties")
    timed(ops, "adopt", "ops.adopt")
    timed(ops, "adopt_feeds", "ops.adopt_feeds")
    timed(ops, "slice_axis", "ops.slice_axis")
    timed(ops, "accept_drafts", "ops.accept_drafts (after the wait)")
    waits = SPENT["wait: device time left at the accept"]
    real_accept = ops.accept_drafts

    def accept(*args, **kwargs):
        t = time.perf_counter_ns()
        sync()
        waits[0] += time.perf_counter_ns() - t
        waits[1] += 1
        return real_accept(*args, **kwargs)
    ops.accept_drafts = accept


def verify_launch_ab(engine, session, sync, width: int, turns: int = 3) -> dict:
    """A VERIFY replay's device ms with plain launches (the engine's choice since run 14,
    when dependent launches made a 5-row replay 10% slower) against dependent ones, at
    W + 1 and 5 rows, in alternating turns (the slot captured afresh for each)."""
    from engines.backends import native_cuda
    from engines.native.graph_slots import GraphSlot

    plain = native_cuda.plain_launches
    found: dict = {}
    try:
        for _ in range(turns):
            for launches, context in (("plain", plain), ("dependent", contextlib.nullcontext)):
                native_cuda.plain_launches = context
                for rows in sorted({5, width + 1}):
                    engine.reset_slot(GraphSlot.VERIFY)
                    found.setdefault(f"{launches} M={rows}", []).append(
                        round(device_ms(sync, session, [5] * rows, "verify"), 4))
    finally:
        native_cuda.plain_launches = plain
        engine.reset_slot(GraphSlot.VERIFY)
    return found


def main(width: int = 8, tokens: int = 128) -> dict:
    from engines.registry import get_engine_class
    from engines.workflow import greedy_decode
    from engines.workflow import speculative as spec_mod
    from engines.workflow.session import DecodeSession
    from suites.lookup_support import with_prompt_lookup

    root = Path(tempfile.mkdtemp(prefix="round-probe-"))
    built = shape_package(root / "base", int(os.environ.get("LAYERS", SHAPE["layers"])))
    prompt = PHRASE * 3
    package = with_prompt_lookup(built, root / "lookup", width)
    engine = get_engine_class(os.environ.get("ENGINE", "native-cuda"))(package)
    stream = getattr(engine, "stream", None)  # native-host (a dry run here): nothing to wait
    sync = stream.synchronize if stream is not None else (lambda: None)
    out: dict = {"width": width, "tokens": tokens, "prompt": len(prompt)}
    try:
        greedy = greedy_decode(engine, prompt, tokens, ignore_eos=True, pipelined=True)
        spec_mod.speculative_decode(engine, prompt, tokens, width, ignore_eos=True)  # warm
        t0 = time.perf_counter()
        greedy = greedy_decode(engine, prompt, tokens, ignore_eos=True, pipelined=True)
        out["greedy_ms_per_token"] = 1e3 * (time.perf_counter() - t0) / tokens
        out["greedy_step_ms_median"] = 1e3 * statistics.median(greedy.step_s[1:])
        # the two speculative loops side by side, alternating: classic and shifted rounds
        loops: dict[str, list[float]] = {"classic": [], "shifted": []}
        for _ in range(3):
            for loop, pipelined in (("classic", False), ("shifted", True)):
                t0 = time.perf_counter()
                run = spec_mod.speculative_decode(engine, prompt, tokens, width,
                                                  ignore_eos=True, pipelined=pipelined)
                sync()
                loops[loop].append(1e3 * (time.perf_counter() - t0) / tokens)
                out[f"{loop}_same_tokens"] = run.tokens == greedy.tokens
                out[f"{loop}_shifted_rounds"] = sum(run.shifted_per_round)
        out["spec_ms_per_token_by_loop"] = {k: statistics.median(v) for k, v in loops.items()}

        install_timers(engine, sync)
        t0 = time.perf_counter()
        result = spec_mod.speculative_decode(engine, prompt, tokens, width, ignore_eos=True)
        wall = time.perf_counter() - t0
        rounds = len(result.widths_per_round)
        out.update({
            "spec_ms_per_token": 1e3 * wall / tokens,
            "same_tokens": result.tokens == greedy.tokens,
            "rounds": rounds, "plain_steps": len(result.step_s) - 1 - rounds,
            "accepted": sum(result.acceptance_per_round),
            "round_ms_median": 1e3 * statistics.median(result.step_s[1:]),
            "pieces_ms_per_round": {k: round(v[0] / 1e6 / max(rounds, 1), 4)
                                    for k, v in sorted(SPENT.items())},
            "pieces_calls": {k: v[1] for k, v in sorted(SPENT.items())},
        })
        session = DecodeSession(engine)
        session.forward(prompt, "prefill")
        out["device_ms_primary"] = device_ms(sync, session, [5], "decode")
        out["device_ms_verify"] = device_ms(sync, session, [5] * (width + 1), "verify")
        if stream is not None:
            out["verify_launches"] = verify_launch_ab(engine, session, sync, width)
    finally:
        engine.close()
    return out


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    found = main(*args)
    text = json.dumps(found, indent=1)
    print(text)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "round_probe.json").write_text(text)
