#!/usr/bin/env bash
# Stage a file too large for one device call (the 255 MB onnxruntime-gpu wheel, a 98 MB
# checkpoint) to the GPU machine in parts, and join them there with a checksum.
#
#   scripts/stage_large_file.sh split FILE      (here) writes .stage/<name>.partNN, each
#                                               40,000,000 bytes (the last shorter), and
#                                               .stage/<name>.sha256; .stage/ is git-ignored
#   scripts/stage_large_file.sh join NAME DEST  (there) joins /tmp/stage/<name>.part* into
#                                               DEST and checks it against <name>.sha256
#
# The device calls, one part each (the carry limit is 64 MiB a call; /tmp survives between
# calls while the machine stays warm):
#   run(carry=[".stage/<name>.part00", ".stage/<name>.sha256"],
#       command="mkdir -p /tmp/stage && cp .stage/<name>.part00 .stage/<name>.sha256 /tmp/stage/")
#   run(carry=[".stage/<name>.part01"], command="mkdir -p /tmp/stage && cp .stage/<name>.part01 /tmp/stage/")
#   ... one call per part ...
#   run(command="scripts/stage_large_file.sh join <name> .whl/<name> && OUT=$OUT scripts/gpu_run.sh")
# (gpu_run.sh installs every .whl/*.whl; if .whl/ is carried in that last call, join after it.)
#
# Environment (tests): STAGE_OUT (default <repo>/.stage), STAGE_DIR (default /tmp/stage),
# STAGE_PART_BYTES (default 40000000: a part plus the tree, about 8 MB, and .whl/, 2.7 MB,
# must stay under a call's 64 MiB; SmolLM2's 98 MB GGUF goes in two with 49181216).
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT_DIR=${STAGE_OUT:-$REPO/.stage}
IN_DIR=${STAGE_DIR:-/tmp/stage}
PART_BYTES=${STAGE_PART_BYTES:-40000000}

usage() { echo "usage: $0 split FILE | join NAME DEST" >&2; exit 2; }

case "${1:-}" in
  split)
    [ $# -eq 2 ] || usage
    file=$2
    [ -f "$file" ] || { echo "split: no file $file" >&2; exit 2; }
    name=$(basename "$file")
    mkdir -p "$OUT_DIR"
    rm -f "$OUT_DIR/$name".part* "$OUT_DIR/$name.sha256"
    split -b "$PART_BYTES" -d -a 2 "$file" "$OUT_DIR/$name.part"
    (cd "$(dirname "$file")" && sha256sum "$name") > "$OUT_DIR/$name.sha256"
    ls -l "$OUT_DIR/$name".part* "$OUT_DIR/$name.sha256"
    ;;
  join)
    [ $# -eq 3 ] || usage
    name=$2
    dest=$3
    [ -f "$IN_DIR/$name.sha256" ] || { echo "join: no $IN_DIR/$name.sha256 (stage it with part00)" >&2; exit 1; }
    compgen -G "$IN_DIR/$name.part*" >/dev/null || { echo "join: no parts $IN_DIR/$name.part*" >&2; exit 1; }
    mkdir -p "$(dirname "$dest")"
    tmp="$dest.joining"
    cat "$IN_DIR/$name".part* > "$tmp"
    want=$(awk '{print $1}' "$IN_DIR/$name.sha256")
    got=$(sha256sum "$tmp" | awk '{print $1}')
    if [ "$want" != "$got" ]; then
      rm -f "$tmp"
      echo "join: sha256 mismatch for $name: want $want, got $got; parts present:" >&2
      ls -l "$IN_DIR/$name".part* >&2
      exit 1
    fi
    mv "$tmp" "$dest"
    echo "joined $name -> $dest (sha256 $got)"
    ;;
  *) usage ;;
esac
