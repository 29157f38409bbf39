"""A built fixture with a prompt-lookup section instead of its own: the same weights, the
same greedy stream, drafts copied from the sequence (kind ``prompt-lookup``)."""
from __future__ import annotations

import shutil
from pathlib import Path

import yaml

from engines.package import load_package


def lookup_section(spec: dict, max_width: int, max_ngram: int = 3, min_ngram: int = 1) -> dict:
    """``decoding.speculative`` of kind prompt-lookup over the target of ``spec`` (a loaded
    package.yaml): every target kv cell rolled back, every recurrent one snapshotted."""
    cells = {name: cell for name, cell in spec["state"].items() if cell["component"] == "target"}
    return {"kind": "prompt-lookup", "target": "target", "max_width": max_width,
            "max_ngram": max_ngram, "min_ngram": min_ngram,
            "rollback": [n for n, c in cells.items() if c["kind"] == "kv"],
            "snapshot": [n for n, c in cells.items() if c["kind"] == "recurrent"]}


def with_prompt_lookup(source: Path, folder: Path, max_width: int, **ngrams):
    """``source`` (a small package folder) copied to ``folder`` with a prompt-lookup section,
    loaded."""
    shutil.copytree(source, folder)
    path = folder / "package.yaml"
    doc = yaml.safe_load(path.read_text())
    doc["name"] = f"{doc['name']}_lookup"
    doc["decoding"]["speculative"] = lookup_section(doc, max_width, **ngrams)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_package(folder)
