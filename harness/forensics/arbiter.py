"""The runs explain compares: the arbiter (the native executor in float64 on the host), its
float32 twin (the same executor, no cast) and onnxruntime's CPU provider, each with every
intermediate value exposed.

* ``float64_model(model)``: a copy of a component's graph in float64. Float initializers,
  float graph inputs, outputs and value_info, ``Cast``/``Constant``/``ConstantOfShape`` to a
  float type become float64; integer and shape arithmetic is left as it is. A mixed-precision
  graph's casts down to float16 become casts to float64 as well: the arbiter computes the
  model's function, not its rounding.
* ``PlanRunner``: a native ``Plan`` over numpy, run with ``observe=`` so every run-time step's
  output comes back (in execution order).
* ``OrtRunner``: a copy of the model whose graph outputs are every intermediate value we
  want (types from the native run's observed dtypes, so no shape inference is needed; shape
  inference is only the fallback for names no native run observed), run on onnxruntime's
  CPU provider with the settings of the ``ort-cpu`` engine.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from engines.native.array_backend import NumpyArrayBackend
from engines.native.plan import Plan

FLOAT_ELEMS = (TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16,
               TensorProto.DOUBLE)


def to_host(value: Any) -> np.ndarray:
    """A host numpy copy of an engine value (CuPy arrays are fetched: forensics only).

    A device array is read once its device is idle. A device engine queues its work on a
    non-blocking stream of its own, which a plain ``get`` (a copy on the current stream) does
    not wait for: read straight after ``run_component`` returned, the copy raced the forward's
    last kernels and brought back whatever the buffer held before (on the H200, wrong logits
    after a verification: docs/evidence/2026-12-04-h200-readback/)."""
    if isinstance(value, np.ndarray):
        return value
    get = getattr(value, "get", None)
    if callable(get) and not isinstance(value, (dict, list, tuple)):
        idle = getattr(getattr(value, "device", None), "synchronize", None)
        if callable(idle):
            idle()
        return np.asarray(get())
    return np.asarray(value)


def _to_f64(tensor: onnx.TensorProto) -> onnx.TensorProto:
    array = numpy_helper.to_array(tensor)
    return numpy_helper.from_array(np.asarray(array, dtype=np.float64), tensor.name)


def float64_model(model: onnx.ModelProto) -> onnx.ModelProto:
    """A float64 copy of ``model`` (see the module docstring); the input is not changed."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    for i, init in enumerate(graph.initializer):
        if init.data_type in FLOAT_ELEMS[:3]:
            graph.initializer[i].CopyFrom(_to_f64(init))
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type in FLOAT_ELEMS:
            vi.type.tensor_type.elem_type = TensorProto.DOUBLE
    for node in graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        for attr in node.attribute:
            if node.op_type == "Cast" and attr.name == "to" and attr.i in FLOAT_ELEMS:
                attr.i = TensorProto.DOUBLE
            elif attr.type == onnx.AttributeProto.TENSOR and attr.t.data_type in FLOAT_ELEMS[:3]:
                attr.t.CopyFrom(_to_f64(attr.t))
        if node.op_type == "Constant":
            for attr in list(node.attribute):
                if attr.name in ("value_float", "value_floats"):
                    values = [attr.f] if attr.name == "value_float" else list(attr.floats)
                    array = np.asarray(values[0] if attr.name == "value_float" else values,
                                       dtype=np.float64)
                    node.attribute.remove(attr)
                    node.attribute.append(helper.make_attribute(
                        "value", numpy_helper.from_array(array)))
    return out


def cast_feeds(feeds: Mapping[str, Any], float_dtype=np.float64) -> dict[str, np.ndarray]:
    """Host copies of ``feeds`` with every float array cast to ``float_dtype``."""
    out = {}
    for name, value in feeds.items():
        array = to_host(value)
        out[name] = array.astype(float_dtype) if array.dtype.kind == "f" or \
            array.dtype.name == "bfloat16" else array.copy()
    return out


@dataclass
class Observed:
    """One run with every intermediate: graph outputs, and each observed value by name in
    execution order (``order``), with the node that produced it."""
    outputs: dict[str, np.ndarray]
    values: dict[str, np.ndarray] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)
    producer: dict[str, onnx.NodeProto] = field(default_factory=dict)

    def observe(self, node, name, value) -> None:
        self.values[name] = np.array(to_host(value), copy=True)
        self.order.append(name)
        self.producer[name] = node


class PlanRunner:
    """The native executor on the host: ``float64`` for the arbiter, else the model as it
    is (the arbiter's float32 execution)."""

    def __init__(self, model: onnx.ModelProto, float64: bool):
        self.float64 = float64
        self.model = float64_model(model) if float64 else model
        self.plan = Plan(self.model, NumpyArrayBackend())
        self.label = "arbiter (native, float64)" if float64 else "native float32"

    def prepare(self, feeds: Mapping[str, Any]) -> dict[str, np.ndarray]:
        if self.float64:
            return cast_feeds(feeds, np.float64)
        return {k: np.array(to_host(v), copy=True) for k, v in feeds.items()}

    def run(self, feeds: Mapping[str, Any], observe: bool = True) -> Observed:
        got = Observed({})
        out = self.plan.run(self.prepare(feeds), observe=got.observe if observe else None)
        got.outputs = {k: np.array(to_host(v), copy=True) for k, v in out.items()}
        return got


class OrtRunner:
    """onnxruntime's CPU provider (the ``ort-cpu`` engine's options) on a copy of the model
    whose outputs include the requested intermediates."""

    label = "onnxruntime CPU"

    def __init__(self, model: onnx.ModelProto, wanted: Mapping[str, np.dtype]):
        self.model = with_outputs(model, wanted)
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        self.session = ort.InferenceSession(self.model.SerializeToString(),
                                            sess_options=options,
                                            providers=["CPUExecutionProvider"])
        self.output_names = [o.name for o in self.session.get_outputs()]
        self.graph_outputs = [o.name for o in model.graph.output]
        self.input_names = [i.name for i in self.session.get_inputs()]

    def run(self, feeds: Mapping[str, Any], observe: bool = True) -> Observed:
        feed = {k: np.array(to_host(v), copy=True) for k, v in feeds.items()
                if k in self.input_names}
        values = self.session.run(None, feed)
        got = dict(zip(self.output_names, values))
        outputs = {k: got[k] for k in self.graph_outputs if k in got}
        result = Observed(outputs)
        if observe:
            result.values = {k: v for k, v in got.items()}
            result.order = list(self.output_names)
        return result


_NP_TO_ELEM = {np.dtype(np.float32): TensorProto.FLOAT, np.dtype(np.float64): TensorProto.DOUBLE,
               np.dtype(np.float16): TensorProto.FLOAT16, np.dtype(np.int64): TensorProto.INT64,
               np.dtype(np.int32): TensorProto.INT32, np.dtype(np.bool_): TensorProto.BOOL,
               np.dtype(np.int8): TensorProto.INT8, np.dtype(np.uint8): TensorProto.UINT8}


def _inferred_types(model: onnx.ModelProto) -> dict[str, int]:
    """Element types by shape inference: only a fallback (it can fail on large or custom
    graphs; then the value is left out)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    except Exception:
        return {}
    return {vi.name: vi.type.tensor_type.elem_type for vi in inferred.graph.value_info
            if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type}


def with_outputs(model: onnx.ModelProto, wanted: Mapping[str, Any] | Iterable[str]
                 ) -> onnx.ModelProto:
    """A copy of ``model`` with every produced value in ``wanted`` added as a graph output,
    typed from ``wanted``'s dtypes (a mapping name -> numpy dtype) or shape inference."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    graph = out.graph
    existing = {o.name for o in graph.output}
    produced = {y for n in graph.node for y in n.output if y}
    dtypes = dict(wanted) if isinstance(wanted, Mapping) else {k: None for k in wanted}
    fallback = None
    for name, dtype in dtypes.items():
        if name in existing or name not in produced:
            continue
        elem = _NP_TO_ELEM.get(np.dtype(dtype)) if dtype is not None else None
        if elem is None:
            if fallback is None:
                fallback = _inferred_types(model)
            elem = fallback.get(name)
        if elem is None:
            continue
        graph.output.append(helper.make_tensor_value_info(name, elem, None))
        existing.add(name)
    return out
