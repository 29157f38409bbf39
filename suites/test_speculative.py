"""Claim 1 for speculative decoding on the host engines: at every width the speculative
stream equals the greedy stream equals the oracle, token for token, and the tallies say
that rejections, rollbacks and full accepts all really happened."""
from __future__ import annotations

import numpy as np
import pytest
from onnx import numpy_helper

from engines.errors import InputError
from engines.oracle import oracle_decode
from engines.workflow import greedy_decode
from engines.workflow.proposers import CarryProposer
from engines.workflow.speculative import SpeculativeSession, speculative_decode
from harness.catalog import lookup_chained
from harness.catalog.builtin import speculative_fixtures
from suites.support import HOST_ENGINES

NEW_TOKENS = 32
SPECULATIVE = speculative_fixtures()
CELLS = [(name, width) for name, top in SPECULATIVE.items() for width in range(1, top + 1)]

_greedy: dict = {}
_oracle: dict = {}


def greedy_stream(engine, package, i):
    key = (engine.name, package.spec.name, i)
    if key not in _greedy:
        _greedy[key] = greedy_decode(engine, package.spec.prompts[i], NEW_TOKENS).tokens
    return _greedy[key]


def oracle_stream(package, i):
    key = (package.spec.name, i)
    if key not in _oracle:
        _oracle[key] = oracle_decode(package, package.spec.prompts[i], NEW_TOKENS).tokens
    return _oracle[key]


def check_tallies(result, package) -> None:
    """The ledger agrees with the rounds the result reports, phase by phase."""
    sp = package.spec.decoding.speculative
    led, acc, widths = result.ledger, result.acceptance_per_round, result.widths_per_round
    partial = [(n, w) for n, w in zip(acc, widths) if n < w]
    assert len(acc) == len(widths) == len(result.drafts_per_round) == led.proposals
    assert all(len(d) == w for d, w in zip(result.drafts_per_round, widths))
    assert all(1 <= w <= result.width for w in widths)
    assert led.accepted == sum(acc)
    assert led.rejected == sum(w - n for n, w in zip(acc, widths))
    assert led.full_accepts == sum(n == w for n, w in zip(acc, widths))
    assert led.rollbacks == len(partial)
    assert led.forwards["prefill"] == 1
    assert led.forwards["verify"] == led.proposals
    assert led.forward_positions["verify"] == sum(w + 1 for w in widths)
    if sp.snapshot:
        assert led.snapshots == led.proposals and led.restores == len(partial)
        assert led.forwards["readvance"] == len(partial)
        assert led.forward_positions["readvance"] == sum(n + 1 for n, _ in partial)
    else:
        assert led.snapshots == led.restores == led.forwards["readvance"] == 0
    own_cells = bool(package.spec.state_of(sp.proposer))
    if sp.kind == "draft" or not own_cells:
        assert led.forwards["propose"] == sum(widths)  # one proposer forward per draft
    # every token is the prefill's, a round's (accepted + bonus) or a last decode step's
    assert len(result.tokens) == 1 + sum(n + 1 for n in acc) + led.forwards["decode"]
    assert led.forwards["decode"] <= 1
    # host engines: nothing crosses, nothing is staged
    assert led.readback_total == 0 and led.h2d_bytes == 0 and led.host_staging == 0


@pytest.mark.claim("spec_equals_greedy", "token_identity")
@pytest.mark.parametrize("package_name,width", CELLS, ids=[f"{n}-w{w}" for n, w in CELLS])
@pytest.mark.parametrize("engine_name", HOST_ENGINES)
def test_speculative_equals_greedy_equals_oracle(packages, engine_cache, package_name, width,
                                                 engine_name):
    package = packages[package_name]
    engine = engine_cache(engine_name, package)
    totals = {"rejected": 0, "rollbacks": 0, "full_accepts": 0}
    for i, prompt in enumerate(package.spec.prompts):
        result = speculative_decode(engine, prompt, NEW_TOKENS, width)
        assert result.tokens == greedy_stream(engine, package, i), (
            f"{engine_name} {package_name} width {width} prompt {i}: speculative != greedy")
        assert result.tokens == oracle_stream(package, i)
        assert len(result.tokens) == NEW_TOKENS
        check_tallies(result, package)
        for key in totals:
            totals[key] += getattr(result.ledger, key)
    assert all(totals.values()), f"{package_name} width {width} never saw one of: {totals}"


# -- the chained drafter proposes exactly what its contract says --------------------------------
def _initializer(package, component: str, name: str) -> np.ndarray:
    model = package.component_model(component)
    return next(numpy_helper.to_array(t) for t in model.graph.initializer if t.name == name)


def analytic_drafts(package, sequence: list[int], start: int, width: int) -> list[int]:
    """lookup_chained's drafts for a round starting at ``start`` (L), from its tables: the
    carry seeded with the target's hidden at L-1, the cache feature from the key at L-1."""
    keys = _initializer(package, "target", "key_token_0")
    key_pos = _initializer(package, "target", "key_position_0")
    hidden = _initializer(package, "target", "hidden_table_0")
    carry_table = _initializer(package, "drafter", "carry_table_0")
    last = sequence[start - 1]
    kv = float(keys[last, 0] + key_pos[start - 1, 0])
    carry = float(hidden[last, 0])
    token, drafts = sequence[start], []
    for _ in range(width):
        drafts.append(lookup_chained.draft_next_token(token, kv, carry))
        carry = float(np.tanh(2.0 * carry_table[token, 0] + 0.5 * carry))
        token = drafts[-1]
    return drafts


def rounds_match_the_contract(package, result) -> bool:
    sequence = list(result.prompt) + list(result.tokens)
    return all(drafts == analytic_drafts(package, sequence, start, len(drafts))
               for drafts, start in zip(result.drafts_per_round, result.start_per_round))


@pytest.mark.claim("spec_equals_greedy")
@pytest.mark.parametrize("width", range(1, SPECULATIVE["lookup_chained"] + 1))
@pytest.mark.parametrize("engine_name", HOST_ENGINES)
def test_chained_drafts_follow_seed_carry_and_borrowed_cache(packages, engine_cache,
                                                             engine_name, width):
    package = packages["lookup_chained"]
    engine = engine_cache(engine_name, package)
    for prompt in package.spec.prompts:
        result = speculative_decode(engine, prompt, NEW_TOKENS, width)
        assert rounds_match_the_contract(package, result)


@pytest.mark.claim("spec_equals_greedy")
def test_a_drafter_bound_to_the_seed_cache_is_caught(packages, engine_cache):
    """Binding the borrowed cell to its initial (seed) value instead of the target's latest
    output changes the drafts; verification still keeps the stream right, so only a check
    of the drafts against the contract can catch it, and it does at every width."""
    package = packages["lookup_chained"]
    engine = engine_cache("native-host", package)
    for width in range(1, SPECULATIVE["lookup_chained"] + 1):
        caught = []
        for i, prompt in enumerate(package.spec.prompts):
            engine.reset_ledger()
            session = SpeculativeSession(engine)
            assert isinstance(session.proposer, CarryProposer)
            seed = {port: engine.tensor_ops.zeros(tuple(package.spec.state[cell].shape),
                                                  np.float32)
                    for port, cell in package.spec.decoding.speculative.borrows.items()}
            session.proposer._borrowed = lambda: seed  # the bug: bound from the seed
            wrong = session.decode(prompt, NEW_TOKENS, width)
            right = speculative_decode(engine, prompt, NEW_TOKENS, width)
            assert wrong.tokens == right.tokens == greedy_stream(engine, package, i)
            assert rounds_match_the_contract(package, right)
            caught.append(not rounds_match_the_contract(package, wrong))
        assert any(caught), f"width {width}: the seed-bound drafter went unnoticed"


@pytest.mark.claim("spec_equals_greedy")
def test_a_carry_seeded_from_the_wrong_row_is_caught(packages, engine_cache):
    """Seeding from the verify output's last row even after a rejection is caught."""
    package = packages["lookup_chained"]
    engine = engine_cache("onnx-reference", package)
    caught = []
    for width in range(2, SPECULATIVE["lookup_chained"] + 1):
        for i, prompt in enumerate(package.spec.prompts):
            engine.reset_ledger()
            session = SpeculativeSession(engine)
            right_seed = session.proposer.seed_from
            session.proposer.seed_from = (  # the bug
                lambda out, row, seed=right_seed: seed(out, out["hidden"].shape[1] - 1))
            wrong = session.decode(prompt, NEW_TOKENS, width)
            assert wrong.tokens == greedy_stream(engine, package, i)
            caught.append(not rounds_match_the_contract(package, wrong))
    assert any(caught)


# -- requests that cannot be served -----------------------------------------------------------
@pytest.mark.parametrize("width", [0, -1, 5, 99, True, 2.0])
def test_width_outside_one_to_max_width_is_an_input_error(packages, engine_cache, width):
    package = packages["lookup_chained"]
    engine = engine_cache("native-host", package)
    with pytest.raises(InputError) as info:
        speculative_decode(engine, package.spec.prompts[0], 8, width)
    err = info.value
    assert err.field == "width" and err.value == width
    assert "1..4" in err.remedy and "max_width" in err.remedy


def test_a_package_without_a_speculative_section_is_refused(packages, engine_cache):
    package = packages["tiny_llama"]
    engine = engine_cache("native-host", package)
    with pytest.raises(InputError) as info:
        speculative_decode(engine, package.spec.prompts[0], 8, 1)
    assert info.value.field == "decoding.speculative"
    assert "greedily" in info.value.remedy


@pytest.mark.parametrize("name", list(SPECULATIVE))
def test_catalog_max_width_matches_the_built_package(packages, name):
    sp = packages[name].spec.decoding.speculative
    assert sp is not None and sp.max_width == SPECULATIVE[name]


def test_every_fixture_with_a_speculative_section_is_in_the_speculative_table(packages):
    declared = {n for n, p in packages.items() if p.spec.decoding.speculative is not None}
    assert declared == set(SPECULATIVE)


@pytest.mark.claim("spec_equals_greedy")
def test_stop_at_max_new_tokens_exactly_like_greedy(packages, engine_cache):
    """Lengths 1..9 at width 4: the last round narrows, a last single token is a decode."""
    package = packages["tiny_llama_pair"]
    engine = engine_cache("native-host", package)
    prompt = package.spec.prompts[1]
    full = greedy_stream(engine, package, 1)
    for n in range(1, 10):
        result = speculative_decode(engine, prompt, n, 4)
        assert result.tokens == full[:n]
        assert all(w <= 4 for w in result.widths_per_round)


@pytest.mark.claim("spec_equals_greedy", "snapshot_budget")
def test_host_snapshot_variant_decodes_the_same(packages, engine_cache):
    package = packages["tiny_llama_pair_static"]
    engine = engine_cache("ort-cpu", package)
    prompt = package.spec.prompts[2]
    device = speculative_decode(engine, prompt, NEW_TOKENS, 3, snapshot_mode="device")
    host = speculative_decode(engine, prompt, NEW_TOKENS, 3, snapshot_mode="host")
    assert host.tokens == device.tokens == greedy_stream(engine, package, 2)
    assert host.acceptance_per_round == device.acceptance_per_round


# -- the runner and the CLI ------------------------------------------------------------------
@pytest.mark.claim("spec_equals_greedy", "token_identity")
def test_cli_speculative_matrix_writes_one_record_per_width(tmp_path, capsys):
    from harness.cli import main
    from harness.evidence import EvidenceRecord

    status = main(["run", "--mode", "speculative", "--width", "all", "--engines", "native-host",
                   "--packages", "lookup_chained", "--max-new-tokens", "12",
                   "--evidence-dir", str(tmp_path)])
    out = capsys.readouterr().out
    assert status == 0, out
    assert "chained/w4" in out and "12 identical" in out
    records = [EvidenceRecord.model_validate_json(p.read_text())
               for p in sorted(tmp_path.glob("*.json"))]
    assert len(records) == 4 * 3
    assert {(r.mode.kind, r.mode.width) for r in records} == {("chained", w) for w in (1, 2, 3, 4)}
    for r in records:
        assert r.ok and r.verdicts["token_identity"] == "pass"
        assert r.tokens == r.reference.tokens and len(r.tokens) == 12
        assert len(r.acceptance_per_round) == r.ledger.proposals
        assert sum(r.acceptance_per_round) == r.ledger.accepted
        assert r.ledger.forwards["verify"] == r.ledger.proposals


@pytest.mark.parametrize("argv,field", [
    (["--mode", "speculative", "--width", "5", "--packages", "lookup_chained"], "--width"),
    (["--mode", "speculative", "--width", "0", "--packages", "lookup_chained"], "--width"),
    (["--width", "2", "--packages", "lookup_chained"], "--width"),
    (["--mode", "speculative", "--packages", "tiny_llama"], "decoding.speculative"),
])
def test_cli_refuses_bad_speculative_requests(argv, field, capsys):
    from harness.cli import main

    assert main(["run", "--engines", "native-host", "--no-evidence", *argv]) == 2
    err = capsys.readouterr().err
    assert f"[field {field}" in err and "remedy:" in err


@pytest.mark.claim("spec_equals_greedy", "token_identity")
def test_runner_flags_a_speculative_stream_that_leaves_greedy(monkeypatch):
    """A broken acceptance rule (accept every draft) is a defect against greedy and oracle."""
    from engines.tensor_ops.host import HostTensorOps
    from harness import runner

    def accept_all(self, logits2d, drafts, fed=None, head=None):
        return len(drafts), self._argmax(logits2d, len(drafts) + 1)[len(drafts)]

    monkeypatch.setattr(HostTensorOps, "_accept", accept_all)
    summary = runner.run_matrix(["native-host"], ["tiny_llama_pair"], None, 16,
                                mode="speculative", widths=[3])
    assert summary.failed
    assert any(c.status == "defect" and c.mode == "draft/w3" for c in summary.cells)


# -- recurrent cells: snapshot before verification, restore and re-advance on partial accept --
@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    from engines.package import load_package
    from suites.recurrent_pair import build_recurrent_pair

    return load_package(build_recurrent_pair(tmp_path_factory.mktemp("recurrent_pair")))


@pytest.mark.claim("spec_equals_greedy", "token_identity", "snapshot_budget")
@pytest.mark.parametrize("width", range(1, 5))
@pytest.mark.parametrize("engine_name", HOST_ENGINES)
def test_recurrent_target_restores_and_readvances(hybrid, engine_cache, engine_name, width):
    engine = engine_cache(engine_name, hybrid)
    totals = {"rejected": 0, "rollbacks": 0, "full_accepts": 0, "restores": 0}
    for i, prompt in enumerate(hybrid.spec.prompts):
        result = speculative_decode(engine, prompt, NEW_TOKENS, width)
        assert result.tokens == greedy_stream(engine, hybrid, i) == oracle_stream(hybrid, i)
        check_tallies(result, hybrid)  # readvance positions == sum of partially accepted prefixes
        assert result.ledger.forwards["readvance"] == result.ledger.rollbacks
        for key in totals:
            totals[key] += getattr(result.ledger, key)
    assert all(totals.values()), totals


@pytest.mark.claim("snapshot_budget", "token_identity")
@pytest.mark.parametrize("bug", ["no-restore", "kv-not-rolled-back"])
def test_a_skipped_restore_or_rollback_leaves_the_oracle(hybrid, engine_cache, monkeypatch, bug):
    """The hybrid package's tokens depend on both cells, so either bug is a defect."""
    from engines.workflow.state_service import StateService

    if bug == "no-restore":
        monkeypatch.setattr(StateService, "restore", lambda self: None)
    else:
        monkeypatch.setattr(StateService, "truncate",
                            lambda self, length, names=None: None)
    engine = engine_cache("native-host", hybrid)
    diverged = [speculative_decode(engine, p, NEW_TOKENS, w).tokens != oracle_stream(hybrid, i)
                for w in range(1, 5) for i, p in enumerate(hybrid.spec.prompts)]
    assert any(diverged)


@pytest.mark.claim("snapshot_budget", "spec_equals_greedy")
def test_host_snapshot_comparison_decodes_the_same(hybrid, engine_cache):
    engine = engine_cache("ort-cpu", hybrid)
    prompt = hybrid.spec.prompts[0]
    device = speculative_decode(engine, prompt, NEW_TOKENS, 2, snapshot_mode="device")
    host = speculative_decode(engine, prompt, NEW_TOKENS, 2, snapshot_mode="host")
    assert host.tokens == device.tokens == oracle_stream(hybrid, 0)
    assert host.acceptance_per_round == device.acceptance_per_round
    assert host.ledger.snapshots == device.ledger.snapshots > 0
    assert host.ledger.restores == device.ledger.restores > 0
    assert host.ledger.host_staging == 0  # nothing crosses on a host engine
