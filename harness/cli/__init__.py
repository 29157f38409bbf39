"""lockstep: differential testing and parity for LLM inference engines.

Each subcommand is a module of this package.

Each subcommand module exposes ``register(subparsers)``, which adds its parser and sets
``func`` (taking the parsed namespace, returning an exit status). User errors
(``LockstepError``) print one clear line and exit 2, never a traceback.
"""
from __future__ import annotations

import argparse
import importlib
import sys

from engines.errors import LockstepError

SUBCOMMANDS = ("run", "report", "claims", "engines", "bench", "fixtures", "convert", "explain", "repro")


def build_parser() -> argparse.ArgumentParser:
    from engines.registry import lockstep_version

    parser = argparse.ArgumentParser(prog="lockstep", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"lockstep {lockstep_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(f"harness.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name == f"harness.cli.{name}":
                continue  # that subcommand has not landed yet
            raise
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except LockstepError as err:
        print(f"lockstep: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
