"""``lockstep calibrate`` and the quantized band (claim 1d, ``docs/QUANTIZED.md``).

Facts, without an engine: a band's bounds are twice the worst observed values rounded up
(the flip rate at least 3 / rows); the worst values are taken over every row of every batch
shape, the stream statistics over every run of ``WINDOW`` rows; the row comparison's KL is
the judge's; a re-run reproduces a checked-in band when every observed value is within the
stated 20% and every mutation is still caught tenfold, and says which metric does not; a
band is refused when a mutation is not caught tenfold or the corpus is short; the table is
written atomically and read back by ``engines.tolerances.bands``; the corpus manifest's
faults name their field; a stream's band statistics check each step's KL, skip the mean and
p99 of a stream shorter than the window, and say how far beyond each bound it is and where
it starts. The GGUF rewriter copies a file unchanged but for the tensors it is told to
change; the weight mutations change exactly what they say. With llama-cpp on SmolLM2 (a
short corpus of our own): every mutation lands at least tenfold beyond the band, the band is
twice what was observed, the two batch shapes differ but agree on the argmax nearly always,
and scoring again reproduces every observed value exactly; the CLI refuses to write a band
from a short corpus and leaves the table untouched.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from engines.errors import InputError
from engines.tolerances import Band, bands
from harness import calibrate as cal
from harness.judgement import kl_divergence


def stats(kl, flipped=None, shape=None, segment="s", gap=None, max_abs=None, nmse=None):
    kl = np.asarray(kl, dtype=np.float64)
    n = len(kl)
    flipped = np.zeros(n, bool) if flipped is None else np.asarray(flipped, bool)
    return cal.RowStats(segment, shape, np.arange(n), np.full(n, 0.5) if max_abs is None
                        else np.asarray(max_abs), np.full(n, 1e-3) if nmse is None
                        else np.asarray(nmse), kl, flipped,
                        np.zeros(n) if gap is None else np.asarray(gap), np.ones(n),
                        np.zeros(n, int))


# -- bounds, observations, reproduction -------------------------------------------------------

def test_round_up_keeps_two_significant_digits_and_never_rounds_down():
    assert cal.round_up(0.0632) == 0.064
    assert cal.round_up(3.736) == 3.8
    assert cal.round_up(0.049) == 0.049
    assert cal.round_up(1.0) == 1.0
    assert cal.round_up(0.0) == 0.0
    for value in np.random.default_rng(0).uniform(1e-5, 50, 200):
        assert value <= cal.round_up(value) <= value * 1.1


def test_bounds_are_twice_the_worst_observed_and_the_flip_rate_is_floored():
    observed = {"near_tie_margin": 0.3, "step_max_abs": 1.87, "step_nmse": 0.04,
                "step_kl": 0.0316, "mean_kl": 0.0048, "p99_kl": 0.03, "flip_rate": 0.032}
    bounds = cal.band_bounds(observed, rows=5000)
    assert bounds == {"near_tie_margin": 0.6, "step_max_abs": 3.8, "step_nmse": 0.08,
                      "step_kl": 0.064, "mean_kl": 0.0096, "p99_kl": 0.06, "flip_rate": 0.064}
    assert cal.band_bounds({**observed, "flip_rate": 0.0}, rows=500)["flip_rate"] == 0.006


def test_worst_values_cover_every_shape_and_stream_statistics_every_window():
    quiet = np.full(40, 0.001)
    burst = quiet.copy()
    burst[20:24] = 0.05  # one run of 16 rows holds all four: mean (4 x 0.05 + 12 x 0.001) / 16
    found = cal.observe([stats(quiet, shape=None),
                         stats(burst, shape=1, flipped=[i == 21 for i in range(40)],
                               gap=np.where(np.arange(40) == 21, 0.3, 0.0))])
    assert found["step_kl"] == pytest.approx(0.05)
    assert found["step_kl_at"] == "s @ 20 (1 a piece)"
    assert found["mean_kl"] == pytest.approx((4 * 0.05 + 12 * 0.001) / 16)
    assert found["near_tie_margin"] == pytest.approx(0.3)
    assert found["flip_rate"] == pytest.approx(1 / 40)  # the worse shape's
    assert found["flips"] == {"all at once": "0/40", "1 a piece": "1/40"}
    assert found["rows"] == 80


def test_the_row_comparison_is_the_judges_kl():
    rng = np.random.default_rng(1)
    oracle = rng.normal(0, 3, (5, 300))
    engine = oracle + rng.normal(0, 0.2, (5, 300))
    got = cal.compare_rows(engine.astype(np.float32), oracle, chunk=2)
    for i in range(5):
        assert got["kl"][i] == pytest.approx(kl_divergence(oracle[i], engine[i].astype(
            np.float32)), rel=1e-9)
        assert got["max_abs"][i] == pytest.approx(np.abs(engine[i].astype(np.float32)
                                                         - oracle[i]).max())
    assert list(got["flipped"]) == [int(np.argmax(e.astype(np.float32))) != int(np.argmax(o))
                                    for e, o in zip(engine, oracle)]


OBSERVED = {"near_tie_margin": 0.3, "step_max_abs": 1.8, "step_nmse": 0.04, "step_kl": 0.03,
            "mean_kl": 0.005, "p99_kl": 0.03, "flip_rate": 0.03}


def checked_in(**observed) -> Band:
    bounds = cal.band_bounds(OBSERVED, 3000)
    return Band(scheme="ggml-cpu:q4_1", **bounds, provenance={
        "observed": {**OBSERVED, **observed}, "reproduce_within": 0.2})


def run_of(observed, mutation_values=None) -> cal.Calibration:
    bounds = cal.band_bounds(observed, 3000)
    band = Band(scheme="ggml-cpu:q4_1", **bounds)
    corpus = cal.Corpus(cal.CORPUS_FILE, "sha256:x", [cal.Segment("s", "plain", "", [1] * 2000)])
    mutations = [cal.mutation_result("planted-x", "", {k: v for k, v in mutation_values.items()},
                                     bounds)] if mutation_values else []
    return cal.Calibration(band, dict(observed), mutations, {}, corpus)


def test_a_rerun_within_the_stated_uncertainty_reproduces_the_band():
    rerun = run_of({**OBSERVED, "step_kl": 0.033, "mean_kl": 0.0045},
                   {**OBSERVED, "step_kl": 1.0})
    rep = cal.reproduce(rerun, checked_in())
    assert rep.reproduced, rep.problems
    assert [m[0] for m in rep.metrics] == list(cal.BOUNDS)
    assert rep.mutations == [("planted-x", "step_kl", pytest.approx(1.0 / 0.06), True)]


def test_a_rerun_beyond_it_does_not_and_says_which_value_moved():
    rep = cal.reproduce(run_of({**OBSERVED, "step_nmse": 0.052}), checked_in())
    assert not rep.reproduced
    assert rep.problems == ["observed step_nmse 0.052 is +30.0% from the checked-in 0.04 "
                            "(within 20% reproduces)"]
    weak = cal.reproduce(run_of(OBSERVED, {**OBSERVED, "step_kl": 0.3}), checked_in())
    assert weak.problems == ["planted-x is only 5x beyond the checked-in band (step_kl)"]


def test_a_band_whose_mutation_is_not_caught_tenfold_is_refused():
    assert run_of(OBSERVED, {**OBSERVED, "step_kl": 1.0}).refused == []
    weak = run_of(OBSERVED, {**OBSERVED, "step_kl": 0.5})
    assert weak.refused == ["planted-x is only 8.33x beyond the band at most (step_kl); at "
                            "least 10x is required"]
    assert "no mutation validates" in run_of(OBSERVED).refused[0]
    short = run_of(OBSERVED, {**OBSERVED, "step_kl": 1.0})
    short.corpus.segments[0].ids[:] = [1] * 100
    assert short.refused == ["the corpus has 100 positions; a band is written from at least "
                             "1500"]


def test_the_table_is_written_beside_other_schemes_and_read_back(tmp_path):
    path = tmp_path / "bands.json"
    first = run_of(OBSERVED).band
    other = Band(scheme="onnxruntime-cpu:matmulnbits-int4-b32-acc4", near_tie_margin=1,
                 step_max_abs=2, step_nmse=0.1, step_kl=0.1, mean_kl=0.01, p99_kl=0.1,
                 flip_rate=0.1, provenance={"date": "x"})
    cal.write_band(other, path)
    cal.write_band(first, path)
    read = bands(path)
    assert set(read) == {first.scheme, other.scheme}
    assert read[first.scheme] == first and read[other.scheme].provenance == {"date": "x"}
    assert not list(tmp_path.glob(".*tmp*"))


@pytest.mark.parametrize("text, why", [
    ("{nope", "not valid JSON"), ("[1, 2]", '"schemes"'), ('{"schemes": [1]}', '"schemes"'),
    ('{"schemes": {"q": {"sharpness": 1}}}', "not a band")])
def test_a_bands_table_that_cannot_be_read_names_the_option(tmp_path, text, why):
    path = tmp_path / "bands.json"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        bands(path, "--bands")
    assert (err.value.field, err.value.value) == ("--bands", str(path))
    assert why in err.value.message and err.value.remedy


# -- the corpus --------------------------------------------------------------------------------

@pytest.fixture
def corpus_dir(tmp_path):
    (tmp_path / "a.txt").write_text("some prose")
    (tmp_path / "corpus.yaml").write_text(
        "segments:\n  - {name: a, kind: plain, topic: prose, file: a.txt}\n")
    return tmp_path


@pytest.mark.parametrize("text, field", [
    ("segments:\n  - {name: a, kind: poem, file: a.txt}\n", "segments[0].kind"),
    ("segments:\n  - {name: a, kind: plain, file: missing.txt}\n", "segments[0].file"),
    ("segments:\n  - {name: a, kind: plain}\n", "segments[0]"),
    ("nothing: here\n", "segments"),
    ("segments:\n  - {name: a, kind: plain, file: ../outside.txt}\n", "segments[0].file"),
    ("segments:\n  - {name: a, kind: plain, file: /etc/hostname}\n", "segments[0].file"),
    ("segments:\n  - {name: a, kind: plain, file: a.txt}\n"
     "  - {name: a, kind: plain, file: a.txt}\n", "segments[1].name"),
    ("segments:\n  - {name: a, kind: plain, file: a.txt, weight: 2}\n", "segments[0].weight"),
])
def test_a_bad_corpus_names_its_field(corpus_dir, text, field):
    (corpus_dir.parent / "outside.txt").write_text("beside the folder, not in it")
    (corpus_dir / "corpus.yaml").write_text(text)
    with pytest.raises(InputError) as err:
        cal.load_corpus(None, corpus_dir / "corpus.yaml")
    assert err.value.field == field


def test_the_cli_refuses_json_at_the_bands_tables_path_before_any_work(tmp_path, capsys):
    """The calibration's JSON would replace the bands table: refused before the engine is
    even looked up (an engine that does not exist is not reached)."""
    from harness.cli import main

    same = tmp_path / "bands.json"
    assert main(["calibrate", "--engine", "no-such-engine", "--bands", str(same), "--json",
                 str(tmp_path / "." / "bands.json"), "--write"]) == 2
    err = capsys.readouterr().err
    assert "[field --json = " in err and "--bands" in err and "Traceback" not in err
    assert not same.exists()


def test_a_chat_segment_that_is_not_yaml_names_its_file(corpus_dir):
    (corpus_dir / "chat.yaml").write_text("- role: user\n  content: [unclosed\n")
    (corpus_dir / "corpus.yaml").write_text(
        "segments:\n  - {name: c, kind: chat, topic: prose, file: chat.yaml}\n")
    with pytest.raises(InputError) as err:
        cal.load_corpus(None, corpus_dir / "corpus.yaml")
    assert (err.value.field, err.value.value) == ("segments[0].file", "chat.yaml")


def test_an_unknown_segment_or_a_missing_manifest_names_the_option(corpus_dir):
    with pytest.raises(InputError) as err:
        cal.load_corpus(None, corpus_dir / "corpus.yaml", ["b"])
    assert (err.value.field, err.value.value) == ("--segments", "b")
    with pytest.raises(InputError) as err:
        cal.load_corpus(None, corpus_dir / "none.yaml")
    assert err.value.field == "--corpus"


# -- a stream against its band (harness.judgement.band_statistics) --------------------------------

def band(**bounds) -> Band:
    return Band(**{"scheme": "s", "near_tie_margin": 0.5, "step_max_abs": 3.0,
                   "step_nmse": 0.1, "step_kl": 0.05, "mean_kl": 0.01, "p99_kl": 0.05,
                   "flip_rate": 0.05, "window": 16, **bounds})


def audited(kls):
    from harness.judgement import LogitsAudit, StepAudit, StreamJudgement

    steps = [StepAudit(i, 0.5, 0.0, 1e-3, 0, True, "", kl) for i, kl in enumerate(kls)]
    return LogitsAudit("s", steps, "same"), StreamJudgement(len(kls), [])


def test_each_steps_kl_is_held_to_the_band_and_the_first_step_beyond_named():
    from harness.judgement import band_statistics

    kls = [0.004] * 20
    kls[7], kls[12] = 0.2, 0.9
    got = band_statistics(*audited(kls), band())
    assert not got.within and got.first_step == 7
    assert "2 step(s) over the band's step KL 0.05, first at step 7 (worst 0.9 at step 12)" \
        in got.reasons
    assert got.farthest == ("step_kl", pytest.approx(18.0))
    assert band_statistics(*audited([0.004] * 20), band()).within


def test_flips_are_measured_against_the_fewest_that_would_be_drift():
    from harness.judgement import (BandStatistics, StepJudgement, StreamJudgement, band_statistics,
                               binomial_tail, fewest_unlikely)

    k = fewest_unlikely(64, 0.05)
    assert binomial_tail(k, 64, 0.05) < 1e-3 <= binomial_tail(k - 1, 64, 0.05)
    assert fewest_unlikely(3, 0.5) == 4  # three steps can never be that unlikely
    audit, _ = audited([0.004] * 64)
    for flips in (k - 1, k):
        found = [StepJudgement(i, 7, 8, 2, 0.1, "near-tie", "", []) for i in range(flips)]
        got = band_statistics(audit, StreamJudgement(64, found), band())
        assert isinstance(got, BandStatistics)
        assert got.ratios["flip_rate"] == pytest.approx(flips / k)
        assert got.within == (flips < k)


def test_a_stream_shorter_than_the_window_is_not_held_to_the_mean():
    from harness.judgement import band_statistics

    short = band_statistics(*audited([0.03] * 8), band())  # mean 0.03 over the band's 0.01
    assert short.within and "mean_kl" not in short.ratios
    long = band_statistics(*audited([0.03] * 16), band())
    assert not long.within and long.reasons[0].startswith("mean KL 0.03 over")
    assert long.ratios["mean_kl"] == pytest.approx(3.0)


def test_a_top_k_audit_reports_no_kl_and_is_held_to_flips_and_its_bound():
    """A server's audit (log-probabilities of the top k) sees no whole distribution: its KL
    statistics are not measured, not zero, and the stream is still held to the band's flip
    rate and to each step's bound."""
    from harness.judgement import LogitsAudit, StepAudit, StepJudgement, StreamJudgement
    from harness.judgement import band_statistics

    steps = [StepAudit(i, 0.2, float("nan"), float("nan"), 0, True) for i in range(20)]
    got = band_statistics(LogitsAudit("s", steps, "same"), StreamJudgement(20, []), band())
    assert got.within and got.mean_kl is None and got.p99_kl is None
    assert {"step_kl", "step_nmse", "mean_kl", "p99_kl"}.isdisjoint(got.ratios)
    assert got.ratios["step_max_abs"] == pytest.approx(0.2 / 3.0)
    flipped = [StepJudgement(i, 7, 8, 2, 0.1, "near-tie", "", []) for i in range(20)]
    assert not band_statistics(LogitsAudit("s", steps, "same"), StreamJudgement(20, flipped),
                               band()).within
    steps[5] = StepAudit(5, 9.0, float("nan"), float("nan"), 0, False)
    assert band_statistics(LogitsAudit("s", steps, "same"), StreamJudgement(20, []),
                           band()).first_step == 5


# -- GGUF rewriting and the weight mutations ---------------------------------------------------

@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    pytest.importorskip("gguf", reason="make real (pip install gguf)")
    from suites.convert_support import write_tiny_gguf

    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


def tensors(path):
    import gguf

    reader = gguf.GGUFReader(str(path))
    return reader, {t.name: t for t in reader.tensors}


def test_a_rewrite_changes_only_the_tensor_it_is_told_to(tiny, tmp_path):
    from harness.gguf_rewrite import Tensor, rewrite_gguf

    def change(t):
        if t.name == "blk.0.attn_q.weight":
            return Tensor(t.name, np.zeros_like(t.data), t.type)
        return None

    out = rewrite_gguf(tiny, tmp_path / "out.gguf", change)
    (r0, before), (r1, after) = tensors(tiny), tensors(out)
    assert list(before) == list(after)
    for name in before:
        a, b = before[name], after[name]
        assert (a.tensor_type, list(a.shape)) == (b.tensor_type, list(b.shape))
        same = np.array_equal(np.array(a.data), np.array(b.data))
        assert same == (name != "blk.0.attn_q.weight"), name
    assert not np.array(after["blk.0.attn_q.weight"].data).any()
    assert {k: r0.fields[k].contents() for k in r0.fields if not k.startswith("GGUF.")} == \
        {k: r1.fields[k].contents() for k in r1.fields if not k.startswith("GGUF.")}


def test_a_patched_tensor_is_what_the_full_rewrite_writes(tiny, tmp_path):
    """``patch_tensor`` (the header's walk, one tensor's bytes replaced in a copy) hands
    ``change`` what the full reader reads and leaves a file the full reader reads as the full
    rewrite's, for every tensor type it sizes (the others, BF16 here, are left to the full
    rewrite: False, nothing written)."""
    from harness.gguf_rewrite import Tensor, patch_tensor, rewrite_gguf

    reader, before = tensors(tiny)
    for name, t in before.items():
        seen = []

        def flip(given):
            seen.append(given)
            return np.ascontiguousarray(np.asarray(given.data)[::-1])

        def change(given):
            return Tensor(given.name, flip(given), given.type) if given.name == name else None

        patched = tmp_path / f"{name}.patched.gguf"
        if not patch_tensor(tiny, patched, name, flip):
            assert t.tensor_type.name == "BF16" and not patched.exists(), name
            continue
        assert np.array_equal(seen[0].data, np.asarray(t.data)) and seen[0].type == \
            t.tensor_type, name
        rewritten = rewrite_gguf(tiny, tmp_path / f"{name}.full.gguf", change)
        (_, a), (_, b) = tensors(patched), tensors(rewritten)
        assert list(a) == list(b)
        for other in a:
            assert np.array_equal(np.asarray(a[other].data), np.asarray(b[other].data)), other
            assert a[other].tensor_type == b[other].tensor_type
    assert not patch_tensor(tiny, tmp_path / "none.gguf", "blk.9.attn_q.weight", flip)


def dequantized(t, data=None):
    import gguf

    return gguf.quants.dequantize(np.asarray(t.data if data is None else data), t.tensor_type)


@pytest.mark.parametrize("name", ["blk.0.attn_q.weight", "blk.0.attn_output.weight",
                                  "blk.0.attn_k.weight"])
def test_halves_swapped_exchanges_each_blocks_two_halves(tiny, name):
    from harness.gguf_rewrite import read_tensor
    from harness.mutations import gguf_halves_swapped

    _, found = tensors(tiny)
    t = found[name]  # Q4_1, Q4_0 and Q8_0
    before = dequantized(t).reshape(-1, 32)
    after = dequantized(t, gguf_halves_swapped(read_tensor(t))).reshape(-1, 32)
    assert np.array_equal(after, np.concatenate([before[:, 16:], before[:, :16]], axis=1))


@pytest.mark.parametrize("name", ["blk.0.attn_q.weight", "blk.0.attn_k.weight"])
def test_block_scale_doubles_one_blocks_scale(tiny, name):
    from harness.gguf_rewrite import read_tensor
    from harness.mutations import gguf_block_scale_doubled

    _, found = tensors(tiny)
    t = found[name]  # Q4_1 (value = d q + m) and Q8_0 (value = d q)
    before = dequantized(t).reshape(-1, 32)
    after = dequantized(t, gguf_block_scale_doubled(read_tensor(t))).reshape(-1, 32)
    changed = np.flatnonzero((before != after).any(axis=1))
    assert len(changed) == 1
    (b,) = changed
    offset = before[b].min() if t.tensor_type.name == "Q4_1" else 0.0
    low = np.round(before[b] - offset, 6)
    assert np.allclose(after[b] - offset, 2 * low, atol=1e-3 * abs(before[b]).max())


def test_a_gguf_a_planted_bug_cannot_be_written_into_is_refused_before_scoring(tmp_path):
    """The tiny GGUF's blk.0.attn_v.weight is F16: halves-swapped has no blocks to swap there
    (one line naming the type and the remedy, not a ValueError after the scoring); made Q4_0,
    it can, and block-scale then names the tensor a 2-block file lacks."""
    pytest.importorskip("gguf", reason="make real (pip install gguf)")
    from engines.errors import InputError
    from harness.mutations import LlamaBlockScale, LlamaHalvesSwapped
    from suites.convert_support import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    with pytest.raises(InputError) as caught:
        LlamaHalvesSwapped.check_plantable(path, "llama-cpp", "pkg")
    line = str(caught.value)
    assert "llama-cpp" in line and "blk.0.attn_v.weight is F16" in line
    assert "[field --package = 'pkg']" in line
    assert line.endswith("remedy: calibrate a quantized GGUF (Q4_0, Q4_1, Q8_0)")
    quantized = write_tiny_gguf(tmp_path / "q.gguf", override_type=("blk.0.attn_v.weight",
                                                                    "Q4_0"))
    LlamaHalvesSwapped.check_plantable(quantized, "llama-cpp", "pkg")
    with pytest.raises(InputError, match="holds no tensor blk.2.ffn_down.weight"):
        LlamaBlockScale.check_plantable(quantized, "llama-cpp", "pkg")


def test_the_shipped_corpus_covers_prose_code_digits_and_chat():
    """The manifest's segments exist and cover prose, code, digits and chat (the tokenized
    count, at least MIN_POSITIONS, is checked with the checkpoint)."""
    import yaml

    manifest = yaml.safe_load(cal.CORPUS_FILE.read_text())
    kinds = {(s["kind"], s["topic"]) for s in manifest["segments"]}
    assert {k for k, _ in kinds} == {"plain", "chat"}
    assert {t for _, t in kinds} >= {"prose", "code", "digits"}
    assert all((cal.CORPUS_FILE.parent / s["file"]).is_file() for s in manifest["segments"])
    size = sum(len((cal.CORPUS_FILE.parent / s["file"]).read_text())
               for s in manifest["segments"])
    assert size >= 3 * cal.MIN_POSITIONS  # English runs ~4 characters a token


# -- llama-cpp on SmolLM2: the procedure end to end on a short corpus of our own ---------------

SHORT_CORPUS = """segments:
  - {name: chat_short, kind: chat, topic: prose, file: chat.yaml}
  - {name: code_short, kind: plain, topic: code, file: code.txt}
"""
SHORT_CHAT = """- role: user
  content: Name two birds that cannot fly.
- role: assistant
  content: The ostrich and the emu cannot fly, though both run fast.
"""
SHORT_CODE = """def area(width, height):
    return width * height


def perimeter(width, height):
    return 2 * (width + height)


rooms = {"kitchen": (3.5, 4.0), "hall": (1.2, 6.0), "study": (2.8, 3.1)}
for name, (w, h) in sorted(rooms.items()):
    print(f"{name:8} area {area(w, h):6.2f} m2, perimeter {perimeter(w, h):5.1f} m")
total = sum(area(w, h) for w, h in rooms.values())
print(f"total floor area: {total:.1f} m2")
"""


@pytest.fixture(scope="module")
def llama_calibration(tmp_path_factory):
    """One calibration of llama-cpp on SmolLM2 over a short corpus (two segments), with every
    mutation, and a second scoring of the honest engine alone."""
    from suites.test_llama_cpp import need_llama

    pytest.importorskip("gguf", reason="make real (pip install gguf tokenizers)")
    from engines.backends.llama_cpp import LlamaCppEngine
    from engines.package import load_package
    from engines.shipped_checkpoint import INSTALL, smollm2_path
    from harness.convert.smollm2 import smollm2_package
    from harness.mutations import mutations_for

    if smollm2_path() is None:
        pytest.skip(f"SmolLM2 is not installed: {INSTALL}")
    need_llama()
    folder = tmp_path_factory.mktemp("corpus")
    (folder / "corpus.yaml").write_text(SHORT_CORPUS)
    (folder / "chat.yaml").write_text(SHORT_CHAT)
    (folder / "code.txt").write_text(SHORT_CODE)
    package = load_package(smollm2_package(cache="dynamic", dtype="float32"))
    corpus = cal.load_corpus(package, folder / "corpus.yaml")
    engine = LlamaCppEngine(package)
    try:
        first = cal.calibrate(engine, package, corpus, mutations_for("llama-cpp"))
        again = cal.calibrate(engine, package, corpus)
    finally:
        engine.close()
    return first, again, corpus


@pytest.mark.real_checkpoint
@pytest.mark.claim("quantized_band")
def test_every_llama_mutation_lands_tenfold_beyond_the_band(llama_calibration):
    first, _, corpus = llama_calibration
    print({m["engine"]: (m["metric"], round(m["ratio"], 1)) for m in first.mutations})
    assert [m["engine"] for m in first.mutations] == [
        "planted-llama-halves-swapped", "planted-llama-block-scale", "planted-llama-rope-base",
        "planted-llama-kv-shift", "planted-llama-bos-dropped"]
    assert all(m["caught"] and m["ratio"] >= 10 for m in first.mutations), first.mutations
    # written only from a long enough corpus: this one is short
    assert first.refused == [f"the corpus has {corpus.positions} positions; a band is "
                             f"written from at least 1500"]


@pytest.mark.real_checkpoint
def test_the_llama_band_is_twice_what_was_observed_over_both_batch_shapes(llama_calibration):
    first, _, corpus = llama_calibration
    band, seen = first.band, first.observed
    assert band.scheme == "ggml-cpu:q4_1" and band.window == cal.WINDOW
    for key in cal.BOUNDS:
        if key != "flip_rate":
            assert getattr(band, key) == cal.round_up(2 * seen[key]) > 0, key
    assert seen["rows"] == 2 * corpus.positions  # every position, in both shapes
    assert set(seen["flips"]) == {"all at once", "1 a piece"}
    (pair,) = first.self_consistency.values()  # the shapes differ, yet mostly agree
    assert not pair["bit_identical"] and pair["same_argmax"] >= 0.9
    prov = band.provenance
    assert prov["corpus"]["hash"] == corpus.hash and prov["positions"] == corpus.positions
    assert prov["engine_build"]["numeric_scheme"] == "ggml-cpu:q4_1"
    assert prov["engine_build"]["cpu_features"] and prov["device"]["cores"]
    assert prov["date"] and prov["observed"]["step_kl"] == seen["step_kl"]


@pytest.mark.real_checkpoint
def test_rerunning_reproduces_the_observed_values_exactly(llama_calibration):
    first, again, _ = llama_calibration
    rep = cal.reproduce(again, first.band)
    assert rep.reproduced, rep.problems
    assert all(change == 0.0 for _, _, _, change, _ in rep.metrics)
    assert again.band == first.band


@pytest.mark.real_checkpoint
def test_the_cli_refuses_to_write_a_band_from_a_short_corpus(llama_calibration, tmp_path,
                                                             monkeypatch, capsys):
    """``lockstep calibrate --write``: the row printed, the refusal named, exit 1, the table
    untouched; a long enough calibration is written and a re-run against it reproduces."""
    from harness.cli import main

    first, again, _ = llama_calibration
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(cal, "calibrate", lambda *a, **k: first)
    table = tmp_path / "bands.json"
    assert main(["calibrate", "--bands", str(table), "--write"]) == 1
    out = capsys.readouterr().out
    assert "not written: the corpus has" in out and "planted-llama-kv-shift" in out
    assert not table.exists()
    long = cal.Calibration(first.band, first.observed, first.mutations,
                           first.self_consistency,
                           cal.Corpus(first.corpus.path, first.corpus.hash,
                                      [cal.Segment("s", "plain", "", [1] * 1500)]))
    monkeypatch.setattr(cal, "calibrate", lambda *a, **k: long)
    assert main(["calibrate", "--bands", str(table), "--write"]) == 0
    assert bands(table)["ggml-cpu:q4_1"] == first.band
    monkeypatch.setattr(cal, "calibrate", lambda *a, **k: again)
    assert main(["calibrate", "--bands", str(table), "--json", str(tmp_path / "c.json")]) == 0
    assert "reproduces the checked-in band" in capsys.readouterr().out
    assert json.loads((tmp_path / "c.json").read_text())["reproduction"]["reproduced"]


@pytest.mark.real_checkpoint
def test_the_shipped_corpus_holds_enough_positions_on_smollm2():
    pytest.importorskip("gguf", reason="make real (pip install gguf tokenizers)")
    from engines.package import load_package
    from engines.tolerances import bands as checked_in
    from engines.shipped_checkpoint import INSTALL, smollm2_path
    from harness.convert.smollm2 import smollm2_package

    if smollm2_path() is None:
        pytest.skip(f"SmolLM2 is not installed: {INSTALL}")
    corpus = cal.load_corpus(load_package(smollm2_package(cache="dynamic", dtype="float32")))
    assert corpus.positions >= cal.MIN_POSITIONS
    chats = [s for s in corpus.segments if s.kind == "chat"]
    assert chats and all(s.ids[0] == 1 for s in chats)  # <|im_start|>: BOS-dropped bites
    # the checked-in SmolLM2 bands were measured on exactly this corpus
    row = checked_in()["ggml-cpu:q4_1"].provenance
    assert row["corpus"]["hash"] == corpus.hash and row["positions"] == corpus.positions
