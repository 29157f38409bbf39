"""onnxruntime-genai's int4 build as a quantized engine (``ort-genai-int4``).

Facts, on SmolLM2 (the int4 build ``make real`` caches): it declares the scheme read from
its graph (MatMulNBits int4, block 32, accuracy level 4); its reference is a float32 package
over its own weights dequantized exactly (cached beside the build, every quantized node
gone) whose logits are far from lockstep's float32 conversion of the checkpoint (int4
rounding of every weight) and close to the engine's own; teacher-forced scoring gives every
row one position an append and the row after each piece of eight; its greedy streams pass
under its scheme's checked-in band, judged against that reference, with the band recorded.
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from engines.backends.ort_genai import OrtGenaiInt4Engine
from suites.genai_support import smollm2  # noqa: F401 - the module's package fixture

pytestmark = pytest.mark.real_checkpoint
SCHEME = "onnxruntime-cpu:matmulnbits-int4-b32-acc4"


@pytest.fixture(scope="module")
def engine(smollm2):  # noqa: F811
    e = OrtGenaiInt4Engine(smollm2)
    yield e
    e.close()


def test_it_declares_the_scheme_of_its_graph_and_a_dequantized_reference(engine):
    import onnx

    from engines.package import load_package

    assert engine.numeric_scheme() == SCHEME
    record = engine.provenance()
    assert record["precision"] == "int4" and record["matmulnbits"] == {"int4-b32-acc4": 151}
    reference = load_package(engine.reference_package())
    assert reference.spec.dtype == "float32"
    graph = onnx.load(str(reference.root / "target.onnx"), load_external_data=False).graph
    ops = {n.op_type for n in graph.node}
    assert not ops & {"MatMulNBits", "GatherBlockQuantized"} and "MatMul" in ops
    origin = json.loads((reference.root / "dequantized.json").read_text())
    assert origin["replaced"] == {"MatMulNBits": 151, "GatherBlockQuantized": 1}


def test_its_rows_are_near_its_own_weights_and_far_from_the_checkpoints(engine, smollm2):  # noqa: F811
    from engines.oracle import Oracle
    from engines.package import load_package
    from harness.row_compare import compare_rows

    ids = smollm2.spec.prompts[1]  # a plain prompt
    positions, rows = engine.teacher_forced(ids, 1)
    assert positions == list(range(len(ids))) and rows.shape == (len(ids), 49152)
    pieces, last = engine.teacher_forced(ids, 8)
    assert pieces == list(range(7, len(ids), 8)) + ([len(ids) - 1] if len(ids) % 8 else [])
    own = np.asarray(Oracle(load_package(engine.reference_package())).stream_rows(
        ids[:1], ids[1:]))
    f32 = np.asarray(Oracle(smollm2).stream_rows(ids[:1], ids[1:]))
    near, far = compare_rows(rows, own)["kl"], compare_rows(rows, f32)["kl"]
    print("KL mean: own weights", near.mean(), "checkpoint", far.mean())
    assert near.mean() < 0.02 < far.mean()
    assert far.mean() > 10 * near.mean()


@pytest.mark.claim("quantized_band")
def test_its_streams_pass_under_its_band(smollm2, tmp_path):  # noqa: F811
    from engines.tolerances import band_for
    from harness.evidence.store import load_evidence_dir
    from harness.runner import run_matrix

    band = band_for(SCHEME)
    assert band is not None, "the int4 scheme's band is checked in"
    summary = run_matrix(["ort-genai-int4"], [str(smollm2.root)], None, 16,
                         evidence_dir=tmp_path, max_prompts=3)
    assert all(c.status in ("identical", "near-tie") for c in summary.cells), \
        [(c.prompt_name, c.status, c.reason) for c in summary.cells]
    (record, *_) = [r for r in load_evidence_dir(tmp_path) if r.engine == "ort-genai-int4"]
    assert record.numeric_scheme == SCHEME and record.band.within
    assert record.band.bounds["step_kl"] == band.step_kl
    assert record.judgement.oracle_package.name.endswith("dequantized")
