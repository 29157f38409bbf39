"""``ignore_eos`` for speculative decoding (issue #12), for timing only: the stream goes on
past eos exactly as greedy's ``ignore_eos`` does, every round's drafts and acceptance are
those of a package without eos, exactly ``max_new_tokens`` tokens come back, the readback
stays exact, and ``lockstep bench --mode speculative --ignore-eos`` times exactly N tokens.

The built-in fixtures declare no eos (``eos_id`` None: their streams never stop), so each
speculative fixture is copied with an eos its first prompt's stream emits at step
``EOS_STEP``; a decode of ``NEW_TOKENS`` then passes eos, and a parity decode stops there.
"""
from __future__ import annotations

import json
import shutil
from dataclasses import dataclass

import numpy as np
import pytest
import yaml

from engines.backends.native_host import NativeHostEngine
from engines.engine import Availability, BlackBoxEngine
from engines.oracle import oracle_decode
from engines.package import load_package
from engines.tensor_ops.host import HostTensorOps
from engines.workflow import DecodeResult, greedy_decode
from engines.workflow.speculative import speculative_decode
from harness.catalog.builtin import speculative_fixtures
from harness import bench as hb
from suites.test_speculative import check_tallies

NEW_TOKENS = 16
EOS_STEP = 2  # eos is the third token of the first prompt's stream (a fresh id there)
SPECULATIVE = speculative_fixtures()
CELLS = [(name, width) for name, top in SPECULATIVE.items() for width in range(1, top + 1)]
ENGINES = ("native-host", "ort-cpu")  # one interpreter; a backend of each kind
CHEAP = "lookup_chained"
FAKE_BW = lambda residency: hb.Bandwidth(residency, 10.0, "fake 10 GB/s")  # noqa: E731


@dataclass(frozen=True)
class EosCase:
    package: object  # the fixture's copy with eos
    base: object  # the fixture itself (no eos)
    prompt: list[int]
    free: list[int]  # the oracle's stream on the fixture: NEW_TOKENS tokens, eos not stopping
    eos: int


def with_eos(base, folder, eos: int):
    """A copy of ``base`` whose package.yaml declares ``eos`` (everything else the same)."""
    shutil.copytree(base.root, folder)
    doc = yaml.safe_load((folder / "package.yaml").read_text())
    doc["eos_id"], doc["name"] = int(eos), f"{base.spec.name}_eos"
    (folder / "package.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return load_package(folder)


@pytest.fixture(scope="module")
def eos_cases(packages, tmp_path_factory) -> dict[str, EosCase]:
    root = tmp_path_factory.mktemp("spec_eos")
    cases = {}
    for name in SPECULATIVE:
        base = packages[name]
        assert base.spec.eos_id is None  # else the copy would need another eos
        prompt = list(base.spec.prompts[0])
        free = oracle_decode(base, prompt, NEW_TOKENS).tokens
        eos = free[EOS_STEP]
        assert eos not in free[:EOS_STEP], f"{name}: pick a step whose token is fresh"
        cases[name] = EosCase(with_eos(base, root / f"{name}_eos", eos), base, prompt, free,
                              eos)
    return cases


@pytest.mark.claim("spec_equals_greedy")
@pytest.mark.parametrize("package_name,width", CELLS, ids=[f"{n}-w{w}" for n, w in CELLS])
@pytest.mark.parametrize("engine_name", ENGINES)
def test_speculative_past_eos_equals_greedy_past_eos(eos_cases, engine_cache, package_name,
                                                     width, engine_name):
    case = eos_cases[package_name]
    engine = engine_cache(engine_name, case.package)
    # the parity path stops at eos, speculative exactly like greedy
    stopped = speculative_decode(engine, case.prompt, NEW_TOKENS, width)
    assert stopped.tokens == greedy_decode(engine, case.prompt, NEW_TOKENS).tokens
    assert stopped.tokens == case.free[:EOS_STEP + 1]
    # ignore_eos: past eos, token for token with greedy's ignore_eos and with the oracle
    kept = speculative_decode(engine, case.prompt, NEW_TOKENS, width, ignore_eos=True)
    greedy = greedy_decode(engine, case.prompt, NEW_TOKENS, ignore_eos=True)
    assert kept.tokens == greedy.tokens == case.free
    assert len(kept.tokens) == NEW_TOKENS and case.eos in kept.tokens[:-1]
    check_tallies(kept, case.package)
    # every proposal and acceptance is the one a package without eos sees
    plain = speculative_decode(engine_cache(engine_name, case.base), case.prompt, NEW_TOKENS,
                               width)
    assert kept.drafts_per_round == plain.drafts_per_round
    assert kept.acceptance_per_round == plain.acceptance_per_round
    assert kept.widths_per_round == plain.widths_per_round


def rounds_accepting_eos_before_more(result, eos: int) -> int:
    """Rounds in which eos is an accepted draft with more tokens committed after it (the
    round the eos path cuts short)."""
    return sum(eos in drafts[:n]  # the bonus follows every accepted draft
               for drafts, n in zip(result.drafts_per_round, result.acceptance_per_round))


@pytest.mark.parametrize("package_name", list(SPECULATIVE))
def test_a_round_that_accepts_eos_goes_on(eos_cases, engine_cache, package_name):
    """The case ``ignore_eos`` must get right: a verification round accepting eos as a
    draft keeps the tokens after it (no truncation), at some width of every fixture."""
    case = eos_cases[package_name]
    engine = engine_cache("native-host", case.package)
    seen = 0
    for width in range(1, SPECULATIVE[package_name] + 1):
        kept = speculative_decode(engine, case.prompt, NEW_TOKENS, width, ignore_eos=True)
        assert kept.tokens == case.free
        seen += rounds_accepting_eos_before_more(kept, case.eos)
    assert seen, f"{package_name}: no width accepted eos as a draft; move EOS_STEP"


class DeviceAccountingOps(HostTensorOps):
    """Host ops that account crossings as ``CudaTensorOps`` does: 4 bytes a token id, and
    per verification 4 bytes ``accept_count`` and 4 bytes ``token_id``, nothing more (so a
    verification's row argmaxes, which stay on a device, are not counted); a prompt-lookup
    decode shifts its rounds, as on a device (``asynchronous_ids``)."""

    asynchronous_ids = True

    def _argmax(self, logits2d, rows):
        self.ledger.record_readback("token_id", 4 * rows)
        return HostTensorOps._argmax(self, logits2d, rows)

    def _argmax_feed(self, logits2d):
        self.ledger.record_readback("token_id", 4)
        token = HostTensorOps._argmax(self, logits2d, 1)[0]
        return token, np.full((1, 1), token, dtype=np.int64)

    def _accept(self, logits2d, drafts, fed=None, head=None):
        if head is not None:  # a shifted round: the feeding forward's row first
            logits2d = np.concatenate([head, logits2d[:drafts.size]])
        best = HostTensorOps._argmax(self, logits2d, drafts.size + 1)
        n = 0
        while n < drafts.size and best[n] == int(drafts[n]):
            n += 1
        self.ledger.record_readback("accept_count", 4)
        self.ledger.record_readback("token_id", 4)
        return n, best[n]


class SimulatedDevice(NativeHostEngine):
    """native-host whose crossings are accounted as on a device (residency ``sim:0``)."""

    name = "simulated-device"
    residency = "sim:0"

    def make_tensor_ops(self):
        return DeviceAccountingOps(self.ledger)


def expected_readback(result) -> dict[str, int]:
    """4 bytes a token id (prefill, each draft, each bonus, a last decode step), 4 an accept
    count per verification: nothing else."""
    led = result.ledger
    drafts = sum(result.widths_per_round)
    return {"token_id": 4 * (1 + drafts + led.proposals + led.forwards["decode"]),
            "accept_count": 4 * led.proposals, "logits_audit": 0}


@pytest.mark.claim("readback_budget")
@pytest.mark.parametrize("package_name,width", CELLS, ids=[f"{n}-w{w}" for n, w in CELLS])
def test_readback_stays_exact_past_eos(eos_cases, package_name, width):
    """On a simulated device (host ops that account crossings as a device does)."""
    case = eos_cases[package_name]
    engine = SimulatedDevice(case.package)
    kept = speculative_decode(engine, case.prompt, NEW_TOKENS, width, ignore_eos=True)
    assert kept.tokens == case.free
    led = kept.ledger
    assert dict(led.readback_bytes) == expected_readback(kept)
    assert led.readback_count["accept_count"] == led.proposals > 0
    assert len(kept.tokens) == 1 + sum(n + 1 for n in kept.acceptance_per_round) \
        + led.forwards["decode"]
    assert led.host_staging == 0
    greedy = greedy_decode(engine, case.prompt, NEW_TOKENS, ignore_eos=True)
    assert dict(greedy.ledger.readback_bytes) == {"token_id": 4 * NEW_TOKENS,
                                                  "accept_count": 0, "logits_audit": 0}


# -- lockstep bench --mode speculative --ignore-eos -------------------------------------------

def test_the_speculative_bench_times_exactly_n_tokens_past_eos(eos_cases, monkeypatch):
    case = eos_cases[CHEAP]
    asked = []  # (decode, ignore_eos) of every decode the bench makes, warm-ups included
    greedy, spec = hb.greedy_decode, hb.speculative_decode
    monkeypatch.setattr(hb, "greedy_decode", lambda *a, ignore_eos=False, **k: (
        asked.append(("greedy", ignore_eos)) or greedy(*a, ignore_eos=ignore_eos, **k)))
    monkeypatch.setattr(hb, "speculative_decode", lambda *a, ignore_eos=False, **k: (
        asked.append(("speculative", ignore_eos)) or spec(*a, ignore_eos=ignore_eos, **k)))
    rows = hb.bench(["native-host"], [case.package], mode="speculative", width=2, repeats=2,
                    max_new_tokens=NEW_TOKENS, ignore_eos=True, bandwidth=FAKE_BW)
    assert {(r.engine, r.mode) for r in rows} == {
        (engine, mode) for engine in ("native-host", "ort-cpu") for mode in ("greedy",
                                                                             "chained/w2")}
    for row in rows:
        assert row.measured and row.ignore_eos and row.new_tokens == NEW_TOKENS, row.reason
        assert "eos after" not in row.reason
        if row.mode == "greedy":
            assert row.tokens_per_step == 1.0
        else:
            assert 1.0 < row.tokens_per_step <= 3.0 and row.same_tokens
    # per engine: one greedy and one speculative warm-up, two timed of each; all past eos
    assert sorted(asked) == sorted([("greedy", True)] * 6 + [("speculative", True)] * 6)
    stopped = hb.bench(["native-host"], [case.package], mode="speculative", width=2,
                       repeats=1, max_new_tokens=NEW_TOKENS, bandwidth=FAKE_BW)
    for row in stopped:  # without it the figures cover the stream up to eos, and say so
        assert row.measured and row.new_tokens == EOS_STEP + 1
        assert f"eos after {EOS_STEP + 1} of {NEW_TOKENS} tokens" in row.reason


def test_a_speculative_decode_that_stops_at_eos_is_an_error_row(eos_cases, monkeypatch):
    """A speculative path that does not honour ignore_eos is refused, never timed over
    fewer tokens (greedy's rule)."""
    case = eos_cases[CHEAP]
    spec = hb.speculative_decode
    monkeypatch.setattr(hb, "speculative_decode",
                        lambda *a, ignore_eos=False, **k: spec(*a, **k))
    rows = hb.bench(["native-host"], [case.package], mode="speculative", width=2, repeats=1,
                    max_new_tokens=NEW_TOKENS, ignore_eos=True, bandwidth=FAKE_BW)
    for row in rows:
        if row.mode == "greedy":  # the greedy path honours it: timed beside
            assert row.measured and row.new_tokens == NEW_TOKENS
            continue
        assert row.status == hb.ERROR and row.ratio is None and row.greedy_ratio is None
        assert f"produced {EOS_STEP + 1} of {NEW_TOKENS} tokens under --ignore-eos" in row.reason


class StopsAtEos(BlackBoxEngine):
    """A black box whose generate stops at eos whatever it is asked."""

    name = "stops-at-eos"
    calls: list = []

    @classmethod
    def availability(cls):
        return Availability(True, "a fake black box")

    def generate(self, prompt, max_new_tokens, audit=False, ignore_eos=False):
        StopsAtEos.calls.append(ignore_eos)
        return DecodeResult(self.name, list(prompt), [self.package.spec.eos_id],
                            self.reset_ledger(), 0.01, [0.01])


def test_a_black_box_never_speculates_and_its_greedy_row_is_refused_alike(eos_cases):
    StopsAtEos.calls = []
    case = eos_cases[CHEAP]
    rows = {(r.engine, r.mode): r for r in hb.bench(
        [StopsAtEos, "native-host"], [case.package], mode="speculative", width=2, repeats=1,
        max_new_tokens=NEW_TOKENS, ignore_eos=True, bandwidth=FAKE_BW)}
    row = rows["stops-at-eos", "chained/w2"]
    assert row.status == hb.UNAVAILABLE and "declares no speculative decoding" in row.reason
    assert row.tokens_per_s_median is None
    assert StopsAtEos.calls == [True, True]  # its greedy warm-up and timed decode only
    greedy = rows["stops-at-eos", "greedy"]
    assert greedy.status == hb.ERROR and "produced 1 of" in greedy.reason
    spec = rows["native-host", "chained/w2"]
    assert spec.measured and spec.new_tokens == NEW_TOKENS


def test_cli_speculative_ignore_eos_writes_rows_over_n_tokens(eos_cases, tmp_path, capsys):
    from harness.cli import main

    case = eos_cases[CHEAP]
    out = tmp_path / "bench.json"
    status = main(["bench", "--mode", "speculative", "--ignore-eos", "--width", "2",
                   "--engines", "native-host", "--packages", str(case.package.root),
                   "--repeats", "1", "--max-new-tokens", str(NEW_TOKENS), "--json", str(out)])
    assert status == 0, capsys.readouterr()
    doc = json.loads(out.read_text())
    assert doc["settings"]["ignore_eos"] is True and doc["settings"]["mode"] == "speculative"
    assert [r["new_tokens"] for r in doc["rows"]] == [NEW_TOKENS] * 4  # 2 engines x 2 modes
    assert [r["mode"] for r in doc["rows"]] == ["greedy", "chained/w2"] * 2
    assert all(r["status"] == "ok" and r["ignore_eos"] for r in doc["rows"])
    assert "eos ignored" in capsys.readouterr().out
