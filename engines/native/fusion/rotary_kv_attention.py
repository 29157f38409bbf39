"""A layer's ``RotaryKVWrite`` whose rotated queries only its ``Attention`` reads, and whose
two caches that attention reads (the presents may read them too), as one
``lockstep.fused:RotaryKVAttention`` with RotaryKVWrite's inputs and outputs (key cache,
value cache, attention output): on the device a decode's or verification's rotation, cache
write and attention are one launch instead of two. The two nodes' attributes travel on the
fused node (the attention's prefixed ``att_``), so the kernel rebuilds both. Runs after
``rotary_kv``; placed where the write was."""
from __future__ import annotations

from onnx import AttributeProto

from .graph_view import FUSED_DOMAIN, Fusion, GraphView, make_fused

PREFIX = "att_"


def _fused(node, op_type: str) -> bool:
    return node is not None and node.domain == FUSED_DOMAIN and node.op_type == op_type


def match(view: GraphView, node) -> Fusion | None:
    if not _fused(node, "Attention"):
        return None
    q, k_all, v_all, positions = node.input[:4]
    write = view.producer.get(q)
    if not _fused(write, "RotaryKVWrite") or view.sole_reader(q) is not node:
        return None
    kept, cache_k, cache_v = write.output[:3]
    if q != kept or (k_all, v_all) != (cache_k, cache_v) or positions != write.input[7]:
        return None
    fused = make_fused("RotaryKVAttention", list(write.input),
                       [cache_k, cache_v, node.output[0]], node)
    fused.attribute.extend(write.attribute)
    for a in node.attribute:
        renamed = AttributeProto()
        renamed.CopyFrom(a)
        renamed.name = PREFIX + a.name
        fused.attribute.append(renamed)
    # where the write was: the attention's inputs are the write's outputs and its positions
    return Fusion([write, node], fused, "RotaryKVAttention")
