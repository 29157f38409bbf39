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
    """``$LOCKSTEP_CACHE``, else ``<repo>/.lockstep/fixtures``. A variable naming a file, a
    folder under a file or a link to nothing is an ``InputError`` naming the variable (a
    write there would fail later with the bare path, a listing would show an empty cache)."""
    env = os.environ.get(CACHE_ENV)
    if not env:
        return REPO_ROOT / ".lockstep" / "fixtures"
    root = Path(env).expanduser()
    for above in (root, *root.parents):
        if above.is_symlink() and not above.exists():  # its folder is gone (a disk not there)
            raise InputError(f"{above} is a link to {os.readlink(above)}, which does not "
                             f"exist", field=CACHE_ENV, value=env,
                             remedy=f"create the folder it points to, or set {CACHE_ENV} to "
                                    f"another folder")
        if above.exists():
            if not above.is_dir():
                raise InputError(f"{above} is a file, not a folder", field=CACHE_ENV,
                                 value=env, remedy=f"set {CACHE_ENV} to a folder (or unset "
                                                   f"it for .lockstep/fixtures)")
            break
    return root
