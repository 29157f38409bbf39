"""Programmatic dependent launch on the device (``engines/native/dependent_launch.py``).

On sm_90 and later native-cuda's kernels launch with programmatic serialization: each may
start while the kernel ahead of it runs, and waits on the device before it touches memory.
That must change no bit: a prefill, greedy decode steps (the PRIMARY graph, captured with
dependent launches), a verification forward (the VERIFY graph) and an append-cache decode
give the same logits, bit for bit, with dependent launches and with the driver's plain
launches. The source rule that makes it so (every kernel waits first) is checked on the
host (``test_dependent_launch.py``)."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from engines.native import dependent_launch
from engines.native.cuda_kernels import get_kernels
from engines.native.fused_kernels import get_fused_kernels

pytestmark = pytest.mark.gpu


def _launchers():
    return [get_kernels(0)._launcher, get_fused_kernels(0)._launcher]


def test_native_cuda_launches_dependent_from_sm90(cp):
    capability = int(cp.cuda.Device(0).compute_capability)
    expected = capability >= 90 and dependent_launch.requested()
    assert [launcher.dependent is not None for launcher in _launchers()] == [expected] * 2


@contextlib.contextmanager
def _plain_launches():
    launchers = _launchers()
    held = [launcher.dependent for launcher in launchers]
    try:
        for launcher in launchers:
            launcher.dependent = None
        yield
    finally:
        for launcher, dependent in zip(launchers, held):
            launcher.dependent = dependent


def _logits(cp, package, steps: int = 8, verify: int = 3) -> list[np.ndarray]:
    """A prefill, ``steps`` greedy decode steps and a verification of ``verify`` rows, each
    forward's logits on the host (as raw bits)."""
    from engines.registry import get_engine_class
    from engines.workflow.session import DecodeSession

    engine = get_engine_class("native-cuda")(package)
    try:
        session = DecodeSession(engine)
        kept = []

        def keep(out):  # to the host now: a graph's next replay rewrites its output
            token = session.last_token(out["logits"])
            engine.synchronize()  # the copy below runs on CuPy's current stream, not the engine's
            host = cp.asnumpy(out["logits"])
            kept.append(host.view(f"u{host.itemsize}"))
            return token

        token = keep(session.forward(list(package.spec.prompts[0]), "prefill"))
        for _ in range(steps):
            token = keep(session.forward([token], "decode"))
        vocab = package.spec.vocab_size
        keep(session.forward([token] + [(token + 7 * i) % vocab for i in range(1, verify)],
                             "verify"))
        return kept
    finally:
        engine.close()


@pytest.mark.claim("token_identity")
@pytest.mark.parametrize("package_name", ["tiny_llama_static", "tiny_llama", "tied_llama"])
def test_dependent_launches_give_the_plain_launches_bits(cp, packages, package_name,
                                                        monkeypatch):
    package = packages[package_name]
    launched = []
    if any(launcher.dependent is not None for launcher in _launchers()):
        original = dependent_launch.DependentLaunch.launch

        def counted(self, *args):
            launched.append(args[0])
            return original(self, *args)

        monkeypatch.setattr(dependent_launch.DependentLaunch, "launch", counted)
    dependent = _logits(cp, package)
    with _plain_launches():
        plain = _logits(cp, package)
    capability = int(cp.cuda.Device(0).compute_capability)
    if capability >= 90 and dependent_launch.requested():
        assert launched, "no kernel went through cuLaunchKernelEx"
    assert len(dependent) == len(plain)
    for step, (a, b) in enumerate(zip(dependent, plain)):
        np.testing.assert_array_equal(a, b, err_msg=f"{package_name}: forward {step}")


def test_a_verification_launches_plain_and_a_prefill_or_decode_dependent(cp, packages,
                                                                         monkeypatch):
    """kernel_launch.plain_launches around a verify forward (eager and captured alike)."""
    from engines.registry import get_engine_class
    from engines.workflow.session import DecodeSession

    capability = int(cp.cuda.Device(0).compute_capability)
    dependent = capability >= 90 and dependent_launch.requested()
    launched = []
    original = dependent_launch.DependentLaunch.launch

    def counted(self, *args):
        launched.append(args[0])
        return original(self, *args)

    monkeypatch.setattr(dependent_launch.DependentLaunch, "launch", counted)
    package = packages["tiny_llama_static"]
    engine = get_engine_class("native-cuda")(package)
    try:
        session = DecodeSession(engine)
        counts = {}
        for phase, tokens in (("prefill", list(package.spec.prompts[0])), ("decode", [5]),
                              ("verify", [5, 6, 7])):
            before = len(launched)
            session.forward(tokens, phase)  # a slot's first use: eager, then the capture
            counts[phase] = len(launched) - before
    finally:
        engine.close()
    assert counts["verify"] == 0
    assert (counts["prefill"] > 0 and counts["decode"] > 0) is dependent, counts
