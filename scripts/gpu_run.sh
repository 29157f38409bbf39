#!/usr/bin/env bash
# The nightly GPU evidence run, as sent through the device tool (or run by hand on any CUDA
# machine): installs the carried wheels, runs the kernel self-check, the GPU suites under
# --require-gpu, the parity matrix with native-cuda, and writes everything under $OUT.
# Usage (repo root): OUT=/some/dir scripts/gpu_run.sh [pytest -k expression]
# Environment: PY (the interpreter, default python3), LOCKSTEP_ENGINES (the matrix's engines;
# default ort-cpu,native-host,native-cuda, plus ort-cuda where it is available),
# LOCKSTEP_HYPOTHESIS_PROFILE (ci or nightly), LOCKSTEP_COMMIT (recorded instead of
# `git rev-parse HEAD`, for a copied tree whose .git is stale or absent).
# Exit status: non-zero on any failed claim.
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
# The full matrix: ort-cuda joins it wherever onnxruntime's CUDA provider can run here.
if [ -z "${LOCKSTEP_ENGINES:-}" ]; then
  ENGINES=ort-cpu,native-host,native-cuda
  if "$PY" -c "from engines.registry import availability as a; import sys; r=a('ort-cuda'); print('ort-cuda:', r.ok, r.reason); sys.exit(0 if r.ok else 1)"; then
    ENGINES=$ENGINES,ort-cuda
  fi
else
  ENGINES=$LOCKSTEP_ENGINES
fi

{
  date -u +%Y-%m-%dT%H:%M:%SZ
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  "$PY" -c "import sys,numpy,onnx,onnxruntime,cupy;print('python',sys.version.split()[0]);print('numpy',numpy.__version__);print('onnx',onnx.__version__);print('onnxruntime',onnxruntime.__version__, onnxruntime.get_available_providers());print('cupy',cupy.__version__,'runtime',cupy.cuda.runtime.runtimeGetVersion(),'driver',cupy.cuda.runtime.driverGetVersion())"
  echo "commit ${LOCKSTEP_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"
  echo "engines $ENGINES; hypothesis profile $LOCKSTEP_HYPOTHESIS_PROFILE"
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

status=0
"$PY" scripts/gpu_selfcheck.py > "$OUT/selfcheck.log" 2>&1 || status=1
tail -n 40 "$OUT/selfcheck.log"

"$PY" -m harness.cli fixtures build > /dev/null || status=1
rm -rf /tmp/lockstep-evidence /tmp/lockstep-gpu-evidence
mkdir -p /tmp/lockstep-gpu-evidence
kexpr=${1:-}
"$PY" -m pytest -m gpu --require-gpu -p no:cacheprovider -q --timeout=300 --hypothesis-show-statistics \
  ${kexpr:+-k "$kexpr"} --junitxml="$OUT/junit-gpu.xml" --evidence-dir /tmp/lockstep-gpu-evidence suites > "$OUT/pytest-gpu.log" 2>&1 || status=1
tail -n 60 "$OUT/pytest-gpu.log"

"$PY" -m harness.cli run --engines "$ENGINES" --strict \
  --evidence-dir /tmp/lockstep-evidence > "$OUT/matrix.txt" 2>&1 || status=1
"$PY" -m harness.cli run --mode speculative --width all --engines "$ENGINES" --strict \
  --evidence-dir /tmp/lockstep-evidence >> "$OUT/matrix.txt" 2>&1 || status=1
cat "$OUT/matrix.txt"
"$PY" -m harness.cli bench --engines "$ENGINES" --packages tiny_llama,tiny_llama_static \
  --repeats 3 --json "$OUT/bench.json" > "$OUT/bench.txt" 2>&1 || status=1
cat "$OUT/bench.txt"
"$PY" -m harness.cli report /tmp/lockstep-evidence -o "$OUT/report.html" || status=1
# The tarball also holds the self-check log, so it survives a copy that keeps only a few files.
tar czf "$OUT/evidence.tgz" -C /tmp lockstep-evidence lockstep-gpu-evidence -C "$OUT" selfcheck.log
echo "gpu_run status $status"
exit $status
