"""The matrix across machines: ``lockstep run --shard I/N`` runs a deterministic share of the
plan, and ``lockstep report`` over the N folders checks the shards cover it exactly once."""
from __future__ import annotations

import json
import os
import shutil

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engines.engine import Availability
from engines.errors import InputError
from harness import evidence as ev
from harness.cli import main
from harness.manifest import read_manifests
from harness.plan import Shard, parse_shard
from harness.shards import shard_coverage
from suites.planted.engines import Planted

ARGS = ["--engines", "native-host,ort-cpu", "--packages", "tiny_llama,lookup_chained",
        "--max-new-tokens", "6"]
VOLATILE = {"run_id", "created", "environment", "timings", "ok"}


@given(total=st.integers(0, 200), count=st.integers(1, 12))
def test_the_shares_tile_the_plan_exactly_once(total, count):
    bounds = [Shard(i, count).bounds(total) for i in range(1, count + 1)]
    cells = [c for start, end in bounds for c in range(start, end)]
    assert cells == list(range(total))
    sizes = [end - start for start, end in bounds]
    assert max(sizes) - min(sizes) <= 1


@pytest.mark.parametrize("text", ["0/3", "4/3", "a/b", "3", "1/0", "-1/2", "1/2/3", ""])
def test_a_bad_shard_is_refused_naming_the_option(text):
    with pytest.raises(InputError) as err:
        parse_shard(text)
    assert err.value.field == "--shard" and "I/N" in str(err.value)


def _normalized(record) -> dict:
    data = json.loads(record.model_dump_json())
    for key in VOLATILE:
        data.pop(key, None)
    data["ledger"].pop("phase_seconds", None)
    return data


def _cells(*folders) -> dict:
    out = {}
    for folder in folders:
        for r in ev.load_evidence_dir(folder):
            key = (r.package.name, r.engine, r.mode.label, r.prompt.name)
            assert key not in out, f"{key} recorded twice"
            out[key] = r
    return out


def test_three_shards_record_what_one_run_records_and_the_report_checks_coverage(
        tmp_path, capsys):
    whole = tmp_path / "whole"
    assert main(["run", *ARGS, "--evidence-dir", str(whole)]) == 0
    shards = [tmp_path / f"shard-{i}" for i in (1, 2, 3)]
    for i, folder in enumerate(shards, 1):
        assert main(["run", *ARGS, "--shard", f"{i}/3", "--evidence-dir", str(folder)]) == 0
    capsys.readouterr()
    one, parts = _cells(whole), _cells(*shards)
    assert list(one) and set(one) == set(parts)
    for key in one:
        assert _normalized(one[key]) == _normalized(parts[key]), key
    manifests = [m for folder in shards for m in read_manifests(folder)]
    (plan,) = {m.plan_digest for m in manifests}
    (whole_manifest,) = read_manifests(whole)
    assert whole_manifest.plan_digest == plan and whole_manifest.shard is None
    assert [len(m.planned) for m in manifests] == [4, 4, 4]  # 12 cells, contiguous shares
    (cov,) = shard_coverage(manifests)
    assert cov.complete and cov.count == 3 and cov.plan_cells == 12

    report = tmp_path / "report.html"
    assert main(["report", *map(str, shards), "-o", str(report)]) == 0
    out = capsys.readouterr().out
    assert "INCOMPLETE" not in out and "report of 12 record(s)" in out
    assert 'class="banner incomplete shards"' not in report.read_text()

    # a missing shard: the plan is INCOMPLETE, the shard named
    assert main(["report", str(shards[0]), str(shards[2]), "-o", str(report)]) == 0
    out = capsys.readouterr().out
    assert "INCOMPLETE: shard 2/3 missing" in out
    html = report.read_text()
    assert 'class="banner incomplete shards"' in html and 'data-missing="2"' in html

    # a shard run twice (its folder copied): named as doubled
    again = tmp_path / "shard-2-again"
    shutil.copytree(shards[1], again)
    assert main(["report", *map(str, shards), str(again), "-o", str(report)]) == 0
    assert "shard 2/3 recorded 2 times" in capsys.readouterr().out


def test_a_shard_of_a_different_plan_does_not_complete_this_one(tmp_path, capsys):
    a, b = tmp_path / "a", tmp_path / "b"
    assert main(["run", *ARGS, "--shard", "1/2", "--evidence-dir", str(a)]) == 0
    other = ARGS[:-1] + ["5"]  # another max_new_tokens: another plan
    assert main(["run", *other, "--shard", "2/2", "--evidence-dir", str(b)]) == 0
    capsys.readouterr()
    covs = shard_coverage(read_manifests(a) + read_manifests(b))
    assert len(covs) == 2 and not any(c.complete for c in covs)
    assert {tuple(c.missing) for c in covs} == {(1,), (2,)}


class OnSomeMachines(Planted):
    """Runs only where its (imaginary) library is: LOCKSTEP_TEST_HAS_FOO is set."""
    name = "some-machines"

    @classmethod
    def availability(cls):
        if os.environ.get("LOCKSTEP_TEST_HAS_FOO"):
            return Availability(True, "foo found")
        return Availability(False, "needs the imaginary libfoo")


def test_every_machine_plans_the_same_cells_and_leaves_out_only_its_own_share(
        tmp_path, capsys, monkeypatch):
    """The plan does not depend on the machine: a shard on a machine without an engine's
    library keeps the plan's digest and bounds and leaves that engine's cells of its share
    out (recorded in its manifest); the shards still cover the plan exactly once."""
    args = ["--engines", "native-host,suites.test_shards:OnSomeMachines", "--packages",
            "tiny_llama,lookup_chained", "--max-new-tokens", "4", "--max-prompts", "1"]
    monkeypatch.setenv("LOCKSTEP_TEST_HAS_FOO", "1")
    assert main(["run", *args, "--shard", "1/2", "--evidence-dir", str(tmp_path / "a")]) == 0
    monkeypatch.delenv("LOCKSTEP_TEST_HAS_FOO")
    assert main(["run", *args, "--shard", "2/2", "--evidence-dir", str(tmp_path / "b")]) == 0
    (a,), (b,) = read_manifests(tmp_path / "a"), read_manifests(tmp_path / "b")
    assert a.plan_digest == b.plan_digest and a.shard.plan_cells == b.shard.plan_cells == 4
    assert [c.engine for c in a.planned] == ["native-host", "some-machines"] and not a.left_out
    assert [c.engine for c in b.planned] == ["native-host"]
    assert [(lo.engine, lo.package, lo.cells, lo.decided_by) for lo in b.left_out] == \
        [("some-machines", "lookup_chained", 1, "machine")]
    (cov,) = shard_coverage([a, b])
    assert cov.complete, cov.describe()
    capsys.readouterr()
    report = tmp_path / "report.html"
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "-o", str(report)]) == 0
    out = capsys.readouterr().out
    assert "INCOMPLETE" not in out and "report of 3 record(s)" in out
    assert "some-machines" in report.read_text().split('id="unavailable"')[1].split("</ul>")[0]
