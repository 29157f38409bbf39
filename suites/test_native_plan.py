"""The native executor's Plan: build-time errors, host-resolved shape arithmetic, freeing,
and the LLaMA fixtures run with no device value ever reaching a host read."""
from __future__ import annotations

import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from engines.errors import ExecutionError, InputError
from engines.native.array_backend import NumpyArrayBackend
from engines.native.ops import KERNELS
from engines.native.plan import Plan, required_host_inputs
from engines.tolerances import tolerance_for

FLOAT, INT64 = TensorProto.FLOAT, TensorProto.INT64


def model(nodes, inputs, outputs, initializers=(), opset=18):
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info(n, t, s) for n, t, s in inputs],
        [helper.make_tensor_value_info(n, t, None) for n, t in outputs],
        initializer=[numpy_helper.from_array(np.asarray(v), n) for n, v in initializers])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)],
                             ir_version=8)


class GuardedArray(np.ndarray):
    """A stand-in for a device array: any scalar or list read of it fails the test."""

    def _read(self, *args, **kwargs):
        raise AssertionError("a device value was read back on the host")

    item = tolist = __int__ = __float__ = __bool__ = __index__ = _read


class _GuardedNumpy:
    """numpy, except every array a function returns is a GuardedArray (a device value)."""

    def __getattr__(self, name):
        attr = getattr(np, name)
        if isinstance(attr, type) or not callable(attr):
            return attr

        def wrapped(*args, **kwargs):
            result = attr(*args, **kwargs)
            return result.view(GuardedArray) if isinstance(result, np.ndarray) else result

        return wrapped


class GuardedBackend(NumpyArrayBackend):
    """NumpyArrayBackend whose arrays are all GuardedArrays; counts adoptions."""

    def __init__(self):
        super().__init__()
        self.xp = _GuardedNumpy()
        self.adopted = 0

    def adopt(self, host_array):
        self.adopted += 1
        return np.asarray(host_array, order="C").view(GuardedArray)


def guard_host_slots(plan: Plan) -> None:
    """Wrap every step so a backend array arriving in a host-read slot fails the test."""
    for step in plan.steps:
        kernel = step.kernel

        def checked(be, *args, _kernel=kernel, _label=step.label):
            for slot in _kernel.host_inputs:
                assert not (slot < len(args) and isinstance(args[slot], GuardedArray)), \
                    f"{_label}: host slot {slot} got a device value"
            return _kernel(be, *args)

        checked.host_inputs = kernel.host_inputs
        step.kernel = checked


def test_unsupported_ops_are_listed_at_build():
    m = model([helper.make_node("Loop", ["x"], ["a"]),
               helper.make_node("Hardmax", ["a"], ["b"]),
               helper.make_node("Foo", ["b"], ["y"], domain="com.example")],
              [("x", FLOAT, [2])], [("y", FLOAT)])
    with pytest.raises(ExecutionError) as err:
        Plan(m, NumpyArrayBackend())
    text = str(err.value)
    assert "Loop" in text and "Hardmax" in text and "com.example:Foo" in text
    assert "out of scope" in text and err.value.field == "graph.node.op_type"


def _reshape_model(shape_from_input: bool):
    nodes = [helper.make_node("Reshape", ["x", "shp"], ["y"], name="the_reshape")]
    inputs = [("x", FLOAT, [2, 3])]
    if shape_from_input:
        inputs.append(("shp", INT64, [2]))
    else:  # shape = [Shape(x)[1], -1], all shape arithmetic
        nodes = [helper.make_node("Shape", ["x"], ["s"]),
                 helper.make_node("Gather", ["s", "one"], ["d1"]),
                 helper.make_node("Concat", ["d1", "minus_one"], ["shp"], axis=0)] + nodes
    inits = [("one", np.array([1], np.int64)), ("minus_one", np.array([-1], np.int64))]
    return model(nodes, inputs, [("y", FLOAT)], [] if shape_from_input else inits)


def test_host_slot_fed_by_a_device_value_names_the_node_and_input():
    with pytest.raises(ExecutionError) as err:
        Plan(_reshape_model(True), NumpyArrayBackend())
    assert err.value.field == "Reshape.input[1]" and err.value.value == "shp"
    assert "the_reshape" in str(err.value) and err.value.remedy


def test_declared_host_input_and_shape_arithmetic_both_build():
    m = _reshape_model(True)
    assert required_host_inputs(m) == {"shp"}
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    plan = Plan(m, NumpyArrayBackend(), host_inputs={"shp"})
    assert plan.run({"x": x, "shp": np.array([3, 2])})["y"].shape == (3, 2)

    plan = Plan(_reshape_model(False), NumpyArrayBackend())
    assert {"s", "d1", "shp"} <= plan.host_resolved
    np.testing.assert_array_equal(plan.run({"x": x})["y"], x.reshape(3, 2))


def test_shape_arithmetic_reaches_host_slots_as_host_values():
    be = GuardedBackend()
    plan = Plan(_reshape_model(False), be)
    guard_host_slots(plan)
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    y = plan.run({"x": be.adopt(x)})["y"]
    assert isinstance(y, GuardedArray)
    np.testing.assert_array_equal(np.asarray(y), x.reshape(3, 2))


def test_a_value_derived_from_data_cannot_feed_a_host_slot():
    m = model([helper.make_node("ReduceMax", ["x"], ["mx"], keepdims=0),
               helper.make_node("Cast", ["mx"], ["n"], to=INT64),
               helper.make_node("Unsqueeze", ["n", "zero"], ["n1"]),
               helper.make_node("Reshape", ["x", "n1"], ["y"], name="r")],
              [("x", FLOAT, [4])], [("y", FLOAT)], [("zero", np.array([0], np.int64))])
    with pytest.raises(ExecutionError) as err:
        Plan(m, NumpyArrayBackend())
    # Unsqueeze's data input is a device value, so its output is one too.
    assert err.value.value == "n1" and "'r'" in str(err.value)


def test_feeds_are_checked_by_name_dtype_and_rank():
    plan = Plan(_reshape_model(False), NumpyArrayBackend())
    x = np.zeros((2, 3), np.float32)
    with pytest.raises(InputError) as err:
        plan.run({})
    assert err.value.value == ["x"]
    with pytest.raises(InputError) as err:
        plan.run({"x": x, "extra": x})
    assert err.value.value == ["extra"]
    with pytest.raises(InputError) as err:
        plan.run({"x": x.astype(np.float64)})
    assert err.value.field == "feeds['x'].dtype"
    with pytest.raises(InputError):
        plan.run({"x": np.zeros((3, 2), np.float32)})


def test_kernel_failures_name_the_node():
    m = model([helper.make_node("Reshape", ["x", "shp"], ["y"], name="bad_reshape")],
              [("x", FLOAT, [2, 3])], [("y", FLOAT)], [("shp", np.array([4, 2], np.int64))])
    plan = Plan(m, NumpyArrayBackend())
    with pytest.raises(ExecutionError) as err:
        plan.run({"x": np.zeros((2, 3), np.float32)})
    assert "bad_reshape" in str(err.value) and err.value.field == "shape"


def test_static_shape_arithmetic_folds_at_build_and_adopts_once():
    w = np.ones((3, 4), np.float32)
    m = model([helper.make_node("Shape", ["w"], ["s"]),
               helper.make_node("Reshape", ["x", "s"], ["x2"]),
               helper.make_node("Add", ["x2", "w"], ["y"])],
              [("x", FLOAT, [12])], [("y", FLOAT)], [("w", w)])
    be = GuardedBackend()
    plan = Plan(m, be)
    assert [s.label for s in plan.steps] == ["node '#1' (Reshape)", "node '#2' (Add)"]
    adopted_at_build = be.adopted
    assert adopted_at_build == 1  # w, once
    out = plan.run({"x": be.adopt(np.arange(12, dtype=np.float32))})
    assert be.adopted == adopted_at_build + 1  # only the feed above
    np.testing.assert_array_equal(np.asarray(out["y"]), np.arange(12).reshape(3, 4) + 1)


def test_weight_only_ops_fold_on_the_backend_at_build():
    w = np.arange(12, dtype=np.float32).reshape(4, 3)
    m = model([helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
               helper.make_node("MatMul", ["x", "wt"], ["y"])],
              [("x", FLOAT, [2, 3])], [("y", FLOAT), ("wt", FLOAT)], [("w", w)])
    be = GuardedBackend()
    plan = Plan(m, be)
    assert [s.label for s in plan.steps] == ["node '#1' (MatMul)"]
    x = np.ones((2, 3), np.float32)
    out = plan.run({"x": be.adopt(x)})
    assert isinstance(out["wt"], GuardedArray)
    np.testing.assert_array_equal(np.asarray(out["y"]), x @ w.T)


def test_intermediates_are_freed_after_their_last_reader():
    nodes = [helper.make_node("Relu", ["x"], ["a"]),
             helper.make_node("Neg", ["a"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["c"]),
             helper.make_node("Mul", ["c", "c"], ["y"])]
    plan = Plan(model(nodes, [("x", FLOAT, [3])], [("y", FLOAT), ("b", FLOAT)]),
                NumpyArrayBackend())
    freed = [set(step.free) for step in plan.steps]
    assert freed == [{"x"}, set(), {"a"}, {"c"}]  # "b" is an output: kept


def test_erf_matches_math_erf():
    x = np.concatenate([np.linspace(-7, 7, 4001), [-40.0, 0.0, 2.999999, 3.0, 3.000001, 40.0]])
    want = np.array([math.erf(v) for v in x])
    erf = KERNELS["Erf"](helper.make_node("Erf", ["x"], ["y"]), 18)
    be = NumpyArrayBackend()
    assert np.max(np.abs(erf(be, x)[0] - want)) < 1e-13
    np.testing.assert_allclose(erf(be, x.astype(np.float32))[0], want.astype(np.float32),
                               rtol=2e-7, atol=1e-7)


@pytest.mark.claim("zero_staging", "logits_within_tolerance", "batch_invariance")
@pytest.mark.parametrize("cache,dtype,tied", [
    ("append", "float32", False), ("static", "float32", True),
    ("append", "float16", True), ("static", "float16", False)])
def test_llama_fixture_runs_without_device_reads_and_matches_ort(cache, dtype, tied):
    from harness.convert.llama_config import LlamaConfig
    from harness.convert.llama_graph import llama_model

    config = LlamaConfig(cache=cache, dtype=dtype, tied=tied)
    m = llama_model(config)
    seq = 0 if cache == "append" else config.max_context
    feeds = {"input_ids": np.array([[1, 17, 42, 5, 9]], np.int64),
             "position_ids": np.arange(5, dtype=np.int64)[None]}
    for i in range(config.layers):
        for kind in ("key", "value"):
            feeds[f"past_{kind}_{i}"] = np.zeros((1, config.kv_heads, seq, config.head_dim),
                                                 dtype)
    assert required_host_inputs(m) == set()

    be = GuardedBackend()
    plan = Plan(m, be)
    guard_host_slots(plan)
    out = plan.run({k: be.adopt(v) for k, v in feeds.items()})
    host = Plan(m, NumpyArrayBackend()).run(feeds)
    for name, value in host.items():
        assert isinstance(out[name], GuardedArray), name
        np.testing.assert_array_equal(np.asarray(out[name]), value, err_msg=name)

    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    ref = dict(zip([o.name for o in session.get_outputs()], session.run(None, feeds)))
    tol = tolerance_for(dtype)
    for name, value in ref.items():
        got, want = host[name].astype(np.float64), value.astype(np.float64)
        nmse = np.sum((got - want) ** 2) / np.sum(want ** 2)
        assert nmse <= tol.nmse, (name, nmse)

    # Batch invariance end to end: a 3-position prefix reproduces the first 3 rows exactly.
    prefix = Plan(m, NumpyArrayBackend()).run(
        {k: (v[:, :3] if k in ("input_ids", "position_ids") else v) for k, v in feeds.items()})
    np.testing.assert_array_equal(prefix["logits"], host["logits"][:, :3])
