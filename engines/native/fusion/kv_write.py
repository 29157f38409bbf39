"""The static cache's slot write: ``Where(written, MatMul(onehot^T, new), old)`` over a
one-hot of ``position_ids`` against ``arange(max_context)``, as one
``lockstep.fused:KVWrite(old, new, positions)``: a copy of ``old`` with slot ``p`` replaced
by the row written at position ``p``.

Recognised from the Where back to ``Equal(Unsqueeze(positions, [2]), arange(C))``; the
one-hot nodes stay for other readers and go when the last write that read them is fused."""
from __future__ import annotations

import numpy as np

from .graph_view import Fusion, GraphView, attr, axes_of, make_fused


def _onehot_t(view: GraphView, name: str):
    """Unsqueeze(Transpose(Where(Equal(Unsqueeze(pos, [2]), arange(C)), 1, 0), [0,2,1]), [1])
    -> (positions, C), else None."""
    unsq = view.prod(name, "Unsqueeze")
    if unsq is None or axes_of(view, unsq) != [1]:
        return None
    trans = view.prod(unsq.input[0], "Transpose")
    if trans is None or list(attr(trans, "perm", [])) != [0, 2, 1]:
        return None
    where = view.prod(trans.input[0], "Where")
    if where is None:
        return None
    one, zero = view.scalar(where.input[1]), view.scalar(where.input[2])
    if one is None or zero is None or float(one) != 1.0 or float(zero) != 0.0:
        return None
    equal = view.prod(where.input[0], "Equal")
    if equal is None:
        return None
    pos_unsq = view.prod(equal.input[0], "Unsqueeze")
    slots = view.ints(equal.input[1])
    if pos_unsq is None or axes_of(view, pos_unsq) != [2] or not slots:
        return None
    if slots != list(range(len(slots))):
        return None
    return pos_unsq.input[0], len(slots)


def _written(view: GraphView, name: str, onehot_t: str) -> bool:
    """Greater(ReduceMax(onehot_t, [3], keepdims=1), 0.5)."""
    greater = view.prod(name, "Greater")
    if greater is None:
        return False
    threshold = view.scalar(greater.input[1])
    rmax = view.prod(greater.input[0], "ReduceMax")
    return (threshold is not None and float(threshold) == 0.5 and rmax is not None
            and rmax.input[0] == onehot_t and axes_of(view, rmax) == [3]
            and attr(rmax, "keepdims", 1) == 1)


def match(view: GraphView, node) -> Fusion | None:
    if node.op_type != "Where" or node.domain not in ("", "ai.onnx"):
        return None
    matmul = view.prod(node.input[1], "MatMul")
    if matmul is None or not view.only_read_by(matmul.output[0], [node]):
        return None
    found = _onehot_t(view, matmul.input[0])
    if found is None or not _written(view, node.input[0], matmul.input[0]):
        return None
    positions, context = found
    fused = make_fused("KVWrite", [node.input[2], matmul.input[1], positions],
                       [node.output[0]], node, max_context=int(np.int64(context)))
    return Fusion([node, matmul], fused, "KVWrite")
