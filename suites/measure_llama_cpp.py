"""Measure ``llama-cpp`` on SmolLM2 Q4_1 against the float32 oracle: the figures that seed
the quantized band (issue 34).

    .venv/bin/python -m suites.measure_llama_cpp --tokens 64 -o llama_cpp.json

Ten prompts (the six shipped real prompts and four more, text and chat) are decoded greedily
by llama-cpp with its float32 logits rows; each row is compared with the oracle's on
llama-cpp's own prefix (``oracle_for``: lockstep's float32 conversion of the same GGUF,
its weights dequantized exactly, on ort-cpu), the quantity the judge reads. Per step: is the
token the oracle's argmax, how far below the oracle's best it is, the KL divergence of
llama-cpp's distribution from the oracle's (the oracle as P), NMSE and max abs of the row;
per run the totals and llama-cpp's tokens/s. ``suites/test_llama_cpp.py`` uses the same
functions. The oracle scores each stream in one forward (``Oracle.stream_rows``), as the
judge does.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

# four more prompts beside the six of fixtures/prompts/real.yaml: (name, kind, topic, text)
EXTRA_PROMPTS = (
    ("chat_sky", "chat", "prose", "Why is the sky blue? Explain in two sentences."),
    ("chat_units", "chat", "numbers", "How many seconds are there in three hours?"),
    ("plain_letter", "plain", "prose", "Dear neighbours, we are writing to let you know that"),
    ("plain_loop", "plain", "code", "for i in range(10):\n    if i % 2 == 0:\n"),
)


def log_softmax(row: np.ndarray) -> np.ndarray:
    row = np.asarray(row, dtype=np.float64)
    shifted = row - row.max()
    return shifted - np.log(np.exp(shifted).sum())


def step_stats(engine_row, oracle_row, token: int) -> dict:
    """One step: the engine's token and row against the oracle's row on the same prefix."""
    e = np.asarray(engine_row, dtype=np.float64)
    o = np.asarray(oracle_row, dtype=np.float64)
    log_p, log_q = log_softmax(o), log_softmax(e)
    diff = e - o
    return {"token": int(token), "own_argmax": int(np.argmax(e)) == token,
            "oracle_argmax": int(np.argmax(o)) == token,
            "gap": float(o.max() - o[token]),
            "kl": float(np.sum(np.exp(log_p) * (log_p - log_q))),
            "nmse": float((diff ** 2).sum() / (o ** 2).sum()),
            "max_abs": float(np.abs(diff).max()),
            "finite": bool(np.isfinite(e).all())}


def summarize(steps: list[dict]) -> dict:
    """Totals over steps: agreement with the oracle's argmax, the worst gap below its best,
    KL mean / p99 / max, NMSE (median and worst row), max abs."""
    kl = np.array([s["kl"] for s in steps])
    nmse = np.array([s["nmse"] for s in steps])
    return {"steps": len(steps),
            "oracle_argmax": sum(s["oracle_argmax"] for s in steps),
            "own_argmax": sum(s["own_argmax"] for s in steps),
            "worst_gap": max(s["gap"] for s in steps),
            "kl_mean": float(kl.mean()), "kl_p99": float(np.percentile(kl, 99)),
            "kl_max": float(kl.max()), "nmse_median": float(np.median(nmse)),
            "nmse_max": float(nmse.max()), "max_abs": max(s["max_abs"] for s in steps),
            "finite": all(s["finite"] for s in steps)}


def measure_stream(engine, oracle, prompt, tokens: int, fed=None) -> tuple[list[dict], object]:
    """Decode ``fed`` (default ``prompt``) on ``engine`` with its rows, and compare each row
    with the oracle's on ``prompt`` plus the engine's tokens so far. ``fed`` other than
    ``prompt`` plants a prompt bug (a dropped BOS) that the comparison must show."""
    result = engine.generate(list(fed if fed is not None else prompt), tokens, audit=True)
    rows = oracle.stream_rows(prompt, result.tokens)  # one more: the row after the last
    return [step_stats(row, ref, token) for token, row, ref
            in zip(result.tokens, result.logits, rows)], result


def prompts(package) -> list[tuple[str, str, list[int]]]:
    """(name, kind, ids) of the shipped real prompts and ``EXTRA_PROMPTS``, tokenized by the
    package's tokenizer (chat ones through ChatML, as the shipped ones are)."""
    from engines.tokenizer import package_tokenizer
    from fixtures.real_checkpoints import RealPrompt, load_prompts

    tokenizer = package_tokenizer(package)
    chosen = load_prompts() + [RealPrompt(*p) for p in EXTRA_PROMPTS]
    return [(p.name, p.kind, tokenizer.encode(p.render())) for p in chosen]


def measure(tokens: int, threads: int | None) -> dict:
    from engines.backends.llama_cpp import LlamaCppEngine
    from engines.oracle import oracle_for
    from engines.package import load_package
    from harness.convert.smollm2 import smollm2_package

    package = load_package(smollm2_package(cache="dynamic", dtype="float32"))
    engine = LlamaCppEngine(package, threads=threads)
    oracle = oracle_for(package)
    runs, everything = [], []
    for name, kind, ids in prompts(package):
        steps, result = measure_stream(engine, oracle, ids, tokens)
        everything += steps
        runs.append({"prompt": name, "kind": kind, "prompt_tokens": len(ids),
                     "tokens_per_s": result.tokens_per_s, "summary": summarize(steps),
                     "steps": steps})
    timed = [r for r in runs if r["summary"]["steps"] == tokens]
    return {"engine": engine.provenance(), "oracle": oracle.name, "tokens": tokens,
            "summary": summarize(everything),
            "tokens_per_s_median": float(np.median([r["tokens_per_s"] for r in timed or runs])),
            "runs": runs}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("-o", "--out", default=None, help="write every step as JSON here")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    report = measure(args.tokens, args.threads)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)
    print(f"{'prompt':16} {'kind':6} steps  argmax  worst gap  KL mean   KL p99   "
          f"NMSE med  NMSE max  max abs  tok/s")
    for run in report["runs"] + [{"prompt": "all", "kind": "", "tokens_per_s":
                                  report["tokens_per_s_median"], "summary": report["summary"]}]:
        s = run["summary"]
        print(f"{run['prompt']:16} {run['kind']:6} {s['steps']:5}  {s['oracle_argmax']:6}  "
              f"{s['worst_gap']:9.4f}  {s['kl_mean']:.2e}  {s['kl_p99']:.2e}  "
              f"{s['nmse_median']:.2e}  {s['nmse_max']:.2e}  {s['max_abs']:7.3f}  "
              f"{run['tokens_per_s']:5.0f}")
    print(f"({time.perf_counter() - start:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
