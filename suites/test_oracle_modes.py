"""The oracle's two modes agree: one forward per stream computes what one forward per prefix
computes (``engines.oracle``).

``stream`` scores a whole stream in one forward (row t is the logits after the first t
tokens); ``recompute`` runs one forward per prefix. Causal attention makes them the same
function, but not the same arithmetic (a longer forward reduces over more masked
positions, and its matrix products have more rows), so the claim is: the same lowest-index
argmax at every step, rows within the float32 logits tolerance, and the same greedy stream.
Shown on every fixture, on ``tied_llama`` (whose top two logits tie exactly at every step,
so the lowest-index rule decides every token) and on SmolLM2: its float32 package and the
float32 twin that judges its reduced-precision conversions.
"""
from __future__ import annotations

import numpy as np
import pytest

from engines.errors import InputError
from engines.oracle import RECOMPUTE, STREAM, Oracle, oracle_for
from engines.tolerances import tolerance_for
from harness.compare import compare_tensors
from harness.judge import lowest_argmax
from harness.package_judge import with_guesser
from harness.packages import fixture_names, resolve_package

TOKENS = 16
FLOAT32 = tolerance_for("float32")


def _agree(package, prompts, tokens: int = TOKENS) -> int:
    """Both modes' greedy streams equal, and every row of it agrees; the rows compared."""
    stream = with_guesser(oracle_for(package, mode=STREAM))  # as the runner builds it
    recompute = oracle_for(package, mode=RECOMPUTE)
    compared = 0
    try:
        for prompt in prompts:
            slow = recompute.decode(prompt, tokens)
            fast = stream.decode(prompt, tokens)
            assert fast.tokens == slow.tokens, (package.spec.name, prompt)
            assert (fast.mode, slow.mode) == (STREAM, RECOMPUTE)
            rows = stream.stream_rows(prompt, slow.tokens)
            for t, row in enumerate(rows):
                want = recompute.row(list(prompt) + slow.tokens[:t])
                assert lowest_argmax(row) == lowest_argmax(want), (package.spec.name, t)
                cmp = compare_tensors(row, want, tol=FLOAT32.logits)
                assert cmp.ok, (package.spec.name, t, cmp.max_abs, cmp.nmse)
                compared += 1
        # one forward per stream in stream mode, one per row in recompute mode
        assert stream.cost.forwards < recompute.cost.forwards
    finally:
        stream.engine.close()
        recompute.engine.close()
    return compared


@pytest.mark.parametrize("name", fixture_names())
def test_both_modes_agree_on_every_fixture(name):
    package = resolve_package(name)
    assert _agree(package, package.spec.prompts[:2]) > 0


def test_lowest_index_ties_are_decided_alike_in_both_modes():
    """tied_llama ties its top two logits bitwise at every step: in stream mode too, so the
    lowest index wins there as well (a longer forward must not break the tie)."""
    package = resolve_package("tied_llama")
    stream = with_guesser(oracle_for(package, mode=STREAM))
    prompt = package.spec.prompts[0]
    trace = stream.decode(prompt, TOKENS)
    for t, row in enumerate(stream.stream_rows(prompt, trace.tokens)[:-1]):
        ordered = np.sort(row)[::-1]
        assert ordered[0] == ordered[1], t  # still an exact tie in one long forward
        assert trace.tokens[t] == int(np.flatnonzero(row == ordered[0])[0])
    assert _agree(package, package.spec.prompts[:1]) > 0


def test_stream_mode_scores_a_stream_in_one_forward_and_shares_prefixes():
    package = resolve_package("tiny_llama")
    oracle = with_guesser(oracle_for(package, mode=STREAM))
    prompt = package.spec.prompts[0]
    stream = oracle.decode(prompt, TOKENS).tokens
    assert oracle.cost.forwards == 1 and oracle.cost.guesses == 1
    forwards = oracle.cost.forwards
    oracle.stream_rows(prompt, stream)  # the judge's rows: already scored
    oracle.stream_rows(prompt, stream[:5])  # a prefix of it: shared
    assert oracle.cost.forwards == forwards
    other = stream[:5] + [(stream[5] + 1) % package.spec.vocab_size]
    oracle.stream_rows(prompt, other)  # parts after 5 tokens: one more forward
    assert oracle.cost.forwards == forwards + 1


@pytest.mark.parametrize("guessing", [False, True], ids=["no-guesser", "interpreter-guesser"])
def test_the_oracle_stream_is_found_whatever_the_guess(guessing):
    """A hint (an engine's stream) or a guesser changes what finding the oracle's stream
    costs, never what it finds: a stream wrong from step 3 on, a guesser that is always wrong,
    ids outside the vocabulary, all give the oracle's own stream."""
    package = resolve_package("tiny_llama")
    prompt = package.spec.prompts[0]
    truth = oracle_for(package, mode=RECOMPUTE).decode(prompt, TOKENS).tokens
    wrong = truth[:3] + [(t + 1) % package.spec.vocab_size for t in truth[3:]]
    for hint in ((), truth, wrong, [10 ** 6] * 4):
        oracle = with_guesser(oracle_for(package)) if guessing else oracle_for(package)
        assert oracle.decode(prompt, TOKENS, hint).tokens == truth
    liar = oracle_for(package)
    liar.guesser = lambda ids, n: [(ids[-1] + 1) % package.spec.vocab_size] * n
    assert liar.decode(prompt, TOKENS).tokens == truth and liar.cost.guesses > 0
    if guessing:  # one decode and one verifying forward after the stream left the truth
        oracle = with_guesser(oracle_for(package))
        oracle.decode(prompt, TOKENS, wrong)
        assert oracle.cost.forwards == 2 and oracle.cost.guesses == 1


def test_a_stream_longer_than_one_forward_can_take_is_refused_naming_the_limit():
    package = resolve_package("tiny_llama")
    oracle = Oracle(package, mode=STREAM)
    limit = package.spec.max_context
    with pytest.raises(InputError) as err:
        oracle.stream_rows([1], [5] * limit)
    assert err.value.field == "max_context" and str(limit) in str(err.value)
    assert "--max-context" in err.value.remedy


def test_an_unknown_oracle_mode_is_refused_by_name():
    with pytest.raises(InputError) as err:
        oracle_for(resolve_package("tiny_llama"), mode="fast")
    assert err.value.field == "oracle_mode" and err.value.value == "fast"


@pytest.mark.real_checkpoint
def test_both_modes_agree_on_smollm2_and_its_reduced_conversions_are_judged_by_it():
    """SmolLM2 in float32 over a text and a chat prompt: real near-ties, 30 layers of
    rounding. Its float16 and bfloat16 conversions declare this very package as the float32
    twin their oracle runs, so the agreement holds for them too."""
    from engines.oracle import reference_package
    from harness.convert.smollm2 import smollm2_package
    from harness.prompts import chat_prompt, resolve_all, text_prompt

    package = resolve_package(smollm2_package(dtype="float32"))
    for dtype in ("float16", "bfloat16"):
        twin = reference_package(resolve_package(smollm2_package(dtype=dtype)))
        assert twin.content_hash == package.content_hash, dtype
    prompts = [list(r.ids) for _, r in resolve_all(
        [text_prompt("Once upon a time, there was a little"),
         chat_prompt([{"role": "user", "content": "What is the capital of France?"}])],
        package, TOKENS)]
    assert _agree(package, prompts) >= 2 * len(prompts)
