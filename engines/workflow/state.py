"""Decode state: the one owner of a sequence's state cells and its position.

A ``kv`` cell with ``append`` grows along its sequence axis by the graph's own concat; one
with ``static`` is a fixed buffer written in-graph, whose valid length the runtime tracks.
A ``recurrent`` cell is overwritten each forward and cannot be truncated, only restored
from a snapshot.

Speculative decoding moves state backwards: a rejected draft must leave no trace. ``rollback``
truncates kv cells (``truncate_axis``: a zero-copy view of the contiguous prefix for an append
cell; a shorter valid length for a static one) and moves the position with them, so the two
never disagree; recurrent cells are copied into a preallocated arena before verification
(``snapshot``) and copied back on a partial accept (``restore``). Every move goes through the
engine's ``TensorOps``: on a device engine the snapshot is a device-to-device ``copy_into`` on
the engine's stream and nothing leaves the device. The interpreter (greedy, both proposers,
verification) and the stateful property test drive this one class.

``snapshot_mode="host"`` is the measured comparison only: the snapshot is staged to the host
(``stage_to_host``: counted as host staging on a device) and adopted back on restore.
"""
from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import numpy as np

from engines.dtypes import dtype_of  # re-exported: engines.workflow.state.dtype_of
from engines.errors import ExecutionError, InputError

SNAPSHOT_MODES = ("device", "host")


@dataclass
class Cell:
    name: str
    spec: Any  # StateCellSpec
    value: Any
    length: int  # valid positions (kv); forwards absorbed (recurrent)


class DecodeState:
    """The cells one component owns and the position of its sequence, at the residency of
    ``ops``; see the module doc."""

    def __init__(self, ops, cells: dict[str, Cell], snapshot_cells: Iterable[str] = (),
                 snapshot_mode: str = "device", position: int = 0):
        if snapshot_mode not in SNAPSHOT_MODES:
            raise InputError("unknown snapshot mode", field="snapshot_mode", value=snapshot_mode,
                             remedy=f"use one of: {', '.join(SNAPSHOT_MODES)}")
        self.ops = ops
        self.cells = cells
        self.position = position  # positions committed; moved only by absorb and rollback
        self.snapshot_mode = snapshot_mode
        self.snapshot_cells = list(snapshot_cells)
        for name in self.snapshot_cells:
            cell = self._cell(name, "snapshot")
            if cell.spec.kind != "recurrent":
                raise InputError(f"cell {name!r} is {cell.spec.kind}; only recurrent cells are "
                                 f"snapshotted", field="snapshot", value=name,
                                 remedy="roll kv cells back with truncate instead")
        # the arena: one snapshot buffer and one restore buffer per cell, allocated once
        self._arena: dict[str, Any] = {}
        self._restore_into: dict[str, Any] = {}
        if snapshot_mode == "device":
            for name in self.snapshot_cells:
                spec = self.cells[name].spec
                self._arena[name] = ops.zeros(tuple(spec.shape), dtype_of(spec.dtype))
                self._restore_into[name] = ops.zeros(tuple(spec.shape), dtype_of(spec.dtype))
        self._host_copies: dict[str, np.ndarray] = {}
        self._saved_lengths: dict[str, int] | None = None
        # truncate's cells by the names asked for (None: every kv cell), once checked
        self._truncated: dict[tuple[str, ...] | None, list[Cell]] = {}
        # per cell: its declared shape, and the sequence axis where it grows (else None);
        # ``absorb`` checks every cell every forward, so they are read from the spec once
        self._expect = {name: (tuple(c.spec.shape),
                               c.spec.seq_axis if c.spec.kind == "kv"
                               and c.spec.update == "append" else None)
                        for name, c in cells.items()}

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def fresh(cls, ops, specs: dict[str, Any], snapshot_cells: Iterable[str] = (),
              snapshot_mode: str = "device") -> DecodeState:
        """Zero-initialised cells for ``specs`` (name -> StateCellSpec)."""
        cells = {name: Cell(name, spec, ops.zeros(tuple(spec.shape), dtype_of(spec.dtype)), 0)
                 for name, spec in specs.items()}
        return cls(ops, cells, snapshot_cells, snapshot_mode)

    @classmethod
    def of_component(cls, package, component: str, ops, snapshot_cells: Iterable[str] = (),
                     snapshot_mode: str = "device") -> DecodeState:
        """The zero-initialised cells ``component`` owns in ``package``."""
        return cls.fresh(ops, {name: spec for name, spec in package.spec.state.items()
                               if spec.component == component}, snapshot_cells, snapshot_mode)

    @classmethod
    def over(cls, state: DecodeState, snapshot_cells: Iterable[str] = (),
             snapshot_mode: str = "device") -> DecodeState:
        """Another snapshot arena over the same cells (a test that snapshots by hand); the
        position stays with ``state``."""
        return cls(state.ops, state.cells, snapshot_cells, snapshot_mode, state.position)

    # -- reading ---------------------------------------------------------------------------
    def _cell(self, name: str, field: str) -> Cell:
        try:
            return self.cells[name]
        except KeyError:
            raise InputError(f"no state cell {name!r}", field=field, value=name,
                             remedy=f"use one of: {', '.join(self.cells) or '(none)'}") from None

    def value(self, name: str):
        return self._cell(name, "cell").value

    def length(self, name: str) -> int:
        return self._cell(name, "cell").length

    @property
    def has_snapshot(self) -> bool:
        return self._saved_lengths is not None

    def feeds(self) -> dict[str, Any]:
        """Each cell's value under its graph input name."""
        return {c.spec.input: c.value for c in self.cells.values()}

    # -- moving forward --------------------------------------------------------------------
    def absorb(self, outputs: dict[str, Any], positions: int) -> None:
        """Take each cell's new value (``outputs`` by graph output name) from a forward over
        ``positions`` new positions, and advance the position. A value of another shape or
        dtype than the cell declares is an ``ExecutionError`` naming the cell (shapes are
        host metadata: checking them reads nothing back)."""
        expect = self._expect
        for name, cell in self.cells.items():
            value = outputs[cell.spec.output]
            shape, axis = expect[name]
            if axis is None:
                if value is cell.value:
                    continue  # the buffer it holds, fed back (a graph replay's static output)
                expected = shape
            else:
                expected = shape[:axis] + (cell.length + positions,) + shape[axis + 1:]
            if tuple(value.shape) != expected or value.dtype != cell.value.dtype:
                raise ExecutionError(
                    f"state output {cell.spec.output!r} has shape {tuple(value.shape)} "
                    f"{value.dtype}, expected {tuple(expected)} {cell.value.dtype} (the "
                    f"cell's {cell.length} valid positions + {positions} fed)",
                    field=f"state.{cell.name}", value=tuple(value.shape),
                    remedy="the component must return each state cell in its declared shape "
                           "and dtype, and a rollback must truncate kv cells to the "
                           "committed length")
        for cell in self.cells.values():
            cell.value = outputs[cell.spec.output]
            cell.length += positions
        self.position += positions

    # -- moving back -----------------------------------------------------------------------
    def rollback(self, length: int, names: Iterable[str] | None = None) -> None:
        """Go back to ``length`` committed positions: kv cells (every one, or ``names``)
        truncated to it and the position moved with them."""
        self.truncate(length, names)
        self.position = length

    def truncate(self, length: int, names: Iterable[str] | None = None) -> None:
        """The cell half of ``rollback`` (kv cells only; the position stays): callers use
        ``rollback``. Refusals, checked for every cell before any changes: a recurrent cell,
        a length past a cell's valid length, a negative length."""
        key = None if names is None else tuple(names)
        chosen = self._truncated.get(key)
        if chosen is None:  # checked once a set of names (a round truncates every kv cell)
            chosen = [self._cell(n, "rollback") for n in
                      (key if key is not None else
                       [n for n, c in self.cells.items() if c.spec.kind == "kv"])]
            for cell in chosen:
                if cell.spec.kind != "kv":
                    raise InputError(f"recurrent cell {cell.name!r} cannot be truncated",
                                     field=f"state.{cell.name}", value=length,
                                     remedy="snapshot it before verification and restore it")
            self._truncated[key] = chosen
        for cell in chosen:
            if not 0 <= length <= cell.length:
                raise InputError(f"truncate to {length} past the cell's length {cell.length}",
                                 field=f"state.{cell.name}", value=length,
                                 remedy=f"truncate to a length in [0, {cell.length}]")
        for cell in chosen:
            if cell.spec.update == "append":
                cell.value = self.ops.truncate_axis(cell.value, cell.spec.seq_axis, length)
            cell.length = length  # a static cell keeps its buffer; only the valid length shrinks

    def snapshot(self) -> None:
        """Copy the snapshot cells into the arena (device) or to the host (comparison)."""
        for name in self.snapshot_cells:
            cell = self.cells[name]
            if self.snapshot_mode == "device":
                self.ops.copy_into(self._arena[name], cell.value)
            else:
                self._host_copies[name] = self.ops.stage_to_host(cell.value, f"snapshot:{name}")
        self._saved_lengths = {n: self.cells[n].length for n in self.snapshot_cells}
        self.ops.ledger.snapshots += 1

    def restore(self) -> None:
        """Put the snapshot back (byte-identical); refused without a snapshot."""
        if self._saved_lengths is None:
            raise InputError("restore without a snapshot", field="snapshot", value=None,
                             remedy="take a snapshot before verification, then restore it")
        for name in self.snapshot_cells:
            cell = self.cells[name]
            if self.snapshot_mode == "device":
                cell.value = self.ops.copy_into(self._restore_into[name], self._arena[name])
            else:
                cell.value = self.ops.adopt(np.array(self._host_copies[name], copy=True))
            cell.length = self._saved_lengths[name]
        self.ops.ledger.restores += 1

    def fork(self) -> DecodeState:
        """An independent copy of every cell, the position and the snapshot, if one was taken."""
        cells = {n: Cell(n, c.spec, self._copy(c.value), c.length) for n, c in self.cells.items()}
        twin = DecodeState(self.ops, cells, self.snapshot_cells, self.snapshot_mode,
                           self.position)
        if self._saved_lengths is not None:
            for name in self.snapshot_cells:
                if self.snapshot_mode == "device":
                    self.ops.copy_into(twin._arena[name], self._arena[name])
                else:
                    twin._host_copies[name] = np.array(self._host_copies[name], copy=True)
            twin._saved_lengths = dict(self._saved_lengths)
        return twin

    def _copy(self, value):
        fresh = self.ops.zeros(tuple(value.shape), value.dtype)
        return self.ops.copy_into(fresh, value) if value.size else fresh


__all__ = ["SNAPSHOT_MODES", "Cell", "DecodeState", "dtype_of"]
