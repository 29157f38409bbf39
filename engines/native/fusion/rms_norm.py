"""RMSNorm: ``Mul(Mul(x, Reciprocal(Sqrt(Add(ReduceMean(Mul(x, x), [-1]), eps)))), gain)``,
and a mixed graph's ``Cast`` down right after it, as one ``lockstep.fused:RMSNorm``."""
from __future__ import annotations

from .graph_view import (Fusion, GraphView, attr, axes_of, cast_to, make_fused, other_input,
                         scalar_attrs)


def match(view: GraphView, node) -> Fusion | None:
    if node.op_type != "ReduceMean" or node.domain not in ("", "ai.onnx"):
        return None
    if axes_of(view, node) != [-1] or attr(node, "keepdims", 1) != 1:
        return None
    square = view.prod(node.input[0], "Mul")
    if square is None or square.input[0] != square.input[1]:
        return None
    x = square.input[0]
    add = view.sole_reader(node.output[0])
    if add is None or add.op_type != "Add" or add.input[0] != node.output[0]:
        return None
    eps = view.scalar(add.input[1])
    sqrt = view.sole_reader(add.output[0])
    if eps is None or sqrt is None or sqrt.op_type != "Sqrt":
        return None
    recip = view.sole_reader(sqrt.output[0])
    if recip is None or recip.op_type != "Reciprocal":
        return None
    scaled = view.sole_reader(recip.output[0])
    if scaled is None or scaled.op_type != "Mul" or other_input(scaled, recip.output[0]) != x:
        return None
    gained = view.sole_reader(scaled.output[0])
    if gained is None or gained.op_type != "Mul":
        return None
    gain = other_input(gained, scaled.output[0])
    if gain is None or not view.is_float_init(gain, rank=1):
        return None
    if not view.only_read_by(square.output[0], [node]):
        return None
    removed = [square, node, add, sqrt, recip, scaled, gained]
    out, to = gained.output[0], 0
    cast = view.sole_reader(gained.output[0])
    if cast_to(cast) is not None:
        removed.append(cast)
        out, to = cast.output[0], cast_to(cast)
    fused = make_fused("RMSNorm", [x, gain], [out], gained, to=to, **scalar_attrs("epsilon", eps))
    return Fusion(removed, fused, "RMSNorm")
