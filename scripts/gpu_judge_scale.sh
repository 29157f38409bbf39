#!/usr/bin/env bash
# The judge at scale on the GPU host (issue 32): SmolLM2 float16 and bfloat16 on native-cuda
# and hf-cuda, the package's six text and chat prompts, 48 new tokens: 24 cells, each judged
# by the oracle (the float32 twin on ort-cpu, one forward per stream), timed as a whole.
# Usage (repo root, on a CUDA machine): OUT=DIR scripts/gpu_judge_scale.sh CHECKPOINT
# (a .gguf path, or smollm2 where `make real` installed it).
# Environment: PY (default python3), ENGINES (default native-cuda,hf-cuda), TOKENS (48).
# Writes to $OUT: judge-scale.txt (the matrix, the wall time, the judge's and the engines'
# seconds summed from the records) and judge-scale-evidence.tgz (records and manifest).
# Exit: non-zero when a cell fails or the run does not finish.
set -uo pipefail
GGUF=${1:?usage: $0 CHECKPOINT (a .gguf path, or smollm2)}
OUT=${OUT:-$PWD/out}
PY=${PY:-python3}
ENGINES=${ENGINES:-native-cuda,hf-cuda}
TOKENS=${TOKENS:-48}
# the conversions scripts/gpu_evidence.sh convert makes (kept where they are there already)
PKG=${PKG:-/tmp/lockstep-dtypes}
EV=/tmp/lockstep-judge-scale-evidence
export LOCKSTEP_CHECKPOINTS=$GGUF  # hf-cuda finds the source checkpoint here
mkdir -p "$OUT" "$PKG"
rm -rf "$EV"
status=0
for dtype in float16 bfloat16; do  # each writes (or reuses) its float32 twin beside it
  [ -f "$PKG/smollm2-dynamic-$dtype/package.yaml" ] || "$PY" -m harness.cli convert "$GGUF" \
    -o "$PKG/smollm2-dynamic-$dtype" --dtype "$dtype" --max-context 512 \
    >> "$OUT/judge-scale-convert.txt" 2>&1 || status=1
done
start=$(date +%s%N)
"$PY" -m harness.cli run --packages "$PKG/smollm2-dynamic-float16,$PKG/smollm2-dynamic-bfloat16" \
  --engines "$ENGINES" --max-new-tokens "$TOKENS" --evidence-dir "$EV" \
  > "$OUT/judge-scale.txt" 2>&1 || status=1
end=$(date +%s%N)
echo "wall: $(( (end - start) / 1000000 )) ms for the run above (conversions before it)" \
  >> "$OUT/judge-scale.txt"
"$PY" - "$EV" >> "$OUT/judge-scale.txt" <<'EOF'
import sys
from harness.evidence import load_evidence_dir
records = load_evidence_dir(sys.argv[1])
judged = [r for r in records if r.timings is not None]
engine_s = sum(r.timings.wall_s for r in judged)
judge_s = sum(r.timings.judge_s or 0 for r in judged)
forwards = sum(r.timings.oracle_forwards or 0 for r in judged)
print(f"records: {len(records)}; decodes timed: {len(judged)}; engines' decode seconds "
      f"{engine_s:.1f}; judge seconds {judge_s:.1f}; oracle forwards {forwards}")
for r in judged:
    print(f"  {r.package.name} {r.engine} {r.prompt.name}: {r.status}, engine "
          f"{r.timings.wall_s:.2f} s, judge {r.timings.judge_s or 0:.2f} s, "
          f"{r.timings.oracle_forwards or 0} oracle forward(s), {len(r.tokens)} tokens")
EOF
cat "$OUT/judge-scale.txt"
tar czf "$OUT/judge-scale-evidence.tgz" -C /tmp lockstep-judge-scale-evidence
echo "gpu_judge_scale status $status"
exit $status
