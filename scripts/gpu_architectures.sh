#!/usr/bin/env bash
# Every architecture the converter supports, on the device engines (issue 14's GPU evidence).
# One tiny checkpoint per family (Llama, Llama 3 rope scaling, Llama with biases, Qwen2,
# Qwen3, Mistral with a sliding window, Granite, OLMo2, Phi3, Gemma2, Gemma3, Mixtral), built by
# transformers with a fixed seed (no network, suites/architecture_checkpoints.py), saved as a
# Hugging Face folder, converted (float32 dynamic and static cache, float16 dynamic with its
# float32 twin), then run on the device engines beside native-host.
# Usage (repo root, on a CUDA machine): OUT=DIR scripts/gpu_architectures.sh
# Environment: PY (default python3), LOCKSTEP_ENGINES (default native-cuda,ort-cuda,native-host),
# TOKENS (default 24: with the 10-token prompt, well past every window of 3).
# Writes to $OUT: arch-build.txt, arch-matrix.txt, arch-evidence.tgz (the records; no report:
# the command that renders one is printed).
# Exit: non-zero on any failed claim or failed conversion.
set -uo pipefail
OUT=${OUT:-$PWD/out}
PY=${PY:-python3}
ENGINES=${LOCKSTEP_ENGINES:-native-cuda,ort-cuda,native-host}
TOKENS=${TOKENS:-24}
PKG=/tmp/lockstep-arch
EV=/tmp/lockstep-arch-evidence
mkdir -p "$OUT"
rm -rf "$PKG" "$EV" && mkdir -p "$PKG" "$EV"
status=0
"$PY" - "$PKG" > "$OUT/arch-build.txt" 2>&1 <<'PYEOF' || status=1
import sys
import warnings
from pathlib import Path

warnings.filterwarnings("ignore")
from harness.convert import convert
from suites.architecture_checkpoints import TinySpec, save_checkpoint

root = Path(sys.argv[1])
SPECS = {
    "llama": TinySpec("llama"), "llama3": TinySpec("llama", rope="llama3", tied=True),
    "llama-bias": TinySpec("llama", bias=True), "qwen2": TinySpec("qwen2"),
    "qwen3": TinySpec("qwen3"), "mistral": TinySpec("mistral", window=3),
    "granite": TinySpec("granite", bias=True), "olmo2": TinySpec("olmo2"),
    "phi3": TinySpec("phi3", window=5), "gemma2": TinySpec("gemma2", window=3, tied=True),
    "gemma3": TinySpec("gemma3", layers=3, window=3, tied=True),
    "mixtral": TinySpec("mixtral", window=3),
}
names, failed = [], []
for name, spec in SPECS.items():
    for cache, dtype in (("dynamic", "float32"), ("static", "float32"),
                         ("dynamic", "float16")):
        try:  # one family failing must not hide the others' evidence
            folder = root / "hf" / name
            if not folder.is_dir():
                save_checkpoint(spec, 2026, folder)
            result = convert(folder, root / f"{name}-{cache}-{dtype}", cache=cache,
                             dtype=dtype, max_context=64)
        except Exception as exc:
            failed.append(f"{name}-{cache}-{dtype}")
            print(f"FAILED {name} {cache} {dtype}: {type(exc).__name__}: {exc}")
            continue
        print(f"converted {name} {cache} {dtype}: {result.folder}")
        names.append(str(result.folder))
(root / "packages.txt").write_text(",".join(names))
sys.exit(1 if failed else 0)
PYEOF
cat "$OUT/arch-build.txt"
PACKAGES=$(cat "$PKG/packages.txt" 2>/dev/null)
[ -n "$PACKAGES" ] || { echo "no packages built"; exit 1; }
"$PY" -m harness.cli run --packages "$PACKAGES" --engines "$ENGINES" \
  --prompt "1 5 9 17 33 60 2 44 7 11" --prompt "3 70 12 12 90 41" \
  --max-new-tokens "$TOKENS" --evidence-dir "$EV" > "$OUT/arch-matrix.txt" 2>&1 || status=1
cat "$OUT/arch-matrix.txt"
tar czf "$OUT/arch-evidence.tgz" -C /tmp lockstep-arch-evidence
echo "report: tar -xzf arch-evidence.tgz && lockstep report lockstep-arch-evidence --no-catch-matrix -o report.html"
echo "gpu_architectures status $status"
exit $status
