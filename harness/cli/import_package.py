"""``lockstep import-package DIR -o OUT``: an onnx-genai model package as lockstep packages.

The folder onnx-genai publishes (``manifest.json``, one folder per variant with its model
and ``inference_metadata.yaml``) becomes one lockstep package per variant this machine can
run (``engines.model_package``), each judged by the oracle like any package. ``lockstep
run --packages DIR`` takes the folder directly (imported once into the cache).
"""
from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console

from engines.errors import InputError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("import-package", help="import an onnx-genai model package "
                                              "(manifest.json + variants) as lockstep packages")
    p.add_argument("package", metavar="DIR", help="the model package folder (manifest.json)")
    p.add_argument("-o", "--output", type=Path, default=None, metavar="OUT",
                   help="the folder to write, one package per variant (default: "
                        "<DIR>-imported beside it)")
    p.add_argument("--force", action="store_true", help="replace the output folder if it exists")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from engines.model_package import import_model_package
    from engines.model_package.manifest import MANIFEST_FILE
    from engines.package import load_package
    from harness.cli.import_genai import replacing

    root = Path(args.package).expanduser().resolve()
    if not (root / MANIFEST_FILE).is_file() or (root / "package.yaml").exists():
        raise InputError(f"{root} holds no model-package manifest.json", field="DIR",
                         value=str(root), remedy="give the folder whose manifest.json names "
                                                 "components and variants (a lockstep "
                                                 "package needs no import)")
    out = args.output if args.output is not None else root.parent / f"{root.name}-imported"
    with replacing(out, root, args.force, "model package") as out:
        report = import_model_package(root, out)
    console = Console(soft_wrap=True)
    console.print(f"imported {report.source} ({report.content_hash[:19]}) into {out}")
    for label, folder in report.imported.items():
        spec = load_package(folder).spec
        cells = ", ".join(f"{n} ({c.update})" for n, c in spec.state.items()
                          if c.kind == "kv")[:80]
        console.print(f"  {label}: {folder.name}, {spec.dtype}, vocab {spec.vocab_size}, "
                      f"max_context {spec.max_context}, cells {cells or '(none)'}")
    for label, reason in report.skipped.items():
        console.print(f"  {label}: left out, {reason}")
    folders = ",".join(str(f) for f in report.imported.values())
    console.print(f"  next: lockstep run --engines ort-cpu,onnx-reference,native-host "
                  f"--packages {root}   (or --packages {folders})")
    return 0


__all__ = ["register", "run"]
