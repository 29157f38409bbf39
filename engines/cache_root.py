"""Where lockstep keeps what it builds: ``$LOCKSTEP_CACHE``, else ``<repo>/.lockstep/fixtures``.

The built-in fixtures, checkpoint conversions, imported model packages and the builds engines
make for themselves (onnxruntime-genai's models, transformers' GGUF loads) all live under this
one root, so ``lockstep cache list`` sees them all and one variable moves them.
"""
from __future__ import annotations

import os
from pathlib import Path

from engines.errors import InputError

REPO_ROOT = Path(__file__).resolve().parents[1]
CACHE_ENV = "LOCKSTEP_CACHE"


def cache_root() -> Path:
    """``$LOCKSTEP_CACHE``, else ``<repo>/.lockstep/fixtures``. A variable naming a file, or
    a folder under a file, is an ``InputError`` naming the variable (a write there would
    fail later with the bare path)."""
    env = os.environ.get(CACHE_ENV)
    if not env:
        return REPO_ROOT / ".lockstep" / "fixtures"
    root = Path(env).expanduser()
    for above in (root, *root.parents):
        if above.exists():
            if not above.is_dir():
                raise InputError(f"{above} is a file, not a folder", field=CACHE_ENV,
                                 value=env, remedy=f"set {CACHE_ENV} to a folder (or unset "
                                                   f"it for .lockstep/fixtures)")
            break
    return root
