"""harness.bench: what the benchmark computes and reports, never how fast anything is.

Ratios come from the baseline timed in the same run, unavailable and failing engines are
rows with their reason, every engine is synchronised (``Engine.synchronize``) around every
timed decode, prefill is reported apart from the steady decode, the floor is the weight bytes
over the bandwidth given, ``--ignore-eos`` times exactly the tokens asked for, a black-box
peer (``hf-cuda``'s form) is benched like any engine, and a bad request fails before anything
is timed. Also ``hf-cuda`` itself on a CPU: unavailable with its reason, refused for
speculation, and its static-cache path (run on the CPU by a test subclass).
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from engines.backends.ort_cpu import OrtCpuEngine
from engines.engine import Availability, BlackBoxEngine
from engines.errors import EngineUnavailable, ExecutionError, InputError, UnknownEngine
from engines.package import load_package
from engines.workflow import DecodeResult, greedy_decode
from harness import bench as hb

SMALL = "lookup_chained"  # the cheapest fixture; speculative (chained) too
NEW = 4
REPO = Path(__file__).resolve().parents[1]


def fake_bandwidth(gb_per_s: float | None = 10.0, log: list | None = None):
    """A bandwidth measurement that measures nothing: ``gb_per_s`` for every residency."""
    def measure(residency):
        if log is not None:
            log.append(residency)
        return hb.Bandwidth(residency, gb_per_s, f"fake {gb_per_s} GB/s")
    return measure


FAKE_BW = fake_bandwidth()


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

    def run_component(self, component, feeds, phase=None):
        raise ExecutionError("op not supported", field="op", value="Foo", remedy="add it")


class WanderingEngine(OrtCpuEngine):
    """Decodes a different stream every time: a benchmark must not summarise that."""

    name = "wandering"
    decodes_itself = True
    calls = 0

    def generate(self, prompt, max_new_tokens, audit=False):
        WanderingEngine.calls += 1
        ledger = self.reset_ledger()
        return DecodeResult(self.name, list(prompt), [WanderingEngine.calls] * max_new_tokens,
                            ledger, 0.01, [0.001] * max_new_tokens)


def logging_engine(log: list[str], synchronizes: bool):
    """An ort-cpu engine that logs each forward (and each ``synchronize``, where it declares
    one of its own, as a device engine does)."""

    class Logged(OrtCpuEngine):
        name = "logged"

        def run_component(self, component, feeds, phase=None):
            log.append("forward")
            return super().run_component(component, feeds, phase=phase)

    if synchronizes:
        class Synced(Logged):
            name = "logged"

            def synchronize(self):
                log.append("sync")

        return Synced
    return Logged


def by_engine(rows):
    return {r.engine: r for r in rows}


@pytest.fixture(scope="module")
def greedy_rows():
    return hb.bench(["native-host", "onnx-reference"], [SMALL], repeats=3, max_new_tokens=NEW,
                    bandwidth=FAKE_BW)


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
        # prefill apart from the steady decode: NEW - 1 decode steps a decode, the first
        # WARMUP_STEPS of each left out (one is always kept)
        assert row.prefill_ms > 0 and row.decode_ms > 0
        assert row.warmup_steps == hb.WARMUP_STEPS
        assert row.decode_steps == 3 * max(NEW - 1 - hb.WARMUP_STEPS, 1)
        assert row.decode_tokens_per_s == pytest.approx(1000 / row.decode_ms)
        # the floor from the package's weight bytes and the (fake) bandwidth
        assert row.bandwidth_gb_s == 10.0 and row.weight_bytes > 0
        assert row.floor_ms == pytest.approx(1000 * row.weight_bytes / 10e9)
        assert row.x_floor == pytest.approx(row.decode_ms / row.floor_ms)


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


def test_compared_engines_join_the_run_and_every_row_has_a_ratio_to_each():
    """``compare_to``: one table, a ratio to the baseline and to every compared engine, each
    the row's median tokens/s over that engine's of the same package, prompts and mode."""
    rows = by_engine(hb.bench(["native-host"], [SMALL], repeats=1, max_new_tokens=NEW,
                              compare_to=["onnx-reference", "ort-cpu"], bandwidth=FAKE_BW))
    assert set(rows) == {"native-host", "ort-cpu", "onnx-reference"}  # the compared joined
    medians = {name: r.tokens_per_s_median for name, r in rows.items()}
    for name, row in rows.items():
        assert row.ratios == {to: medians[name] / medians[to] for to in ("ort-cpu",
                                                                         "onnx-reference")}
        assert row.ratio == row.ratios["ort-cpu"]  # the baseline's, as before
    plan = hb.plan_bench(["native-host"], [SMALL], compare_to=["ort-cpu", "onnx-reference"])
    assert plan.baseline == "ort-cpu" and plan.compare_to == ("onnx-reference",)


def test_a_ratio_to_a_compared_engine_exists_only_where_it_was_measured():
    def row(engine, mode, median, status=hb.OK):
        return hb.BenchRow("a", engine, mode, status, tokens_per_s=[median] if median else [],
                           tokens_per_s_median=median)

    rows = hb.attach_ratios([row("base", "greedy", 100.0), row("peer", "greedy", 25.0),
                             row("x", "greedy", 50.0), row("x", "chained/w2", 80.0),
                             row("base", "chained/w2", 40.0), row("peer", "chained/w2", None,
                                                                 hb.UNAVAILABLE),
                             row("gone", "greedy", None, hb.ERROR)], "base", ("peer",))
    ratios = [(r.engine, r.mode, r.ratios) for r in rows]
    assert ratios == [("base", "greedy", {"base": 1.0, "peer": 4.0}),
                      ("peer", "greedy", {"base": 0.25, "peer": 1.0}),
                      ("x", "greedy", {"base": 0.5, "peer": 2.0}),
                      ("x", "chained/w2", {"base": 2.0}),
                      ("base", "chained/w2", {"base": 1.0}),
                      ("peer", "chained/w2", {}), ("gone", "greedy", {})]


def test_a_compared_engine_and_a_listed_one_of_one_name_are_refused():
    class Other(OrtCpuEngine):
        name = "native-host"

    with pytest.raises(InputError) as err:
        hb.plan_bench(["native-host"], [SMALL], compare_to=[Other])
    assert err.value.field == "compare_to" and err.value.value == "native-host"


def test_unavailable_engines_are_rows_with_their_reason():
    rows = by_engine(hb.bench([MissingEngine, RefusingEngine, "native-host"], [SMALL],
                              repeats=1, max_new_tokens=NEW, bandwidth=FAKE_BW))
    assert rows["missing-here"].status == hb.UNAVAILABLE
    assert rows["missing-here"].reason == "needs a device this machine lacks"
    assert rows["refuses-package"].status == hb.UNAVAILABLE
    assert "loads static packages only" in rows["refuses-package"].reason
    for name in ("missing-here", "refuses-package"):
        assert rows[name].ratio is None and rows[name].tokens_per_s == []
    assert rows["native-host"].measured and rows["native-host"].ratio is not None


def test_an_unavailable_baseline_leaves_every_ratio_empty_and_says_why():
    rows = by_engine(hb.bench(["native-host"], [SMALL], repeats=1, max_new_tokens=NEW,
                              baseline=MissingEngine, bandwidth=FAKE_BW))
    assert rows["native-host"].measured and rows["native-host"].ratio is None
    assert "baseline missing-here not measured (needs a device" in rows["native-host"].reason


def test_a_failing_engine_is_an_error_row_and_the_others_still_run():
    rows = by_engine(hb.bench([FailingEngine], [SMALL], repeats=1, max_new_tokens=NEW,
                              bandwidth=FAKE_BW))
    assert rows["fails-forward"].status == hb.ERROR
    assert "op not supported" in rows["fails-forward"].reason
    assert rows["ort-cpu"].measured and rows["ort-cpu"].ratio == 1.0


def test_decodes_that_differ_between_repeats_are_an_error_not_a_speed():
    rows = by_engine(hb.bench([WanderingEngine], [SMALL], repeats=2, max_new_tokens=NEW,
                              bandwidth=FAKE_BW))
    assert rows["wandering"].status == hb.ERROR and rows["wandering"].ratio is None
    row = rows["wandering"]
    assert "different tokens" in row.reason
    first = next(iter(row.prompts))  # where they part: the first prompt, its first token
    assert f"prompt {first!r}, repeats 1 and 2 part at new token 0" in row.reason


def test_engines_are_timed_in_turns():
    log: list[str] = []
    first, second = logging_engine(log, False), logging_engine(log, False)
    first.name, second.name = "first", "second"
    marks = []
    plan = hb.plan_bench([first, second], [SMALL], repeats=3, max_new_tokens=NEW, warmup=1)
    hb.run_bench(plan, lambda n, text: marks.append(text), bandwidth=FAKE_BW)
    timed = [t.split(" · ")[1] for t in marks if "repeat" in t]
    assert timed == ["first", "second", "ort-cpu"] * 3


@pytest.mark.parametrize("interleave", [False, True])
def test_interleave_times_every_package_in_one_rotation(interleave):
    """By default a package's engines are timed in turns, one package after another; with
    ``interleave`` repeat r of every (package, engine) comes before repeat r+1 of any, so a
    ratio across packages is measured side by side. The rows and figures are the same."""
    marks = []
    plan = hb.plan_bench(["native-host"], [SMALL, "tiny_llama"], repeats=2, max_new_tokens=NEW,
                         warmup=1, baseline="native-host", interleave=interleave)
    rows = hb.run_bench(plan, lambda n, text: marks.append(text), bandwidth=FAKE_BW)
    timed = [t.split(" · ")[0] for t in marks if "repeat" in t]
    pair = [SMALL, "tiny_llama"]
    assert timed == (pair * 2 if interleave else [SMALL, SMALL, "tiny_llama", "tiny_llama"])
    assert [(r.package, r.status, r.repeats) for r in rows] == [(n, hb.OK, 2) for n in pair]
    assert all(r.ratio == 1.0 and r.floor_ms is not None for r in rows)


@pytest.mark.parametrize("synchronizes", [True, False])
def test_the_engine_is_synchronised_before_and_after_every_decode(synchronizes):
    log: list[str] = []
    plan = hb.plan_bench([logging_engine(log, synchronizes)], [SMALL], repeats=2,
                         max_new_tokens=NEW, warmup=1, baseline="native-host")
    hb.run_bench(plan, bandwidth=FAKE_BW)
    decodes = "".join("s" if e == "sync" else "f" for e in log)
    if synchronizes:  # 3 decodes (1 warm-up, 2 timed), each of NEW forwards between two
        # syncs; one more sync before its bandwidth is measured (nothing left queued)
        assert decodes == ("s" + "f" * NEW + "s") * 3 + "s"
    else:  # the default synchronize has nothing to wait for
        assert decodes == "f" * NEW * 3


def test_the_bench_reads_declarations_and_probes_no_engine():
    source = (REPO / "harness" / "bench.py").read_text()
    for probe in ('getattr(engine', 'getattr(cls', 'hasattr(engine', '"stream"', "inspect"):
        assert probe not in source


def test_progress_counts_every_planned_decode():
    plan = hb.plan_bench([MissingEngine, FailingEngine, "native-host"], [SMALL],
                         mode="speculative", width=2, repeats=2, max_new_tokens=NEW)
    advanced = []
    rows = hb.run_bench(plan, lambda n, text: advanced.append(n), bandwidth=FAKE_BW)
    # per engine: a greedy and a speculative warm-up, then 2 repeats of greedy and of speculative
    assert sum(advanced) == plan.total_decodes == 4 * (1 + 1 + 2 * 2)
    assert [r.status for r in rows] == [hb.UNAVAILABLE] * 2 + [hb.ERROR] * 2 + [hb.OK] * 4
    assert [r.mode for r in rows] == ["greedy", "chained/w2"] * 4


def test_speculative_rows_report_rounds():
    rows = by_engine(hb.bench(["native-host"], [SMALL], mode="speculative", width=2,
                              repeats=1, max_new_tokens=8, bandwidth=FAKE_BW))
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
    ({"warmup_steps": -1}, "warmup_steps"),
    ({"warmup_steps": 1.5}, "warmup_steps"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"interleave": 1}, "interleave"),
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
    with pytest.raises(InputError, match="'tiny_llama' has no speculative section") as info:
        hb.plan_bench(["native-host"], ["tiny_llama"], mode="speculative")
    assert info.value.field == "package" and "lockstep run" not in str(info.value)


def test_json_holds_the_rows_and_settings(greedy_rows, tmp_path):
    plan = hb.plan_bench(["native-host", "onnx-reference"], [SMALL], repeats=3,
                         max_new_tokens=NEW)
    path = hb.write_json(greedy_rows, tmp_path / "sub" / "bench.json", plan)
    data = json.loads(path.read_text())
    assert data["kind"] == "lockstep-bench" and data["format"] == hb.FORMAT
    assert data["settings"]["baseline"] == "ort-cpu" and data["settings"]["repeats"] == 3
    assert data["settings"]["ignore_eos"] is False and data["settings"]["interleave"] is False
    assert data["settings"]["warmup_steps"] == hb.WARMUP_STEPS
    assert data["bandwidth"] == [{"residency": "host", "gb_per_s": 10.0, "how": "fake 10.0 GB/s"}]
    for row in data["rows"]:
        for key in ("prefill_ms", "decode_ms", "decode_tokens_per_s", "weight_bytes",
                    "bandwidth_gb_s", "floor_ms", "x_floor", "decode_ratio"):
            assert row[key] is not None, key
        assert row["compute_dtype"] == "float32" and row["prompt_set"] == "first"
        assert list(row["prompts"]) == ["p0"]
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
    for column in ("tok/s", "prefill ms", "decode ms/tok", "decode tok/s", "floor ms/tok",
                   "x floor", "ratio"):
        assert column in text
    assert "bandwidth host:" in text and "numpy copy of 256 MiB" in text  # measured here
    assert f"weights {SMALL}:" in text
    from engines.registry import availability

    cuda = availability("native-cuda")
    if not cuda.ok:
        assert "n/a" in text and f"native-cuda ({SMALL}): unavailable" in text
    rows = {r["engine"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["ort-cpu"]["ratio"] == 1.0 and rows["native-host"]["ratio"] > 0


def test_cli_compare_to_adds_a_ratio_column_per_engine_and_keeps_them_in_the_json(
        tmp_path, capsys, monkeypatch):
    from harness.cli import main

    monkeypatch.setenv("COLUMNS", "250")
    out = tmp_path / "bench.json"
    assert main(["bench", "--engines", "native-host", "--packages", SMALL, "--repeats", "1",
                 "--max-new-tokens", str(NEW), "--compare-to", "no-such-engine",
                 "--json", str(out)]) == 2  # refused before anything is timed
    refusal = capsys.readouterr()
    assert "--compare-to" in refusal.err and "no-such-engine" in refusal.err
    assert not out.exists()
    status = main(["bench", "--engines", "native-host", "--packages", SMALL, "--repeats", "1",
                   "--max-new-tokens", str(NEW), "--compare-to", "onnx-reference",
                   "--json", str(out)])
    assert status == 0
    text = capsys.readouterr().out
    assert "x onnx-reference" in text and "ratio to ort-cpu, onnx-reference in this run" in text
    data = json.loads(out.read_text())
    assert data["settings"]["compare_to"] == ["onnx-reference"]
    rows = {r["engine"]: r for r in data["rows"]}
    assert rows["onnx-reference"]["ratios"]["onnx-reference"] == 1.0
    native = rows["native-host"]
    assert native["ratios"]["onnx-reference"] == pytest.approx(
        native["tokens_per_s_median"] / rows["onnx-reference"]["tokens_per_s_median"])
    assert f"{native['ratios']['onnx-reference']:.2f}x" in text


def test_cli_interleave_reaches_the_plan_and_the_title(tmp_path, capsys, monkeypatch):
    from harness.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    out = tmp_path / "bench.json"
    status = main(["bench", "--engines", "native-host", "--baseline", "native-host",
                   "--packages", f"{SMALL},tiny_llama", "--repeats", "1", "--max-new-tokens",
                   str(NEW), "--interleave", "--json", str(out)])
    assert status == 0 and "packages interleaved" in capsys.readouterr().out
    data = json.loads(out.read_text())
    assert data["settings"]["interleave"] is True
    assert [r["package"] for r in data["rows"]] == [SMALL, "tiny_llama"]


def test_profile_shows_where_an_untimed_decode_spent_its_host_time(capsys, monkeypatch):
    """``--profile``: each measured greedy row decodes once more under cProfile; the host
    functions that cost most are its profile (the native executor's plan among them for
    native-host), in the JSON and printed; an engine without graph slots has no replay."""
    from harness.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(hb, "measure_bandwidth", FAKE_BW)
    rows = hb.bench(["native-host"], [SMALL], repeats=1, max_new_tokens=NEW,
                    baseline="native-host", profile=True, bandwidth=FAKE_BW)
    [row] = rows
    host = row.profile["host"]
    assert row.profile["replay_ms"] is None and 0 < len(host) <= 15
    assert any("native/plan.py" in f["function"] for f in host), host
    assert all(f["cumulative_ms"] >= f["own_ms"] >= 0 and f["calls"] >= 1 for f in host)
    assert [f["own_ms"] for f in host] == sorted((f["own_ms"] for f in host), reverse=True)
    unprofiled = hb.bench(["native-host"], [SMALL], repeats=1, max_new_tokens=NEW,
                          baseline="native-host", bandwidth=FAKE_BW)
    assert unprofiled[0].profile is None
    assert main(["bench", "--engines", "native-host", "--baseline", "native-host",
                 "--packages", SMALL, "--repeats", "1", "--max-new-tokens", str(NEW),
                 "--profile"]) == 0
    out = capsys.readouterr().out
    assert f"where the time goes: native-host on {SMALL}" in out and "native/plan.py" in out


def test_a_graph_replay_is_timed_back_to_back_between_two_events():
    """The device time of one forward: the PRIMARY slot's captured graph launched on the
    engine's stream (ten untimed, then ``replays`` between two events), the elapsed time
    over ``replays``; an engine without a captured graph has none."""
    from types import SimpleNamespace

    from engines.native.graph_slots import GraphSlot, GraphSlots
    from harness.decode_profile import graph_replay_ms

    launches = []

    class Event:
        def record(self, stream):
            self.at = len(launches)

        def synchronize(self):
            pass

    cupy = SimpleNamespace(cuda=SimpleNamespace(
        Event=Event, get_elapsed_time=lambda start, stop: 2.0 * (stop.at - start.at)))
    slots = GraphSlots(device=None, ledger=lambda: None, enabled=True)
    engine = SimpleNamespace(slots=slots, stream="stream-0")
    assert graph_replay_ms(engine, cupy) is None
    slots[GraphSlot.PRIMARY].graph = SimpleNamespace(launch=launches.append)
    assert graph_replay_ms(engine, cupy, replays=50) == 2.0
    assert launches == ["stream-0"] * 60
    assert graph_replay_ms(engine, cupy, slot=GraphSlot.VERIFY) is None  # none captured
    slots[GraphSlot.VERIFY].graph = SimpleNamespace(launch=lambda s: launches.extend([s] * 3))
    assert graph_replay_ms(engine, cupy, replays=10, slot=GraphSlot.VERIFY) == 6.0
    assert graph_replay_ms(SimpleNamespace(stream="s"), cupy) is None


def test_the_cli_default_of_warmup_steps_is_the_bench_default():
    from harness.cli import bench as cli_bench

    assert cli_bench.WARMUP_STEPS == hb.WARMUP_STEPS


def test_cli_ignore_eos_times_every_token_asked_for(eos_package, capsys, monkeypatch):
    from harness.cli import main

    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(hb, "measure_bandwidth", FAKE_BW)
    package = str(eos_package[0].root)
    assert main(["bench", "--engines", "native-host", "--packages", package, "--repeats", "1",
                 "--max-new-tokens", str(LONG), "--ignore-eos", "--warmup-steps", "1"]) == 0
    text = capsys.readouterr().out
    assert f"{LONG} new tokens, eos ignored" in text and "after 1 warm-up step," in text
    assert "eos after" not in text
    assert main(["bench", "--engines", "native-host", "--packages", package, "--repeats", "1",
                 "--max-new-tokens", str(LONG)]) == 0
    assert f"eos after {eos_package[3] + 1} of {LONG} tokens" in capsys.readouterr().out


@pytest.mark.parametrize("argv, field", [
    (["--width", "2"], "--width"),  # greedy mode
    (["--mode", "speculative", "--width", "two"], "--width"),
    (["--repeats", "0"], "--repeats"),
    (["--warmup-steps", "-1"], "--warmup-steps"),
    (["--max-new-tokens", "4", "--warmup-steps", "3"], "--warmup-steps"),
])
def test_cli_bad_input_exits_2_naming_the_field(argv, field, capsys):
    from harness.cli import main

    status = main(["bench", "--engines", "native-host", "--packages", SMALL, *argv])
    assert status == 2
    assert f"field {field}" in capsys.readouterr().err


def test_warmup_steps_must_leave_a_decode_step_to_time():
    """N new tokens: the prefill makes the first, N - 1 decode steps follow; the K given must
    leave one of them (an unset K, the default, shrinks to fit)."""
    from engines.errors import InputError
    from harness.cli.bench import _check_warmup_steps

    for steps, tokens in ((2, 4), (0, 1), (None, 1), (None, 2)):
        _check_warmup_steps(steps, tokens)
    with pytest.raises(InputError) as caught:
        _check_warmup_steps(3, 4)
    line = str(caught.value)
    assert "--max-new-tokens 4" in line and "[field --warmup-steps = 3]" in line
    assert "give --warmup-steps 2 or fewer, or raise --max-new-tokens to 5 or more" in line
    with pytest.raises(InputError, match="remedy: raise --max-new-tokens to 3 or more$"):
        _check_warmup_steps(1, 2)


# -- --ignore-eos: exactly the tokens asked for ----------------------------------------------

LONG = 12


def with_eos(source: Path, folder: Path, eos: int, name: str):
    """A copy of the package at ``source`` whose eos is ``eos`` (everything else the same)."""
    shutil.copytree(source, folder)
    doc = yaml.safe_load((folder / "package.yaml").read_text())
    doc["eos_id"], doc["name"] = int(eos), name
    (folder / "package.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_package(folder)


@pytest.fixture(scope="module")
def eos_package(tmp_path_factory):
    """tiny_llama with an eos its greedy stream emits early: (package, prompt, the stream
    without eos, the step at which eos is emitted)."""
    from harness.packages import resolve_package

    base = resolve_package("tiny_llama")
    prompt = list(base.spec.prompts[0])
    free = greedy_decode(OrtCpuEngine(base), prompt, LONG).tokens
    stop = next(i for i in range(1, LONG - 3) if free[i] not in free[:i])
    package = with_eos(base.root, tmp_path_factory.mktemp("eos") / "tiny_llama_eos",
                       free[stop], "tiny_llama_eos")
    return package, prompt, free, stop


@pytest.mark.parametrize("engine_name", ["ort-cpu", "native-host"])
def test_ignore_eos_decodes_exactly_the_tokens_asked_for_past_eos(eos_package, engine_name):
    from engines.registry import get_engine_class

    package, prompt, free, stop = eos_package
    engine = get_engine_class(engine_name)(package)
    stopped = greedy_decode(engine, prompt, LONG)
    assert stopped.tokens == free[:stop + 1]  # the parity run: ends after emitting eos
    kept = greedy_decode(engine, prompt, LONG, ignore_eos=True)
    assert kept.tokens == free and len(kept.tokens) == LONG  # on past eos, same tokens
    assert kept.ledger.forwards == {**kept.ledger.forwards, "prefill": 1, "decode": LONG - 1}
    assert len(kept.step_s) == LONG


def test_the_bench_times_exactly_n_tokens_with_ignore_eos(eos_package):
    package, _prompt, _free, stop = eos_package
    kept = hb.bench(["native-host"], [package], repeats=2, max_new_tokens=LONG,
                    ignore_eos=True, bandwidth=FAKE_BW)
    for row in kept:
        assert row.measured and row.ignore_eos and row.new_tokens == LONG, row.reason
        assert row.decode_steps == 2 * (LONG - 1 - hb.WARMUP_STEPS)
        assert "eos after" not in row.reason
    stopped = hb.bench(["native-host"], [package], repeats=2, max_new_tokens=LONG,
                       bandwidth=FAKE_BW)
    for row in stopped:  # without it the figures cover the stream up to eos, and say so
        assert row.measured and not row.ignore_eos and row.new_tokens == stop + 1
        assert f"eos after {stop + 1} of {LONG} tokens" in row.reason


# -- a black-box peer (hf-cuda's form), through a fake ----------------------------------------

PREFILL_S, FIRST_S, STEADY_S = 0.050, 0.020, 0.002


def gpu_peer(log: list, *, eos_at: int | None = None, honours_ignore_eos: bool = True,
             takes_ignore_eos: bool = True):
    """A black box standing in for ``hf-cuda``: residency cuda:0, decodes by itself, its own
    ``synchronize``; reports a slow prefill, two slow first decode steps, then steady steps
    (scripted step times, so nothing here depends on how fast this machine is). It stops
    after ``eos_at`` tokens unless asked to ignore eos (and ``honours_ignore_eos``)."""

    class Peer(BlackBoxEngine):
        name = "fake-gpu-peer"
        residency = "cuda:0"

        @classmethod
        def availability(cls):
            return Availability(True, "a fake GPU peer")

        def _generate(self, prompt, max_new_tokens, ignore_eos):
            log.append(("generate", ignore_eos))
            ledger = self.reset_ledger()
            stop = eos_at is not None and not (ignore_eos and honours_ignore_eos)
            n = min(eos_at, max_new_tokens) if stop else max_new_tokens
            steps = ([PREFILL_S] + [FIRST_S] * 2 + [STEADY_S] * max_new_tokens)[:n]
            return DecodeResult(self.name, list(prompt), [7] * n, ledger, sum(steps), steps)

        def synchronize(self):
            log.append("sync")

    if takes_ignore_eos:
        class Generating(Peer):
            name = "fake-gpu-peer"

            def generate(self, prompt, max_new_tokens, audit=False, ignore_eos=False):
                return self._generate(prompt, max_new_tokens, ignore_eos)
    else:
        class Generating(Peer):
            name = "fake-gpu-peer"

            def generate(self, prompt, max_new_tokens, audit=False):
                return self._generate(prompt, max_new_tokens, False)
    return Generating


def test_a_black_box_gpu_peer_is_benched_beside_the_others(packages):
    log, measured_at = [], []
    rows = by_engine(hb.bench([gpu_peer(log, eos_at=3), "native-host"], [SMALL], repeats=2,
                              max_new_tokens=8, ignore_eos=True,
                              bandwidth=fake_bandwidth(4000.0, measured_at)))
    row = rows["fake-gpu-peer"]
    assert row.measured and row.residency == "cuda:0" and row.new_tokens == 8, row.reason
    # its own synchronize around every decode (1 warm-up, 2 timed), each asked to go on
    # past eos, and once more before its device's bandwidth is measured
    assert log == ["sync", ("generate", True), "sync"] * 3 + ["sync"]
    # prefill apart from the steady decode; the two slow first steps are the warm-up
    assert row.prefill_ms == pytest.approx(1000 * PREFILL_S)
    assert row.decode_ms == pytest.approx(1000 * STEADY_S)
    assert row.decode_tokens_per_s == pytest.approx(1 / STEADY_S)
    assert row.decode_steps == 2 * (8 - 1 - hb.WARMUP_STEPS) and row.tokens_per_step == 1.0
    # the mean: every step after the prefill, the slow first two too, over their tokens
    assert row.decode_mean_ms == pytest.approx(1000 * (2 * FIRST_S + 5 * STEADY_S) / 7)
    # the floor: the package's weight bytes over its device's bandwidth, measured once
    assert sorted(measured_at) == ["cuda:0", "host"]
    assert row.bandwidth_gb_s == 4000.0
    assert row.weight_bytes == hb.weight_bytes(packages[SMALL])
    assert row.floor_ms == pytest.approx(1000 * row.weight_bytes / 4000e9)
    assert row.x_floor == pytest.approx(row.decode_ms / row.floor_ms)
    # and a ratio to the baseline timed in the same run
    assert row.ratio == pytest.approx(row.tokens_per_s_median
                                      / rows["ort-cpu"].tokens_per_s_median)
    assert row.decode_ratio == pytest.approx(row.decode_tokens_per_s
                                             / rows["ort-cpu"].decode_tokens_per_s)


def test_a_peer_that_stops_at_eos_under_ignore_eos_is_an_error_not_a_speed():
    rows = by_engine(hb.bench([gpu_peer([], eos_at=3, honours_ignore_eos=False)], [SMALL],
                              repeats=1, max_new_tokens=8, ignore_eos=True, bandwidth=FAKE_BW))
    row = rows["fake-gpu-peer"]
    assert row.status == hb.ERROR and row.ratio is None
    assert "produced 3 of 8 tokens under --ignore-eos" in row.reason
    assert rows["ort-cpu"].measured


def test_a_peer_whose_generate_takes_no_ignore_eos_says_so():
    rows = by_engine(hb.bench([gpu_peer([], eos_at=3, takes_ignore_eos=False)], [SMALL],
                              repeats=1, max_new_tokens=8, ignore_eos=True, bandwidth=FAKE_BW))
    row = rows["fake-gpu-peer"]
    assert row.status == hb.ERROR and "TypeError" in row.reason
    assert "bench it without --ignore-eos" in row.reason
    rows = by_engine(hb.bench([gpu_peer([], eos_at=3, takes_ignore_eos=False)], [SMALL],
                              repeats=1, max_new_tokens=8, bandwidth=FAKE_BW))
    row = rows["fake-gpu-peer"]  # without --ignore-eos it is timed, up to its eos
    assert row.measured and row.new_tokens == 3 and "eos after 3 of 8 tokens" in row.reason


def test_a_black_box_is_timed_greedily_beside_speculation_it_cannot_run():
    """Speculative mode: a peer that decodes by itself gets its greedy row on the same
    prompts (the table's peer) and an unavailable speculative row; it never speculates."""
    log: list = []
    rows = {(r.engine, r.mode): r for r in hb.bench(
        [gpu_peer(log), "native-host"], [SMALL], mode="speculative", width=2, repeats=1,
        max_new_tokens=8, bandwidth=FAKE_BW)}
    row = rows["fake-gpu-peer", "chained/w2"]
    assert row.status == hb.UNAVAILABLE and "declares no speculative decoding" in row.reason
    assert rows["fake-gpu-peer", "greedy"].measured
    assert log.count(("generate", False)) == 2  # one greedy warm-up, one timed greedy decode
    assert rows["native-host", "greedy"].measured and rows["native-host", "chained/w2"].measured


def test_no_bandwidth_means_no_floor_and_a_note():
    rows = by_engine(hb.bench([gpu_peer([])], [SMALL], repeats=1, max_new_tokens=8,
                              bandwidth=fake_bandwidth(None)))
    row = rows["fake-gpu-peer"]
    assert row.measured and row.floor_ms is None and row.x_floor is None
    assert row.weight_bytes > 0 and "no floor: cuda:0 copy bandwidth" in row.reason


# -- the floor's parts ------------------------------------------------------------------------

def test_weight_bytes_are_the_initializers_bytes(packages):
    from onnx import numpy_helper

    for name in ("tiny_llama", "tiny_llama_static", SMALL):
        package = packages[name]
        model = package.component_model("target")
        expected = sum(numpy_helper.to_array(t).nbytes for t in model.graph.initializer)
        assert hb.weight_bytes(package) == expected > 0


def test_floor_ms_is_bytes_over_bandwidth():
    assert hb.floor_ms(270_000_000, 4250.0) == pytest.approx(1000 * 270e6 / 4250e9)


def test_host_bandwidth_is_a_numpy_copy():
    bw = hb.host_copy_bandwidth(nbytes=1 << 20, repeats=2)
    assert bw.residency == "host" and bw.gb_per_s > 0
    assert "numpy copy of 1 MiB" in bw.how and "median of 2" in bw.how


class FakeCupy:
    """Just the CuPy calls a device-to-device copy benchmark makes, recorded; each event
    pair reports the next of ``elapsed_ms``."""

    def __init__(self, elapsed_ms):
        calls, times = [], iter(elapsed_ms)
        self.calls = calls

        class Runtime:
            memcpyDeviceToDevice = 3

            @staticmethod
            def memsetAsync(ptr, value, n, stream):
                calls.append(("memset", ptr, n, stream))

            @staticmethod
            def memcpyAsync(dst, src, n, kind, stream):
                calls.append(("memcpy", dst, src, n, kind, stream))

        class Device:
            def __init__(self, index):
                calls.append(("device", index))

            def __enter__(self):
                return self

            def __exit__(self, *exc):
                return False

        class Stream:
            def __init__(self, non_blocking=False):
                self.ptr = 77
                calls.append(("stream", non_blocking))

            def synchronize(self):
                calls.append("stream.synchronize")

        class Memory:
            made = 0

            def __init__(self, size):
                Memory.made += 1
                self.ptr, self.size = 1000 * Memory.made, size

        class Event:
            def record(self, stream):
                calls.append(("record", stream.ptr))

            def synchronize(self):
                pass

        class Cuda:
            runtime = Runtime

        Cuda.Device, Cuda.Stream, Cuda.Memory, Cuda.Event = Device, Stream, Memory, Event
        Cuda.get_elapsed_time = staticmethod(lambda start, end: next(times))
        self.cuda = Cuda


def test_cuda_bandwidth_times_a_device_to_device_copy_with_events():
    fake = FakeCupy([1.0, 2.0, 4.0])
    bw = hb.cuda_copy_bandwidth(1, nbytes=1 << 20, repeats=3, cupy=fake)
    assert bw.residency == "cuda:1"
    assert bw.gb_per_s == pytest.approx(2 * (1 << 20) / 0.002 / 1e9)  # read + write, median
    copies = [c for c in fake.calls if c[0] == "memcpy"]
    assert len(copies) == 4  # one untimed, three timed
    assert all(c[3] == 1 << 20 and c[4] == 3 and c[5] == 77 and c[1] != c[2] for c in copies)
    assert ("device", 1) in fake.calls and ("stream", True) in fake.calls
    assert "device-to-device copy of 1 MiB on cuda:1" in bw.how


def test_bandwidth_where_nothing_can_measure_it_says_why(monkeypatch):
    assert hb.measure_bandwidth("sim:0").gb_per_s is None
    assert "no copy benchmark for residency 'sim:0'" in hb.measure_bandwidth("sim:0").how

    def no_cupy(*args, **kwargs):
        raise EngineUnavailable("CuPy is not importable", field="engine", value="cupy",
                                remedy="install cupy")

    monkeypatch.setattr(hb, "cuda_copy_bandwidth", no_cupy)
    bw = hb.measure_bandwidth("cuda:0")
    assert bw.gb_per_s is None and "not measured: CuPy is not importable" in bw.how


# -- hf-cuda: transformers on the GPU, seen from a CPU ----------------------------------------

def hf_available() -> bool:
    from engines.backends.hf import HfEngine

    return HfEngine.availability().ok


needs_hf = pytest.mark.skipif("not hf_available()", reason="the hf engine needs torch and "
                                                           "transformers (the 'hf' extra)")


def cpu_hf_cuda():
    """hf-cuda's own code (static cache, SDPA attention, its dtype rule, residency cuda:0)
    with the model on the CPU, so its path runs here."""
    from engines.backends.hf import HfCudaEngine, HfEngine

    class CpuHfCuda(HfCudaEngine):
        name = "hf-cuda-on-cpu"
        device = "cpu"

        @classmethod
        def availability(cls):
            return HfEngine.availability()

    return CpuHfCuda


def test_hf_cuda_is_a_builtin_black_box_declared_on_cuda():
    from engines.backends.hf import HfCudaEngine, HfEngine
    from engines.registry import BUILTIN, check_engine_class, get_engine_class

    assert BUILTIN["hf-cuda"] == "engines.backends.hf:HfCudaEngine"
    cls = get_engine_class("hf-cuda")
    assert cls is HfCudaEngine and check_engine_class(cls) is cls
    assert issubclass(cls, HfEngine) and cls.name == "hf-cuda" and cls.device == "cuda:0"
    caps = cls.capabilities()
    assert caps.residency == "cuda:0" and caps.decodes_itself and caps.logits_audit
    assert not caps.speculative and not caps.graph_slots
    assert cls.static_cache and cls.attention == "sdpa"
    assert HfEngine.static_cache is False and HfEngine.device == "cpu"
    # float16 for a float16 package, float32 for every other; hf keeps the package's
    assert [cls.default_dtype(d) for d in ("float16", "float32", "bfloat16")] == [
        "float16", "float32", "float32"]
    assert [HfEngine.default_dtype(d) for d in ("float16", "float32")] == ["float16", "float32"]


def test_hf_cuda_availability_without_cuda_is_false_with_the_reason(packages):
    from types import SimpleNamespace

    from engines.backends.hf import HfCudaEngine, cuda_availability

    def fake_torch(version, cuda, devices):
        return SimpleNamespace(
            __version__=version, version=SimpleNamespace(cuda=cuda),
            cuda=SimpleNamespace(is_available=lambda: devices > 0,
                                 device_count=lambda: devices,
                                 get_device_name=lambda i: "NVIDIA H200"))

    cpu_build = cuda_availability(fake_torch("2.13.0+cpu", None, 0))
    assert not cpu_build.ok and "CPU-only build" in cpu_build.reason
    no_gpu = cuda_availability(fake_torch("2.11.0+cu130", "13.0", 0))
    assert not no_gpu.ok and "sees no CUDA device" in no_gpu.reason
    gpu = cuda_availability(fake_torch("2.11.0+cu130", "13.0", 1))
    assert gpu.ok and "NVIDIA H200" in gpu.reason

    here = HfCudaEngine.availability()
    try:
        import torch
    except ImportError:
        assert not here.ok and "is not installed" in here.reason
        return
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    assert not here.ok and here.reason
    with pytest.raises(EngineUnavailable, match="hf-cuda needs CUDA"):
        HfCudaEngine(packages["tiny_llama"])
    rows = by_engine(hb.bench(["hf-cuda"], [SMALL], repeats=1, max_new_tokens=NEW,
                              bandwidth=FAKE_BW))
    assert rows["hf-cuda"].status == hb.UNAVAILABLE and rows["hf-cuda"].reason == here.reason


@needs_hf
def test_hf_cuda_is_refused_for_speculation():
    from harness.runner import run_matrix

    summary = run_matrix([cpu_hf_cuda()], ["tiny_llama_pair"], None, 4, mode="speculative",
                         widths=[1], max_prompts=1)
    assert summary.cells == []
    assert "declares no speculative decoding" in summary.left_out[0].reason


@pytest.fixture(scope="module")
def converted(tmp_path_factory):
    """A tiny GGUF converted by lockstep convert (hf loads converted checkpoints only), and
    the same package with an eos its greedy stream emits at once."""
    from harness.convert.conversion import convert
    from suites.convert_support import write_tiny_gguf

    folder = tmp_path_factory.mktemp("hf")
    package = load_package(convert(write_tiny_gguf(folder / "tiny.gguf"), folder / "p").folder)
    prompt = list(package.spec.prompts[0])
    first = greedy_decode(OrtCpuEngine(package), prompt, 1).tokens[0]
    eos = with_eos(package.root, folder / "eos", first, "tiny_eos")
    return package, eos, prompt


def test_weight_bytes_of_external_data_are_not_loaded(converted):
    from onnx import numpy_helper

    package = converted[0]
    model = package.component_model("target")
    assert hb.weight_bytes(package) == sum(numpy_helper.to_array(t).nbytes
                                           for t in model.graph.initializer)


@needs_hf
def test_hf_cuda_code_path_agrees_with_the_oracle_on_a_cpu(converted):
    """Static cache, SDPA and residency cuda:0 (the audit in a separate decode), on the CPU."""
    from harness.runner import run_matrix

    package = converted[0]
    cls = cpu_hf_cuda()
    engine = cls(package)
    assert engine.use_static_cache and engine.dtype_name == "float32"
    assert cls(package, dtype="float16", static_cache=False).dtype_name == "float16"
    with pytest.raises(InputError, match="computes in"):
        cls(package, dtype="int8")
    summary = run_matrix([cls], [str(package.root)], None, 6, max_prompts=1)
    cell = summary.cells[0]
    assert cell.status == "identical", cell.reason
    assert cell.audit is not None and cell.audit.decode == "separate"


@needs_hf
def test_hf_cuda_is_timed_in_a_bfloat16_packages_own_dtype(tmp_path):
    """Parity runs keep hf-cuda's float32 for a bfloat16 package (its records say so); the
    bench builds it for speed (``Engine.for_speed``) in bfloat16, and its row says so."""
    from harness.convert.conversion import convert
    from suites.convert_support import write_tiny_gguf

    package = load_package(convert(write_tiny_gguf(tmp_path / "tiny.gguf"), tmp_path / "bf16",
                                   dtype="bfloat16").folder)
    cls = cpu_hf_cuda()
    parity = cls(package)
    assert parity.compute_dtype() == parity.provenance()["dtype"] == "float32"
    rows = hb.bench([cls], [package], baseline=cls, repeats=1, max_new_tokens=3,
                    bandwidth=FAKE_BW)
    assert [(r.engine, r.compute_dtype, r.status) for r in rows] == [
        ("hf-cuda-on-cpu", "bfloat16", hb.OK)]


def test_an_engine_computes_in_its_scheme_or_its_packages_dtype(packages):
    class Scheme(OrtCpuEngine):
        name = "scheme"

        def numeric_scheme(self):
            return "onnxruntime-cpu:some-int4"

    package = packages["tiny_llama"]
    assert OrtCpuEngine(package).compute_dtype() == "float32"
    assert Scheme(package).compute_dtype() == "onnxruntime-cpu:some-int4"
    assert isinstance(OrtCpuEngine.for_speed(package), OrtCpuEngine)


@needs_hf
@pytest.mark.parametrize("which", ["hf", "hf-cuda-on-cpu"])
def test_hf_goes_on_past_eos_only_when_asked(converted, which):
    from engines.registry import get_engine_class

    _package, eos_package, prompt = converted
    cls = cpu_hf_cuda() if which == "hf-cuda-on-cpu" else get_engine_class("hf")
    engine = cls(eos_package)
    stopped = greedy_decode(engine, prompt, 6)
    assert stopped.tokens == [eos_package.spec.eos_id]  # eos at once: the parity run stops
    kept = greedy_decode(engine, prompt, 6, ignore_eos=True, audit=True)
    assert len(kept.tokens) == 6 and len(kept.step_s) == 6 and len(kept.logits) == 6
    assert kept.tokens[0] == eos_package.spec.eos_id
    assert kept.tokens == greedy_decode(OrtCpuEngine(eos_package), prompt, 6,
                                        ignore_eos=True).tokens
    engine.synchronize()  # nothing queued on a CPU
    engine.close()


@needs_hf
def test_the_bench_times_hf_cuda_code_beside_the_interpreter_engines(converted):
    _package, eos_package, _prompt = converted
    rows = by_engine(hb.bench([cpu_hf_cuda(), "native-host"], [eos_package], repeats=2,
                              max_new_tokens=6, ignore_eos=True, bandwidth=FAKE_BW))
    assert set(rows) == {"hf-cuda-on-cpu", "native-host", "ort-cpu"}
    for row in rows.values():
        assert row.measured and row.new_tokens == 6, (row.engine, row.reason)
        assert row.prefill_ms > 0 and row.decode_ms > 0 and row.floor_ms > 0
    assert rows["hf-cuda-on-cpu"].residency == "cuda:0"
