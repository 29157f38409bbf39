"""MatMuls that read the same activation with 2-D weight initializers of one K (a layer's
q/k/v projections, or gate/up) as one ``lockstep.fused:MatMulN(a, w_1, ..., w_n)``, n = 2
or 3, one output each: one GEMV launch on the device, each output bit for bit its own
MatMul's."""
from __future__ import annotations

from .graph_view import Fusion, GraphView, make_fused

MAX_WEIGHTS = 3


def initializer_weight(view: GraphView, node):
    """The node's weight initializer if it is a MatMul by a 2-D float initializer."""
    if node.op_type != "MatMul" or node.domain not in ("", "ai.onnx") or len(node.input) != 2:
        return None
    tensor = view.inits.get(node.input[1])
    if tensor is None or len(tensor.dims) != 2 or not view.is_float_init(node.input[1]):
        return None
    return tensor


def match(view: GraphView, node) -> Fusion | None:
    first = initializer_weight(view, node)
    if first is None:
        return None
    order = {id(n): i for i, n in enumerate(view.nodes)}
    siblings = [n for n in view.consumers.get(node.input[0], ())
                if n is not node and order[id(n)] > order[id(node)]
                and n.input[0] == node.input[0]]
    group = [node]
    for n in sorted(siblings, key=lambda n: order[id(n)]):
        w = initializer_weight(view, n)
        if w is not None and w.dims[0] == first.dims[0] and w.data_type == first.data_type:
            group.append(n)
        if len(group) == MAX_WEIGHTS:
            break
    if len(group) < 2:
        return None
    fused = make_fused("MatMulN", [node.input[0]] + [n.input[1] for n in group],
                       [n.output[0] for n in group], group[-1])
    return Fusion(group, fused, "MatMulN")
