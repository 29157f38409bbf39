"""The facts a package takes from genai_config.json's ``model`` section (vocab_size,
context_length, bos/eos token ids), each checked by name.

onnxruntime-genai builds (``lockstep import-genai``) and onnx-genai model packages
(``lockstep import-package``) both carry the file; a value of the wrong kind or outside the
vocabulary is refused naming genai_config.json's field, never dropped or passed on to be
blamed on the package.yaml lockstep writes from it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

# genai_config.json's model.<key> -> the package.yaml field it becomes
COUNTS = {"vocab_size": "vocab_size", "context_length": "max_context"}
TOKENS = {"bos_token_id": "bos_id", "eos_token_id": "eos_id"}
REMEDY = "correct genai_config.json, or build the model again with its builder"


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def model_facts(model: dict, path: Path, error: type, needs_vocab: bool = False) -> dict:
    """``{package field: value}`` for the facts ``model`` holds (null ones left out), an eos
    list reduced to its first id; a wrong one raises ``error`` (an ``InputError`` or a
    ``PackageError``) naming ``model.<key>`` in ``path``."""
    def refuse(key: str, value: Any, why: str, remedy: str = REMEDY) -> Exception:
        return error(f"genai_config.json's model.{key} {why}", field=f"model.{key}",
                     value=value, remedy=remedy, where=str(path))

    facts = {}
    for key, field in COUNTS.items():
        value = model.get(key)
        if value is None and not (needs_vocab and key == "vocab_size"):
            continue
        if not _int(value) or value < 1:
            raise refuse(key, value, "is not a positive integer")
        facts[field] = value
    vocab = facts.get("vocab_size")
    for key, field in TOKENS.items():
        value = model.get(key)
        if value is None:
            continue
        ids = value if isinstance(value, list) else [value]
        if not ids or not all(_int(t) and t >= 0 for t in ids):
            raise refuse(key, value, "is not a token id (an integer of 0 or more) or a "
                                     "non-empty list of them")
        outside = [t for t in ids if vocab is not None and t >= vocab]
        if outside:
            raise refuse(key, value, f"holds token id {outside[0]}, outside the vocabulary "
                                     f"[0, {vocab})",
                         f"use a token id below vocab_size ({vocab}) in genai_config.json, "
                         f"or build the model again")
        facts[field] = ids[0]
    return facts


__all__ = ["model_facts"]
