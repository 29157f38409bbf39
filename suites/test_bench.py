"""harness.bench: what the benchmark computes and reports, never how fast anything is.

Ratios come from the baseline timed in the same run, unavailable and failing engines are
rows with their reason, device engines are synchronised around every timed decode, and a bad
request fails before anything is timed.
"""
from __future__ import annotations

import json

import pytest

from engines.backends.ort_cpu import OrtCpuEngine
from engines.engine import Availability
from engines.errors import EngineUnavailable, ExecutionError, InputError, UnknownEngine
from engines.workflow import DecodeResult
from harness import bench as hb

SMALL = "lookup_chained"  # the cheapest fixture; speculative (chained) too
NEW = 4


class MissingEngine(OrtCpuEngine):
    name = "missing-here"

    @classmethod
    def availability(cls):
        return Availability(False, "needs a device this machine lacks")


class RefusingEngine(OrtCpuEngine):
    name = "refuses-package"

    def __init__(self, package):
        raise EngineUnavailable("loads static packages only", field="package",
                                value=package.spec.name, remedy="use a static package")


class FailingEngine(OrtCpuEngine):
    name = "fails-forward"

    def run_component(self, component, feeds):
        raise ExecutionError("op not supported", field="op", value="Foo", remedy="add it")


class WanderingEngine(OrtCpuEngine):
    """Decodes a different stream every time: a benchmark must not summarise that."""

    name = "wandering"
    calls = 0

    def greedy(self, prompt, max_new_tokens, audit=False):
        WanderingEngine.calls += 1
        ledger = self.reset_ledger()
        return DecodeResult(self.name, list(prompt), [WanderingEngine.calls] * max_new_tokens,
                            ledger, 0.01, [0.001] * max_new_tokens)


class FakeStream:
    def __init__(self, log):
        self.log = log

    def synchronize(self):
        self.log.append("sync")


def logging_engine(log: list[str], with_stream: bool):
    """An ort-cpu engine that logs each forward (and each sync of its stream, if it has one)."""

    class Logged(OrtCpuEngine):
        name = "logged"

        def __init__(self, package):
            super().__init__(package)
            if with_stream:
                self.stream = FakeStream(log)

        def run_component(self, component, feeds):
            log.append("forward")
            return super().run_component(component, feeds)

    return Logged


def by_engine(rows):
    return {r.engine: r for r in rows}


@pytest.fixture(scope="module")
def greedy_rows():
    return hb.bench(["native-host", "onnx-reference"], [SMALL], repeats=3, max_new_tokens=NEW)


def test_baseline_joins_the_run_and_every_ratio_is_taken_against_it(greedy_rows):
    rows = by_engine(greedy_rows)
    assert set(rows) == {"native-host", "onnx-reference", "ort-cpu"}  # the baseline joined
    base = rows["ort-cpu"]
    assert base.ratio == 1.0
    for row in greedy_rows:
        assert row.status == hb.OK and row.baseline == "ort-cpu"
        assert row.ratio == row.tokens_per_s_median / base.tokens_per_s_median


def test_measured_rows_summarise_their_repeats(greedy_rows):
    for row in greedy_rows:
        assert row.repeats == 3 and len(row.tokens_per_s) == 3
        assert row.tokens_per_s_min <= row.tokens_per_s_median <= row.tokens_per_s_max
        assert row.tokens_per_s_median == sorted(row.tokens_per_s)[1]
        assert row.new_tokens == NEW and row.mode == "greedy" and row.residency == "host"
        assert row.tokens_per_step == 1.0  # greedy: one token a step
        assert row.step_ms > 0
        assert set(row.forward_ms) == {"prefill", "decode"}


def test_ratio_uses_the_baseline_of_the_same_package_and_mode():
    def row(package, engine, mode, median):
        return hb.BenchRow(package, engine, mode, hb.OK, tokens_per_s=[median],
                           tokens_per_s_median=median)

    rows = hb.attach_ratios([row("a", "base", "greedy", 100.0), row("a", "x", "greedy", 50.0),
                             row("b", "base", "greedy", 10.0), row("b", "x", "greedy", 50.0),
                             row("b", "x", "chained/w2", 80.0)], "base")
    ratios = [(r.package, r.engine, r.mode, r.ratio) for r in rows]
    assert ratios == [("a", "base", "greedy", 1.0), ("a", "x", "greedy", 0.5),
                      ("b", "base", "greedy", 1.0), ("b", "x", "greedy", 5.0),
                      ("b", "x", "chained/w2", None)]
    assert "baseline base not measured (not in this run)" in rows[-1].reason


def test_unavailable_engines_are_rows_with_their_reason():
    rows = by_engine(hb.bench([MissingEngine, RefusingEngine, "native-host"], [SMALL],
                              repeats=1, max_new_tokens=NEW))
    assert rows["missing-here"].status == hb.UNAVAILABLE
    assert rows["missing-here"].reason == "needs a device this machine lacks"
    assert rows["refuses-package"].status == hb.UNAVAILABLE
    assert "loads static packages only" in rows["refuses-package"].reason
    for name in ("missing-here", "refuses-package"):
        assert rows[name].ratio is None and rows[name].tokens_per_s == []
    assert rows["native-host"].measured and rows["native-host"].ratio is not None


def test_an_unavailable_baseline_leaves_every_ratio_empty_and_says_why():
    rows = by_engine(hb.bench(["native-host"], [SMALL], repeats=1, max_new_tokens=NEW,
                              baseline=MissingEngine))
    assert rows["native-host"].measured and rows["native-host"].ratio is None
    assert "baseline missing-here not measured (needs a device" in rows["native-host"].reason


def test_a_failing_engine_is_an_error_row_and_the_others_still_run():
    rows = by_engine(hb.bench([FailingEngine], [SMALL], repeats=1, max_new_tokens=NEW))
    assert rows["fails-forward"].status == hb.ERROR
    assert "op not supported" in rows["fails-forward"].reason
    assert rows["ort-cpu"].measured and rows["ort-cpu"].ratio == 1.0


def test_decodes_that_differ_between_repeats_are_an_error_not_a_speed():
    rows = by_engine(hb.bench([WanderingEngine], [SMALL], repeats=2, max_new_tokens=NEW))
    assert rows["wandering"].status == hb.ERROR and rows["wandering"].ratio is None
    assert "different tokens" in rows["wandering"].reason


def test_engines_are_timed_in_turns():
    log: list[str] = []
    first, second = logging_engine(log, False), logging_engine(log, False)
    first.name, second.name = "first", "second"
    marks = []
    plan = hb.plan_bench([first, second], [SMALL], repeats=3, max_new_tokens=NEW, warmup=1)
    hb.run_bench(plan, lambda n, text: marks.append(text))
    timed = [t.split(" · ")[1] for t in marks if "repeat" in t]
    assert timed == ["first", "second", "ort-cpu"] * 3


@pytest.mark.parametrize("with_stream", [True, False])
def test_a_stream_is_synchronised_before_and_after_every_decode(with_stream):
    log: list[str] = []
    plan = hb.plan_bench([logging_engine(log, with_stream)], [SMALL], repeats=2,
                         max_new_tokens=NEW, warmup=1, baseline="native-host")
    hb.run_bench(plan)
    decodes = "".join("s" if e == "sync" else "f" for e in log)
    if with_stream:  # 3 decodes (1 warm-up, 2 timed), each of NEW forwards between two syncs
        assert decodes == ("s" + "f" * NEW + "s") * 3
    else:
        assert decodes == "f" * NEW * 3


def test_progress_counts_every_planned_decode():
    plan = hb.plan_bench([MissingEngine, FailingEngine, "native-host"], [SMALL],
                         mode="speculative", width=2, repeats=2, max_new_tokens=NEW)
    advanced = []
    rows = hb.run_bench(plan, lambda n, text: advanced.append(n))
    assert sum(advanced) == plan.total_decodes == 4 * (1 + 1 + 2)
    assert [r.status for r in rows] == [hb.UNAVAILABLE, hb.ERROR, hb.OK, hb.OK]


def test_speculative_rows_report_rounds():
    rows = by_engine(hb.bench(["native-host"], [SMALL], mode="speculative", width=2,
                              repeats=1, max_new_tokens=8))
    row = rows["native-host"]
    assert row.mode == "chained/w2" and row.measured and rows["ort-cpu"].ratio == 1.0
    assert 1.0 <= row.tokens_per_step <= 3.0  # a round commits 1..W+1 tokens
    assert {"prefill", "propose", "verify"} <= set(row.forward_ms)


@pytest.mark.parametrize("options, field", [
    ({"mode": "beam"}, "mode"),
    ({"width": 2}, "width"),  # greedy mode takes no width
    ({"mode": "speculative", "width": 0}, "width"),
    ({"mode": "speculative", "width": 99}, "width"),
    ({"repeats": 0}, "repeats"),
    ({"repeats": 2.5}, "repeats"),
    ({"warmup": -1}, "warmup"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": 10_000}, "max_new_tokens"),  # past the package's context
    ({"prompt": [1, 10_000]}, "prompt[1]"),
])
def test_bad_requests_fail_before_anything_runs(options, field):
    with pytest.raises(InputError) as info:
        hb.plan_bench(["native-host"], [SMALL], **options)
    assert info.value.field == field and info.value.remedy


def test_unknown_engines_and_packages_and_empty_lists_are_named():
    with pytest.raises(UnknownEngine, match="nope"):
        hb.plan_bench(["nope"], [SMALL])
    with pytest.raises(UnknownEngine, match="nope"):
        hb.plan_bench(["native-host"], [SMALL], baseline="nope")
    with pytest.raises(InputError) as info:
        hb.plan_bench([], [SMALL])
    assert info.value.field == "engines"
    with pytest.raises(InputError) as info:
        hb.plan_bench(["native-host"], [])
    assert info.value.field == "packages"
    with pytest.raises(InputError, match="declares no speculative decoding"):
        hb.plan_bench(["native-host"], ["tiny_llama"], mode="speculative")


def test_json_holds_the_rows_and_settings(greedy_rows, tmp_path):
    plan = hb.plan_bench(["native-host", "onnx-reference"], [SMALL], repeats=3,
                         max_new_tokens=NEW)
    path = hb.write_json(greedy_rows, tmp_path / "sub" / "bench.json", plan)
    data = json.loads(path.read_text())
    assert data["kind"] == "lockstep-bench" and data["format"] == hb.FORMAT
    assert data["settings"]["baseline"] == "ort-cpu" and data["settings"]["repeats"] == 3
    assert data["settings"]["engines"] == ["native-host", "onnx-reference", "ort-cpu"]
    assert [r["engine"] for r in data["rows"]] == [r.engine for r in greedy_rows]
    assert [r["ratio"] for r in data["rows"]] == [r.ratio for r in greedy_rows]
    assert data["environment"]["python"]


def test_cli_prints_the_table_and_writes_json(tmp_path, capsys, monkeypatch):
    from harness.cli import main

    monkeypatch.setenv("COLUMNS", "200")  # xdist workers report a narrow terminal
    out = tmp_path / "bench.json"
    status = main(["bench", "--engines", "native-host,native-cuda", "--packages", SMALL,
                   "--repeats", "1", "--max-new-tokens", str(NEW), "--json", str(out)])
    assert status == 0  # an unavailable engine is reported, not a failure
    text = capsys.readouterr().out
    assert "lockstep bench" in text and "native-host" in text and "1.00x" in text
    from engines.registry import availability

    cuda = availability("native-cuda")
    if not cuda.ok:
        assert "n/a" in text and f"native-cuda ({SMALL}): unavailable" in text
    rows = {r["engine"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["ort-cpu"]["ratio"] == 1.0 and rows["native-host"]["ratio"] > 0


@pytest.mark.parametrize("argv, field", [
    (["--width", "2"], "--width"),  # greedy mode
    (["--mode", "speculative", "--width", "two"], "--width"),
    (["--repeats", "0"], "repeats"),
])
def test_cli_bad_input_exits_2_naming_the_field(argv, field, capsys):
    from harness.cli import main

    status = main(["bench", "--engines", "native-host", "--packages", SMALL, *argv])
    assert status == 2
    assert f"field {field}" in capsys.readouterr().err
