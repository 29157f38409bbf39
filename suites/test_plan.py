"""A run plans only the cells an engine could run, and the plan is the same on every machine:
what an engine's declarations exclude is outside the plan, what this machine cannot run is
left out of this run only, and both are said."""
from __future__ import annotations

import pytest

from engines.engine import Availability
from engines.registry import get_engine_class
from harness.packages import resolve_package
from harness.plan import Shard, fold_not_run, plan_packages, plan_run
from suites.planted.engines import Planted

PACKAGES = ("tiny_llama", "lookup_chained")


class SomewhereElse(Planted):
    """Runs only on machines this test says it is on."""
    name = "somewhere-else"
    here = False

    @classmethod
    def availability(cls):
        return Availability(cls.here, "" if cls.here else "needs the imaginary libqux")


class GreedyOnly(Planted):
    name = "greedy-only"
    speculative = False


class Raises(Planted):
    """A declaration that raises is no refusal: its cells run and record the error."""
    name = "declaration-raises"

    @classmethod
    def supports(cls, package):
        raise RuntimeError("broken declaration")


def _plan(names, mode="greedy", shard=None, widths=None):
    classes = {}
    for ref in names:
        cls = ref if isinstance(ref, type) else get_engine_class(ref)
        classes[cls.name] = cls
    refs = {name: name for name in classes}
    packages = [resolve_package(p) for p in (PACKAGES if mode == "greedy"
                                             else ("tiny_llama_pair",))]
    plans = plan_packages(packages, mode, widths, None, 1, 4)
    return plan_run(plans, classes, refs, mode, 4, shard)


def test_cells_an_engine_declares_it_cannot_run_are_left_out_of_the_plan(monkeypatch):
    run = _plan(["native-host", "hf", SomewhereElse, Raises])
    assert {c.engine for c in run.cells} == {"native-host", "declaration-raises"}
    declared = [lo for lo in run.left_out if lo.decided_by == "declaration"]
    assert {(lo.engine, lo.package, lo.mode, lo.cells) for lo in declared} == \
        {("hf", p, "greedy", 1) for p in PACKAGES}
    assert all("checkpoint.json" in lo.reason for lo in declared)
    here = [lo for lo in run.left_out if lo.decided_by == "machine"]
    assert {(lo.engine, lo.package) for lo in here} == {("somewhere-else", p) for p in PACKAGES}
    assert all(lo.reason == "not available here: needs the imaginary libqux" for lo in here)
    # the plan (its digest and size) does not depend on what this machine has
    monkeypatch.setattr(SomewhereElse, "here", True)
    elsewhere = _plan(["native-host", "hf", SomewhereElse, Raises])
    assert (elsewhere.digest, elsewhere.total) == (run.digest, run.total) == (run.digest, 6)
    assert len(elsewhere.cells) == 6 and len(run.cells) == 4
    assert [lo.decided_by for lo in elsewhere.left_out] == ["declaration"] * 2


def test_a_shard_leaves_out_only_the_cells_of_its_own_share():
    whole = _plan(["native-host", SomewhereElse])
    shares = [_plan(["native-host", SomewhereElse], shard=Shard(i, 2)) for i in (1, 2)]
    assert {s.digest for s in shares} == {whole.digest}
    assert sum(len(s.cells) for s in shares) == len(whole.cells)
    assert sum(lo.cells for s in shares for lo in s.left_out) == \
        sum(lo.cells for lo in whole.left_out) == 2


def test_speculation_is_left_out_for_an_engine_that_declares_none():
    run = _plan(["native-host", GreedyOnly], mode="speculative", widths=[1, 2])
    assert {c.engine for c in run.cells} == {"native-host"}
    assert {(lo.engine, lo.mode, lo.cells) for lo in run.left_out} == \
        {("greedy-only", "draft/w1", 1), ("greedy-only", "draft/w2", 1)}
    (line,) = fold_not_run((lo.engine, lo.package, lo.reason, lo.cells) for lo in run.left_out)
    assert line.line() == ("greedy-only: 2 cell(s) on 1 package(s) not run: greedy-only declares "
                           "no speculative decoding (capabilities: speculative false)")


@pytest.mark.parametrize("name", ["native-cuda", "ort-cuda"])
def test_a_device_engine_is_planned_where_it_runs_and_left_out_where_it_does_not(name):
    found = get_engine_class(name).availability()
    run = _plan([name])
    if found:
        assert {c.engine for c in run.cells} == {name} and run.left_out == []
    else:
        assert run.cells == [] and run.total == 2
        assert {(lo.reason, lo.decided_by) for lo in run.left_out} == \
            {(f"not available here: {found.reason}", "machine")}
