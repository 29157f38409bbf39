"""An RMSNorm (or AddRMSNorm) whose normed row only MatMuls by 2-D weights read (one
MatMulN, or one MatMul: q/k/v, gate/up, the head) as one ``lockstep.fused:NormMatMul``: on
the device the norm becomes the GEMV's prologue, one launch instead of two. Runs after
``residual_norm`` and ``matmul_siblings``, on their nodes; placed where the norm was, so
a reader of the sum between the two still finds it."""
from __future__ import annotations

from .graph_view import FUSED_DOMAIN, Fusion, GraphView, attr, make_fused
from .matmul_siblings import initializer_weight


def _weights(view: GraphView, reader, normed: str) -> list[str] | None:
    """The reader's weights if it is the norm's MatMulN or a MatMul by a 2-D weight."""
    if reader.domain == FUSED_DOMAIN and reader.op_type == "MatMulN" \
            and reader.input[0] == normed and normed not in reader.input[1:]:
        return list(reader.input[1:])
    if initializer_weight(view, reader) is not None and reader.input[0] == normed \
            and reader.input[1] != normed:
        return [reader.input[1]]
    return None


def match(view: GraphView, node) -> Fusion | None:
    if node.domain != FUSED_DOMAIN or node.op_type not in ("RMSNorm", "AddRMSNorm"):
        return None
    normed = node.output[-1]
    reader = view.sole_reader(normed)
    if reader is None:
        return None
    weights = _weights(view, reader, normed)
    if weights is None:
        return None
    attrs = {a.name: attr(node, a.name) for a in node.attribute}
    fused = make_fused("NormMatMul", list(node.input) + weights,
                       list(node.output[:-1]) + list(reader.output), reader,
                       add=int(node.op_type == "AddRMSNorm"), **attrs)
    return Fusion([node, reader], fused, "NormMatMul")
