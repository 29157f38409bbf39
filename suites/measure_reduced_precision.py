"""Measure a reduced-precision SmolLM2 package against its oracle: the figures behind the
float16 and bfloat16 rows of ``engines/tolerances.py``.

    .venv/bin/python -m suites.measure_reduced_precision --dtype float16 \
        --engines ort-cpu,native-host,onnx-reference --tokens 32 --same -o f16.json
    .venv/bin/python -m suites.measure_reduced_precision --dtype bfloat16 \
        --engines native-host,onnx-reference --tokens 32 -o bf16.json

Every default prompt is decoded greedily on each engine with its logits rows; each row is
compared with the reference's row on the engine's own prefix: the twin (``oracle_for``, the
float32 package on ort-cpu) and, with ``--same``, the package itself on ort-cpu (float16
only). Per step: max abs, NMSE and the gap error (the error on the reference's best logit
minus each of its next four, what a near-tie margin must cover); per stream the verdicts of
``judge_stream`` under the dtype's current row. The JSON holds every step; a summary table
is printed. On two cores a float16 run takes about 15 minutes, bfloat16 about 12.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

TOP = 5


def gap_errors(engine_rows, reference_rows) -> list[float]:
    out = []
    for engine_row, ref in zip(engine_rows, reference_rows):
        err = np.asarray(engine_row, dtype=np.float64) - ref
        top = np.argsort(-ref, kind="stable")[:TOP]
        out.append(float(np.abs(err[top[0]] - err[top[1:]]).max()))
    return out


def measure(dtype: str, engines: list[str], tokens: int, same: bool,
            max_prompts: int | None = None) -> dict:
    from engines.oracle import Oracle, oracle_for
    from engines.package import load_package
    from engines.registry import get_engine_class
    from engines.tolerances import tolerance_for
    from engines.workflow import greedy_decode
    from harness.convert.smollm2 import smollm2_package
    from harness.judgement import audit_logits, judge_stream

    pkg = load_package(smollm2_package(dtype=dtype))
    tol = tolerance_for(dtype)
    refs = {"twin": oracle_for(pkg)}
    if same:
        refs["same"] = Oracle(pkg, engine=get_engine_class("ort-cpu")(pkg))
    out = {"dtype": dtype, "package": pkg.content_hash, "tokens": tokens,
           "references": {k: {"engine": o.name, "package": o.package.content_hash}
                          for k, o in refs.items()}, "runs": []}
    for name in engines:
        engine = get_engine_class(name)(pkg)
        try:
            for i, prompt in enumerate(pkg.spec.prompts[:max_prompts]):
                start = time.perf_counter()
                result = greedy_decode(engine, prompt, tokens, audit=True)
                run = {"engine": name, "prompt": i, "tokens": result.tokens,
                       "seconds": time.perf_counter() - start}
                for key, oracle in refs.items():
                    rows = [oracle.row(list(prompt) + result.tokens[:s])
                            for s in range(len(result.tokens))]
                    j = judge_stream(oracle, prompt, result.tokens, tokens, tol, result.logits)
                    a = audit_logits(oracle, prompt, result.tokens, result.logits, tol)
                    run[key] = {
                        "verdict": j.verdict,
                        "findings": [{"step": f.step, "engine": f.engine_token,
                                      "oracle": f.oracle_token, "rank": f.rank, "gap": f.gap,
                                      "verdict": f.verdict} for f in j.findings],
                        "max_abs": [s.max_abs for s in a.steps],
                        "nmse": [s.nmse for s in a.steps],
                        "gap_error": gap_errors(result.logits, rows),
                        "non_finite_steps": a.non_finite_steps}
                out["runs"].append(run)
                print(f"{name} p{i} {run['seconds']:.0f}s", flush=True)
        finally:
            engine.close()
    return out


def summary(result: dict) -> list[str]:
    lines = [f"{result['dtype']}: reference, engine, steps, worst max abs, worst NMSE, "
             f"worst gap error, verdicts"]
    for key in result["references"]:
        for name in dict.fromkeys(r["engine"] for r in result["runs"]):
            runs = [r[key] for r in result["runs"] if r["engine"] == name]
            steps = sum(len(r["max_abs"]) for r in runs)
            worst = [max(v for r in runs for v in r[m]) for m in ("max_abs", "nmse", "gap_error")]
            verdicts = [r["verdict"] for r in runs]
            lines.append(f"  {key:4s} {name:15s} {steps:4d}  {worst[0]:.4g}  {worst[1]:.3g}  "
                         f"{worst[2]:.4g}  {verdicts}")
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=("float16", "bfloat16"), required=True)
    p.add_argument("--engines", default="native-host")
    p.add_argument("--tokens", type=int, default=32)
    p.add_argument("--max-prompts", type=int, default=None)
    p.add_argument("--same", action="store_true",
                   help="also measure against the package itself on ort-cpu (float16)")
    p.add_argument("-o", "--output", default=None)
    args = p.parse_args(argv)
    result = measure(args.dtype, args.engines.split(","), args.tokens, args.same,
                     args.max_prompts)
    if args.output:
        with open(args.output, "w") as fh:
            json.dump(result, fh, indent=1)
    print("\n".join(summary(result)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
