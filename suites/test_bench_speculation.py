"""``lockstep bench`` over prompt sets, and speculative rows beside greedy ones.

A prompt set is its own rows; a timed pass decodes each of its prompts, and its tokens/s is
their tokens over their summed wall time. In speculative mode every engine is timed greedily
and speculatively on the same prompts: the speculative row carries its rounds and accept rate
(what the decodes did, not an estimate), its tokens/s over the greedy row's, and whether its
tokens are greedy's; a batch-invariant engine whose streams part is an error, not a speed.
"""
from __future__ import annotations

import json

import pytest

from engines.errors import InputError
from engines.workflow.speculative import speculative_decode
from harness import bench as hb
from harness.bench_speculation import round_figures
from harness.packages import resolve_package
from suites.lookup_support import with_prompt_lookup
from suites.support import one_line_error
from suites.test_bench import FAKE_BW

NEW = 12
WIDTH = 4


@pytest.fixture(scope="module")
def lookup(tmp_path_factory):
    """tiny_llama_static with a prompt-lookup section, and two prompt sets of ids."""
    folder = tmp_path_factory.mktemp("bench-lookup")
    package = with_prompt_lookup(resolve_package("tiny_llama_static").root, folder / "pkg",
                                 WIDTH)
    prompts = [list(p) for p in package.spec.prompts]
    sets = {}
    for name, chosen in (("three", prompts), ("one", prompts[1:2])):
        path = folder / f"{name}.jsonl"
        path.write_text("".join(json.dumps({"name": f"{name}{i}", "ids": ids}) + "\n"
                                for i, ids in enumerate(chosen)))
        sets[name] = path
    return package, sets


def rows_of(rows):
    return {(r.engine, r.prompt_set, r.mode): r for r in rows}


@pytest.mark.parametrize("pipelined", [False, True], ids=["classic", "pipelined"])
def test_speculative_rows_stand_beside_greedy_with_their_rounds(lookup, pipelined,
                                                                monkeypatch):
    """Without ``--pipelined`` the rows are the classic loop's; with it a prompt-lookup
    decode on a device shifts its rounds (``engines.workflow.speculative``; here host ops
    read ids as a device does), the rows counting those."""
    from engines.tensor_ops.host import HostTensorOps

    monkeypatch.setattr(HostTensorOps, "asynchronous_ids", True)
    package, sets = lookup
    rows = rows_of(hb.bench(["native-host"], [package], mode="speculative",
                            prompt_sets=[sets["three"]], repeats=2, max_new_tokens=NEW,
                            baseline="native-host", bandwidth=FAKE_BW, pipelined=pipelined))
    label = f"prompt-lookup/w{WIDTH}"
    assert set(rows) == {("native-host", "three", "greedy"), ("native-host", "three", label)}
    greedy, spec = rows["native-host", "three", "greedy"], rows["native-host", "three", label]
    for row in (greedy, spec):
        assert row.measured and row.compute_dtype == "float32", row.reason
        assert list(row.prompts) == ["three0", "three1", "three2"]
        assert row.new_tokens == 3 * NEW and row.repeats == 2
    assert greedy.rounds is None and greedy.accept_rate is None and greedy.greedy_ratio is None
    assert spec.greedy_ratio == spec.tokens_per_s_median / greedy.tokens_per_s_median
    assert spec.same_tokens is True
    # what the decodes did: the same rounds decoded again, outside the bench
    from engines.registry import get_engine_class

    engine = get_engine_class("native-host")(package)
    again = [speculative_decode(engine, ids, NEW, WIDTH, pipelined=pipelined)
             for ids in spec.prompts.values()]
    assert any(any(r.shifted_per_round) for r in again) is pipelined
    figures = round_figures(again)
    assert {k: getattr(spec, k) for k in figures} == figures
    accepted = sum(sum(r.acceptance_per_round) for r in again)
    drafted = sum(sum(r.widths_per_round) for r in again)
    assert spec.accept_rate == accepted / drafted and 0 < spec.accept_rate < 1
    assert spec.rounds == sum(len(r.widths_per_round) for r in again) > 0


def test_a_pass_rate_is_its_prompts_tokens_over_their_summed_walls(lookup, monkeypatch):
    """Each decode between two synchronisations: a pass's tokens/s is the tokens of all its
    prompts over the sum of their walls (here scripted: 10 ms a prompt token)."""
    package, sets = lookup
    real = hb.timed_decode

    def scripted(engine, prompt, *args, **kwargs):
        result, _ = real(engine, prompt, *args, **kwargs)
        return result, 0.01 * len(prompt)

    monkeypatch.setattr(hb, "timed_decode", scripted)
    (row,) = hb.bench(["native-host"], [package], prompt_sets=[sets["three"]], repeats=1,
                      max_new_tokens=NEW, baseline="native-host", bandwidth=FAKE_BW)
    walls = sum(0.01 * len(ids) for ids in row.prompts.values())
    assert row.tokens_per_s == [3 * NEW / walls]


@pytest.mark.claim("spec_equals_greedy")
def test_a_speculative_stream_that_leaves_greedy_is_no_speed(lookup, monkeypatch):
    """A planted bug in the speculative path (its last token changed): on native-host, which
    declares batch invariance, the row is an error naming claim 2; on ort-cpu, which does
    not, it is timed, says where the streams part, and its tokens are not greedy's."""
    package, sets = lookup
    real = hb.speculative_decode

    def planted(*args, **kwargs):
        result = real(*args, **kwargs)
        result.tokens[-1] = (result.tokens[-1] + 1) % package.spec.vocab_size
        return result

    monkeypatch.setattr(hb, "speculative_decode", planted)
    rows = rows_of(hb.bench(["native-host"], [package], mode="speculative",
                            prompt_sets=[sets["one"]], repeats=1, max_new_tokens=NEW,
                            bandwidth=FAKE_BW))
    label = f"prompt-lookup/w{WIDTH}"
    native = rows["native-host", "one", label]
    assert native.status == hb.ERROR and "claim 2" in native.reason
    assert f"one0 step {NEW - 1}" in native.reason
    ort = rows["ort-cpu", "one", label]
    assert ort.measured and ort.same_tokens is False
    assert f"part at one0 step {NEW - 1}" in ort.reason
    assert rows["native-host", "one", "greedy"].measured


def test_each_prompt_set_is_its_own_rows_with_its_own_ratios(lookup):
    package, sets = lookup
    plan = hb.plan_bench(["native-host"], [package], prompt_sets=[sets["three"], sets["one"]],
                         repeats=1, max_new_tokens=NEW)
    assert [(t.prompt_set, len(t.prompts)) for t in plan.targets] == [("three", 3), ("one", 1)]
    advanced = []
    rows = hb.run_bench(plan, lambda n, text: advanced.append(n), bandwidth=FAKE_BW)
    # per engine: one warm-up and one timed pass over each set's prompts
    assert sum(advanced) == plan.total_decodes == 2 * 2 * (3 + 1)
    by = rows_of(rows)
    for name in ("three", "one"):
        native, base = by["native-host", name, "greedy"], by["ort-cpu", name, "greedy"]
        assert native.ratio == native.tokens_per_s_median / base.tokens_per_s_median
    again = sets["one"].parent / "again" / "one.jsonl"  # another file of the same name
    again.parent.mkdir(exist_ok=True)
    again.write_text(sets["one"].read_text())
    for bad in ({"prompt": [1, 2], "prompt_sets": [sets["one"]]},
                {"prompt_sets": [sets["one"], again]}):
        with pytest.raises(InputError) as err:
            hb.plan_bench(["native-host"], [package], **bad)
        assert err.value.field == "prompt_sets"


def test_cli_bench_times_prompt_sets_beside_greedy(lookup, tmp_path, capsys, monkeypatch):
    from harness.cli import main

    package, sets = lookup
    monkeypatch.setenv("COLUMNS", "240")
    monkeypatch.setattr(hb, "measure_bandwidth", FAKE_BW)
    out = tmp_path / "bench.json"
    assert main(["bench", "--mode", "speculative", "--engines", "native-host", "--baseline",
                 "native-host", "--packages", str(package.root), "--prompts",
                 f"{sets['one']},{sets['three']}", "--repeats", "1", "--max-new-tokens",
                 str(NEW), "--pipelined", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    for column in ("prompts", "dtype", "accept", "x greedy", "same", "pipelined"):
        assert column in text
    doc = json.loads(out.read_text())
    assert doc["format"] == hb.FORMAT == 3
    assert doc["settings"]["prompt_sets"] == ["one", "three"]
    assert [(r["prompt_set"], r["mode"]) for r in doc["rows"]] == [
        (s, m) for s in ("one", "three") for m in ("greedy", f"prompt-lookup/w{WIDTH}")]
    from reports import render_report

    html = render_report([], bench=[out])  # the report's speed table shows the same rows
    spec = doc["rows"][3]  # three prompts: rounds with accepted drafts
    assert f"{spec['accept_rate'] * 100:.0f}%" in html and f"{spec['greedy_ratio']:.2f}x" in html
    assert ">yes<" in html and ">one<" in html
    error = one_line_error(capsys, ["bench", "--engines", "native-host", "--packages",
                                    "tiny_llama", "--prompts", "grounded"])
    assert "has no tokenizer" in error and "grounded.jsonl:1" in error


def test_an_engine_is_built_once_for_every_prompt_set_of_a_package(lookup):
    """Its prompt sets share a package's engines: built once (``for_speed``), warmed up on
    each set's prompts, closed once after the last set was timed."""
    from engines.backends.ort_cpu import OrtCpuEngine

    package, sets = lookup
    log = []

    class Counted(OrtCpuEngine):
        name = "counted"

        @classmethod
        def for_speed(cls, package):
            log.append("built")
            return super().for_speed(package)

        def close(self):
            log.append("closed")
            super().close()

    rows = hb.bench([Counted], [package], prompt_sets=[sets["three"], sets["one"]], repeats=1,
                    max_new_tokens=NEW, baseline=Counted, bandwidth=FAKE_BW)
    assert log == ["built", "closed"]
    assert [(r.prompt_set, r.measured) for r in rows] == [("three", True), ("one", True)]


@pytest.mark.parametrize("width", [60, 100, 200])
def test_a_table_wider_than_its_console_folds_a_name_and_never_drops_it(width):
    """``print_table``: where the columns' least widths exceed the console, the table is laid
    out that wide (rich would squeeze the folding package column to nothing); where they
    fit, a long name folds onto more lines; every character is printed either way."""
    from rich.console import Console
    from rich.table import Table

    from harness.cli.tables import print_table

    name = "SmolLM2-135M-Instruct.Q4_1-static-float16-lookup8"
    table = Table()
    for col in ("engine", "package", "a", "b", "c", "d", "e", "f"):
        table.add_column(col, no_wrap=col != "package",
                         overflow="fold" if col == "package" else "ellipsis")
    table.add_row("native-cuda", name, *["12345.678"] * 6)
    console = Console(width=width, record=True, file=open("/dev/null", "w"))
    print_table(console, table)
    body = [line.split("│") for line in console.export_text().splitlines() if "│" in line]
    assert "".join(cells[2].strip() for cells in body) == name
    assert body[0][1].strip() == "native-cuda" and body[0][3].strip() == "12345.678"


def test_pipelined_in_speculative_mode_pipelines_the_greedy_rows(lookup, monkeypatch):
    """``--pipelined --mode speculative``: the greedy rows beside the speculative ones run
    the pipelined loop (the best greedy loop, against the speculative one), the speculative
    rows their own (a round reads its accept count back before the next)."""
    package, sets = lookup
    asked = []
    greedy = hb.greedy_decode
    monkeypatch.setattr(hb, "greedy_decode", lambda *a, pipelined=False, **k: (
        asked.append(pipelined) or greedy(*a, pipelined=pipelined, **k)))
    rows = hb.bench(["native-host"], [package], mode="speculative", prompt_sets=[sets["one"]],
                    repeats=1, max_new_tokens=NEW, baseline="native-host", pipelined=True,
                    bandwidth=FAKE_BW)
    assert asked == [True, True] and all(r.measured for r in rows)  # a warm-up, a timed one
