"""Speculative decoding on ``native-cuda`` (claims 1, 3, 4, 5, 7 on the device).

Every test here is marked ``gpu``: without CUDA they skip (a failure under
``--require-gpu``). The budgets, exact:

- host staging 0, by the engine's ledger and by the independent transfer guard;
- readback: 4 bytes per proposer step (the draft id, ``token_id``), 8 per verification (the
  accept count, 4 bytes ``accept_count``, and the bonus id, 4 bytes ``token_id``), plus 4 for
  the prefill's token and 4 for a last plain decode step;
- rolled-back kv cells still live on the device, at the committed length;
- a device-to-device snapshot restores byte-identical state, and moves no byte to the host;
- live device allocations unchanged exactly across 100 proposals after warm-up.
"""
from __future__ import annotations

import time

import numpy as np
import pytest

from engines.ledger import Ledger
from engines.oracle import oracle_decode
from engines.workflow import greedy_decode
from engines.workflow.speculative import SpeculativeSession, speculative_decode
from harness.catalog.builtin import speculative_fixtures
from suites.support import write_figure

pytestmark = pytest.mark.gpu
FREE_MEMORY_DRIFT = 64 * 2**20  # bytes
ENGINE = "native-cuda"
NEW_TOKENS = 32
SPECULATIVE = speculative_fixtures()
CELLS = [(name, width) for name, top in SPECULATIVE.items() for width in range(1, top + 1)]


def expected_readback(result) -> dict[str, int]:
    led = result.ledger
    steps = sum(result.widths_per_round)
    return {"token_id": 4 * (1 + led.forwards["decode"] + steps + led.proposals),
            "accept_count": 4 * led.proposals, "logits_audit": 0}


@pytest.mark.claim("spec_equals_greedy", "token_identity", "zero_staging", "readback_budget")
@pytest.mark.parametrize("package_name,width", CELLS, ids=[f"{n}-w{w}" for n, w in CELLS])
def test_speculative_equals_greedy_with_zero_staging_and_exact_readback(
        packages, engine_cache, package_name, width):
    from harness.transfer_guard import transfer_guard

    package = packages[package_name]
    engine = engine_cache(ENGINE, package)
    for prompt in package.spec.prompts:
        oracle = oracle_decode(package, prompt, NEW_TOKENS)
        greedy = greedy_decode(engine, prompt, NEW_TOKENS)
        with transfer_guard("disallow") as guard:
            result = speculative_decode(engine, prompt, NEW_TOKENS, width)
        assert result.tokens == greedy.tokens == oracle.tokens
        led = result.ledger
        assert led.host_staging == 0 and guard.staging_count == 0, guard.staging_sites
        want = expected_readback(result)
        assert dict(led.readback_bytes) == want
        assert {p: guard.readback_bytes[p] for p in want} == want
        assert led.readback_count["accept_count"] == led.proposals
        assert led.proposals == len(result.acceptance_per_round) > 0


@pytest.mark.claim("snapshot_budget")
@pytest.mark.parametrize("package_name", list(SPECULATIVE))
def test_rolled_back_cells_stay_on_the_device_at_the_committed_length(packages, engine_cache,
                                                                      package_name):
    package = packages[package_name]
    engine = engine_cache(ENGINE, package)
    checked = 0
    for prompt in package.spec.prompts:
        engine.reset_ledger()
        session = SpeculativeSession(engine)
        result = session.decode(prompt, NEW_TOKENS, SPECULATIVE[package_name])
        if not result.ledger.rollbacks:
            continue  # the check means something only after a rollback
        checked += 1
        assert_cells_at_committed_length(package, engine, session)
    assert checked, "no prompt rolled back"


def assert_cells_at_committed_length(package, engine, session) -> None:
    from engines.residency import residency_of

    for name in package.spec.rollback_cells():
        cell = session.target.cells.cells[name]
        assert residency_of(cell.value) == engine.residency
        assert cell.length == session.target.position
        if cell.spec.update == "append":
            assert cell.value.shape[cell.spec.seq_axis] == session.target.position


@pytest.mark.claim("snapshot_budget", "zero_staging")
def test_device_snapshot_restores_byte_identical_state_without_a_host_byte():
    import cupy
    import ml_dtypes

    from engines.package.schema import StateCellSpec
    from engines.tensor_ops import CudaTensorOps
    from engines.workflow.state import DecodeState
    from harness.transfer_guard import transfer_guard

    stream = cupy.cuda.Stream(non_blocking=True)
    ops = CudaTensorOps(Ledger(), stream)
    specs = {"r": StateCellSpec(kind="recurrent", component="target", input="a", output="b",
                                dtype="bfloat16", shape=[1, 3, 257])}
    service = DecodeState.fresh(ops, specs, snapshot_cells=["r"])
    rng = np.random.default_rng(0)
    before = rng.standard_normal((1, 3, 257)).astype(ml_dtypes.bfloat16)
    service.absorb({"b": ops.adopt(before)}, 1)  # outputs by graph output name
    with transfer_guard("disallow") as guard:
        service.snapshot()
        service.absorb({"b": ops.zeros((1, 3, 257), ml_dtypes.bfloat16)}, 4)
        service.restore()
        stream.synchronize()
    assert guard.events == [] and ops.ledger.readback_total == 0
    restored = service.value("r")
    assert isinstance(restored, cupy.ndarray)
    assert cupy.asnumpy(restored, stream=stream).tobytes() == before.tobytes()
    assert service.length("r") == 1


@pytest.mark.claim("readback_budget", "zero_staging")
def test_accept_drafts_reads_back_exactly_8_bytes_and_copy_into_none():
    import cupy

    from engines.tensor_ops import CudaTensorOps
    from harness.transfer_guard import transfer_guard

    stream = cupy.cuda.Stream(non_blocking=True)
    ops = CudaTensorOps(Ledger(), stream)
    logits = ops.adopt(np.array([[0, 3, 1], [5, 1, 1], [0, 0, 9]], np.float32))
    with transfer_guard("disallow") as guard:
        assert ops.accept_drafts(logits, [1, 0]) == (2, 2)
        assert ops.accept_drafts(logits, [1, 2]) == (1, 0)
        ops.copy_into(ops.zeros((3, 3), np.float32), logits)
        stream.synchronize()
    assert ops.ledger.readback_bytes == {"token_id": 8, "accept_count": 8, "logits_audit": 0}
    assert guard.readback_bytes["token_id"] == 8 and guard.readback_bytes["accept_count"] == 8
    assert guard.staging_count == 0


@pytest.mark.claim("readback_budget", "token_identity")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_one_launch_accept_agrees_with_the_host_s_on_ties_nan_and_the_fed_drafts(dtype):
    """``accept_rows`` (each row's argmax, then the count, in one launch) against the host
    ops on random rows with planted ties and NaN, drafts read from a tokens feed (pending
    token first) and adopted, and a shifted round's (row 0 apart, the feed the drafts
    alone); its ticket is back at 0 after every launch, so launches of
    different widths follow each other; one 8-byte read a verification."""
    import cupy

    from engines.dtypes import dtype_of
    from engines.tensor_ops import CudaTensorOps, HostTensorOps
    from harness.transfer_guard import transfer_guard

    stream = cupy.cuda.Stream(non_blocking=True)
    ops, host = CudaTensorOps(Ledger(), stream), HostTensorOps(Ledger())
    rng = np.random.default_rng(7)
    cases = 0
    with transfer_guard("disallow") as guard:
        for width in (1, 3, 7, 8, 2):
            for _ in range(6):
                rows = rng.integers(-4, 5, size=(width + 1, 300)).astype(np.float32)
                rows[rng.random(rows.shape) < 0.05] = np.nan
                best = host.argmax_rows(rows, width + 1)
                keep = int(rng.integers(0, width + 1))  # drafts agree up to here
                drafts = [int(b) for b in best[:keep]] + \
                         [int((b + 1) % 300) for b in best[keep:width]]
                want = host.accept_drafts(rows, drafts)
                on_device = ops.adopt(rows.astype(dtype_of(dtype)))
                fed = ops.adopt(np.array([[5] + drafts], np.int64))
                assert ops.accept_drafts(on_device, drafts, fed=fed) == want, (width, keep)
                assert ops.accept_drafts(on_device, drafts) == want
                # shifted: row 0 from the forward that fed the pending token, the drafts
                # alone in the verification's feed
                head, rest = on_device[:1], ops.adopt(rows[1:].astype(dtype_of(dtype)))
                drafts_fed = ops.adopt(np.array([drafts], np.int64))
                assert ops.accept_drafts(rest, drafts, fed=drafts_fed, head=head) == want
                cases += 3
        stream.synchronize()
    assert ops.ledger.readback_bytes == {"token_id": 4 * cases, "accept_count": 4 * cases,
                                         "logits_audit": 0}
    assert ops.ledger.readback_count["accept_count"] == cases
    assert guard.readback_bytes["token_id"] == guard.readback_bytes["accept_count"] == 4 * cases
    assert guard.staging_count == 0
    assert int(ops._accept_buffers["done"].get()[0]) == 0


@pytest.mark.claim("flat_memory")
@pytest.mark.parametrize("package_name", list(SPECULATIVE))
def test_live_allocations_flat_across_100_proposals(packages, engine_cache, package_name,
                                                    evidence_dir):
    """Rounds at a fixed length (propose, verify, accept, roll the target back): after two
    warm-up rounds, every further round leaves the live allocation count and bytes exactly
    where they were, and the driver's free memory within 64 MiB."""
    from engines.device_memory import driver_free_bytes

    package = packages[package_name]
    engine = engine_cache(ENGINE, package)
    engine.reset_ledger()
    session = SpeculativeSession(engine)
    width = SPECULATIVE[package_name]
    prompt = list(package.spec.prompts[0])
    ops = engine.tensor_ops
    series = []
    with engine.allocator.scope():
        out = session.target.forward(prompt, "prefill")
        pending = ops.argmax_rows(ops.last_along_axis(out["logits"], 1).reshape(1, -1), 1)[0]
        base = session.target.position
        for i in range(102):
            if session.sp.kind == "draft":
                drafts = session.proposer.propose(prompt + [pending], width)
            else:
                seed = session.proposer.seed_from(out, base - 1)
                drafts = session.proposer.propose(pending, width, seed, base)
            if session.state.snapshot_cells:
                session.state.snapshot()
            verify = session.target.forward([pending] + drafts, "verify")
            logits = verify["logits"]
            ops.accept_drafts(logits.reshape(width + 1, logits.shape[-1]), drafts)
            session.state.truncate(base, session.rollback)
            if session.state.snapshot_cells:
                session.state.restore()
            session.target.position = base
            if session.sp.kind == "draft":
                session.proposer.after_round(prompt)  # the round is undone: back to L
            del verify, logits
            engine.allocator.publish(engine.ledger)
            series.append((engine.ledger.live_allocations, engine.ledger.live_bytes))
            if i == 1:  # after the warm-up rounds
                engine.stream.synchronize()
                free_after_warmup = driver_free_bytes()
    engine.stream.synchronize()
    free_drift = driver_free_bytes() - free_after_warmup
    write_figure(evidence_dir, f"proposal_flatness_{package_name}",
                 {"rounds": len(series), "width": width, "series": series,
                  "free_drift_bytes": free_drift})
    assert len(set(series[2:])) == 1, series[:6]
    assert abs(free_drift) <= FREE_MEMORY_DRIFT


@pytest.mark.claim("snapshot_budget", "zero_staging")
def test_device_versus_host_snapshot_timing(packages, engine_cache, evidence_dir,
                                            tmp_path_factory):
    """The measured comparison: the host-snapshot variant stages every snapshot (counted),
    the device variant none; both decode the same tokens. Timings kept as evidence. Runs
    on every catalog fixture with recurrent cells and on the suites' recurrent_pair."""
    from engines.package import load_package
    from suites.recurrent_pair import build_recurrent_pair

    chosen = {n: packages[n] for n in SPECULATIVE if packages[n].spec.decoding.speculative.snapshot}
    chosen["recurrent_pair"] = load_package(
        build_recurrent_pair(tmp_path_factory.mktemp("recurrent_pair")))
    out = {}
    for name, package in chosen.items():
        engine = engine_cache(ENGINE, package)
        prompt = package.spec.prompts[0]
        width = package.spec.decoding.speculative.max_width
        runs = {}
        for mode in ("device", "host"):
            speculative_decode(engine, prompt, NEW_TOKENS, width, snapshot_mode=mode)  # warm-up
            start = time.perf_counter()
            result = speculative_decode(engine, prompt, NEW_TOKENS, width, snapshot_mode=mode)
            runs[mode] = (time.perf_counter() - start, result)
        dev, host = runs["device"][1], runs["host"][1]
        assert dev.tokens == host.tokens
        cells = len(package.spec.decoding.speculative.snapshot)
        assert dev.ledger.host_staging == 0
        assert host.ledger.host_staging == cells * host.ledger.snapshots > 0
        out[name] = {"width": width, "device_s": runs["device"][0], "host_s": runs["host"][0],
                     "snapshots": dev.ledger.snapshots, "restores": dev.ledger.restores,
                     "host_staging_bytes": host.ledger.host_staging_bytes}
    write_figure(evidence_dir, "snapshot_device_vs_host", out)
