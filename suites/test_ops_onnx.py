"""The ONNX-domain ops real exports use, against ONNX's own node tests, judged by the
tolerance table (``engines/tolerances.py``) rather than each case's rtol/atol.

``test_op_conformance.py`` runs every selected node case with the case's own bounds; this
module holds the exporter ops to the bounds the rest of lockstep uses (per dtype, allclose
and NMSE), and asserts none of their cases is left out or listed as a gap.
"""
from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import numpy_helper

from engines.native.onnx_backend import NativeBackend
from harness.compare import compare_tensors
from suites.test_op_conformance import CASES, KNOWN_GAPS, SELECTED_NAMES, main_op
from suites.test_ops_contrib import OpCase, assert_agree, one_node, run_native_host, run_ort

# Ops onnxruntime-genai's builder and optimum/torch exports write (issue #14, item 6);
# GatherND, IsNaN come from torch's dynamo exporter (test_ops_torch_export.py).
EXPORT_OPS = frozenset("""
Attention ArgMax ArgMin Clip CumSum Erf GatherElements GatherND Gelu IsInf IsNaN
LayerNormalization Pow RMSNormalization RotaryEmbedding ScatterElements ScatterND Trilu
""".split())

# The ONNX-domain ops the seed engine's graphs use that native-host lacked (issue #38):
# TensorScatter's static caches and what a mixture-of-experts or vision graph adds.
SEED_OPS = frozenset("""
BitShift BitwiseOr BitwiseXor Gemm GroupNormalization Mod NonZero OneHot PRelu ReduceProd
Round Softplus TensorScatter TopK
""".split())

EXPORT_CASES = [c for c in CASES
                if main_op(c) in EXPORT_OPS | SEED_OPS and "_expanded" not in c.name]


def _host(value):
    if isinstance(value, onnx.TensorProto):
        return numpy_helper.to_array(value)
    return np.asarray(value)


def test_every_export_op_case_is_selected_and_none_is_a_gap():
    names = {c.name for c in EXPORT_CASES}
    assert {main_op(c) for c in EXPORT_CASES} == EXPORT_OPS | SEED_OPS
    assert names <= SELECTED_NAMES, sorted(names - SELECTED_NAMES)
    assert not names & set(KNOWN_GAPS), sorted(names & set(KNOWN_GAPS))


@pytest.mark.parametrize("case", EXPORT_CASES, ids=[c.name for c in EXPORT_CASES])
def test_export_op_case_within_the_tolerance_table(case):
    for inputs, expected in case.data_sets:
        outputs = NativeBackend.run_model(case.model, [_host(x) for x in inputs])
        assert len(outputs) == len(expected)
        for i, (got, want) in enumerate(zip(outputs, expected)):
            want = _host(want)
            assert got.dtype == want.dtype and got.shape == want.shape, f"output {i}"
            if want.dtype.kind in "biu":
                np.testing.assert_array_equal(got, want, err_msg=f"output {i}")
                continue
            special = ~np.isfinite(want.astype(np.float64))
            if special.any():  # NaN and infinities where the case puts them, exactly
                np.testing.assert_array_equal(got[special].astype(np.float64),
                                              want[special].astype(np.float64),
                                              err_msg=f"output {i}")
                got, want = got[~special], want[~special]
            result = compare_tensors(got, want, dtype=want.dtype)
            assert result.ok, f"output {i}: {result.reason}"


# ---- Attention as exports write it, against onnxruntime's CPU kernel ---------------------

@st.composite
def attention_cases(draw):
    """Attention-23 in the forms exports use: causal self-attention with GQA, over a kv
    cache (past_key/past_value) or without one, 3-D or 4-D, optionally with a padding mask."""
    kv_heads = draw(st.integers(1, 2))
    heads = kv_heads * draw(st.integers(1, 3))
    head, batch = draw(st.sampled_from([8, 16])), draw(st.integers(1, 2))
    seq, past = draw(st.integers(1, 4)), draw(st.integers(0, 4))
    four_d = draw(st.booleans())
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))

    def x(n, s):
        shape = (batch, n, s, head) if four_d else (batch, s, n * head)
        return rng.standard_normal(shape).astype(np.float32)
    inputs = {"Q": x(heads, seq), "K": x(kv_heads, seq), "V": x(kv_heads, seq),
              "attn_mask": None, "past_key": None, "past_value": None}
    if draw(st.booleans()):  # a bool padding mask over the whole (past + new) key range
        keep = rng.random((batch, 1, 1, past + seq)) < 0.8
        keep[..., 0] = True  # onnxruntime wants the mask's query axis at full extent
        inputs["attn_mask"] = np.repeat(keep, seq, axis=2)
    if past:
        inputs["past_key"] = rng.standard_normal((batch, kv_heads, past, head)).astype(np.float32)
        inputs["past_value"] = rng.standard_normal((batch, kv_heads, past, head)).astype(np.float32)
    attrs = dict(is_causal=int(draw(st.booleans())))
    if not four_d:
        attrs.update(q_num_heads=heads, kv_num_heads=kv_heads)
    outputs = ["Y"] + (["present_key", "present_value"] if past else [])
    case = one_node("Attention", "", inputs, outputs, f"Attention {attrs} past={past}", **attrs)
    case.model.opset_import[0].version = 23
    return OpCase(case.model, case.feeds, case.outputs, case.label, case.host_inputs)


@given(case=attention_cases())
def test_attention_matches_onnxruntime_cpu(case):
    assert_agree(run_native_host(case), run_ort(case), case.label)


def test_the_float_remainder_is_numpys_bit_for_bit_on_every_edge():
    """Mod (fmod=0) on floats is written out as numpy computes it, so that a backend whose own
    float mod differs (CuPy gives NaN for an infinite divisor: seen on the H200, run 18)
    computes what the host computes: every pair of zeros, infinities, NaN and ordinary values
    in three float dtypes, the 16-bit one through float32 as numpy does."""
    from engines.native.ops.elementwise import _python_mod

    values = [0.0, -0.0, 1.0, -1.0, 5.0, -5.0, 2.5, -2.5, np.inf, -np.inf, np.nan, 1e-30, 3e4,
              7.25]
    for dtype in (np.float16, np.float32, np.float64):
        a, b = (x.ravel() for x in np.meshgrid(np.array(values, dtype), np.array(values, dtype)))
        with np.errstate(all="ignore"):
            want, got = np.mod(a, b), _python_mod(np, a, b)
        assert got.dtype == want.dtype
        nan = np.isnan(want)
        assert (np.isnan(got) == nan).all()
        assert got[~nan].tobytes() == want[~nan].tobytes()
