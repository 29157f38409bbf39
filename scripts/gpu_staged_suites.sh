#!/usr/bin/env bash
# The staging calls of a budgeted GPU session, doing work while the large files travel.
# Every call copies the carried .stage/ parts into /tmp/stage (kept while the machine stays
# warm, for scripts/stage_large_file.sh join) and installs the carried small wheels once.
# Long work starts in a process session of its own (setsid), so it runs on between calls
# while the next parts travel: the device keeps such a process until the machine goes back.
# Usage (repo root): OUT=DIR scripts/gpu_staged_suites.sh [ACTION...]
#   suites [-k EXPR]: the GPU suites (scripts/gpu_run.sh with LOCKSTEP_SUITES_ONLY: the
#     self-check, then pytest -m gpu --require-gpu; EXPR defaults to leaving out the timing
#     prints), started in the background
#   convert NAME: join the staged GGUF NAME into /tmp/smollm2.gguf (its checksum checked),
#     then the SmolLM2 conversions (scripts/gpu_evidence.sh convert), in the background
#   ptx OLD: every kernel's PTX against the old sources in OLD (scripts/kernel_ptx_compare.py
#     --compiler nvrtc, the file its --save-old wrote here), in the background
#   ort NAME: join the staged onnxruntime-gpu wheel NAME (its checksum checked), install it
#     into /tmp/site-ort, then run the onnxruntime CUDA suite and the oracle on ort-cuda
#     (suites/test_ort_cuda.py, test_oracle_engine.py's GPU tests: what `suites -k ... and not
#     test_ort_cuda and not ort_cuda` leaves out) with it, in the background
#   wait SECONDS: wait (at most SECONDS) for the background work, then bring back its logs
#     and exit statuses (suites.tgz, convert.txt, ptx.tgz, ort.txt, background.txt)
# The kernels compile into /tmp/cupy-cache (CUPY_CACHE_DIR) once; every later call, the
# evidence phase's too, loads them from there.
set -uo pipefail
OUT=${OUT:-$PWD/out}
PY=${PY:-python3}
BG=/tmp/lockstep-bg
mkdir -p "$OUT" /tmp/stage "$BG"
export PYTHONUNBUFFERED=1 CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupy-cache} PY
export LOCKSTEP_CACHE=${LOCKSTEP_CACHE:-/tmp/lockstep-fixtures}
# the commit the records name (.stage/commit, written here by `git rev-parse --short HEAD`;
# the device's copy of the tree has no .git)
for f in .stage/commit /tmp/stage/commit; do
  [ -z "${LOCKSTEP_COMMIT:-}" ] && [ -f "$f" ] && LOCKSTEP_COMMIT=$(cat "$f")
done
export LOCKSTEP_COMMIT=${LOCKSTEP_COMMIT:-unknown}
status=0
if compgen -G ".stage/*" > /dev/null; then cp .stage/* /tmp/stage/ || status=1; fi
if compgen -G ".whl/*.whl" > /dev/null && [ ! -f /tmp/site/.lockstep-wheels ]; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site \
    $(ls .whl/*.whl | grep -v -e onnxruntime_genai -e onnxruntime_gpu) \
    && touch /tmp/site/.lockstep-wheels || status=1
fi
ls -la /tmp/stage > "$OUT/stage.txt"

# background NAME COMMAND: COMMAND in its own session, its output in $BG/NAME.log, its exit
# status in $BG/NAME.rc once it ends
background() {
  local name=$1
  shift
  rm -f "$BG/$name.rc"
  setsid bash -c "$*; echo \$? > $BG/$name.rc" > "$BG/$name.log" 2>&1 < /dev/null &
  echo "started $name in the background" | tee -a "$OUT/stage.txt"
}

while [ $# -gt 0 ]; do
  case "$1" in
    suites)
      kexpr="not print_decode_ms and not print_device_ms"
      if [ "${2:-}" = -k ]; then kexpr=$3; shift 2; fi
      background suites "OUT=$BG/suites LOCKSTEP_SUITES_ONLY=1 bash scripts/gpu_run.sh '$kexpr'"
      shift ;;
    convert)
      bash scripts/stage_large_file.sh join "$2" /tmp/smollm2.gguf >> "$OUT/stage.txt" 2>&1 \
        || status=1
      background convert "OUT=$BG/convert bash scripts/gpu_evidence.sh convert /tmp/smollm2.gguf"
      shift 2 ;;
    ptx)
      cp "$2" /tmp/ptx-old.json || status=1
      background ptx "$PY scripts/kernel_ptx_compare.py --old /tmp/ptx-old.json --compiler nvrtc --out $BG/ptx"
      shift 2 ;;
    ort)
      bash scripts/stage_large_file.sh join "$2" "/tmp/$2" >> "$OUT/stage.txt" 2>&1 || status=1
      "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site-ort "/tmp/$2" \
        >> "$OUT/stage.txt" 2>&1 || status=1
      background ort "PYTHONPATH=/tmp/site-ort:/tmp/site:$PWD $PY -m pytest suites/test_ort_cuda.py suites/test_oracle_engine.py -m gpu --require-gpu -p no:cacheprovider -q --timeout=300"
      shift 2 ;;
    wait)
      deadline=$(( $(date +%s) + $2 ))
      for name in suites convert ptx ort; do
        [ -f "$BG/$name.log" ] || continue
        while [ ! -f "$BG/$name.rc" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 2; done
        echo "$name: $(cat "$BG/$name.rc" 2>/dev/null || echo 'still running')" \
          | tee -a "$OUT/background.txt"
        tail -n 30 "$BG/$name.log" >> "$OUT/background.txt"
      done
      [ -d "$BG/suites" ] && tar czf "$OUT/suites.tgz" -C "$BG" suites suites.log
      [ -f "$BG/convert.log" ] && cp "$BG/convert.log" "$OUT/convert.txt"
      [ -d "$BG/ptx" ] && tar czf "$OUT/ptx.tgz" -C "$BG" ptx ptx.log
      [ -f "$BG/ort.log" ] && cp "$BG/ort.log" "$OUT/ort.txt"
      shift 2 ;;
    *) echo "unknown action $1" >&2; exit 2 ;;
  esac
done
echo "staged suites status $status"
exit $status
