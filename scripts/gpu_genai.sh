#!/usr/bin/env bash
# onnxruntime-genai on the GPU beside lockstep's engines (issue 13): its own model builder
# makes SmolLM2 from the checkpoint (-e cuda -p fp16 for the float16 conversion; -e cpu -p fp32
# for the float32 one, run by ort-genai), the parity matrix judges ort-genai-cuda, ort-genai and
# hf-cuda against the oracle on lockstep's conversions of the same checkpoint, and the bench
# times ort-genai-cuda beside native-cuda, ort-cuda and hf-cuda. No network is used.
# The builder's fp32 model is also imported as a lockstep package (`lockstep convert
# --builder onnxruntime-genai`) and run on native-cuda and native-host (issue 14: a component
# onnxruntime-genai wrote, on lockstep's own executor).
# Usage (repo root, on a CUDA machine): OUT=DIR scripts/gpu_genai.sh CHECKPOINT (a .gguf path)
# Needs: onnxruntime-gpu importable (ORT_SITE, default /tmp/site, is put on PYTHONPATH when it
# exists), and in .whl/ the onnxruntime_genai_cuda and onnx_ir wheels
# (scripts/fetch_gpu_wheels.sh --with-genai); any other .whl/ wheel is installed too when
# pydantic or gguf is not importable. Environment: PY (default python3), TOKENS (parity run,
# default 32), BENCH_TOKENS (default 128), REPEATS (default 3), PROMPTS (default 3),
# PARTS (default "parity bench": parity is the matrix and the imported package, nothing timed;
# bench is the timed bench, to be run alone on the GPU).
# Writes to $OUT: genai-install.txt, genai-convert.txt, genai-matrix.txt, genai-builds.json,
# genai-import.txt, genai-bench.txt, genai-evidence.tgz (records and bench JSON; no report: the
# commands that render them are printed). Exit: non-zero on any failed claim.
set -uo pipefail
GGUF=$(realpath "${1:?usage: $0 CHECKPOINT (a .gguf path)}")
OUT=${OUT:-$PWD/out}
PY=${PY:-python3}
TOKENS=${TOKENS:-32}
BENCH_TOKENS=${BENCH_TOKENS:-128}
REPEATS=${REPEATS:-3}
PROMPTS=${PROMPTS:-3}
PARTS=${PARTS:-parity bench}
ORT_SITE=${ORT_SITE:-/tmp/site}
SITE=/tmp/site-genai
PKG=/tmp/lockstep-dtypes  # shared with gpu_real_dtypes.sh: a conversion made there is reused
EV=$OUT/genai-evidence  # under $OUT: a run cut short still brings back what it recorded
mkdir -p "$OUT" "$PKG" "$SITE"
rm -rf "$EV" && mkdir -p "$EV/bench"
status=0
[ -d "$ORT_SITE" ] && export PYTHONPATH="$ORT_SITE${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH="${PYTHONPATH:+$PYTHONPATH:}$SITE"
"$PY" -m pip install -q --no-index --no-deps --target "$SITE" .whl/onnxruntime_genai_cuda-*.whl \
  .whl/onnx_ir-*.whl > "$OUT/genai-install.txt" 2>&1 || status=1
if ! "$PY" -c "import pydantic, gguf" 2>/dev/null; then
  ls .whl/*.whl | grep -v -e onnxruntime_genai -e onnx_ir -e onnxruntime_gpu | \
    xargs "$PY" -m pip install -q --no-index --no-deps --target "$SITE" >> "$OUT/genai-install.txt" 2>&1 || status=1
fi
"$PY" -c "import onnxruntime as o, onnxruntime_genai as g; print('onnxruntime', o.__version__, o.get_available_providers()); print('genai', g.__file__, 'cuda', g.is_cuda_available())" \
  >> "$OUT/genai-install.txt" 2>&1 || status=1
cat "$OUT/genai-install.txt"
# the engines that build from the checkpoint find it here (by content hash); builds are cached
export LOCKSTEP_CHECKPOINTS="$GGUF"
export LOCKSTEP_CACHE=/tmp/lockstep-genai-cache
for dtype in float32 float16; do
  [ -f "$PKG/smollm2-static-$dtype/package.yaml" ] || "$PY" -m harness.cli convert "$GGUF" \
    -o "$PKG/smollm2-static-$dtype" --cache static --dtype "$dtype" \
    >> "$OUT/genai-convert.txt" 2>&1 || status=1
done
tail -n 4 "$OUT/genai-convert.txt"
"$PY" -m harness.cli engines >> "$OUT/genai-convert.txt" 2>&1
if [[ " $PARTS " == *" parity "* ]]; then
# ort-genai-cuda runs the float16 package (its float32 CUDA builds do not load in 0.18: that
# cell is unavailable, with the reason); ort-genai (CPU, fp32) the float32 one
"$PY" -m harness.cli run --packages "$PKG/smollm2-static-float32,$PKG/smollm2-static-float16" \
  --engines ort-genai-cuda,ort-genai,hf-cuda --max-prompts "$PROMPTS" --max-new-tokens "$TOKENS" \
  --evidence-dir "$EV" > "$OUT/genai-matrix.txt" 2>&1 || status=1
cat "$OUT/genai-matrix.txt"
# which conversion each engine ran: onnxruntime-genai's builds (builder, version, precision,
# checkpoint hash); the oracle's package is named in every record's judgement
"$PY" -c "import json,glob,sys; json.dump([json.load(open(p)) for p in sorted(glob.glob(sys.argv[1]))], sys.stdout, indent=1)" \
  "$LOCKSTEP_CACHE/genai/*/build.json" > "$OUT/genai-builds.json" || status=1
# the builder's fp32 graph as a lockstep package, on lockstep's executor (host and device)
rm -rf "$PKG/smollm2-genai-built"
"$PY" -m harness.cli convert "$GGUF" --builder onnxruntime-genai -o "$PKG/smollm2-genai-built" \
  > "$OUT/genai-import.txt" 2>&1 || status=1
"$PY" -m harness.cli run --packages "$PKG/smollm2-genai-built" --engines native-cuda,native-host \
  --strict --max-prompts "$PROMPTS" --max-new-tokens "$TOKENS" --evidence-dir "$EV/imported" \
  >> "$OUT/genai-import.txt" 2>&1 || status=1
cat "$OUT/genai-import.txt"
fi
if [[ " $PARTS " == *" bench "* ]]; then
"$PY" -m harness.cli bench --engines ort-genai-cuda,native-cuda,ort-cuda,hf-cuda \
  --packages "$PKG/smollm2-static-float16" --baseline hf-cuda --ignore-eos \
  --max-new-tokens "$BENCH_TOKENS" --repeats "$REPEATS" --warmup 2 \
  --json "$EV/bench/bench-genai-float16.json" > "$OUT/genai-bench.txt" 2>&1 || status=1
cat "$OUT/genai-bench.txt"
fi
tar czf "$OUT/genai-evidence.tgz" -C "$OUT" genai-evidence && rm -rf "$EV"
if [[ " $PARTS " == *" parity "* ]]; then  # the bench alone writes no records to report
  echo "report: tar -xzf genai-evidence.tgz && lockstep report genai-evidence -o report.html"
  echo "report: lockstep report genai-evidence/imported --no-catch-matrix -o imported-report.html"
fi
echo "gpu_genai status $status"
exit $status
