"""``docs/evidence/`` keeps what cannot be regenerated (docs/GPU.md, the evidence layout):
each run's README, bench JSON, records and logs; no report (its records rendered), no archive
member that repeats a file beside it, at most 5 MB on disk, and every run with records says
how to render them."""
from __future__ import annotations

import hashlib
import os
import re
import tarfile
from pathlib import Path

import pytest

EVIDENCE = Path(__file__).resolve().parents[1] / "docs" / "evidence"
RUNS = sorted(p for p in EVIDENCE.iterdir() if p.is_dir())
ARCHIVES = (".tar.xz", ".tar.gz", ".tgz")
LIMIT = 5 * 2 ** 20  # bytes on disk, as du counts them
RECORD = re.compile(r"\d{8}T\d{6}Z-[0-9a-f]{8}__.+\.json$")  # an evidence record's file name


def test_no_report_is_kept():
    assert not sorted(str(p.relative_to(EVIDENCE)) for p in EVIDENCE.rglob("*")
                      if p.suffix == ".html" or p.name.endswith("report.png"))


def test_the_evidence_fits_in_five_megabytes():
    paths = [EVIDENCE, *EVIDENCE.rglob("*")]
    on_disk = sum(os.lstat(p).st_blocks * 512 for p in paths)
    assert RUNS and on_disk <= LIMIT, f"{on_disk / 2 ** 20:.2f} MiB (du -sh docs/evidence)"


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_a_run_with_records_says_how_to_render_them(run):
    records = [name for archive in run.rglob("*") if archive.name.endswith(ARCHIVES)
               for name in _members(archive) if RECORD.search(name)]
    section = (run / "README.md").read_text().partition("## Regenerating the reports")[2]
    if records:
        assert "lockstep report" in section or "harness.cli report" in section


@pytest.mark.parametrize("run", RUNS, ids=lambda p: p.name)
def test_no_archive_repeats_a_file_beside_it(run):
    beside = {hashlib.sha256(p.read_bytes()).hexdigest(): p for p in run.rglob("*")
              if p.is_file() and not p.name.endswith(ARCHIVES)}
    repeated = [f"{archive.name}:{name} = {beside[digest].relative_to(run)}"
                for archive in run.rglob("*") if archive.name.endswith(ARCHIVES)
                for name, digest in _members(archive).items() if digest in beside]
    assert not repeated


def _members(archive: Path) -> dict[str, str]:
    """Each file member's name and sha256."""
    with tarfile.open(archive) as tar:
        return {m.name: hashlib.sha256(tar.extractfile(m).read()).hexdigest()
                for m in tar.getmembers() if m.isfile()}
