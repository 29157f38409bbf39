"""Declared ports checked against the real ONNX graph of each component.

package.yaml says which graph input is ``tokens`` and which output is a state cell's new
value; an engine trusts that. A misspelt port, an int32 token input or a cache of the wrong
rank would otherwise surface as an opaque runtime failure inside one engine, so every
binding is checked here against what the graph itself declares: names, element types,
ranks and the extents it fixes. Dimensions the graph leaves symbolic are not guessed at.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import onnx

from engines.errors import PackageError
from engines.package.messages import did_you_mean
from engines.package.schema import PackageSpec, StateCellSpec, field_path

ELEMENT_TYPES = {
    onnx.TensorProto.FLOAT: "float32", onnx.TensorProto.FLOAT16: "float16",
    onnx.TensorProto.BFLOAT16: "bfloat16", onnx.TensorProto.DOUBLE: "float64",
    onnx.TensorProto.INT64: "int64", onnx.TensorProto.INT32: "int32",
    onnx.TensorProto.INT16: "int16", onnx.TensorProto.INT8: "int8",
    onnx.TensorProto.UINT8: "uint8", onnx.TensorProto.BOOL: "bool",
}
FLOATS = ("float32", "float16", "bfloat16", "float64")
# role -> (required element type, or None for "any float"; required rank, or None)
INPUT_CONTRACT = {"tokens": ("int64", 2), "positions": ("int64", 2),
                  "embeddings": (None, None), "carry": (None, None)}
OUTPUT_CONTRACT = {"logits": ("<package dtype>", 3), "hidden": (None, 3), "carry": (None, None)}


@dataclass(frozen=True)
class Port:
    """What a graph declares about one of its inputs or outputs."""
    name: str
    is_tensor: bool
    elem: str | None  # None: the graph does not declare an element type
    dims: tuple[int | str | None, ...] | None  # None: no declared rank; str: symbolic

    @property
    def rank(self) -> int | None:
        return None if self.dims is None else len(self.dims)

    def shape_text(self) -> str:
        if self.dims is None:
            return "[unknown rank]"
        return "[" + ", ".join("?" if d is None else str(d) for d in self.dims) + "]"


def _port(value_info: onnx.ValueInfoProto) -> Port:
    if value_info.type.WhichOneof("value") != "tensor_type":
        return Port(value_info.name, False, None, None)
    tensor = value_info.type.tensor_type
    elem = None
    if tensor.elem_type != onnx.TensorProto.UNDEFINED:
        elem = ELEMENT_TYPES.get(tensor.elem_type,
                                 onnx.TensorProto.DataType.Name(tensor.elem_type).lower())
    dims = None
    if tensor.HasField("shape"):
        dims = tuple(d.dim_value if d.HasField("dim_value") else
                     (d.dim_param if d.HasField("dim_param") else None)
                     for d in tensor.shape.dim)
    return Port(value_info.name, True, elem, dims)


def graph_inputs(model: onnx.ModelProto) -> dict[str, Port]:
    """Inputs a caller must feed: graph inputs that are not also initializers (weights)."""
    weights = {t.name for t in model.graph.initializer}
    weights |= {t.values.name for t in model.graph.sparse_initializer}
    return {vi.name: _port(vi) for vi in model.graph.input if vi.name not in weights}


def graph_outputs(model: onnx.ModelProto) -> dict[str, Port]:
    return {vi.name: _port(vi) for vi in model.graph.output}


Where = Callable[[tuple], str]


class ComponentCheck:
    """Checks one component's bindings; raises ``PackageError`` at the first mismatch."""

    def __init__(self, spec: PackageSpec, name: str, model: onnx.ModelProto, file: str,
                 where: Where):
        self.spec, self.name, self.file, self.where = spec, name, file, where
        self.comp = spec.components[name]
        self.inputs = graph_inputs(model)
        self.outputs = graph_outputs(model)
        self.weights = {t.name: tuple(t.dims) for t in model.graph.initializer}
        self.nodes = model.graph.node
        self.cells = spec.state_of(name)

    def _error(self, loc: tuple, message: str, value, remedy: str) -> PackageError:
        return PackageError(message, field=field_path(loc), value=value, remedy=remedy,
                            where=self.where(loc))

    def run(self) -> None:
        self._names()
        self._role_types()
        for cell_name, cell in self.cells.items():
            self._cell(cell_name, cell)
        self._all_inputs_fed()
        self._position_tables()

    # -- names -------------------------------------------------------------------------------
    def _find(self, loc: tuple, port: str, side: str, what: str) -> None:
        ports = self.inputs if side == "input" else self.outputs
        if port in ports:
            return
        real = ", ".join(ports) or "(none)"
        if side == "input" and port in self.weights:
            msg = (f"{what} names {port!r}, which is an initializer (a weight) of "
                   f"{self.file}, not a graph input")
        else:
            msg = (f"{what} names {port!r}, which is not a graph {side} of "
                   f"{self.file}{did_you_mean(port, ports)}")
        raise self._error(loc, msg, port, f"use one of the graph {side}s of {self.file}: {real}")

    def _names(self) -> None:
        base = ("components", self.name)
        for role, port in self.comp.inputs.items():
            self._find((*base, "inputs", role), port, "input", f"input role {role!r}")
        for role, port in self.comp.outputs.items():
            self._find((*base, "outputs", role), port, "output", f"output role {role!r}")
        for cell_name, cell in self.cells.items():
            self._find(("state", cell_name, "input"), cell.input, "input",
                       f"state cell {cell_name!r}")
            self._find(("state", cell_name, "output"), cell.output, "output",
                       f"state cell {cell_name!r}")

    # -- roles -------------------------------------------------------------------------------
    def _role_types(self) -> None:
        for side, bound, contract, ports in (
                ("inputs", self.comp.inputs, INPUT_CONTRACT, self.inputs),
                ("outputs", self.comp.outputs, OUTPUT_CONTRACT, self.outputs)):
            for role, port_name in bound.items():
                loc = ("components", self.name, side, role)
                port = ports[port_name]
                want_elem, want_rank = contract[role]
                if want_elem == "<package dtype>":
                    want_elem = self.spec.dtype
                self._is_tensor(loc, port, f"role {role}")
                if port.elem is not None:
                    if want_elem is not None and port.elem != want_elem:
                        why = ("the package dtype" if role == "logits"
                               else "the component contract")
                        raise self._error(
                            loc, f"{self.file} declares {port_name!r} (role {role}) as "
                                 f"{port.elem}, but {why} requires {want_elem}", port_name,
                            self._fix_elem(role, port_name, port.elem, want_elem))
                    if want_elem is None and port.elem not in FLOATS:
                        raise self._error(
                            loc, f"{self.file} declares {port_name!r} (role {role}) as "
                                 f"{port.elem}, but role {role} carries floating-point values",
                            port_name, f"bind {role} to a float tensor of the graph")
                if want_rank is not None and port.rank is not None and port.rank != want_rank:
                    raise self._error(
                        loc, f"{self.file} declares {port_name!r} (role {role}) with rank "
                             f"{port.rank} {port.shape_text()}, but role {role} has rank "
                             f"{want_rank} ({'[1, M]' if want_rank == 2 else '[1, M, width]'})",
                        port_name, f"export the graph with {port_name} of rank {want_rank}")
                if port.dims and isinstance(port.dims[0], int) and port.dims[0] != 1:
                    raise self._error(
                        loc, f"{self.file} fixes the batch axis of {port_name!r} (role {role}) "
                             f"to {port.dims[0]}, but components run with batch 1", port_name,
                        f"export the graph with batch dimension 1 or symbolic")
                if (role == "logits" and port.rank == 3 and isinstance(port.dims[2], int)
                        and port.dims[2] != self.spec.vocab_size):
                    raise self._error(
                        loc, f"{self.file} gives {port_name!r} {port.dims[2]} columns "
                             f"{port.shape_text()}, but vocab_size is {self.spec.vocab_size}",
                        port_name, f"set vocab_size: {port.dims[2]}, or bind logits to the "
                                   f"output of width {self.spec.vocab_size}")

    def _fix_elem(self, role: str, port: str, have: str, want: str) -> str:
        if role == "logits":
            return (f"set dtype: {have} if the logits really are {have}, or export "
                    f"{port} as {want}")
        return f"export {port} as {want} (the contract for {role} is {want} [1, M])"

    def _is_tensor(self, loc: tuple, port: Port, what: str) -> None:
        if not port.is_tensor:
            raise self._error(loc, f"{self.file} declares {port.name!r} ({what}) as a "
                                   f"non-tensor value (sequence, map or optional)", port.name,
                              "bind it to a plain tensor")

    # -- state cells -------------------------------------------------------------------------
    def _cell(self, cell_name: str, cell: StateCellSpec) -> None:
        for side, port_name in (("input", cell.input), ("output", cell.output)):
            port = (self.inputs if side == "input" else self.outputs)[port_name]
            self._is_tensor(("state", cell_name, side), port, f"state cell {cell_name}")
            if port.elem is not None and port.elem != cell.dtype:
                raise self._error(
                    ("state", cell_name, "dtype"),
                    f"state cell {cell_name!r} is declared {cell.dtype}, but {self.file} "
                    f"declares its {side} {port_name!r} as {port.elem}", cell.dtype,
                    f"set dtype: {port.elem}" if port.elem in FLOATS[:3] else
                    f"export {port_name} as {cell.dtype}")
            if port.dims is None:
                continue
            if port.rank != len(cell.shape):
                raise self._error(
                    ("state", cell_name, "shape"),
                    f"state cell {cell_name!r} has rank {len(cell.shape)} (shape "
                    f"{cell.shape}), but {self.file} declares its {side} {port_name!r} with "
                    f"rank {port.rank} {port.shape_text()}", cell.shape,
                    f"give shape one extent per axis of {port_name} ({port.rank} axes)")
            for axis, (fixed, declared) in enumerate(zip(port.dims, cell.shape)):
                if not isinstance(fixed, int):
                    continue
                if cell.kind == "kv" and cell.update == "append" and axis == cell.seq_axis:
                    raise self._error(
                        ("state", cell_name, "update"),
                        f"{self.file} fixes the sequence axis {axis} of {port_name!r} to "
                        f"{fixed} {port.shape_text()}, but append cell {cell_name!r} grows "
                        f"along it every step", cell.update,
                        f"export {port_name} with a symbolic axis {axis} (e.g. 'past'), or "
                        f"declare update: static with a max_context buffer")
                if fixed != declared:
                    raise self._error(
                        ("state", cell_name, "shape"),
                        f"{self.file} fixes axis {axis} of {port_name!r} to {fixed} "
                        f"{port.shape_text()}, but state cell {cell_name!r} declares shape "
                        f"{cell.shape}", cell.shape,
                        f"set shape[{axis}] to {fixed}, or export the graph with that axis "
                        f"{declared} or symbolic")

    # -- coverage ----------------------------------------------------------------------------
    def _all_inputs_fed(self) -> None:
        bound = set(self.comp.inputs.values()) | {c.input for c in self.cells.values()}
        sp = self.spec.decoding.speculative
        if sp is not None and sp.proposer == self.name:
            bound |= set(sp.borrows)  # fed with the target's cells, read-only
            if sp.carry is not None and sp.carry.input is not None:
                bound.add(sp.carry.input)
        for port in self.inputs:
            if port not in bound:
                raise self._error(
                    ("components", self.name, "inputs"),
                    f"graph input {port!r} of {self.file} is bound to no role and no state "
                    f"cell, so no engine could feed it", port,
                    f"bind it under components.{self.name}.inputs (roles: tokens, positions, "
                    f"embeddings, carry), declare a state cell with input: {port}, borrow a "
                    f"target cell through it (decoding.speculative.borrows), or remove it "
                    f"from the graph")

    # -- tables indexed by position ----------------------------------------------------------
    def _position_tables(self) -> None:
        """A weight gathered by the ``positions`` input (a rotary cos/sin table, a learned
        position embedding) must have a row for every position up to ``max_context``: one
        row short, every engine fails the same way at that position, and the fault would be
        blamed on the engines instead of on the package."""
        positions = self.comp.inputs.get("positions")
        if positions is None:
            return
        for node in self.nodes:
            if (node.op_type != "Gather" or node.domain not in ("", "ai.onnx")
                    or len(node.input) < 2 or node.input[1] != positions
                    or any(a.name == "axis" and a.i != 0 for a in node.attribute)):
                continue
            rows = (self.weights.get(node.input[0]) or [self.spec.max_context])[0]
            if rows < self.spec.max_context:
                raise self._error(
                    ("max_context",), f"{self.file} gathers {node.input[0]!r} by position "
                    f"and it has {rows} rows, so the graph computes positions 0..{rows - 1} "
                    f"only, but max_context is {self.spec.max_context}",
                    self.spec.max_context,
                    f"set max_context to {rows} or less, or rebuild the package for "
                    f"{self.spec.max_context} positions (lockstep convert --max-context "
                    f"{self.spec.max_context})")
