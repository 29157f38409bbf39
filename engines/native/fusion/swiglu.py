"""SwiGLU's elementwise part: ``Mul(Mul(g, Sigmoid(g)), up)`` as one
``lockstep.fused:SwiGLU``; a mixed graph's Casts up of ``g`` and ``up`` and its Cast down of
the product fold in (each only when nothing else reads it)."""
from __future__ import annotations

from .graph_view import Fusion, GraphView, cast_to, make_fused


def match(view: GraphView, node) -> Fusion | None:
    if node.op_type != "Mul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    inner = view.prod(node.input[0], "Mul")
    if inner is None or len(inner.input) != 2:
        return None
    up = node.input[1]
    sig = view.prod(inner.input[1], "Sigmoid")
    gate = inner.input[0]
    if sig is None or sig.input[0] != gate:
        return None
    pattern = [node, inner, sig]
    if not view.only_read_by(inner.output[0], pattern) \
            or not view.only_read_by(sig.output[0], pattern):
        return None
    attrs = {"up": 0, "to": 0}
    gate_cast, up_cast = view.prod(gate, "Cast"), view.prod(up, "Cast")
    if gate_cast is not None and up_cast is not None and gate_cast is not up_cast \
            and cast_to(gate_cast) == cast_to(up_cast) \
            and view.only_read_by(gate, pattern) and view.only_read_by(up, pattern):
        pattern += [gate_cast, up_cast]
        gate, up, attrs["up"] = gate_cast.input[0], up_cast.input[0], cast_to(gate_cast)
    out, last = node.output[0], node
    cast = view.sole_reader(out)
    if cast_to(cast) is not None:
        pattern.append(cast)
        out, attrs["to"], last = cast.output[0], cast_to(cast), cast
    return Fusion(pattern, make_fused("SwiGLU", [gate, up], [out], last, **attrs), "SwiGLU")
