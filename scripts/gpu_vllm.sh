#!/usr/bin/env bash
# vLLM 0.26.0 on the H200 (issue 35 item 5): SmolLM2 float16 and bfloat16 on the in-process
# `vllm` engine, then vLLM's OpenAI-compatible server over the same folder through
# `http:openai=URL` with --concurrency 4, without and with VLLM_BATCH_INVARIANT=1.
# Usage (repo root, on the GPU machine), one phase a device call:
#   OUT=DIR scripts/gpu_vllm.sh stage [N]   copy the carried .stage/ files (part N of
#       lockstep-vllm-wheels.tar, the first call its .sha256 too) into /tmp/stage
#   OUT=DIR scripts/gpu_vllm.sh install     join and check the tar; its wheels into /tmp/vp
#       (pip --no-index --no-deps --target: the image's torch 2.11.0+cu130 stays), .whl/'s
#       into /tmp/site; the GGUF to /tmp/smollm2.gguf; vllm's version and imports; the two
#       SmolLM2 packages converted and the Hugging Face folder vLLM loads made
#   OUT=DIR scripts/gpu_vllm.sh run         offline then server (below), under 540 s in all
#   OUT=DIR scripts/gpu_vllm.sh offline     lockstep run --engines vllm on both packages,
#       --concurrency 4 (vLLM batches the prompts of one generate call)
#   OUT=DIR scripts/gpu_vllm.sh server      the server, plain then VLLM_BATCH_INVARIANT=1
# Here, first: scripts/fetch_gpu_wheels.sh --with-vllm (the parts in .stage/).
# Environment: PY (python3), TOKENS (64), CONCURRENCY (4), PORT (8765), PKG
# (/tmp/lockstep-vllm-packages), DEADLINE (seconds a run phase may take, 530).
# Writes to $OUT (two files: the device brings back eight at most): summary.txt and
# vllm-<phase>.tgz, each step's log, the servers' logs and the evidence folders (records; no
# report: the command that renders one is printed). Every step is recorded with its exit
# status and the next step is still tried; the exit status is non-zero if any step failed.
set -u
PHASE=${1:?usage: $0 stage [N] | install | run | offline | server}
OUT=${OUT:-$PWD/out}
PY=${PY:-python3}
TOKENS=${TOKENS:-64}
CONCURRENCY=${CONCURRENCY:-4}
PORT=${PORT:-8765}
PKG=${PKG:-/tmp/lockstep-vllm-packages}
DEADLINE=${DEADLINE:-530}
TAR=lockstep-vllm-wheels.tar
W=/tmp/vllm-out/$PHASE
rm -rf "$W" && mkdir -p "$OUT" "$W" /tmp/stage
export PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/vp:/tmp/site:$PWD
export LOCKSTEP_CACHE=${LOCKSTEP_CACHE:-/tmp/lockstep-cache}
export LOCKSTEP_CHECKPOINTS=/tmp/smollm2.gguf  # the engines find the source GGUF here
# FlashInfer is not shipped (fetch_gpu_wheels.sh --with-vllm leaves it out); vLLM 0.26.0's
# model runner imports it for its top-k/top-p sampler unless this is 0 (greedy needs neither)
export VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}
F16=$PKG/smollm2-dynamic-float16
status=0
SUMMARY=$W/summary.txt

# step NAME SECONDS COMMAND...: COMMAND under `timeout` (at most what the deadline leaves),
# its output in $W/NAME.txt, its exit status in the summary; never stops the script
step() {
  local name=$1 limit=$2
  shift 2
  local left=$(( DEADLINE - SECONDS ))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -le 5 ]; then
    echo "$name: not run (the phase's $DEADLINE s are spent)" | tee -a "$SUMMARY"
    status=1
    return 1
  fi
  local start=$SECONDS rc
  timeout -k 10 "$limit" "$@" > "$W/$name.txt" 2>&1
  rc=$?
  [ $rc -eq 0 ] || status=1
  printf '%-28s rc=%-4s %4ss%s\n' "$name" "$rc" "$((SECONDS - start))" \
    "$([ $rc -eq 124 ] && echo " (timed out at ${limit}s)")" | tee -a "$SUMMARY"
  tail -n 15 "$W/$name.txt"
  return $rc
}

SERVER_PID=
stop_server() {
  [ -n "$SERVER_PID" ] || return 0
  kill -TERM -- "-$SERVER_PID" 2>/dev/null || kill -TERM "$SERVER_PID" 2>/dev/null
  for _ in $(seq 20); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 0.5; done
  kill -KILL -- "-$SERVER_PID" 2>/dev/null || kill -KILL "$SERVER_PID" 2>/dev/null
  SERVER_PID=
}
trap stop_server EXIT
trap 'stop_server; exit 143' INT TERM

# serve NAME [ENV=VALUE...]: vLLM's OpenAI server on the float16 folder, ready on /health
serve() {
  local name=$1 folder
  shift
  folder=$(cat /tmp/vllm-folder.txt 2>/dev/null) || { echo "$name: no folder (run install)" \
    | tee -a "$SUMMARY"; status=1; return 1; }
  setsid env "$@" "$PY" -m vllm.entrypoints.openai.api_server --model "$folder" \
    --dtype float16 --host 127.0.0.1 --port "$PORT" --seed 0 --gpu-memory-utilization 0.3 \
    --max-model-len 512 --max-logprobs 10 --enforce-eager --no-enable-prefix-caching \
    > "$W/$name-server.log" 2>&1 < /dev/null &
  SERVER_PID=$!
  local limit=$(( DEADLINE - SECONDS - 60 )) start=$SECONDS
  [ $limit -gt 240 ] && limit=240
  while [ $((SECONDS - start)) -lt $limit ]; do
    if "$PY" -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; then
      echo "$name server: ready in $((SECONDS - start)) s" | tee -a "$SUMMARY"
      return 0
    fi
    kill -0 "$SERVER_PID" 2>/dev/null || break
    sleep 2
  done
  echo "$name server: not ready after $((SECONDS - start)) s; its log's end:" | tee -a "$SUMMARY"
  tail -n 30 "$W/$name-server.log"
  stop_server
  status=1
  return 1
}


# one process a package: each loads its own vLLM (a second engine core in one process is
# the path vLLM exercises least)
offline() {
  local dtype ev
  for dtype in float16 bfloat16; do
    ev=$W/evidence-offline-$dtype
    step "offline-$dtype-run" 170 "$PY" -m harness.cli run --engines vllm \
      --packages "$PKG/smollm2-dynamic-$dtype" --max-new-tokens "$TOKENS" \
      --concurrency "$CONCURRENCY" --evidence-dir "$ev"
  done
}

server() {
  local name ev
  for name in server-plain server-batch-invariant; do
    ev=$W/evidence-$name
    if [ $name = server-plain ]; then serve $name VLLM_BATCH_INVARIANT=0
    else serve $name VLLM_BATCH_INVARIANT=1; fi || continue
    step "$name-run" 150 "$PY" -m harness.cli run \
      --engines "http:openai=http://127.0.0.1:$PORT" --packages "$F16" \
      --max-new-tokens "$TOKENS" --concurrency "$CONCURRENCY" --evidence-dir "$ev"
    stop_server
  done
}

case "$PHASE" in
  stage)
    if compgen -G ".stage/*" > /dev/null; then cp .stage/* /tmp/stage/ || status=1; fi
    echo "stage ${2:-}: $(ls /tmp/stage | tr '\n' ' ')" | tee -a "$SUMMARY"
    ;;
  install)
    step join 120 bash scripts/stage_large_file.sh join "$TAR" "/tmp/$TAR" \
      && step untar 60 tar -xf "/tmp/$TAR" -C /tmp && rm -f "/tmp/$TAR"
    step pip-vllm 300 "$PY" -m pip install -q --no-index --no-deps --no-compile \
      --no-cache-dir --target /tmp/vp /tmp/lockstep-vllm-wheels/*.whl
    if compgen -G ".whl/*.whl" > /dev/null; then
      step pip-small 120 "$PY" -m pip install -q --no-index --no-deps --no-compile \
        --no-cache-dir --target /tmp/site $(ls .whl/*.whl | grep -v -e onnxruntime_ -e vllm)
    fi
    [ -f /tmp/smollm2.gguf ] || step gguf 60 "$PY" -c "import lzma, shutil; shutil.copyfileobj(
      lzma.open('/tmp/lockstep-vllm-wheels/smollm2.gguf.xz'), open('/tmp/smollm2.gguf', 'wb'))"
    step import-vllm 120 "$PY" -c "import torch, vllm, vllm.entrypoints.openai.api_server
from vllm import LLM, SamplingParams
from vllm.inputs import TokensPrompt
print('vllm', vllm.__version__, 'torch', torch.__version__, 'cuda', torch.version.cuda,
      torch.cuda.get_device_name(0))"
    # the suite's one test that needs vLLM itself: the fakes' fields are vLLM's
    step vllm-suite 120 "$PY" -m pytest suites/test_vllm_engine.py -m gpu --require-gpu \
      -p no:cacheprovider -q
    for dtype in float16 bfloat16; do  # each writes (or reuses) its float32 twin beside it
      [ -f "$PKG/smollm2-dynamic-$dtype/package.yaml" ] || step "convert-$dtype" 240 \
        "$PY" -m harness.cli convert /tmp/smollm2.gguf -o "$PKG/smollm2-dynamic-$dtype" \
        --dtype "$dtype" --max-context 512
    done
    step hf-folder 120 "$PY" -c "from pathlib import Path
from engines.backends.checkpoint_source import find_checkpoint
from engines.backends.vllm_engine import hf_folder
folder = hf_folder(find_checkpoint(Path('$F16'), 'vllm'))
Path('/tmp/vllm-folder.txt').write_text(str(folder))
print(folder, sorted(p.name for p in folder.iterdir()))"
    step engines 60 "$PY" -m harness.cli engines
    ;;
  offline) offline ;;
  server) server ;;
  run) offline; server ;;
  *) echo "unknown phase $PHASE (stage, install, run, offline, server)" >&2; exit 2 ;;
esac
echo "== summary ($PHASE, ${SECONDS}s) =="
cat "$SUMMARY" 2>/dev/null
grep -h -E "identical|drift|diverge|fail|error|unavailable|concurrency" \
  "$W"/offline-*-run.txt "$W"/server-*-run.txt 2>/dev/null | tail -n 40
cp "$SUMMARY" "$OUT/summary.txt" 2>/dev/null
tar czf "$OUT/vllm-$PHASE.tgz" -C /tmp/vllm-out "$PHASE"
for ev in "$W"/evidence-*; do  # the folders that hold records
  compgen -G "$ev/*.json*" > /dev/null || compgen -G "$ev/*/*.json*" > /dev/null || continue
  echo "report: tar -xzf vllm-$PHASE.tgz && lockstep report $PHASE/$(basename "$ev") -o report.html"
done
echo "gpu_vllm $PHASE status $status"
exit $status
