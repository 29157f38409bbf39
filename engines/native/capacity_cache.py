"""Append kv cells run as capacity buffers inside the engine, so their forwards have one
shape per phase and can be captured as CUDA graphs like a static cache's.

An ``append`` cell grows every step (``present = Concat(past, new)`` on its sequence axis),
so each decode step is a new graph signature. When a component's graph allows it, the
engine plans a *capacity* variant instead: each such ``past`` input becomes a buffer of
``max_context`` slots, the Concat becomes ``lockstep.fused:KVWrite(past, new, positions)``
(a copy of the buffer with slot p holding the row written at position p), and the
attention that reads ``present`` is the fused causal ``Attention`` (``engines.native.fusion``),
which reads slots 0..p for the query at position p and no other: slots past the valid
length are never read, so the result is the append graph's, bit for bit.

When: every append cell of the component is rank 4 with sequence axis 2, its ``present``
is produced by ``Concat(past, new)`` on that axis, ``past`` is read by that Concat alone,
and after fusion ``present`` is read only by fused Attention nodes that mask with the
component's ``positions`` input (and by the graph output). Anything else (a sliding window,
an unfused attention, a reader of the cache's shape) keeps the append plan.

The interpreter keeps its append semantics (``engines/workflow/state.py``): it feeds
``past`` of length P and takes ``present`` of length P + M. ``CapacityCells`` translates:
a ``past`` that is a prefix view of a capacity buffer (what the previous forward returned)
is fed as that buffer, untouched (the KVWrite copies, so no buffer a cell still views is
ever written); any other ``past`` (the empty first feed, a truncated copy, a fork) is
copied into the prefix of a fresh zero buffer. ``present`` comes back as the view of its
first P + M slots. The contract it relies on is the interpreter's: a forward's positions
are P, ..., P + M - 1 (``DecodeState`` moves cells and position together).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import onnx
from onnx import helper

from engines.errors import InputError
from engines.native.fusion import FUSED_DOMAIN, fuse_nodes

SEQ_AXIS = 2
STEADY_STEPS_KEPT = 4096  # replayed steps whose presents are kept (a step: 2 per kv cell)
_ONNX = ("", "ai.onnx")


@dataclass(frozen=True)
class CapacityCell:
    name: str
    input: str   # graph input: the capacity buffer [1, kv_heads, max_context, head_dim]
    output: str  # graph output: the written buffer, same shape


@dataclass(frozen=True)
class CapacityPlan:
    """A component's capacity variant: the rewritten model and its cells."""
    model: onnx.ModelProto
    cells: tuple[CapacityCell, ...]
    max_context: int


def _axis(node: onnx.NodeProto) -> int | None:
    for a in node.attribute:
        if a.name == "axis":
            return int(a.i)
    return None


def capacity_plan(model: onnx.ModelProto, package_spec, component: str) -> tuple[
        CapacityPlan | None, str]:
    """(the capacity variant, "") for ``component`` of ``package_spec``, or (None, why not)."""
    comp = package_spec.components[component]
    positions = comp.inputs.get("positions")
    cells = {name: c for name, c in package_spec.state.items()
             if c.component == component and c.kind == "kv" and c.update == "append"}
    if not cells:
        return None, "no append kv cell"
    if positions is None:
        return None, "the component has no positions input to place rows by"
    graph = model.graph
    outputs = [o.name for o in graph.output]
    producer = {y: n for n in graph.node for y in n.output if y}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for x in node.input:
            if x:
                readers.setdefault(x, []).append(node)
    swap: dict[int, onnx.NodeProto] = {}
    written: dict[str, str] = {}  # cell -> the value the Concat (now the KVWrite) produces
    for name, cell in cells.items():
        if len(cell.shape) != 4 or cell.seq_axis != SEQ_AXIS:
            return None, f"cell {name}: rank {len(cell.shape)}, seq_axis {cell.seq_axis}"
        concat = producer.get(cell.output)
        while (concat is not None and concat.op_type == "Identity"
               and concat.domain in _ONNX):  # present = Identity(k_all), as builders write it
            concat = producer.get(concat.input[0])
        if (concat is None or concat.op_type != "Concat" or concat.domain not in _ONNX
                or list(concat.input[:1]) != [cell.input] or len(concat.input) != 2
                or _axis(concat) not in (SEQ_AXIS, SEQ_AXIS - 4)):
            return None, f"cell {name}: present is not Concat(past, new) on axis 2"
        if [id(n) for n in readers.get(cell.input, [])] != [id(concat)]:
            return None, f"cell {name}: past is read by more than its Concat"
        written[name] = concat.output[0]
        swap[id(concat)] = helper.make_node(
            "KVWrite", [cell.input, concat.input[1], positions], [concat.output[0]],
            name=f"{concat.name or cell.output}/capacity", domain=FUSED_DOMAIN,
            max_context=int(package_spec.max_context))
    nodes = [swap.get(id(n), n) for n in graph.node]
    fused, _ = fuse_nodes(nodes, graph.initializer, outputs)
    fused_readers: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in fused:
        for slot, x in enumerate(node.input):
            if x:
                fused_readers.setdefault(x, []).append((node, slot))
    graph_outputs = set(outputs)
    for name in cells:
        values, seen = [written[name]], set()
        while values:  # the written buffer and its Identity aliases
            value = values.pop()
            seen.add(value)
            for node, slot in fused_readers.get(value, []):
                if node.op_type == "Identity" and node.domain in _ONNX:
                    values.extend(y for y in node.output if y and y not in seen)
                    continue
                if not (node.domain == FUSED_DOMAIN and node.op_type == "Attention"
                        and slot in (1, 2) and node.input[3] == positions):
                    return None, (f"cell {name}: the cache is read by {node.op_type} (input "
                                  f"{slot}), not only by the fused causal attention")
        if cells[name].output not in seen or cells[name].output not in graph_outputs:
            return None, f"cell {name}: present is not the written cache"
    rewritten = onnx.ModelProto()
    rewritten.CopyFrom(model)
    del rewritten.graph.node[:]
    rewritten.graph.node.extend(nodes)
    c = int(package_spec.max_context)
    for value in list(rewritten.graph.input) + list(rewritten.graph.output):
        if value.name in {cell.input for cell in cells.values()} | {
                cell.output for cell in cells.values()}:
            dim = value.type.tensor_type.shape.dim[SEQ_AXIS]
            dim.Clear()
            dim.dim_value = c
    return CapacityPlan(rewritten, tuple(CapacityCell(n, cell.input, cell.output)
                                         for n, cell in cells.items()), c), ""


def _root(value: Any) -> Any:
    while getattr(value, "base", None) is not None:
        value = value.base
    return value


class CapacityCells:
    """The feed and output translation of one capacity component (module doc), written
    against an array module ``xp`` (numpy here, CuPy on the device); ``zeros`` allocates a
    fresh buffer (the engine passes its allocator-scoped one), ``copy_into(dst, src)`` moves
    bits (device to device on the engine's stream)."""

    def __init__(self, plan: CapacityPlan, xp, zeros=None, copy_into=None):
        self.plan = plan
        self.xp = xp
        self._zeros = zeros or (lambda shape, dtype: xp.zeros(shape, dtype=dtype))
        self._copy_into = copy_into or _assign
        self.copies = 0  # pasts copied into a fresh buffer (not a prefix of one)
        self.recognised = 0  # pasts fed back as handed out, known by identity
        # id -> (view, its buffer, its length) for each present the last forward handed out:
        # fed back as a past, it is recognised by identity, with nothing of it read again
        self._handed: dict[int, tuple[Any, Any, int]] = {}
        # a graph slot's replays write the same output buffers every time: what ``outputs``
        # made of them, by (positions, each cell's length), made once and handed out again
        # (``lasting`` outputs only: they live while the slot does, so nothing else is held)
        self._steady: dict[tuple, _Steady] = {}
        self._steady_buffers: tuple[Any, ...] = ()  # the buffers those views view

    def feeds(self, feeds: Mapping[str, Any], positions: int = 0
              ) -> tuple[dict[str, Any], dict[str, int]]:
        """The capacity feeds, and each cell's valid length P (its past's extent); a forward
        that would run past ``max_context`` is refused (an append cache would grow past it)."""
        out = dict(feeds)
        lengths: dict[str, int] = {}
        c = self.plan.max_context
        handed = self._handed
        for cell in self.plan.cells:
            past = feeds[cell.input]
            hit = handed.get(id(past))
            if hit is not None and hit[0] is past:
                p = hit[2]
                if p + positions <= c:
                    lengths[cell.output] = p
                    out[cell.input] = hit[1]
                    self.recognised += 1
                    continue
            p = int(past.shape[SEQ_AXIS])
            if p + positions > c:
                raise InputError(f"cell {cell.name} holds {p} positions; {positions} more "
                                 f"pass max_context {c}", field=f"state.{cell.name}",
                                 value=p + positions,
                                 remedy=f"keep prompt + new tokens within max_context {c}")
            lengths[cell.output] = p
            shape = tuple(past.shape[:SEQ_AXIS]) + (c,) + tuple(past.shape[SEQ_AXIS + 1:])
            out[cell.input] = self._buffer(past, shape, p)
        return out, lengths

    def _buffer(self, past, shape, p: int):
        root = _root(past)
        if (root is not past and isinstance(root, type(past)) and tuple(root.shape) == shape
                and root.dtype == past.dtype and root.strides == past.strides
                and _pointer(root) == _pointer(past)):
            return root  # the prefix of the buffer the last forward returned
        buffer = self._zeros(shape, past.dtype)
        if p:
            self._copy_into(buffer[:, :, :p, :], past)
            self.copies += 1
        return buffer

    def outputs(self, outputs: Mapping[str, Any], lengths: Mapping[str, int],
                positions: int, lasting: bool = False) -> dict[str, Any]:
        """Each present as the view of its first P + M slots (remembered for ``feeds``).
        ``lasting``: the outputs are a graph slot's own buffers (a replay), so the views of
        a step seen before are the ones made then."""
        out = dict(outputs)
        if not lasting:
            views, self._handed = self._views(outputs, lengths, positions)
            out.update(views)
            return out
        buffers = tuple(outputs[cell.output] for cell in self.plan.cells)
        memo = self._steady
        if (any(a is not b for a, b in zip(self._steady_buffers, buffers))
                or len(memo) >= STEADY_STEPS_KEPT):
            memo.clear()  # another slot's buffers, or the slot captured again: let go
        self._steady_buffers = buffers
        key = (positions, tuple(lengths.values()))
        steady = memo.get(key)
        if steady is None:
            steady = memo[key] = _Steady(*self._views(outputs, lengths, positions))
        out.update(steady.views)
        self._handed = steady.handed
        return out

    def _views(self, outputs: Mapping[str, Any], lengths: Mapping[str, int], positions: int
               ) -> tuple[dict[str, Any], dict[int, tuple[Any, Any, int]]]:
        """(the presents by output name, what ``feeds`` recognises them by)."""
        views: dict[str, Any] = {}
        handed: dict[int, tuple[Any, Any, int]] = {}
        c = self.plan.max_context
        for cell in self.plan.cells:
            buffer = outputs[cell.output]
            length = lengths[cell.output] + positions
            view = buffer[:, :, :length, :]
            views[cell.output] = view
            if buffer.shape[SEQ_AXIS] == c and view.base is buffer:
                handed[id(view)] = (view, buffer, length)
        return views, handed

    def forget(self) -> None:
        """Drop the views handed out last and those kept (a reset or close: no dropped
        buffer is held)."""
        self._handed = {}
        self._steady, self._steady_buffers = {}, ()


@dataclass(frozen=True)
class _Steady:
    """One replayed step's presents: the views by output name, and ``feeds``'s record of
    them."""
    views: dict[str, Any]
    handed: dict[int, tuple[Any, Any, int]]


def _assign(dst, src) -> None:
    dst[...] = src


def _pointer(array) -> int:
    if isinstance(array, np.ndarray):
        return int(array.__array_interface__["data"][0])
    return int(array.data.ptr)  # CuPy


__all__ = ["CapacityCell", "CapacityCells", "CapacityPlan", "capacity_plan"]
