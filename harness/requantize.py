"""Fresh quantizations of a package's float weights, as packages that declare the float model
they were made from: what quality beside the verdict is shown on (``harness.quality``).

SmolLM2 ships as a Q4_1 GGUF and no float original ships with it. Its float32 conversion
(the Q4_1 weights dequantized exactly: ``lockstep convert smollm2``) stands in as the
original float model: its GGUF's every matrix is dequantized and quantized again by the
``gguf`` package's own quantizer (Q4_0 or Q8_0; vectors stay float32), written as a new GGUF
(``cache/requantized/``), converted like any GGUF (its ``checkpoint.json`` also names the
GGUF's path, where engines look first), and the package declares the float32 package as its
``original`` (``package.yaml``, a sibling folder pinned by its content hash).
llama-cpp then runs the new GGUF; the verdict judges it against float32 over its own
dequantized weights (the new package), and the quality is measured against the original.

    python -m harness.requantize q4_0 q8_0      # prints each package's folder
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

from engines.backends.checkpoint_source import find_checkpoint
from engines.cache_root import cache_root
from engines.errors import InputError, LockstepError
from engines.package import load_package
from harness.convert.conversion import convert
from harness.convert.smollm2 import smollm2_package
from harness.gguf_rewrite import Tensor, rewrite_gguf

QTYPES = ("q4_0", "q8_0")


def requantize_gguf(src: Path, dst: Path, qtype: str) -> Path:
    """``src`` with every matrix dequantized and quantized to ``qtype`` (vectors float32)."""
    import gguf

    target = gguf.GGMLQuantizationType[qtype.upper()]

    def change(t):
        values = gguf.quants.dequantize(t.data, t.type).astype("float32")
        if values.ndim == 2:
            return Tensor(t.name, gguf.quants.quantize(values, target), target)
        return Tensor(t.name, values, gguf.GGMLQuantizationType.F32)

    file_type = getattr(gguf.LlamaFileType, f"MOSTLY_{qtype.upper()}")
    return rewrite_gguf(src, dst, change, file_type=file_type)


def declare_original(folder: Path, original) -> None:
    """Write ``original: {folder, content_hash}`` (``original``: a loaded sibling package)
    into the package at ``folder``."""
    if Path(original.root).parent.resolve() != Path(folder).parent.resolve():
        raise InputError("an original package must be a sibling folder", field="original",
                         value=str(original.root), remedy=f"put it beside {folder}")
    path = Path(folder) / "package.yaml"
    data = yaml.safe_load(path.read_text())
    data["original"] = {"folder": original.root.name, "content_hash": original.content_hash}
    path.write_text(yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=100))
    load_package(folder)  # still a package


def requantized_package(original, qtype: str) -> Path:
    """The package of ``original``'s checkpoint requantized to ``qtype``, converted beside
    ``original`` and declaring it (made once; reused while ``original`` is unchanged)."""
    if qtype not in QTYPES:
        raise InputError("unknown quantization", field="QTYPE", value=qtype,
                         remedy=f"use one of: {', '.join(QTYPES)}")
    source = find_checkpoint(original.root, "requantize")
    gguf_path = cache_root() / "requantized" / f"{source.path.stem}-{qtype.upper()}.gguf"
    if not gguf_path.is_file():
        gguf_path.parent.mkdir(parents=True, exist_ok=True)
        requantize_gguf(source.path, gguf_path, qtype)
    folder = convert(gguf_path, Path(original.root).parent / f"{gguf_path.stem}-float32",
                     cache="dynamic", dtype="float32").folder
    sidecar = folder / "checkpoint.json"  # where engines find the GGUF (hash-checked there)
    record = json.loads(sidecar.read_text())
    if record["source"].get("path") != str(gguf_path):
        record["source"]["path"] = str(gguf_path)
        sidecar.write_text(json.dumps(record, indent=2) + "\n")
    declared = load_package(folder).spec.original
    if declared is None or declared.content_hash != original.content_hash:
        declare_original(folder, original)
    return folder


def main(argv: list[str] | None = None) -> int:
    try:
        original = load_package(smollm2_package(cache="dynamic", dtype="float32"))
        for qtype in (argv if argv is not None else sys.argv[1:]) or QTYPES:
            print(requantized_package(original, qtype))
    except LockstepError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())


__all__ = ["QTYPES", "declare_original", "requantize_gguf", "requantized_package"]
