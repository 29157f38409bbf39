"""Claim 2 on the host: row i of an M-row forward equals, bit for bit, the M=1 forward.

The same property runs on native-cuda in the GPU suite; here it is native-host over every
fixture, with M from 1 to 9 after a random prefix.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engines.workflow import DecodeSession
from suites.support import fixture_names

NATIVE_HOST = "native-host"


def stepwise_and_batched(engine, prefix, tokens, to_host=np.asarray):
    """Logits of ``tokens`` after ``prefix``: one M-row forward, and M one-row forwards."""
    engine.reset_ledger()
    batched = DecodeSession(engine)
    batched.forward(prefix, "prefill")
    rows = to_host(batched.forward(tokens, "verify")["logits"])[0]
    stepped = DecodeSession(engine)
    stepped.forward(prefix, "prefill")
    singles = [to_host(stepped.forward([t], "decode")["logits"])[0, 0] for t in tokens]
    return rows, np.stack(singles)


@pytest.mark.claim("batch_invariance")
@pytest.mark.parametrize("package_name", fixture_names())
@given(data=st.data())
def test_rows_equal_single_forwards(packages, engine_cache, package_name, data):
    package = packages[package_name]
    engine = engine_cache(NATIVE_HOST, package)
    spec = package.spec
    m = data.draw(st.integers(1, 9), label="M")
    p = data.draw(st.integers(1, min(8, spec.max_context - m)), label="prefix length")
    ids = st.integers(0, spec.vocab_size - 1)
    prefix = data.draw(st.lists(ids, min_size=p, max_size=p), label="prefix")
    tokens = data.draw(st.lists(ids, min_size=m, max_size=m), label="tokens")
    rows, singles = stepwise_and_batched(engine, prefix, tokens)
    assert rows.shape == singles.shape
    assert rows.tobytes() == singles.tobytes(), (
        f"row mismatch at {np.argwhere(rows != singles)[:3].tolist()}")


@pytest.mark.claim("snapshot_budget")
@pytest.mark.parametrize("package_name", fixture_names())
def test_roll_back_then_redecode_reproduces(packages, engine_cache, package_name):
    """Roll the cells back (kv by truncation, recurrent by snapshot restore) and decode the
    same tokens again: the same logits, bit for bit."""
    from engines.workflow.state_service import StateService

    package = packages[package_name]
    engine = engine_cache(NATIVE_HOST, package)
    prompt = list(package.spec.prompts[0])
    session = DecodeSession(engine)
    cells = session.cells.cells
    recurrent = [n for n, c in cells.items() if c.spec.kind == "recurrent"]
    kv = [n for n, c in cells.items() if c.spec.kind == "kv"]
    service = StateService.over(session.cells, recurrent)
    session.forward(prompt, "prefill")
    tail = [3, 1, 4, 1, 5]
    first = []
    for i, t in enumerate(tail):
        if i == 2:
            service.snapshot()
        first.append(np.asarray(session.forward([t], "decode")["logits"]).copy())
    keep = len(prompt) + 2
    if recurrent:
        service.restore()
    service.truncate(keep, kv)
    session.position = keep
    assert all(cells[n].length == keep for n in kv)
    again = [np.asarray(session.forward([t], "decode")["logits"]) for t in tail[2:]]
    for a, b in zip(first[2:], again):
        assert a.tobytes() == b.tobytes()
