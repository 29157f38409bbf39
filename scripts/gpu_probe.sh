#!/usr/bin/env bash
# A quick look at native-cuda's kernels after a change, in one device call and without any
# staged wheel or checkpoint: the fused-kernel, GEMV, decode and graph-slot suites, then
# random packages of SmolLM2-135M's shape (mixed precision, cache of 512: float16 static and
# append, bfloat16 static) profiled (scripts/gpu_profile_decode.py; PREFILL=512 adds a
# prefill's kernels) and timed: the plain and the pipelined greedy loop, a 512-token
# prefill and verification-shaped forwards. Diagnostic: the evidence issue 12 is
# judged on is scripts/gpu_evidence.sh speed, on the real checkpoint beside its peers.
# Usage (repo root, on a CUDA machine, the small wheels in .whl/): OUT=DIR scripts/gpu_probe.sh
# Writes $OUT/probe.txt (every log, in order).
set -uo pipefail
OUT=${OUT:-$PWD/out}
PY=${PY:-python3}
PKG=/tmp/lockstep-probe/smollm2-shape  # -float16-static, -float16-append, -bfloat16-static
LOG="$OUT/probe.txt"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then  # pydantic and the like (scripts/fetch_gpu_wheels.sh)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    $(ls .whl/*.whl | grep -v onnxruntime_genai) >> "$LOG" 2>&1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
status=0
step() { echo "== $* ($(date -u +%T))" | tee -a "$LOG"; }

{ nvidia-smi -L; echo "commit ${LOCKSTEP_COMMIT:-unknown}"; } >> "$LOG"
step "GPU suites: fused kernels, GEMV and op kernels, native-cuda decode, graph slots"
timeout 360 "$PY" -m pytest -q -p no:randomly -p no:cacheprovider -s \
  suites/test_fused_kernels_cuda.py suites/test_ops_cuda.py suites/test_native_cuda_decode.py \
  suites/test_graph_slots.py >> "$LOG" 2>&1 || status=1
step "random packages of SmolLM2's shape"
for variant in float16-static float16-append bfloat16-static; do
  [ -f "$PKG-$variant/package.yaml" ] || "$PY" scripts/build_smollm2_shape.py "$PKG-$variant" \
    "$variant" >> "$LOG" 2>&1 || status=1
done
step "where a decode step goes (float16 and bfloat16, static cache)"
TOKENS=128 PREFILL=${PREFILL:-0} timeout 150 "$PY" scripts/gpu_profile_decode.py \
  "$PKG-float16-static" "$PKG-bfloat16-static" >> "$LOG" 2>&1 || status=1
for loop in plain pipelined; do
  step "greedy loop $loop, 128 tokens: float16 static and append, bfloat16 static"
  LOCKSTEP_NATIVE_CUDA_GRAPHS=on timeout 120 "$PY" -m harness.cli bench --engines native-cuda \
    --baseline native-cuda --ignore-eos \
    --packages "$PKG-float16-static,$PKG-float16-append,$PKG-bfloat16-static" \
    --max-new-tokens 128 --repeats 3 --warmup 2 \
    $([ "$loop" = pipelined ] && echo --pipelined) >> "$LOG" 2>&1 || status=1
done
step "single forwards: prefill 512, M = 1..5 after 64 positions"
timeout 120 "$PY" -m harness.cli bench-forward --engines native-cuda --packages "$PKG-float16-static" \
  --prefill 512 --rows 1,2,3,4,5 --prefix 64 --repeats 10 --warmup 2 >> "$LOG" 2>&1 || status=1
step "probe status $status"
exit $status
