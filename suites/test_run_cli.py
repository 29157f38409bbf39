"""``lockstep run`` when cells fail (claim 1c): the matrix finishes, every cell has a
record, the exit status says what happened, and a killed run is visibly incomplete."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engines.engine import Availability
from harness.cli import main
from harness.evidence import load_evidence_dir, read_evidence
from harness.manifest import read_manifests
from suites.planted.engines import Planted

pytestmark = pytest.mark.claim("token_identity")
ROOT = Path(__file__).resolve().parents[1]


class NeverHere(Planted):
    """An engine whose dependency is missing on this machine."""
    name = "never-here"

    @classmethod
    def availability(cls):
        return Availability(False, "needs the imaginary libfoo; pip install foo")


class Stalls(Planted):
    """Correct, but stalls for a long time at step 3 of its second package (to be killed)."""
    name = "stalls"

    def corrupt(self, component, feeds, out, phase):
        if self.package.spec.name == "tiny_llama" and self.step == 3:
            time.sleep(120)
        return out


class NoName(Planted):
    """Forgets its own name: would otherwise write its results as its parent's."""



@pytest.fixture(autouse=True)
def wide_console(monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")  # rich wraps the tables to the terminal's width


def _run(args, capsys):
    status = main(["run", *args])
    out = capsys.readouterr()
    return status, out.out + out.err


def test_a_crashing_engine_finishes_the_matrix_records_the_error_and_exits_1(tmp_path, capsys):
    ev = tmp_path / "ev"
    status, out = _run(["--engines", "native-host,suites.planted.engines:RaiseMidDecode",
                        "--packages", "tiny_llama,lookup_chained", "--max-new-tokens", "8",
                        "--evidence-dir", str(ev)], capsys)
    assert status == 1
    assert "lockstep parity" in out and "planted-raise-mid-decode" in out  # the table
    assert "RuntimeError" in out and "step 3" in out
    records = load_evidence_dir(ev)
    manifests = read_manifests(ev)
    assert len(manifests) == 1 and manifests[0].complete
    assert len(records) == len(manifests[0].planned) == 2 * (3 + 3)
    errors = [r for r in records if r.status == "error"]
    assert len(errors) == 6 and all(r.engine == "planted-raise-mid-decode" for r in errors)
    assert all(r.error.stage == "decode" and r.error.step == 3 and r.error.type == "RuntimeError"
               and r.error.traceback for r in errors)
    assert all(not r.ok for r in errors)
    assert all(r.status == "identical" for r in records if r.engine == "native-host")


def test_a_constructor_failure_is_an_error_record_per_cell(tmp_path, capsys):
    status, out = _run(["--engines", "suites.planted.engines:ConstructorFails,native-host",
                        "--packages", "lookup_chained", "--max-new-tokens", "4",
                        "--evidence-dir", str(tmp_path)], capsys)
    assert status == 1 and "OSError" in out
    records = load_evidence_dir(tmp_path)
    bad = [r for r in records if r.engine == "planted-constructor-fails"]
    assert len(bad) == 3 and all(r.error.stage == "constructor" for r in bad)
    assert all(r.reference is not None for r in bad)  # the oracle still ran for the prompt


@pytest.mark.claim("readback_budget")
@pytest.mark.parametrize("engine", ["SimulatedExtraReadback", "SimulatedDeviceStaging"])
def test_no_evidence_still_fails_a_budget_breach(engine, capsys):
    status, out = _run(["--engines", f"suites.planted.engines:{engine}", "--packages",
                        "tiny_llama", "--max-new-tokens", "4", "--no-evidence"], capsys)
    assert status == 1 and "budget" in out


def test_no_evidence_passes_an_honest_device_engine(capsys):
    status, _ = _run(["--engines", "suites.planted.engines:SimulatedDevice", "--packages",
                      "tiny_llama", "--max-new-tokens", "4", "--no-evidence"], capsys)
    assert status == 0


def test_an_engine_unavailable_here_is_left_out_shown_in_one_line_and_fails_only_under_strict(
        tmp_path, capsys):
    args = ["--engines", "native-host,suites.test_run_cli:NeverHere", "--packages",
            "lookup_chained", "--max-new-tokens", "4", "--evidence-dir", str(tmp_path)]
    status, out = _run(args, capsys)
    assert status == 0
    (line,) = [ln for ln in out.splitlines() if ln.startswith("never-here:")]
    assert line == ("never-here: 3 cell(s) on 1 package(s) not run: not available here: needs "
                    "the imaginary libfoo; pip install foo (asked for by name, and it ran no "
                    "cell)")
    table = out.split("lockstep parity")[1].split("never-here:")[0]
    assert "never-here" not in table  # no column of its own
    assert {r.engine for r in load_evidence_dir(tmp_path)} == {"native-host"}
    (manifest,) = read_manifests(tmp_path)
    assert manifest.complete and len(manifest.planned) == 3
    assert [(lo.engine, lo.package, lo.mode, lo.cells, lo.decided_by)
            for lo in manifest.left_out] == [("never-here", "lookup_chained", "greedy", 3,
                                              "machine")]
    assert "libfoo" in manifest.left_out[0].reason
    assert "lockstep: error" not in out
    status, out = _run(args[:-2] + ["--evidence-dir", str(tmp_path / "strict"), "--strict"],
                       capsys)
    assert status == 1
    assert out.splitlines()[-1] == (  # why it failed, on one line (the last, on stderr)
        "lockstep: error: --strict: never-here: 3 cell(s) on 1 package(s) not run: not "
        "available here: needs the imaginary libfoo; pip install foo; remedy: make the engine "
        "runnable here, or drop --strict to report it without failing the run")


class LookupOnly(Planted):
    """Declares it loads lookup_chained and nothing else."""
    name = "lookup-only"

    @classmethod
    def supports(cls, package):
        if package.spec.name != "lookup_chained":
            return Availability(False, "loads lookup tables only")
        return Availability(True)


def test_an_engine_named_explicitly_that_can_run_nothing_is_still_visible(tmp_path, capsys):
    args = ["--engines", "native-host,suites.test_run_cli:LookupOnly", "--packages",
            "tiny_llama,tied_llama", "--max-new-tokens", "4", "--max-prompts", "1"]
    status, out = _run(args + ["--evidence-dir", str(tmp_path)], capsys)
    assert status == 0
    assert ("lookup-only: 2 cell(s) on 2 package(s) not run: loads lookup tables only (asked "
            "for by name, and it ran no cell)") in out
    (manifest,) = read_manifests(tmp_path)
    assert [c.engine for c in manifest.planned] == ["native-host"] * 2
    assert {(lo.engine, lo.package, lo.decided_by) for lo in manifest.left_out} == \
        {("lookup-only", "tiny_llama", "declaration"), ("lookup-only", "tied_llama", "declaration")}
    assert _run(args + ["--no-evidence", "--strict"], capsys)[0] == 1
    # where it runs some cells, what its declaration leaves out is said, and does not fail
    # --strict: it was never this engine's to run
    args[3] = "tiny_llama,lookup_chained"
    status, out = _run(args + ["--no-evidence", "--strict"], capsys)
    assert status == 0 and "lockstep: error" not in out
    assert "lookup-only: 1 cell(s) on 1 package(s) not run: loads lookup tables only\n" in out


def test_an_engine_without_its_own_name_is_refused_before_anything_runs(tmp_path, capsys):
    status, out = _run(["--engines", "suites.test_run_cli:NoName", "--packages",
                        "lookup_chained", "--evidence-dir", str(tmp_path)], capsys)
    assert status == 2 and "name" in out and "NoName" in out
    assert not list(tmp_path.glob("*.json"))


def test_a_run_killed_midway_is_incomplete(tmp_path):
    """SIGKILL after the first records: the manifest stays incomplete, the report says so."""
    ev = tmp_path / "ev"
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(
        [sys.executable, "-m", "harness.cli", "run", "--engines", "suites.test_run_cli:Stalls",
         "--packages", "lookup_chained,tiny_llama", "--max-new-tokens", "6",
         "--evidence-dir", str(ev)], cwd=ROOT, env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and len(list(ev.glob("*.json"))) < 3:
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    manifests = read_manifests(ev)
    assert len(manifests) == 1 and not manifests[0].complete
    recorded = {(r.package.name, r.engine, r.mode.label, r.prompt.name)
                for r in load_evidence_dir(ev)}
    planned = {c.key for c in manifests[0].planned}
    assert len(planned) == 6 and 3 <= len(recorded) < len(planned) and recorded < planned
    from reports.render import render_report

    html = render_report(load_evidence_dir(ev), manifests=manifests)
    assert "INCOMPLETE" in html


def test_every_record_of_a_mixed_run_reads_back_intact(tmp_path, capsys):
    """Every kind of cell (identical, defect, non-finite, drift, error) round-trips its
    record: judgement findings with both top-5 lists, the logits audit, the error."""
    engines = ",".join(f"suites.planted.engines:{e}" for e in (
        "Control", "TokenSwap", "NanRow", "LogitsFloat16", "RaiseMidDecode"))
    status, _ = _run(["--engines", engines, "--packages", "tiny_llama", "--max-new-tokens",
                      "6", "--max-prompts", "1", "--evidence-dir", str(tmp_path)], capsys)
    assert status == 1
    by = {}
    for path in tmp_path.glob("*.json"):
        record = read_evidence(path)
        assert json.loads(path.read_text())["ok"] == record.ok
        by[record.engine] = record
    assert by["planted-control"].status == "identical" and by["planted-control"].ok
    swap = by["planted-token-swap"]
    assert swap.status == "defect" and swap.divergence.step == 3
    finding = swap.judgement.findings[0]
    assert len(finding.oracle_top) == 5 and len(finding.engine_top) == 5
    assert swap.judgement.steps_judged == 6
    assert by["planted-nan-row"].status == "non-finite"
    drift = by["planted-logits-float16"]
    assert drift.status == "drift" and drift.logits_audit.out_of_tolerance_steps == 6
    assert drift.verdicts["logits_within_tolerance"] == "fail"
    assert by["planted-raise-mid-decode"].error.step == 3


def test_narrow_tables_cut_no_header_and_no_engine_name(capsys, monkeypatch):
    """rich shortened columns to fit: nine engines in 120 columns read ``onnx-refe…``. At 80
    columns every header and name is printed whole (the table is wider instead)."""
    monkeypatch.setenv("COLUMNS", "80")
    names = ["onnx-reference", "native-host", "planted-fused-attention-extra-slot",
             "planted-position-off-by-one", "planted-control"]
    engines = ["onnx-reference", "native-host"] + [
        f"suites.planted.engines:{c}" for c in ("FusedAttentionExtraSlot", "PositionOffByOne",
                                                "Control")]
    status, out = _run(["--engines", ",".join(engines), "--packages", "tiny_llama_static",
                        "--max-prompts", "1", "--max-new-tokens", "6", "--no-evidence"], capsys)
    assert status == 1
    assert "…" not in out
    header = next(line for line in out.splitlines() if "package" in line and "┃" in line)
    assert [h.strip() for h in header.split("┃")[2:-1]] == names
    details = out[out.index("cells that are not identical"):]
    assert "planted-fused-attention-extra-slot" in details
    status = main(["bench", "--engines", ",".join(engines[1:3]), "--packages",
                   "tiny_llama_static", "--repeats", "1", "--warmup", "0",
                   "--max-new-tokens", "2"])
    out = capsys.readouterr().out
    assert "…" not in out and "planted-fused-attention-extra-slot" in out
