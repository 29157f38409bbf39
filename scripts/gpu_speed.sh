#!/usr/bin/env bash
# native-cuda speed evidence beyond the dtype bench (issue 12): the dynamic cache beside the
# static one, a 512-token prefill and verification-shaped forwards (M = 1..5) beside
# ort-cuda, the plain greedy loop beside the pipelined one (bench --pipelined), and
# self-speculation at every width against greedy, all timed side by side.
# Usage (repo root, on a CUDA machine, after scripts/gpu_real_dtypes.sh, whose converted
# packages under /tmp/lockstep-dtypes it reuses): OUT=DIR scripts/gpu_speed.sh CHECKPOINT
# Environment: PY (default python3), ENGINES (default native-cuda,ort-cuda), BENCH_TOKENS
# (default 128), REPEATS (default 3), PARTS (default "cache forward loop selfspec": which
# parts run), CACHE_DTYPES (default "float32 float16"), GRAPHS (default "auto on": the
# dynamic cache eager as by default, and captured), LOOPS (default "plain": the greedy loops
# the cache part times; "plain pipelined" adds bench --pipelined).
# Writes to $OUT: speed.txt (every table) and speed-json.tgz (every bench JSON).
set -uo pipefail
GGUF=${1:?usage: $0 CHECKPOINT (a .gguf path, or smollm2)}
OUT=${OUT:-$PWD/out}
PY=${PY:-python3}
ENGINES=${ENGINES:-native-cuda,ort-cuda}
BENCH_TOKENS=${BENCH_TOKENS:-128}
REPEATS=${REPEATS:-3}
PARTS=${PARTS:-cache forward loop selfspec}
CACHE_DTYPES=${CACHE_DTYPES:-float32 float16}
GRAPHS=${GRAPHS:-auto on}
LOOPS=${LOOPS:-plain}
part() { [[ " $PARTS " == *" $1 "* ]]; }
PKG=/tmp/lockstep-dtypes
JS=$OUT/speed-json  # under $OUT: a run cut short still brings back every finished table
mkdir -p "$OUT" "$PKG"
rm -rf "$JS" && mkdir -p "$JS"
LOG="$OUT/speed.txt"
status=0
step() { echo "== $*" | tee -a "$LOG"; }

for dtype in $CACHE_DTYPES; do
  part cache || break
  [ -d "$PKG/smollm2-dynamic-$dtype" ] || "$PY" -m harness.cli convert "$GGUF" \
    -o "$PKG/smollm2-dynamic-$dtype" --cache dynamic --max-context 512 --dtype "$dtype" \
    >> "$LOG" 2>&1 || status=1
done
if part selfspec; then
  [ -d "$PKG/smollm2-selfspec-float16" ] || "$PY" -m harness.cli convert "$GGUF" \
    -o "$PKG/smollm2-selfspec-float16" --cache static --dtype float16 --draft-layers 24 \
    >> "$LOG" 2>&1 || status=1
fi

for dtype in $CACHE_DTYPES; do
  part cache || break
  # the dynamic cache as native-cuda runs it by default (auto: append plan, eager), and with
  # LOCKSTEP_NATIVE_CUDA_GRAPHS=on (capacity buffers, PRIMARY captured and replayed)
  for graphs in $GRAPHS; do
    for loop in $LOOPS; do
      step "static vs dynamic cache, $dtype, greedy decode of $BENCH_TOKENS tokens, graphs $graphs, loop $loop"
      LOCKSTEP_NATIVE_CUDA_GRAPHS=$graphs "$PY" -m harness.cli bench --engines native-cuda \
        --baseline native-cuda \
        --packages "$PKG/smollm2-static-$dtype,$PKG/smollm2-dynamic-$dtype" --ignore-eos \
        --max-new-tokens "$BENCH_TOKENS" --repeats "$REPEATS" --warmup 2 --interleave \
        $([ "$loop" = pipelined ] && echo --pipelined) \
        --json "$JS/cache-$dtype-graphs-$graphs-$loop.json" >> "$LOG" 2>&1 || status=1
    done
  done
done
for dtype in float32 float16; do
  part forward || break
  step "single forwards, $dtype: prefill 512, M = 1..5 after 64 positions"
  "$PY" -m harness.cli bench-forward --engines "$ENGINES" \
    --packages "$PKG/smollm2-static-$dtype" --prefill 512 --rows 1,2,3,4,5 --prefix 64 \
    --repeats 10 --warmup 2 --json "$JS/forward-$dtype.json" >> "$LOG" 2>&1 || status=1
done
for loop in plain pipelined; do  # the greedy loop as parity runs it, and the pipelined one
  part loop || break
  step "greedy loop $loop, float16, native-cuda and ort-cuda"
  "$PY" -m harness.cli bench --engines "$ENGINES" --baseline native-cuda \
    --packages "$PKG/smollm2-static-float16" --ignore-eos --max-new-tokens "$BENCH_TOKENS" \
    --repeats "$REPEATS" --warmup 2 $([ "$loop" = pipelined ] && echo --pipelined) \
    --json "$JS/loop-$loop.json" >> "$LOG" 2>&1 || status=1
done
for width in 1 2 3 4; do
  part selfspec || break
  step "self-speculation (24 of 30 blocks), float16, width $width"
  "$PY" -m harness.cli bench --mode speculative --width "$width" --engines "$ENGINES" \
    --baseline native-cuda --packages "$PKG/smollm2-selfspec-float16" --ignore-eos \
    --max-new-tokens "$BENCH_TOKENS" --repeats "$REPEATS" \
    --json "$JS/selfspec-w$width.json" >> "$LOG" 2>&1 || status=1
done
if part selfspec; then
  step "greedy on the same self-speculative package, float16"
  "$PY" -m harness.cli bench --engines "$ENGINES" --baseline native-cuda \
    --packages "$PKG/smollm2-selfspec-float16" --ignore-eos --max-new-tokens "$BENCH_TOKENS" \
    --repeats "$REPEATS" --json "$JS/selfspec-greedy.json" >> "$LOG" 2>&1 || status=1
fi
tar czf "$OUT/speed-json.tgz" -C "$OUT" speed-json && rm -rf "$JS"
echo "gpu_speed status $status" | tee -a "$LOG"
exit $status
