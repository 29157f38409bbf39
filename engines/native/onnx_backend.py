"""``onnx.backend.base.Backend`` over Plan + NumpyArrayBackend, for ONNX's own node tests.

Graph inputs that flow into host-read slots (a Reshape shape fed as an input, as the node
tests do) are declared host inputs: here every value is a numpy array anyway, and the plan
still separates shape arithmetic from data exactly as it does for a device backend.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import onnx
from onnx import helper
from onnx.backend.base import Backend, BackendRep

from engines.errors import EngineUnavailable, InputError

from .array_backend import NumpyArrayBackend
from .plan import Plan, required_host_inputs


class NativeBackendRep(BackendRep):
    """A prepared model: ``run`` takes inputs in graph order (or by name)."""

    def __init__(self, plan: Plan):
        self.plan = plan

    def run(self, inputs: Any, **kwargs: Any) -> tuple[Any, ...]:
        names = self.plan.input_names
        if isinstance(inputs, Mapping):
            feeds = dict(inputs)
        else:
            if isinstance(inputs, np.ndarray):
                inputs = [inputs]
            if len(inputs) != len(names):
                raise InputError("wrong number of inputs", field="inputs", value=len(inputs),
                                 remedy=f"give {len(names)} in this order: {names}")
            feeds = dict(zip(names, inputs))
        feeds = {k: (np.asarray(v) if isinstance(v, (np.generic, int, float, bool)) else v)
                 for k, v in feeds.items()}
        out = self.plan.run(feeds)
        return tuple(out[name] for name in self.plan.output_names)


class NativeBackend(Backend):
    @classmethod
    def supports_device(cls, device: str) -> bool:
        return device.upper() == "CPU"

    @classmethod
    def prepare(cls, model: onnx.ModelProto, device: str = "CPU",
                **kwargs: Any) -> NativeBackendRep:
        if not cls.supports_device(device):
            raise EngineUnavailable("the native ONNX backend runs on the host only",
                                    field="device", value=device, remedy="use device='CPU'")
        onnx.checker.check_model(model)
        backend = NumpyArrayBackend()
        return NativeBackendRep(Plan(model, backend, host_inputs=required_host_inputs(model)))

    @classmethod
    def run_model(cls, model: onnx.ModelProto, inputs: Any, device: str = "CPU",
                  **kwargs: Any) -> tuple[Any, ...]:
        return cls.prepare(model, device, **kwargs).run(inputs)

    @classmethod
    def run_node(cls, node: onnx.NodeProto, inputs: Any, device: str = "CPU",
                 outputs_info: Sequence[tuple[np.dtype, tuple[int, ...]]] | None = None,
                 **kwargs: Any) -> tuple[Any, ...]:
        super().run_node(node, inputs, device=device, outputs_info=outputs_info, **kwargs)
        present = [x for x in node.input if x]
        graph = helper.make_graph(
            [node], f"run_node_{node.op_type}",
            inputs=[onnx.ValueInfoProto(name=x) for x in present],
            outputs=[onnx.ValueInfoProto(name=y) for y in node.output if y])
        opset = kwargs.get("opset_version", onnx.defs.onnx_opset_version())
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        plan = Plan(model, NumpyArrayBackend(), host_inputs=required_host_inputs(model))
        return NativeBackendRep(plan).run(inputs)


prepare = NativeBackend.prepare
run_model = NativeBackend.run_model
run_node = NativeBackend.run_node
supports_device = NativeBackend.supports_device
