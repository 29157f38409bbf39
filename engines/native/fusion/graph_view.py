"""A read-only index over a graph's nodes for the recognisers: who produces a value, who
reads it, which values are constants. Recognisers match by structure (op types, wiring,
constant values), never by node or value names."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import helper, numpy_helper

FUSED_DOMAIN = "lockstep.fused"
_SMALL = 4096  # elements: constants larger than this are never read by a recogniser


@dataclass
class Fusion:
    """One match: the nodes it replaces and the node that replaces them."""
    removed: list[onnx.NodeProto]
    node: onnx.NodeProto
    kind: str


class GraphView:
    def __init__(self, nodes: list[onnx.NodeProto], initializers, outputs):
        self.nodes = nodes
        self.inits = {t.name: t for t in initializers}
        self.outputs = set(outputs)
        self.producer: dict[str, onnx.NodeProto] = {}
        self.consumers: dict[str, list[onnx.NodeProto]] = defaultdict(list)
        for node in nodes:
            for y in node.output:
                if y:
                    self.producer[y] = node
            for x in node.input:
                if x:
                    self.consumers[x].append(node)

    # -- structure ---------------------------------------------------------------------------
    def prod(self, name: str, op_type: str) -> onnx.NodeProto | None:
        """The node producing ``name`` if it is a default-domain ``op_type``, else None."""
        node = self.producer.get(name)
        if node is None or node.op_type != op_type or node.domain not in ("", "ai.onnx"):
            return None
        return node

    def only_read_by(self, name: str, readers) -> bool:
        """``name`` is no graph output and every reader is one of ``readers`` (by identity)."""
        if name in self.outputs:
            return False
        ids = {id(r) for r in readers}
        return all(id(c) in ids for c in self.consumers.get(name, ()))

    def sole_reader(self, name: str) -> onnx.NodeProto | None:
        readers = self.consumers.get(name, ())
        if name in self.outputs or len(readers) != 1:
            return None
        return readers[0]

    # -- constants ---------------------------------------------------------------------------
    def const(self, name: str) -> np.ndarray | None:
        """A small initializer's or Constant node's value, else None."""
        tensor = self.inits.get(name)
        if tensor is None:
            node = self.prod(name, "Constant")
            if node is None or len(node.attribute) != 1 or node.attribute[0].name != "value":
                return None
            tensor = node.attribute[0].t
        if int(np.prod(tensor.dims, dtype=np.int64)) > _SMALL:
            return None
        return numpy_helper.to_array(tensor)

    def scalar(self, name: str) -> np.ndarray | None:
        """A one-element float constant (as a 0-d array of its own dtype), else None."""
        value = self.const(name)
        if value is None or value.size != 1 or not _is_float(value.dtype):
            return None
        return value.reshape(())

    def ints(self, name: str) -> list[int] | None:
        value = self.const(name)
        if value is None or value.dtype.kind not in "iu":
            return None
        return [int(v) for v in value.reshape(-1)]

    def is_float_init(self, name: str, rank: int | None = None) -> bool:
        tensor = self.inits.get(name)
        if tensor is None or tensor.data_type not in _FLOAT_TYPES:
            return False
        return rank is None or len(tensor.dims) == rank


def _is_float(dtype: np.dtype) -> bool:
    return dtype.kind == "f" or dtype.name == "bfloat16"  # ml_dtypes' bfloat16 is kind "V"


_FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
                onnx.TensorProto.DOUBLE}


def attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            return helper.get_attribute_value(a)
    return default


def axes_of(view: GraphView, node: onnx.NodeProto) -> list[int] | None:
    """A Reduce*/Unsqueeze node's axes: the attribute (old opsets) or the constant input."""
    value = attr(node, "axes")
    if value is not None:
        return [int(v) for v in value]
    if len(node.input) > 1 and node.input[1]:
        return view.ints(node.input[1])
    return None


def slice_bounds(view: GraphView, node: onnx.NodeProto) -> tuple[int, int, int] | None:
    """(start, end, axis) of a one-axis, step-1 Slice with constant bounds, else None."""
    if node.op_type != "Slice" or len(node.input) < 4:
        return None
    starts, ends, axes = (view.ints(node.input[i]) for i in (1, 2, 3))
    if len(node.input) > 4 and node.input[4]:
        steps = view.ints(node.input[4])
        if steps != [1]:
            return None
    if not starts or not ends or not axes or len(starts) != 1 or len(ends) != 1 \
            or len(axes) != 1:
        return None
    return starts[0], ends[0], axes[0]


def other_input(node: onnx.NodeProto, name: str) -> str | None:
    """The other input of a binary node one of whose inputs is ``name``."""
    if len(node.input) != 2:
        return None
    a, b = node.input
    if a == name:
        return b
    if b == name:
        return a
    return None


def cast_to(node: onnx.NodeProto | None) -> int | None:
    """A Cast node's target element type (None for any other node)."""
    if node is None or node.op_type != "Cast":
        return None
    return attr(node, "to")


def make_fused(op_type: str, inputs, outputs, anchor: onnx.NodeProto, **attrs) -> onnx.NodeProto:
    name = f"{anchor.name or anchor.output[0]}/{op_type}"
    return helper.make_node(op_type, list(inputs), list(outputs), name=name,
                            domain=FUSED_DOMAIN, **attrs)


def scalar_attrs(prefix: str, value: np.ndarray) -> dict:
    """A float scalar as two attributes: its value and its ONNX element type, so the
    host kernel rebuilds the very same 0-d array (value and dtype) the graph held."""
    return {prefix: float(value), f"{prefix}_type":
            helper.np_dtype_to_tensor_dtype(value.dtype)}
