"""The hybrid_mtp fixture: deterministic, exact on every host engine, its recurrent state
matters, M positions equal M single steps, and its MTP head both agrees and disagrees."""
from __future__ import annotations

import numpy as np
import pytest
from onnxruntime.capi.onnxruntime_pybind11_state import Fail as OrtFail

from engines.errors import ExecutionError, InputError
from engines.oracle import oracle_decode
from engines.package import load_package
from engines.tolerances import tolerance_for
from engines.workflow import DecodeSession, greedy_decode
from harness.catalog import hybrid_mtp
from harness.catalog.hybrid_graph import HybridConfig, successor
from harness.convert.package_writer import content_hash
from suites.support import HOST_ENGINES
from suites.test_fixtures import check_graph_contract

NEW = 32
TOL = tolerance_for("float32")


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    folder = tmp_path_factory.mktemp("hybrid") / "pkg"
    return load_package(hybrid_mtp.build_hybrid_mtp(folder, hybrid_mtp.DEFAULT_SEED))


@pytest.fixture(scope="module")
def engines(package, engine_cache):
    """One engine per name for this package (the session-wide cache, keyed by package)."""
    return lambda name: engine_cache(name, package)


@pytest.fixture(scope="module")
def oracle_streams(package):
    return {tuple(p): oracle_decode(package, p, NEW) for p in package.spec.prompts}


def zero_state(spec):
    return {c.input: np.zeros(c.shape, dtype=c.dtype) for c in spec.state_of("target").values()}


def target_forward(engine, spec, tokens, start, state):
    """One target forward at positions start..; returns (outputs, new state by input name)."""
    comp = spec.components["target"]
    feeds = {comp.inputs["tokens"]: np.asarray([tokens], dtype=np.int64),
             comp.inputs["positions"]: np.arange(start, start + len(tokens))[None], **state}
    out = {k: np.asarray(v) for k, v in engine.run_component("target", feeds).items()}
    return out, {c.input: out[c.output] for c in spec.state_of("target").values()}


# -- build and contract -----------------------------------------------------------------------

def test_builds_deterministically_and_validates(tmp_path, package):
    seed = hybrid_mtp.DEFAULT_SEED
    first = hybrid_mtp.build_hybrid_mtp(tmp_path / "a", seed)
    again = hybrid_mtp.build_hybrid_mtp(tmp_path / "b", seed)
    other = hybrid_mtp.build_hybrid_mtp(tmp_path / "c", seed + 1)
    assert content_hash(first) == content_hash(again) == package.content_hash
    assert content_hash(other) != content_hash(first)
    for comp in package.spec.components:
        check_graph_contract(package.component_model(comp), "float32")


@pytest.mark.parametrize("field, value, remedy", [("conv_kernel", 1, "conv_kernel 3 or 4"),
                                                  ("vocab", 48, "vocab 64"),
                                                  ("head_dim", 15, "16")])
def test_bad_config_is_a_clear_error(field, value, remedy):
    with pytest.raises(InputError) as err:
        HybridConfig(**{field: value})
    assert err.value.field == field and err.value.value == value
    assert remedy in err.value.remedy


def test_speculative_section_declares_the_mtp_contract(package):
    spec = package.spec
    sp = spec.decoding.speculative
    assert (sp.kind, sp.proposer, sp.target) == ("mtp", "mtp_head", "target")
    assert sp.max_width == hybrid_mtp.MAX_WIDTH in (3, 4)
    assert sp.carry.seed == "hidden" and "hidden" in spec.components["target"].outputs
    assert (sp.carry.input, sp.carry.output) == (spec.components["mtp_head"].inputs["carry"],
                                                 spec.components["mtp_head"].outputs["carry"])
    cells = spec.state_of("target")
    assert sorted(sp.snapshot) == sorted(n for n, c in cells.items() if c.kind == "recurrent")
    assert sorted(sp.rollback) == sorted(n for n, c in cells.items() if c.kind == "kv")
    assert len(sp.snapshot) == 4 and len(sp.rollback) == 2
    assert not spec.state_of("mtp_head")  # the head is stateless: rows are independent


@pytest.mark.claim("token_identity")
def test_oracle_streams_are_well_conditioned_and_context_shaped(package, oracle_streams):
    c = hybrid_mtp.CONFIG
    follows = departs = 0
    for prompt, trace in oracle_streams.items():
        assert trace.min_margin >= 10 * TOL.near_tie_margin
        assert len(set(trace.tokens[NEW // 2:])) >= 8
        seq = list(prompt) + trace.tokens
        for i in range(len(prompt) - 1, len(seq) - 1):
            if seq[i + 1] == successor(c, seq[i]):
                follows += 1
            else:
                departs += 1
    # the skip table's successor mostly wins, and the context overrules it sometimes
    assert follows > departs > 0


# -- exactness --------------------------------------------------------------------------------

@pytest.mark.claim("token_identity")
@pytest.mark.parametrize("engine_name", HOST_ENGINES)
def test_greedy_equals_the_oracle(engines, package, oracle_streams, engine_name):
    engine = engines(engine_name)
    for prompt, trace in oracle_streams.items():
        result = greedy_decode(engine, list(prompt), NEW)
        assert result.tokens == trace.tokens, f"{engine_name} diverges on prompt {prompt}"
        forwards = result.ledger.forwards
        assert (forwards["prefill"], forwards["decode"]) == (1, NEW - 1)  # one token a step


def test_the_interpreter_carries_the_recurrent_cells(engines, package):
    engine = engines("native-host")
    spec = package.spec
    prompt = spec.prompts[1]
    session = DecodeSession(engine)
    session.forward(prompt, "prefill")
    session.forward([5], "decode")
    expected, state = target_forward(engine, spec, prompt, 0, zero_state(spec))
    expected, state = target_forward(engine, spec, [5], len(prompt), state)
    for name, cell in spec.state_of("target").items():
        value = np.asarray(session.cells.cells[name].value)
        assert value.tobytes() == state[cell.input].tobytes(), name
        if cell.kind == "recurrent":
            assert value.shape == tuple(cell.shape) and np.abs(value).max() > 0.01


@pytest.mark.claim("batch_invariance")
@pytest.mark.parametrize("engine_name", ["native-host", "ort-cpu"])
@pytest.mark.parametrize("prefix_len, tokens", [(4, [7]), (3, [9, 27, 50, 2]),
                                                (7, [33, 8, 50, 1, 60, 3, 28, 23, 9])])
def test_m_positions_equal_m_single_positions(engines, package, engine_name, prefix_len,
                                              tokens):
    engine = engines(engine_name)
    spec = package.spec
    prefix = (spec.prompts[1] * 2)[:prefix_len]
    batched, stepped = DecodeSession(engine), DecodeSession(engine)
    batched.forward(prefix, "prefill")
    stepped.forward(prefix, "prefill")
    rows = np.asarray(batched.forward(tokens, "verify")["logits"])[0]
    singles = np.stack([np.asarray(stepped.forward([t], "decode")["logits"])[0, 0]
                        for t in tokens])
    cells_b = {n: np.asarray(c.value) for n, c in batched.cells.cells.items()}
    cells_s = {n: np.asarray(c.value) for n, c in stepped.cells.cells.items()}
    if engine_name == "native-host":  # claim 2: bit for bit
        assert rows.tobytes() == singles.tobytes()
        for name in cells_b:
            assert cells_b[name].tobytes() == cells_s[name].tobytes(), name
    else:
        np.testing.assert_allclose(rows, singles, atol=TOL.max_abs, rtol=TOL.max_rel)
        for name in cells_b:
            np.testing.assert_allclose(cells_b[name], cells_s[name], atol=TOL.max_abs,
                                       rtol=TOL.max_rel)


def test_more_positions_than_the_unrolled_recurrence_fail(engines, package):
    """The recurrence is unrolled over max_context steps: more rows fail, never truncate."""
    spec = package.spec
    too_many = [1] * (spec.max_context + 1)
    with pytest.raises(OrtFail, match="broadcast"):
        target_forward(engines("ort-cpu"), spec, too_many, 0, zero_state(spec))
    with pytest.raises(ExecutionError, match="broadcast"):
        target_forward(engines("native-host"), spec, too_many, 0, zero_state(spec))


# -- the state matters ------------------------------------------------------------------------

def test_every_state_cell_changes_the_logits(engines, package):
    engine = engines("ort-cpu")
    spec = package.spec
    prompt = spec.prompts[1]
    _, state = target_forward(engine, spec, prompt, 0, zero_state(spec))
    step, _ = target_forward(engine, spec, [12], len(prompt), state)
    for name, cell in spec.state_of("target").items():
        assert np.abs(state[cell.input]).max() > 0.01, f"{name} stayed at zero"
        wiped = {**state, cell.input: np.zeros_like(state[cell.input])}
        out, _ = target_forward(engine, spec, [12], len(prompt), wiped)
        assert np.abs(out["logits"] - step["logits"]).max() > 100 * TOL.max_abs, name
    fresh = {**state, **{c.input: np.zeros(c.shape, np.float32)
                         for c in spec.state_of("target").values() if c.kind == "recurrent"}}
    out, _ = target_forward(engine, spec, [12], len(prompt), fresh)
    assert np.abs(out["logits"] - step["logits"]).max() > 0.1


# -- the MTP head -----------------------------------------------------------------------------

def mtp_run(engine, spec, tokens, carry):
    comp = spec.components["mtp_head"]
    out = engine.run_component("mtp_head", {comp.inputs["tokens"]: np.asarray([tokens]),
                                            comp.inputs["carry"]: carry})
    return np.asarray(out[comp.outputs["logits"]]), np.asarray(out[comp.outputs["carry"]])


def accepted_lengths(engine, spec, prompt, stream, width):
    """For every position p of the stream: how many of the head's ``width`` chained
    proposals, seeded from the target's hidden at p and the token at p + 1, are right."""
    seq = list(prompt) + list(stream)
    out, _ = target_forward(engine, spec, seq, 0, zero_state(spec))
    hidden = out[spec.components["target"].outputs["hidden"]]
    lengths = []
    for p in range(len(prompt) - 1, len(seq) - 1 - width):
        carry, token, k = hidden[:, p:p + 1], seq[p + 1], 0
        while k < width:
            logits, carry = mtp_run(engine, spec, [token], carry)
            token = int(logits[0, -1].argmax())
            if token != seq[p + 2 + k]:
                break
            k += 1
        lengths.append(k)
    return lengths


def test_mtp_head_agrees_sometimes_and_disagrees_sometimes(engines, package, oracle_streams):
    engine = engines("ort-cpu")
    spec = package.spec
    width = spec.decoding.speculative.max_width
    lengths = []
    for prompt, trace in oracle_streams.items():
        lengths += accepted_lengths(engine, spec, prompt, trace.tokens, width)
    counts = np.bincount(lengths, minlength=width + 1)
    agree, disagree = int((counts[1:]).sum()), int(counts[0])
    assert agree > disagree > 0, counts        # the first draft: right mostly, not always
    assert counts[width] > 0 and counts[1:width].sum() > 0, counts  # full and partial accepts


@pytest.mark.claim("batch_invariance")
def test_mtp_rows_are_independent_and_the_carry_matters(engines, package):
    engine = engines("native-host")
    spec = package.spec
    rng = np.random.default_rng(0)
    carry = rng.standard_normal((1, 5, hybrid_mtp.CONFIG.hidden)).astype(np.float32)
    tokens = [3, 9, 27, 50, 2]
    logits, carry_out = mtp_run(engine, spec, tokens, carry)
    assert logits.shape == (1, 5, spec.vocab_size) and carry_out.shape == carry.shape
    for i, t in enumerate(tokens):  # row i alone gives row i, bit for bit
        row, row_carry = mtp_run(engine, spec, [t], carry[:, i:i + 1])
        assert row.tobytes() == logits[:, i:i + 1].tobytes()
        assert row_carry.tobytes() == carry_out[:, i:i + 1].tobytes()
    other, _ = mtp_run(engine, spec, tokens, -carry)
    assert np.abs(other - logits).max() > 100 * TOL.max_abs


def greedy_by_hand(engine, spec, prompt, n, corrupt):
    """Greedy decoding that passes the state through ``corrupt(state, position)`` before
    every decode step: the bugs an interpreter could have, planted on purpose."""
    out, state = target_forward(engine, spec, prompt, 0, zero_state(spec))
    tokens = [int(out["logits"][0, -1].argmax())]
    while len(tokens) < n:
        position = len(prompt) + len(tokens) - 1
        out, state = target_forward(engine, spec, tokens[-1:], position,
                                    corrupt(state, position, tokens[-1]))
        tokens.append(int(out["logits"][0, -1].argmax()))
    return tokens


@pytest.mark.claim("token_identity")
def test_recurrent_cells_decide_tokens(engines, package, oracle_streams):
    """Forgetting the recurrent cells, or missing the snapshot restore after rejected drafts
    (every fourth step), changes the greedy stream on every default prompt: token identity
    alone catches either bug."""
    engine = engines("ort-cpu")
    spec = package.spec
    recurrent = [c.input for c in spec.state_of("target").values() if c.kind == "recurrent"]

    def intact(state, position, token):
        return state

    def forgotten(state, position, token):
        return {**state, **{k: np.zeros_like(state[k]) for k in recurrent}}

    def missed_restore(state, position, token):
        if position % 4:
            return state
        rejected = (token + 1) % spec.vocab_size  # a draft verified, then rejected
        _, advanced = target_forward(engine, spec, [rejected], position, state)
        return {**state, **{k: advanced[k] for k in recurrent}}  # kv rolled back, rest not

    for prompt, trace in oracle_streams.items():
        assert greedy_by_hand(engine, spec, list(prompt), NEW, intact) == trace.tokens
        for bug in (forgotten, missed_restore):
            assert greedy_by_hand(engine, spec, list(prompt), NEW, bug) != trace.tokens, (
                f"{bug.__name__} leaves the stream of {prompt} unchanged")
