"""CUDA graph slots on native-cuda (claim 6), with claims 1, 3, 4 and 5 held while replaying.

Every test here is marked ``gpu`` (skipped without CUDA, a failure under
``--require-gpu``). What is checked on the device:

- greedy decoding on every ``static`` fixture captures PRIMARY once and replays every
  later step, never falls back nor invalidates, and its tokens equal the oracle's and the
  same engine's with graphs off;
- replay integrity: with the outputs poisoned (NaN) before every replay the stream still
  equals the oracle; a graph whose outputs are detached (writes nothing the caller reads)
  is caught by the poison, and one reading a stale input buffer is caught by the bitwise
  comparison with the eager forward, which equals a good replay;
- PRIMARY (M=1) and VERIFY (M=W+1) interleaved over many steps, each reset on its own,
  equal the eager engine bit for bit, and each keeps replaying after the other's reset;
- a capture-unsafe op (cuBLAS through ``cupy.matmul``) makes the slot fall back once,
  counted, and the stream stays equal to the oracle;
- 100 replayed decode steps leave the live allocations (slot pools included) unchanged
  exactly, in a process of its own (``suites/gpu_memory_probe.py``, mode ``graphs``);
- on a warm engine, a greedy decode stages nothing (ledger and transfer guard), reads back
  exactly 4 bytes per token, and moves host-to-device only the prompt's ids and positions.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from engines.errors import InputError
from engines.native.graph_slots import GraphSlot, SlotStatus, graphs_default
from engines.oracle import oracle_decode
from engines.workflow import DecodeSession, greedy_decode
from suites.support import fixture_names, write_figure

pytestmark = pytest.mark.gpu
NEW_TOKENS = 24
STATIC = [name for name in fixture_names() if name.endswith("_static")]
ROOT = Path(__file__).resolve().parents[1]
FREE_MEMORY_DRIFT = 64 * 2**20  # bytes, as in test_native_cuda_decode.py




def make_engine(package, **options):
    from engines.backends.native_cuda import NativeCudaEngine

    return NativeCudaEngine(package, **options)


def host(engine, value) -> np.ndarray:
    """Test-side readback, ordered on the engine's stream."""
    import cupy

    return cupy.asnumpy(value, stream=engine.stream)


def slot_counters(ledger, slot: GraphSlot) -> tuple[int, int, int, int, int]:
    c = ledger.slot(slot.value)
    return c.captures, c.replays, c.fallbacks, c.invalidations, c.resets


def test_static_fixtures_are_listed_and_static(packages):
    assert {"tiny_llama_static", "tiny_llama_pair_static"} <= set(STATIC)
    for name in STATIC:
        assert graphs_default(packages[name].spec), name


# -- greedy: capture once, replay every later step ---------------------------------------------

@pytest.mark.claim("graph_replay", "token_identity", "zero_staging", "readback_budget")
@pytest.mark.parametrize("package_name", STATIC)
def test_greedy_captures_primary_once_and_replays_every_later_step(cp, packages, package_name):
    from harness.transfer_guard import transfer_guard

    package = packages[package_name]
    engine = make_engine(package)
    eager = make_engine(package, graphs=False)
    assert engine.graphs and not eager.graphs
    try:
        for prompt in package.spec.prompts:
            oracle = oracle_decode(package, prompt, NEW_TOKENS)
            plain = greedy_decode(eager, prompt, NEW_TOKENS)
            engine.reset_graphs()  # every prompt captures afresh
            with transfer_guard("disallow") as guard:
                result = greedy_decode(engine, prompt, NEW_TOKENS)
            assert result.tokens == oracle.tokens == plain.tokens
            led = result.ledger
            steps = led.forwards["decode"]
            assert steps == len(result.tokens) - 1 == NEW_TOKENS - 1
            state = engine.slots[GraphSlot.PRIMARY]
            assert slot_counters(led, GraphSlot.PRIMARY) == (1, steps - 1, 0, 0, 0), state.describe()
            assert state.status is SlotStatus.CAPTURED
            assert slot_counters(led, GraphSlot.VERIFY) == (0, 0, 0, 0, 0)
            assert sum(slot_counters(plain.ledger, GraphSlot.PRIMARY)) == 0
            assert led.host_staging == 0 and guard.staging_count == 0, guard.staging_sites
            assert led.readback_bytes["token_id"] == 4 * len(result.tokens)
            assert guard.readback_bytes["token_id"] == led.readback_bytes["token_id"]
    finally:
        engine.close()
        eager.close()


# -- replay integrity ------------------------------------------------------------------------------

@pytest.mark.claim("graph_replay", "token_identity")
@pytest.mark.parametrize("package_name", STATIC)
def test_poisoned_replays_still_equal_the_oracle(cp, packages, package_name):
    package = packages[package_name]
    engine = make_engine(package, poison_outputs=True)
    try:
        for prompt in package.spec.prompts:
            engine.reset_graphs()
            result = greedy_decode(engine, prompt, NEW_TOKENS)
            assert result.tokens == oracle_decode(package, prompt, NEW_TOKENS).tokens
            steps = result.ledger.forwards["decode"]
            assert slot_counters(result.ledger, GraphSlot.PRIMARY) == (1, steps - 1, 0, 0, 0)
    finally:
        engine.close()


@pytest.mark.claim("graph_replay", "token_identity")
@pytest.mark.parametrize("package_name", STATIC)
def test_a_prompt_length_seen_twice_replays_its_prefill_with_the_eager_bits(cp, packages,
                                                                            package_name):
    """``prefill_graphs.py`` on the device: a length's first prefill eager, its second
    captured, later ones replayed (outputs poisoned before each replay); every prefill's
    logits are the graphs-off engine's bit for bit, and the decode that follows a replayed
    prefill (it reads the graph's kv outputs) gives the same tokens."""
    package = packages[package_name]
    engine = make_engine(package, poison_outputs=True)
    eager = make_engine(package, graphs=False)
    try:
        for prompt in package.spec.prompts:
            engine.reset_graphs()
            want = host(eager, DecodeSession(eager).forward(prompt, "prefill")["logits"])
            tokens = greedy_decode(eager, prompt, NEW_TOKENS).tokens
            replayed = []
            for _ in range(3):
                got = host(engine, DecodeSession(engine).forward(prompt, "prefill")["logits"])
                replayed.append(engine.slots.replayed)
                assert got.tobytes() == want.tobytes()
                result = greedy_decode(engine, prompt, NEW_TOKENS)
                replayed.append(result.ledger.slot("PREFILL").replays == 1)
                assert result.tokens == tokens
            assert replayed == [False, False, True, True, True, True]
            assert engine.ledger.slot("PREFILL").fallbacks == 0
    finally:
        engine.close()
        eager.close()


def _after_capture(engine, prompt):
    """A session past its prefill and one decode step (PRIMARY captured); the next token."""
    session = DecodeSession(engine)
    out = session.forward(prompt, "prefill")
    token = session.last_token(out["logits"])
    out = session.forward([token], "decode")
    assert engine.slots[GraphSlot.PRIMARY].status is SlotStatus.CAPTURED
    return session, session.last_token(out["logits"])


@pytest.mark.claim("graph_replay")
def test_a_replay_that_writes_nothing_is_caught_by_the_poison(cp, packages):
    package = packages["tiny_llama_static"]
    engine = make_engine(package, poison_outputs=True)
    try:
        session, token = _after_capture(engine, list(package.spec.prompts[0]))
        state = engine.slots[GraphSlot.PRIMARY]
        # sabotage: the caller now gets buffers the graph never writes
        with engine.stream:
            state.outputs = {name: cp.empty_like(buf) for name, buf in state.outputs.items()}
        out = session.forward([token], "decode")
        assert engine.ledger.slot("PRIMARY").replays == 1
        assert np.isnan(host(engine, out["logits"])).all()
        with pytest.raises(InputError, match="all NaN"):
            session.last_token(out["logits"])
    finally:
        engine.close()


@pytest.mark.claim("graph_replay")
def test_a_replay_reading_a_stale_input_is_caught_by_the_eager_comparison(cp, packages):
    """A good replay equals the eager forward bit for bit; a graph left reading the tokens
    buffer it captured (the feed now copied elsewhere) does not."""
    package = packages["tiny_llama_static"]
    prompt = list(package.spec.prompts[0])
    engine = make_engine(package, poison_outputs=True)
    eager = make_engine(package, graphs=False)
    try:
        g_session, token = _after_capture(engine, prompt)
        e_session, e_token = _after_capture_eager(eager, prompt)
        assert token == e_token
        vocab = package.spec.vocab_size
        tokens_name = package.spec.components["target"].inputs["tokens"]
        for step in range(3):  # positive control: good replays, bit for bit
            t = (token + 5 * step + 1) % vocab
            g = host(engine, g_session.forward([t], "decode")["logits"])
            e = host(eager, e_session.forward([t], "decode")["logits"])
            assert g.tobytes() == e.tobytes(), step
        state = engine.slots[GraphSlot.PRIMARY]
        with engine.stream:
            state.inputs = dict(state.inputs, **{tokens_name: cp.empty_like(state.inputs[tokens_name])})
        t = (token + 29) % vocab
        g = host(engine, g_session.forward([t], "decode")["logits"])
        e = host(eager, e_session.forward([t], "decode")["logits"])
        assert np.isfinite(g).all()  # the graph wrote its outputs ...
        assert g.tobytes() != e.tobytes()  # ... from the stale token, and it shows
    finally:
        engine.close()
        eager.close()


def _after_capture_eager(engine, prompt):
    session = DecodeSession(engine)
    out = session.forward(prompt, "prefill")
    token = session.last_token(out["logits"])
    out = session.forward([token], "decode")
    return session, session.last_token(out["logits"])


# -- two slots, interleaved, reset independently -----------------------------------------------------

@pytest.mark.claim("graph_replay")
@pytest.mark.parametrize("package_name", STATIC)
def test_primary_and_verify_interleave_and_reset_independently(cp, packages, package_name):
    package = packages[package_name]
    spec = package.spec
    prompt = list(spec.prompts[0])
    width = 2  # VERIFY forwards run W + 1 = 3 positions
    engine = make_engine(package, poison_outputs=True)
    eager = make_engine(package, graphs=False)
    try:
        g_session, e_session = DecodeSession(engine), DecodeSession(eager)
        g_session.forward(prompt, "prefill")
        e_session.forward(prompt, "prefill")
        position = len(prompt)
        rounds = (spec.max_context - position) // (1 + width + 1)
        assert rounds >= 12
        forwards = {GraphSlot.PRIMARY: 0, GraphSlot.VERIFY: 0}
        for r in range(rounds):
            if r == rounds // 3:
                engine.reset_slot(GraphSlot.PRIMARY)
                assert engine.slots[GraphSlot.VERIFY].status is SlotStatus.CAPTURED
            if r == 2 * rounds // 3:
                engine.reset_slot(GraphSlot.VERIFY)
                assert engine.slots[GraphSlot.PRIMARY].status is SlotStatus.CAPTURED
            for phase, m in (("decode", 1), ("verify", width + 1)):
                ids = [(7 * (position + i) + 3) % spec.vocab_size for i in range(m)]
                g = host(engine, g_session.forward(ids, phase)["logits"])
                e = host(eager, e_session.forward(ids, phase)["logits"])
                assert np.isfinite(g).all()
                assert g.tobytes() == e.tobytes(), (r, phase)
                position += m
                forwards[GraphSlot.PRIMARY if phase == "decode" else GraphSlot.VERIFY] += 1
        led = engine.ledger
        for slot, n in forwards.items():
            captures, replays, fallbacks, invalidations, resets = slot_counters(led, slot)
            assert (captures, fallbacks, invalidations, resets) == (2, 0, 0, 1), slot
            assert replays == n - 2, slot
    finally:
        engine.close()
        eager.close()


# -- fallback ---------------------------------------------------------------------------------------

@pytest.mark.claim("graph_replay", "token_identity")
def test_a_capture_unsafe_op_falls_back_once_and_stays_correct(cp, packages, monkeypatch):
    package = packages["tiny_llama_static"]
    prompt = list(package.spec.prompts[0])
    engine = make_engine(package)
    with engine.stream:
        small = cp.ones((2, 2), dtype=cp.float32)
    real = engine.backend.matmul

    def unsafe(a, b):
        cp.matmul(small, small)  # cuBLAS: fine eagerly, refused during stream capture
        return real(a, b)

    monkeypatch.setattr(engine.backend, "matmul", unsafe)
    try:
        result = greedy_decode(engine, prompt, NEW_TOKENS)
        assert result.tokens == oracle_decode(package, prompt, NEW_TOKENS).tokens
        steps = result.ledger.forwards["decode"]
        state = engine.slots[GraphSlot.PRIMARY]
        assert slot_counters(result.ledger, GraphSlot.PRIMARY) == (0, 0, steps, 0, 0)
        assert state.status is SlotStatus.FALLBACK and state.capture_attempts == 1
        assert "cuBLAS" in state.failure, state.failure
        assert result.ledger.host_staging == 0
    finally:
        engine.close()


# -- memory, crossings -----------------------------------------------------------------------------

@pytest.mark.claim("flat_memory", "graph_replay")
@pytest.mark.parametrize("package_name", STATIC)
def test_device_memory_stays_flat_across_replays(cp, package_name, evidence_dir):
    steps = 100
    proc = subprocess.run([sys.executable, "-m", "suites.gpu_memory_probe", package_name,
                           str(steps), "graphs"], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    probe = json.loads(proc.stdout.strip().splitlines()[-1])
    write_figure(evidence_dir, f"memory_flatness_graphs_{package_name}", probe)
    assert probe["graphs"]
    primary = probe["graph_slots"]["PRIMARY"]
    assert (primary["captures"], primary["replays"], primary["fallbacks"]) == (0, steps + 1, 0)
    series = probe["series"]
    assert len(series) == steps + 1
    first = series[0]
    assert first["live_allocations"] > 0
    assert all(s["live_allocations"] == first["live_allocations"] for s in series), series[:5]
    assert all(s["live_bytes"] == first["live_bytes"] for s in series)
    assert abs(probe["free_before"] - probe["free_after"]) <= FREE_MEMORY_DRIFT
    assert probe["host_staging"] == 0


@pytest.mark.claim("zero_staging", "readback_budget", "token_identity")
@pytest.mark.parametrize("graphs", [True, False], ids=["graphs", "eager"])
@pytest.mark.parametrize("package_name", STATIC)
def test_a_warm_greedy_decode_moves_only_the_prompt_and_token_ids(cp, packages, package_name,
                                                                   graphs):
    """No per-step host-to-device copy (the next token's id and position are made on the
    device, host-resolved values are cached there), exactly 4 bytes back per token."""
    from harness.transfer_guard import transfer_guard

    package = packages[package_name]
    engine = make_engine(package, graphs=graphs)
    try:
        for prompt in package.spec.prompts:
            greedy_decode(engine, prompt, NEW_TOKENS)  # warm: captured, host values cached
            with transfer_guard("disallow") as guard:
                result = greedy_decode(engine, prompt, NEW_TOKENS)
            assert result.tokens == oracle_decode(package, prompt, NEW_TOKENS).tokens
            led = result.ledger
            assert led.h2d_bytes == 2 * 8 * len(prompt) and led.h2d_count == 2  # ids, positions
            assert led.host_staging == 0 and guard.staging_count == 0, guard.staging_sites
            assert led.readback_bytes["token_id"] == 4 * len(result.tokens)
            assert guard.readback_bytes["token_id"] == 4 * len(result.tokens)
            assert led.readback_count["token_id"] == len(result.tokens)
            steps = led.forwards["decode"]
            want = (0, steps, 0, 0, 0) if graphs else (0, 0, 0, 0, 0)
            assert slot_counters(led, GraphSlot.PRIMARY) == want
    finally:
        engine.close()


@pytest.mark.claim("tensor_ops")
def test_device_feed_ops_equal_the_host_ops(cp, packages):
    from engines.ledger import Ledger
    from engines.tensor_ops.host import HostTensorOps

    engine = make_engine(packages["tiny_llama_static"], graphs=False)
    ops, ref = engine.tensor_ops, HostTensorOps(Ledger())
    rng = np.random.default_rng(5)
    try:
        for dtype in (np.float32, np.float16):
            logits = rng.standard_normal((1, 97)).astype(dtype)
            logits[0, [3, 40]] = logits.max() + 1  # a tie: the lower index wins
            token, feed = ops.next_token_feed(ops.adopt(logits))
            want, want_feed = ref.next_token_feed(logits)
            assert token == want == 3
            assert feed.dtype == np.int64 and feed.shape == (1, 1)
            assert host(engine, feed).tolist() == want_feed.tolist()
        positions = np.arange(5, 9, dtype=np.int64).reshape(1, 4)
        nxt = ops.advance_positions(ops.adopt(positions))
        assert nxt.dtype == np.int64 and host(engine, nxt).tolist() == [[9]]
        assert ops.ledger.readback_bytes["token_id"] == 8  # two ids, 4 bytes each
    finally:
        engine.close()


# -- speculative: both slots replay ------------------------------------------------------------

@pytest.mark.claim("graph_replay", "spec_equals_greedy", "zero_staging", "readback_budget")
@pytest.mark.parametrize("width", [1, 2, 4])
def test_speculative_replays_primary_for_proposals_and_verify_for_verification(cp, packages,
                                                                               width):
    """On a static draft-model package, the draft model's single-position steps replay in
    PRIMARY and the target's W+1-position verifications in VERIFY; neither falls back; the
    stream equals greedy; nothing is staged (ledger and guard) and the readback is exact."""
    from engines.workflow.speculative import speculative_decode
    from harness.budgets import expected_readback
    from harness.transfer_guard import transfer_guard

    package = packages["tiny_llama_pair_static"]
    engine = make_engine(package)
    try:
        prompt = list(package.spec.prompts[0])
        want = oracle_decode(package, prompt, NEW_TOKENS).tokens
        speculative_decode(engine, prompt, NEW_TOKENS, width)  # captures
        with transfer_guard("disallow") as guard:
            result = speculative_decode(engine, prompt, NEW_TOKENS, width)
        assert result.tokens == want
        led = result.ledger
        primary, verify = led.slot("PRIMARY"), led.slot("VERIFY")
        assert primary.replays >= 1 and verify.replays >= 1, (vars(primary), vars(verify))
        assert primary.fallbacks == 0 and verify.fallbacks == 0
        assert verify.captures + verify.replays + verify.fallbacks == led.forwards["verify"]
        assert led.host_staging == 0 and guard.staging_count == 0, guard.staging_sites
        budget, _ = expected_readback(result)
        assert led.readback_total == budget == sum(guard.readback_bytes.values())
    finally:
        engine.close()
