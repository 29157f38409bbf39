"""Runs the recognisers over a graph's nodes and returns the fused node list.

Each recogniser looks at one anchor node and either returns a ``Fusion`` (the nodes it
replaces, the node replacing them) or None. A node claimed by one fusion is not offered to
another. Nodes left without readers by the fusions (the shared one-hot of a static cache
and the causal mask, once every reader is fused) are dropped; nodes that were already dead
stay, so an unfused graph comes back unchanged."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import onnx

from . import (attention, kv_pair, kv_write, matmul_siblings, norm_glu, norm_matmul,
               residual_norm, rms_norm, rotary, rotary_kv, rotary_kv_attention, rotary_pair,
               swiglu, swiglu_matmul)
from .graph_view import FUSED_DOMAIN, GraphView

# Order matters where one pattern builds on another: kv_pair and rotary_pair pair the
# nodes of kv_write and rotary, residual_norm extends rms_norm's, norm_matmul and
# swiglu_matmul take the norms, SwiGLUs and MatMulNs the passes before them made (norm_glu a
# gate/up NormMatMul and its SwiGLU first, so swiglu_matmul takes only the SwiGLUs left),
# rotary_kv the pairs of rotary_pair and kv_pair, rotary_kv_attention rotary_kv's node and
# attention's.
RECOGNISERS = (kv_write.match, kv_pair.match, attention.match, rms_norm.match,
               residual_norm.match, rotary.match, rotary_pair.match, swiglu.match,
               matmul_siblings.match, norm_matmul.match, norm_glu.match, swiglu_matmul.match,
               rotary_kv.match, rotary_kv_attention.match)


def fuse_nodes(nodes: Sequence[onnx.NodeProto], initializers,
               outputs: Sequence[str]) -> tuple[list[onnx.NodeProto], Counter]:
    """The node list with every recognised subgraph replaced, and a count per fused op."""
    nodes = list(nodes)
    counts: Counter = Counter()
    dead_before = _dead(nodes, outputs)
    for recognise in RECOGNISERS:
        view = GraphView(nodes, initializers, outputs)
        claimed: set[int] = set()
        replaced: dict[int, onnx.NodeProto | None] = {}
        for node in nodes:
            if id(node) in claimed:
                continue
            fusion = recognise(view, node)
            if fusion is None or any(id(n) in claimed for n in fusion.removed):
                continue
            claimed.update(id(n) for n in fusion.removed)
            last = fusion.removed[0]
            for n in fusion.removed:
                replaced[id(n)] = None
            replaced[id(last)] = fusion.node
            counts[fusion.kind] += 1
            for n in fusion.removed:  # a fused node folded into a larger one
                if n.domain == FUSED_DOMAIN:
                    counts[n.op_type] -= 1
        if replaced:
            nodes = [replaced.get(id(n), n) for n in nodes]
            nodes = [n for n in nodes if n is not None]
    if counts:
        dead_ids = {id(n) for n in dead_before}
        while True:
            dead = [n for n in _dead(nodes, outputs) if id(n) not in dead_ids]
            if not dead:
                break
            gone = {id(n) for n in dead}
            nodes = [n for n in nodes if id(n) not in gone]
    return nodes, Counter({kind: n for kind, n in counts.items() if n > 0})


def _dead(nodes, outputs) -> list[onnx.NodeProto]:
    read = {x for n in nodes for x in n.input if x} | set(outputs)
    return [n for n in nodes if not any(y in read for y in n.output if y)]
