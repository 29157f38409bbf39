"""The example engines under lockstep's checks, the way any engine's own suite would do it.

lockstep's pytest plugin (loaded through its ``pytest11`` entry point) gives the options
``--engines`` and ``--packages`` and the fixtures ``lockstep_packages``, ``evidence_dir``
and ``assert_token_identity``; ``harness.runner.run_matrix`` runs and judges a matrix of cells
exactly as ``lockstep run`` does. Run: ``pytest`` in this folder (after
``pip install -e .`` here and lockstep in the same environment).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engines.registry import describe_engines, get_engine_class
from harness.judge import DEFECT, FAILING
from harness.packages import resolve_package
from harness.runner import run_matrix
from lockstep_example_engine.engine import OrtBlackBoxEngine, OrtOptimizedEngine

ENGINES = ("example-ort-optimized", "example-ort-blackbox")
NEW_TOKENS = 12


def _describe(summary) -> str:
    return "\n".join(f"{c.package} {c.engine} {c.mode} {c.prompt_name}: {c.status} {c.reason}"
                     for c in summary.cells if c.status != "identical")


def test_the_engines_are_registered_by_their_entry_points():
    listed = {e.name: e for e in describe_engines()}
    for name, cls in zip(ENGINES, (OrtOptimizedEngine, OrtBlackBoxEngine)):
        assert get_engine_class(name) is cls
        assert listed[name].source == "entry point"
        assert listed[name].distribution == "lockstep-example-engine"
        assert listed[name].problem is None
    assert not OrtOptimizedEngine.capabilities().decodes_itself
    caps = OrtBlackBoxEngine.capabilities()
    assert caps.decodes_itself and not caps.speculative and caps.logits_audit


@pytest.mark.claim("token_identity", "logits_within_tolerance", "finite_logits")
@pytest.mark.parametrize("engine", ENGINES)
def test_greedy_agrees_with_the_oracle(engine, lockstep_packages, evidence_dir):
    summary = run_matrix([engine], lockstep_packages, None, NEW_TOKENS,
                         evidence_dir=evidence_dir, command=["pytest", engine])
    assert summary.cells and not summary.failed, _describe(summary)
    assert all(c.audit is not None for c in summary.cells)  # every logits row was audited


@pytest.mark.claim("token_identity")
def test_speculative_decoding_on_the_optimized_engine(lockstep_packages, evidence_dir):
    speculative = [p for p in lockstep_packages
                   if resolve_package(p).spec.decoding.speculative is not None]
    if not speculative:
        pytest.skip("no package with a speculative section among --packages")
    summary = run_matrix(["example-ort-optimized"], speculative, None, NEW_TOKENS,
                         evidence_dir=evidence_dir, mode="speculative", widths="all")
    assert summary.cells and not summary.failed, _describe(summary)


def test_the_black_box_is_not_asked_to_speculate(lockstep_packages):
    speculative = [p for p in lockstep_packages
                   if resolve_package(p).spec.decoding.speculative is not None]
    if not speculative:
        pytest.skip("no package with a speculative section among --packages")
    summary = run_matrix(["example-ort-blackbox"], speculative[:1], None, 4,
                         mode="speculative", widths=[1])
    # left out of the plan by its declaration, with the reason, rather than run and refused
    assert summary.cells == []
    (left,) = summary.left_out
    assert left.engine == "example-ort-blackbox" and left.decided_by == "declaration"
    assert "declares no speculative decoding" in left.reason


def test_tokens_directly_against_the_oracle(assert_token_identity):
    """Without the runner: the interpreter decodes, the recompute oracle is the reference."""
    from engines.oracle import oracle_decode
    from engines.workflow import greedy_decode

    package = resolve_package("tiny_llama")
    prompt = list(package.spec.prompts[0])
    oracle = oracle_decode(package, prompt, NEW_TOKENS)
    for cls in (OrtOptimizedEngine, OrtBlackBoxEngine):
        with cls(package) as engine:
            result = greedy_decode(engine, prompt, NEW_TOKENS)
        assert_token_identity(oracle.tokens, result.tokens, margins=oracle.margins,
                              label=cls.name)


# -- a check that cannot fail proves nothing: the same engine with one planted bug ----------

class PositionOffByOne(OrtOptimizedEngine):
    """From the third decode step on, the position fed is one too high."""

    name = "example-position-off-by-one"

    def run_component(self, component, feeds, phase=None):
        positions = self.package.spec.components[component].inputs.get("positions")
        if positions and phase == "decode" and self.ledger.forwards["decode"] >= 3:
            feeds = dict(feeds, **{positions: np.asarray(feeds[positions]) + 1})
        return super().run_component(component, feeds, phase=phase)


def test_a_planted_bug_in_the_engine_is_caught():
    summary = run_matrix([PositionOffByOne], ["tiny_llama"], None, NEW_TOKENS, max_prompts=2)
    assert {c.status for c in summary.cells} <= set(FAILING)
    assert all(c.judgement.defects for c in summary.cells if c.status == DEFECT)
    assert any(c.status == DEFECT for c in summary.cells)


# -- the command line: what a user types -------------------------------------------------------

def _lockstep() -> list[str]:
    script = Path(sys.executable).with_name("lockstep")
    return [str(script)] if script.exists() else [sys.executable, "-m", "harness.cli"]


def test_lockstep_run_through_the_entry_point(tmp_path):
    proc = subprocess.run(
        _lockstep() + ["run", "--engines", ",".join(ENGINES), "--packages", "tiny_llama",
                       "--max-new-tokens", str(NEW_TOKENS), "--evidence-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert all(name in proc.stdout for name in ENGINES)
    assert list(tmp_path.glob("**/*.json"))  # evidence records were written


def test_lockstep_engines_lists_them():
    proc = subprocess.run(_lockstep() + ["engines", "--json"], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    import json

    rows = {r["name"]: r for r in json.loads(proc.stdout)}
    for name in ENGINES:
        assert rows[name]["distribution"] == "lockstep-example-engine"
        assert rows[name]["version"] == "0.1.0" and rows[name]["available"]
