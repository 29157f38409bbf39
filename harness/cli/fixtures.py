"""``lockstep fixtures``: build the built-in fixture packages into the cache, or list them."""
from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fixtures", help="build or list the built-in fixture packages")
    actions = p.add_subparsers(dest="fixtures_command", required=True)
    b = actions.add_parser("build", help="build fixtures into the cache (only missing ones "
                                         "unless --force)")
    b.add_argument("names", nargs="*", metavar="NAME",
                   help="fixture names (default: every built-in fixture)")
    b.add_argument("--force", action="store_true", help="rebuild even when already cached")
    b.set_defaults(func=build)
    ls = actions.add_parser("list", help="list the built-in fixtures and their cache state")
    ls.set_defaults(func=list_)


def short_hash(digest: str) -> str:
    return digest.split(":", 1)[-1][:12]


def build(args: argparse.Namespace) -> int:
    from fixtures import catalog
    from fixtures.package_writer import content_hash, read_build_info

    names = args.names or list(catalog.FIXTURES)
    for name in names:  # every name is checked before anything is built
        catalog.get_fixture(name)
    table = Table(title="fixtures built")
    table.add_column("name", no_wrap=True)
    for column in ("seed", "min margin", "hash"):
        table.add_column(column, no_wrap=True)
    table.add_column("folder", overflow="fold")
    for name in names:
        folder = catalog.build(name, force=args.force)
        info = read_build_info(folder) or {}
        table.add_row(name, str(info.get("seed")),
                      str(info.get("conditioning", {}).get("min_margin")),
                      short_hash(content_hash(folder)), str(folder))
    Console().print(table)
    return 0


def list_(args: argparse.Namespace) -> int:
    from fixtures import catalog
    from fixtures.cache import cache_root

    table = Table(title="built-in fixtures", caption=f"cache: {cache_root()}")
    for column in ("name", "seed", "built", "min margin", "hash"):
        table.add_column(column, no_wrap=True)
    table.add_column("what")
    for s in catalog.list_fixtures():
        seed = str(s.default_seed) if s.seed in (None, s.default_seed) else \
            f"{s.default_seed}->{s.seed}"
        built = "yes" if s.current else ("stale" if s.built else "no")
        table.add_row(s.name, seed, built,
                      "" if s.min_margin is None else f"{s.min_margin:g}",
                      short_hash(s.content_hash or ""), s.summary)
    Console().print(table)
    return 0
