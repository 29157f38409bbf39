"""Two static-cache writes at the same positions (a layer's keys and values) as one
``lockstep.fused:KVWrite2(old_a, new_a, old_b, new_b, positions)``: one launch for both.
Runs after ``kv_write``, on its nodes; each write pairs with the next one in graph order
unless either reads the other's output (merging them would make a cycle)."""
from __future__ import annotations

from .graph_view import FUSED_DOMAIN, Fusion, GraphView, attr, make_fused


def _is_write(node) -> bool:
    return node.domain == FUSED_DOMAIN and node.op_type == "KVWrite"


def depends_on(view: GraphView, node, other) -> bool:
    """Whether ``node`` reads, through any chain, an output of ``other``."""
    seen, work = set(), [x for x in node.input if x]
    while work:
        name = work.pop()
        producer = view.producer.get(name)
        if producer is None or id(producer) in seen:
            continue
        if producer is other:
            return True
        seen.add(id(producer))
        work.extend(x for x in producer.input if x)
    return False


def match(view: GraphView, node) -> Fusion | None:
    if not _is_write(node):
        return None
    order = {id(n): i for i, n in enumerate(view.nodes)}
    later = [n for n in view.consumers.get(node.input[2], ())
             if _is_write(n) and n is not node and order[id(n)] > order[id(node)]
             and attr(n, "max_context") == attr(node, "max_context")]
    if not later:
        return None
    partner = min(later, key=lambda n: order[id(n)])
    if depends_on(view, partner, node) or depends_on(view, node, partner):
        return None
    fused = make_fused("KVWrite2", [node.input[0], node.input[1], partner.input[0],
                                    partner.input[1], node.input[2]],
                       [node.output[0], partner.output[0]], partner,
                       max_context=attr(node, "max_context"))
    return Fusion([node, partner], fused, "KVWrite2")
