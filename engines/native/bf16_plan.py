"""Which components native-cuda plans for bfloat16, and the plan it gives them.

``Bf16Plan`` routes every backend step through ``bf16.bf16_call`` (the storage rules live in
``bf16``, which the device backend reads too; the plan lives here, so that ``bf16`` does
not depend on the planner that depends on the backend).
"""
from __future__ import annotations

import functools

from onnx import TensorProto

from engines.native.bf16 import bf16_call
from engines.native.plan import Plan


class Bf16Plan(Plan):
    """A ``Plan`` whose backend steps go through ``bf16_call`` (host-resolved steps, shape
    arithmetic on numpy, are untouched). Built by native-cuda for components that declare a
    bfloat16 value; every other component keeps the plain ``Plan``."""

    def _call(self, kernel, be, args, label):  # Plan._call is a staticmethod: same signature
        if be is self.backend:
            return Plan._call(functools.partial(bf16_call, kernel), be, args, label)
        return Plan._call(kernel, be, args, label)


def model_uses_bf16(model) -> bool:
    """Whether a component declares any bfloat16 value: an initializer, a graph input or
    output, a typed intermediate, or a Cast to bfloat16."""
    graph = model.graph
    if any(t.data_type == TensorProto.BFLOAT16 for t in graph.initializer):
        return True
    for v in list(graph.input) + list(graph.output) + list(graph.value_info):
        if v.type.HasField("tensor_type") and v.type.tensor_type.elem_type == TensorProto.BFLOAT16:
            return True
    for node in graph.node:
        for a in node.attribute:
            if node.op_type == "Cast" and a.name == "to" and a.i == TensorProto.BFLOAT16:
                return True
            if a.t.data_type == TensorProto.BFLOAT16:
                return True
    return False


__all__ = ["Bf16Plan", "model_uses_bf16"]
