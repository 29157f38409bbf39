"""``lockstep bench-forward``: what it measures and refuses (never how fast anything is)."""
from __future__ import annotations

import pytest

from engines.errors import InputError
from harness.cli import main
from harness.forward_bench import bench_forwards, prompt_of_length, start_up_length


@pytest.fixture(scope="module")
def rows():
    return bench_forwards(["ort-cpu", "native-host"], ["tiny_llama"], prefill=[12],
                          rows=[1, 3], prefix=6, repeats=3, warmup=1)


def test_every_shape_of_every_engine_is_timed(rows):
    shapes = {(r.engine, r.kind, r.tokens, r.prefix) for r in rows}
    assert shapes == {(e, k, n, p) for e in ("ort-cpu", "native-host")
                      for k, n, p in (("prefill", 12, 0), ("rows", 1, 6), ("rows", 3, 6))}
    for r in rows:
        assert r.status == "ok", r.reason
        assert len(r.times_ms) == 3 and r.ms == sorted(r.times_ms)[1]
        assert r.first_ms is not None and r.first_ms > 0  # the shape's first forward


def test_the_start_up_prefill_has_a_length_no_timed_shape_has(monkeypatch):
    """An engine's own first-forward costs go to one untimed prefill first, so that each
    row's first_ms is its shape's; its length differs from every timed one (a step memo
    or a graph keyed by that shape would otherwise be made by it)."""
    import harness.forward_bench as fb
    from engines.registry import get_engine_class

    base = get_engine_class("native-host")
    seen: list[tuple[str, int]] = []

    class Logged(base):
        def run_component(self, component, feeds, phase=None):
            seen.append((phase, next(v.shape[1] for k, v in feeds.items()
                                     if k == "input_ids")))
            return super().run_component(component, feeds, phase=phase)

    monkeypatch.setattr(fb, "get_engine_class", lambda name: Logged)
    fb.bench_forwards(["native-host"], ["tiny_llama_static"], prefill=[2, 5], rows=[1, 3],
                      prefix=4, repeats=1, warmup=0)
    # prefills of 2 and 5, rows of 1 and 3 after a prefix of 4: 6 is the first free length
    assert seen[0] == ("prefill", 6)
    assert all(m != 6 for _, m in seen[1:])


def test_start_up_length_skips_taken_lengths_and_respects_max_context():
    spec = type("Spec", (), {"max_context": 4})()
    assert start_up_length(spec, [2, 3], [], 0) == 4
    assert start_up_length(spec, [2], [1], 3) == 4  # the rows' prefix is taken too
    assert start_up_length(spec, [2, 3, 4], [1], 0) is None
    unbounded = type("Spec", (), {"max_context": None})()
    assert start_up_length(unbounded, [2, 3], [1, 4], 5) == 6


def test_no_warm_up_leaves_first_ms_empty():
    (row,) = [r for r in bench_forwards(["native-host"], ["tiny_llama"], prefill=[6], rows=[],
                                        repeats=1, warmup=0)]
    assert row.status == "ok" and row.first_ms is None


def test_ratios_are_taken_within_the_run(rows):
    by = {(r.engine, r.kind, r.tokens): r for r in rows}
    for engine in ("ort-cpu", "native-host"):
        one, three = by[(engine, "rows", 1)], by[(engine, "rows", 3)]
        assert one.ratio == 1.0
        assert three.ratio == pytest.approx(three.ms / one.ms)
    base = by[("ort-cpu", "prefill", 12)]
    assert by[("native-host", "prefill", 12)].ratio == pytest.approx(
        by[("native-host", "prefill", 12)].ms / base.ms)


def test_engines_agree_on_the_token_each_forward_ends_with(rows):
    """Every repeat starts from the same cache, so each engine reads back one token per
    shape, and two correct engines read back the same one."""
    by = {(r.engine, r.kind, r.tokens): r.token for r in rows}
    for kind, n in (("prefill", 12), ("rows", 1), ("rows", 3)):
        assert by[("ort-cpu", kind, n)] == by[("native-host", kind, n)] is not None


def test_prompt_is_the_packages_ids_repeated():
    from harness.packages import resolve_package

    spec = resolve_package("tiny_llama").spec
    pool = [t for p in spec.prompts for t in p]
    ids = prompt_of_length(spec, len(pool) + 3)
    assert ids == pool + pool[:3]


def test_a_forward_past_max_context_is_refused():
    from harness.packages import resolve_package

    spec = resolve_package("tiny_llama").spec
    with pytest.raises(InputError) as err:
        bench_forwards(["native-host"], ["tiny_llama"], rows=[2], prefix=spec.max_context)
    assert err.value.field == "prefix" and "max_context" in str(err.value)
    with pytest.raises(InputError) as err:
        bench_forwards(["native-host"], ["tiny_llama"], prefill=[spec.max_context + 1])
    assert err.value.field == "prefill" and err.value.value == spec.max_context + 1


@pytest.mark.parametrize("value", ["0", "1,x", "2,2", "-1"])
def test_bad_lengths_are_one_line_and_exit_2(value, capsys):
    assert main(["bench-forward", "--engines", "native-host", "--packages", "tiny_llama",
                 "--rows", value]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--rows" in err[0]


def test_each_shape_runs_as_one_block_so_a_graph_slot_keeps_its_signature(monkeypatch):
    """A graph slot holds one signature: the verifications of one M (warm-up and timed
    repeats) must run back to back, never interleaved with another M's, or every timed
    forward would recapture (the first H200 run of this bench timed captures that way)."""
    import harness.forward_bench as fb
    from engines.registry import get_engine_class

    base = get_engine_class("native-host")
    seen: list[tuple[str, int]] = []

    class Logged(base):
        def run_component(self, component, feeds, phase=None):
            m = next(v.shape[1] for k, v in feeds.items() if k == "input_ids")
            if phase != "prefill":
                seen.append((phase, m))
            return super().run_component(component, feeds, phase=phase)

    monkeypatch.setattr(fb, "get_engine_class", lambda name: Logged)
    fb.bench_forwards(["native-host"], ["tiny_llama_static"], rows=[1, 2, 3], prefix=4,
                      repeats=3, warmup=2)
    blocks = [key for i, key in enumerate(seen) if i == 0 or seen[i - 1] != key]
    assert blocks == [("decode", 1), ("verify", 2), ("verify", 3)]
    assert len(seen) == 3 * (3 + 2)
