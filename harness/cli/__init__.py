"""lockstep: differential testing and parity for LLM inference engines.

lockstep runs several inference engines step for step over the same model packages and
checks that they agree with a recompute oracle: the same tokens, logits within the dtype's
tolerance, and on a GPU engine no value leaving the device but token ids, flat memory and
CUDA graphs that replay. Exit status 0: every cell passed; 1: a cell failed; 2: bad input.

Each subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``func`` (taking the parsed namespace, returning an exit status). User errors
(``LockstepError``) print one clear line and exit 2, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from engines.errors import LockstepError

SUBCOMMANDS = ("run", "report", "claims", "engines", "bench", "bench_forward", "bench_judge", "fixtures", "convert", "import_genai", "cache", "explain", "repro", "calibrate")


def build_parser() -> argparse.ArgumentParser:
    from engines.registry import lockstep_version

    parser = argparse.ArgumentParser(prog="lockstep", description=__doc__.split("\n\nEach")[0])
    parser.add_argument("--version", action="version", version=f"lockstep {lockstep_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        importlib.import_module(f"harness.cli.{name}").register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LockstepError as err:
        print(f"lockstep: error: {err}", file=sys.stderr)
        return 2
    except OSError as err:  # the machine said no (full disk, permissions): not a bug of ours
        where = f": {err.filename}" if err.filename else ""
        print(f"lockstep: error: {err.strerror or err}{where}; remedy: check that path, its "
              f"permissions and the free space on its disk", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
