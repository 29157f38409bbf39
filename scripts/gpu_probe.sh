#!/usr/bin/env bash
# A quick look at native-cuda's kernels after a change, in one device call and without any
# staged wheel or checkpoint: the fused-kernel, GEMV and decode suites, then a random
# package of SmolLM2-135M's shape (float16, mixed precision, static cache of 512) profiled
# (scripts/gpu_profile_decode.py) and timed: the plain and the pipelined greedy loop, a
# 512-token prefill and verification-shaped forwards. Diagnostic: the evidence issue 12 is
# judged on is scripts/gpu_evidence.sh speed, on the real checkpoint beside its peers.
# Usage (repo root, on a CUDA machine, the small wheels in .whl/): OUT=DIR scripts/gpu_probe.sh
# Writes $OUT/probe.txt (every log, in order).
set -uo pipefail
OUT=${OUT:-$PWD/out}
PY=${PY:-python3}
PKG=/tmp/lockstep-probe/smollm2-shape-float16  # -static and -append
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
step "GPU suites: fused kernels, GEMV and op kernels, native-cuda decode"
timeout 330 "$PY" -m pytest -q -p no:randomly -p no:cacheprovider -s \
  suites/test_fused_kernels_cuda.py suites/test_ops_cuda.py suites/test_native_cuda_decode.py \
  >> "$LOG" 2>&1 || status=1
step "a random package of SmolLM2's shape"
for cache in static append; do
  [ -f "$PKG-$cache/package.yaml" ] || "$PY" - "$PKG-$cache" "$cache" >> "$LOG" 2>&1 <<'PYEOF' || status=1
import sys
from pathlib import Path
from fixtures.llama_config import LlamaConfig
from fixtures.llama_graph import build_llama
shape = dict(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536, vocab=49152,
             tied=True, cache=sys.argv[2], max_context=512, dtype="float16", precision="mixed")
prompt = [[(7 * i + 3) % 49152 for i in range(16)]]
build_llama(Path(sys.argv[1]), LlamaConfig(**shape), prompt,
            name=f"smollm2_shape_float16_{sys.argv[2]}")
PYEOF
done
step "where a decode step goes"
TOKENS=128 PREFILL=512 timeout 120 "$PY" scripts/gpu_profile_decode.py "$PKG-static" \
  >> "$LOG" 2>&1 || status=1
for loop in plain pipelined; do
  step "greedy loop $loop, 128 tokens, static and append (dynamic) cache, graphs on"
  LOCKSTEP_NATIVE_CUDA_GRAPHS=on timeout 120 "$PY" -m harness.cli bench --engines native-cuda \
    --baseline native-cuda --packages "$PKG-static,$PKG-append" --ignore-eos \
    --max-new-tokens 128 --repeats 3 --warmup 2 \
    $([ "$loop" = pipelined ] && echo --pipelined) >> "$LOG" 2>&1 || status=1
done
step "single forwards: prefill 512, M = 1..5 after 64 positions"
timeout 120 "$PY" -m harness.cli bench-forward --engines native-cuda --packages "$PKG-static" \
  --prefill 512 --rows 1,2,3,4,5 --prefix 64 --repeats 10 --warmup 2 >> "$LOG" 2>&1 || status=1
step "probe status $status"
exit $status
