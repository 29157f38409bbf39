"""A SwiGLU whose product only a MatMul by a 2-D weight reads (the down projection) as one
``lockstep.fused:SwiGLUMatMul``: on the device SwiGLU becomes the GEMV's prologue, one
launch instead of two. Runs after ``swiglu``, on its nodes; placed where SwiGLU was."""
from __future__ import annotations

from .graph_view import FUSED_DOMAIN, Fusion, GraphView, attr, make_fused
from .matmul_siblings import initializer_weight


def match(view: GraphView, node) -> Fusion | None:
    if node.domain != FUSED_DOMAIN or node.op_type != "SwiGLU":
        return None
    product = node.output[0]
    reader = view.sole_reader(product)
    if reader is None or initializer_weight(view, reader) is None \
            or reader.input[0] != product or reader.input[1] == product:
        return None
    attrs = {a.name: attr(node, a.name) for a in node.attribute}
    fused = make_fused("SwiGLUMatMul", list(node.input) + [reader.input[1]],
                       list(reader.output), reader, **attrs)
    return Fusion([node, reader], fused, "SwiGLUMatMul")
