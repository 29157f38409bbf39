"""Planted-bug engines: each a thin wrapper over ``native-host`` that breaks exactly one
thing, the way real engines break. On a real checkpoint the same hooks wrap ``ort-cpu``
instead (``on_ort``): native-host's fixed-order numpy kernels take about a second a SmolLM2
step, and what the verdict must catch is the planted bug, not the engine under it. A verdict is only as good as the bugs it catches; the
suite asserts each of these is caught with its verdict and step, and the control is not.

``step`` below is the index of the emitted token a forward decides: the prefill is step 0,
the k-th decode forward is step k. Inside ``run_component`` the current step is the number
of forwards the (fresh, per decode) ledger has completed.
"""
from __future__ import annotations

import functools
from typing import Any

import numpy as np

from engines.backends.native_host import NativeHostEngine
from engines.backends.ort_cpu import OrtCpuEngine
from engines.engine import Engine
from engines.tensor_ops.host import HostTensorOps

K = 3  # the step at which step-triggered bugs strike


class Planted(NativeHostEngine):
    """Base: native-host with hooks; subclasses override ``corrupt`` or the tensor ops."""

    name = "planted-base"
    description = "native-host with one planted bug"
    on_ort = False  # the forward is ort-cpu's (``on_ort``)

    def __init__(self, package):
        if not self.on_ort:
            super().__init__(package)
            return
        Engine.__init__(self, package)
        self.ort = OrtCpuEngine(package)

    @property
    def step(self) -> int:
        return sum(self.ledger.forwards.values())

    def run_component(self, component: str, feeds: dict[str, Any], phase: str | None = None):
        feeds = self.corrupt_feeds(component, dict(feeds), phase)
        if self.on_ort:
            out = dict(self.ort.run_component(component, feeds, phase=phase))
        else:
            out = dict(super().run_component(component, feeds, phase=phase))
        return self.corrupt(component, feeds, out, phase)

    def corrupt_feeds(self, component, feeds, phase):
        return feeds

    def corrupt(self, component, feeds, out, phase):
        return out

    def state_cells(self, component: str):
        return [c for c in self.package.spec.state.values() if c.component == component]

    def logits_name(self, component: str) -> str:
        return self.package.spec.components[component].outputs["logits"]


class Control(Planted):
    """Harmless: every logit times (1 + 1e-7). Must stay ``identical`` everywhere."""
    name = "planted-control"

    def corrupt(self, component, feeds, out, phase):
        name = self.logits_name(component)
        out[name] = (out[name] * np.float32(1 + 1e-7)).astype(out[name].dtype)
        return out


class KvDropAppend(Planted):
    """At step K the new position's KV is never written (zeros in an append cache)."""
    name = "planted-kv-drop-append"

    def corrupt(self, component, feeds, out, phase):
        if self.step == K:
            for cell in self.state_cells(component):
                if cell.kind == "kv":
                    value = out[cell.output].copy()
                    index = [slice(None)] * value.ndim
                    index[cell.seq_axis] = slice(value.shape[cell.seq_axis] - 1, None)
                    value[tuple(index)] = 0
                    out[cell.output] = value
        return out


class PositionOffByOne(Planted):
    """From step K on, the position ids fed are one too high."""
    name = "planted-position-off-by-one"

    def corrupt_feeds(self, component, feeds, phase):
        positions = self.package.spec.components[component].inputs.get("positions")
        if positions and self.step >= K:
            feeds[positions] = np.asarray(feeds[positions]) + 1
        return feeds


class RecurrentStateLost(Planted):
    """At step K the recurrent state cells are fed as zeros (the state was dropped)."""
    name = "planted-recurrent-state-lost"

    def corrupt_feeds(self, component, feeds, phase):
        if self.step == K:
            for cell in self.state_cells(component):
                if cell.kind == "recurrent":
                    feeds[cell.input] = np.zeros_like(feeds[cell.input])
        return feeds


class _NoTruncate(HostTensorOps):
    def truncate_axis(self, v, axis, length):
        return v  # the rollback forgets to cut the rejected drafts off the cache


class RollbackNoTruncate(Planted):
    """Speculative rollback that does not truncate the KV cache: rejected drafts stay."""
    name = "planted-rollback-no-truncate"

    def make_tensor_ops(self):
        return _NoTruncate(self.ledger)


class VerifyRowShift(Planted):
    """In a verification forward (M = W+1 rows) every logits row is the one before it."""
    name = "planted-verify-row-shift"

    def corrupt(self, component, feeds, out, phase):
        if phase == "verify":
            name = self.logits_name(component)
            out[name] = np.roll(out[name], 1, axis=1)
        return out


class VerifyLogitsFloat16(Planted):
    """A verification forward's logits rounded through float16 on a float32 package: every
    token survives (greedy, prefill and drafts are exact), only the audit of the verification
    rows can see it."""
    name = "planted-verify-logits-float16"

    def corrupt(self, component, feeds, out, phase):
        if phase == "verify":
            name = self.logits_name(component)
            out[name] = out[name].astype(np.float16).astype(out[name].dtype)
        return out


class VerifyNanPartialRow(Planted):
    """NaN in every odd vocabulary entry of a verification forward's rows (argmax ignores
    NaN, so the accepted drafts and the bonus token are still right)."""
    name = "planted-verify-nan-partial-row"

    def corrupt(self, component, feeds, out, phase):
        if phase == "verify":
            name = self.logits_name(component)
            value = out[name].copy()
            value[..., 1::2] = np.nan
            out[name] = value
        return out


class PrefillWrongRow(Planted):
    """A multi-position forward returns its rows shifted by one: the prefill's last row is
    the second-to-last position's (step 0 is decided on the wrong row)."""
    name = "planted-prefill-wrong-row"

    def corrupt(self, component, feeds, out, phase):
        name = self.logits_name(component)
        if out[name].shape[1] > 1:
            out[name] = np.roll(out[name], 1, axis=1)
        return out


class LogitsFloat16(Planted):
    """Logits rounded through float16 on a float32 package: tokens survive, logits do not."""
    name = "planted-logits-float16"

    def corrupt(self, component, feeds, out, phase):
        name = self.logits_name(component)
        out[name] = out[name].astype(np.float16).astype(out[name].dtype)
        return out


class NanPartialRow(Planted):
    """Every odd vocabulary entry of every logits row is NaN (argmax ignores NaN)."""
    name = "planted-nan-partial-row"

    def corrupt(self, component, feeds, out, phase):
        name = self.logits_name(component)
        value = out[name].copy()
        value[..., 1::2] = np.nan
        out[name] = value
        return out


class NanRow(Planted):
    """At step K the whole logits row is NaN."""
    name = "planted-nan-row"

    def corrupt(self, component, feeds, out, phase):
        if self.step == K:
            name = self.logits_name(component)
            out[name] = np.full_like(out[name], np.nan)
        return out


class _LastIndexTies(HostTensorOps):
    def _argmax(self, logits2d, rows):
        keys = np.where(np.isnan(logits2d[:rows]), -np.inf, logits2d[:rows].astype(np.float64))
        flipped = keys[:, ::-1]
        return [int(keys.shape[1] - 1 - i) for i in flipped.argmax(axis=1)]

    def _argmax_feed(self, logits2d):
        token = self._argmax(logits2d, 1)[0]
        return token, np.full((1, 1), token, dtype=np.int64)


class LastIndexTies(Planted):
    """argmax breaks exact ties towards the highest index."""
    name = "planted-last-index-ties"

    def make_tensor_ops(self):
        return _LastIndexTies(self.ledger)


class _SwapAt(HostTensorOps):
    engine: "TokenSwap"

    def _argmax_feed(self, logits2d):
        token, feed = super()._argmax_feed(logits2d)
        if self.engine.step == K + 1:  # the forward for step K has completed by now
            token = (token + 1) % logits2d.shape[1]
            feed = np.full((1, 1), token, dtype=np.int64)
        return token, feed


class TokenSwap(Planted):
    """At step K the emitted token is its neighbour id (a rare wrong pick)."""
    name = "planted-token-swap"

    def make_tensor_ops(self):
        ops = _SwapAt(self.ledger)
        ops.engine = self
        return ops


class StaleStaticSlot(Planted):
    """Static cache: at step K the new position's KV lands in the previous slot and its own
    slot keeps stale (old) contents."""
    name = "planted-stale-static-slot"

    def corrupt(self, component, feeds, out, phase):
        if self.step == K:
            positions = self.package.spec.components[component].inputs["positions"]
            p = int(np.asarray(feeds[positions])[0, -1])
            for cell in self.state_cells(component):
                if cell.kind == "kv" and cell.update == "static":
                    new = out[cell.output].copy()
                    old = np.asarray(feeds[cell.input])
                    index = [slice(None)] * new.ndim
                    index[cell.seq_axis] = p
                    prev = list(index)
                    prev[cell.seq_axis] = p - 1
                    new[tuple(prev)] = out[cell.output][tuple(index)]
                    new[tuple(index)] = old[tuple(index)]
                    out[cell.output] = new
        return out


class FusedAttentionExtraSlot(Planted):
    """The fused attention kernel reads one key slot too many: the query at position p also
    sees slot p + 1 (a static cache's next, not yet written slot; in a prefill, the next
    token's key). Planted in every fused attention: a standalone Attention node, and the
    attention inside a RotaryKVAttention (a static cache's layers)."""
    name = "planted-fused-attention-extra-slot"

    def __init__(self, package):
        super().__init__(package)
        from engines.native.fusion import FUSED_DOMAIN
        from engines.native.ops.fused import Attention

        class OneSlotTooMany(Attention):
            def __call__(self, be, q, k_all, v_all, positions):
                return super().__call__(be, q, k_all, v_all, positions + 1)

        for plan in self._plans.values():
            for step in plan.steps:
                if step.node.domain != FUSED_DOMAIN:
                    continue
                if step.node.op_type == "Attention":
                    step.kernel = OneSlotTooMany(step.node, plan.opset)
                elif step.node.op_type == "RotaryKVAttention":
                    inner = step.kernel.attention
                    step.kernel.attention = OneSlotTooMany(inner.node, plan.opset)


class RaiseMidDecode(Planted):
    """A runtime failure inside the engine at step K."""
    name = "planted-raise-mid-decode"

    def corrupt(self, component, feeds, out, phase):
        if self.step == K:
            raise RuntimeError("CUDA error: an illegal memory access was encountered (planted)")
        return out


class ConstructorFails(Planted):
    """The engine cannot load the package (an OS error while opening its files)."""
    name = "planted-constructor-fails"

    def __init__(self, package):
        raise OSError(28, "No space left on device (planted)", str(package.root))


class WrongStateShape(Planted):
    """At step K a KV output comes back one position short."""
    name = "planted-wrong-state-shape"

    def corrupt(self, component, feeds, out, phase):
        if self.step == K:
            for cell in self.state_cells(component):
                if cell.kind == "kv":
                    value = out[cell.output]
                    index = [slice(None)] * value.ndim
                    index[cell.seq_axis] = slice(0, value.shape[cell.seq_axis] - 1)
                    out[cell.output] = value[tuple(index)]
                    break
        return out


class EarlyStop(Planted):
    """An eos check off by one: the stream stops after K tokens though no eos came."""
    name = "planted-early-stop"
    decodes_itself = True  # its own (broken) loop: the interpreter calls generate

    def generate(self, prompt, max_new_tokens: int, audit: bool = False):
        from engines.workflow import DecodeSession

        self.reset_ledger()
        result = DecodeSession(self).greedy(prompt, max_new_tokens, audit=audit)
        result.tokens = result.tokens[:K]
        if result.logits is not None:
            result.logits = result.logits[:K]
        return result


class GreedyOnlyPosition(Planted):
    """Positions one too high in plain decode forwards from the K-th on: the greedy path is
    wrong, the speculative path (prefill, propose, verify) is right."""
    name = "planted-greedy-only-position"

    def corrupt_feeds(self, component, feeds, phase):
        positions = self.package.spec.components[component].inputs.get("positions")
        if positions and phase == "decode" and self.ledger.forwards["decode"] >= K:
            feeds[positions] = np.asarray(feeds[positions]) + 1
        return feeds


class _SimulatedDeviceOps(HostTensorOps):
    """Host ops that account token ids the way a device does: 4 bytes read back each; and
    run the loops a device runs (``asynchronous_ids``: prompt lookup shifts its rounds)."""

    asynchronous_ids = True

    _verifying = False  # inside _accept: its argmax rows stay on the "device"

    def _argmax(self, logits2d, rows):
        ids = super()._argmax(logits2d, rows)
        if not self._verifying:
            self.ledger.record_readback("token_id", 4 * rows)
        return ids

    def _argmax_feed(self, logits2d):
        token = super()._argmax(logits2d, 1)[0]
        self.ledger.record_readback("token_id", 4)
        return token, np.full((1, 1), token, dtype=np.int64)

    def _accept(self, logits2d, drafts, fed=None, head=None):
        # a device verification reads back the accept count and the bonus id only (8
        # bytes), not the W+1 argmax rows it compares on the device
        self._verifying = True
        try:
            accepted, bonus = super()._accept(logits2d, drafts, head=head)
        finally:
            self._verifying = False
        self.ledger.record_readback("accept_count", 4)
        self.ledger.record_readback("token_id", 4)
        return accepted, bonus

    def _audit_rows(self, logits2d):
        self.ledger.record_readback("logits_audit", logits2d.nbytes)
        return super()._audit_rows(logits2d)


class SimulatedDevice(Planted):
    """Control for the budget claims on a CPU: declares a device residency and accounts
    its crossings like one (4 bytes a token id), with no bug. Budgets must pass."""
    name = "planted-simulated-device"
    residency = "sim:0"

    def make_tensor_ops(self):
        return _SimulatedDeviceOps(self.ledger)


class SimulatedDeviceStaging(SimulatedDevice):
    """A device engine that stages each step's logits to the host (a ``.get()`` left in a
    hot path): claim 3 must fail although every token is right."""
    name = "planted-simulated-device-staging"

    def corrupt(self, component, feeds, out, phase):
        logits = out[self.logits_name(component)]
        self.ledger.record_staging(logits.nbytes, "planted: logits staged to host")
        return out


class SimulatedExtraReadback(SimulatedDevice):
    """A device engine that reads back 4 extra bytes per step: claim 4 must fail."""
    name = "planted-simulated-extra-readback"

    def corrupt(self, component, feeds, out, phase):
        self.ledger.record_readback("token_id", 4)
        return out


@functools.cache
def on_ort(bug: type) -> type:
    """``bug`` with its forward computed by ort-cpu (the same name, hooks and description):
    for the catch matrix's rows on a real checkpoint."""
    return type(bug.__name__, (bug,), {"name": bug.name, "on_ort": True, "batch_invariant": False,
                                       "__doc__": bug.__doc__, "__module__": bug.__module__})
