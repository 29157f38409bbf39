"""Bad input: each a clear error naming the field, the value and the remedy; no deep traceback."""
from __future__ import annotations

import pytest

from engines.backends.native_host import NativeHostEngine
from engines.errors import InputError, PackageError, UnknownEngine
from engines.workflow import greedy_decode
from harness.cli import main


@pytest.fixture(scope="module")
def lookup(packages):
    return packages["lookup_chained"]


@pytest.mark.parametrize("engine_name", ["native-host", "ort-cpu"])
@pytest.mark.parametrize("prompt, field, needle", [
    (lambda v: [1, v], "prompt[1]", "out of range"),
    (lambda v: [1, -1], "prompt[1]", "out of range"),
    (lambda v: [], "prompt", "empty"),
])
def test_bad_prompt_ids(lookup, engine_cache, engine_name, prompt, field, needle):
    engine = engine_cache(engine_name, lookup)
    vocab = lookup.spec.vocab_size
    with pytest.raises(InputError) as info:
        greedy_decode(engine, prompt(vocab), 4)
    err = info.value
    assert err.field == field
    assert needle in str(err)
    assert err.remedy


def test_prompt_longer_than_context(lookup, engine_cache):
    engine = engine_cache("native-host", lookup)
    n = lookup.spec.max_context + 1
    with pytest.raises(InputError) as info:
        greedy_decode(engine, [1] * n, 1)
    assert info.value.field == "prompt"
    assert str(lookup.spec.max_context) in info.value.remedy


def test_new_tokens_past_context(lookup, engine_cache):
    engine = engine_cache("native-host", lookup)
    with pytest.raises(InputError) as info:
        greedy_decode(engine, [1, 2], lookup.spec.max_context)
    assert info.value.field == "max_new_tokens"
    assert str(lookup.spec.max_context - 2) in info.value.remedy


def test_unknown_engine_names_the_valid_ones():
    from engines.registry import get_engine_class

    with pytest.raises(UnknownEngine) as info:
        get_engine_class("warp-drive")
    assert info.value.value == "warp-drive"
    assert "native-host" in info.value.remedy


def test_missing_package(tmp_path):
    from harness.packages import resolve_package

    with pytest.raises(PackageError) as info:
        resolve_package(tmp_path / "nowhere")
    assert "lookup_chained" in info.value.remedy


@pytest.mark.parametrize("argv, needle", [
    (["run", "--engines", "warp-drive", "--packages", "lookup_chained", "--no-evidence"], "warp-drive"),
    (["run", "--packages", "/nonexistent/pkg", "--engines", "native-host", "--no-evidence"], "no such package"),
    (["run", "--packages", "lookup_chained", "--engines", "native-host", "--prompt", "1 999",
      "--no-evidence"], "prompt[1]"),
    (["run", "--packages", "lookup_chained", "--engines", "native-host", "--prompt", "1 x",
      "--no-evidence"], "--prompt"),
])
def test_cli_reports_errors_in_one_line(capsys, argv, needle):
    status = main(argv)
    err = capsys.readouterr().err
    assert status == 2
    assert needle in err
    assert "Traceback" not in err


@pytest.mark.parametrize("field, value, kwargs", [
    ("max_prompts", 0, {"max_prompts": 0}),
    ("max_prompts", -1, {"max_prompts": -1}),
    ("max_new_tokens", 0, {"max_new_tokens": 0}),
])
def test_run_matrix_refuses_counts_below_one_before_anything_is_built(monkeypatch, tmp_path,
                                                                      field, value, kwargs):
    """The library refuses what ``lockstep run --max-prompts 0`` refuses (0 prompts would
    mean all of them, -1 all but the last), with the same check, before an engine or a
    package is touched."""
    from harness import runner

    def untouched(*args, **kw):
        raise AssertionError("reached past the count check")

    monkeypatch.setattr(runner, "resolve_engines", untouched)
    monkeypatch.setattr(runner, "resolve_package", untouched)
    call = {"max_new_tokens": 2, "max_prompts": 1, **kwargs}
    with pytest.raises(InputError) as info:
        runner.run_matrix(["native-host"], ["lookup_chained"], None, call["max_new_tokens"],
                          tmp_path / "evidence", max_prompts=call["max_prompts"])
    err = info.value
    assert (err.field, err.value) == (field, value)
    assert f"[field {field} = {value!r}]" in str(err)
    assert err.remedy
    assert not (tmp_path / "evidence").exists()


# -- one engine named twice, in two spellings --------------------------------------------------

NATIVE_HOST_REF = "engines.backends.native_host:NativeHostEngine"


@pytest.mark.parametrize("engines, first, second", [
    (["native-host", NATIVE_HOST_REF], "'native-host'", repr(NATIVE_HOST_REF)),
    ([NATIVE_HOST_REF, "ort-cpu", "native-host"], repr(NATIVE_HOST_REF), "'native-host'"),
    (["native-host", NativeHostEngine], "'native-host'", f"class {NATIVE_HOST_REF}"),
    (["native-host", "native-host"], None, None),
])
def test_run_matrix_refuses_one_engine_named_twice_before_anything_runs(monkeypatch, tmp_path,
                                                                        engines, first, second):
    """Two spellings of one class (a registered name, a ``module:Class`` reference, the class
    itself) would be keyed by the one engine name and merge silently: the matrix would run the
    engine once where the list names it twice. Refused like the same spelling twice, before a
    package is resolved or an evidence folder written."""
    from harness import runner

    def untouched(*args, **kw):
        raise AssertionError("reached past the engine check")

    monkeypatch.setattr(runner, "resolve_package", untouched)
    with pytest.raises(InputError) as info:
        runner.run_matrix(engines, ["lookup_chained"], None, 2, tmp_path / "evidence",
                          max_prompts=1)
    err = info.value
    assert err.field == "engines" and err.remedy
    assert "twice" in err.message
    if first is not None:
        assert f"as {first} and as {second}" in err.message
        assert "engines.backends.native_host.NativeHostEngine" in err.message
    assert not (tmp_path / "evidence").exists()


def test_run_matrix_refuses_two_classes_under_one_name(tmp_path):
    """Two different classes with one ``name`` would record into one engine's cells."""
    from engines.backends.ort_cpu import OrtCpuEngine
    from harness.runner import run_matrix

    class One(OrtCpuEngine):
        name = "same-name"

    class Other(OrtCpuEngine):
        name = "same-name"

    with pytest.raises(InputError) as info:
        run_matrix([One, Other], ["lookup_chained"], None, 2, tmp_path / "evidence")
    assert "two different engine classes are named 'same-name'" in info.value.message
    assert not (tmp_path / "evidence").exists()


@pytest.mark.parametrize("engines", [
    ["native-host", NATIVE_HOST_REF],
    ["native-host", "native-host"],
    ["native-host", "ort-cpu", "engines.backends.ort_cpu:OrtCpuEngine"],
])
def test_plan_bench_refuses_one_engine_named_twice(engines):
    """The bench would time the one class twice, one row under the reference's text."""
    from harness.bench import plan_bench

    with pytest.raises(InputError) as info:
        plan_bench(engines, ["lookup_chained"], repeats=1, max_new_tokens=2)
    assert info.value.field == "engines" and "twice" in info.value.message
    assert info.value.remedy


def test_plan_bench_baseline_in_another_spelling_joins_its_engine():
    """The baseline named as a reference is the listed engine, not a second one."""
    from harness.bench import plan_bench

    plan = plan_bench(["native-host", "ort-cpu"], ["lookup_chained"], repeats=1,
                      max_new_tokens=2, baseline="engines.backends.ort_cpu:OrtCpuEngine")
    assert [name for name, _ in plan.engines] == ["native-host", "ort-cpu"]
    assert plan.baseline == "ort-cpu"
