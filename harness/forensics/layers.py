"""Which decoder layer each node of a component belongs to.

Node names in lockstep's graphs (``harness/convert/llama_graph.py``, the converter, the hybrid
fixture) carry no layer: the builder names nodes ``n_<Op>_<k>`` with one counter per op type.
The layer is read from what a node consumes instead, and propagated:

1. *Anchors.* A node is in layer i when it consumes a value named for layer i:
   - a state cell's input (``past_key_3``, ``conv_state_1``, ``rec_state_0``: the trailing
     index), or
   - a per-layer weight: an initializer whose name has an explicit layer (``layers.3.``,
     ``layer_3``, ``blocks.3``, ``h.3``: exporters' naming) or whose stem the builder mints
     once per layer (``wq_0`` .. ``wq_{L-1}``: a stem whose indices are exactly 0..L-1, L
     being the number of layers the state cells name, L >= 2), or
   - its own name or output name has an explicit layer (exported graphs:
     ``/model/layers.3/self_attn/...``).
2. *Forward.* A node without an anchor takes the highest layer among its producers.
3. *Backward.* A node that still has none (the shared prelude: the embedding gather, the
   rotary tables gathered by ``position_ids``) takes the lowest layer of its consumers: the
   rotary Gathers of a LLaMA graph belong to layer 0, where they are first used.
4. *Head.* A node downstream of the layers that reaches no anchor and consumes a float
   weight of no layer (the final norm's eps and gain, the head) or a head node's output is
   in the ``head``.

``Layers.label(name)`` is ``"layer 3"``, ``"head"`` or ``"-"`` (shape arithmetic that feeds
nothing with a layer); graph outputs compared at the component's boundary are ``"output"``.
"""
from __future__ import annotations

import heapq
import re
from collections import defaultdict
from dataclasses import dataclass

import onnx

_EXPLICIT = re.compile(r"(?:^|[/._:-])(?:layers?|blocks?|h|decoder[._]layers?)[._/:-]?(\d+)"
                       r"(?=$|[/._:-])", re.IGNORECASE)
_TRAILING = re.compile(r"(\d+)$")
_STEM = re.compile(r"^(.*?)[._-]?(\d+)$")

HEAD = "head"
OUTPUT = "output"


def explicit_layer(name: str) -> int | None:
    m = _EXPLICIT.search(name or "")
    return int(m.group(1)) if m else None


@dataclass
class Layers:
    layer: dict[str, int | None]  # by value name (every node output)
    head: set[str]
    count: int  # layers found (max index + 1)

    def of(self, name: str) -> int | None:
        return self.layer.get(name)

    def label(self, name: str) -> str:
        if name in self.head:
            return HEAD
        i = self.layer.get(name)
        return "-" if i is None else f"layer {i}"

    def order(self) -> list[str]:
        return [f"layer {i}" for i in range(self.count)] + [HEAD, OUTPUT]


def assign_layers(model: onnx.ModelProto, state_inputs: dict[str, str] | None = None
                  ) -> Layers:
    """Layers for every node output of ``model``. ``state_inputs`` maps a state cell's
    graph input to its cell name (only the inputs are used: their trailing index)."""
    graph = model.graph
    nodes = list(graph.node)
    inits = {t.name: t for t in graph.initializer}
    float_inits = {n for n, t in inits.items() if t.data_type in (
        onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
        onnx.TensorProto.DOUBLE)}

    anchor_of: dict[str, int] = {}
    for name in (state_inputs or {}):
        i = explicit_layer(name)
        if i is None:
            m = _TRAILING.search(name)
            i = int(m.group(1)) if m else None
        if i is not None:
            anchor_of[name] = i
    count = max(anchor_of.values(), default=-1) + 1

    stems: dict[str, set[int]] = defaultdict(set)
    for name in float_inits:
        i = explicit_layer(name)
        if i is not None:
            anchor_of[name] = i
            continue
        m = _STEM.match(name)
        if m:
            stems[m.group(1)].add(int(m.group(2)))
    if count >= 2:
        per_layer = {s for s, idx in stems.items() if idx == set(range(count))}
        for name in float_inits:
            m = _STEM.match(name)
            if name not in anchor_of and m and m.group(1) in per_layer:
                anchor_of[name] = int(m.group(2))
    count = max(count, max(anchor_of.values(), default=-1) + 1)

    producer: dict[str, int] = {}
    for k, node in enumerate(nodes):
        for y in node.output:
            if y:
                producer[y] = k
    consumers: dict[int, list[int]] = defaultdict(list)
    for k, node in enumerate(nodes):
        for x in node.input:
            if x in producer:
                consumers[producer[x]].append(k)
    order = _topological(nodes, producer)

    anchored: dict[int, int] = {}
    for k, node in enumerate(nodes):
        found = [anchor_of[x] for x in node.input if x in anchor_of]
        own = explicit_layer(node.name)
        if own is None:
            own = next((explicit_layer(y) for y in node.output if explicit_layer(y) is not None),
                       None)
        if own is not None:
            found.append(own)
        if found:
            anchored[k] = max(found)

    forward: dict[int, int | None] = {}
    for k in order:
        if k in anchored:
            forward[k] = anchored[k]
            continue
        ups = [forward[producer[x]] for x in nodes[k].input
               if x in producer and forward.get(producer[x]) is not None]
        forward[k] = max(ups) if ups else None

    final: dict[int, int | None] = dict(forward)
    reaches_anchor: dict[int, bool] = {}
    for k in reversed(order):
        downs = consumers.get(k, [])
        reaches_anchor[k] = any(d in anchored or reaches_anchor.get(d, False) for d in downs)
        if final[k] is None:
            below = [final[d] for d in downs if final.get(d) is not None]
            final[k] = min(below) if below else None

    head_nodes: set[int] = set()
    for k in order:
        if k in anchored or forward[k] is None or reaches_anchor[k]:
            continue
        node = nodes[k]
        if any(x in float_inits and x not in anchor_of for x in node.input) or \
                any(x in producer and producer[x] in head_nodes for x in node.input):
            head_nodes.add(k)

    layer: dict[str, int | None] = {}
    head: set[str] = set()
    for k, node in enumerate(nodes):
        for y in node.output:
            if y:
                layer[y] = final.get(k)
                if k in head_nodes:
                    head.add(y)
    return Layers(layer, head, count)


def _topological(nodes, producer) -> list[int]:
    waiting = {k: {producer[x] for x in n.input if x in producer} for k, n in enumerate(nodes)}
    readers: dict[int, list[int]] = defaultdict(list)
    for k, deps in waiting.items():
        for d in deps:
            readers[d].append(k)
    ready = [k for k, deps in waiting.items() if not deps]
    heapq.heapify(ready)
    out = []
    while ready:
        k = heapq.heappop(ready)
        out.append(k)
        for r in readers[k]:
            waiting[r].discard(k)
            if not waiting[r]:
                heapq.heappush(ready, r)
    if len(out) != len(nodes):  # a cycle: keep file order for the rest
        seen = set(out)
        out += [k for k in range(len(nodes)) if k not in seen]
    return out
