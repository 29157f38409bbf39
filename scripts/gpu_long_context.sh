#!/usr/bin/env bash
# Long contexts on the GPU: SmolLM2 (float32, dynamic cache, the converter's default context of
# 4096) with prompts of 1-2k tokens built from our own text (python -m harness.prompts_long:
# two text prompts and one chat through the checkpoint's own template), 256 new tokens,
# native-cuda and ort-cuda judged by the recompute oracle on ort-cuda (--oracle-engine
# ort-cuda: the CPU oracle cannot afford 2k-token recomputes; the run first checks that the
# ort-cuda oracle agrees with ort-cpu's on a short prefix, and stops if it does not).
# Usage (repo root): OUT=DIR scripts/gpu_long_context.sh CHECKPOINT (a .gguf path, or smollm2)
# Environment: PY (default python3), LONG_ENGINES (default native-cuda,ort-cuda),
# LONG_TOKENS (default 256), LONG_ORACLE (default ort-cuda; a CPU smoke run of this script:
# LONG_ENGINES=ort-cpu LONG_ORACLE=native-host LONG_TOKENS=2). Writes long-convert.txt,
# long-prompts.txt, long-prompts.jsonl, long-matrix.txt and long-evidence.tgz (the records; no
# report: the command that renders it is printed) under $OUT. Exit: non-zero on any
# failed claim or refused run.
set -uo pipefail
GGUF=${1:?usage: $0 CHECKPOINT (a .gguf path, or smollm2)}
OUT=${OUT:-$PWD/out}
PY=${PY:-python3}
ENGINES=${LONG_ENGINES:-native-cuda,ort-cuda}
TOKENS=${LONG_TOKENS:-256}
ORACLE=${LONG_ORACLE:-ort-cuda}
if [ -z "${PYTHONPATH:-}" ]; then  # run alone: the carried wheels, as gpu_run.sh installs them
  if [ ! -d /tmp/site ] && compgen -G ".whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target /tmp/site .whl/*.whl || exit 1
  fi
  if [ -d /tmp/site ]; then export PYTHONPATH=/tmp/site:$PWD; else export PYTHONPATH=$PWD; fi
fi
export PYTHONUNBUFFERED=1
PKG=/tmp/lockstep-real/smollm2  # the same conversion gpu_real_checkpoint.sh makes (reused)
EV=/tmp/lockstep-long-evidence
mkdir -p "$OUT" /tmp/lockstep-real
rm -rf "$EV"
status=0
"$PY" -m harness.cli convert "$GGUF" -o "$PKG" --cache dynamic > "$OUT/long-convert.txt" 2>&1 || status=1
tail -n 3 "$OUT/long-convert.txt"
"$PY" -m harness.prompts_long "$PKG" --out "$OUT/long-prompts.jsonl" > "$OUT/long-prompts.txt" 2>&1 || status=1
cat "$OUT/long-prompts.txt"
t0=$(date +%s)
"$PY" -m harness.cli run --packages "$PKG" --engines "$ENGINES" --strict \
  --oracle-engine "$ORACLE" --prompts "$OUT/long-prompts.jsonl" --max-new-tokens "$TOKENS" \
  --evidence-dir "$EV" > "$OUT/long-matrix.txt" 2>&1 || status=1
echo "long-context matrix: $(( $(date +%s) - t0 )) s" >> "$OUT/long-matrix.txt"
cat "$OUT/long-matrix.txt"
tar czf "$OUT/long-evidence.tgz" -C /tmp lockstep-long-evidence
echo "report: tar -xzf long-evidence.tgz && lockstep report lockstep-long-evidence --title" \
  "'lockstep: long contexts (SmolLM2, 1-2k-token prompts, $TOKENS new tokens, oracle on $ORACLE)'" \
  "-o report.html"
echo "gpu_long_context status $status"
exit $status
