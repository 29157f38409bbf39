"""Ops whose output shape depends on values: how a plan handles them without reading a
device value back to learn a shape.

- TopK's k and OneHot's depth are host inputs: shape arithmetic, or refused when the plan
  is built (on every backend, by the host-slot rule).
- NonZero reads its count from its input's values: free on the host backend; on a device
  backend it runs only when its input is host-resolved (then it runs on the host, like
  any shape arithmetic) and is refused at build otherwise. The device here is a fake: the
  numpy backend under a device residency, so the rule is checked on a machine without one.
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from engines.errors import ExecutionError
from engines.native.array_backend import NumpyArrayBackend
from engines.native.plan import Plan


class FakeDeviceBackend(NumpyArrayBackend):
    residency = "cuda:0"


def _model(nodes, inputs, outputs):
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_empty_tensor_value_info(o)
                                                   for o in outputs])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)])


X = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])
NONZERO_OF_INPUT = _model([helper.make_node("NonZero", ["x"], ["idx"])], [X], ["idx"])
# NonZero over the input's shape (shape arithmetic): [[0, 1]] for x [2, 3]
NONZERO_OF_SHAPE = _model([helper.make_node("Shape", ["x"], ["s"]),
                           helper.make_node("NonZero", ["s"], ["idx"])], [X], ["idx"])


def test_nonzero_of_a_device_value_runs_on_the_host_backend():
    x = np.array([[0, 1.5, 0], [2, 0, -1]], np.float32)
    (idx,) = Plan(NONZERO_OF_INPUT, NumpyArrayBackend()).run({"x": x}).values()
    np.testing.assert_array_equal(idx, np.array(np.nonzero(x)))
    assert idx.dtype == np.int64


def test_nonzero_of_a_device_value_is_refused_on_a_device_when_planned():
    with pytest.raises(ExecutionError) as info:
        Plan(NONZERO_OF_INPUT, FakeDeviceBackend())
    err = info.value
    assert err.field == "NonZero.input[0]" and err.value == "x"
    assert "host" in err.remedy and "NonZero" in str(err)


def test_nonzero_of_shape_arithmetic_runs_on_the_host_inside_a_device_plan():
    plan = Plan(NONZERO_OF_SHAPE, FakeDeviceBackend())
    (step,) = [s for s in plan.steps if type(s.kernel).__name__ == "NonZero"]
    assert step.backend is plan.host
    assert "idx" in plan.host_resolved


def test_topk_with_k_computed_from_device_values_is_refused_on_every_backend():
    k_from_values = [helper.make_node("ReduceMax", ["x"], ["m"], keepdims=0),
                     helper.make_node("Cast", ["m"], ["k0"], to=TensorProto.INT64),
                     helper.make_node("Reshape", ["k0", "one"], ["k"]),
                     helper.make_node("TopK", ["x", "k"], ["v", "i"])]
    model = _model(k_from_values, [X], ["v", "i"])
    model.graph.initializer.append(helper.make_tensor("one", TensorProto.INT64, [1], [1]))
    for backend in (NumpyArrayBackend(), FakeDeviceBackend()):
        with pytest.raises(ExecutionError) as info:
            Plan(model, backend)
        assert info.value.field == "TopK.input[1]" and info.value.value == "k"


def test_topk_keeps_the_lower_index_first_among_equal_values():
    x = np.array([[3, 1, 3, 2, 3]], np.float32)
    model = _model([helper.make_node("TopK", ["x", "k"], ["v", "i"], largest=1),
                    helper.make_node("TopK", ["x", "k"], ["sv", "si"], largest=0)],
                   [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 5])],
                   ["v", "i", "sv", "si"])
    model.graph.initializer.append(helper.make_tensor("k", TensorProto.INT64, [1], [4]))
    out = Plan(model, NumpyArrayBackend()).run({"x": x})
    np.testing.assert_array_equal(out["i"], [[0, 2, 4, 3]])
    np.testing.assert_array_equal(out["si"], [[1, 3, 0, 2]])
