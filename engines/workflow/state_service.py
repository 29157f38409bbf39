"""The state service: append, truncate, snapshot, restore and fork over one component's cells.

Speculative decoding moves state backwards: a rejected draft must leave no trace in the
target's cells. kv cells roll back by truncation (``truncate_axis``: a zero-copy view of the
contiguous prefix for an append cell; a shorter valid length for a static one); recurrent
cells cannot be truncated, so they are copied into a preallocated arena before
verification and copied back on a partial accept. Every move goes through the engine's
``TensorOps``, so on a device engine nothing leaves the device: the snapshot is a
device-to-device ``copy_into`` on the engine's stream.

The same service backs the interpreter and the stateful property test: one object, one set
of refusals (truncate past the length, truncate a recurrent cell, restore without a
snapshot), whatever the residency.

``snapshot_mode="host"`` is the measured comparison only: the snapshot is staged to the host
(``stage_to_host``: counted as host staging on a device) and adopted back on restore.
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from engines.errors import InputError
from engines.workflow.state import Cell, StateCells, dtype_of

SNAPSHOT_MODES = ("device", "host")


class StateService:
    """Cells of one component at the residency of ``ops``; see the module doc."""

    def __init__(self, ops, cells: dict[str, Cell], snapshot_cells: Iterable[str] = (),
                 snapshot_mode: str = "device"):
        if snapshot_mode not in SNAPSHOT_MODES:
            raise InputError("unknown snapshot mode", field="snapshot_mode", value=snapshot_mode,
                             remedy=f"use one of: {', '.join(SNAPSHOT_MODES)}")
        self.ops = ops
        self.cells = cells
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

    # -- construction ----------------------------------------------------------------------
    @classmethod
    def over(cls, state_cells: StateCells, snapshot_cells: Iterable[str] = (),
             snapshot_mode: str = "device") -> StateService:
        """A service sharing the Cell objects of a decode session (its forwards absorb)."""
        return cls(state_cells.ops, state_cells.cells, snapshot_cells, snapshot_mode)

    @classmethod
    def fresh(cls, ops, specs: dict[str, Any], snapshot_cells: Iterable[str] = (),
              snapshot_mode: str = "device") -> StateService:
        """Zero-initialised cells for ``specs`` (name -> StateCellSpec)."""
        cells = {name: Cell(name, spec, ops.zeros(tuple(spec.shape), dtype_of(spec.dtype)), 0)
                 for name, spec in specs.items()}
        return cls(ops, cells, snapshot_cells, snapshot_mode)

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

    # -- writing ---------------------------------------------------------------------------
    def absorb(self, values: dict[str, Any], positions: int) -> None:
        """A forward over ``positions`` new positions produced these new cell values."""
        for name, value in values.items():
            cell = self._cell(name, "values")
            cell.value = value
            cell.length += positions

    def truncate(self, length: int, names: Iterable[str] | None = None) -> None:
        """Roll kv cells back to ``length`` valid positions (all kv cells, or ``names``).

        Refusals, checked for every cell before any changes: a recurrent cell, a length
        past a cell's valid length, a negative length."""
        chosen = [self._cell(n, "rollback") for n in
                  (names if names is not None else
                   [n for n, c in self.cells.items() if c.spec.kind == "kv"])]
        for cell in chosen:
            if cell.spec.kind != "kv":
                raise InputError(f"recurrent cell {cell.name!r} cannot be truncated",
                                 field=f"state.{cell.name}", value=length,
                                 remedy="snapshot it before verification and restore it")
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

    def fork(self) -> StateService:
        """An independent copy of every cell (and of the snapshot, if one was taken)."""
        cells = {n: Cell(n, c.spec, self._copy(c.value), c.length) for n, c in self.cells.items()}
        twin = StateService(self.ops, cells, self.snapshot_cells, self.snapshot_mode)
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
