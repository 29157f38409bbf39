"""Faults are cells, not crashes: a server unreachable, an HTTP 5xx, a timeout, malformed
JSON, strings where ids were asked, a connection dropped mid-request, a server process that
dies mid-cell. Each is an ``error`` cell naming the request and the server's words; safe
retries (a refused connection, 503 while loading) back off and give up in bounded time; the
rest of the matrix completes and nothing waits past its timeout."""
from __future__ import annotations

import re
import socket
import sys
import time
from pathlib import Path

import pytest

from harness.runner import run_matrix
from suites.fake_server import FakeServer

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def tiny(packages):
    return packages["tiny_llama"]


@pytest.fixture
def quick(monkeypatch):
    monkeypatch.setenv("LOCKSTEP_HTTP_TIMEOUT", "1")
    monkeypatch.setenv("LOCKSTEP_HTTP_STARTUP_TIMEOUT", "20")


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run(spelling, **kw):
    start = time.monotonic()
    summary = run_matrix([spelling], ["tiny_llama"], None, 6, **kw)
    return summary, time.monotonic() - start


@pytest.mark.parametrize("fault, words", [
    ("http500", ["POST /completion: HTTP 500", "fake: the decode failed (CUDA OOM)"]),
    ("malformed", ["the reply is not JSON", "<html>502 Bad Gateway</html>"]),
    ("strings", ["not a token id: the server sent strings where ids were asked for",
                 "'piece"]),
    ("drop", ["the connection was dropped before a complete reply"]),
    ("timeout", ["no complete reply within 1 s"]),
])
def test_a_fault_in_one_request_is_that_cells_error_and_the_matrix_goes_on(
        tiny, quick, fault, words):
    with FakeServer(tiny, fault=fault, fault_on=2, sleep=3.0) as server:
        summary, wall = _run(f"http:llama-server={server.url}")
    assert [c.status for c in summary.cells] == ["identical", "error", "identical"]
    bad = summary.cells[1]
    assert bad.error.stage == "decode" and bad.error.type == "ServerError"
    for needle in words:
        assert needle in bad.reason, bad.reason
    assert "Traceback" not in bad.reason
    assert wall < 15  # the timeout's 1 s, not the server's 3 s sleep, bounds the cell


def test_an_unreachable_server_is_an_error_cell_per_prompt_after_bounded_retries(tiny, quick):
    summary, wall = _run(f"http:llama-server=http://127.0.0.1:{closed_port()}")
    assert [c.status for c in summary.cells] == ["error"] * 3
    cell = summary.cells[0]
    assert cell.error.stage == "constructor"
    assert "connection refused" in cell.reason and re.search(r"tried [234] times", cell.reason)
    assert wall < 10  # 0.25 + 0.5 + 1 s of backoff, once: the engine is set up once


def test_503_while_loading_is_retried_with_backoff_then_served(tiny, quick):
    with FakeServer(tiny, fault="loading", fault_on=2) as server:
        summary, _ = _run(f"http:llama-server={server.url}")
        seen = server.completions
    assert [c.status for c in summary.cells] == ["identical"] * 3
    assert seen == 5  # two 503s, then one request per prompt


def test_a_server_that_never_finishes_loading_is_an_error_not_a_hang(tiny, quick):
    with FakeServer(tiny, fault="loading", fault_on=1000) as server:
        summary, wall = _run(f"http:llama-server={server.url}")
    assert [c.status for c in summary.cells] == ["error"] * 3
    assert "HTTP 503" in summary.cells[0].reason and "Loading model" in summary.cells[0].reason
    assert wall < 15


def test_faults_through_lockstep_run_print_no_traceback_and_exit_1(tiny, quick, tmp_path,
                                                                    capsys):
    from harness.cli import main

    with FakeServer(tiny, fault="http500", fault_on=1) as server:
        code = main(["run", "--engines", f"http:llama-server={server.url}", "--packages",
                     "tiny_llama", "--max-new-tokens", "4", "--evidence-dir", str(tmp_path)])
    out = capsys.readouterr()
    assert code == 1
    assert "Traceback" not in out.out + out.err
    assert "2 identical" in out.out and "1 error" in out.out


# -- a server lockstep starts (a stand-in binary: suites/fake_server.py in its own process) ----

def _stand_in(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "llama-server"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return script


@pytest.fixture
def managed(monkeypatch, tmp_path, quick):
    """``http:llama-server`` with a stand-in binary serving tiny_llama (the GGUF lookup and
    its scheme answered with placeholders: tiny_llama has no source checkpoint)."""
    from engines.backends.checkpoint_source import CheckpointSource
    from engines.backends.http import engine as http_engine

    # placeholders where the HTTP engine binds them (it imports both at its top)
    monkeypatch.setattr(http_engine, "find_checkpoint",
                        lambda root, engine: CheckpointSource(tmp_path / "model.gguf", "gguf",
                                                              "sha256:0"))
    monkeypatch.setattr(http_engine, "gguf_scheme", lambda path: {"numeric_scheme": None})
    monkeypatch.setenv("FAKE_SERVER_PACKAGE", "tiny_llama")
    env = f"PYTHONPATH={REPO} exec {sys.executable} -m suites.fake_server \"$@\""

    def use(body: str = env, fault: str = "") -> None:
        monkeypatch.setenv("LOCKSTEP_LLAMA_SERVER", str(_stand_in(tmp_path, body)))
        monkeypatch.setenv("FAKE_SERVER_FAULT", fault)

    return use



def _live_servers():
    from engines.backends.http.server_process import _LIVE

    return [s.proc for s in _LIVE]


def test_a_started_server_is_judged_its_log_kept_with_the_evidence_and_stopped(
        tiny, managed, tmp_path):
    managed()
    evidence = tmp_path / "evidence"
    seen = []
    summary = run_matrix(["http:llama-server"], ["tiny_llama"], None, 6,
                         evidence_dir=evidence, on_cell=lambda c: seen.extend(_live_servers()))
    assert [c.status for c in summary.cells] == ["identical"] * 3, summary.cells[0].reason
    prov = summary.cells[0].provenance
    assert prov["started_by"] == "lockstep" and prov["argv"][3:5] == ["--host", "127.0.0.1"]
    assert "--no-repack" in prov["argv"]  # no AMX, no repacking: as the llama-cpp engine
    assert prov["log"].startswith("logs/")
    log = (evidence / prov["log"]).read_text()
    assert "fake llama-server: listening" in log and "# lockstep: stopped" in log
    assert len(set(seen)) == 1 and seen[0].poll() is not None  # one server, stopped at the end
    assert not _live_servers()


def test_a_server_killed_mid_cell_fails_that_cell_and_the_next_at_once(tiny, managed):
    managed(fault="die:2")
    summary, wall = _run("http:llama-server")
    assert [c.status for c in summary.cells] == ["identical", "error", "error"]
    died = summary.cells[1].reason
    assert "dropped before a complete reply" in died and "has exited with code 3" in died
    assert "fake: dying in the middle of a request" in died
    last = summary.cells[2].reason
    assert "has exited with code 3" in last and "fake: dying in the middle of a request" in last
    assert wall < 30


def test_a_server_that_never_answers_health_is_stopped_after_its_start_up_time(
        tiny, managed, monkeypatch):
    monkeypatch.setenv("LOCKSTEP_HTTP_STARTUP_TIMEOUT", "2")
    managed(body='echo "stand-in: thinking"; exec sleep 60')
    summary, wall = _run("http:llama-server")
    assert [c.status for c in summary.cells] == ["error"] * 3
    reason = summary.cells[0].reason
    assert "did not answer /health within its start-up time" in reason
    assert "stand-in: thinking" in reason
    assert wall < 10


def test_a_server_that_exits_at_start_up_says_why(tiny, managed):
    managed(body='echo "error: unknown argument: --no-webui" >&2; exit 1')
    summary, wall = _run("http:llama-server")
    assert summary.cells[0].status == "error"
    assert "has exited with code 1" in summary.cells[0].reason
    assert "unknown argument: --no-webui" in summary.cells[0].reason
    assert wall < 10


def test_ctrl_c_stops_a_started_server(tiny, managed):
    managed()
    seen = []

    def interrupt(cell):
        seen.extend(_live_servers())
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_matrix(["http:llama-server"], ["tiny_llama"], None, 4, on_cell=interrupt)
    assert len(seen) == 1 and seen[0].wait(5) is not None


def test_a_server_that_lost_its_port_is_started_again_on_another(tiny, managed, tmp_path):
    marker = tmp_path / "tried"
    env = f"PYTHONPATH={REPO} exec {sys.executable} -m suites.fake_server \"$@\""
    managed(body=f'if [ ! -e {marker} ]; then touch {marker}; '
                 f'echo "error: bind: Address already in use" >&2; exit 1; fi\n{env}')
    summary, _ = _run("http:llama-server")
    assert [c.status for c in summary.cells] == ["identical"] * 3
    assert marker.exists()
