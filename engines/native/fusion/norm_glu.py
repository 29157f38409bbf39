"""A NormMatMul over two weights (gate, up) whose two products only a SwiGLU reads, as one
``lockstep.fused:NormGLU``: on the device a block computes gate column n and up column n
together and stores SwiGLU of the pair, so the down projection becomes a plain GEMV and no
block recomputes SwiGLU over every row (what SwiGLUMatMul's prologue does). Runs after
``norm_matmul`` and ``swiglu``, before ``swiglu_matmul``; placed where the norm was.
SwiGLU's own attributes carry a ``glu_`` prefix (the norm has an ``up`` and a ``to`` too)."""
from __future__ import annotations

from .graph_view import FUSED_DOMAIN, Fusion, GraphView, attr, make_fused


def match(view: GraphView, node) -> Fusion | None:
    if node.domain != FUSED_DOMAIN or node.op_type != "SwiGLU":
        return None
    gate, up = node.input
    norm = view.producer.get(gate)
    if norm is None or norm.domain != FUSED_DOMAIN or norm.op_type != "NormMatMul" \
            or gate == up or list(norm.output[-2:]) != [gate, up]:
        return None
    lead = 3 if attr(norm, "add") else 2
    if len(norm.input) != lead + 2 or not view.only_read_by(gate, [node]) \
            or not view.only_read_by(up, [node]):
        return None
    attrs = {a.name: attr(norm, a.name) for a in norm.attribute}
    attrs.update({f"glu_{a.name}": attr(node, a.name) for a in node.attribute})
    fused = make_fused("NormGLU", list(norm.input), list(norm.output[:-2]) + list(node.output),
                       node, **attrs)
    return Fusion([norm, node], fused, "NormGLU")
