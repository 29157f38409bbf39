"""``lockstep report EVIDENCE_DIR [--baseline DIR] [--catch-matrix PATH] [--bench JSON ...]
-o report.html``: render the parity report."""
from __future__ import annotations

import argparse
from pathlib import Path

from engines.errors import InputError, LockstepError
from engines.output_paths import check_output_file
from harness.cli.arguments import as_option, existing


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "report", help="render evidence into one self-contained HTML parity report",
        description="Render every evidence file in EVIDENCE_DIR into one HTML file that opens "
                    "offline. The run manifests in EVIDENCE_DIR/runs make an interrupted run "
                    "show as INCOMPLETE. With --baseline, what regressed against that "
                    "evidence is listed first.")
    parser.add_argument("evidence_dirs", metavar="EVIDENCE_DIR",
                        type=existing("EVIDENCE_DIR", "folder"), nargs="+",
                        help="folder(s) of evidence JSON files (from --evidence-dir or lockstep "
                             "run); the shards of a run made with --shard I/N, one folder each, "
                             "are checked to cover its plan exactly once")
    parser.add_argument("--baseline", metavar="DIR", type=existing("--baseline", "folder"),
                        default=None,
                        help="evidence folder to compare against (e.g. the last nightly)")
    parser.add_argument("-o", "--output", metavar="PATH", type=Path, default=Path("report.html"),
                        help="where to write the HTML (default: report.html; an existing file "
                             "is replaced only when it is a lockstep report, or with --force)")
    parser.add_argument("--force", action="store_true",
                        help="replace an -o file that is not a lockstep report")
    parser.add_argument("--title", default="lockstep parity report", help="report heading")
    parser.add_argument("--bench", metavar="JSON", type=Path, nargs="+", action="extend",
                        default=[], help="lockstep bench --json files to show as the speed "
                                         "section (a table each)")
    catch = parser.add_mutually_exclusive_group()
    catch.add_argument("--catch-matrix", metavar="PATH", type=Path, default=None,
                       help="planted-bug catch matrix JSON to render (default: "
                            "docs/catch_matrix.json of this checkout, when it exists)")
    catch.add_argument("--no-catch-matrix", action="store_true",
                       help="leave the planted-bug catch matrix out")
    parser.set_defaults(func=run)


def _catch_matrix(args: argparse.Namespace) -> Path | None:
    """The catch matrix file to render (its path: the report names where it came from)."""
    from reports.render import DEFAULT_CATCH_MATRIX

    if args.no_catch_matrix:
        return None
    if args.catch_matrix is not None:
        return args.catch_matrix  # given explicitly: it must be readable
    return DEFAULT_CATCH_MATRIX if DEFAULT_CATCH_MATRIX.exists() else None


def write_output(output: Path, html: str) -> None:
    """Write the report atomically (the path was checked before: ``check_output_file``); a
    write the machine refuses (a full disk) is one ``LockstepError`` naming ``-o``."""
    tmp = output.with_name(f".{output.name}.tmp")
    try:
        output.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(html, encoding="utf-8")
        tmp.replace(output)
    except OSError as exc:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass  # its folder is what failed
        raise LockstepError(f"cannot write the report ({exc.strerror or exc})", field="-o",
                            value=str(output),
                            remedy="pick a path in a writable folder with free space") from exc


def _an_evidence_folder(folder: Path | None, option: str) -> None:
    """A folder given where an evidence folder belongs that is something else lockstep knows
    is named as such: an evidence folder's ``runs/`` (its run manifests, no records) or a
    package (its files are not records for the user to delete)."""
    from engines.model_package.manifest import is_model_package
    from engines.package.schema import PACKAGE_FILE
    from harness.manifest import RUNS

    if folder is None:
        return
    if folder.resolve().name == RUNS and not (folder / RUNS).is_dir():
        raise InputError(f"{folder} holds the run manifests of an evidence folder, not its "
                         f"records", field=option, value=str(folder),
                         remedy=f"give {option} the evidence folder itself: {folder.parent}")
    what = (f"a package (it holds {PACKAGE_FILE})" if (folder / PACKAGE_FILE).is_file() else
            "an onnx-genai model package" if is_model_package(folder) else None)
    if what is not None:
        raise InputError(f"{folder} is {what}, not an evidence folder", field=option,
                         value=str(folder),
                         remedy=f"give {option} the folder lockstep run wrote its records to "
                                f"(--evidence-dir, default evidence/); to make one, run "
                                f"lockstep run --packages {folder}")


def run(args: argparse.Namespace) -> int:
    from harness.evidence import load_evidence_dir, load_evidence_files
    from harness.forensics import load_explanations
    from harness.manifest import read_manifests
    from harness.run_coverage import drop_duplicates, run_coverage
    from harness.shards import shard_coverage
    from reports import render_report
    from reports.render import MARKER

    check_output_file(args.output, "-o", marker=MARKER, force=args.force, example="report.html")
    _an_evidence_folder(args.baseline, "--baseline")
    seen: set[Path] = set()
    for folder in args.evidence_dirs:  # one folder twice would count each record twice
        _an_evidence_folder(folder, "EVIDENCE_DIR")
        if folder.resolve() in seen:
            raise InputError("EVIDENCE_DIR names one folder twice", field="EVIDENCE_DIR",
                             value=str(folder), remedy="name each evidence folder once")
        seen.add(folder.resolve())
    if args.baseline is not None and args.baseline.resolve() in seen:
        raise InputError("--baseline is one of the evidence folders: the evidence would be "
                         "compared with itself and nothing could regress",
                         field="--baseline", value=str(args.baseline),
                         remedy="give --baseline the evidence folder of an earlier run")

    found, manifests, explanations = [], [], {}
    for folder in args.evidence_dirs:
        planned_here = read_manifests(folder)
        # a run killed after its manifest and before its first record is an incomplete
        # run, not an empty folder
        found += load_evidence_files(folder, allow_empty=bool(planned_here))
        manifests += planned_here
        explanations.update(load_explanations(folder))
    manifests.sort(key=lambda m: m.started)
    records, duplicates = drop_duplicates([r for _, r in found], [p for p, _ in found])
    try:
        baseline = load_evidence_dir(args.baseline) if args.baseline is not None else None
    except LockstepError as err:
        raise (as_option(err, "--baseline") if err.field is None else err) from None

    html = render_report(records, baseline, title=args.title, manifests=manifests,
                         catch_matrix=_catch_matrix(args), explanations=explanations,
                         bench=args.bench, duplicates=duplicates)
    output: Path = args.output
    write_output(output, html)
    failing = sum(not r.ok for r in records)
    print(f"lockstep: report of {len(records)} record(s) ({failing} not ok) written to "
          f"{output.resolve()}")
    for dup in duplicates:
        print(f"lockstep: DUPLICATE record: {dup.describe()}")
    for cov in run_coverage(records, manifests, duplicates):
        if cov.incomplete or cov.mismatched:
            print(f"lockstep: run {cov.manifest.run_id} {cov.describe()}")
    for cov in shard_coverage(manifests):
        if not cov.complete:
            print(f"lockstep: sharded plan {cov.plan_digest} ({cov.count} shards, "
                  f"{cov.plan_cells} cells) is INCOMPLETE: {cov.describe()}")
    return 0
