"""``LOCKSTEP_WIDE_VERIFY`` on the device (``engines/native/launch/prologue_gemv.py``): a
verification's norm-prologue GEMVs in blocks of eight warps must change no bit. A prefill,
greedy steps and a verification give the same logits with the switch on and off (the
emulator checks the kernels alone: ``test_kernel_emulation.py``)."""
from __future__ import annotations

import numpy as np
import pytest

from engines.native.fused_kernels import get_fused_kernels
from engines.native.launch.prologue_gemv import WIDE_ENV
from suites.test_dependent_launch_cuda import _logits

pytestmark = pytest.mark.gpu


def _with_switch(cp, package, monkeypatch, value: str) -> list[np.ndarray]:
    monkeypatch.setenv(WIDE_ENV, value)
    family = get_fused_kernels(0)
    family.__dict__.pop("_wide_verify", None)  # the family reads the switch once
    logits = _logits(cp, package)
    assert family.__dict__.get("_wide_verify") is (value == "on"), "no multi-row prologue ran"
    return logits


@pytest.mark.claim("token_identity")
@pytest.mark.parametrize("package_name", ["tiny_llama_static", "tiny_llama", "tied_llama"])
def test_wide_verify_blocks_give_the_narrow_blocks_bits(cp, packages, package_name,
                                                       monkeypatch):
    package = packages[package_name]
    narrow = _with_switch(cp, package, monkeypatch, "off")
    wide = _with_switch(cp, package, monkeypatch, "on")
    get_fused_kernels(0).__dict__.pop("_wide_verify", None)
    assert len(wide) == len(narrow)
    for step, (a, b) in enumerate(zip(wide, narrow)):
        np.testing.assert_array_equal(a, b, err_msg=f"{package_name}: forward {step}")
