"""Why a speculative decode's prefill measured slower than greedy's on long prompts (issue 37,
docs/evidence/2026-12-04-h200: 61.4 against 41.1 ms on the grounded prompts, 18.8 against
19.4 on the short free ones).

Both loops run the same prefill forward (``DecodeSession.forward(prompt, "prefill")``) and
read one token back, so the probe times that forward alone, with the stream synchronised on
both sides, in the order a bench row runs it: after a greedy decode, after a speculative
decode, and with CuPy's memory pool emptied first (every activation then needs a new
``cudaMalloc``). Beside each time: the pool's held and used bytes before and after. A random
SmolLM2-shaped float16 package (static cache, prompt lookup at ``WIDTH``), prompts of
``LENGTHS`` tokens. Printed, and written as JSON to
``$OUT/prefill_probe.json``. Usage (repo root, GPU image):
``python scripts/gpu_prefill_probe.py [WIDTH] [LENGTHS...]``; ``ENGINE=native-host
LAYERS=2`` runs it on the host (a dry run of the script, not a figure).

``PACKAGE=FOLDER`` (a converted package with a prompt-lookup section, such as
``gpu_bench_floor.sh`` writes) times the bench's own case instead: its grounded prompts, each
decode to eos as a bench row runs it (``TOKENS``, 128) and past eos (``ignore_eos``), greedy
(the pipelined loop) and speculative at ``WIDTH``, every step-0 time and the lone forward
after each.

What it found (docs/evidence/2026-12-04-h200-prefill): the two loops' prefills are equal; the
bench's were slow because its step memos kept too few signatures for two prompt sets.
"""
from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

SHAPE = dict(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=49152,
             tied=True, cache="static", max_context=1024)
REPEATS = int(os.environ.get("REPEATS", 5))


def pool_state() -> dict:
    try:
        import cupy
    except ImportError:  # the host dry run
        return {}
    pool = cupy.get_default_memory_pool()
    return {"held_mb": round(pool.total_bytes() / 2**20, 1),
            "used_mb": round(pool.used_bytes() / 2**20, 1)}


def empty_pool() -> None:
    try:
        import cupy
    except ImportError:
        return
    cupy.get_default_memory_pool().free_all_blocks()


def prefill_ms(engine, sync, prompt) -> tuple[float, dict, dict]:
    """One prefill forward on a fresh session, its token read back: ms, pool before, after."""
    from engines.workflow.proposers import argmax_last_row
    from engines.workflow.session import DecodeSession

    session = DecodeSession(engine)
    sync()
    before = pool_state()
    t0 = time.perf_counter()
    out = session.forward(prompt, "prefill")
    argmax_last_row(engine.tensor_ops, out["logits"])
    sync()
    ms = 1e3 * (time.perf_counter() - t0)
    return ms, before, pool_state()


def main(width: int = 7, *lengths: int) -> dict:
    from engines.registry import get_engine_class
    from engines.workflow import greedy_decode
    from engines.workflow import speculative as spec_mod
    from harness.convert.llama_graph import LlamaConfig, build_llama
    from suites.lookup_support import with_prompt_lookup

    lengths = lengths or (32, 128, 400)
    root = Path(tempfile.mkdtemp(prefix="prefill-probe-"))
    shape = dict(SHAPE, layers=int(os.environ.get("LAYERS", SHAPE["layers"])))
    config = LlamaConfig(**shape, dtype="float16", precision="mixed")
    phrase = [(37 * i + 11) % 49000 + 50 for i in range(40)]
    prompts = {n: (phrase * (n // len(phrase) + 1))[:n] for n in lengths}
    built = build_llama(root / "base", config, list(prompts.values()),
                        name="smollm2_shape_float16")
    package = with_prompt_lookup(built, root / "lookup", width)
    engine = get_engine_class(os.environ.get("ENGINE", "native-cuda"))(package)
    sync = engine.synchronize  # the engine's own wait for its stream (none on a host)
    out: dict = {"width": width, "lengths": list(lengths), "repeats": REPEATS, "rows": []}
    try:
        for n, prompt in prompts.items():  # warm every shape and both loops once
            greedy_decode(engine, prompt, 8, ignore_eos=True, pipelined=True)
            spec_mod.speculative_decode(engine, prompt, 8, width, ignore_eos=True)
        for n, prompt in prompts.items():
            seen: dict[str, list] = {"greedy step 0": [], "spec step 0": [],
                                     "forward after greedy": [], "forward after spec": [],
                                     "forward, pool emptied": []}
            pools: dict[str, list] = {k: [] for k in seen}
            for _ in range(REPEATS):
                g = greedy_decode(engine, prompt, 16, ignore_eos=True, pipelined=True)
                seen["greedy step 0"].append(1e3 * g.step_s[0])
                ms, before, after = prefill_ms(engine, sync, prompt)
                seen["forward after greedy"].append(ms)
                pools["forward after greedy"].append((before, after))
                s = spec_mod.speculative_decode(engine, prompt, 16, width, ignore_eos=True)
                seen["spec step 0"].append(1e3 * s.step_s[0])
                ms, before, after = prefill_ms(engine, sync, prompt)
                seen["forward after spec"].append(ms)
                pools["forward after spec"].append((before, after))
                empty_pool()
                ms, before, after = prefill_ms(engine, sync, prompt)
                seen["forward, pool emptied"].append(ms)
                pools["forward, pool emptied"].append((before, after))
            row = {"prompt": n}
            for key, values in seen.items():
                row[key] = {"median_ms": round(statistics.median(values), 3),
                            "ms": [round(v, 3) for v in values]}
                if pools[key]:
                    row[key]["pool_before_after"] = pools[key][-1]
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
    finally:
        engine.close()
    return out


def real_main(folder: str, width: int = 7) -> dict:
    from engines.package import load_package
    from engines.registry import get_engine_class
    from engines.workflow import greedy_decode
    from engines.workflow import speculative as spec_mod
    from harness.prompts import prompt_set_file, read_prompts_file, resolve_all

    package = load_package(folder)
    tokens = int(os.environ.get("TOKENS", 128))
    prompts = {name: r.ids for name, r in
               resolve_all(read_prompts_file(prompt_set_file("grounded")), package)}
    engine = get_engine_class(os.environ.get("ENGINE", "native-cuda"))(package)
    sync = engine.synchronize  # the engine's own wait for its stream (none on a host)
    out: dict = {"package": package.spec.name, "width": width, "tokens": tokens,
                 "repeats": REPEATS, "rows": []}
    try:
        for prompt in prompts.values():  # the bench's warm-up: greedy, then speculative
            greedy_decode(engine, prompt, tokens, pipelined=True)
            spec_mod.speculative_decode(engine, prompt, tokens, width)
        for name, prompt in prompts.items():
            seen: dict[str, list] = {}
            for _ in range(REPEATS):
                for ignore in (False, True):
                    tag = " past eos" if ignore else ""
                    sync()
                    g = greedy_decode(engine, prompt, tokens, ignore_eos=ignore, pipelined=True)
                    seen.setdefault("greedy step 0" + tag, []).append(1e3 * g.step_s[0])
                    seen.setdefault("greedy tokens" + tag, []).append(len(g.tokens))
                    seen.setdefault("forward after greedy" + tag, []).append(
                        prefill_ms(engine, sync, prompt)[0])
                    sync()
                    s = spec_mod.speculative_decode(engine, prompt, tokens, width,
                                                    ignore_eos=ignore)
                    seen.setdefault("spec step 0" + tag, []).append(1e3 * s.step_s[0])
                    seen.setdefault("spec step 1" + tag, []).append(
                        1e3 * s.step_s[1] if len(s.step_s) > 1 else 0.0)
                    seen.setdefault("forward after spec" + tag, []).append(
                        prefill_ms(engine, sync, prompt)[0])
            row = {"prompt": name, "length": len(prompt)}
            row.update({k: {"median": round(statistics.median(v), 3),
                            "all": [round(x, 3) for x in v]} for k, v in seen.items()})
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
    finally:
        engine.close()
    return out


if __name__ == "__main__":
    args = [int(a) for a in sys.argv[1:]]
    if os.environ.get("PACKAGE"):
        found = real_main(os.environ["PACKAGE"], *args[:1])
    else:
        found = main(*args)
    text = json.dumps(found, indent=1)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "prefill_probe.json").write_text(text)
