"""Runtime-owned state cells: initial values, feeding, absorbing outputs, truncation.

A ``kv`` cell with ``append`` grows along its sequence axis by the graph's own concat; one
with ``static`` is a fixed buffer written in-graph, whose valid length the runtime tracks.
A ``recurrent`` cell is overwritten each forward and cannot be truncated, only restored
from a snapshot.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from engines.dtypes import dtype_of  # re-exported: engines.workflow.state.dtype_of
from engines.errors import ExecutionError, InputError


@dataclass
class Cell:
    name: str
    spec: Any  # StateCellSpec
    value: Any
    length: int  # valid positions (kv); forwards absorbed (recurrent)


class StateCells:
    """The cells one component owns, at the residency of the engine's tensor ops."""

    def __init__(self, package, component: str, tensor_ops):
        self.ops = tensor_ops
        self.cells: dict[str, Cell] = {}
        for name, spec in package.spec.state.items():
            if spec.component != component:
                continue
            value = tensor_ops.zeros(tuple(spec.shape), dtype_of(spec.dtype))
            self.cells[name] = Cell(name, spec, value, 0)

    def feeds(self) -> dict[str, Any]:
        return {c.spec.input: c.value for c in self.cells.values()}

    def absorb(self, outputs: dict[str, Any], positions: int) -> None:
        """Take each cell's new value from a forward over ``positions`` positions; a value
        of another shape or dtype than the cell declares is an ``ExecutionError`` naming
        the cell (shapes are host metadata: checking them reads nothing back)."""
        for cell in self.cells.values():
            value = outputs[cell.spec.output]
            expected = list(cell.spec.shape)
            if cell.spec.kind == "kv" and cell.spec.update == "append":
                expected[cell.spec.seq_axis] = cell.length + positions
            if list(value.shape) != expected or value.dtype != cell.value.dtype:
                raise ExecutionError(
                    f"state output {cell.spec.output!r} has shape {tuple(value.shape)} "
                    f"{value.dtype}, expected {tuple(expected)} {cell.value.dtype} (the "
                    f"cell's {cell.length} valid positions + {positions} fed)",
                    field=f"state.{cell.name}", value=tuple(value.shape),
                    remedy="the component must return each state cell in its declared shape "
                           "and dtype, and a rollback must truncate kv cells to the "
                           "committed length")
            cell.value = value
            cell.length += positions

    @property
    def length(self) -> int:
        """The common valid length of the kv cells (0 without any)."""
        lengths = {c.length for c in self.cells.values() if c.spec.kind == "kv"}
        return lengths.pop() if len(lengths) == 1 else 0

    def truncate(self, length: int) -> None:
        """Roll kv cells back to ``length`` positions; recurrent cells refuse (snapshot them)."""
        for cell in self.cells.values():
            if cell.spec.kind != "kv":
                raise InputError("a recurrent cell cannot be truncated", field=f"state.{cell.name}",
                                 value=cell.length, remedy="restore it from a snapshot instead")
            if not 0 <= length <= cell.length:
                raise InputError("truncate past the cell's length", field=f"state.{cell.name}",
                                 value=length, remedy=f"truncate to at most {cell.length}")
            if cell.spec.update == "append":
                cell.value = self.ops.truncate_axis(cell.value, cell.spec.seq_axis, length)
            cell.length = length


__all__ = ["Cell", "StateCells", "dtype_of"]
