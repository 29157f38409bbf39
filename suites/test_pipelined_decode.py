"""The pipelined greedy loop (``DecodeSession(..., pipelined=True)``, ``lockstep bench
--pipelined``): each next forward is queued on the device feed before the last token id is
waited for.

Facts: on every host engine and fixture it emits the plain loop's tokens with the same
readbacks and forwards; the forward for step t+1 really is run before step t's id is asked
for; at eos the one forward queued past it is undone (the state's position is the plain
loop's) and counted; ``max_new_tokens`` is never overrun; the audit and engines without a
device feed keep the plain loop; the bench records the setting."""
from __future__ import annotations

import json

import numpy as np
import pytest

from engines.registry import get_engine_class
from engines.tensor_ops.pending import PendingToken, ReadyToken
from engines.workflow import greedy_decode
from engines.workflow.session import DecodeSession
from harness.packages import resolve_package
from suites.support import HOST_ENGINES

FIXTURES = ("tiny_llama", "tiny_llama_static", "hybrid_mtp", "tied_llama")
NEW = 12


def _engine(engine: str, fixture: str):
    cls = get_engine_class(engine)
    if not cls.availability().ok:
        pytest.skip(cls.availability().reason)
    return cls(resolve_package(fixture))


def _decode(engine, prompt, n, pipelined, eos=None):
    """A fresh session's greedy decode, with the package's eos replaced by ``eos``."""
    engine.reset_ledger()
    session = DecodeSession(engine, pipelined=pipelined)
    if eos is not None:
        session.spec = session.spec.model_copy(update={"eos_id": eos})
    return session, session.greedy(prompt, n)


@pytest.mark.claim("token_identity")
@pytest.mark.parametrize("fixture", FIXTURES)
@pytest.mark.parametrize("engine_name", HOST_ENGINES)
def test_pipelined_tokens_readbacks_and_forwards_are_the_plain_loops(engine_name, fixture):
    engine = _engine(engine_name, fixture)
    prompt = list(engine.package.spec.prompts[0])
    plain = greedy_decode(engine, prompt, NEW)
    plain_forwards = dict(plain.ledger.forwards)
    plain_readbacks = dict(plain.ledger.readback_count)
    piped = greedy_decode(engine, prompt, NEW, pipelined=True)
    assert piped.tokens == plain.tokens and len(piped.tokens) == NEW
    assert dict(piped.ledger.forwards) == plain_forwards  # no forward past max_new_tokens
    assert dict(piped.ledger.readback_count) == plain_readbacks
    assert len(piped.step_s) == NEW


@pytest.mark.parametrize("engine_name", HOST_ENGINES)
def test_at_eos_the_forward_queued_past_it_is_undone_and_counted(engine_name):
    engine = _engine(engine_name, "tiny_llama")
    prompt = list(engine.package.spec.prompts[0])
    free = greedy_decode(engine, prompt, NEW).tokens
    eos = free[4]
    stop = free.index(eos) + 1  # the first time it is emitted
    plain_session, plain = _decode(engine, prompt, NEW, False, eos)
    plain_forwards = plain.ledger.forwards["decode"]
    plain_readbacks = dict(plain.ledger.readback_count)  # none on the host: nothing crosses
    piped_session, piped = _decode(engine, prompt, NEW, True, eos)
    assert plain.tokens == piped.tokens == free[:stop]
    assert piped_session.position == plain_session.position == len(prompt) + stop - 1
    assert piped.ledger.forwards["decode"] == plain_forwards + 1  # run, undone, counted
    assert dict(piped.ledger.readback_count) == plain_readbacks


def test_the_next_forward_is_queued_before_the_last_id_is_asked_for(monkeypatch):
    """The order the loop exists for: forward t+1 runs before step t's ``result()``."""
    engine = _engine("native-host", "tiny_llama_static")
    events: list[str] = []
    ops = engine.tensor_ops
    real_async, real_run = ops._argmax_feed_async, engine.run_component

    class Recorded(PendingToken):
        def __init__(self, token):
            self.token = token

        def _wait(self):
            events.append("result")
            return self.token

    def argmax_async(logits2d):
        ready, feed = real_async(logits2d)
        return Recorded(ready.result()), feed

    def run_component(component, feeds, phase=None):
        events.append(phase)
        return real_run(component, feeds, phase=phase)

    monkeypatch.setattr(ops, "_argmax_feed_async", argmax_async)
    monkeypatch.setattr(engine, "run_component", run_component)
    prompt = list(engine.package.spec.prompts[0])
    session = DecodeSession(engine, pipelined=True)
    session.greedy(prompt, 4)
    assert events == ["prefill", "decode", "result", "decode", "result", "decode", "result",
                      "result"]


def test_the_audit_and_max_new_tokens_one_keep_to_the_plain_loop(monkeypatch):
    engine = _engine("native-host", "tiny_llama")
    prompt = list(engine.package.spec.prompts[0])
    audited = greedy_decode(engine, prompt, 5, audit=True, pipelined=True)
    assert len(audited.logits) == 5  # the audit's rows: the plain loop ran
    one = greedy_decode(engine, prompt, 1, pipelined=True)
    assert one.ledger.forwards.get("decode", 0) == 0 and len(one.tokens) == 1


def test_a_pending_token_of_an_all_nan_row_is_refused_when_asked_for():
    from engines.errors import NonFiniteLogits

    assert ReadyToken(7).result() == 7
    with pytest.raises(NonFiniteLogits) as info:
        ReadyToken(-1).result()
    assert info.value.field == "logits2d"


def test_a_device_token_waits_once_then_hands_its_word_and_event_back():
    """``DeviceToken``: the first ``result()`` waits on the event and reads the pinned word;
    then (not before) the pair goes back to the ops for a later token, once; asking again
    returns the id read; an all-NaN row (-1) is still refused, after the pair went back."""
    from engines.errors import NonFiniteLogits
    from engines.tensor_ops.pending import DeviceToken

    class Event:
        waits = 0

        def synchronize(self):
            Event.waits += 1

    returned = []
    word, event = np.array([41], np.int32), Event()
    token = DeviceToken(word, event, lambda h, e: returned.append((h, e)))
    assert returned == [] and Event.waits == 0
    assert token.result() == 41 and token.result() == 41
    assert Event.waits == 1 and len(returned) == 1
    assert returned[0][0] is word and returned[0][1] is event
    nan = DeviceToken(np.array([-1], np.int32), Event(), lambda h, e: returned.append((h, e)))
    with pytest.raises(NonFiniteLogits):
        nan.result()
    assert len(returned) == 2
    assert DeviceToken(np.array([3], np.int32), Event()).result() == 3  # nothing to hand back


def test_bench_records_pipelined_and_refuses_a_non_bool(tmp_path):
    from engines.errors import InputError
    from harness.bench import plan_bench, run_bench, write_json

    with pytest.raises(InputError) as info:
        plan_bench(["native-host"], ["tiny_llama"], pipelined="yes")
    assert info.value.field == "pipelined"
    plan = plan_bench(["native-host"], ["tiny_llama"], repeats=1, max_new_tokens=4,
                      baseline="native-host", pipelined=True)
    rows = run_bench(plan)
    assert rows[0].status == "ok" and rows[0].new_tokens == 4
    path = write_json(rows, tmp_path / "bench.json", plan)
    assert json.loads(path.read_text())["settings"]["pipelined"] is True
