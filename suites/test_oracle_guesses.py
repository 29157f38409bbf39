"""Greedy streams kept to guess the oracle's own stream (``harness.oracle_guesses``): a later
judge of the same package content guesses from them without decoding again, and a kept stream
stays a guess: a wrong one costs forwards, never a token."""
from __future__ import annotations

import harness.package_judge as package_judge
from engines.oracle import RECOMPUTE, oracle_for
from harness.oracle_guesses import GreedyStreams
from harness.packages import resolve_package

TOKENS = 12


def _counting(tokens_of):
    calls = []

    def decode(ids, n):
        calls.append((tuple(ids), n))
        return tokens_of(ids, n)
    return decode, calls


def test_a_kept_stream_serves_every_prefix_it_extends():
    streams = GreedyStreams()
    decode, calls = _counting(lambda ids, n: [100 + i for i in range(n)])
    assert streams.guess("s", [1, 2], 5, None, decode) == [100, 101, 102, 103, 104]
    assert streams.guess("s", [1, 2, 100, 101], 3, None, decode) == [102, 103, 104]
    assert len(calls) == 1
    # past its end, under another source, or off its path: decoded (and kept) again
    streams.guess("s", [1, 2, 100], 9, None, decode)
    streams.guess("t", [1, 2], 2, None, decode)
    streams.guess("s", [1, 2, 7], 2, None, decode)
    assert [c[0] for c in calls[1:]] == [(1, 2, 100), (1, 2), (1, 2, 7)]


def test_a_stream_that_ended_at_eos_answers_a_longer_ask():
    streams = GreedyStreams()
    decode, calls = _counting(lambda ids, n: [5, 6, 0])  # 0: eos
    assert streams.guess("s", [1], 10, 0, decode) == [5, 6, 0]
    assert streams.guess("s", [1, 5], 10, 0, decode) == [6, 0]
    assert len(calls) == 1
    no_eos = GreedyStreams()  # without an eos a short stream is no answer to a longer ask
    no_eos.guess("s", [1], 10, None, decode)
    no_eos.guess("s", [1], 10, None, decode)
    assert len(calls) == 3


def test_a_second_judge_of_the_same_package_guesses_without_decoding(monkeypatch):
    """Two oracles as two runs build them, one process: the stream both judge leaves the
    oracle's at step 2; the second's guess comes from the first's decode, its forwards and
    tokens are the first's."""
    package = resolve_package("tiny_llama")
    prompt = list(package.spec.prompts[0])
    truth = oracle_for(package, mode=RECOMPUTE).decode(prompt, TOKENS).tokens
    wrong = truth[:2] + [(t + 1) % package.spec.vocab_size for t in truth[2:]]
    monkeypatch.setattr(package_judge, "STREAMS", GreedyStreams())
    decodes = []
    real = package_judge.greedy_decode
    monkeypatch.setattr(package_judge, "greedy_decode",
                        lambda engine, ids, n: decodes.append(n) or real(engine, ids, n))
    first = package_judge.with_guesser(oracle_for(package))
    second = package_judge.with_guesser(oracle_for(package))
    assert first.decode(prompt, TOKENS, wrong).tokens == truth
    assert second.decode(prompt, TOKENS, wrong).tokens == truth
    assert len(decodes) == 1
    assert (second.cost.forwards, second.cost.guesses) == (first.cost.forwards,
                                                            first.cost.guesses) == (2, 1)


def test_a_wrong_kept_stream_costs_forwards_never_a_token(monkeypatch):
    """A kept stream that is wrong from its first token: the oracle still finds its own
    stream (each guessed token is verified), paying a forward more than a true one costs."""
    package = resolve_package("tiny_llama")
    prompt = list(package.spec.prompts[0])
    truth = oracle_for(package, mode=RECOMPUTE).decode(prompt, TOKENS).tokens
    costs = []
    for lie in (False, True):
        kept = GreedyStreams()
        monkeypatch.setattr(package_judge, "STREAMS", kept)
        oracle = package_judge.with_guesser(oracle_for(package))
        if lie:
            source = package_judge.guess_source(oracle.engine, "target")
            liar = [(t + 3) % package.spec.vocab_size for t in truth]
            kept.guess(source, prompt, TOKENS, None, lambda ids, n: liar[:n])
        assert oracle.decode(prompt, TOKENS).tokens == truth
        costs.append(oracle.cost.forwards)
    assert costs[1] > costs[0] == 1


def test_a_package_without_a_content_hash_is_not_kept(monkeypatch):
    package = resolve_package("tiny_llama")
    oracle = oracle_for(package)
    monkeypatch.setattr(oracle.engine.package, "content_hash", None)
    kept = GreedyStreams()
    monkeypatch.setattr(package_judge, "STREAMS", kept)
    package_judge.with_guesser(oracle)
    assert len(oracle.guesser(list(package.spec.prompts[0]), 3)) == 3
    assert not kept._by_source
