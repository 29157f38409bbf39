"""The HTTP engine against a fake server that computes with a real host engine on tiny_llama
(``suites/fake_server.py``): every protocol judged ``identical`` on the happy path, the record
naming the server and what a top-k audit cannot see; the top-k audit catching planted
servers; spellings refused with one line."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from engines.decode_result import StepLogprobs
from engines.registry import get_engine_class
from engines.tolerances import tolerance_for
from harness.runner import run_matrix
from harness.topk_audit import audit_step, log_softmax, logprob_bound
from suites.fake_server import FakeServer
from suites.planted import servers as planted

PROTOCOLS = ("llama-server", "openai", "sglang")


@pytest.fixture(scope="module")
def tiny(packages):
    return packages["tiny_llama"]


@pytest.mark.claim("token_identity", "logits_within_tolerance", "finite_logits")
@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_each_protocol_is_judged_identical_on_the_happy_path(tiny, protocol, tmp_path):
    with FakeServer(tiny, protocols=(protocol,)) as server:
        summary = run_matrix([f"http:{protocol}={server.url}"], ["tiny_llama"], None, 8,
                             evidence_dir=tmp_path)
    assert [c.status for c in summary.cells] == ["identical"] * 3
    cell = summary.cells[0]
    assert cell.engine == f"http-{protocol}@127.0.0.1-{server.url.rsplit(':', 1)[1]}"
    assert cell.verdicts["logits_within_tolerance"] == "pass"
    assert cell.audit.k == 10 and len(cell.audit.steps) == len(cell.tokens) == 8
    record = json.loads(cell.record_path.read_text())
    audit = record["logits_audit"]
    assert audit["kind"] == "top-k" and audit["top_k"] == 10
    assert audit["logprob_bound"] == 2 * tolerance_for("float32").logits_max_abs
    assert "outside each step's top-k" in audit["unseen"]
    prov = record["engine_provenance"]
    assert prov["started_by"] == "the user" and prov["url"] == server.url
    assert prov["server"]["flavour"] == protocol and prov["server"]["model"]
    request = prov["request"]
    assert request.get("temperature", request.get("sampling_params", {}).get("temperature")) == 0


def test_the_protocol_is_detected_from_the_servers_own_endpoints(tiny):
    for protocol in PROTOCOLS:
        with FakeServer(tiny, protocols=(protocol,)) as server:
            summary = run_matrix([f"http={server.url}"], ["tiny_llama"], None, 4,
                                 max_prompts=1)
        cell = summary.cells[0]
        assert cell.status == "identical", cell.reason
        assert cell.provenance["server"]["flavour"] == protocol
        assert cell.engine.startswith("http-auto@")


def test_the_llama_server_request_is_greedy_uncached_and_asks_for_ids():
    from engines.backends.http.flavours import LlamaServer, OpenAICompletions, SglangGenerate

    body = LlamaServer().request([1, 2], 5, 10, False, None)
    assert body["prompt"] == [1, 2] and body["n_predict"] == 5
    assert body["temperature"] == 0 and body["samplers"] == ["temperature"]
    assert body["cache_prompt"] is False and body["return_tokens"] is True
    assert body["n_probs"] == 10 and body["post_sampling_probs"] is False
    oa = OpenAICompletions().request([1, 2], 5, 10, True, "m")
    assert oa["temperature"] == 0 and oa["logprobs"] == 10 and oa["ignore_eos"] is True
    assert oa["return_tokens_as_token_ids"] is True and oa["prompt"] == [1, 2]
    sg = SglangGenerate().request([1, 2], 5, 10, False, None)
    assert sg["input_ids"] == [1, 2] and sg["sampling_params"]["temperature"] == 0


# -- the top-k audit ---------------------------------------------------------------------------

@pytest.mark.claim("logits_within_tolerance")
def test_a_server_whose_logprobs_move_is_drift_not_identical(tiny):
    with FakeServer(tiny, planted.SlightNoise) as server:
        summary = run_matrix([f"http:llama-server={server.url}"], ["tiny_llama"], None, 8)
    for cell in summary.cells:
        assert cell.status == "drift", cell.reason
        assert cell.verdicts["token_identity"] == "pass"
        assert cell.verdicts["logits_within_tolerance"] == "fail"
        assert "log-probabilities outside the float32 bound 0.002 (top-10 audit) from step 0" \
            in cell.reason


def _row(rng, vocab=64):
    return rng.normal(0, 3, vocab)


def _reported(row, k, token=None):
    lsm = log_softmax(row)
    order = np.lexsort((np.arange(lsm.size), -lsm))[:k]
    token = int(order[0]) if token is None else token
    return StepLogprobs(token, float(lsm[token]), tuple((int(i), float(lsm[i])) for i in order))


def test_a_row_within_the_logits_tolerance_never_fails_the_top_k_audit():
    """The bound's derivation: every logit within a of the oracle's keeps every
    log-probability within 2a, and the top-k's membership within 2a of the k-th."""
    tol = tolerance_for("float32")
    a, bound = tol.logits_max_abs, logprob_bound(tol)
    rng = np.random.default_rng(0)
    for _ in range(200):
        oracle = _row(rng)
        engine = oracle + rng.uniform(-a, a, oracle.size)
        step, reason = audit_step(0, _reported(engine, 10), oracle, bound, oracle.size)
        assert step.ok, reason


@pytest.mark.parametrize("break_it, needle", [
    (lambda r, s: StepLogprobs(s.token, s.logprob + 0.01, s.top), "log-probability"),
    (lambda r, s: StepLogprobs(s.token, s.logprob, s.top[:1] + s.top[2:]), "missing from"),
    (lambda r, s: StepLogprobs(s.top[3][0], s.top[3][1], s.top), "not the server's own top-1"),
    (lambda r, s: StepLogprobs(s.token, math.nan, s.top), "NaN or +infinity"),
    (lambda r, s: StepLogprobs(s.token, s.logprob, s.top + ((99999, -30.0),)), "vocabulary"),
])
def test_the_top_k_audit_catches_each_kind_of_wrong_report(break_it, needle):
    tol = tolerance_for("float32")
    row = _row(np.random.default_rng(1))
    good = _reported(row, 10)
    assert audit_step(0, good, row, logprob_bound(tol), row.size)[0].ok
    step, reason = audit_step(0, break_it(row, good), row, logprob_bound(tol), row.size)
    assert not step.ok and needle in reason


# -- naming a server -----------------------------------------------------------------------------

@pytest.mark.parametrize("spelling, needle", [
    ("http:vllm-ish=http://127.0.0.1:8000", "no server protocol 'vllm-ish'"),
    ("http:openai", "lockstep starts only llama-server"),
    ("http:openai=https://127.0.0.1:8000", "a server URL is http://HOST:PORT"),
    ("http:openai=http://127.0.0.1:port", "port"),
    ("http", "named with its protocol or its URL"),
])
def test_a_bad_server_spelling_is_one_line_exit_2(spelling, needle, capsys):
    from harness.cli import main

    assert main(["run", "--engines", spelling, "--packages", "tiny_llama",
                 "--no-evidence"]) == 2
    err = capsys.readouterr().err
    assert needle in err and "--engines" in err and "Traceback" not in err


@pytest.mark.parametrize("variable, value, spelling", [
    ("LOCKSTEP_HTTP_TIMEOUT", "soon", "http:openai=http://127.0.0.1:8000"),
    ("LOCKSTEP_HTTP_TIMEOUT", "-1", "http:llama-server"),
    ("LOCKSTEP_HTTP_STARTUP_TIMEOUT", "later", "http:llama-server"),
    ("LOCKSTEP_HTTP_SLOTS", "2.5", "http:llama-server"),
])
def test_a_bad_setting_is_refused_when_the_server_is_named(variable, value, spelling,
                                                          monkeypatch, capsys):
    """Checked when the engine is named (again after its class was made), before any cell
    or request: one line naming the variable, exit 2."""
    from harness.cli import main

    get_engine_class(spelling)  # its class made with the settings as they were
    monkeypatch.setenv(variable, value)
    assert main(["run", "--engines", spelling, "--packages", "tiny_llama",
                 "--no-evidence"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lockstep: error: {variable} must be a positive")
    assert repr(value) in err and "remedy:" in err and "cells planned" not in err


@pytest.mark.parametrize("content, mode, why", [
    ("my-host\n", 0o755, "not a program (neither a compiled binary nor a #! script)"),
    ("#!/bin/sh\n", 0o644, "not an executable file"),
])
def test_a_named_server_binary_that_cannot_start_is_refused_when_the_server_is_named(
        content, mode, why, tmp_path, monkeypatch, capsys):
    """LOCKSTEP_LLAMA_SERVER is checked before any cell: a text file marked executable would
    fail only when the first cell starts it (an exec format error, the variable unnamed)."""
    from engines.backends.http.server_build import find_server
    from harness.cli import main

    binary = tmp_path / "llama-server"
    binary.write_text(content)
    binary.chmod(mode)
    monkeypatch.setenv("LOCKSTEP_LLAMA_SERVER", str(binary))
    assert main(["run", "--engines", "http:llama-server", "--packages", "tiny_llama",
                 "--no-evidence"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lockstep: error: {why} [field LOCKSTEP_LLAMA_SERVER = "
                          f"{str(binary)!r}]") and "remedy:" in err
    binary.write_text("#!/bin/sh\n")  # a script of the user's own is a program
    binary.chmod(0o755)
    assert find_server().binary == binary


def test_a_started_servers_settings_do_not_concern_a_server_given_by_url(monkeypatch):
    monkeypatch.setenv("LOCKSTEP_HTTP_STARTUP_TIMEOUT", "later")
    assert get_engine_class("http:openai=http://127.0.0.1:8000").url == "http://127.0.0.1:8000"


def test_one_spelling_is_one_engine_class_and_its_capabilities_are_declared():
    cls = get_engine_class("http:openai=http://127.0.0.1:8000")
    assert cls is get_engine_class("http:openai=http://127.0.0.1:8000")
    caps = cls.capabilities()
    assert caps.decodes_itself and caps.logprobs_audit and caps.concurrent
    assert not caps.logits_audit and not caps.speculative
    assert cls.name == "http-openai@127.0.0.1-8000"
    assert get_engine_class("http:llama-server").name == "http-llama-server"


def test_concurrent_without_generate_concurrent_is_refused():
    from engines.engine import BlackBoxEngine
    from engines.errors import EngineDefinitionError
    from engines.registry import check_engine_class

    class Claims(BlackBoxEngine):
        name = "contract-concurrent"
        concurrent = True

        @classmethod
        def availability(cls):
            raise AssertionError("not asked")

        def generate(self, prompt, max_new_tokens, audit=False, ignore_eos=False):
            raise AssertionError("not asked")

    with pytest.raises(EngineDefinitionError, match="generate_concurrent") as err:
        check_engine_class(Claims)
    assert err.value.field == "concurrent"


def test_a_server_of_another_model_is_refused_naming_both_vocabularies(packages):
    with FakeServer(packages["hybrid_mtp"], protocols=("llama-server",)) as server:
        summary = run_matrix([f"http:llama-server={server.url}"], ["tiny_llama"], None, 4,
                             max_prompts=1)
    cell = summary.cells[0]
    assert cell.status == "error" and cell.error.stage == "constructor"
    assert "vocabulary of 64, the package 'tiny_llama' has 96" in cell.reason
