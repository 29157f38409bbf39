"""The decode state (``DecodeState``, the one owner of cells and position) as a stateful
property (Hypothesis ``RuleBasedStateMachine``).

Random sequences of append (a forward's new cell values), rollback, snapshot, restore and
fork run on two states at once, one per ``TensorOps``, next to a plain numpy model of what
the cells must hold. After every rule the states equal the model (valid prefix of every
kv cell, every recurrent cell, every length, and the position equal to the kv length: the
two move together), and a rule one state refuses (rollback past the length, restore without
a snapshot, roll back a recurrent cell) the other refuses with the same error class and
field, changing nothing. In CI both states run on ``HostTensorOps``; the ``gpu`` machine
pairs ``CudaTensorOps`` with ``HostTensorOps``.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from engines.cuda_support import cuda_availability
from engines.errors import InputError, LockstepError
from engines.ledger import Ledger
from engines.package.schema import StateCellSpec
from engines.tensor_ops import HostTensorOps
from engines.workflow.state import DecodeState
from harness.forensics.arbiter import to_host

MAX_CONTEXT = 12
SPECS = {
    "k": StateCellSpec(kind="kv", component="target", input="pk", output="ok", dtype="float32",
                       shape=[1, 2, 0, 3], seq_axis=2, update="append"),
    "s": StateCellSpec(kind="kv", component="target", input="ps", output="os", dtype="float16",
                       shape=[1, MAX_CONTEXT, 2], seq_axis=1, update="static"),
    "r": StateCellSpec(kind="recurrent", component="target", input="pr", output="or",
                       dtype="float32", shape=[1, 4]),
}


def outcome(fn):
    try:
        fn()
        return "ok", None
    except LockstepError as err:
        return type(err).__name__, err.field


class Model:
    """What the cells must hold, in numpy: the valid prefix of each kv cell, each value."""

    def __init__(self):
        self.kv = {"k": np.zeros((1, 2, 0, 3), np.float32), "s": np.zeros((1, 0, 2), np.float16)}
        self.r = np.zeros((1, 4), np.float32)
        self.snap = None

    def copy(self) -> Model:
        twin = Model()
        twin.kv = {k: v.copy() for k, v in self.kv.items()}
        twin.r, twin.snap = self.r.copy(), None if self.snap is None else self.snap.copy()
        return twin

    @property
    def length(self) -> int:
        return self.kv["k"].shape[2]


class DecodeStateMachine(RuleBasedStateMachine):
    """Two states (``ops_a``, ``ops_b``) and the model move together."""

    make_ops = staticmethod(lambda: (HostTensorOps(Ledger()), HostTensorOps(Ledger())))

    @initialize()
    def start(self):
        self.ops = self.make_ops()
        self.services = [DecodeState.fresh(ops, SPECS, snapshot_cells=["r"]) for ops in self.ops]
        self.model = Model()

    def _both(self, fn):
        results = [outcome(lambda s=s: fn(s)) for s in self.services]
        assert results[0] == results[1], f"the services disagree: {results}"
        return results[0]

    @rule(m=st.integers(1, 3), seed=st.integers(0, 2**16))
    def append(self, m, seed):
        """A forward over m positions: kv cells grow (or are written), r is overwritten."""
        if self.model.length + m > MAX_CONTEXT:
            return
        rng = np.random.default_rng(seed)
        length = self.model.length
        new_k = np.concatenate([self.model.kv["k"], rng.standard_normal((1, 2, m, 3))
                                .astype(np.float32)], axis=2)
        rows = rng.standard_normal((1, m, 2)).astype(np.float16)
        new_r = rng.standard_normal((1, 4)).astype(np.float32)
        for service, ops in zip(self.services, self.ops):
            static = to_host(service.value("s")).copy()  # a static buffer is written in place
            static[:, length:length + m] = rows
            service.absorb({"ok": ops.adopt(new_k.copy()), "os": ops.adopt(static),
                            "or": ops.adopt(new_r.copy())}, m)
        self.model.kv = {"k": new_k, "s": np.concatenate([self.model.kv["s"], rows], axis=1)}
        self.model.r = new_r

    @rule(length=st.integers(-1, MAX_CONTEXT + 1))
    def rollback(self, length):
        status, field = self._both(lambda s: s.rollback(length, ["k", "s"]))
        if 0 <= length <= self.model.length:
            assert status == "ok"
            self.model.kv = {"k": self.model.kv["k"][:, :, :length],
                             "s": self.model.kv["s"][:, :length]}
        else:
            assert (status, field) == ("InputError", "state.k")

    @rule()
    def rollback_recurrent(self):
        assert self._both(lambda s: s.rollback(0, ["r"])) == ("InputError", "state.r")

    @rule()
    def snapshot(self):
        assert self._both(lambda s: s.snapshot()) == ("ok", None)
        self.model.snap = self.model.r.copy()

    @rule()
    def restore(self):
        status, field = self._both(lambda s: s.restore())
        if self.model.snap is None:
            assert (status, field) == ("InputError", "snapshot")
        else:
            assert status == "ok"
            self.model.r = self.model.snap.copy()

    @rule(seed=st.integers(0, 2**16))
    def fork(self, seed):
        """A fork is independent: changing the original leaves the fork as it was."""
        forks = [s.fork() for s in self.services]
        kept = self.model.copy()
        self.append(1, seed)
        self.rollback(max(self.model.length - 2, 0))
        for fork in forks:
            self._equal(fork, kept)
        self.services, self.model = forks, kept

    def _equal(self, service, model):
        assert service.length("k") == service.length("s") == service.position == model.length
        k = to_host(service.value("k"))
        assert k.shape == model.kv["k"].shape and k.tobytes() == model.kv["k"].tobytes()
        s = to_host(service.value("s"))[:, :model.length]
        assert s.tobytes() == model.kv["s"].tobytes()
        assert to_host(service.value("r")).tobytes() == model.r.tobytes()
        assert service.has_snapshot == (model.snap is not None)

    @invariant()
    def services_equal_the_model(self):
        if not hasattr(self, "services"):
            return
        for service in self.services:
            self._equal(service, self.model)


TestDecodeStateOnHost = pytest.mark.claim("snapshot_budget")(DecodeStateMachine.TestCase)


class CudaDecodeStateMachine(DecodeStateMachine):
    """The device half: CudaTensorOps against HostTensorOps."""

    @staticmethod
    def make_ops():
        import cupy

        from engines.tensor_ops import CudaTensorOps

        return (CudaTensorOps(Ledger(), cupy.cuda.Stream(non_blocking=True)),
                HostTensorOps(Ledger()))


@pytest.mark.claim("snapshot_budget", "tensor_ops")
@pytest.mark.gpu
def test_gpu_decode_state_agrees_with_host():
    ok, reason = cuda_availability()
    if not ok:
        pytest.skip(f"CUDA unavailable: {reason}")
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(CudaDecodeStateMachine)


# -- plain facts -------------------------------------------------------------------------------
def _outputs(ops, k_length=0, r=None):
    """A forward's outputs for the k and r cells of SPECS, by graph output name."""
    return {"ok": ops.adopt(np.ones((1, 2, k_length, 3), np.float32)),
            "or": ops.adopt(np.zeros((1, 4), np.float32) if r is None else r.copy())}


K_AND_R = {"k": SPECS["k"], "r": SPECS["r"]}


@pytest.mark.claim("snapshot_budget")
def test_restore_is_byte_identical_and_counted():
    ops = HostTensorOps(Ledger())
    state = DecodeState.fresh(ops, K_AND_R, snapshot_cells=["r"])
    before = np.arange(4, dtype=np.float32).reshape(1, 4) - 1.5
    state.absorb(_outputs(ops, 1, before), 1)
    state.snapshot()
    state.absorb(_outputs(ops, 3, np.full((1, 4), 9, np.float32)), 2)
    state.rollback(1)
    state.restore()
    assert state.value("r").tobytes() == before.tobytes()
    assert state.length("r") == state.length("k") == state.position == 1
    assert ops.ledger.snapshots == 1 and ops.ledger.restores == 1


def test_snapshot_cells_must_be_recurrent():
    with pytest.raises(InputError) as info:
        DecodeState.fresh(HostTensorOps(Ledger()), SPECS, snapshot_cells=["k"])
    assert info.value.field == "snapshot" and info.value.value == "k"
    assert "truncate" in info.value.remedy


def test_rollback_is_all_or_nothing():
    """A refused rollback leaves every cell and the position as they were."""
    ops = HostTensorOps(Ledger())
    state = DecodeState.fresh(ops, K_AND_R, snapshot_cells=["r"])
    state.absorb(_outputs(ops, 3), 3)
    with pytest.raises(InputError):
        state.rollback(2, ["k", "r"])
    assert state.length("k") == 3 and state.value("k").shape[2] == 3 and state.position == 3


def test_absorb_of_a_misshapen_output_changes_nothing():
    from engines.errors import ExecutionError

    ops = HostTensorOps(Ledger())
    state = DecodeState.fresh(ops, K_AND_R)
    state.absorb(_outputs(ops, 2), 2)
    with pytest.raises(ExecutionError) as info:
        state.absorb(_outputs(ops, 5), 1)  # the graph grew k by 3, not 1
    assert info.value.field == "state.k"
    assert state.length("k") == state.length("r") == state.position == 2


def test_a_session_rolls_cells_and_position_back_together(packages, engine_cache):
    from engines.workflow import DecodeSession

    package = packages["tiny_llama"]
    session = DecodeSession(engine_cache("native-host", package))
    prompt = list(package.spec.prompts[0])
    session.forward(prompt, "prefill")
    session.forward([3], "decode")
    session.rollback(2)
    cells = session.state.cells.values()
    assert session.position == 2 and all(c.length == 2 for c in cells)
    assert all(c.value.shape[c.spec.seq_axis] == 2 for c in cells)
