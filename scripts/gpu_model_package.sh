#!/usr/bin/env bash
# The seed format's model packages on the device engines (issue 38's GPU evidence): our own
# onnx-genai model package (fixtures/model_package.py: tiny random weights, TensorScatter
# static caches, every variant form the seed's fixtures use) imported and decoded on
# native-cuda beside the host engines, ort-cuda where onnxruntime's CUDA provider runs.
# Usage (repo root, on a CUDA machine): OUT=DIR scripts/gpu_model_package.sh
# Environment: PY (default python3), LOCKSTEP_ENGINES (default
# native-cuda,native-host,ort-cpu,ort-cuda), TOKENS (default 8: its context is 16 positions),
# SEED_PACKAGES (comma-separated folders of the seed repository's own model-package fixtures,
# e.g. its model-package-cpu, carried in build/: judged beside ours).
# Writes to $OUT: model-package.txt (the matrix) and model-package-evidence.tgz (records).
# Exit: non-zero on any failed claim.
set -uo pipefail
OUT=${OUT:-$PWD/out}
PY=${PY:-python3}
ENGINES=${LOCKSTEP_ENGINES:-native-cuda,native-host,ort-cpu,ort-cuda}
TOKENS=${TOKENS:-8}
PKG=/tmp/lockstep-model-package
EV=/tmp/lockstep-model-package-evidence
mkdir -p "$OUT"
rm -rf "$PKG" "$EV"
status=0
"$PY" -m fixtures.model_package "$PKG" > "$OUT/model-package.txt" 2>&1 || status=1
"$PY" -m harness.cli run --packages "$PKG${SEED_PACKAGES:+,$SEED_PACKAGES}" --engines "$ENGINES" --max-new-tokens "$TOKENS" \
  --evidence-dir "$EV" >> "$OUT/model-package.txt" 2>&1 || status=1
cat "$OUT/model-package.txt"
tar czf "$OUT/model-package-evidence.tgz" -C /tmp lockstep-model-package-evidence
echo "gpu_model_package status $status"
exit $status
