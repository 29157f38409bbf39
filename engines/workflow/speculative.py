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

**Shifted rounds** (the default where a prompt-lookup decode runs on tensor ops with a device
feed whose ids come back asynchronously, as on a GPU; ``pipelined=False`` keeps the loop above,
as host engines do: on the host nothing runs while an id is read, so they would only add
forwards). Plain steps are pipelined as greedy's are: the decode forward over the id being
read is queued before the host waits for it. When the proposer then drafts, that queued
forward has already fed t and its logits row decides d1: the target runs [d1..dW+1] at
L+1..L+W+1 and ``accept_drafts(..., head=row)`` judges W + 1 drafts with W + 2 rows, still 8
bytes; the verification keeps the classic W + 1 positions, so one VERIFY shape serves both
kinds of round. A round after a round is classic (its bonus is not fed yet). Such a decode
reads 4 bytes per decode forward less those whose row went into a round
(``Ledger.shifted_verifications``) or that were queued past eos and undone
(``Ledger.discarded_forwards``).

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
from engines.package.schema import MODEL_FREE_KINDS
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
    # whether each round was shifted (``SpeculativeSession._round``): its pending token fed
    # by the decode forward before it, whose row decided its first draft
    shifted_per_round: list[bool] = field(default_factory=list)
    # with an audit: the rows of every target forward that decided tokens (the prefill, each
    # verification's W+1 rows, plain decode steps, a shifted round's head row as a decode
    # step's), read back under ``logits_audit``
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
        self.seed = None  # (target outputs, row) holding the last committed position
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
               ignore_eos: bool = False, audit: bool = False,
               pipelined: bool = True) -> SpeculativeResult:
        width = check_width(self.spec, width)
        ids = check_request(self.spec, prompt, max_new_tokens)
        tokens: list[int] = []
        try:
            return self._decode(ids, max_new_tokens, width, tokens, ignore_eos, audit,
                                pipelined)
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
                tokens: list[int], ignore_eos: bool = False, audit: bool = False,
                pipelined: bool = False) -> SpeculativeResult:
        eos = None if ignore_eos else self.spec.eos_id  # None: nothing stops at eos
        ops = self.ops
        logits_role = "logits"
        audited: list[AuditedForward] | None = [] if audit else None
        rounds = _Rounds()
        start = time.perf_counter()
        steps: list[float] = []
        out = self.target.forward(ids, "prefill")
        self._audit(audited, out[logits_role], tokens, (), "prefill")
        if pipelined and self.shifts():
            return self._decode_shifted(ids, max_new_tokens, width, tokens, eos, out, rounds,
                                        start, audited)
        tokens.append(argmax_last_row(ops, out[logits_role]))
        self.seed = (out, len(ids) - 1)  # target outputs holding the last committed row
        steps.append(time.perf_counter() - start)
        while len(tokens) < max_new_tokens and tokens[-1] != eos:
            t0 = time.perf_counter()
            w = self._classic_width(width, max_new_tokens - len(tokens))
            pending = tokens[-1]
            base = self.target.position  # L: positions committed into the target's cells
            drafts: list[int] = []
            if w:
                if isinstance(self.proposer, CarryProposer):
                    seed = self.proposer.seed_from(*self.seed)
                    drafts = self.proposer.propose(pending, w, seed, base)
                else:
                    drafts = self.proposer.propose(ids + tokens, w)
            if not drafts:  # one token left, or no prompt-lookup match: a plain decode step
                out = self.target.forward([pending], "decode")
                self._audit(audited, out[logits_role], tokens, (), "decode")
                tokens.append(argmax_last_row(ops, out[logits_role]))
                self.seed = (out, 0)
                steps.append(time.perf_counter() - t0)
                continue
            self._round(ids, tokens, max_new_tokens, eos, drafts, rounds, audited)
            steps.append(time.perf_counter() - t0)
        return self._result(ids, tokens, width, rounds, start, steps, audited)

    def _classic_width(self, width: int, left: int) -> int:
        """The drafts a classic round asks for with ``left`` tokens to go: as many as leave
        its bonus room; a proposer that drafts for free keeps ``width`` where the context has
        room (the last round is cut after verification: one VERIFY shape)."""
        w = min(width, left - 1)
        if (self.proposer.fixed_width and w
                and self.target.position + width + 1 <= self.spec.max_context):
            return width
        return w

    def shifts(self) -> bool:
        """Whether ``pipelined`` decodes shift their verifications (``_decode_shifted``): a
        proposer that drafts for free from the host's tokens (prompt-lookup), and tensor ops
        with a device feed whose ids come back asynchronously (``asynchronous_ids``: on the
        host nothing runs while an id is read, so the head forwards would only cost)."""
        return bool(self.proposer.fixed_width and self.sp.kind in MODEL_FREE_KINDS
                    and self.ops.supports_device_feed and self.ops.asynchronous_ids)

    def _round(self, ids: list[int], tokens: list[int], max_new_tokens: int, eos,
               drafts: list[int], rounds: "_Rounds", audited=None, queued=None) -> None:
        """One verification, its accept and its rollback; the committed tokens join
        ``tokens``. Classic (``queued`` None): the target runs [pending, d1..dW] and its W + 1
        rows decide. Shifted: the pending token was fed by the decode forward ``queued``
        (outputs by role, its logits unread), the target runs [d1..dk] and ``queued``'s row
        goes first, so k drafts are decided by the same k + 1 rows."""
        ledger, ops, logits_role = self.ledger, self.ops, "logits"
        pending, k = tokens[-1], len(drafts)
        base = self.target.position  # where the verified positions start
        if self.state.snapshot_cells:
            self.state.snapshot()
        fed = drafts if queued is not None else [pending] + drafts
        verify = self.target.forward(fed, "verify")
        logits = verify[logits_role]
        label = f"verify r{len(rounds.widths)}"
        if queued is None:
            self._audit(audited, logits, tokens, drafts, label)
            n, bonus = ops.accept_drafts(logits.reshape(k + 1, logits.shape[-1]), drafts,
                                         fed=self.target.tokens_fed)
        else:  # the head row follows the tokens; verification row j follows d1..d(j+1)
            self._audit(audited, queued[logits_role], tokens, (), "decode")
            self._audit(audited, logits, tokens + drafts[:1], drafts[1:], label)
            head = ops.last_along_axis(queued[logits_role], 1)
            n, bonus = ops.accept_drafts(logits.reshape(k, logits.shape[-1]), drafts,
                                         fed=self.target.tokens_fed,
                                         head=head.reshape(1, head.shape[-1]))
            ledger.shifted_verifications += 1
        ledger.proposals += 1
        ledger.accepted += n
        ledger.rejected += k - n
        # L, the pending token's position: the classic round feeds it, a shifted one did
        rounds.add(n, drafts, base - 1 if queued is not None else base, queued is not None)
        if n == k:
            ledger.full_accepts += 1
            self.seed = (verify, len(fed) - 1)
        else:
            ledger.rollbacks += 1
            kept = fed[:len(fed) - k + n]  # the verified positions still committed
            if self.state.snapshot_cells:
                self.target.rollback(base, self.rollback)
                self.state.restore()
                if kept:
                    self.seed = (self.target.forward(kept, "readvance"), len(kept) - 1)
            else:
                self.target.rollback(base + len(kept), self.rollback)
                self.seed = (verify, len(kept) - 1)
        new = (drafts[:n] + [bonus])[:max_new_tokens - len(tokens)]
        if eos is not None and eos in new:
            new = new[:new.index(eos) + 1]
        tokens += new
        self.proposer.after_round(ids + tokens, start=base, accepted=n, width=k,
                                  drafts=drafts, target_out=verify,
                                  row_of_position=lambda pos: pos - base)

    def _decode_shifted(self, ids: list[int], max_new_tokens: int, width: int,
                        tokens: list[int], eos, out, rounds: "_Rounds",
                        start: float, audited=None) -> SpeculativeResult:
        """The pipelined loop: plain steps run as greedy's pipelined loop does (each next
        decode forward queued on the device feed before the last id is waited for), and a
        round that follows one is shifted (``_round`` with ``queued``): the queued forward's
        row decides the first of W + 1 drafts, so it is never wasted and the verification
        keeps the classic round's W + 1 positions (one VERIFY shape). A round that follows a
        round is classic. The tokens are the classic loop's; a shifted round's pending id
        is read once (as the step before's token), its own row only inside the 8-byte
        accept; a forward queued past eos is undone, never read (``discarded_forwards``)."""
        target, ctx = self.target, self.spec.max_context
        steps: list[float] = []
        last = start  # the first step holds the prefill, as the classic loop's does
        # ``queued``: the outputs of the forward that fed tokens[-1] (its logits unread), or
        # None where tokens[-1] is not fed yet (after a round); ``logits``: what decides the
        # next plain step's id
        logits = out["logits"]
        while True:
            # the plain step: read the id ``logits`` decide, with the next forward queued first
            queued = target.step_ahead(logits, tokens, max_new_tokens, eos)
            now = time.perf_counter()
            steps.append(now - last)
            last = now
            if queued is None:
                break
            while True:  # rounds, while the proposer drafts
                left = max_new_tokens - len(tokens)
                if queued is not None:  # tokens[-1] fed: W + 1 drafts, its row first
                    k = min(width + 1, ctx - target.position)
                    drafts = self.proposer.propose(ids + tokens, k) if left > 1 and k else []
                    if not drafts:
                        logits = queued["logits"]
                        self._audit(audited, logits, tokens, (), "decode")
                        break
                else:  # after a round: [pending] + W drafts, or a plain forward over it
                    w = self._classic_width(width, left)
                    drafts = self.proposer.propose(ids + tokens, w) if w else []
                    if not drafts:
                        logits = target.forward(tokens[-1:], "decode")["logits"]
                        self._audit(audited, logits, tokens, (), "decode")
                        break
                self._round(ids, tokens, max_new_tokens, eos, drafts, rounds, audited, queued)
                queued = None
                now = time.perf_counter()
                steps.append(now - last)
                last = now
                if len(tokens) >= max_new_tokens or tokens[-1] == eos:
                    return self._result(ids, tokens, width, rounds, start, steps, audited)
        return self._result(ids, tokens, width, rounds, start, steps, audited)

    def _result(self, ids, tokens, width, rounds: "_Rounds", start: float, steps, audited):
        wall = time.perf_counter() - start
        return SpeculativeResult(self.engine.name, ids, tokens, self.ledger, wall, steps,
                                 kind=self.sp.kind, width=width,
                                 acceptance_per_round=rounds.accepted,
                                 widths_per_round=rounds.widths,
                                 drafts_per_round=rounds.drafts, start_per_round=rounds.starts,
                                 shifted_per_round=rounds.shifted, audited=audited)


@dataclass
class _Rounds:
    """What each verification of one decode did, in order."""
    accepted: list[int] = field(default_factory=list)
    widths: list[int] = field(default_factory=list)
    drafts: list[list[int]] = field(default_factory=list)
    starts: list[int] = field(default_factory=list)
    shifted: list[bool] = field(default_factory=list)

    def add(self, n: int, drafts: list[int], start: int, shifted: bool) -> None:
        self.accepted.append(n)
        self.widths.append(len(drafts))
        self.drafts.append(list(drafts))
        self.starts.append(start)
        self.shifted.append(shifted)


def speculative_decode(engine, prompt: Sequence[int], max_new_tokens: int, width: int,
                       snapshot_mode: str = "device", *,
                       ignore_eos: bool = False, audit: bool = False,
                       pipelined: bool = True) -> SpeculativeResult:
    """Fresh ledger, fresh session, speculative decode at ``width``; an engine that
    declares no speculative decoding (``Engine.speculative`` False) is refused.
    ``ignore_eos`` is for timing only (as ``greedy_decode``'s): on past eos, exactly
    ``max_new_tokens`` tokens; a parity run never sets it. ``audit`` reads back the rows of
    every target forward that decided tokens (``SpeculativeResult.audited``, purpose
    ``logits_audit``): on a device only in a labelled audit decode, never a budgeted one.
    ``pipelined`` (the default) shifts a prompt-lookup decode's rounds where the engine's
    tensor ops keep a device feed and read ids asynchronously (``SpeculativeSession.shifts``);
    False keeps the classic loop (``lockstep bench`` without ``--pipelined``, as its greedy
    rows)."""
    if not engine.speculative:
        raise InputError(f"engine {engine.name!r} declares no speculative decoding",
                         field="engine", value=engine.name,
                         remedy="run it with --mode greedy (its capabilities: lockstep engines)")
    check_width(engine.package.spec, width)
    engine.reset_ledger()
    return SpeculativeSession(engine, snapshot_mode).decode(prompt, max_new_tokens, width,
                                                            ignore_eos=ignore_eos, audit=audit,
                                                            pipelined=pipelined)
