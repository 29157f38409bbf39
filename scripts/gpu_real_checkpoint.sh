#!/usr/bin/env bash
# The real checkpoint on a GPU machine: convert SmolLM2 from its GGUF (dynamic cache, static
# cache, and a 24-block layer-skip drafter with each cache), then the parity matrix on the
# device engines (greedy, every speculative width) and the memory probe eager and with graphs;
# the records packed in real-evidence.tgz (no report: the command that renders it is printed).
# Usage (repo root): OUT=DIR scripts/gpu_real_checkpoint.sh CHECKPOINT (a .gguf path, or
# smollm2 where `make real` installed it)
# Environment: PY (default python3), LOCKSTEP_ENGINES (default native-cuda). Exit: non-zero
# on any failed claim.
set -uo pipefail
GGUF=${1:?usage: $0 CHECKPOINT (a .gguf path, or smollm2)}
OUT=${OUT:-$PWD/out}
PY=${PY:-python3}
ENGINES=${LOCKSTEP_ENGINES:-native-cuda}
PKG=/tmp/lockstep-real
EV=/tmp/lockstep-real-evidence
mkdir -p "$OUT" "$PKG"
rm -rf "$EV"
status=0
"$PY" -m harness.cli convert "$GGUF" -o "$PKG/smollm2" --cache dynamic > "$OUT/real-convert.txt" 2>&1 || status=1
"$PY" -m harness.cli convert "$GGUF" -o "$PKG/smollm2-static" --cache static >> "$OUT/real-convert.txt" 2>&1 || status=1
"$PY" -m harness.cli convert "$GGUF" -o "$PKG/smollm2-selfspec" --draft-layers 24 >> "$OUT/real-convert.txt" 2>&1 || status=1
"$PY" -m harness.cli convert "$GGUF" -o "$PKG/smollm2-selfspec-static" --cache static --draft-layers 24 \
  >> "$OUT/real-convert.txt" 2>&1 || status=1
tail -n 5 "$OUT/real-convert.txt"
"$PY" -m harness.cli run --packages "$PKG/smollm2,$PKG/smollm2-static" --engines "$ENGINES" --strict \
  --max-prompts 3 --evidence-dir "$EV" > "$OUT/real-matrix.txt" 2>&1 || status=1
"$PY" -m harness.cli run --mode speculative --width all --packages "$PKG/smollm2-selfspec,$PKG/smollm2-selfspec-static" \
  --engines "$ENGINES" --strict --max-prompts 2 --evidence-dir "$EV" >> "$OUT/real-matrix.txt" 2>&1 || status=1
cat "$OUT/real-matrix.txt"
for mode in eager graphs; do
  "$PY" -m suites.gpu_memory_probe "$PKG/smollm2-static" 100 "$mode" > "$OUT/real-memory-$mode.json" || status=1
  "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); s=d['series']; print(sys.argv[2], 'live', s[0]['live_allocations'], s[-1]['live_allocations'], 'bytes', s[0]['live_bytes'], s[-1]['live_bytes'], 'free drift', d['free_before']-d['free_after'], d.get('graph_slots'))" "$OUT/real-memory-$mode.json" "$mode" || status=1
done
tar czf "$OUT/real-evidence.tgz" -C /tmp lockstep-real-evidence
echo "report: tar -xzf real-evidence.tgz && lockstep report lockstep-real-evidence -o report.html"
echo "gpu_real_checkpoint status $status"
exit $status
