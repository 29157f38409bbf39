"""Op kernels, one module per family, registered in one table keyed by op type.

ONNX's own ops are keyed by their op type; ops of another domain (onnxruntime's
``com.microsoft`` contrib ops, the fusion pass's ``lockstep.fused`` nodes) by
``domain:op_type`` (``kernel_key``). Subgraph ops (If,
Loop, Scan) are out of scope.
"""
from __future__ import annotations

from . import (activation, attention, bitwise, cast, contrib_attention, cumulative,
               elementwise, float_checks, fused, indexing, matmul, moe, nd_indexing, nn,
               normalization, quantized, reduction, rotary, scatter, selection, shape)
from .base import Kernel

_FAMILIES = (activation, attention, bitwise, cast, contrib_attention, cumulative,
             elementwise, float_checks, fused, indexing, matmul, moe, nd_indexing, nn,
             normalization, quantized, reduction, rotary, scatter, selection, shape)

ONNX_DOMAINS = ("", "ai.onnx")


def kernel_key(domain: str, op_type: str) -> str:
    """The KERNELS key of an op: its type in ONNX's domain, ``domain:type`` elsewhere."""
    return op_type if domain in ONNX_DOMAINS else f"{domain}:{op_type}"


def kernel_for(node) -> type[Kernel] | None:
    """The kernel class for a node (by its domain and op type), or None."""
    return KERNELS.get(kernel_key(node.domain, node.op_type))


KERNELS: dict[str, type[Kernel]] = {
    kernel_key(obj.domain, obj.op_type or name): obj
    for module in _FAMILIES
    for name, obj in vars(module).items()
    if isinstance(obj, type) and issubclass(obj, Kernel) and not name.startswith("_")
    and obj.__module__ == module.__name__
}

__all__ = ["KERNELS", "Kernel", "kernel_for", "kernel_key"]
