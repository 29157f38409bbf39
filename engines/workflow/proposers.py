"""Proposers: what produces the W draft tokens of a speculative round.

- ``DraftModelProposer`` (kind ``draft``): a separate draft model with its own state cells.
  Each round it is fed the committed tokens it has not seen plus the pending token in one
  forward, then one forward per further draft; after verification it is truncated to the
  prefix it processed that is still committed.
- ``CarryProposer`` (kinds ``chained`` and ``mtp``): the proposer is fed the token's
  embedding and a folded carry, seeded once per proposal from a declared target output at the
  last committed position. With ``fused_input`` the two halves are assembled into one
  preallocated buffer on the engine's residency (``gather_rows`` of the scaled token table
  + ``scatter_into_last_axis``); borrowed target cells are bound from the target's latest
  (rolled-back) value, never from the initial seed.

Every value stays where the engine keeps it; the only readback is ``argmax_rows`` of one
row per step (4 bytes on a device). Kind ``prompt-lookup`` runs no model:
``prompt_lookup.PromptLookupProposer``.
"""
from __future__ import annotations

import time
from typing import Any

import numpy as np

from engines.errors import InputError, PackageError
from engines.package.speculative_ports import embedding_table
from engines.residency import residency_of
from engines.workflow.session import DecodeSession
from engines.workflow.state import DecodeState


def argmax_last_row(ops, logits) -> int:
    """The argmax of the last position of ``[1, M, V]`` logits: 4 bytes read back."""
    last = ops.last_along_axis(logits, 1)
    return ops.argmax_rows(last.reshape(1, last.shape[-1]), 1)[0]


class DraftModelProposer:
    """A separate draft model with its own cells (kind ``draft``)."""

    fixed_width = False  # each draft costs a forward: a round is never wider than needed

    def __init__(self, engine, target: DecodeSession, spec):
        self.engine = engine
        self.target = target
        self.session = DecodeSession(engine, component=spec.proposer)
        for name, cell in self.session.cells.cells.items():
            if cell.spec.kind != "kv":
                raise PackageError(f"draft model cell {name!r} is recurrent; a draft model's "
                                   f"cells are rolled back by truncation", field=f"state.{name}",
                                   value=cell.spec.kind,
                                   remedy="give the draft model kv cells only, or use kind: mtp")
        self.seen: list[int] = []  # the tokens the draft model has processed, in order

    def propose(self, sequence: list[int], width: int) -> list[int]:
        """``sequence``: prompt + committed tokens, the last one pending (not yet verified)."""
        ops = self.engine.tensor_ops
        unseen = sequence[len(self.seen):]
        out = self.session.forward(unseen, "propose")
        self.seen += unseen
        drafts = [argmax_last_row(ops, out["logits"])]
        while len(drafts) < width:
            out = self.session.forward(drafts[-1:], "propose")
            self.seen.append(drafts[-1])
            drafts.append(argmax_last_row(ops, out["logits"]))
        return drafts

    def after_round(self, committed: list[int], **_: Any) -> None:
        """Keep the processed prefix that is still committed; drop the rest."""
        keep = 0
        for a, b in zip(self.seen, committed):
            if a != b:
                break
            keep += 1
        if keep < len(self.seen):
            self.session.rollback(keep)
            del self.seen[keep:]


class CarryProposer:
    """A proposer fed (token embedding, carry) each step (kinds ``chained`` and ``mtp``)."""

    fixed_width = False  # each draft costs a forward: a round is never wider than needed

    def __init__(self, engine, target: DecodeSession, spec):
        self.engine = engine
        self.target = target
        self.spec = spec
        package = engine.package
        comp = package.spec.components[spec.proposer]
        self.name = spec.proposer
        self.inputs = dict(comp.inputs)
        self.outputs = dict(comp.outputs)
        self.seed_role = spec.carry.seed
        self.carry_out = spec.carry.output
        # proposer-owned cells (an MTP head's cache) and the positions they hold
        self.state = DecodeState.of_component(package, spec.proposer, engine.tensor_ops)
        self.table = None
        self.buffer = None
        if spec.fused_input is not None:
            emb = spec.embedding
            host = embedding_table(package.component_model(emb.component), emb.initializer)
            # the scale is applied once, here, in float64, then rounded to the table's dtype
            scaled = (host.astype(np.float64) * emb.scale).astype(host.dtype)
            self.table = engine.tensor_ops.adopt(np.ascontiguousarray(scaled))
            self.fused_port = self.inputs[spec.fused_input]

    @property
    def ops(self):
        return self.engine.tensor_ops

    @property
    def position(self) -> int:
        return self.state.position

    def seed_from(self, target_out: dict, row: int):
        """The carry seed: the target's ``seed`` output at ``row`` (the last committed
        position), ``[1, 1, C]``; adopted once if the engine returned it on the host."""
        value = target_out[self.seed_role]
        seed = self.ops.slice_axis(value, 1, row, 1)
        if residency_of(seed) != self.ops.residency:
            seed = self.ops.adopt(np.ascontiguousarray(seed))
        return seed

    def _borrowed(self) -> dict[str, Any]:
        """Borrowed ports bound from the target's cells as they are now (rolled back)."""
        cells = self.target.cells.cells
        return {port: cells[cell].value for port, cell in self.spec.borrows.items()}

    def _fused(self, token: int, carry):
        ops = self.ops
        emb = ops.gather_rows(self.table, [token])                      # [1, E]
        emb = emb.reshape(1, 1, emb.shape[-1])
        width = emb.shape[-1] + carry.shape[-1]
        if self.buffer is None or self.buffer.shape[-1] != width:
            # one buffer, allocated once and refilled in place for every step
            self.buffer = ops.zeros((1, 1, width), emb.dtype)
        ops.scatter_into_last_axis(self.buffer, 0, emb)
        ops.scatter_into_last_axis(self.buffer, emb.shape[-1], carry)
        return self.buffer

    def step(self, token: int, carry, position: int, phase: str = "propose") -> dict[str, Any]:
        """One proposer forward at ``position``; returns its outputs by graph name."""
        ops = self.ops
        feeds: dict[str, Any] = {}
        if self.table is not None:
            feeds[self.fused_port] = self._fused(token, carry)
        else:
            feeds[self.spec.carry.input] = carry
        if "tokens" in self.inputs:
            feeds[self.inputs["tokens"]] = ops.adopt(np.asarray([[token]], dtype=np.int64))
        if "positions" in self.inputs:
            feeds[self.inputs["positions"]] = ops.adopt(np.asarray([[position]], dtype=np.int64))
        feeds.update(self._borrowed())
        feeds.update(self.state.feeds())
        start = time.perf_counter()
        out = self.engine.run_component(self.name, feeds, phase=phase)
        self.engine.ledger.record_forward(phase, 1, time.perf_counter() - start)
        self.state.absorb(out, 1)
        return out

    def propose(self, pending: int, width: int, seed, position: int) -> list[int]:
        """W drafts after ``pending`` (at ``position``), the carry seeded with ``seed``."""
        if self.state.cells and self.position != position:
            raise InputError("the proposer's own cells are out of step with the target",
                             field="position", value=self.position,
                             remedy=f"expected {position}: report this as a lockstep bug")
        drafts: list[int] = []
        token, carry = pending, seed
        for k in range(width):
            out = self.step(token, carry, position + k)
            token = argmax_last_row(self.ops, out[self.outputs["logits"]])
            drafts.append(token)
            carry = self.ops.last_along_axis(out[self.carry_out], 1)
        return drafts

    def after_round(self, committed: list[int], *, start: int, accepted: int, width: int,
                    drafts: list[int], target_out: dict, row_of_position) -> None:
        """Proposer-owned cells (an MTP head's cache) follow the committed sequence."""
        if not self.state.cells:
            return
        self.state.rollback(start + min(accepted, width - 1) + 1)  # the processed prefix kept
        if accepted == width:
            # full accept: the last draft was never fed; feed it with the target's carry
            pos = start + width
            self.step(drafts[-1], self.seed_from(target_out, row_of_position(pos - 1)), pos)
