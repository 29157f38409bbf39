"""Speculative decoding: propose W drafts, verify W+1 positions in one target forward, commit.

One implementation for every engine (the engine only runs components and moves values
through its ``TensorOps``). A round, with L positions committed and the pending token t
(emitted, not yet fed to the target):

1. the proposer drafts d1..dW (``proposers.py``): 4 bytes read back per draft (a
   ``prompt-lookup`` proposer, ``prompt_lookup.py``, copies them from the sequence on the
   host and reads back nothing; where it finds no match the round is one plain decode
   step);
2. recurrent target cells are snapshotted device-to-device (``state.py``);
3. the target runs [t, d1..dW] at positions L..L+W (phase ``verify``);
4. ``accept_drafts`` compares the target's argmax per row with the drafts on the engine's
   residency (on a device one launch, the drafts read from the verification's own tokens
   feed): ``accepted`` n (4 bytes, ``accept_count``) and the bonus token (4 bytes,
   ``token_id``), read back together, are the only readbacks;
5. committed: d1..dn + bonus. Full accept (n = W): nothing to undo. Partial: kv cells roll
   back by truncation; with recurrent cells, kv roll back to L, the snapshot is restored
   and [t, d1..dn] re-advanced (phase ``readvance``, n+1 positions), without them kv
   truncate to L+n+1.

Readback per round on a device: 4 bytes per proposer step (none for prompt-lookup) + 8 per
verification. Decoding stops at eos or max_new_tokens exactly like greedy, so the streams are
equal token for token including their length (a round's width shrinks near max_new_tokens,
so a round never commits past it; with one token left a plain decode step ends the stream).
A proposer that drafts for free (``fixed_width``: prompt-lookup) keeps every round at the
full width where the context has room, and its last round commits only the tokens left: its
verifications then keep one shape (one VERIFY graph on native-cuda, never recaptured).

``ignore_eos`` (for timing only: ``lockstep bench --mode speculative --ignore-eos``) is
greedy's: eos stops nothing and cuts no round short, every proposal and acceptance is
otherwise the same, and exactly ``max_new_tokens`` tokens come back. A parity run never
sets it.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from engines.decode_result import AuditedForward
from engines.errors import InputError
from engines.workflow.prompt_lookup import PromptLookupProposer
from engines.workflow.proposers import CarryProposer, DraftModelProposer, argmax_last_row
from engines.workflow.session import DecodeResult, DecodeSession
from engines.workflow.state import SNAPSHOT_MODES
from engines.requests import check_request


@dataclass
class SpeculativeResult(DecodeResult):
    kind: str = ""
    width: int = 0
    acceptance_per_round: list[int] = field(default_factory=list)
    widths_per_round: list[int] = field(default_factory=list)
    drafts_per_round: list[list[int]] = field(default_factory=list)
    # positions committed into the target before each round (L): where its drafts start
    start_per_round: list[int] = field(default_factory=list)
    # with an audit: the rows of every target forward that decided tokens (the prefill, each
    # verification's W+1 rows, plain decode steps), read back under ``logits_audit``
    audited: list[AuditedForward] | None = None


def check_width(spec, width, field: str = "width") -> int:
    """The one width rule: the package speculates, and ``width`` is an integer in
    1..``decoding.speculative.max_width`` (``field``: the name the caller knows it by)."""
    sp = spec.decoding.speculative
    if sp is None:
        raise InputError(f"package {spec.name!r} declares no speculative decoding",
                         field="decoding.speculative", value=None,
                         remedy="decode it greedily (lockstep run --mode greedy), or use a "
                                "package with a speculative section")
    if isinstance(width, bool) or not isinstance(width, int):
        raise InputError("width must be an integer", field=field, value=width,
                         remedy=f"use an integer width in 1..{sp.max_width} (decoding."
                                f"speculative.max_width)")
    if not 1 <= width <= sp.max_width:
        raise InputError(f"width {width} is outside 1..max_width {sp.max_width} of "
                         f"{spec.name!r}", field=field, value=width,
                         remedy=f"use a width in 1..{sp.max_width} (decoding.speculative."
                                f"max_width), or all")
    return width


def speculative_widths(spec, widths=None, field: str = "width") -> list[int]:
    """The widths to run: ``None`` or ``"all"`` is 1..max_width; a list is checked width by
    width with ``check_width``."""
    if widths is None or widths == "all":
        check_width(spec, 1, field)  # the package speculates at all
        return list(range(1, spec.decoding.speculative.max_width + 1))
    return [check_width(spec, w, field) for w in widths]


class SpeculativeSession:
    """One sequence decoded speculatively on one engine."""

    def __init__(self, engine, snapshot_mode: str = "device"):
        spec = engine.package.spec
        self.engine = engine
        self.spec = spec
        sp = spec.decoding.speculative
        if sp is None:
            check_width(spec, 1)  # the clear error
        if snapshot_mode not in SNAPSHOT_MODES:
            raise InputError("unknown snapshot mode", field="snapshot_mode", value=snapshot_mode,
                             remedy=f"use one of: {', '.join(SNAPSHOT_MODES)}")
        self.sp = sp
        self.target = DecodeSession(engine, sp.target, sp.snapshot, snapshot_mode)
        self.state = self.target.state
        self.rollback = spec.rollback_cells()
        self.proposer = (DraftModelProposer(engine, self.target, sp) if sp.kind == "draft"
                         else PromptLookupProposer(sp) if sp.kind == "prompt-lookup"
                         else CarryProposer(engine, self.target, sp))

    @property
    def ops(self):
        return self.engine.tensor_ops

    @property
    def ledger(self):
        return self.engine.ledger

    def decode(self, prompt: Sequence[int], max_new_tokens: int, width: int,
               ignore_eos: bool = False, audit: bool = False) -> SpeculativeResult:
        width = check_width(self.spec, width)
        ids = check_request(self.spec, prompt, max_new_tokens)
        tokens: list[int] = []
        try:
            return self._decode(ids, max_new_tokens, width, tokens, ignore_eos, audit)
        except Exception as exc:
            exc.decode_step = len(tokens)  # the step being decided when it failed
            raise

    def _audit(self, audited, logits, tokens: list[int], fed: Sequence[int], label: str):
        """With an audit, the rows a target forward decided tokens with (``logits``: the
        last ``len(fed) + 1`` positions), after ``tokens`` committed so far."""
        if audited is None:
            return
        m = len(fed) + 1
        rows = self.ops.slice_axis(logits, 1, int(logits.shape[1]) - m, m)
        audited.append(AuditedForward(tuple(tokens), tuple(fed),
                                      self.ops.audit_rows(rows.reshape(m, rows.shape[-1])),
                                      label))

    def _decode(self, ids: list[int], max_new_tokens: int, width: int,
                tokens: list[int], ignore_eos: bool = False,
                audit: bool = False) -> SpeculativeResult:
        eos = None if ignore_eos else self.spec.eos_id  # None: nothing stops at eos
        ledger, ops = self.ledger, self.ops
        logits_role = "logits"
        audited: list[AuditedForward] | None = [] if audit else None
        start = time.perf_counter()
        steps: list[float] = []
        out = self.target.forward(ids, "prefill")
        self._audit(audited, out[logits_role], tokens, (), "prefill")
        tokens.append(argmax_last_row(ops, out[logits_role]))
        seed_out, seed_row = out, len(ids) - 1  # target outputs holding the last committed row
        steps.append(time.perf_counter() - start)
        accepted_log: list[int] = []
        widths: list[int] = []
        drafted: list[list[int]] = []
        starts: list[int] = []
        fixed = self.proposer.fixed_width
        while len(tokens) < max_new_tokens and tokens[-1] != eos:
            t0 = time.perf_counter()
            w = min(width, max_new_tokens - len(tokens) - 1)
            pending = tokens[-1]
            base = self.target.position  # L: positions committed into the target's cells
            if fixed and w and base + width + 1 <= self.spec.max_context:
                w = width  # drafting is free: the last round is cut after verification
            drafts: list[int] = []
            if w:
                if isinstance(self.proposer, CarryProposer):
                    seed = self.proposer.seed_from(seed_out, seed_row)
                    drafts = self.proposer.propose(pending, w, seed, base)
                else:
                    drafts = self.proposer.propose(ids + tokens, w)
            if not drafts:  # one token left, or no prompt-lookup match: a plain decode step
                out = self.target.forward([pending], "decode")
                self._audit(audited, out[logits_role], tokens, (), "decode")
                tokens.append(argmax_last_row(ops, out[logits_role]))
                seed_out, seed_row = out, 0
                steps.append(time.perf_counter() - t0)
                continue
            if self.state.snapshot_cells:
                self.state.snapshot()
            verify = self.target.forward([pending] + drafts, "verify")
            logits = verify[logits_role]
            self._audit(audited, logits, tokens, drafts, f"verify r{len(widths)}")
            n, bonus = ops.accept_drafts(logits.reshape(w + 1, logits.shape[-1]), drafts,
                                         fed=self.target.tokens_fed)
            ledger.proposals += 1
            ledger.accepted += n
            ledger.rejected += w - n
            accepted_log.append(n)
            widths.append(w)
            drafted.append(list(drafts))
            starts.append(base)
            if n == w:
                ledger.full_accepts += 1
                seed_out, seed_row = verify, w
            else:
                ledger.rollbacks += 1
                if self.state.snapshot_cells:
                    self.target.rollback(base, self.rollback)
                    self.state.restore()
                    seed_out = self.target.forward([pending] + drafts[:n], "readvance")
                    seed_row = n
                else:
                    self.target.rollback(base + n + 1, self.rollback)
                    seed_out, seed_row = verify, n
            new = (drafts[:n] + [bonus])[:max_new_tokens - len(tokens)]
            if eos is not None and eos in new:
                new = new[:new.index(eos) + 1]
            tokens += new
            self.proposer.after_round(ids + tokens, start=base, accepted=n, width=w,
                                      drafts=drafts, target_out=verify,
                                      row_of_position=lambda pos: pos - base)
            steps.append(time.perf_counter() - t0)
        wall = time.perf_counter() - start
        return SpeculativeResult(self.engine.name, ids, tokens, ledger, wall, steps,
                                 kind=self.sp.kind, width=width,
                                 acceptance_per_round=accepted_log, widths_per_round=widths,
                                 drafts_per_round=drafted, start_per_round=starts,
                                 audited=audited)


def speculative_decode(engine, prompt: Sequence[int], max_new_tokens: int, width: int,
                       snapshot_mode: str = "device", *,
                       ignore_eos: bool = False, audit: bool = False) -> SpeculativeResult:
    """Fresh ledger, fresh session, speculative decode at ``width``; an engine that
    declares no speculative decoding (``Engine.speculative`` False) is refused.
    ``ignore_eos`` is for timing only (as ``greedy_decode``'s): on past eos, exactly
    ``max_new_tokens`` tokens; a parity run never sets it. ``audit`` reads back the rows of
    every target forward that decided tokens (``SpeculativeResult.audited``, purpose
    ``logits_audit``): on a device only in a labelled audit decode, never a budgeted one."""
    if not engine.speculative:
        raise InputError(f"engine {engine.name!r} declares no speculative decoding",
                         field="engine", value=engine.name,
                         remedy="run it with --mode greedy (its capabilities: lockstep engines)")
    check_width(engine.package.spec, width)
    engine.reset_ledger()
    return SpeculativeSession(engine, snapshot_mode).decode(prompt, max_new_tokens, width,
                                                            ignore_eos=ignore_eos, audit=audit)
