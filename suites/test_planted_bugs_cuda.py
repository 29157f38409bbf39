"""Device-only planted bugs on native-cuda: a staging copy, an unaccounted readback, a stale
graph replay, non-finite logits on the device; and the native-cuda control. Each must be
caught with its verdict (claims 1, 1b, 3, 4, 6) and the control must stay clean, with its
logits audited in a separate, labelled decode that no budget counts."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from engines.backends.native_cuda import NativeCudaEngine
from engines.cuda_support import sanctioned_readback
from harness.runner import run_matrix
from suites.support import write_figure

pytestmark = pytest.mark.gpu
K = 3
TOKENS = 16


def _logits(engine, component, out):
    return out[engine.package.spec.components[component].outputs["logits"]]


class CudaStagesLogits(NativeCudaEngine):
    """A ``.get()`` of the logits left in the hot path; the ledger never hears of it."""
    name = "planted-cuda-stages-logits"

    def run_component(self, component, feeds, phase=None):
        out = super().run_component(component, feeds, phase)
        _logits(self, component, out).get(stream=self.stream)  # host staging
        return out


class CudaExtraReadback(NativeCudaEngine):
    """Reads back one more int32 each forward, sanctioned but outside the budget."""
    name = "planted-cuda-extra-readback"

    def run_component(self, component, feeds, phase=None):
        out = super().run_component(component, feeds, phase)
        logits = _logits(self, component, out)
        with sanctioned_readback("token_id"):
            logits[0, -1, 0:1].astype(self._cupy.int32).get(stream=self.stream)
        return out


class _StaleCopy:
    """A graph device whose copy into the static input buffers forgets int64 [1, 1] feeds
    (the token id and the position): replays recompute the captured step."""

    def __init__(self, device):
        self._device = device

    def __getattr__(self, attr):
        return getattr(self._device, attr)

    def copy(self, dst, src):
        if src.dtype == np.int64 and tuple(src.shape) == (1, 1):
            return
        self._device.copy(dst, src)


class CudaStaleReplay(NativeCudaEngine):
    """A stale graph replay: the token and position feeds are never copied into the graph's
    static input buffers (at capture, the first decode step, nor before a replay)."""
    name = "planted-cuda-stale-replay"

    def __init__(self, package, **kwargs):
        super().__init__(package, **kwargs)
        for state in self.slots.states.values():
            state.device = _StaleCopy(state.device)


class CudaNanRow(NativeCudaEngine):
    """At step K the whole logits row is NaN on the device: the argmax kernel's -1 comes
    back in the token readback itself (no extra byte), so the budgeted decode sees it."""
    name = "planted-cuda-nan-row"

    def run_component(self, component, feeds, phase=None):
        step = sum(self.ledger.forwards.values())
        out = super().run_component(component, feeds, phase)
        if step == K:
            _logits(self, component, out).fill(np.nan)
        return out


class CudaNanPartialRow(NativeCudaEngine):
    """Odd vocabulary entries NaN on the device: only the logits audit can see it."""
    name = "planted-cuda-nan-partial-row"

    def run_component(self, component, feeds, phase=None):
        out = super().run_component(component, feeds, phase)
        _logits(self, component, out)[..., 1::2] = np.nan
        return out


CASES = [
    (NativeCudaEngine, "tiny_llama_static", "identical", None),
    (NativeCudaEngine, "tiny_llama", "identical", None),
    (NativeCudaEngine, "tied_llama", "identical", None),
    (CudaStagesLogits, "tiny_llama_static", "budget", None),
    (CudaExtraReadback, "tiny_llama", "budget", None),
    (CudaStaleReplay, "tiny_llama_static", "defect", 1),
    (CudaNanRow, "tiny_llama_static", "non-finite", K),
    (CudaNanPartialRow, "tiny_llama", "non-finite", 0),
]


@pytest.fixture(scope="module")
def catches(evidence_dir):
    rows = []
    yield rows
    write_figure(evidence_dir, "planted_bugs_cuda", rows)


@pytest.mark.claim("token_identity")
@pytest.mark.parametrize("cls, package, status, step", CASES,
                         ids=[f"{c.name}-{p}" for c, p, _, _ in CASES])
def test_device_planted_bug_is_caught(cp, catches, cls, package, status, step):
    from suites.planted.catch_matrix import observed_status, observed_step

    summary = run_matrix([cls], [package], None, TOKENS)
    got, at = observed_status(summary.cells), observed_step(summary.cells)
    catches.append({"engine": cls.name, "package": package, "expected": [status, step],
                    "observed": [got, at], "reasons": [c.reason for c in summary.cells]})
    assert (got, at) == (status, step), [(c.prompt_name, c.status, c.reason)
                                         for c in summary.cells]
    for cell in summary.cells:
        if status in ("identical", "defect") and cell.audit is not None:
            # the audit ran as its own decode: every row read back under logits_audit,
            # none of it in the budgeted decode's ledger
            vocab = summary_vocab(package)
            assert cell.audit.decode == "separate"
            assert cell.audit.readback_bytes == len(cell.tokens) * vocab * 4
            assert cell.ledger.readback_bytes["logits_audit"] == 0
        if status == "identical":
            assert all(b.verdict == "pass" for b in cell.budgets) and len(cell.budgets) == 4
        if status == "budget":
            failing = [b for b in cell.budgets if b.verdict == "fail"]
            assert failing and all("transfer guard" in b.unit for b in failing), failing


def summary_vocab(package_name: str) -> int:
    from harness.packages import resolve_package

    return resolve_package(package_name).spec.vocab_size


class CudaPositionOffByOne(NativeCudaEngine):
    """From step K on, the position ids fed to the device forward are one too high."""
    name = "planted-cuda-position-off-by-one"

    def run_component(self, component, feeds, phase=None):
        positions = self.package.spec.components[component].inputs.get("positions")
        if positions and sum(self.ledger.forwards.values()) >= K:
            feeds = dict(feeds, **{positions: feeds[positions] + 1})
        return super().run_component(component, feeds, phase)


@pytest.mark.claim("token_identity")
def test_explain_and_repro_localise_a_device_bug(cp, evidence_dir, tmp_path):
    """Issue 15 on the device: explain names layer 0's rotary gather for a native-cuda
    position bug (eager, dynamic cache: every forward goes through the plan), and the repro
    pack's test fails on the buggy engine and passes on native-host."""
    import json
    import os
    import subprocess
    import sys

    from harness.forensics import explain_record, write_repro

    summary = run_matrix([CudaPositionOffByOne], ["tiny_llama"], None, TOKENS, tmp_path / "ev")
    failing = [c for c in summary.cells if c.failed]
    assert failing and failing[0].first_step == K
    e = explain_record(failing[0].record_path, engine=CudaPositionOffByOne)
    fb = e.first_bad
    assert e.step == K and (fb.where, fb.layer, fb.op) == ("inside", 0, "Gather")
    pack = write_repro(failing[0].record_path, tmp_path / "repro", engine=CudaPositionOffByOne)
    outcomes = {}
    root = Path(__file__).resolve().parents[1]
    for engine in ("suites.test_planted_bugs_cuda:CudaPositionOffByOne", "native-host"):
        run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                              str(pack.folder)], capture_output=True, text=True, cwd=root,
                             env=dict(os.environ, LOCKSTEP_REPRO_ENGINE=engine,
                                      PYTHONPATH=os.pathsep.join(
                                          filter(None, [str(root), os.environ.get("PYTHONPATH")]))))
        outcomes[engine] = run.returncode
    write_figure(evidence_dir, "explain_cuda_position", {
        "step": e.step, "first_bad": {"layer": fb.layer, "op": fb.op, "label": fb.label,
                                      "error": float(fb.error), "floor": float(fb.floor)},
        "layer_curve": json.loads(json.dumps(e.layer_curve(), default=float)),
        "shrunk_prompt": pack.shrunk_prompt,
        "repro_returncodes": outcomes, "text": e.text()})
    assert outcomes["suites.test_planted_bugs_cuda:CudaPositionOffByOne"] != 0
    assert outcomes["native-host"] == 0
    json.dumps(e.to_dict())  # the explanation serialises
