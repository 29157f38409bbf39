"""Quality beside the verdict (``harness.quality``), the requantized packages that declare
their original (``harness.requantize``), and the report's quantized section.

Facts: the statistics are llama-perplexity's (KL with the original as P, same top, the
chosen token's probability change with its spread and skew, the perplexity ratio) and read
zero, 100% and 1 for an engine equal to its original; a package declaring an original finds
it as a sibling pinned by its hash, and names the field when it is missing or changed; a run
on such a package records each stream's quality, and a quality that cannot be measured is
a note, never the cell's verdict; a requantization turns every matrix into the asked type and
keeps vectors float32; the report lists each band with its bounds and provenance, each
quantized cell with its statistics and its plot (KL along the steps, flips against the
top-2 margin), and the quality table.
"""
from __future__ import annotations

import shutil

import numpy as np
import pytest

from engines.errors import PackageError
from harness.quality import original_package, quality


def test_an_engine_equal_to_its_original_reads_zero_and_one():
    rows = np.random.default_rng(0).normal(0, 2, (12, 50))
    tokens = rows.argmax(axis=1)
    q = quality(rows, rows, tokens, perplexity=True)
    assert q.positions == 12 and q.kl["mean"] == 0 and q.kl["max"] == 0
    assert q.same_top == 1.0 and q.ppl_ratio == pytest.approx(1.0)
    assert q.delta_p["mean"] == 0 and q.delta_p["rms"] == 0 and "skew" not in q.delta_p


def test_a_skewed_change_of_the_chosen_tokens_probability_shows_as_skew():
    rng = np.random.default_rng(1)
    original = rng.normal(0, 2, (200, 40))
    tokens = rng.integers(0, 40, 200)
    engine = original.copy()
    engine[np.arange(200), tokens] -= np.where(np.arange(200) % 10 == 0, 3.0, 0.0)  # damage
    q = quality(engine, original, tokens, perplexity=True)
    assert q.delta_p["mean"] < 0 and q.delta_p["skew"] < -1  # a one-sided loss, not noise
    assert q.ppl_ratio > 1 and 0 < q.kl["mean"] < q.kl["max"]
    assert q.delta_p["p1"] <= q.delta_p["p50"] <= q.delta_p["p99"]


@pytest.fixture
def twins(tmp_path):
    """Two sibling copies of tiny_llama: ``quantized`` declares ``original``."""
    from engines.package import load_package
    from harness.catalog.builtin import build
    from harness.requantize import declare_original

    source = build("tiny_llama")
    shutil.copytree(source, tmp_path / "original")
    shutil.copytree(source, tmp_path / "quantized")
    original = load_package(tmp_path / "original")
    declare_original(tmp_path / "quantized", original)
    return original, load_package(tmp_path / "quantized")


def test_a_declared_original_is_a_sibling_pinned_by_its_hash(twins, tmp_path):
    original, quantized = twins
    assert quantized.spec.original.folder == "original"
    assert original_package(quantized).content_hash == original.content_hash
    assert original_package(original) is None
    (tmp_path / "original" / "extra.txt").write_text("changed")
    with pytest.raises(PackageError) as err:
        original_package(quantized)
    assert err.value.field == "original.content_hash"
    shutil.rmtree(tmp_path / "original")
    with pytest.raises(PackageError) as err:
        original_package(quantized)
    assert err.value.field == "original.folder"


def test_a_run_records_each_streams_quality_and_never_fails_for_it(twins, tmp_path):
    from harness.evidence.store import load_evidence_dir
    from harness.runner import run_matrix

    original, quantized = twins
    summary = run_matrix(["native-host"], [str(quantized.root)], None, 8,
                         evidence_dir=tmp_path / "ev")
    assert all(c.status == "identical" for c in summary.cells)
    records = [r for r in load_evidence_dir(tmp_path / "ev")]
    assert records and all(r.quality is not None for r in records)
    for r in records:  # the same weights: no distance
        assert r.quality.original.name == "original" and r.quality.same_top == 1.0
        assert r.quality.kl["max"] < 1e-9 and r.quality.positions == len(r.tokens)
    (tmp_path / "original" / "extra.txt").write_text("changed")
    broken = run_matrix(["native-host"], [str(quantized.root)], None, 8)
    assert all(c.status == "identical" and c.quality is None for c in broken.cells)
    assert all("quality against the original not measured" in c.reason for c in broken.cells)


@pytest.mark.parametrize("qtype", ["q4_0", "q8_0"])
def test_a_requantization_turns_every_matrix_into_the_type(tmp_path, qtype):
    gguf = pytest.importorskip("gguf")
    from harness.requantize import requantize_gguf
    from suites.convert_support import write_tiny_gguf

    src = write_tiny_gguf(tmp_path / "tiny.gguf")
    out = requantize_gguf(src, tmp_path / "out.gguf", qtype)
    before = {t.name: t for t in gguf.GGUFReader(str(src)).tensors}
    after = {t.name: t for t in gguf.GGUFReader(str(out)).tensors}
    assert list(before) == list(after)
    for name, t in after.items():
        expected = qtype.upper() if len(t.shape) == 2 else "F32"
        assert t.tensor_type.name == expected, name
        a = gguf.quants.dequantize(np.asarray(before[name].data), before[name].tensor_type)
        b = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        tol = 0.02 if qtype == "q8_0" else 0.3
        assert np.abs(a - b).max() <= tol * np.abs(a).max() + 1e-6, name


# -- the report ----------------------------------------------------------------------------------

def quantized_record(prompt="p0", within=True):
    from harness import evidence as ev
    from suites.test_report import finding, make_record

    kls = [0.002, 0.004, 0.09 if not within else 0.003, 0.001, 0.002, 0.003]
    audit = ev.LogitsAuditRecord(
        dtype="ggml-cpu:q4_1", tolerance={"logits_max_abs": 3.8, "logits_nmse": 0.081},
        decode="same", steps=[ev.StepAuditRecord(step=i, max_abs=0.5, max_rel=0.1, nmse=1e-3,
                                                 non_finite=0, ok=True, kl=k)
                              for i, k in enumerate(kls)],
        non_finite_steps=0, out_of_tolerance_steps=0, worst_max_abs=0.5, worst_nmse=1e-3)
    flip = finding(4, 66, 7, verdict="near-tie", rank=2, gap=0.25,
                   oracle_top=[(7, 3.5), (66, 3.25), (12, 3.0)])
    record = make_record(engine="llama-cpp", prompt=prompt, findings=[flip], audit=audit)
    band = ev.BandRecord(scheme="ggml-cpu:q4_1", bounds={
        "near_tie_margin": 1.2, "step_max_abs": 3.8, "step_nmse": 0.081, "step_kl": 0.064,
        "mean_kl": 0.019, "p99_kl": 0.06, "flip_rate": 0.065, "window": 16},
        provenance={"engine": "llama-cpp", "date": "2026-12-03T14:00:00+00:00",
                    "engine_build": {"llama_cpp_python": "0.3.36",
                                     "cpu_features": ["AVX2", "AVX512"]},
                    "device": {"model": "a CPU"}, "positions": 2615, "rows": 5230,
                    "corpus": {"file": "harness/texts/calibration/corpus.yaml",
                               "hash": "sha256:" + "c" * 64},
                    "observed": {"step_kl": 0.0316},
                    "mutations": [{"engine": "planted-llama-rope-base", "metric": "step_kl",
                                   "ratio": 46.3, "caught": True}]},
        steps=6, mean_kl=0.0025, p99_kl=0.004, flips=1, flip_p=0.3, within=within,
        reasons=[] if within else ["1 step(s) over the band's step KL 0.064, first at step 2"],
        ratios={"step_kl": 1.4 if not within else 0.06}, first_step=None if within else 2)
    quality = ev.QualityRecord(original=ev.PackageRef(name="smollm2-f32",
                                                      content_hash="sha256:" + "ab" * 32),
                               positions=6, kl={"mean": 0.27, "median": 0.2, "p90": 0.5,
                                                "p99": 0.9, "max": 1.0},
                               same_top=0.83, delta_p={"mean": -0.04, "rms": 0.1, "skew": -1.5})
    # the band beside the judgement: a stream beyond it is drift (found_status says so too)
    record = record.model_copy(update={"numeric_scheme": "ggml-cpu:q4_1", "band": band,
                                       "quality": quality,
                                       "status": "near-tie" if within else "drift"})
    assert ev.found_status(record)[0] == record.status
    return record


def test_the_report_shows_each_band_each_quantized_cell_and_its_quality():
    from reports import render_report
    from suites.test_report import parse

    dom = parse(render_report([quantized_record("p0"), quantized_record("p1", within=False)]))
    section = dom.by_id("quantized")
    schemes = section.by_id("band-schemes")
    text = schemes.text()
    assert "ggml-cpu:q4_1" in text and "step_kl 0.064" in text
    assert "2615 positions" in text and "planted-llama-rope-base: step_kl 46.3x" in text
    assert "AVX2 AVX512" in text and "2026-12-03" in text
    rows = section.by_id("band-cells").find_all("tr")
    cells = [r for r in rows if "band-cell" in r.classes]
    assert [r.attrs["data-within"] for r in cells] == ["yes", "no"]
    assert "first at step 2" in cells[1].text() and "step_kl 1.4x" in cells[1].text()
    plots = [r for r in rows if "band-plot" in r.classes]
    assert len(plots) == 2 and all(p.find_all("svg") for p in plots)
    quality_rows = section.by_id("quality").find_all("tr")[1:]
    assert len(quality_rows) == 2 and "83.0%" in quality_rows[0].text()
    assert "smollm2-f32" in quality_rows[0].text()


def test_a_scheme_without_a_band_is_named():
    from reports import render_report
    from suites.test_report import make_record, parse

    record = make_record(engine="llama-cpp").model_copy(update={"numeric_scheme": "ggml-cpu:q2_k"})
    section = parse(render_report([record])).by_id("quantized")
    assert "No band for ggml-cpu:q2_k is checked in" in " ".join(section.text().split())
