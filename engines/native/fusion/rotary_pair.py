"""Two rotary nodes over the same cos/sin with the same layout and casts (a layer's queries
and keys) as one ``lockstep.fused:Rotary2(x_a, x_b, cos, sin)``: one launch for both.
Runs after ``rotary``, on its nodes; each pairs with the next one in graph order unless
either reads the other's output."""
from __future__ import annotations

from .graph_view import FUSED_DOMAIN, Fusion, GraphView, attr, make_fused
from .kv_pair import depends_on

_SHARED = ("layout", "half", "up", "to")


def _is_rotary(node) -> bool:
    return node.domain == FUSED_DOMAIN and node.op_type == "Rotary"


def match(view: GraphView, node) -> Fusion | None:
    if not _is_rotary(node):
        return None
    order = {id(n): i for i, n in enumerate(view.nodes)}
    later = [n for n in view.consumers.get(node.input[1], ())
             if _is_rotary(n) and n is not node and order[id(n)] > order[id(node)]
             and n.input[1:3] == node.input[1:3]
             and all(attr(n, k) == attr(node, k) for k in _SHARED)]
    if not later:
        return None
    partner = min(later, key=lambda n: order[id(n)])
    if depends_on(view, partner, node) or depends_on(view, node, partner):
        return None
    attrs = {k: attr(node, k) for k in _SHARED}
    if isinstance(attrs["layout"], bytes):
        attrs["layout"] = attrs["layout"].decode()
    for suffix, source in (("a", node), ("b", partner)):
        attrs[f"scale_{suffix}"] = attr(source, "scale", 0.0)
        attrs[f"scale_{suffix}_type"] = attr(source, "scale_type", 0)
    fused = make_fused("Rotary2", [node.input[0], partner.input[0], node.input[1],
                                   node.input[2]], [node.output[0], partner.output[0]],
                       partner, **attrs)
    return Fusion([node, partner], fused, "Rotary2")
