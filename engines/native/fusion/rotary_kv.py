"""A layer's paired rotation (``Rotary2``) whose rotated keys only its static-cache write
(``KVWrite2``) reads, as one ``lockstep.fused:RotaryKVWrite(x_keep, x_cache, cos, sin,
old_rot, old_plain, new_plain, positions)`` with outputs (the kept rotation, the cache of
the rotated rows, the other cache): on the device the write rotates the rows it stores, one
launch instead of two. Runs after ``rotary_pair`` and ``kv_pair``, on their nodes; placed
where the write was, and only when every reader of the kept rotation comes after it."""
from __future__ import annotations

from .graph_view import FUSED_DOMAIN, Fusion, GraphView, attr, make_fused

_SHARED = ("layout", "half", "up", "to")


def _fused(node, op_type: str) -> bool:
    return node.domain == FUSED_DOMAIN and node.op_type == op_type


def match(view: GraphView, node) -> Fusion | None:
    if not _fused(node, "Rotary2"):
        return None
    order = {id(n): i for i, n in enumerate(view.nodes)}
    for cached in (0, 1):
        rotated, kept = node.output[cached], node.output[1 - cached]
        write = view.sole_reader(rotated)
        if write is None or not _fused(write, "KVWrite2") or kept in write.input:
            continue
        if write.input[1] == rotated and rotated not in write.input[2:]:
            slot = 0
        elif write.input[3] == rotated and rotated not in write.input[:3]:
            slot = 1
        else:
            continue
        if any(order[id(r)] < order[id(write)] for r in view.consumers.get(kept, ())):
            continue
        old_rot, old_plain = write.input[2 * slot], write.input[2 - 2 * slot]
        new_plain = write.input[3 - 2 * slot]
        attrs = {k: attr(node, k) for k in _SHARED}
        if isinstance(attrs["layout"], bytes):
            attrs["layout"] = attrs["layout"].decode()
        for role, source in (("a", "ab"[1 - cached]), ("b", "ab"[cached])):
            attrs[f"scale_{role}"] = attr(node, f"scale_{source}", 0.0)
            attrs[f"scale_{role}_type"] = attr(node, f"scale_{source}_type", 0)
        fused = make_fused("RotaryKVWrite",
                           [node.input[1 - cached], node.input[cached], node.input[2],
                            node.input[3], old_rot, old_plain, new_plain, write.input[4]],
                           [kept, write.output[slot], write.output[1 - slot]], write,
                           max_context=attr(write, "max_context"), **attrs)
        return Fusion([write, node], fused, "RotaryKVWrite")
    return None
