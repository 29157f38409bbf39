#!/usr/bin/env bash
# A whole GPU evidence session in two device calls, each under the device's 10-minute limit.
#   correctness CHECKPOINT: the nightly run (scripts/gpu_run.sh: GPU suites, matrix) with the
#     SmolLM2 conversions made beside it on the CPU; then SmolLM2 parity in
#     float32/float16/bfloat16 on native-cuda, ort-cuda and hf-cuda.
#   speed CHECKPOINT: everything timed, alone on the GPU: the dtype bench (float16 and
#     bfloat16 with the pipelined greedy loop beside ort-cuda and hf-cuda, packages
#     interleaved; float32 beside ort-cuda), the caches and single forwards of
#     scripts/gpu_speed.sh (SPEED_PARTS adds its loop and selfspec parts),
#     scripts/gpu_genai.sh's bench when SPEED_GENAI is set, then
#     scripts/gpu_profile_decode.py (a prefill of 512 and a verification of 5 rows too);
#     with SPEED_PARITY set, then SmolLM2 parity in float16, bfloat16 and float32 on
#     native-cuda and ort-cuda, packed with the rest and in the phase's report (so one call
#     brings back every record: the device returns at most 8 files); last, the plain
#     greedy loop's float16 and bfloat16 table with every peer.
#   brief CHECKPOINT: what a short device budget holds, in one call: the nightly run, then
#     SmolLM2 parity in float16 and bfloat16 on native-cuda and ort-cuda, the float16 bench
#     with the pipelined loop (native-cuda, ort-cuda, hf-cuda) and the single forwards
#     (prefill 512 and M = 1..5, float16 and float32, native-cuda beside ort-cuda).
#   decode CHECKPOINT: the least a decode change needs, in one call of about 500 s: the
#     self-check and the GPU suites (no matrix) with SmolLM2's float16 conversion beside
#     them, its parity on native-cuda (2 prompts) and the float16 bench with the pipelined
#     loop (native-cuda, hf-cuda); ort-cuda beside native-cuda in both where it is available.
#   parity CHECKPOINT: what a kernel change needs before it lands, about 450 s: the GPU
#     suites with the SmolLM2 conversions made beside them on the CPU, then SmolLM2 parity in
#     float16, bfloat16 (static and dynamic) and float32 on native-cuda and ort-cuda.
#   ratio CHECKPOINT: a float16/bfloat16 kernel change, with no peer brought (about 300 s
#     after the staged suites and conversions): native-cuda's float16 and bfloat16 tables
#     (pipelined and plain loops, packages interleaved), their SmolLM2 parity (bfloat16
#     static and dynamic), then scripts/gpu_kernel_variants.py's tree against the kernels
#     before run 17 (VARIANTS, default base,before) on the same two packages.
#   convert CHECKPOINT: the SmolLM2 conversions every phase uses, alone (on the CPU: a
#     staging call makes them beside a share of the GPU suites, scripts/gpu_staged_suites.sh)
#   coverage CHECKPOINT: side by side on the GPU, nothing timed: the tiny architecture
#     checkpoints (scripts/gpu_architectures.sh), the long contexts
#     (scripts/gpu_long_context.sh), and onnxruntime-genai's parity (scripts/gpu_genai.sh, its
#     matrix and the builder's graph imported and run on native-cuda; its bench runs in speed),
#     then scripts/gpu_profile_decode.py alone (where a decode step's time goes).
# Usage (repo root, wheels in .whl/, onnxruntime-gpu in /tmp/site):
#   OUT=DIR scripts/gpu_evidence.sh correctness|speed|brief|decode|parity|ratio|convert|coverage CHECKPOINT
# Each step has its own time limit (a step that overruns is cut, and says so in
# summary.txt); every step's files are packed into $OUT/<phase>.tgz (again after each step),
# its exit status and the last lines of its log into $OUT/summary-<phase>.txt. Exit: non-zero
# when any step failed.
set -uo pipefail
PHASE=${1:?usage: $0 correctness|speed|brief|decode|parity|ratio|convert|coverage CHECKPOINT}
GGUF=$(realpath "${2:?usage: $0 correctness|speed|brief|decode|parity|ratio|convert|coverage CHECKPOINT}")
OUT=${OUT:-$PWD/out}
PY=${PY:-python3}
export PY PYTHONUNBUFFERED=1
export LOCKSTEP_CACHE=${LOCKSTEP_CACHE:-/tmp/lockstep-fixtures}
# hf and the onnxruntime-genai engines find the source checkpoint here (by content hash)
export LOCKSTEP_CHECKPOINTS=$GGUF
W=/tmp/lockstep-session/$PHASE
rm -rf "$W" && mkdir -p "$W" "$OUT"
SUMMARY="$OUT/summary-$PHASE.txt"
PKG=/tmp/lockstep-dtypes
mkdir -p "$PKG"
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    $(ls .whl/*.whl | grep -v onnxruntime_genai) > "$W/install.txt" 2>&1
fi
export PYTHONPATH=/tmp/site:$PWD
status=0

# step NAME SECONDS COMMAND...: run with a time limit, output under $W/NAME, logged
step() {
  local name=$1 limit=$2 rc t0
  shift 2
  mkdir -p "$W/$name"
  t0=$(date +%s)
  OUT="$W/$name" timeout "$limit" "$@" > "$W/$name/log.txt" 2>&1
  rc=$?
  [ "$rc" -ne 0 ] && status=1
  {
    echo "== $name: exit $rc ($([ "$rc" -eq 124 ] && echo "cut at ${limit} s" || echo "$(( $(date +%s) - t0 )) s"))"
    tail -n 25 "$W/$name/log.txt"
  } >> "$SUMMARY"
  pack
  return "$rc"  # a step run in the background reports through wait
}

# $OUT/<phase>.tgz holds every finished step's files after each step (written beside, then
# renamed), so a call cut short by its time limit or the device budget still brings back
# what finished; two files come back in all (the device returns at most 8).
pack() {
  tar czf "$OUT/.$PHASE.tgz.$$.$BASHPID" -C /tmp/lockstep-session "$PHASE" 2>/dev/null \
    && mv -f "$OUT/.$PHASE.tgz.$$.$BASHPID" "$OUT/$PHASE.tgz"
}

# run_report EVIDENCE TITLE: the phase's report.html, EVIDENCE's records with every bench
# table the phase wrote ($W/bench/bench-*.json)
run_report() {
  local tables=("$W"/bench/bench-*.json)
  [ -e "${tables[0]}" ] && tables=(--bench "${tables[@]}") || tables=()
  "$PY" -m harness.cli report "$1" --no-catch-matrix -o "$W/report.html" \
    --title "lockstep H200 ${LOCKSTEP_COMMIT:-}: $2" "${tables[@]}" >> "$SUMMARY" 2>&1 \
    || status=1
}

convert_all() {  # every SmolLM2 package both phases use (a conversion already there is kept)
  local spec dtype cache extra
  for spec in static:float32 static:float16 static:bfloat16 dynamic:float32 dynamic:float16 \
      dynamic:bfloat16; do
    cache=${spec%%:*} dtype=${spec##*:}
    extra=()
    [ "$cache" = dynamic ] && extra=(--max-context 512)
    [ -f "$PKG/smollm2-$cache-$dtype/package.yaml" ] || "$PY" -m harness.cli convert "$GGUF" \
      -o "$PKG/smollm2-$cache-$dtype" --cache "$cache" --dtype "$dtype" "${extra[@]}" || return 1
  done
  [ -f "$PKG/smollm2-selfspec-float16/package.yaml" ] || "$PY" -m harness.cli convert "$GGUF" \
    -o "$PKG/smollm2-selfspec-float16" --cache static --dtype float16 --draft-layers 24
}

# native-cuda's kernel modules compiled into CuPy's on-disk cache (NVRTC, a minute or
# two on a fresh machine), beside the conversions on the CPU: the timed steps then load them
warm_kernels() {
  timeout 300 "$PY" -c "from engines.native.cuda_kernels import get_kernels
from engines.native.fused_kernels import get_fused_kernels
get_kernels(0); get_fused_kernels(0)" > "$W/warm-kernels.txt" 2>&1
}

# nightly_converting SECONDS: the nightly run (scripts/gpu_run.sh) with the SmolLM2
# conversions made beside it on the CPU; the memory-flatness tests read the driver's free
# memory, so nothing else uses the GPU meanwhile
nightly_converting() {
  OUT="$W/convert" timeout 300 bash -c "$(declare -f convert_all); PY=$PY GGUF=$GGUF PKG=$PKG convert_all" \
    > "$W/convert.txt" 2>&1 &
  local converting=$!
  step nightly "$1" scripts/gpu_run.sh "not print_decode_ms and not print_device_ms"
  wait "$converting" || { status=1; echo "== convert: failed" >> "$SUMMARY"; }
  tail -n 5 "$W/convert.txt" >> "$SUMMARY"
}

{ echo "phase $PHASE, $(date -u +%FT%TZ)"; nvidia-smi -L; echo "commit ${LOCKSTEP_COMMIT:-unknown}"; } > "$SUMMARY"

if [ "$PHASE" = correctness ]; then
  nightly_converting 400
  step dtypes 140 "$PY" -m harness.cli run --engines native-cuda,ort-cuda,hf-cuda \
    --packages "$PKG/smollm2-static-float32,$PKG/smollm2-static-float16,$PKG/smollm2-static-bfloat16" \
    --max-prompts 2 --max-new-tokens 32 --evidence-dir "$W/dtypes/evidence"
  "$PY" -m harness.cli report "$W/dtypes/evidence" -o "$W/dtypes/report.html" \
    --no-catch-matrix >> "$W/dtypes/log.txt" 2>&1 || status=1
elif [ "$PHASE" = brief ]; then  # one call: the nightly run, then parity and speed essentials
  nightly_converting 320  # run 11: its suites took 154 s, the matrices more than 240 s left
  step dtypes 80 "$PY" -m harness.cli run --engines native-cuda,ort-cuda \
    --packages "$PKG/smollm2-static-float16,$PKG/smollm2-static-bfloat16" \
    --max-prompts 2 --max-new-tokens 32 --evidence-dir "$W/dtypes/evidence"
  step bench 90 "$PY" -m harness.cli bench --engines native-cuda,ort-cuda,hf-cuda \
    --baseline hf-cuda --packages "$PKG/smollm2-static-float16" --ignore-eos \
    --max-new-tokens 128 --repeats 3 --warmup 2 --pipelined \
    --json "$W/bench/bench-float16-pipelined.json"
  step speed 90 env REPEATS=3 PARTS=forward bash scripts/gpu_speed.sh "$GGUF"
  run_report "$W/dtypes/evidence" "SmolLM2 parity and speed"
elif [ "$PHASE" = decode ]; then  # the least a decode change needs: suites, parity, speed
  OUT="$W/convert" timeout 200 "$PY" -m harness.cli convert "$GGUF" \
    -o "$PKG/smollm2-static-float16" --cache static --dtype float16 > "$W/convert.txt" 2>&1 &
  converting=$!
  # run 12: 409 of the suites' tests in 200 s on a fresh machine (kernels compiled cold)
  step suites 280 env LOCKSTEP_SUITES_ONLY=1 scripts/gpu_run.sh \
    "not print_decode_ms and not print_device_ms"
  wait "$converting" || { status=1; echo "== convert: failed" >> "$SUMMARY"; }
  tail -n 3 "$W/convert.txt" >> "$SUMMARY"
  # ort-cuda where its provider was brought (onnxruntime-gpu in /tmp/site)
  ortc=$("$PY" -c "from engines.registry import availability as a
print(',ort-cuda' if a('ort-cuda').ok else '')" 2>/dev/null)
  step dtypes 50 "$PY" -m harness.cli run --engines "native-cuda$ortc" \
    --packages "$PKG/smollm2-static-float16" --max-prompts 2 --max-new-tokens 32 \
    --evidence-dir "$W/dtypes/evidence"
  # hf-cuda's warm-up compiles its static-cache forward (torch.compile): over 80 s in run 12
  step bench 160 "$PY" -m harness.cli bench --engines "native-cuda$ortc,hf-cuda" \
    --baseline hf-cuda --packages "$PKG/smollm2-static-float16" --ignore-eos \
    --max-new-tokens 128 --repeats 3 --warmup 2 --pipelined \
    --json "$W/bench/bench-float16-pipelined.json"
  run_report "$W/dtypes/evidence" "SmolLM2 float16 parity and speed"
elif [ "$PHASE" = parity ]; then  # a kernel change before it lands: suites, then every dtype
  OUT="$W/convert" timeout 280 bash -c "$(declare -f convert_all); PY=$PY GGUF=$GGUF PKG=$PKG convert_all" \
    > "$W/convert.txt" 2>&1 &
  converting=$!
  step suites 280 env LOCKSTEP_SUITES_ONLY=1 scripts/gpu_run.sh \
    "not print_decode_ms and not print_device_ms"
  wait "$converting" || { status=1; echo "== convert: failed" >> "$SUMMARY"; }
  step parity 150 "$PY" -m harness.cli run --engines native-cuda,ort-cuda \
    --packages "$PKG/smollm2-static-float16,$PKG/smollm2-static-bfloat16,$PKG/smollm2-dynamic-bfloat16,$PKG/smollm2-static-float32" \
    --max-prompts 2 --max-new-tokens 32 --evidence-dir "$W/parity/evidence"
elif [ "$PHASE" = ratio ]; then  # a float16/bfloat16 kernel change: ratio, parity, A/B
  OUT="$W/convert" timeout 200 bash -c "$(declare -f convert_all); PY=$PY GGUF=$GGUF PKG=$PKG convert_all" \
    > "$W/convert.txt" 2>&1 || status=1
  pair="$PKG/smollm2-static-float16,$PKG/smollm2-static-bfloat16"
  step bench 120 "$PY" -m harness.cli bench --engines native-cuda --baseline native-cuda \
    --packages "$pair" --ignore-eos --max-new-tokens 128 --repeats 3 --warmup 2 --pipelined \
    --interleave --json "$W/bench/bench-float16-pipelined.json"
  step plain 100 "$PY" -m harness.cli bench --engines native-cuda --baseline native-cuda \
    --packages "$pair" --ignore-eos --max-new-tokens 128 --repeats 3 --warmup 2 --interleave \
    --json "$W/bench/bench-float16.json"
  step parity 100 "$PY" -m harness.cli run --engines native-cuda \
    --packages "$pair,$PKG/smollm2-dynamic-bfloat16" --max-prompts 2 --max-new-tokens 32 \
    --evidence-dir "$W/parity/evidence"
  run_report "$W/parity/evidence" "SmolLM2 float16 and bfloat16"
  pack
  step variants 240 env VARIANTS="${VARIANTS:-base,before}" "$PY" \
    scripts/gpu_kernel_variants.py "$PKG/smollm2-static-float16" "$PKG/smollm2-static-bfloat16"
elif [ "$PHASE" = convert ]; then  # the SmolLM2 conversions alone, on the CPU
  step convert 300 bash -c "$(declare -f convert_all); PY=$PY GGUF=$GGUF PKG=$PKG convert_all"
elif [ "$PHASE" = coverage ]; then  # correctness only, side by side on the GPU
  step architectures 300 env PYTHONPATH="$PYTHONPATH" bash scripts/gpu_architectures.sh &
  ar=$!
  step long 300 bash scripts/gpu_long_context.sh "$GGUF" &
  lo=$!
  step genai 420 env PARTS=parity PROMPTS=2 bash scripts/gpu_genai.sh "$GGUF" &
  ge=$!
  for job in "$ar" "$lo" "$ge"; do wait "$job" || status=1; done
  # alone on the GPU again: where a native-cuda decode step's time goes (diagnostic)
  step profile 120 "$PY" scripts/gpu_profile_decode.py "$PKG/smollm2-static-float16" \
    "$PKG/smollm2-static-float32" || status=1
else
  warm_kernels &  # run 15: the bench's first warm-up compiled them, 120 s of its 330
  warming=$!
  OUT="$W/convert" timeout 200 bash -c "$(declare -f convert_all); PY=$PY GGUF=$GGUF PKG=$PKG convert_all" \
    > "$W/convert.txt" 2>&1 || status=1
  wait "$warming" || { status=1; echo "== warm kernels: failed" >> "$SUMMARY"; }
  # the headline first (run 15 lost it to the step's limit): float16 and bfloat16 with the
  # pipelined greedy loop beside both peers (transformers' generate runs its own loop), the
  # packages interleaved so the dtype ratio is taken side by side too; then float32 against
  # ort-cuda (its target; transformers' float32 is none), then the plain loop's table
  bench_dtypes() {
    "$PY" -m harness.cli bench --engines native-cuda,ort-cuda,hf-cuda --baseline hf-cuda \
      --packages "$PKG/smollm2-static-float16,$PKG/smollm2-static-bfloat16" --ignore-eos \
      --max-new-tokens 128 --repeats 3 --warmup 2 --pipelined --interleave \
      --json "$OUT/bench-float16-pipelined.json" || return 1
    "$PY" -m harness.cli bench --engines native-cuda,ort-cuda --baseline ort-cuda \
      --packages "$PKG/smollm2-static-float32" --ignore-eos --max-new-tokens 128 --repeats 3 \
      --warmup 2 --json "$OUT/bench-float32.json" || return 1
  }
  # run 14: 56 s and 109 s for these two tables (hf-cuda compiling its forward in the first)
  step bench 240 bash -c "$(declare -f bench_dtypes); PY=$PY PKG=$PKG OUT=\$OUT bench_dtypes"
  # the caches (float16, captured, both loops) and the single forwards; the pipelined loop
  # is in the bench above; self-speculation with SPEED_PARTS="... selfspec"
  step speed 200 env REPEATS=3 PARTS="${SPEED_PARTS:-cache forward}" CACHE_DTYPES=float16 \
    GRAPHS=on LOOPS="plain pipelined" bash scripts/gpu_speed.sh "$GGUF"
  if [ -n "${SPEED_GENAI:-}" ]; then
    step genai 150 env PARTS=bench REPEATS=2 bash scripts/gpu_genai.sh "$GGUF"
  fi
  # where a native-cuda decode step's time goes (diagnostic: docs/PERFORMANCE.md's bounds)
  step profile 80 env PREFILL=512 VERIFY=5 "$PY" scripts/gpu_profile_decode.py \
    "$PKG/smollm2-static-float16" "$PKG/smollm2-static-float32"
  if [ -n "${SPEED_PARITY:-}" ]; then  # after the timed steps: nothing else on the GPU then
    # the dynamic bfloat16 graph beside the static one: ort-cuda has a kernel for each of
    # its ops (the static graph's mask has a bfloat16 ReduceMax, which it has not)
    step parity 120 "$PY" -m harness.cli run --engines native-cuda,ort-cuda \
      --packages "$PKG/smollm2-static-float16,$PKG/smollm2-static-bfloat16,$PKG/smollm2-dynamic-bfloat16,$PKG/smollm2-static-float32" \
      --max-prompts 2 --max-new-tokens 32 --evidence-dir "$W/parity/evidence"
  fi
  # last, as time allows: the plain greedy loop's float16 and bfloat16 table, every peer
  step plain 120 "$PY" -m harness.cli bench --engines native-cuda,ort-cuda,hf-cuda \
    --baseline hf-cuda --packages "$PKG/smollm2-static-float16,$PKG/smollm2-static-bfloat16" \
    --ignore-eos --max-new-tokens 128 --repeats 3 --warmup 2 --interleave \
    --json "$W/bench/bench-float16.json"
  # one report of the run: this phase's SmolLM2 parity (SPEED_PARITY), else the correctness
  # phase's (when it ran on this machine), with every bench table of this phase
  parity=$W/parity/evidence
  [ -d "$parity" ] || parity=/tmp/lockstep-session/correctness/dtypes/evidence
  if [ -d "$parity" ]; then
    run_report "$parity" "SmolLM2 parity and speed"
    pack
  fi
fi
pack
echo "gpu_evidence $PHASE status $status" >> "$SUMMARY"
cat "$SUMMARY"
exit $status
