"""``lockstep fixtures``: build the built-in fixture packages into the cache, or list them."""
from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from engines.cache_root import cache_root
from engines.shipped_checkpoint import INSTALL, smollm2_path
from harness.cli.tables import print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fixtures", help="build or list the built-in fixture packages")
    actions = p.add_subparsers(dest="fixtures_command", metavar="ACTION", required=True)
    b = actions.add_parser("build", help="build fixtures into the cache (only missing ones "
                                         "unless --force)")
    b.add_argument("names", nargs="*", metavar="NAME",
                   help="fixture names (default: every built-in fixture)")
    b.add_argument("--force", action="store_true", help="rebuild even when already cached")
    b.set_defaults(func=build, fields={"name": "NAME"})
    ls = actions.add_parser("list", help="list the built-in fixtures and their cache state")
    ls.set_defaults(func=list_)


def short_hash(digest: str) -> str:
    return digest.split(":", 1)[-1][:12]


def build(args: argparse.Namespace) -> int:
    from engines.package import package_content_hash
    from harness.catalog import builtin
    from harness.convert.package_writer import read_build_info

    names = args.names or list(builtin.FIXTURES)
    for name in names:  # every name is checked before anything is built
        builtin.get_fixture(name)
    table = Table(title="fixtures built")
    table.add_column("name", no_wrap=True)
    for column in ("seed", "min margin", "hash"):
        table.add_column(column, no_wrap=True)
    table.add_column("folder", overflow="fold")
    for name in names:
        folder = builtin.build(name, force=args.force)
        info = read_build_info(folder) or {}
        table.add_row(name, str(info.get("seed")),
                      str(info.get("conditioning", {}).get("min_margin")),
                      short_hash(package_content_hash(folder)), str(folder))
    print_table(Console(), table)
    return 0


def list_(args: argparse.Namespace) -> int:
    from harness.catalog import builtin

    table = Table(title="built-in fixtures", caption=f"cache: {cache_root()}")
    for column in ("name", "seed", "built", "min margin", "hash"):
        table.add_column(column, no_wrap=True)
    table.add_column("what")
    for s in builtin.list_fixtures():
        seed = str(s.default_seed) if s.seed in (None, s.default_seed) else \
            f"{s.default_seed}->{s.seed}"
        built = "yes" if s.current else ("stale" if s.built else "no")
        table.add_row(s.name, seed, built,
                      "" if s.min_margin is None else f"{s.min_margin:g}",
                      short_hash(s.content_hash or ""), s.summary)
    for name, built, what in real_checkpoint_rows():
        table.add_row(name, "", built, "", "", what)
    print_table(Console(), table)
    return 0


def real_checkpoint_rows() -> list[tuple[str, str, str]]:
    """``smollm2`` and ``smollm2-selfspec`` (the names ``lockstep run --packages`` takes):
    whether the checkpoint is installed and converted by the converter checked out now."""
    what = {"smollm2": "SmolLM2-135M-Instruct (real checkpoint, converted from GGUF)",
            "smollm2-selfspec": "the same with a 24-block layer-skip drafter (speculative)"}
    path = smollm2_path()
    if path is None:
        return [(name, "not installed", f"{text}; {INSTALL}") for name, text in what.items()]
    try:
        from engines.package.hashing import checkpoint_hash
        from harness.convert import cache
        from harness.convert.conversion import _folder_name, _key
        from harness.convert.smollm2 import SELFSPEC_DRAFT_LAYERS
        from harness.convert.writer import ConvertOptions
    except ImportError as exc:  # the converter's libraries: the 'real' extra
        return [(name, "no converter", f"{text}; make real ({exc.name} missing)")
                for name, text in what.items()]
    source_hash = checkpoint_hash(path)
    rows = []
    for name, draft in (("smollm2", None), ("smollm2-selfspec", SELFSPEC_DRAFT_LAYERS)):
        opts = ConvertOptions(draft_layers=draft).checked()
        key = _key(source_hash, opts, None)
        current = cache.is_current(cache.converted_root() / _folder_name(path, opts, key), key)
        hint = "" if current else "; lockstep convert smollm2" + \
            ("" if draft is None else f" --draft-layers {draft}")
        rows.append((name, "converted" if current else "no", what[name] + hint))
    return rows
