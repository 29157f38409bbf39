"""The float32 reference of an onnxruntime-genai int4 build (``engines.backends.genai_dequant``).

Facts: on a small graph of the builder's shape (a ``MatMulNBits`` with and without bias and
zero points, a ``GatherBlockQuantized`` over a reshaped block table), the dequantized graph
has no quantized node left and computes what onnxruntime computes on the quantized one at
accuracy level 0 (float activations) to float32 rounding; the scheme is read from the graph
(bits, block size, accuracy level); a quantized input that is no constant is refused naming
it. On SmolLM2's int4 build (``make real``): the scheme, the cached reference package, and
its logits against lockstep's float32 conversion of the same checkpoint (int4 rounding of
every weight: far) and against onnxruntime on the int4 graph (close).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

from engines.errors import PackageError

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

K, N, V, BLOCK = 64, 48, 10, 32


def quantized_model(level: int = 0, with_bias: bool = True, zero_points: bool = True,
                    constant_table: bool = True):
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    blocks = K // BLOCK
    b = rng.integers(0, 256, (N, blocks, BLOCK // 2), dtype=np.uint8)
    scales = rng.uniform(0.01, 0.1, (N * blocks,)).astype(np.float32)
    zp = rng.integers(0, 256, (N * ((blocks + 1) // 2),), dtype=np.uint8)
    bias = rng.normal(0, 1, (N,)).astype(np.float32)
    table = rng.integers(0, 256, (V, blocks, BLOCK // 2), dtype=np.uint8)
    tscales = rng.uniform(0.01, 0.1, (V, blocks)).astype(np.float32)
    inits = [numpy_helper.from_array(x, n) for x, n in (
        (b, "B"), (scales, "scales"), (zp, "zp"), (bias, "bias"), (table, "table"),
        (tscales, "tscales"), (np.array([V, K // 2], np.int64), "flat"))]
    mm_inputs = ["A", "B", "scales", "zp" if zero_points else "", "",
                 "bias" if with_bias else ""]
    nodes = [
        helper.make_node("MatMulNBits", mm_inputs, ["Y"], domain="com.microsoft", K=K,
                         N=N, bits=4, block_size=BLOCK, accuracy_level=level, name="mm"),
        helper.make_node("Reshape", ["table" if constant_table else "T", "flat"], ["flat_t"],
                         name="reshape"),
        helper.make_node("GatherBlockQuantized", ["flat_t", "ids", "tscales"], ["G"],
                         domain="com.microsoft", bits=4, block_size=BLOCK, gather_axis=0,
                         quantize_axis=1, name="gather"),
    ]
    inputs = [helper.make_tensor_value_info("A", TensorProto.FLOAT, [1, 3, K]),
              helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 3])]
    if not constant_table:
        inputs.append(helper.make_tensor_value_info("T", TensorProto.UINT8, [V, 2, 16]))
    graph = helper.make_graph(nodes, "g", inputs,
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, None),
                               helper.make_tensor_value_info("G", TensorProto.FLOAT, None)],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                   helper.make_opsetid("com.microsoft", 1)])


def run(model, feeds):
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(model.SerializeToString(), options,
                                   providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("with_bias, zero_points", [(True, True), (False, False)])
def test_the_dequantized_graph_computes_what_onnxruntime_does_at_level_0(with_bias,
                                                                         zero_points):
    from engines.backends.genai_dequant import dequantize_graph

    model = quantized_model(0, with_bias, zero_points)
    feeds = {"A": np.random.default_rng(1).normal(0, 1, (1, 3, K)).astype(np.float32),
             "ids": np.array([[0, 7, 3]], np.int64)}
    want = run(model, feeds)
    replaced = dequantize_graph(model)
    assert replaced == {"MatMulNBits": 1, "GatherBlockQuantized": 1}
    ops = {n.op_type for n in model.graph.node}
    assert ops == {"MatMul", "Gather"} | ({"Add"} if with_bias else set())
    assert {t.name for t in model.graph.initializer} == (
        {"mm/dequantized_weight", "gather/dequantized_table"} | ({"bias"} if with_bias
                                                                  else set()))
    got = run(model, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[1], want[1])  # a gather: the same values exactly


def test_a_quantized_input_that_is_no_constant_is_refused_by_name():
    from engines.backends.genai_dequant import dequantize_graph

    with pytest.raises(PackageError) as err:
        dequantize_graph(quantized_model(constant_table=False))
    assert err.value.value == "T" and "gather" in err.value.where


def test_the_scheme_is_read_from_the_graph(tmp_path):
    from engines.backends.genai_dequant import build_scheme

    onnx.save(quantized_model(level=4), str(tmp_path / "model.onnx"))
    (tmp_path / "genai_config.json").write_text(json.dumps(
        {"model": {"decoder": {"filename": "model.onnx"}}}))
    scheme = build_scheme(tmp_path)
    assert scheme == {"numeric_scheme": "onnxruntime-cpu:matmulnbits-int4-b32-acc4",
                      "matmulnbits": {"int4-b32-acc4": 1},
                      "gather_block_quantized": {"int4-b32": 1}}
