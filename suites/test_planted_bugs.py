"""Planted bugs: every verdict rule is shown to catch what it should, at the right step,
and to leave harmless changes alone (claims 1, 1b, 1c, 3, 4; DESIGN "A check that cannot
fail proves nothing"). The rows feed the catch matrix in docs/."""
from __future__ import annotations

import json
import os

import pytest

from harness.runner import run_matrix
from suites.planted import catch_matrix
from suites.planted import engines as pe
from suites.planted.catalog import (CASES, FIXTURE_TOKENS, QUANTIZED_TOKENS, REAL, REAL_TOKENS,
                                    Case)

pytestmark = pytest.mark.claim("token_identity")


def _quantized_prompts(case: Case):
    from harness.prompts import chat_prompt, text_prompt

    return [chat_prompt([{"role": "user", "content": text}], name=f"q{i}")
            if kind == "chat" else text_prompt(text, name=f"q{i}")
            for i, (kind, text) in enumerate(case.prompts)]


def _run(case: Case, evidence_dir=None):
    if case.quantized:
        return run_matrix([case.bug], [case.package], _quantized_prompts(case),
                          QUANTIZED_TOKENS, evidence_dir)
    real = case.package == REAL
    return run_matrix([case.bug], [case.package], None, REAL_TOKENS if real else FIXTURE_TOKENS,
                      evidence_dir, mode=case.mode, widths=[case.width] if case.width else None,
                      max_prompts=1 if real else None)


def _first_rollback_step(case: Case) -> int:
    """Where a rollback bug strikes: the tokens committed when a correct engine's first
    partial accept is rolled back (the next forward reads the cache)."""
    from engines.workflow.speculative import speculative_decode
    from harness.packages import resolve_package

    package = resolve_package(case.package)
    engine = pe.Control(package)
    steps = []
    for prompt in package.spec.prompts:
        result = speculative_decode(engine, prompt, FIXTURE_TOKENS, case.width)
        committed = 1
        for accepted, width in zip(result.acceptance_per_round, result.widths_per_round):
            committed += accepted + 1
            if accepted < width:
                steps.append(committed)
                break
    return min(steps)


def _marks(case: Case):
    marks = [pytest.mark.claim(_claim_of(case))]
    if case.package == REAL:
        marks.append(pytest.mark.real_checkpoint)
    return marks


def _claim_of(case: Case) -> str:
    if case.quantized:
        return "quantized_band"
    return {"drift": "logits_within_tolerance", "non-finite": "finite_logits",
            "budget": "readback_budget"}.get(case.status, "token_identity")


def _need(case: Case) -> None:
    """A quantized engine's case needs its engine here (CI installs both: there, as where
    ``LOCKSTEP_REQUIRE_LLAMA`` is set, an engine that cannot run fails the case)."""
    if case.package == REAL:
        pytest.importorskip("gguf")
    if case.min_ratio is None and not case.quantized:
        return
    found = case.bug.availability()
    if not found.ok:
        message = f"{case.bug.name} cannot run here: {found.reason}"
        if os.environ.get("LOCKSTEP_REQUIRE_LLAMA"):
            pytest.fail(message, pytrace=False)
        pytest.skip(message)


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=_marks(c)) for c in CASES])
def test_planted_bug_is_caught_with_its_verdict_and_step(case: Case):
    _need(case)
    summary = _run(case)
    assert summary.cells, "the cell ran nowhere"
    status = catch_matrix.observed_status(summary.cells)
    step = catch_matrix.observed_step(summary.cells)
    beyond = catch_matrix.observed_beyond(summary.cells)
    expected_step = _first_rollback_step(case) if case.step == -1 else case.step
    catch_matrix.write_row(case, status, step, expected_step, beyond)
    details = [(c.prompt_name, c.status, c.first_step, c.reason) for c in summary.cells]
    assert status == case.status, details
    assert step == expected_step, details
    if case.quantized:  # judged by its scheme's checked-in band, never by float32 identity
        assert all(c.band is not None for c in summary.cells), details
    if case.min_ratio is not None:
        assert beyond is not None and beyond["ratio"] >= case.min_ratio, (beyond, details)
    if case.control:
        assert not summary.failed
    else:
        assert summary.failed


@pytest.mark.claim("quantized_band")
def test_every_planted_quantized_bug_must_land_tenfold_beyond_its_band():
    """Claim 1d: no quantized bug's row is let off the tenfold distance (the catch matrix's
    decodes, as ``calibrate`` requires on the corpus)."""
    bugs = [c for c in CASES if c.quantized and not c.control]
    assert {"Int4BlockScale", "Int4BosDropped"} <= {c.bug.__name__ for c in bugs}
    assert [c.id for c in bugs if c.min_ratio is None or c.min_ratio < 10] == []


@pytest.mark.claim("quantized_band")
@pytest.mark.real_checkpoint
def test_a_dropped_bos_is_judged_only_on_prompts_that_start_with_the_bos():
    """The BOS rows decode prompts the bug acts on: each starts with the package's BOS (on
    SmolLM2 a text prompt does not: its tokenizer adds none)."""
    pytest.importorskip("gguf")
    from harness.packages import resolve_package
    from harness.prompts import resolve, text_prompt

    package = resolve_package(REAL)
    bos = package.spec.bos_id
    assert resolve(text_prompt("Hi"), package).ids[0] != bos
    rows = [c for c in CASES if c.bug.__name__.endswith("BosDropped")]
    assert len(rows) == 2
    for case in rows:
        ids = [resolve(p, package).ids for p in _quantized_prompts(case)]
        assert [i[0] for i in ids] == [bos] * len(ids) and min(map(len, ids)) > 1, ids


def test_the_catch_matrix_names_what_each_quantized_row_was_decoded_on():
    row = {"bug": "x-bos-dropped", "package": REAL, "mode": "greedy", "caught": True,
           "description": "", "expected": {"status": "defect", "step": 0},
           "observed": {"status": "defect", "step": 0},
           "prompts": ["chat: Hi", "plain: <|im_start|>system\nYou"]}
    text = catch_matrix.markdown({"rows": [row, {**row, "bug": "y-bos-dropped"}],
                                  "control": []})
    assert ("x-bos-dropped, y-bos-dropped: decoded on `chat: Hi`, "
            "`plain: <|im_start|>system\\nYou`.") in text.splitlines()


def test_greedy_only_bug_names_the_greedy_path_and_the_right_reference():
    """Claim 1 in speculative mode: a broken greedy path is named as such, with the oracle's
    token, and the speculative stream is judged correct on its own."""
    case = next(c for c in CASES if c.bug is pe.GreedyOnlyPosition)
    summary = _run(case)
    for cell in summary.cells:
        assert cell.judgement.defects == 0  # the speculative stream is right
        g = cell.greedy_judgement.first
        assert g is not None and g.verdict == "defect"
        assert (f"the greedy path is wrong at step {g.step} (engine {g.engine_token}, "
                f"oracle {g.oracle_token})") in cell.reason
        assert cell.verdicts["spec_equals_greedy"] == "fail"


def test_a_speculative_path_bug_names_the_speculative_path():
    case = next(c for c in CASES if c.bug is pe.VerifyRowShift)
    summary = _run(case)
    for cell in summary.cells:
        assert cell.greedy_judgement.defects == 0
        assert "the speculative path is wrong" in cell.reason


@pytest.mark.claim("logits_within_tolerance")
def test_speculative_cells_audit_every_verification_row_without_touching_the_budgets():
    """Every row of every target forward that decided a token is audited (prefill, each
    verification's W+1 rows, plain decode steps). On a (simulated) device the rows come from a
    separate, labelled audit decode, so the judged decode's exact budget still holds."""
    for engine, how in ((pe.Control, "same"), (pe.SimulatedDevice, "separate")):
        summary = run_matrix([engine], ["tiny_llama_pair"], None, FIXTURE_TOKENS, mode="speculative",
                             widths=[2], max_prompts=1)
        (cell,) = summary.cells
        assert cell.status == "identical", cell.reason
        audit = cell.audit
        assert audit is not None and audit.decode == how
        rounds = cell.tallies["proposals"]
        verify_rows = [s for s in audit.steps if s.where.startswith("verify")]
        assert len(verify_rows) == 3 * rounds  # W + 1 rows a verification
        assert audit.steps[0].where == "prefill" and audit.steps[0].step == 0
        assert all(s.ok for s in audit.steps)
        assert cell.verdicts["logits_within_tolerance"] == "pass"
        if how == "separate":
            assert cell.ledger.readback_bytes.get("logits_audit", 0) == 0
            assert audit.readback_bytes > 0
            assert all(b.verdict == "pass" for b in cell.budgets) and cell.budgets


def test_a_near_tie_is_judged_by_the_engines_token_not_the_top2_margin(monkeypatch):
    """On the tied fixture every step's top-2 tie exactly; an engine that emits the oracle's
    third choice there is a defect (the old rule called any divergence at a small top-2
    margin a near-tie), while the tied twin itself would be a near-tie."""
    import numpy as np

    from engines.oracle import Oracle
    from engines.tolerances import tolerance_for
    from harness.judgement import DEFECT, NEAR_TIE, judge_stream
    from harness.packages import resolve_package

    package = resolve_package("tied_llama")
    oracle = Oracle(package)
    prompt = package.spec.prompts[0]
    clean = oracle.decode(prompt, 6).tokens
    row = oracle.row(prompt + clean[:2])
    order = np.lexsort((np.arange(row.size), -row))
    twin, third = int(order[1]), int(order[2])
    assert row[twin] == row[order[0]]  # the fixture's exact tie
    tol = tolerance_for("float32")
    for token, verdict in ((twin, NEAR_TIE), (third, DEFECT)):
        tokens = clean[:2] + [token]
        judged = judge_stream(oracle, prompt, tokens, 3, tol)
        assert judged.first.step == 2 and judged.first.verdict == verdict
        assert judged.first.rank == (2 if token == twin else 3)
        assert len(judged.first.oracle_top) == 5


def test_every_step_is_judged_after_the_first_defect():
    case = Case(pe.TokenSwap, "tiny_llama", "defect", pe.K)
    # a swap at one step and an engine that keeps decoding on its own prefix: one finding,
    # every later step judged against the oracle on that prefix (and found right)
    summary = _run(case)
    for cell in summary.cells:
        assert cell.judgement.steps_judged == FIXTURE_TOKENS
        assert [f.step for f in cell.judgement.findings] == [pe.K]


def test_exact_ties_go_to_the_lowest_index_on_every_host_engine():
    """Lowest index wins, everywhere: the engines' tensor ops and the oracle agree on it."""
    import numpy as np

    from engines.ledger import Ledger
    from engines.tensor_ops.host import HostTensorOps
    from harness.judgement import lowest_argmax
    from engines.oracle import top2_margin

    row = np.array([[0.5, 2.0, 2.0, -1.0, 2.0]], dtype=np.float32)
    assert HostTensorOps(Ledger()).argmax_rows(row, 1) == [1]
    assert lowest_argmax(row[0].astype(np.float64)) == 1
    assert top2_margin(row[0])[:2] == (1, 2)


def test_the_oracle_failing_is_an_error_cell_and_the_matrix_goes_on(monkeypatch, tmp_path):
    from engines.oracle import Oracle

    real_row = Oracle.row

    def flaky(self, prefix):
        if len(prefix) == 4 + 2 and self.package.spec.name == "tiny_llama":
            raise RuntimeError("onnxruntime: Non-zero status code returned while running "
                               "MatMul node (planted)")
        return real_row(self, prefix)

    monkeypatch.setattr(Oracle, "row", flaky)
    summary = run_matrix(["native-host"], ["tiny_llama", "lookup_chained"], None, 8, tmp_path)
    by = {(c.package, c.prompt_name): c for c in summary.cells}
    broken = by[("tiny_llama", "p0")]  # prompt p0 has 4 ids: its oracle fails at step 2
    assert broken.status == "error" and broken.error.stage == "oracle"
    assert "MatMul" in broken.error.message
    assert by[("tiny_llama", "p1")].status == "identical"
    assert all(c.status == "identical" for c in summary.cells if c.package == "lookup_chained")
    records = [json.loads(p.read_text()) for p in tmp_path.glob("*.json")]
    assert len(records) == len(summary.cells) == summary.planned
    assert any(r["status"] == "error" and r["error"]["stage"] == "oracle" for r in records)
