#!/usr/bin/env bash
# Issue 37's GPU work as named steps, so each device call is one short command and a call
# that ends early (a machine taken back, a step past its time) still leaves every finished
# step's evidence under $OUT/<step>/ (log.txt, the step's JSON, rc.txt), packed as
# $OUT/<step>.tgz when the step ends (a device call brings back at most 8 files).
#
#   OUT=$OUT bash scripts/gpu_issue37.sh STEP [STEP ...]
#
# Steps, in the order docs/GPU.md's calls take them:
#   stage NN   copy .stage/$GGUF.partNN (and its .sha256) to /tmp/stage (the call carries it)
#   join       join the parts into /tmp/smollm2.gguf, checking the sha256
#   bound      scripts/gpu_persistent_bound.py: a persistent step's best case against launches
#   variants   a random SmolLM2-shaped float16 package (built once a machine), then
#              scripts/gpu_kernel_variants.py over $VARIANTS (tokens compared, the PRIMARY
#              and VERIFY replays timed)
#   profile    scripts/gpu_kernel_profile.py 7 with dependent launches off (kernel by kernel)
#   round      scripts/gpu_round_probe.py 7 128 with LOCKSTEP_WIDE_VERIFY in $ROUND_ORDER
#              (default off on off on: each setting twice, in turns)
#   bench      scripts/gpu_bench_floor.sh on /tmp/smollm2.gguf (float16 and bfloat16, W = 7,
#              $PEERS beside: ort-cuda where scripts/gpu_staged_suites.sh's `ort` installed
#              onnxruntime-gpu into /tmp/site-ort; $BUDGET seconds, the table $BENCH_LIMIT)
#   pass       scripts/gpu_pass_probe.py 7 on the bench's float16 conversion (after bench, on
#              the same machine): the grounded pass's wall against its forwards' device time
#   program    scripts/gpu_program_probe.py with MIN_BLOCKS="6 8" (a call of its own)
#   suites     the GPU suites alone (scripts/gpu_run.sh with LOCKSTEP_SUITES_ONLY=1), less
#              what needs a staged package: the ort-cuda tests (gpu_staged_suites.sh's
#              `ort`) and vLLM's field names (gpu_vllm.sh)
#
# Environment: OUT (required), GGUF (default SmolLM2-135M-Instruct.Q4_1.gguf), VARIANTS
# (default base,treeall,rkakeys,nokvprefetch and the ablations cutcopy,
# cutattention,cutscores,cutsoftmax,cutvalues), BUDGET (bench seconds, default 450),
# BENCH_LIMIT (the bench table's seconds, default 330), PEERS (default hf-cuda,ort-cuda:
# those available join), ROUND_ORDER (default "off on off on"), LIMIT_<STEP> (a step's
# timeout in seconds, e.g. LIMIT_BOUND=150).
# Every step installs .whl/ into /tmp/site first (once a machine) and sets the cache folders
# and LOCKSTEP_COMMIT from .stage/commit (written here by `git rev-parse --short HEAD`).
set -uo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
cd "$REPO"
: "${OUT:?set OUT to the folder the evidence goes to}"
GGUF=${GGUF:-SmolLM2-135M-Instruct.Q4_1.gguf}
ABLATIONS=cutcopy,cutattention,cutscores,cutsoftmax,cutvalues  # gpu_kernel_variants.py's
VARIANTS=${VARIANTS:-base,treeall,rkakeys,nokvprefetch,$ABLATIONS}
BUDGET=${BUDGET:-450}
PEERS=${PEERS:-hf-cuda,ort-cuda}  # ort-cuda joins where /tmp/site-ort holds onnxruntime-gpu
BENCH_LIMIT=${BENCH_LIMIT:-330}
RANDOM_PACKAGE=/tmp/lockstep-rand-smollm2
ROUND_ORDER=${ROUND_ORDER:-off on off on}
# the suites step's selection: no timing prints, nothing that needs a staged package
SUITES_EXPR="not print_decode_ms and not print_device_ms and not ort_cuda"
SUITES_EXPR="$SUITES_EXPR and not test_the_fakes_have_vllms_field_names"

prepare() {
  if [ ! -f /tmp/site/.lockstep-wheels ] && ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
      && touch /tmp/site/.lockstep-wheels
  fi
  export LOCKSTEP_COMMIT=${LOCKSTEP_COMMIT:-$(cat .stage/commit 2> /dev/null || echo unknown)}
  export CUPY_CACHE_DIR=/tmp/cupy-cache LOCKSTEP_CACHE=/tmp/lockstep-fixtures
  export PYTHONPATH=/tmp/site:$REPO PYTHONUNBUFFERED=1
  mkdir -p "$OUT" /tmp/stage
  nvidia-smi -L > "$OUT/gpu.txt" 2>&1 || true
}

# run_step NAME DEFAULT_SECONDS COMMAND...: the command under its timeout, logged; prints
# the log's tail, the exit status and the seconds it took
run_step() {
  local name=$1 default=$2
  shift 2
  local limit_var="LIMIT_${name^^}"
  local limit=${!limit_var:-$default}
  mkdir -p "$OUT/$name"
  local t0
  t0=$(date +%s)
  timeout "$limit" "$@" > "$OUT/$name/log.txt" 2>&1
  local rc=$?
  echo "$rc" > "$OUT/$name/rc.txt"
  tail -n 40 "$OUT/$name/log.txt"
  echo "== $name: rc $rc, $(( $(date +%s) - t0 )) s (limit $limit)"
  # a call brings back at most 8 files: each step's folder as one archive
  tar -C "$OUT" -czf "$OUT/$name.tgz" "$name" && rm -rf "${OUT:?}/$name"
  return 0
}

variants() {
  [ -f "$RANDOM_PACKAGE/package.yaml" ] \
    || python3 scripts/gpu_kernel_variants.py --random-smollm2 "$RANDOM_PACKAGE" || return 1
  VARIANTS=$VARIANTS ROUNDS=5 python3 scripts/gpu_kernel_variants.py "$RANDOM_PACKAGE"
}

# the switch off and on in turns, twice: the first probe of a machine runs its host pieces
# slower throughout (2026-12-05, H100), so one run of each mixed the switch with warm-up
round_both() {
  local wide turn=0
  for wide in $ROUND_ORDER; do
    turn=$(( turn + 1 ))
    mkdir -p "$OUT/round/wide-$wide-$turn"
    echo "-- LOCKSTEP_WIDE_VERIFY=$wide (turn $turn)"
    LOCKSTEP_WIDE_VERIFY=$wide OUT=$OUT/round/wide-$wide-$turn \
      python3 scripts/gpu_round_probe.py 7 128 || return 1
  done
}

export OUT VARIANTS RANDOM_PACKAGE ROUND_ORDER
export -f variants round_both  # timeout runs them in a bash of its own
prepare
while [ $# -gt 0 ]; do
  step=$1
  shift
  case "$step" in
    stage)
      part=${1:?stage needs a part number, e.g. stage 00}
      shift
      cp ".stage/$GGUF.part$part" /tmp/stage/ && cp ".stage/$GGUF.sha256" /tmp/stage/ \
        && echo "== stage: part $part in /tmp/stage" || echo "== stage: part $part missing"
      ;;
    join)
      run_step join 60 bash scripts/stage_large_file.sh join "$GGUF" /tmp/smollm2.gguf ;;
    bound)
      run_step bound 150 env OUT="$OUT/bound" python3 scripts/gpu_persistent_bound.py ;;
    variants)
      run_step variants 280 bash -c variants ;;
    profile)
      run_step profile 90 env LOCKSTEP_DEPENDENT_LAUNCH=off OUT="$OUT/profile" \
        python3 scripts/gpu_kernel_profile.py 7 ;;
    round)
      run_step round 220 bash -c round_both ;;
    bench)
      run_step bench $(( BUDGET + 60 )) env WIDTH=7 DTYPES="float16 bfloat16" PEERS="$PEERS" \
        BUDGET="$BUDGET" BENCH_LIMIT="$BENCH_LIMIT" OUT="$OUT/bench" \
        bash scripts/gpu_bench_floor.sh /tmp/smollm2.gguf ;;
    pass)
      run_step pass 240 env OUT="$OUT/pass" python3 scripts/gpu_pass_probe.py 7 ;;
    program)
      run_step program 500 env MIN_BLOCKS="6 8" OUT="$OUT/program" \
        python3 scripts/gpu_program_probe.py ;;
    suites)
      run_step suites 560 env LOCKSTEP_SUITES_ONLY=1 OUT="$OUT/suites" \
        bash scripts/gpu_run.sh "$SUITES_EXPR" ;;
    *)
      echo "unknown step $step (see the head of $0)" >&2
      exit 2 ;;
  esac
done
