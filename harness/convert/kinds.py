"""What a checkpoint's metadata value must be (a count, a positive number, a flag, ...),
for the readers that check each value by name before using it (``hf_config`` for a Hugging
Face config, ``gguf_reader`` for GGUF metadata)."""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Kind:
    what: str  # what a value must be, as the error says it
    ok: Callable[[Any], bool]
    nullable: bool = True  # null means "the default", as transformers reads it


def _int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# the largest float32: a package stores these constants as float32, where a larger one is inf
FLOAT32_MAX = 3.4028234663852886e38


def _number(v) -> bool:
    return (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
            and abs(v) <= FLOAT32_MAX)


def _token(v) -> bool:
    return _int(v) and v >= 0


COUNT = Kind("a positive integer", lambda v: _int(v) and v >= 1)
POSITIVE = Kind("a number above 0 and at most 3.4e38 (float32's largest)",
                lambda v: _number(v) and v > 0)
FLAG = Kind("true or false", lambda v: isinstance(v, bool))
TEXT = Kind("a string", lambda v: isinstance(v, str))
NAMES = Kind("a non-empty list of strings",
             lambda v: isinstance(v, list) and bool(v) and all(isinstance(x, str) for x in v))
MAPPING = Kind("a mapping of fields", lambda v: isinstance(v, dict))
TOKEN_IDS = Kind("a token id (an integer of 0 or more) or a list of them",
                 lambda v: _token(v) or (isinstance(v, list) and bool(v)
                                         and all(_token(x) for x in v)))


def required(kind: Kind) -> Kind:
    return Kind(kind.what, kind.ok, nullable=False)
