"""Rotary embedding: ``Add(Mul(x, cos), Mul(rotate(x), sin))`` with ``rotate`` built from
Slice/Neg/Concat over channel halves (``layout="halves"``) or over adjacent pairs through a
Reshape to [.., half, 2] (``layout="pairs"``), as one ``lockstep.fused:Rotary``.

A mixed graph's Cast up of ``x``, its scale Mul by a constant and its Cast down after the
Add fold in too, each only where it is there and read by nothing else."""
from __future__ import annotations

from .graph_view import (Fusion, GraphView, attr, cast_to, make_fused, other_input,
                         scalar_attrs, slice_bounds)


def _halves(view: GraphView, concat):
    """Concat(Neg(x[half:2half]), x[:half]) on axis 3/-1 -> (x, half, nodes)."""
    if concat is None or concat.op_type != "Concat" or len(concat.input) != 2:
        return None
    if attr(concat, "axis") not in (-1, 3):
        return None
    neg = view.prod(concat.input[0], "Neg")
    first = view.prod(concat.input[1], "Slice")
    if neg is None or first is None:
        return None
    second = view.prod(neg.input[0], "Slice")
    if second is None or second.input[0] != first.input[0]:
        return None
    b1, b2 = slice_bounds(view, first), slice_bounds(view, second)
    if b1 is None or b2 is None:
        return None
    half = b1[1]
    if half <= 0 or b1 != (0, half, b1[2]) or b2[:2] != (half, 2 * half) \
            or b1[2] not in (3, -1) or b2[2] not in (3, -1):
        return None
    nodes = [concat, neg, first, second]
    if not all(view.only_read_by(n.output[0], nodes) for n in (neg, first, second)):
        return None
    return first.input[0], half, nodes


def _pairs(view: GraphView, merge):
    """Reshape(Concat(Neg(odd), even, -1), [0,0,0,D]) with even/odd = Slice(Reshape(x,
    [0,0,0,D/2,2]), 0:1 / 1:2, axis 4) -> (x, half, nodes)."""
    if merge is None or merge.op_type != "Reshape" or view.ints(merge.input[1]) is None:
        return None
    concat = view.prod(merge.input[0], "Concat")
    if concat is None or len(concat.input) != 2 or attr(concat, "axis") not in (-1, 4):
        return None
    neg = view.prod(concat.input[0], "Neg")
    even = view.prod(concat.input[1], "Slice")
    if neg is None or even is None:
        return None
    odd = view.prod(neg.input[0], "Slice")
    if odd is None or odd.input[0] != even.input[0]:
        return None
    if slice_bounds(view, even) not in ((0, 1, 4), (0, 1, -1)) \
            or slice_bounds(view, odd) not in ((1, 2, 4), (1, 2, -1)):
        return None
    split = view.prod(even.input[0], "Reshape")
    shape = None if split is None else view.ints(split.input[1])
    if shape is None or len(shape) != 5 or shape[:3] != [0, 0, 0] or shape[4] != 2 \
            or shape[3] <= 0:
        return None
    half = shape[3]
    if view.ints(merge.input[1]) != [0, 0, 0, 2 * half]:
        return None
    nodes = [merge, concat, neg, even, odd, split]
    if not all(view.only_read_by(n.output[0], nodes) for n in (concat, neg, even, odd, split)):
        return None
    return split.input[0], half, nodes


def match(view: GraphView, node) -> Fusion | None:
    if node.op_type != "Add" or node.domain not in ("", "ai.onnx"):
        return None
    muls = [view.prod(x, "Mul") for x in node.input]
    if None in muls or len(muls) != 2:
        return None
    direct, rotated = muls
    found = None
    for layout, recogniser in (("halves", _halves), ("pairs", _pairs)):
        rot = view.producer.get(rotated.input[0])
        found = recogniser(view, rot)
        if found is not None:
            break
    if found is None:
        return None
    x, half, rot_nodes = found
    cos = other_input(direct, x)
    if cos is None or direct.input[0] != x or rotated.input[0] != rot_nodes[0].output[0]:
        return None
    sin = rotated.input[1]
    pattern = [node, direct, rotated] + rot_nodes
    if not view.only_read_by(direct.output[0], pattern) \
            or not view.only_read_by(rotated.output[0], pattern) \
            or not view.only_read_by(rot_nodes[0].output[0], pattern):
        return None
    attrs = {"layout": layout, "half": half, "up": 0, "scale": 0.0, "scale_type": 0, "to": 0}
    source = x
    up = view.prod(x, "Cast")
    if up is not None and view.only_read_by(x, pattern):
        pattern.append(up)
        source, attrs["up"] = up.input[0], cast_to(up)
    out = node.output[0]
    last = node
    scale_mul = view.sole_reader(out)
    if scale_mul is not None and scale_mul.op_type == "Mul" and scale_mul.input[0] == out:
        scale = view.scalar(scale_mul.input[1])
        if scale is not None:
            pattern.append(scale_mul)
            attrs.update(scalar_attrs("scale", scale))
            out, last = scale_mul.output[0], scale_mul
    cast = view.sole_reader(out)
    if cast_to(cast) is not None:
        pattern.append(cast)
        out, attrs["to"], last = cast.output[0], cast_to(cast), cast
    fused = make_fused("Rotary", [source, cos, sin], [out], last, **attrs)
    return Fusion(pattern, fused, "Rotary")
