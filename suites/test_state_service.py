"""The state service as a stateful property (Hypothesis ``RuleBasedStateMachine``).

Random sequences of append (a forward's new cell values), truncate, snapshot, restore and
fork run on two services at once, one per ``TensorOps``, next to a plain numpy model of what
the cells must hold. After every rule the services equal the model (valid prefix of every
kv cell, every recurrent cell, every length), and a rule one service refuses (truncate past
the length, restore without a snapshot, truncate a recurrent cell) the other refuses with
the same error class and field. In CI both services run on ``HostTensorOps``; the ``gpu``
machine pairs ``CudaTensorOps`` with ``HostTensorOps``.
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
from engines.workflow.state_service import StateService

MAX_CONTEXT = 12
SPECS = {
    "k": StateCellSpec(kind="kv", component="target", input="pk", output="ok", dtype="float32",
                       shape=[1, 2, 0, 3], seq_axis=2, update="append"),
    "s": StateCellSpec(kind="kv", component="target", input="ps", output="os", dtype="float16",
                       shape=[1, MAX_CONTEXT, 2], seq_axis=1, update="static"),
    "r": StateCellSpec(kind="recurrent", component="target", input="pr", output="or",
                       dtype="float32", shape=[1, 4]),
}


def to_host(value) -> np.ndarray:
    return value.get() if hasattr(value, "get") and not isinstance(value, np.ndarray) else value


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


class StateServiceMachine(RuleBasedStateMachine):
    """Two services (``ops_a``, ``ops_b``) and the model move together."""

    make_ops = staticmethod(lambda: (HostTensorOps(Ledger()), HostTensorOps(Ledger())))

    @initialize()
    def start(self):
        self.ops = self.make_ops()
        self.services = [StateService.fresh(ops, SPECS, snapshot_cells=["r"]) for ops in self.ops]
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
            service.absorb({"k": ops.adopt(new_k.copy()), "s": ops.adopt(static),
                            "r": ops.adopt(new_r.copy())}, m)
        self.model.kv = {"k": new_k, "s": np.concatenate([self.model.kv["s"], rows], axis=1)}
        self.model.r = new_r

    @rule(length=st.integers(-1, MAX_CONTEXT + 1))
    def truncate(self, length):
        status, field = self._both(lambda s: s.truncate(length, ["k", "s"]))
        if 0 <= length <= self.model.length:
            assert status == "ok"
            self.model.kv = {"k": self.model.kv["k"][:, :, :length],
                             "s": self.model.kv["s"][:, :length]}
        else:
            assert (status, field) == ("InputError", "state.k")

    @rule()
    def truncate_recurrent(self):
        assert self._both(lambda s: s.truncate(0, ["r"])) == ("InputError", "state.r")

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
        self.truncate(max(self.model.length - 2, 0))
        for fork in forks:
            self._equal(fork, kept)
        self.services, self.model = forks, kept

    def _equal(self, service, model):
        assert service.length("k") == service.length("s") == model.length
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


TestStateServiceOnHost = pytest.mark.claim("snapshot_budget")(StateServiceMachine.TestCase)


class CudaStateServiceMachine(StateServiceMachine):
    """The device half: CudaTensorOps against HostTensorOps."""

    @staticmethod
    def make_ops():
        import cupy

        from engines.tensor_ops import CudaTensorOps

        return (CudaTensorOps(Ledger(), cupy.cuda.Stream(non_blocking=True)),
                HostTensorOps(Ledger()))


@pytest.mark.claim("snapshot_budget", "tensor_ops")
@pytest.mark.gpu
def test_gpu_state_service_agrees_with_host():
    ok, reason = cuda_availability()
    if not ok:
        pytest.skip(f"CUDA unavailable: {reason}")
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(CudaStateServiceMachine)


# -- plain facts -------------------------------------------------------------------------------
@pytest.mark.claim("snapshot_budget")
def test_restore_is_byte_identical_and_counted():
    ops = HostTensorOps(Ledger())
    service = StateService.fresh(ops, SPECS, snapshot_cells=["r"])
    before = np.arange(4, dtype=np.float32).reshape(1, 4) - 1.5
    service.absorb({"r": ops.adopt(before.copy())}, 1)
    service.snapshot()
    service.absorb({"r": ops.adopt(np.full((1, 4), 9, np.float32))}, 2)
    service.restore()
    assert service.value("r").tobytes() == before.tobytes()
    assert service.length("r") == 1
    assert ops.ledger.snapshots == 1 and ops.ledger.restores == 1


def test_snapshot_cells_must_be_recurrent():
    with pytest.raises(InputError) as info:
        StateService.fresh(HostTensorOps(Ledger()), SPECS, snapshot_cells=["k"])
    assert info.value.field == "snapshot" and info.value.value == "k"
    assert "truncate" in info.value.remedy


def test_truncate_is_all_or_nothing():
    """A refused truncate leaves every cell as it was (checked before any change)."""
    ops = HostTensorOps(Ledger())
    service = StateService.fresh(ops, SPECS, snapshot_cells=["r"])
    service.absorb({"k": ops.adopt(np.ones((1, 2, 3, 3), np.float32))}, 3)
    with pytest.raises(InputError):
        service.truncate(2, ["k", "r"])
    assert service.length("k") == 3 and service.value("k").shape[2] == 3
