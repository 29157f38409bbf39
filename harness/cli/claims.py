"""``lockstep claims``: every claim lockstep asserts, and the tests that cover each.

The tests are found by reading the suites' source for ``pytest.mark.claim("...")`` markers
(on a test function, a class, or a module's ``pytestmark``), so listing them needs no
collection run and imports nothing from the suites.
"""
from __future__ import annotations

import argparse
import ast
import json
from collections import defaultdict
from pathlib import Path

from rich.console import Console
from rich.table import Table

from harness.cli.tables import print_table

SUITES = Path(__file__).resolve().parents[2] / "suites"


def _claim_ids(node: ast.AST) -> list[str]:
    """Claim ids named by ``pytest.mark.claim("a", ...)`` calls anywhere inside ``node``."""
    found = []
    for call in ast.walk(node):
        if (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr == "claim" and isinstance(call.func.value, ast.Attribute)
                and call.func.value.attr == "mark"):
            found += [a.value for a in call.args if isinstance(a, ast.Constant)]
    return found


def covering_tests(root: Path = SUITES) -> dict[str, list[str]]:
    """claim id -> ``file::test`` names that carry its marker (module marks cover every test
    of the module)."""
    out: dict[str, list[str]] = defaultdict(list)
    for path in sorted(root.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        rel = path.relative_to(root.parent).as_posix()
        module_ids = []
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                    isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
                module_ids += _claim_ids(node.value)
        for node in tree.body:
            tests = []
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test"):
                tests = [(node.name, _claim_ids(ast.Module(node.decorator_list, [])))]
            elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
                own = _claim_ids(ast.Module(node.decorator_list, []))
                tests = [(f"{node.name}::{f.name}",
                          own + _claim_ids(ast.Module(f.decorator_list, [])))
                         for f in node.body if isinstance(f, ast.FunctionDef)
                         and f.name.startswith("test")]
            for name, ids in tests:
                for claim_id in dict.fromkeys(module_ids + ids):
                    out[claim_id].append(f"{rel}::{name}")
    return dict(out)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("claims", help="list the claims lockstep asserts and the tests that "
                                      "cover each")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.add_argument("--tests", action="store_true", help="list every covering test by name")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.claims import CLAIMS

    tests = covering_tests() if SUITES.is_dir() else {}
    if args.json:
        print(json.dumps([{"id": c.id, "statement": c.statement, "unit": c.unit,
                           "tests": tests.get(c.id, [])} for c in CLAIMS.values()], indent=1))
        return 0
    table = Table(title="claims lockstep asserts (harness/claims.py, docs/CLAIMS.md)")
    for col in ("id", "statement", "unit", "tests"):
        table.add_column(col)
    for c in CLAIMS.values():
        covered = tests.get(c.id, [])
        shown = "\n".join(covered) if args.tests else f"{len(covered)}"
        table.add_row(c.id, c.statement, c.unit, shown if covered else "[red]none[/]")
    print_table(Console(), table)
    return 0
