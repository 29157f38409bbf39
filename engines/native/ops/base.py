"""The kernel contract: attributes parsed once at plan build, a call per run.

A kernel instance is bound to one node. ``__call__(be, *inputs)`` returns a tuple with one
value per node output. Inputs listed in ``host_inputs`` arrive as numpy arrays (the plan
proves at build time that they are shape arithmetic), so a kernel may read them with
``tolist()``; every other input is a backend array that must only be touched through
``be.xp`` or ``be.matmul`` / ``be.sum``, never read back.
"""
from __future__ import annotations

from typing import Any, ClassVar

import numpy as np
import onnx
from onnx import helper, numpy_helper

from engines.errors import ExecutionError


def attribute_values(node: onnx.NodeProto) -> dict[str, Any]:
    """Node attributes as Python values: strings decoded, tensors as numpy arrays."""
    out: dict[str, Any] = {}
    for attr in node.attribute:
        if attr.ref_attr_name:
            raise ExecutionError("attribute references only exist inside functions",
                                 field=f"{node.op_type}.{attr.name}", value=attr.ref_attr_name,
                                 remedy="inline the function body before planning")
        value = helper.get_attribute_value(attr)
        if isinstance(value, bytes):
            value = value.decode("utf-8")
        elif isinstance(value, onnx.TensorProto):
            value = numpy_helper.to_array(value)
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            value = [v.decode("utf-8") for v in value]
        out[attr.name] = value
    return out


class Kernel:
    """One op bound to one node; subclasses are named after the op they implement."""

    # The operator set domain the op belongs to ("" is ONNX's own; "com.microsoft" is
    # onnxruntime's contrib ops). Its key in KERNELS is the op type, domain-qualified if set.
    domain: ClassVar[str] = ""
    # The op type when the class name cannot be it (one name in two domains).
    op_type: ClassVar[str | None] = None
    # Input slots whose values the kernel reads on the host (shapes, axes, bounds).
    host_inputs: ClassVar[frozenset[int]] = frozenset()
    # True for ops that read only their inputs' metadata (Shape, Size): their outputs are
    # host values whatever their inputs are.
    metadata_only: ClassVar[bool] = False
    # True for ops whose output shape is read from their input values (NonZero): free on
    # the host; a device plan runs them only on host-resolved inputs and refuses the rest.
    value_dependent_shape: ClassVar[bool] = False

    def __init__(self, node: onnx.NodeProto, opset: int):
        self.node = node
        self.opset = opset
        self.attrs = attribute_values(node)
        self.n_outputs = len(node.output)
        self.setup()

    def setup(self) -> None:
        """Parse attributes into fields; runs once at plan build."""

    def attr(self, name: str, default: Any = None) -> Any:
        return self.attrs.get(name, default)

    def fail(self, message: str, *, field: str, value: Any, remedy: str) -> ExecutionError:
        where = f"node {self.node.name or '<unnamed>'!r} ({self.node.op_type})"
        return ExecutionError(message, field=field, value=value, remedy=remedy, where=where)

    def __call__(self, be, *inputs):  # pragma: no cover - every subclass overrides
        raise NotImplementedError


def host_ints(value: Any) -> list[int]:
    """A host-resolved integer tensor as a list of Python ints (never a device read)."""
    return [int(v) for v in np.asarray(value).reshape(-1).tolist()]


def norm_axis(axis: int, rank: int, kernel: Kernel, field: str = "axis") -> int:
    if not -rank <= axis < max(rank, 1):
        raise kernel.fail("axis out of range", field=field, value=axis,
                          remedy=f"use an axis in [-{rank}, {rank - 1}]")
    return axis % max(rank, 1)
