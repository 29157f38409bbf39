"""``lockstep engines``: every engine lockstep knows, built in and by plugin.

For each (and the server lockstep starts, ``http:llama-server``): where it comes from
(built in, or the entry point of which distribution), its version (the distribution's;
lockstep's for built-ins), its declared capabilities (``engines.engine.Capabilities``), and
whether it can run here and, if not, why. A plugin that fails to import, or whose class
lockstep refuses, is listed with its error.

Exit status: 0 when every engine loads (whether or not it can run here), 1 when some engine
cannot be loaded (its error is in the listing), 2 when two engines claim one name (an entry
point named like a built-in, or two distributions declaring the same name).
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from engines.registry import EngineListing, describe_engines, lockstep_version

SERVER = "http:llama-server"


def _capabilities(cls) -> tuple[dict[str, Any] | None, str | None]:
    try:
        return cls.capabilities().to_dict(), None
    except Exception as exc:
        return None, f"capabilities() failed: {type(exc).__name__}: {exc}"


def _availability(cls) -> tuple[bool, str]:
    try:
        avail = cls.availability()
    except Exception as exc:  # a plugin's availability that raises is reported, not fatal
        return False, f"availability() failed: {type(exc).__name__}: {exc}"
    return bool(avail.ok), avail.reason


def _server_listing() -> EngineListing:
    """``http:llama-server``, the one server spelling whose server lockstep starts (the
    others name a server of the user's by its URL): listed so that a bad setting of it
    (``LOCKSTEP_LLAMA_SERVER``, the HTTP variables) shows as the reason it cannot run."""
    from engines.backends.http.spelling import engine_class

    cls = engine_class(SERVER, checked=False)
    return EngineListing(SERVER, f"{cls.__module__}:HttpEngine", "built-in", "lockstep",
                         lockstep_version(), cls)


def engine_rows() -> list[dict[str, Any]]:
    """One dict per engine (the ``--json`` form): name, source, distribution, version,
    target, description, capabilities, available, reason, problem, clash."""
    rows = []
    for listing in [*describe_engines(), _server_listing()]:
        row: dict[str, Any] = {
            "name": listing.name, "source": listing.source,
            "distribution": listing.distribution, "version": listing.version,
            "target": listing.target, "description": "", "capabilities": None,
            "available": False, "reason": "", "problem": listing.problem,
            "clash": listing.clash,
        }
        cls = listing.engine_class
        if cls is not None:
            row["description"] = cls.description
            row["capabilities"], problem = _capabilities(cls)
            if problem and not row["problem"]:
                row["problem"] = problem
            row["available"], row["reason"] = _availability(cls)
        else:
            row["reason"] = "cannot be loaded"
        rows.append(row)
    return rows


def _source_text(row: dict[str, Any]) -> str:
    if row["source"] == "built-in":
        return "built-in"
    return f"entry point of {row['distribution']}" if row["distribution"] else "entry point"


def _caps_text(caps: dict[str, Any] | None) -> str:
    if caps is None:
        return "-"
    flags = [k for k, v in caps.items() if v is True]
    return f"{caps['residency']}: {', '.join(flags) if flags else '-'}"


def _here_text(row: dict[str, Any]) -> str:
    if row["problem"]:
        return f"{'NAME CLASH' if row['clash'] else 'BROKEN'}: {row['problem']}"
    if row["available"]:
        return f"runs here: yes ({row['reason']})" if row["reason"] else "runs here: yes"
    return f"runs here: no, {row['reason']}"


def render(rows: list[dict[str, Any]]) -> str:
    """One line per engine (name, source, version, residency and capabilities), then,
    indented, whether it runs here and why not (or what is wrong with it)."""
    cols = [(r["name"], _source_text(r), r["version"] or "?", _caps_text(r["capabilities"]))
            for r in rows]
    head = ("engine", "source", "version", "residency: capabilities")
    widths = [max(len(c[i]) for c in cols + [head]) for i in range(3)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(head[:3], widths)) + "  " + head[3]]
    for row, c in zip(rows, cols):
        lines.append("  ".join(v.ljust(w) for v, w in zip(c[:3], widths)) + "  " + c[3])
        lines.append("    " + _here_text(row))
    return "\n".join(lines)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engines", help="list every engine (built in and plugins): source, "
                                       "version, capabilities, and whether it runs here")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    rows = engine_rows()
    if args.json:
        print(json.dumps(rows, indent=1))
    else:
        print(render(rows))
    clashes = [r for r in rows if r["clash"]]
    broken = [r for r in rows if r["problem"] and not r["clash"]]
    for row in clashes + broken:
        kind = "name clash" if row["clash"] else "cannot load"
        print(f"lockstep: error: {kind}: {row['name']!r}: {row['problem']}", file=sys.stderr)
    if clashes:
        return 2
    return 1 if broken else 0
