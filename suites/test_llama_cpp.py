"""llama.cpp through llama-cpp-python (``llama-cpp``), on the GGUF a package was converted from.

Facts: without llama-cpp-python (or gguf) the engine is unavailable with the install line,
in ``lockstep engines`` and in a run; the thread count comes from the constructor, then
``$LOCKSTEP_LLAMA_THREADS``, then 2, and a bad one is one line naming its field; the numeric
scheme is read from the GGUF's tensor types; a package with no GGUF source is refused with
the remedy; the GGUF is found by content hash (a file of the right name with other bytes is
refused). On SmolLM2 Q4_1: provenance names the build, its CPU features, the scheme and the
GGUF's hash; a request decodes bit for bit alike whatever was decoded before it (no KV
prefix kept from one decode into the next); ``ignore_eos`` forces the count; each token is
the argmax of llama.cpp's own row; its rows against the float32 oracle on the same prefix
are finite and within a loose sanity bound (not the calibrated band, issue 34) that a
planted RoPE base or a dropped BOS exceeds many times; ``lockstep run`` writes records with
the engine's provenance, judged within its scheme's checked-in band.

Where llama-cpp-python is absent these tests skip with the install line, unless
``LOCKSTEP_REQUIRE_LLAMA`` is set (CI sets it: the set-up installs it), where they fail.
"""
from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from engines.backends import llama_cpp as llama_backend
from engines.backends.checkpoint_source import SEARCH_ENV
from engines.backends.llama_cpp import LlamaCppEngine
from engines.errors import EngineUnavailable, InputError
from engines.registry import get_engine_class

REQUIRE = "LOCKSTEP_REQUIRE_LLAMA"
TOKENS = 16
# Loose sanity bounds on llama-cpp's rows against the float32 oracle over the same
# dequantized weights, over SANE_PROMPTS x SANE_TOKENS: a broken engine fails them, they are
# not the calibrated band (issue 34). Measured here (2 threads or 1 alike): NMSE median
# 9.7e-4, KL mean 0.0024, 102 of 104 tokens the oracle's argmax; over ten prompts x 64 tokens
# (suites/measure_llama_cpp.py) NMSE median 1.1e-3 (3.0e-3 the worst prompt's), KL mean
# 0.0026, 520 of 538. Planted: RoPE base 10,000 gives NMSE median 0.027 and KL mean 0.068,
# a dropped BOS (the chat prompt's first token) 0.030 and 0.018.
SANE_NMSE_MEDIAN = 4e-3
SANE_KL_MEAN = 0.01
SANE_ARGMAX_SHARE = 0.9
SANE_PROMPTS = (0, 1, 2, 4)  # the chat prompt ends at eos after 8 tokens; plain ones run on
SANE_TOKENS = 32


def need_llama():
    found = LlamaCppEngine.availability()
    if not found.ok:
        message = f"llama-cpp-python cannot run here: {found.reason}"
        if os.environ.get(REQUIRE):
            pytest.fail(f"{message}, and {REQUIRE} is set", pytrace=False)
        pytest.skip(message)


@pytest.fixture
def without_llama(monkeypatch):
    """llama_cpp made unimportable (``sys.modules`` entry None), the cached build forgotten
    before and after."""
    llama_backend.build_info.cache_clear()
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    yield
    llama_backend.build_info.cache_clear()


# -- without llama-cpp-python, and what needs no checkpoint ----------------------------------

def test_without_llama_cpp_python_it_is_unavailable_with_the_install(without_llama, tiny_gguf,
                                                                    tmp_path):
    from harness.cli.engines import engine_rows
    from harness.runner import run_matrix

    found = get_engine_class("llama-cpp").availability()
    assert not found.ok
    assert "llama_cpp is not installed" in found.reason and "pip install" in found.reason
    assert "llama-cpp-python==0.3.36" in found.reason
    (row,) = [r for r in engine_rows() if r["name"] == "llama-cpp"]
    assert row["source"] == "built-in" and not row["problem"]
    assert (row["available"], row["reason"]) == (False, found.reason)
    assert row["capabilities"]["decodes_itself"] and row["capabilities"]["logits_audit"]
    # a package it supports (converted from a GGUF): left out of this machine's run, saying
    # how to install it
    summary = run_matrix(["llama-cpp"], [str(tiny_gguf[1].root)], [[1, 2, 3]], 2,
                         evidence_dir=tmp_path)
    (left,) = summary.left_out
    assert summary.cells == [] and left.decided_by == "machine"
    assert "pip install" in left.reason


def test_without_gguf_it_is_unavailable_with_the_install(monkeypatch):
    need_llama()
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *rest: None if name == "gguf" else real(name, *rest))
    found = LlamaCppEngine.availability()
    assert not found.ok and "gguf is not installed" in found.reason
    assert "pip install -e '.[llama]'" in found.reason


def test_the_thread_count_is_pinned(monkeypatch):
    monkeypatch.delenv(llama_backend.THREADS_ENV, raising=False)
    assert llama_backend.resolve_threads(None) == 1
    monkeypatch.setenv(llama_backend.THREADS_ENV, "2")
    assert llama_backend.resolve_threads(None) == 2
    assert llama_backend.resolve_threads(3) == 3  # the constructor's wins
    monkeypatch.setenv(llama_backend.THREADS_ENV, "two")
    with pytest.raises(InputError) as err:
        llama_backend.resolve_threads(None)
    assert (err.value.field, err.value.value) == (llama_backend.THREADS_ENV, "two")
    with pytest.raises(InputError) as err:
        llama_backend.resolve_threads(0)
    assert (err.value.field, err.value.value) == ("threads", 0)


@pytest.mark.parametrize("engine", ["llama-cpp", "http:llama-server"])
@pytest.mark.parametrize("value", ["many", "0"])
def test_bad_threads_are_refused_when_the_engine_is_named(engine, value, monkeypatch, capsys):
    """Both engines that read LOCKSTEP_LLAMA_THREADS check it when a run names them, before
    any cell: one line naming the variable, exit 2 (not a cell error after the run)."""
    from harness.cli import main

    monkeypatch.setenv(llama_backend.THREADS_ENV, value)
    assert main(["run", "--engines", engine, "--packages", "tiny_llama", "--no-evidence"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"lockstep: error: {llama_backend.THREADS_ENV} ")
    assert f"[field {llama_backend.THREADS_ENV} = {value if value == '0' else repr(value)}]" \
        in err and "remedy:" in err and "cells planned" not in err
    monkeypatch.setenv(llama_backend.THREADS_ENV, "2")  # a good count: no refusal to plan
    LlamaCppEngine.check_settings()


def test_cpu_features_are_the_ones_the_build_marks_on():
    line = "CPU : SSE3 = 1 | AVX512 = 1 | AVX512_BF16 = 0 | LLAMAFILE = 1 | OPENMP = 1 |"
    assert llama_backend.cpu_features(line) == ["SSE3", "AVX512", "LLAMAFILE", "OPENMP"]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """A 2-block GGUF of mixed tensor types (``write_tiny_gguf``) and its conversion."""
    pytest.importorskip("gguf", reason="make real (pip install gguf tokenizers)")
    from engines.package import load_package
    from harness.convert.conversion import convert
    from suites.convert_support import write_tiny_gguf

    folder = tmp_path_factory.mktemp("tiny_gguf")
    (folder / "checkpoints").mkdir()
    gguf = write_tiny_gguf(folder / "checkpoints" / "tiny.gguf")
    package = load_package(convert(gguf, folder / "package").folder)
    return gguf, package


def test_the_numeric_scheme_is_the_gguf_s_dominant_weight_type(tiny_gguf, tmp_path):
    from engines.backends.genai_build import dequantize_gguf

    gguf, _ = tiny_gguf
    scheme = llama_backend.gguf_scheme(gguf)
    # Q8_0 holds the embedding and attn_k: the most elements of any quantized type
    assert scheme["numeric_scheme"] == "ggml-cpu:q8_0"
    assert scheme["tensor_types"] == {"BF16": 2, "F16": 2, "F32": 5, "Q4_0": 2, "Q4_1": 2,
                                      "Q5_0": 2, "Q5_1": 2, "Q8_0": 3}
    plain = llama_backend.gguf_scheme(dequantize_gguf(gguf, tmp_path / "f32.gguf"))
    assert plain["numeric_scheme"] == "ggml-cpu:f32" and plain["gguf_file_type"] == "ALL_F32"


def test_a_package_without_a_gguf_source_is_refused_with_the_remedy(tmp_path):
    need_llama()
    from engines.package import load_package
    from harness.catalog.builtin import build
    from harness.convert.conversion import convert
    from suites.convert_support import write_tiny_hf

    with pytest.raises(EngineUnavailable) as err:  # a fixture built from a seed
        LlamaCppEngine(load_package(build("tiny_llama")))
    assert err.value.field == "package" and "lockstep convert" in err.value.remedy
    folder = write_tiny_hf(tmp_path / "hf")
    with pytest.raises(EngineUnavailable) as err:  # converted from a Hugging Face folder
        LlamaCppEngine(load_package(convert(folder, tmp_path / "from_hf").folder))
    assert err.value.field == "checkpoint" and "GGUF" in err.value.remedy


def test_the_gguf_is_found_by_content_not_by_name(tiny_gguf, tmp_path, monkeypatch):
    need_llama()
    from suites.convert_support import write_tiny_gguf

    gguf, package = tiny_gguf
    monkeypatch.delenv(SEARCH_ENV, raising=False)
    with pytest.raises(EngineUnavailable) as err:
        LlamaCppEngine(package)
    assert err.value.field == "checkpoint" and SEARCH_ENV in err.value.remedy
    monkeypatch.setenv(SEARCH_ENV, str(gguf.parent))
    engine = LlamaCppEngine(package, threads=1)
    try:
        record = engine.provenance()
        want = json.loads((package.root / "checkpoint.json").read_text())["source"]
        assert record["checkpoint"]["content_hash"] == want["content_hash"]
        assert record["checkpoint"]["path"] == str(gguf)
        assert record["options"]["n_threads"] == 1
    finally:
        engine.close()
    other = tmp_path / "other"
    other.mkdir()
    write_tiny_gguf(other / gguf.name, seed=4)  # the same name, other weights
    monkeypatch.setenv(SEARCH_ENV, str(other))
    with pytest.raises(EngineUnavailable) as err:
        LlamaCppEngine(package)
    assert "other content" in str(err.value)


# -- SmolLM2 Q4_1 -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("gguf", reason="make real (pip install gguf tokenizers)")
    from engines.package import load_package
    from engines.shipped_checkpoint import INSTALL, smollm2_path
    from harness.convert.smollm2 import smollm2_package

    if smollm2_path() is None:
        pytest.skip(f"SmolLM2 is not installed: {INSTALL}")
    need_llama()
    return load_package(smollm2_package(cache="dynamic", dtype="float32"))


@pytest.fixture(scope="module")
def engine(smollm2):
    e = LlamaCppEngine(smollm2)
    yield e
    e.close()


@pytest.fixture(scope="module")
def oracle(smollm2):
    from engines.oracle import oracle_for

    return oracle_for(smollm2)


@pytest.mark.real_checkpoint
def test_it_says_which_build_and_scheme_ran(engine, smollm2):
    import llama_cpp

    from harness.cli.engines import engine_rows

    record = engine.provenance()
    source = json.loads((smollm2.root / "checkpoint.json").read_text())["source"]
    assert record["checkpoint"]["content_hash"] == source["content_hash"]
    assert record["llama_cpp_python"] == llama_cpp.__version__ == "0.3.36"
    assert record["numeric_scheme"] == "ggml-cpu:q4_1"
    assert record["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}
    assert record["gguf_file_type"] == "MOSTLY_Q4_1"
    assert record["kv_cache"] == {"k": "F16", "v": "F16"}
    threads = llama_backend.resolve_threads(None)  # 2 unless LOCKSTEP_LLAMA_THREADS says
    assert record["options"]["n_threads"] == record["options"]["n_threads_batch"] == threads
    assert record["options"]["logits_all"] is True
    # no extra buffer types: ggml's AMX product segfaults on some hosts, and each is another
    # kernel (engines/backends/llama_plain_buffers.py)
    assert engine.llama.model_params.use_extra_bufts is False
    assert record["extra_buffer_types"].startswith("off")
    assert record["cpu_features"] and all(f"{f} = 1" in record["system_info"]
                                          for f in record["cpu_features"])
    (row,) = [r for r in engine_rows() if r["name"] == "llama-cpp"]
    assert row["available"] and "llama-cpp-python 0.3.36" in row["reason"]
    assert " ".join(record["cpu_features"]) in row["reason"]


@pytest.mark.real_checkpoint
def test_decodes_are_repeatable_and_none_leaks_into_the_next(engine, smollm2):
    """A prompt that continues the previous decode's stream: without ``reset()``
    llama-cpp-python's ``generate`` keeps the KV cache of that stream, whose positions past
    the prompt were computed one token at a time, not as one batch of the new prompt, and
    its rows differ (by up to ~0.9 here). With it, the same request decodes bit for bit
    alike whatever came before."""
    chat, plain = smollm2.spec.prompts[0], smollm2.spec.prompts[1]  # no common prefix
    first = engine.generate(chat, TOKENS, audit=True)
    assert len(first.tokens) >= 8 and first.ledger.forwards["prefill"] == 1
    again = engine.generate(chat, TOKENS, audit=True)
    assert again.tokens == first.tokens and same_rows(again.logits, first.logits)
    follow_up = list(chat) + first.tokens[:5]
    after_its_own_stream = engine.generate(follow_up, TOKENS, audit=True)
    engine.generate(plain, TOKENS)
    after_another = engine.generate(follow_up, TOKENS, audit=True)
    assert after_its_own_stream.tokens == after_another.tokens
    assert same_rows(after_its_own_stream.logits, after_another.logits), \
        "a decode depends on the one before it"


def same_rows(a, b) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.real_checkpoint
def test_each_token_is_the_argmax_of_its_own_row(engine, smollm2):
    for prompt in smollm2.spec.prompts[:3]:
        result = engine.generate(prompt, TOKENS, audit=True)
        assert len(result.logits) == len(result.tokens)
        assert all(row.shape == (smollm2.spec.vocab_size,) and row.dtype == np.float64
                   for row in result.logits)
        assert [int(np.argmax(row)) for row in result.logits] == result.tokens


@pytest.mark.real_checkpoint
def test_ignore_eos_forces_the_token_count(engine, smollm2):
    prompt = smollm2.spec.prompts[0]
    stops = engine.generate(prompt, 32)
    assert stops.tokens[-1] == smollm2.spec.eos_id and len(stops.tokens) < 32
    forced = engine.generate(prompt, len(stops.tokens) + 4, ignore_eos=True)
    assert len(forced.tokens) == len(stops.tokens) + 4
    assert forced.tokens[:len(stops.tokens)] == stops.tokens


class RopeBase10k(LlamaCppEngine):
    """Planted: RoPE base 10,000 instead of SmolLM2's 100,000 (llama.cpp's override)."""
    name = "llama-cpp-rope-10k"

    def options(self):
        return {**super().options(), "rope_freq_base": 10000.0}


def pooled(engine, oracle, package) -> dict:
    """``summarize`` over SANE_PROMPTS x SANE_TOKENS, each row on the engine's own prefix."""
    from suites.measure_llama_cpp import measure_stream, summarize

    return summarize([step for i in SANE_PROMPTS for step in measure_stream(
        engine, oracle, package.spec.prompts[i], SANE_TOKENS)[0]])


@pytest.mark.real_checkpoint
def test_its_rows_are_sane_against_the_oracle_and_planted_bugs_are_not(engine, smollm2,
                                                                        oracle):
    from suites.measure_llama_cpp import measure_stream, summarize

    honest = pooled(engine, oracle, smollm2)
    print("llama-cpp vs the float32 oracle:", honest)
    assert honest["finite"] and honest["own_argmax"] == honest["steps"]
    assert honest["nmse_median"] <= SANE_NMSE_MEDIAN and honest["kl_mean"] <= SANE_KL_MEAN
    assert honest["oracle_argmax"] >= SANE_ARGMAX_SHARE * honest["steps"]

    rope = RopeBase10k(smollm2)
    try:
        planted = pooled(rope, oracle, smollm2)
    finally:
        rope.close()
    print("RoPE base 10,000:", planted)
    assert planted["nmse_median"] > 5 * SANE_NMSE_MEDIAN
    assert planted["kl_mean"] > 5 * SANE_KL_MEAN

    chat = smollm2.spec.prompts[0]
    assert chat[0] == smollm2.spec.bos_id
    dropped = summarize(measure_stream(engine, oracle, chat, SANE_TOKENS, fed=chat[1:])[0])
    print("BOS dropped:", dropped)
    assert dropped["nmse_median"] > 5 * SANE_NMSE_MEDIAN and dropped["kl_mean"] > SANE_KL_MEAN


@pytest.mark.real_checkpoint
def test_lockstep_run_writes_records_with_its_provenance(smollm2, tmp_path, capsys,
                                                          monkeypatch):
    from harness.cli import main
    from harness.evidence.store import load_evidence_dir

    monkeypatch.setenv("COLUMNS", "400")
    status = main(["run", "--engines", "llama-cpp", "--packages", "smollm2", "--max-prompts",
                   "2", "--max-new-tokens", "8", "--evidence-dir", str(tmp_path)])
    out = capsys.readouterr().out
    print(out)
    records = [r for r in load_evidence_dir(tmp_path) if r.engine == "llama-cpp"]
    assert len(records) == 2
    for r in records:
        # judged by the checked-in ggml-cpu:q4_1 band (docs/QUANTIZED.md), and within it
        assert r.status in ("identical", "near-tie"), r.reason
        assert r.engine_provenance["numeric_scheme"] == "ggml-cpu:q4_1"
        assert r.numeric_scheme == "ggml-cpu:q4_1" and r.band is not None and r.band.within
        assert r.band.provenance["engine"] == "llama-cpp" and r.band.provenance["corpus"]
        assert r.engine_provenance["checkpoint"]["content_hash"] == \
            json.loads((smollm2.root / "checkpoint.json").read_text())["source"][
                "content_hash"]
    assert status == 0
