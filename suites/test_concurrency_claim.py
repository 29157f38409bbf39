"""Claim concurrency_invariance: ``--concurrency N`` sends each package's prompts N at a time
to a server and compares each prompt's stream there with its stream alone. A fake server
whose engine moves its logits only with more than one request in flight is caught (tokens:
``defect``; log-probabilities only: ``drift``); a concurrent and correct one passes."""
from __future__ import annotations

import json

import pytest

from harness.plan import concurrent_groups
from harness.runner import run_matrix
from suites.fake_server import FakeServer
from suites.planted import servers as planted

N = 4
WINDOW = 0.3  # the fake server's batching window: all N requests arrive within it


@pytest.fixture(scope="module")
def tiny(packages):
    return packages["tiny_llama"]


def _run(tiny, engine_cls, tmp_path=None, prompts=None):
    with FakeServer(tiny, engine_cls, batch_window=WINDOW) as server:
        summary = run_matrix([f"http:llama-server={server.url}"], ["tiny_llama"], prompts, 8,
                             evidence_dir=tmp_path, concurrency=N)
        return summary, server.peak


@pytest.mark.claim("concurrency_invariance")
def test_a_concurrent_and_correct_server_passes(tiny, tmp_path):
    summary, peak = _run(tiny, planted.ServedEngine, tmp_path)
    assert peak == N  # the requests really were in flight together
    for cell in summary.cells:
        assert cell.status == "identical", cell.reason
        assert cell.verdicts["concurrency_invariance"] == "pass"
        assert cell.concurrency.requests == N and cell.concurrency.max_logprob_delta == 0.0
    record = json.loads(summary.cells[1].record_path.read_text())
    assert record["concurrency"]["requests"] == N and record["concurrency"]["slot"] == 1
    assert record["concurrency"]["tokens"] == record["tokens"]
    assert record["verdicts"]["concurrency_invariance"] == "pass"


@pytest.mark.claim("concurrency_invariance")
def test_a_server_that_moves_logits_under_load_is_a_concurrency_defect(tiny, tmp_path):
    summary, peak = _run(tiny, planted.BatchNoise, tmp_path)
    assert peak == N
    for cell in summary.cells:
        # alone it is exact: token identity and the top-k audit pass
        assert cell.verdicts["token_identity"] == "pass"
        assert cell.verdicts["logits_within_tolerance"] == "pass"
        assert cell.verdicts["concurrency_invariance"] == "fail"
        assert cell.status == "defect", cell.reason
        assert f"among {N} concurrent requests the stream parts from the stream alone" \
            in cell.reason
        assert "the concurrent stream is wrong" in cell.reason
    record = json.loads(summary.cells[0].record_path.read_text())
    assert record["concurrency"]["first_difference"] is not None
    assert record["concurrency"]["concurrent_verdict"] == "defect"


@pytest.mark.claim("concurrency_invariance")
def test_log_probabilities_that_move_under_load_are_drift(tiny):
    summary, _ = _run(tiny, planted.SlightBatchNoise)
    for cell in summary.cells:
        assert cell.status == "drift", cell.reason
        assert cell.concurrency.first_difference is None
        assert cell.concurrency.max_logprob_delta > cell.concurrency.bound
        assert "log-probabilities move by" in cell.reason


def test_prompts_go_n_at_a_time_and_the_last_group_is_filled_from_the_start():
    prompts = [[1], [2], [3], [4], [5]]
    groups = concurrent_groups(prompts, 4)
    assert groups[0] == (((1,), (2,), (3,), (4,)), 0)
    assert groups[3] == (((1,), (2,), (3,), (4,)), 3)
    assert groups[4] == (((5,), (1,), (2,), (3,)), 0)
    assert concurrent_groups([[7]], 3) == [(((7,), (7,), (7,)), 0)]


def test_an_engine_that_does_not_serve_concurrently_says_so(tiny):
    summary = run_matrix(["native-host"], ["tiny_llama"], None, 4, max_prompts=1,
                         concurrency=2)
    cell = summary.cells[0]
    assert cell.status == "identical"
    assert cell.verdicts["concurrency_invariance"] == "skip"
    assert "declares no concurrent decoding" in cell.reason


@pytest.mark.parametrize("argv, needle", [
    (["--concurrency", "0"], "--concurrency takes an integer"),
    (["--concurrency", "2", "--mode", "speculative"], "greedy cells only"),
])
def test_bad_concurrency_is_one_line_exit_2(argv, needle, capsys):
    from harness.cli import main

    assert main(["run", "--engines", "native-host", "--packages", "tiny_llama",
                 "--no-evidence", *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err
