"""lockstep: differential testing and parity for LLM inference engines.

lockstep runs several inference engines step for step over the same model packages and
checks that they agree with a recompute oracle: the same tokens, logits within the dtype's
tolerance, and on a GPU engine no value leaving the device but token ids, flat memory and
CUDA graphs that replay. Exit status 0: every cell passed; 1: a cell failed; 2: bad input;
130: interrupted.

Each subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``func`` (taking the parsed namespace, returning an exit status). User errors
(``LockstepError``) print one clear line and exit 2, never a traceback; Ctrl-C prints one
line and exits 130.
"""
from __future__ import annotations

import importlib
import sys
from pathlib import Path

from engines.cache_root import cache_root
from engines.errors import LockstepError
from engines.registry import lockstep_version
from harness.cli.arguments import as_option
from harness.cli.interrupt import Interrupted
from harness.cli.parser import LockstepParser

SUBCOMMANDS = ("run", "report", "claims", "engines", "bench", "bench_forward", "bench_judge", "fixtures", "convert", "import_genai", "import_package", "cache", "explain", "repro", "calibrate")


def build_parser() -> LockstepParser:
    parser = LockstepParser(prog="lockstep", description=__doc__.split("\n\nEach")[0])
    parser.add_argument("--version", action="version", version=f"lockstep {lockstep_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"harness.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = None
    try:
        args = parser.parse_args(argv)  # option values are checked here (arguments.py)
        return int(args.func(args) or 0)
    except KeyboardInterrupt as err:  # Ctrl-C: one line, the shell's status for SIGINT
        print(f"lockstep: {err if isinstance(err, Interrupted) else 'interrupted'}",
              file=sys.stderr)
        return 130
    except LockstepError as err:
        option = (getattr(args, "fields", None) or {}).get(err.field)
        print(f"lockstep: error: {err if option is None else as_option(err, option)}",
              file=sys.stderr)
        return 2
    except OSError as err:  # the machine said no (full disk, permissions): not a bug of ours
        where = f": {err.filename}" if err.filename else ""
        cache = _in_cache(err.filename)
        about = (f" [field LOCKSTEP_CACHE = {cache!r}]; remedy: set LOCKSTEP_CACHE to a "
                 f"writable folder with free space" if cache else
                 "; remedy: check that path, its permissions and the free space on its disk")
        print(f"lockstep: error: {err.strerror or err}{where}{about}", file=sys.stderr)
        return 2


def _in_cache(filename) -> str | None:
    """lockstep's cache folder, where the path that failed lies in it (the variable
    LOCKSTEP_CACHE, or its default, is then what the user can change)."""
    try:
        root, path = cache_root().resolve(), Path(filename).resolve()
    except (LockstepError, OSError, TypeError, ValueError):
        return None
    return str(root) if root == path or root in path.parents else None


if __name__ == "__main__":
    sys.exit(main())
