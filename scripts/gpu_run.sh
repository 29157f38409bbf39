#!/usr/bin/env bash
# The nightly GPU evidence run, as sent through the device tool (or run by hand on any CUDA
# machine): installs the carried wheels, runs the kernel self-check, the GPU suites under
# --require-gpu, the parity matrix with native-cuda, and writes everything under $OUT.
# Every visible GPU is used: with more than one, the GPU suites run on pytest-xdist with one
# worker per GPU (-n $GPUS --dist loadfile, each worker pinned to its GPU by the root
# conftest through LOCKSTEP_GPUS; a test module stays whole on one worker, so the
# memory-flatness modules keep one process with the GPU to itself), and the matrix runs with
# `lockstep run --devices all`. With one GPU (or none) everything runs as it always did.
#
# Usage (repo root):
#   OUT=/some/dir scripts/gpu_run.sh [pytest -k expression]   the nightly run
#   OUT=/some/dir scripts/gpu_run.sh --timing                  the multi-GPU acceptance run
# Environment: PY (the interpreter, default python3), LOCKSTEP_ENGINES (the matrix's engines;
# default ort-cpu,native-host,native-cuda, plus ort-cuda where it is available),
# LOCKSTEP_HYPOTHESIS_PROFILE (ci or nightly), LOCKSTEP_COMMIT (recorded instead of
# `git rev-parse HEAD`, for a copied tree whose .git is stale or absent), LOCKSTEP_LONG_GGUF
# (SmolLM2's GGUF: adds the long-context step, scripts/gpu_long_context.sh, 1-2k-token
# prompts and 256 new tokens on native-cuda and ort-cuda with the oracle on ort-cuda),
# LOCKSTEP_SUITES_ONLY (set: the self-check and the GPU suites, then stop).
# --timing: the same matrix (TIMING_ENGINES, default native-cuda plus ort-cuda where it runs;
# every fixture, greedy and every speculative width, TIMING_TOKENS=40 new tokens, the first
# TIMING_PROMPTS=8 of 16 prompts)
# on one GPU (--devices 0) and on every GPU (--devices all), each wall-timed, nvidia-smi
# sampled every 0.5 s, then compared cell for cell (python -m harness.gpu_timing). It writes
# environment.txt, timing.txt, timing.json and timing.tgz (both runs' records, manifests and
# session logs, the matrix tables, the wall times, the utilization samples).
# What it writes is what docs/evidence keeps (docs/GPU.md): records and logs, no report; its
# output names the `lockstep report` command that renders the records.
# Exit status: non-zero on any failed claim (--timing: on any failed acceptance check).
set -uo pipefail
OUT=${OUT:-$PWD/out}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export LOCKSTEP_CACHE=${LOCKSTEP_CACHE:-/tmp/lockstep-fixtures}
if compgen -G ".whl/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
    --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export LOCKSTEP_HYPOTHESIS_PROFILE=${LOCKSTEP_HYPOTHESIS_PROFILE:-ci}
MODE=nightly
if [ "${1:-}" = "--timing" ]; then MODE=timing; shift; fi

# Every GPU this process may use, as CUDA_VISIBLE_DEVICES values (CuPy's count, else nvidia-smi).
GPU_LIST=$("$PY" -c "from harness.distributed import visible_gpus; print(','.join(visible_gpus()))" 2>/dev/null) \
  || GPU_LIST=$(nvidia-smi -L 2>/dev/null | awk '/^GPU /{print n++}' | paste -sd, -)
if [ -n "$GPU_LIST" ]; then GPUS=$(echo "$GPU_LIST" | tr ',' '\n' | grep -c .); else GPUS=0; fi

# The full matrix: ort-cuda joins it wherever onnxruntime's CUDA provider can run here.
ORT_CUDA=no
if "$PY" -c "from engines.registry import availability as a; import sys; r=a('ort-cuda'); print('ort-cuda:', r.ok, r.reason); sys.exit(0 if r.ok else 1)"; then
  ORT_CUDA=yes
fi
if [ -z "${LOCKSTEP_ENGINES:-}" ]; then
  ENGINES=ort-cpu,native-host,native-cuda
  [ "$ORT_CUDA" = yes ] && ENGINES=$ENGINES,ort-cuda
else
  ENGINES=$LOCKSTEP_ENGINES
fi
if [ "$MODE" = timing ]; then  # the timed matrix: device engines only
  ENGINES=${TIMING_ENGINES:-native-cuda$([ "$ORT_CUDA" = yes ] && echo ,ort-cuda)}
fi

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=index,name,uuid,pci.bus_id,memory.total,driver_version --format=csv,noheader
  "$PY" -c "import sys,numpy,onnx,onnxruntime,cupy;print('python',sys.version.split()[0]);print('numpy',numpy.__version__);print('onnx',onnx.__version__);print('onnxruntime',onnxruntime.__version__, onnxruntime.get_available_providers());print('cupy',cupy.__version__,'runtime',cupy.cuda.runtime.runtimeGetVersion(),'driver',cupy.cuda.runtime.driverGetVersion())"
  "$PY" -c "import pytest, xdist; print('pytest', pytest.__version__, 'pytest-xdist', xdist.__version__)"
  echo "commit ${LOCKSTEP_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  echo "gpus $GPUS (${GPU_LIST:-none}); mode $MODE"
  echo "engines $ENGINES; hypothesis profile $LOCKSTEP_HYPOTHESIS_PROFILE"
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

ms() { echo $(( $(date +%s%N) / 1000000 )); }

if [ "$MODE" = timing ]; then
  # The acceptance measurement: the same matrix on one GPU and on every GPU.
  if [ "$GPUS" -lt 2 ]; then
    echo "gpu_run --timing: needs 2 or more GPUs, $GPUS visible (${GPU_LIST:-none})" | tee "$OUT/timing.txt"
    exit 1
  fi
  TOKENS=${TIMING_TOKENS:-40}  # hybrid_mtp's context (48) allows 41 after a 7-token prompt
  # ids below 32 (lookup_chained's vocabulary), each starting with bos 1, at most 7 long;
  # the first TIMING_PROMPTS (default 8) of them
  PROMPTS=("1 7 20" "1 4 9 30 2" "1 13 13 26 5 11" "1 17 2 5" "1 3 9 27 19" "1 21 8"
           "1 30 12 6 15" "1 11 22 29" "1 2 3 4 5" "1 31 16 8" "1 9 18 27 4 13" "1 6 6 6"
           "1 25 14 3 30" "1 12 24" "1 19 5 28 10 2 7" "1 8 23 15")
  ARGS=(--engines "$ENGINES" --max-new-tokens "$TOKENS")
  for p in "${PROMPTS[@]:0:${TIMING_PROMPTS:-8}}"; do ARGS+=(--prompt "$p"); done
  T=/tmp/lockstep-timing
  rm -rf "$T" && mkdir -p "$T/warmup" "$T/one" "$T/two"
  "$PY" -m harness.cli fixtures build > /dev/null || exit 1
  # Warm-up (not timed): every kernel compiled into CuPy's cache, on every GPU.
  w0=$(ms)
  "$PY" -m harness.cli run "${ARGS[@]}" --max-prompts 1 --devices all \
    --evidence-dir "$T/warmup" > "$T/warmup.txt" 2>&1
  "$PY" -m harness.cli run --mode speculative "${ARGS[@]}" --max-prompts 1 --devices all \
    --evidence-dir "$T/warmup" >> "$T/warmup.txt" 2>&1
  echo "warm-up $(( $(ms) - w0 )) ms"
  timed() {  # $1 label, $2 --devices value: greedy then speculative, wall-timed, GPUs sampled
    local label=$1 devices=$2 t0 t1 t2 s1 s2 sampler
    nvidia-smi --query-gpu=timestamp,index,uuid,utilization.gpu,memory.used \
      --format=csv,noheader,nounits -lms 500 > "$T/util-$label.csv" 2>/dev/null &
    sampler=$!
    t0=$(date +%s%N)
    "$PY" -m harness.cli run "${ARGS[@]}" --devices "$devices" --evidence-dir "$T/$label" \
      > "$T/matrix-$label.txt" 2>&1; s1=$?
    t1=$(date +%s%N)
    "$PY" -m harness.cli run --mode speculative "${ARGS[@]}" --devices "$devices" \
      --evidence-dir "$T/$label" >> "$T/matrix-$label.txt" 2>&1; s2=$?
    t2=$(date +%s%N)
    kill "$sampler" 2>/dev/null; wait "$sampler" 2>/dev/null
    echo "$label greedy_ns=$((t1 - t0)) speculative_ns=$((t2 - t1)) greedy_exit=$s1 speculative_exit=$s2" >> "$T/times.txt"
    tail -n 3 "$T/matrix-$label.txt"
  }
  timed one 0
  timed two all
  "$PY" -m harness.gpu_timing --one "$T/one" --two "$T/two" --times "$T/times.txt" \
    --util-one "$T/util-one.csv" --util-two "$T/util-two.csv" --json "$OUT/timing.json" \
    > "$OUT/timing.txt" 2>&1
  status=$?
  cat "$OUT/timing.txt"
  tar czf "$OUT/timing.tgz" -C /tmp lockstep-timing/one lockstep-timing/two \
    lockstep-timing/times.txt lockstep-timing/util-one.csv lockstep-timing/util-two.csv \
    lockstep-timing/matrix-one.txt lockstep-timing/matrix-two.txt lockstep-timing/warmup.txt \
    -C "$OUT" timing.json
  echo "report: tar -xzf timing.tgz && lockstep report lockstep-timing/one lockstep-timing/two" \
    "--title 'lockstep: the same matrix on one GPU and on $GPUS' -o report.html"
  echo "gpu_run --timing status $status"
  exit $status
fi

status=0
"$PY" scripts/gpu_selfcheck.py > "$OUT/selfcheck.log" 2>&1 || status=1
tail -n 40 "$OUT/selfcheck.log"

"$PY" -m harness.cli fixtures build > /dev/null || status=1
rm -rf /tmp/lockstep-evidence /tmp/lockstep-gpu-evidence
mkdir -p /tmp/lockstep-gpu-evidence
kexpr=${1:-}
# More than one GPU: one pytest-xdist worker per GPU, each pinned by the root conftest
# (LOCKSTEP_GPUS), whole test modules per worker; the matrix on every GPU (--devices all).
PYTEST=("$PY" -m pytest)
DEVICES=()
if [ "$GPUS" -gt 1 ]; then
  PYTEST=(env LOCKSTEP_GPUS="$GPU_LIST" "$PY" -m pytest -n "$GPUS" --dist loadfile)
  DEVICES=(--devices all)
fi
"${PYTEST[@]}" -m gpu --require-gpu -p no:cacheprovider -q --timeout=300 --hypothesis-show-statistics \
  ${kexpr:+-k "$kexpr"} --junitxml="$OUT/junit-gpu.xml" --evidence-dir /tmp/lockstep-gpu-evidence suites > "$OUT/pytest-gpu.log" 2>&1 || status=1
tail -n 60 "$OUT/pytest-gpu.log"

if [ -n "${LOCKSTEP_SUITES_ONLY:-}" ]; then  # a short device budget: the suites alone
  tar czf "$OUT/records.tar.gz" -C /tmp lockstep-gpu-evidence -C "$OUT" junit-gpu.xml \
    && rm -f "$OUT/junit-gpu.xml"
  echo "gpu_run: the GPU suites alone (LOCKSTEP_SUITES_ONLY): no matrix or bench"
  exit $status
fi
"$PY" -m harness.cli run --engines "$ENGINES" --strict --explain ${DEVICES[@]+"${DEVICES[@]}"} \
  --evidence-dir /tmp/lockstep-evidence > "$OUT/matrix.txt" 2>&1 || status=1
"$PY" -m harness.cli run --mode speculative --width all --engines "$ENGINES" --strict ${DEVICES[@]+"${DEVICES[@]}"} \
  --evidence-dir /tmp/lockstep-evidence >> "$OUT/matrix.txt" 2>&1 || status=1
cat "$OUT/matrix.txt"
"$PY" -m harness.cli bench --engines "$ENGINES" --packages tiny_llama,tiny_llama_static \
  --repeats 3 --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1 || status=1
cat "$OUT/bench.txt"
# The tarball holds every record, manifest and figure, and the files a copy that keeps only a
# few (the device tool returns eight) would drop: the JUnit XML and the bench JSON (moved in,
# not copied: nothing is kept twice). The report is not written: it is the records rendered.
tar czf "$OUT/records.tar.gz" -C /tmp lockstep-evidence lockstep-gpu-evidence \
  -C "$OUT" junit-gpu.xml bench.json && rm -f "$OUT/junit-gpu.xml" "$OUT/bench.json"
echo "report: tar -xzf records.tar.gz && lockstep report lockstep-evidence -o report.html"
if [ -n "${LOCKSTEP_LONG_GGUF:-}" ]; then
  OUT="$OUT" PY="$PY" scripts/gpu_long_context.sh "$LOCKSTEP_LONG_GGUF" || status=1
fi
echo "gpu_run status $status"
exit $status
