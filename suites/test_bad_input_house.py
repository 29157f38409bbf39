"""One rule, one place: the decode state has one owner (cells and position move together),
the package hash and the fixture op list are each defined once."""
from __future__ import annotations

import pytest

from engines.workflow.speculative import SpeculativeSession


def test_the_package_hash_is_defined_once():
    from engines.package.hashing import package_content_hash
    from harness.convert import package_writer

    assert package_writer.content_hash is package_content_hash


def test_the_conformance_suite_requires_exactly_the_ops_the_builder_allows():
    from harness.convert.onnx_graph import ALLOWED_OPS
    from suites.test_op_conformance import FIXTURE_OPS

    assert FIXTURE_OPS == ALLOWED_OPS


def test_the_old_state_service_name_is_the_one_owner():
    from engines.workflow.state import DecodeState
    from engines.workflow.state_service import StateService

    assert StateService is DecodeState


@pytest.mark.parametrize("package_name, partial", [
    ("lookup_chained", False),  # chained over borrowed cells: every round a full accept
    ("tiny_llama_pair", True),  # a draft model with its own cells: rolled back
    ("hybrid_mtp", True),  # recurrent target cells: restored from the snapshot
])
def test_speculative_rounds_leave_cells_and_position_together(packages, engine_cache,
                                                              package_name, partial):
    """After every round (full accepts, partial accepts with restores), the target's and the
    proposer's kv cells hold exactly the committed positions the state says."""
    package = packages[package_name]
    engine = engine_cache("native-host", package)
    engine.reset_ledger()
    session = SpeculativeSession(engine)
    assert session.state is session.target.state
    rounds = []
    original = session.proposer.after_round

    def check_after(committed, **kwargs):
        original(committed, **kwargs)
        for state in (session.target.state, getattr(session.proposer, "state", None),
                      getattr(getattr(session.proposer, "session", None), "state", None)):
            if state is None:
                continue
            for cell in state.cells.values():
                if cell.spec.kind == "kv":
                    assert cell.length == state.position
                    if cell.spec.update == "append":
                        assert cell.value.shape[cell.spec.seq_axis] == state.position
        rounds.append(kwargs["accepted"] < kwargs["width"])

    session.proposer.after_round = check_after
    prompt = list(package.spec.prompts[0])
    result = session.decode(prompt, 12, package.spec.decoding.speculative.max_width)
    assert rounds and len(result.tokens) > 1
    assert any(rounds) == partial  # the rollback path ran where the package has one
    assert session.target.position == len(prompt) + len(result.tokens) - 1
