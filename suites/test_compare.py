"""The comparators: every token judged on the engine's own prefix (harness.judgement), logits
audited against the oracle's row, tensors by the tolerance table.

The judge is exercised on a fake oracle with fixed float64 rows, one per step, so each rule
is stated by its numbers: which token the engine picked decides, never the top-2 margin.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from engines.oracle import top2_margin
from engines.tolerances import TABLE, tolerance_for
from harness.compare import compare_tensors
from harness.judgement import (DEFECT, DRIFT, IDENTICAL, NEAR_TIE, NON_FINITE, audit_logits,
                               judge_stream)

VOCAB = 8
EOS = 7
PROMPT = [1, 2]
TOL = tolerance_for("float32")  # near-tie margin 1e-2


def logits(values: dict[int, float], vocab: int = VOCAB) -> np.ndarray:
    """A float64 row: 0.0 everywhere but the given ids."""
    row = np.zeros(vocab, dtype=np.float64)
    for token, value in values.items():
        row[token] = value
    return row


class FakeOracle:
    """``row(prefix)`` is the fixed row of step ``len(prefix) - len(prompt)``; every prefix
    asked for is kept, so a test can see the judge used the engine's own prefix."""

    mode = "fake"

    def __init__(self, rows, prompt=PROMPT, vocab=VOCAB, eos=EOS):
        self.spec = SimpleNamespace(vocab_size=vocab, eos_id=eos)
        self.prompt = list(prompt)
        self.rows = [np.asarray(r, dtype=np.float64) for r in rows]
        self.asked: list[list[int]] = []

    def row(self, prefix):
        prefix = [int(t) for t in prefix]
        assert prefix[:len(self.prompt)] == self.prompt
        self.asked.append(prefix)
        return self.rows[len(prefix) - len(self.prompt)]

    def stream_rows(self, prompt, tokens):
        return [self.row(list(prompt) + list(tokens[:t])) for t in range(len(tokens) + 1)]


def judge(rows, tokens, max_new_tokens=None, engine_rows=None, **spec):
    oracle = FakeOracle(rows, **spec)
    max_new = len(tokens) if max_new_tokens is None else max_new_tokens
    return judge_stream(oracle, PROMPT, tokens, max_new, TOL, engine_rows), oracle


# -- tokens: judge_stream ------------------------------------------------------------------

@pytest.mark.claim("token_identity")
def test_a_stream_of_the_oracles_argmaxes_is_identical():
    rows = [logits({3: 2.0, 4: 1.0}), logits({1: 5.0}), logits({4: 0.5})]
    j, oracle = judge(rows, [3, 1, 4])
    assert (j.verdict, j.findings, j.steps_judged, j.defects, j.near_ties) == (
        IDENTICAL, [], 3, 0, 0)
    assert j.first is None
    assert oracle.asked == [PROMPT, PROMPT + [3], PROMPT + [3, 1]]  # the engine's own prefix


@pytest.mark.claim("token_identity")
def test_a_token_within_the_margin_of_the_best_is_a_near_tie_with_its_rank_and_gap():
    rows = [logits({3: 2.0}), logits({1: 2.0, 5: 1.995, 6: 1.0}), logits({4: 1.0})]
    j, _ = judge(rows, [3, 5, 4])
    assert (j.verdict, j.defects, j.near_ties, j.steps_judged) == (NEAR_TIE, 0, 1, 3)
    f = j.first
    assert (f.step, f.engine_token, f.oracle_token, f.rank, f.verdict) == (1, 5, 1, 2, NEAR_TIE)
    assert f.gap == pytest.approx(0.005)
    assert f.oracle_top[:3] == [(1, 2.0), (5, 1.995), (6, 1.0)]
    assert "within" in f.reason


@pytest.mark.claim("token_identity")
def test_the_oracles_third_choice_at_a_tiny_top2_margin_is_a_defect():
    """The old rule's false pass: the oracle's first two barely differ, which says nothing
    about an engine that chose the third."""
    tight = logits({1: 2.0, 2: 1.999, 6: 1.0})
    assert top2_margin(tight)[2] < TOL.near_tie_margin  # the old rule would call this a tie
    j, _ = judge([logits({3: 2.0}), tight, logits({4: 1.0})], [3, 6, 4])
    assert (j.verdict, j.defects, j.near_ties) == (DEFECT, 1, 0)
    f = j.first
    assert (f.step, f.engine_token, f.oracle_token, f.rank, f.verdict) == (1, 6, 1, 3, DEFECT)
    assert f.gap == pytest.approx(1.0)
    assert "beyond" in f.reason


@pytest.mark.claim("token_identity")
def test_an_exact_tie_goes_to_the_lowest_index():
    tie = logits({2: 3.0, 5: 3.0})
    lower, _ = judge([tie], [2])
    assert lower.verdict == IDENTICAL and lower.findings == []
    # the higher twin, the engine's own logits unknown: 0 below the best, a near-tie at rank 2
    higher, _ = judge([tie], [5])
    assert higher.verdict == NEAR_TIE
    assert (higher.first.rank, higher.first.gap) == (2, 0.0)
    # the engine's own row ties too: it broke its own tie the wrong way, a defect
    own, _ = judge([tie], [5], engine_rows=[tie.astype(np.float32)])
    assert own.verdict == DEFECT
    f = own.first
    assert (f.step, f.engine_token, f.oracle_token, f.rank, f.gap) == (0, 5, 2, 2, 0.0)
    assert "not the engine's own argmax" in f.reason
    assert f.engine_top[:2] == [(2, 3.0), (5, 3.0)]
    # the lower twin with the engine's tied row is a plain match
    ok, _ = judge([tie], [2], engine_rows=[tie])
    assert ok.verdict == IDENTICAL


@pytest.mark.claim("token_identity")
def test_judging_goes_on_after_the_first_defect_on_the_engines_own_prefix():
    rows = [logits({3: 2.0}), logits({1: 2.0, 6: 1.995}), logits({4: 2.0}),
            logits({0: 2.0}), logits({5: 1.0})]
    tokens = [6, 6, 0, 0, 5]  # defect at 0, near-tie at 1, defect at 2, match at 3 and 4
    j, oracle = judge(rows, tokens)
    assert j.steps_judged == 5
    assert [(f.step, f.verdict) for f in j.findings] == [(0, DEFECT), (1, NEAR_TIE), (2, DEFECT)]
    assert (j.defects, j.near_ties, j.verdict) == (2, 1, DEFECT)
    assert j.first.step == 0
    assert oracle.asked == [PROMPT + tokens[:i] for i in range(5)]


@pytest.mark.claim("token_identity")
def test_a_stream_that_ends_early_without_eos_is_a_defect():
    rows = [logits({3: 2.0}), logits({1: 2.0}), logits({4: 2.0})]
    j, _ = judge(rows, [3, 1], max_new_tokens=4)
    assert (j.verdict, j.steps_judged, len(j.findings)) == (DEFECT, 2, 1)
    f = j.first
    assert (f.step, f.engine_token, f.oracle_token, f.verdict) == (2, None, 4, DEFECT)
    assert "without eos" in f.reason
    # ending at eos before max_new_tokens is how a stream should end
    stopped, _ = judge([logits({3: 2.0}), logits({EOS: 2.0})], [3, EOS], max_new_tokens=4)
    assert stopped.verdict == IDENTICAL


@pytest.mark.claim("token_identity")
def test_a_token_past_eos_or_past_max_new_tokens_is_a_defect():
    rows = [logits({3: 2.0}), logits({EOS: 2.0}), logits({4: 2.0})]
    j, _ = judge(rows, [3, EOS, 4], max_new_tokens=5)
    assert [(f.step, f.engine_token, f.verdict) for f in j.findings] == [(2, 4, DEFECT)]
    assert "past eos" in j.first.reason and j.steps_judged == 2
    plain = [logits({3: 2.0}), logits({1: 2.0}), logits({4: 2.0})]
    over, _ = judge(plain, [3, 1, 4], max_new_tokens=2)
    assert [(f.step, f.engine_token, f.verdict) for f in over.findings] == [(2, 4, DEFECT)]
    assert "past max_new_tokens" in over.first.reason


@pytest.mark.claim("token_identity")
@pytest.mark.parametrize("bad", [VOCAB, 99, -1])
def test_an_id_outside_the_vocabulary_is_a_defect(bad):
    rows = [logits({3: 2.0}), logits({1: 2.0}), logits({4: 2.0})]
    j, _ = judge(rows, [3, bad, 4])
    assert j.verdict == DEFECT and j.defects == 1
    f = j.first
    assert (f.step, f.engine_token, f.oracle_token, f.rank, f.gap) == (1, bad, 1, None, None)
    assert "outside the vocabulary" in f.reason


# -- logits: audit_logits ------------------------------------------------------------------

@pytest.mark.claim("logits_within_tolerance", "finite_logits")
def test_the_audit_flags_a_nan_row_and_a_float16_rounded_row_and_passes_the_exact_one():
    rng = np.random.default_rng(0)
    rows = [rng.uniform(-16.0, 16.0, VOCAB) for _ in range(3)]
    oracle = FakeOracle(rows)
    nan_row = rows[1].copy()
    nan_row[4] = np.nan
    half = rows[2].astype(np.float16)
    engine_rows = [rows[0].astype(np.float32), nan_row, half]
    audit = audit_logits(oracle, PROMPT, [3, 1, 4], engine_rows, TOL)
    exact, nan, rounded = audit.steps
    assert exact.ok and exact.non_finite == 0
    assert nan.non_finite == 1 and not nan.ok
    assert not rounded.ok and rounded.non_finite == 0
    assert rounded.max_abs > TOL.logits_max_abs
    assert (audit.non_finite_steps, audit.out_of_tolerance_steps) == (1, 1)
    assert audit.first_non_finite.step == 1 and audit.first_out_of_tolerance.step == 2
    assert audit.verdict == NON_FINITE and not audit.within_tolerance
    assert oracle.asked == [PROMPT, PROMPT + [3], PROMPT + [3, 1]]
    # without the NaN row the rounding alone is drift; the exact rows alone pass
    assert audit_logits(FakeOracle(rows), PROMPT, [3, 1, 4], [rows[0], rows[1], half],
                        TOL).verdict == DRIFT
    clean = audit_logits(FakeOracle(rows), PROMPT, [3, 1, 4], rows, TOL)
    assert clean.verdict == IDENTICAL and clean.within_tolerance and clean.worst_max_abs == 0.0


@pytest.mark.claim("finite_logits")
def test_the_audit_counts_infinities_as_non_finite():
    rows = [logits({3: 2.0})]
    inf = rows[0].copy()
    inf[[0, 5]] = [np.inf, -np.inf]
    audit = audit_logits(FakeOracle(rows), PROMPT, [3], [inf], TOL)
    assert audit.steps[0].non_finite == 2 and audit.verdict == NON_FINITE


# -- tensors: the tolerance table -----------------------------------------------------------

def test_every_float_dtype_has_one_row_with_every_metric():
    for name, row in TABLE.items():
        assert row.dtype == name
        assert 0 < row.max_abs and 0 < row.max_rel and 0 < row.nmse and 0 < row.near_tie_margin
    with pytest.raises(KeyError, match="no tolerance row"):
        tolerance_for("int8")


@pytest.mark.claim("logits_within_tolerance")
def test_tensors_within_tolerance_pass_and_outside_fail():
    rng = np.random.default_rng(0)
    ref = rng.standard_normal(1000).astype(np.float32)
    tol = tolerance_for("float32")
    assert compare_tensors(ref + tol.max_abs / 10, ref).ok
    bad = ref.copy()
    bad[17] += 1.0
    result = compare_tensors(bad, ref)
    assert not result.ok and result.max_abs == pytest.approx(1.0, rel=1e-6)
    assert "nmse" in result.reason


@pytest.mark.claim("finite_logits", "logits_within_tolerance")
def test_nan_never_passes_and_infinities_must_match_in_sign():
    ref = np.array([1.0, np.inf, -np.inf], dtype=np.float32)
    assert compare_tensors(ref.copy(), ref).ok
    assert not compare_tensors(np.array([1.0, np.inf, np.inf], np.float32), ref).ok
    nan = np.array([np.nan, 1.0], np.float32)
    assert not compare_tensors(nan, nan).ok
    assert not compare_tensors(np.ones(3, np.float32), np.ones(2, np.float32)).ok
