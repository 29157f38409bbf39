"""Causal grouped-query attention over a KV cache, as one
``lockstep.fused:Attention(q, k_all, v_all, positions)`` -> [1, M, heads * head_dim].

The recognised graph: q reshaped to [1, kv_heads, group, -1, head_dim]; scores
``MatMul(q5, Transpose(Unsqueeze(k_all, [2]), [0,1,2,4,3]))``, then either ``Mul`` by a
constant scale (uniform) or a ``Cast`` up (mixed: q arrived scaled); ``Where(visible,
scores, masked)``; ``Softmax(axis=-1)`` (and a Cast down, mixed); ``MatMul`` with
``Unsqueeze(v_all, [2])``; Reshape [1, heads, -1, head_dim], Transpose [0,2,1,3], Reshape
[0, 0, heads * head_dim].

``visible`` must be exactly the plain causal mask ``LessOrEqual(Range(0, T, 1),
Unsqueeze(positions, [1, 2, 4]))``: key slot j is visible to the query at position p iff
j <= p. Anything else (a sliding window, a soft cap on the scores, a bias) is left alone."""
from __future__ import annotations

from .graph_view import (Fusion, GraphView, attr, axes_of, cast_to, make_fused, scalar_attrs)


def _causal_positions(view: GraphView, name: str) -> str | None:
    """The query positions behind a plain causal mask, else None."""
    le = view.prod(name, "LessOrEqual")
    if le is None:
        return None
    rng = view.prod(le.input[0], "Range")
    query = view.prod(le.input[1], "Unsqueeze")
    if rng is None or query is None or axes_of(view, query) != [1, 2, 4]:
        return None
    if view.ints(rng.input[0]) != [0] or view.ints(rng.input[2]) != [1]:
        return None
    length = view.prod(rng.input[1], "Gather")
    if length is None or view.ints(length.input[1]) != [2] or attr(length, "axis", 0) != 0:
        return None
    shape = view.prod(length.input[0], "Shape")
    if shape is None or attr(shape, "start") is not None or attr(shape, "end") is not None:
        return None
    return query.input[0]


def match(view: GraphView, node) -> Fusion | None:
    if node.op_type != "Reshape" or node.domain not in ("", "ai.onnx"):
        return None
    shape_out = view.ints(node.input[1])
    trans = view.prod(node.input[0], "Transpose")
    if shape_out is None or len(shape_out) != 3 or shape_out[:2] != [0, 0] or trans is None \
            or list(attr(trans, "perm", [])) != [0, 2, 1, 3]:
        return None
    ctx = view.prod(trans.input[0], "Reshape")
    ctx_shape = None if ctx is None else view.ints(ctx.input[1])
    if ctx_shape is None or len(ctx_shape) != 4 or ctx_shape[0] != 1 or ctx_shape[2] != -1:
        return None
    heads, head_dim = ctx_shape[1], ctx_shape[3]
    if heads <= 0 or head_dim <= 0 or shape_out[2] != heads * head_dim:
        return None
    pv = view.prod(ctx.input[0], "MatMul")
    if pv is None:
        return None
    v5 = view.prod(pv.input[1], "Unsqueeze")
    if v5 is None or axes_of(view, v5) != [2]:
        return None
    probs_node = view.producer.get(pv.input[0])
    down = cast_to(probs_node)
    softmax = view.prod(probs_node.input[0], "Softmax") if down is not None else \
        view.prod(pv.input[0], "Softmax")
    if softmax is None or attr(softmax, "axis", -1) not in (-1, 4):
        return None
    where = view.prod(softmax.input[0], "Where")
    if where is None:
        return None
    positions = _causal_positions(view, where.input[0])
    masked = view.scalar(where.input[2])
    if positions is None or masked is None:
        return None
    scores = view.producer.get(where.input[1])
    if scores is None:
        return None
    attrs = {"up": 0, "scale": 0.0, "scale_type": 0}
    if scores.op_type == "Mul" and down is None:
        scale = view.scalar(scores.input[1])
        if scale is None:
            return None
        attrs.update(scalar_attrs("scale", scale))
        qk = view.prod(scores.input[0], "MatMul")
    elif cast_to(scores) is not None and down is not None:
        attrs["up"], attrs["down"] = cast_to(scores), down
        qk = view.prod(scores.input[0], "MatMul")
    else:
        return None
    if qk is None:
        return None
    q5 = view.prod(qk.input[0], "Reshape")
    k5 = view.prod(qk.input[1], "Transpose")
    if q5 is None or k5 is None or list(attr(k5, "perm", [])) != [0, 1, 2, 4, 3]:
        return None
    q_shape = view.ints(q5.input[1])
    if q_shape is None or len(q_shape) != 5 or q_shape[0] != 1 or q_shape[3] != -1 \
            or q_shape[4] != head_dim or q_shape[1] * q_shape[2] != heads:
        return None
    k_unsq = view.prod(k5.input[0], "Unsqueeze")
    if k_unsq is None or axes_of(view, k_unsq) != [2]:
        return None
    pattern = [node, trans, ctx, pv, v5, softmax, where, scores, qk, q5, k5, k_unsq]
    if down is not None:
        pattern.append(probs_node)
    for n in pattern[1:]:
        if not view.only_read_by(n.output[0], pattern):
            return None
    attrs.update(scalar_attrs("masked", masked))
    fused = make_fused("Attention", [q5.input[0], k_unsq.input[0], v5.input[0], positions],
                       [node.output[0]], node, kv_heads=q_shape[1], group=q_shape[2],
                       head_dim=head_dim, **attrs)
    return Fusion(pattern, fused, "Attention")
