"""``lockstep report EVIDENCE_DIR [--baseline DIR] -o report.html``: render the parity report."""
from __future__ import annotations

import argparse
from pathlib import Path


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "report", help="render evidence into one self-contained HTML parity report",
        description="Render every evidence file in EVIDENCE_DIR into one HTML file that opens "
                    "offline. With --baseline, what regressed against that evidence is listed "
                    "first.")
    parser.add_argument("evidence_dir", metavar="EVIDENCE_DIR", type=Path,
                        help="folder of evidence JSON files (from --evidence-dir or lockstep run)")
    parser.add_argument("--baseline", metavar="DIR", type=Path, default=None,
                        help="evidence folder to compare against (e.g. the last nightly)")
    parser.add_argument("-o", "--output", metavar="PATH", type=Path, default=Path("report.html"),
                        help="where to write the HTML (default: report.html)")
    parser.add_argument("--title", default="lockstep parity report", help="report heading")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from harness.evidence import load_evidence_dir
    from reports import render_report

    records = load_evidence_dir(args.evidence_dir)
    baseline = load_evidence_dir(args.baseline) if args.baseline is not None else None
    html = render_report(records, baseline, title=args.title)
    output: Path = args.output
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(f".{output.name}.tmp")
    tmp.write_text(html, encoding="utf-8")
    tmp.replace(output)
    failing = sum(not r.ok for r in records)
    print(f"lockstep: report of {len(records)} record(s) ({failing} not ok) written to "
          f"{output.resolve()}")
    return 0
