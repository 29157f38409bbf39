"""``lockstep cache list`` / ``lockstep cache prune``: what lockstep keeps on disk, and
removing superseded conversions and the staging folders of killed builds."""
from __future__ import annotations

import argparse

from rich.console import Console
from rich.table import Table

from harness.cli.arguments import integer, number
from harness.cli.tables import print_table


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("cache", help="list or prune the fixture and conversion caches",
                       description="Fixture builds, checkpoint conversions (each converter "
                                   "version converts again, ~0.5 GB each), onnxruntime-genai's "
                                   "builds and their wrapped packages (ort-genai), transformers' "
                                   "GGUF loads (hf) and staging folders left by killed builds. "
                                   "The caches live under $LOCKSTEP_CACHE (default: "
                                   ".lockstep/fixtures); prune removes conversions and stale "
                                   "staging folders.")
    actions = p.add_subparsers(dest="cache_command", metavar="ACTION", required=True)
    ls = actions.add_parser("list", help="every cached package and staging folder, its size "
                                         "and age")
    ls.set_defaults(func=list_)
    pr = actions.add_parser("prune", help="remove conversions by age, by total size or beyond "
                                          "the newest N of each; always removes stale staging "
                                          "folders")
    pr.add_argument("--older-than", type=number("--older-than", minimum=0), metavar="DAYS",
                    default=None,
                    help="remove conversions written more than DAYS days ago")
    pr.add_argument("--max-size", metavar="SIZE", default=None,
                    help="remove the oldest conversions until the rest fit in SIZE (500M, 2G)")
    pr.add_argument("--keep", type=integer("--keep", minimum=0), metavar="N", default=None,
                    help="keep the newest N conversions of each checkpoint and options (the "
                         "folder name without its key), remove older ones")
    pr.add_argument("--dry-run", action="store_true",
                    help="print what would be removed and remove nothing")
    pr.set_defaults(func=prune)


def _table(entries, title: str) -> Table:
    from harness.cache_admin import human_age, human_size

    table = Table(title=title)
    for column in ("kind", "size", "age", "folder"):
        table.add_column(column, no_wrap=column != "folder", overflow="fold")
    for e in entries:
        kind = e.kind + (" (stale)" if e.stale else "")
        table.add_row(kind, human_size(e.size), human_age(e.age_s), str(e.path))
    return table


def list_(args: argparse.Namespace) -> int:
    from harness.cache_admin import KINDS, cache_entries, human_size

    entries = cache_entries()
    console = Console()
    print_table(console, _table(entries, "lockstep caches"))
    by_kind = {k: sum(e.size for e in entries if e.kind == k) for k in KINDS}
    console.print(", ".join(f"{k}s {human_size(n)}" for k, n in by_kind.items()),
                  soft_wrap=True)
    return 0


def prune(args: argparse.Namespace) -> int:
    from harness.cache_admin import cache_entries, human_size, parse_size, remove, select_prune

    max_bytes = None if args.max_size is None else parse_size(args.max_size)
    older = None if args.older_than is None else args.older_than * 86400
    chosen = select_prune(cache_entries(), older_than_s=older, max_bytes=max_bytes,
                          keep=args.keep)
    console = Console()
    if not chosen:
        console.print("nothing to prune")
        return 0
    print_table(console, _table(chosen, "would remove" if args.dry_run else "removing"))
    total = sum(e.size for e in chosen)
    if args.dry_run:
        console.print(f"dry run: {len(chosen)} folder(s), {human_size(total)} would be freed")
        return 0
    freed = remove(chosen)
    console.print(f"removed {len(chosen)} folder(s), {human_size(freed)} freed")
    return 0
