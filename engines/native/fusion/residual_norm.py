"""A residual add feeding an RMSNorm: ``RMSNorm(Add(x, Cast(delta)))`` (the Cast only in a
mixed graph) as one ``lockstep.fused:AddRMSNorm`` with two outputs, the sum (the next
block's residual stream) and the normed row. Runs after ``rms_norm``, on its nodes."""
from __future__ import annotations

from .graph_view import FUSED_DOMAIN, Fusion, GraphView, attr, cast_to, make_fused


def match(view: GraphView, node) -> Fusion | None:
    if node.domain != FUSED_DOMAIN or node.op_type != "RMSNorm":
        return None
    add = view.prod(node.input[0], "Add")
    if add is None or len(add.input) != 2:
        return None
    residual, delta = add.input
    removed = [node, add]
    up = 0
    cast = view.prod(delta, "Cast")
    if cast is not None and view.only_read_by(delta, [add]):
        removed.append(cast)
        delta, up = cast.input[0], cast_to(cast)
    attrs = {a.name: attr(node, a.name) for a in node.attribute}
    fused = make_fused("AddRMSNorm", [residual, delta, node.input[1]],
                       [add.output[0], node.output[0]], node, up=up, **attrs)
    return Fusion(removed, fused, "AddRMSNorm")
