#!/usr/bin/env bash
# Fetch the wheels the GPU machine lacks (it has no registry access) into .whl/ (git-ignored).
# Usage: scripts/fetch_gpu_wheels.sh [--with-ort-gpu]
# The large onnxruntime-gpu wheel is split into .stage/ parts of 52,000,000 bytes, each small
# enough for one device call; scripts/gpu_stage_join.sh joins and checks them there.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
fetch() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLAT[@]}" -d "$1" "${@:2}"
}
# pydantic and its small dependencies (absent on the H200 image).
fetch .whl pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.7.0 typing-inspection==0.4.2
if [ "${1:-}" = "--with-ort-gpu" ]; then
  mkdir -p .stage
  fetch .stage onnxruntime-gpu==1.31.1
  whl=$(ls .stage/onnxruntime_gpu-*.whl)
  sha256sum "$whl" | tee .stage/SHA256
  (cd .stage && split -b 52000000 "$(basename "$whl")" part. && rm "$(basename "$whl")")
fi
ls -la .whl .stage 2>/dev/null || true
