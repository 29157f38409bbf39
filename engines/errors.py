"""One error family for everything a user can get wrong.

Every error names the field, the bad value and the remedy, so the CLI can print it
without a traceback and a test can assert on each part.
"""
from __future__ import annotations

import re
from typing import Any


class LockstepError(Exception):
    """Base: a user-facing error with field, value and remedy."""

    def __init__(self, message: str, *, field: str | None = None, value: Any = None,
                 remedy: str | None = None, where: str | None = None):
        self.message = message
        self.field = field
        self.value = value
        self.remedy = remedy
        self.where = where
        super().__init__(self.render())

    def render(self) -> str:
        parts = []
        if self.where:
            parts.append(f"{self.where}: ")
        parts.append(self.message)
        if self.field is not None:
            parts.append(f" [field {self.field}")
            if self.value is not None:
                parts.append(f" = {self.value!r}")
            parts.append("]")
        if self.remedy:
            parts.append(f"; remedy: {self.remedy}")
        # one line, whatever a wrapped parser message (YAML's, with its caret) held
        return re.sub(r"\s*\n\s*", " ", "".join(parts))


class PackageError(LockstepError):
    """A package folder, its package.yaml or one of its ONNX components is malformed."""


class InputError(LockstepError):
    """A request is invalid for the package: bad token id, prompt too long, width too large."""


class ResidencyError(LockstepError):
    """A value lives where the operation cannot take it (host vs device, or another device)."""


class EngineUnavailable(LockstepError):
    """An engine's dependency is missing here; the message says which and how to get it."""


class UnknownEngine(LockstepError):
    """An engine name that no built-in or entry point provides."""


class ExecutionError(LockstepError):
    """A component could not be executed (unsupported op, shape not resolvable on the host)."""


class EngineDefinitionError(LockstepError):
    """An engine class, or its registration, cannot be trusted to name its own results: no
    ``name`` of its own, a name other than the one it is registered under, a name taken from
    a built-in engine, or an entry point that would replace a built-in."""


class EngineImportError(EngineDefinitionError):
    """An engine's module raised while being imported; carries that error's type and message."""

    def __init__(self, message: str, *, import_error: BaseException, **kwargs: Any):
        self.error_type = type(import_error).__name__
        self.error_message = str(import_error)
        super().__init__(message, **kwargs)


class NonFiniteLogits(InputError):
    """A logits row holds no finite maximum (all NaN): the engine computed no token. The
    runner gives the cell the verdict ``non-finite`` at that step."""
