#!/usr/bin/env bash
# SmolLM2 in every dtype the converter ships, on the device engines, and the decode bench
# beside transformers on the GPU (issue 12's precision and bench evidence).
# Usage (repo root, on a CUDA machine): OUT=DIR scripts/gpu_real_dtypes.sh CHECKPOINT
# (a .gguf path, or smollm2 where `make real` installed it).
# Environment: PY (default python3), LOCKSTEP_ENGINES (default native-cuda,ort-cuda,hf-cuda),
# TOKENS (parity run, default 32), BENCH_TOKENS (default 128), REPEATS (default 3).
# Writes to $OUT: dtypes-convert.txt, dtypes-matrix.txt, dtypes-bench.txt, dtypes-evidence.tgz
# (records and bench JSON; no report: the command that renders it is printed). Exit: non-zero
# on any failed claim.
set -uo pipefail
GGUF=${1:?usage: $0 CHECKPOINT (a .gguf path, or smollm2)}
OUT=${OUT:-$PWD/out}
PY=${PY:-python3}
ENGINES=${LOCKSTEP_ENGINES:-native-cuda,ort-cuda,hf-cuda}
TOKENS=${TOKENS:-32}
BENCH_TOKENS=${BENCH_TOKENS:-128}
REPEATS=${REPEATS:-3}
PKG=/tmp/lockstep-dtypes
EV=/tmp/lockstep-dtypes-evidence
mkdir -p "$OUT" "$PKG"
rm -rf "$EV" && mkdir -p "$EV/bench"
status=0
# float16 and bfloat16 conversions write (or reuse) their float32 twin beside them
for dtype in float32 float16 bfloat16; do
  "$PY" -m harness.cli convert "$GGUF" -o "$PKG/smollm2-static-$dtype" --cache static \
    --dtype "$dtype" >> "$OUT/dtypes-convert.txt" 2>&1 || status=1
done
tail -n 6 "$OUT/dtypes-convert.txt"
PACKAGES="$PKG/smollm2-static-float32,$PKG/smollm2-static-float16,$PKG/smollm2-static-bfloat16"
"$PY" -m harness.cli run --packages "$PACKAGES" --engines "$ENGINES" --max-prompts 2 \
  --max-new-tokens "$TOKENS" --evidence-dir "$EV" > "$OUT/dtypes-matrix.txt" 2>&1 || status=1
cat "$OUT/dtypes-matrix.txt"
for dtype in float32 float16 bfloat16; do
  "$PY" -m harness.cli bench --engines "$ENGINES" --packages "$PKG/smollm2-static-$dtype" \
    --baseline hf-cuda --ignore-eos --max-new-tokens "$BENCH_TOKENS" --repeats "$REPEATS" \
    --warmup 2 --json "$EV/bench/bench-$dtype.json" >> "$OUT/dtypes-bench.txt" 2>&1 || status=1
done
cat "$OUT/dtypes-bench.txt"
tar czf "$OUT/dtypes-evidence.tgz" -C /tmp lockstep-dtypes-evidence
echo "report: tar -xzf dtypes-evidence.tgz && lockstep report lockstep-dtypes-evidence" \
  "--no-catch-matrix --bench lockstep-dtypes-evidence/bench/bench-*.json -o report.html"
echo "gpu_real_dtypes status $status"
exit $status
