#!/usr/bin/env bash
# Two trees of lockstep timed side by side in one device call: whether a change moved a
# figure, or the machine did (each machine differs; only a same-machine pair says). Builds the
# random SmolLM2-shaped float16 package (scripts/build_smollm2_shape.py), then in each tree:
# single forwards (a 512-token prefill, M = 1 and 5 after 64 positions) and the pipelined
# greedy bench, both eager and graph replay figures of the same package.
# Usage (repo root of the new tree, the small wheels in .whl/):
#   OUT=DIR scripts/gpu_compare_trees.sh OLD_TREE_DIR [EXTRA_PYTEST_ARGS...]
# EXTRA_PYTEST_ARGS (optional) run first, in this tree. Writes $OUT/compare.txt.
# COMPARE_ENV=NAME times one tree twice instead, NAME=off then NAME=on (a switch's A/B, e.g.
# LOCKSTEP_DEPENDENT_LAUNCH); PROFILE=1 adds scripts/gpu_profile_decode.py (VERIFY=5) to each;
# ROWS_PROBE=1 adds this tree's scripts/gpu_rows_probe.py (ROWS=5, LAUNCHES=30) run against
# each tree's kernels; FORWARD_ROWS (default 1,5) are bench-forward's --rows.
set -uo pipefail
OLD=$(cd "$1" && pwd); shift
NEW=$PWD
OUT=${OUT:-$PWD/out}
PY=${PY:-python3}
PKG=/tmp/lockstep-compare/smollm2-shape-float16-static
LOG="$OUT/compare.txt"
mkdir -p "$OUT"
"$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
  $(ls .whl/*.whl | grep -v onnxruntime_genai) >> "$LOG" 2>&1
status=0
step() { echo "== $* ($(date -u +%T))" | tee -a "$LOG"; }
{ nvidia-smi -L; echo "new ${LOCKSTEP_COMMIT:-unknown}, old $(cat "$OLD/.commit" 2>/dev/null)"; } >> "$LOG"
if [ $# -gt 0 ]; then
  step "pytest $*"
  PYTHONPATH=/tmp/site:$NEW timeout 240 "$PY" -m pytest -q -p no:randomly -p no:cacheprovider \
    "$@" >> "$LOG" 2>&1 || status=1
fi
PYTHONPATH=/tmp/site:$NEW "$PY" scripts/build_smollm2_shape.py "$PKG" float16-static \
  >> "$LOG" 2>&1 || status=1
if [ -n "${COMPARE_ENV:-}" ]; then
  sides=("$NEW off" "$NEW on")
else
  sides=("$OLD -" "$NEW -")
fi
for side in "${sides[@]}"; do
  tree=${side% *} value=${side##* }
  step "tree $tree${COMPARE_ENV:+, $COMPARE_ENV=$value}"
  ( cd "$tree" && export PYTHONPATH=/tmp/site:$tree PYTHONUNBUFFERED=1
    [ -n "${COMPARE_ENV:-}" ] && export "$COMPARE_ENV=$value"
    timeout 150 "$PY" -m harness.cli bench-forward --engines native-cuda --packages "$PKG" \
      --prefill 512 --rows "${FORWARD_ROWS:-1,5}" --prefix 64 --repeats 10 --warmup 2
    LOCKSTEP_NATIVE_CUDA_GRAPHS=on timeout 90 "$PY" -m harness.cli bench --engines native-cuda \
      --baseline native-cuda --packages "$PKG" --ignore-eos --max-new-tokens 128 --repeats 3 \
      --warmup 2 --pipelined
    if [ -n "${PROFILE:-}" ]; then
      VERIFY=5 PREFILL=512 REPLAYS=200 timeout 90 "$PY" scripts/gpu_profile_decode.py "$PKG" \
        | grep -v "^ \{2,\}[0-9]" | grep -v "^$"
    fi
    if [ -n "${ROWS_PROBE:-}" ]; then
      ROWS=5 LAUNCHES=30 timeout 150 "$PY" "$NEW/scripts/gpu_rows_probe.py"
    fi ) >> "$LOG" 2>&1 || status=1
done
step "compare status $status"
exit $status
