"""The workflow interpreter: one decode session drives any engine the same way.

A forward runs over M positions (prefill, a decode step, later verification of W+1
drafts), feeds the runtime-owned state cells and absorbs their new values. Token ids cross
only through the engine's tensor ops: ``adopt`` on the way in, ``argmax_rows`` (4 bytes a
row) on the way out, both counted in the engine's ledger. Where the tensor ops keep a
device feed (``supports_device_feed``), a greedy step's token id and position are made
where the engine lives (``next_token_feed``, ``advance_positions``): only the prompt
crosses in. Every forward is told its phase (``Engine.run_component``'s ``phase``:
native-cuda's graph slots replay ``decode``, ``propose`` and ``verify`` forwards). The
pipelined greedy loop (``pipelined=True``) queues each next forward before it waits for the
last id (``TensorOps.next_token_async``).
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from engines.decode_result import DecodeResult
from engines.ledger import Ledger
from engines.requests import check_request
from engines.workflow.state import DecodeState


class DecodeSession:
    """One sequence on one engine's component: its forwards, over the ``DecodeState`` that
    owns its cells and position (``snapshot_cells``: recurrent cells verification restores)."""

    def __init__(self, engine, component: str = "target", snapshot_cells=(),
                 snapshot_mode: str = "device", pipelined: bool = False):
        self.engine = engine
        # greedy: queue each next forward before the last token is read (``_greedy_pipelined``)
        self.pipelined = bool(pipelined)
        self.package = engine.package
        self.spec = self.package.spec
        self.component = component
        comp = self.spec.components[component]
        self.inputs = dict(comp.inputs)
        self.outputs = dict(comp.outputs)
        self.state = DecodeState.of_component(self.package, component, engine.tensor_ops,
                                              snapshot_cells, snapshot_mode)
        # the last forward's positions feed and the position it ended at (device feed)
        self._positions: tuple[Any, int] | None = None
        # the last ``forward``'s tokens feed (kept by the ops until the next forward of its
        # width): a verification's accept reads its drafts there
        self.tokens_fed: Any = None

    @property
    def ops(self):
        return self.engine.tensor_ops

    @property
    def cells(self) -> DecodeState:
        """The state (``cells.cells``: the ``Cell`` objects by name)."""
        return self.state

    @property
    def position(self) -> int:
        return self.state.position

    @position.setter
    def position(self, value: int) -> None:  # a test steering the state by hand
        self.state.position = value

    @property
    def ledger(self) -> Ledger:
        return self.engine.ledger

    def forward(self, tokens: Sequence[int], phase: str) -> dict[str, Any]:
        """Run the component over ``len(tokens)`` new positions; returns outputs by role."""
        m = len(tokens)
        host = [np.asarray(tokens, dtype=np.int64).reshape(1, m)]
        if "positions" in self.inputs:
            host.append(np.arange(self.position, self.position + m,
                                  dtype=np.int64).reshape(1, m))
        # one staged copy a step on a device (the feeds keep their addresses step to step)
        fed = self.ops.adopt_feeds(host, key=self.component)
        self.tokens_fed = fed[0]
        feeds = {self.inputs["tokens"]: fed[0]}
        if "positions" in self.inputs:
            feeds[self.inputs["positions"]] = fed[1]
        return self._run(feeds, m, phase)

    def forward_fed(self, token_feed, phase: str) -> dict[str, Any]:
        """One position whose token id already lives with the engine (``next_token``'s
        feed); its position is advanced there too, so nothing crosses."""
        feeds = {self.inputs["tokens"]: token_feed}
        if "positions" in self.inputs:
            last = self._positions
            if last is not None and last[1] == self.position:
                feeds[self.inputs["positions"]] = self.ops.advance_positions(last[0], 1)
            else:  # no forward yet, or truncated since: the position crosses once
                pos = np.full((1, 1), self.position, dtype=np.int64)
                feeds[self.inputs["positions"]] = self.ops.adopt(pos)
        return self._run(feeds, 1, phase)

    def _run(self, feeds: dict[str, Any], m: int, phase: str) -> dict[str, Any]:
        feeds.update(self.state.feeds())
        start = time.perf_counter()
        out = self.engine.run_component(self.component, feeds, phase=phase)
        self.ledger.record_forward(phase, m, time.perf_counter() - start)
        self.state.absorb(out, m)  # the cells' new values, and the position, together
        if "positions" in self.inputs:
            self._positions = (feeds[self.inputs["positions"]], self.position)
        return {role: out[name] for role, name in self.outputs.items()}

    def last_token(self, logits) -> int:
        """Greedy choice at the last position: argmax on the engine, 4 bytes read back."""
        last = self.ops.last_along_axis(logits, 1)
        return self.ops.argmax_rows(last.reshape(1, last.shape[-1]), 1)[0]

    def next_token(self, logits) -> tuple[int, Any]:
        """The greedy choice at the last position (4 bytes read back) and, where the tensor
        ops keep a device feed, the same id as the next forward's tokens feed (else None)."""
        if not self.ops.supports_device_feed:
            return self.last_token(logits), None
        last = self.ops.last_along_axis(logits, 1)
        return self.ops.next_token_feed(last.reshape(1, last.shape[-1]))

    def rollback(self, length: int, cells=None) -> None:
        """Back to ``length`` committed positions: kv cells (all, or ``cells``) and the
        position move together (``DecodeState.rollback``)."""
        self.state.rollback(length, cells)

    def truncate(self, length: int) -> None:
        """Every kv cell and the position back to ``length`` (``rollback`` of all cells)."""
        self.state.rollback(length)

    def audit_row(self, logits):
        """The last position's logits as a host float64 row (claim 1b's audit): on a device
        a readback accounted under its own purpose, ``logits_audit``."""
        last = self.ops.last_along_axis(logits, 1)
        return self.ops.audit_row(last.reshape(1, last.shape[-1]))

    def greedy(self, prompt: Sequence[int], max_new_tokens: int,
               audit: bool = False, ignore_eos: bool = False) -> DecodeResult:
        """Greedy decode: stops after emitting the package's eos or at ``max_new_tokens``.
        ``ignore_eos`` (for timing only: ``lockstep bench --ignore-eos``) keeps going past
        eos, so exactly ``max_new_tokens`` come back; a parity run never sets it."""
        ids = check_request(self.spec, prompt, max_new_tokens)
        tokens: list[int] = []
        try:
            return self._greedy(ids, max_new_tokens, audit, tokens, ignore_eos)
        except Exception as exc:
            exc.decode_step = len(tokens)  # the step being decided when it failed
            raise

    def _greedy(self, ids: list[int], max_new_tokens: int, audit: bool,
                tokens: list[int], ignore_eos: bool = False) -> DecodeResult:
        if self.pipelined and self.ops.supports_device_feed and not audit:
            return self._greedy_pipelined(ids, max_new_tokens, tokens, ignore_eos)
        eos = None if ignore_eos else self.spec.eos_id
        rows: list[np.ndarray] | None = [] if audit else None
        start = time.perf_counter()
        steps = []
        out = self.forward(ids, "prefill")
        if rows is not None:
            rows.append(self.audit_row(out["logits"]))
        token, feed = self.next_token(out["logits"])
        tokens.append(token)
        steps.append(time.perf_counter() - start)
        while len(tokens) < max_new_tokens and tokens[-1] != eos:
            t0 = time.perf_counter()
            out = (self.forward_fed(feed, "decode") if feed is not None
                   else self.forward(tokens[-1:], "decode"))
            if rows is not None:
                rows.append(self.audit_row(out["logits"]))
            token, feed = self.next_token(out["logits"])
            tokens.append(token)
            steps.append(time.perf_counter() - t0)
        wall = time.perf_counter() - start
        return DecodeResult(self.engine.name, ids, tokens, self.ledger, wall, steps, rows)

    def _greedy_pipelined(self, ids: list[int], max_new_tokens: int, tokens: list[int],
                          ignore_eos: bool) -> DecodeResult:
        """The greedy loop with the host's work for step t+1 (its feeds, its launch) queued
        while step t still runs: the forward on step t's device feed is queued before step
        t's 4-byte id is waited for (``TensorOps.next_token_async``). The same tokens, the
        same readbacks (one ``token_id`` a token); when a token is eos the forward queued
        after it is undone (``rollback``; the ledger still counts it) and its logits never
        read. Steps are the times between consecutive tokens."""
        eos = None if ignore_eos else self.spec.eos_id
        start = last = time.perf_counter()
        steps = []
        out = self.forward(ids, "prefill")
        while out is not None:
            out = self.step_ahead(out["logits"], tokens, max_new_tokens, eos)
            now = time.perf_counter()
            steps.append(now - last)
            last = now
        wall = time.perf_counter() - start
        return DecodeResult(self.engine.name, ids, tokens, self.ledger, wall, steps, None)

    def step_ahead(self, logits, tokens: list[int], max_new_tokens: int, eos) -> Any:
        """One pipelined greedy step: the id ``logits`` decide at their last position joins
        ``tokens``, the decode forward over it queued on its device feed before the host waits
        for it (``TensorOps.next_token_async``). Returns that forward's outputs (by role), or
        None where the decode ends at this token: ``max_new_tokens`` reached (nothing was
        queued) or eos (the forward queued past it undone, never read: ``discarded_forwards``)."""
        last = self.ops.last_along_axis(logits, 1)
        pending, feed = self.ops.next_token_async(last.reshape(1, last.shape[-1]))
        ahead = len(tokens) + 1 < max_new_tokens  # a forward follows unless this is eos
        if ahead:
            committed = self.position
            out = self.forward_fed(feed, "decode")
        tokens.append(pending.result())
        if not ahead:
            return None
        if tokens[-1] == eos:
            self.rollback(committed)
            self.ledger.discarded_forwards += 1
            return None
        return out


def greedy_decode(engine, prompt: Sequence[int], max_new_tokens: int,
                  audit: bool = False, ignore_eos: bool = False,
                  pipelined: bool = False) -> DecodeResult:
    """Fresh ledger, fresh session, greedy decode; with ``audit`` each step's logits row
    comes back too (``DecodeResult.logits``). An engine that declares ``decodes_itself`` (a
    black box such as ``hf``, through transformers' ``generate``) is handed the validated
    request through ``Engine.generate`` instead.

    ``pipelined`` (``lockstep bench --pipelined``) runs ``DecodeSession._greedy_pipelined``
    where the engine's tensor ops keep a device feed (not with ``audit``): the same tokens
    and readbacks, the next forward queued before each id is waited for.

    ``ignore_eos`` is for timing only (``lockstep bench --ignore-eos``): the loop goes on
    past eos and returns exactly ``max_new_tokens`` tokens. A parity run never sets it. A
    black box is asked for it as ``generate(..., ignore_eos=True)`` (only then, so the
    contract's three-argument ``generate`` is all a parity run needs); one whose
    ``generate`` takes no such keyword fails with a ``TypeError``."""
    if engine.decodes_itself:
        ids = check_request(engine.package.spec, prompt, max_new_tokens)
        if ignore_eos:
            return engine.generate(ids, max_new_tokens, audit=audit, ignore_eos=True)
        return engine.generate(ids, max_new_tokens, audit=audit)
    engine.reset_ledger()
    return DecodeSession(engine, pipelined=pipelined).greedy(prompt, max_new_tokens,
                                                             audit=audit,
                                                             ignore_eos=ignore_eos)


__all__ = ["DecodeResult", "DecodeSession", "greedy_decode"]
