"""The checkpoint converter on tiny synthetic checkpoints: GGUF (written and quantized by
the gguf package itself) and Hugging Face folders (written by safetensors).

Facts: dequantization equals ``gguf.quants.dequantize`` bit for bit and the block layouts
match their specification; converted packages decode identically on every host engine;
transformers (``hf``) computes the same logits from the same weights, which checks the
RoPE pairing, the GGUF Q/K permutation and the weight mapping; the tokenizer splits as the
checkpoint says; conversions are cached by content; bad checkpoints fail naming the cause.
"""
from __future__ import annotations

import numpy as np
import pytest

gguf = pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("tokenizers", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("safetensors", reason="the converter needs the 'real' extra (make real)")

from engines.errors import InputError  # noqa: E402
from engines.oracle import oracle_decode  # noqa: E402
from engines.package import load_package  # noqa: E402
from engines.registry import get_engine_class  # noqa: E402
from engines.tolerances import tolerance_for  # noqa: E402
from engines.workflow import greedy_decode  # noqa: E402
from fixtures.convert import convert, read_checkpoint  # noqa: E402
from fixtures.convert.gguf_reader import dequantize_tensor, open_gguf, weight_key  # noqa: E402
from harness.compare import DEFECT, compare_tensors, compare_tokens  # noqa: E402
from suites.convert_support import (GGUF_TYPES, write_tiny_gguf,  # noqa: E402
                                    write_tiny_hf)

TOKENS = 6


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    return write_tiny_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf")


@pytest.fixture(scope="module")
def gguf_package(tiny_gguf, tmp_path_factory):
    return load_package(convert(tiny_gguf, tmp_path_factory.mktemp("pkg") / "p").folder)


def hf_available() -> bool:
    return get_engine_class("hf").availability().ok


# -- dequantization ----------------------------------------------------------------------

def test_every_tensor_dequantizes_as_gguf_quants_does_bit_for_bit(tiny_gguf):
    reader = open_gguf(tiny_gguf)
    ckpt = read_checkpoint(tiny_gguf, with_tokenizer=False)
    seen = set()
    for tensor in reader.tensors:
        seen.add(tensor.tensor_type.name)
        reference = gguf.quants.dequantize(np.asarray(tensor.data), tensor.tensor_type)
        reference = reference.reshape(tuple(int(d) for d in reversed(tensor.shape)))
        key = weight_key(tensor.name)
        ours = ckpt.weights[key]
        ours = ours.T if ours.ndim == 2 and key != "embed" else ours
        assert ours.dtype == np.float32
        assert ours.shape == reference.shape, tensor.name
        assert np.array_equal(ours.view(np.uint32), reference.astype(np.float32).view(np.uint32)), \
            tensor.name
    assert seen == set(GGUF_TYPES.values())  # F32 F16 BF16 Q8_0 Q4_0 Q4_1 Q5_0 Q5_1


def _blocks(tensor):
    return np.asarray(tensor.data).reshape(-1, tensor.data.shape[-1])


def test_q4_1_and_q8_0_blocks_decode_as_specified(tiny_gguf):
    """Independent of gguf's code: Q4_1 = f16 d, f16 m, 16 bytes of nibbles (low nibbles are
    elements 0-15, high 16-31), value d*q + m; Q8_0 = f16 d, 32 int8, value d*q."""
    reader = open_gguf(tiny_gguf)
    by_name = {t.name: t for t in reader.tensors}
    q41 = by_name["blk.0.attn_q.weight"]
    raw = _blocks(q41)[0]
    d, m = raw[0:2].view(np.float16).astype(np.float32), raw[2:4].view(np.float16).astype(np.float32)
    nibbles = raw[4:20]
    q = np.concatenate([nibbles & 0x0F, nibbles >> 4]).astype(np.float32)
    expected = d[0] * q + m[0]
    got = dequantize_tensor(q41)[0, :32]
    assert np.array_equal(got, expected)
    q80 = by_name["token_embd.weight"]
    raw = _blocks(q80)[5]
    d = raw[0:2].view(np.float16).astype(np.float32)[0]
    expected = d * raw[2:34].view(np.int8).astype(np.float32)
    assert np.array_equal(dequantize_tensor(q80)[5, :32], expected)


# -- converted packages run --------------------------------------------------------------

@pytest.mark.parametrize("engine_name", ["ort-cpu", "native-host", "onnx-reference"])
def test_converted_gguf_decodes_like_the_oracle(gguf_package, engine_name):
    pkg = gguf_package
    near_tie = tolerance_for(pkg.spec.dtype).near_tie_margin
    engine = get_engine_class(engine_name)(pkg)
    for prompt in pkg.spec.prompts[:2]:
        oracle = oracle_decode(pkg, prompt, TOKENS)
        result = greedy_decode(engine, prompt, TOKENS)
        div = compare_tokens(oracle.tokens, oracle.margins, result.tokens, near_tie)
        assert div is None or div.verdict != DEFECT, (engine_name, div)


def _logits(engine, prompt):
    comp = engine.package.spec.components["target"]
    n = len(prompt)
    feeds = {comp.inputs["tokens"]: np.asarray([prompt], dtype=np.int64),
             comp.inputs["positions"]: np.arange(n, dtype=np.int64).reshape(1, n)}
    for cell in engine.package.spec.state_of("target").values():
        feeds[cell.input] = np.zeros(cell.shape, dtype=np.float32)
    return engine.run_component("target", feeds)[comp.outputs["logits"]]


@pytest.mark.skipif(not hf_available(), reason="hf engine needs the 'hf' extra (torch, "
                                                "transformers)")
def test_transformers_computes_the_same_logits_from_a_gguf(gguf_package):
    """GGUF Q/K are permuted for adjacent-pair RoPE; hf un-permutes them and rotates halves."""
    ort = get_engine_class("ort-cpu")(gguf_package)
    hf = get_engine_class("hf")(gguf_package)
    prompt = gguf_package.spec.prompts[0]
    cmp = compare_tensors(_logits(hf, prompt), _logits(ort, prompt), "float32")
    assert cmp.ok, cmp.reason
    oracle = oracle_decode(gguf_package, prompt, TOKENS)
    result = hf.greedy(prompt, TOKENS)
    div = compare_tokens(oracle.tokens, oracle.margins, result.tokens, 1e-2)
    assert div is None or div.verdict != DEFECT, div


def test_static_cache_and_float16_variants_decode_the_same_stream(tiny_gguf, gguf_package,
                                                                  tmp_path):
    static = load_package(convert(tiny_gguf, tmp_path / "s", cache="static").folder)
    assert static.spec.state["k0"].update == "static"
    assert static.spec.state["k0"].shape[2] == static.spec.max_context
    prompt = gguf_package.spec.prompts[1]
    reference = oracle_decode(gguf_package, prompt, TOKENS)
    result = greedy_decode(get_engine_class("native-host")(static), prompt, TOKENS)
    div = compare_tokens(reference.tokens, reference.margins, result.tokens, 1e-2)
    assert div is None or div.verdict != DEFECT, div

    half = load_package(convert(tiny_gguf, tmp_path / "h", dtype="float16").folder)
    assert half.spec.dtype == "float16"
    inits = {t.name: t for t in half.component_model("target").graph.initializer}
    from onnx import numpy_helper

    names = __import__("json").loads((half.root / "checkpoint.json").read_text())["weights"]
    embed = numpy_helper.to_array(inits[names["target"]["embed"]])
    ckpt = read_checkpoint(tiny_gguf, with_tokenizer=False)
    assert embed.dtype == np.float16
    assert np.array_equal(embed, ckpt.weights["embed"].astype(np.float16))  # rounded once
    trace = oracle_decode(half, prompt, TOKENS)
    assert len(trace.tokens) >= 1


@pytest.mark.parametrize("arch,tied,dtype", [("LlamaForCausalLM", False, "bfloat16"),
                                             ("Qwen2ForCausalLM", True, "float32")])
def test_hf_folder_converts_and_runs(tmp_path, arch, tied, dtype):
    folder = write_tiny_hf(tmp_path / "hf", arch=arch, tied=tied, dtype=dtype)
    ckpt = read_checkpoint(folder)
    assert ckpt.arch.rope_layout == "halves" and ckpt.arch.tied is tied
    assert ckpt.arch.attention_bias is (arch == "Qwen2ForCausalLM")
    if dtype == "bfloat16":  # BF16 widened exactly: the bits are the high half of a float32
        from safetensors import safe_open  # noqa: F401 (format written by safetensors)
        import ml_dtypes

        from suites.convert_support import tiny_weights

        src = tiny_weights(5, 300, tied=tied)["model.layers.0.self_attn.q_proj.weight"]
        assert np.array_equal(ckpt.weights["l0.wq"],
                              src.astype(ml_dtypes.bfloat16).astype(np.float32).T)
    pkg = load_package(convert(folder, tmp_path / "pkg").folder)
    assert pkg.spec.tokenizer is None and pkg.spec.prompts == [[1]]
    prompt = [1, 40, 7, 99, 250]
    oracle = oracle_decode(pkg, prompt, TOKENS)
    result = greedy_decode(get_engine_class("native-host")(pkg), prompt, TOKENS)
    div = compare_tokens(oracle.tokens, oracle.margins, result.tokens, 1e-2)
    assert div is None or div.verdict != DEFECT, div
    if hf_available():
        ort, hf = get_engine_class("ort-cpu")(pkg), get_engine_class("hf")(pkg)
        cmp = compare_tensors(_logits(hf, prompt), _logits(ort, prompt), "float32")
        assert cmp.ok, cmp.reason


def test_layer_skip_drafter_with_every_block_is_the_target(tiny_gguf, tmp_path):
    """The self-speculation hook: a drafter of all N blocks computes the target exactly;
    fewer blocks compute something else."""
    full = load_package(convert(tiny_gguf, tmp_path / "full", draft_layers=2).folder)
    short = load_package(convert(tiny_gguf, tmp_path / "short", draft_layers=1).folder)
    assert set(full.spec.components) == {"target", "drafter"}
    prompt = full.spec.prompts[1]

    def logits(pkg, component):
        eng = get_engine_class("ort-cpu")(pkg)
        comp = pkg.spec.components[component]
        n = len(prompt)
        feeds = {comp.inputs["tokens"]: np.asarray([prompt], dtype=np.int64),
                 comp.inputs["positions"]: np.arange(n, dtype=np.int64).reshape(1, n)}
        for cell in pkg.spec.state_of(component).values():
            feeds[cell.input] = np.zeros(cell.shape, dtype=np.float32)
        return eng.run_component(component, feeds)[comp.outputs["logits"]]

    assert np.array_equal(logits(full, "drafter"), logits(full, "target"))
    assert len(short.spec.state_of("drafter")) == 2  # one block: k and v
    assert not np.allclose(logits(short, "drafter"), logits(short, "target"))


@pytest.mark.parametrize("cache", ["dynamic", "static"])
def test_layer_skip_drafter_declares_a_draft_section_and_speculates_like_greedy(
        tiny_gguf, tmp_path, cache):
    """kind draft: the drafter proposes with its own cells, a rejection rolls back every
    target kv cell; speculative == greedy == oracle at every width on the host engines."""
    pkg = load_package(convert(tiny_gguf, tmp_path / "p", draft_layers=1, cache=cache,
                               max_context=64).folder)
    sp = pkg.spec.decoding.speculative
    target_cells = list(pkg.spec.state_of("target"))
    assert (sp.kind, sp.proposer, sp.target, sp.max_width) == ("draft", "drafter", "target", 4)
    assert sp.rollback == target_cells == ["k0", "v0", "k1", "v1"]
    assert list(pkg.spec.state_of("drafter")) == ["draft_k0", "draft_v0"]
    assert pkg.spec.name.endswith(f"-{cache}-float32-draft1")
    from engines.workflow.speculative import speculative_decode

    prompt = pkg.spec.prompts[1]
    oracle = oracle_decode(pkg, prompt, TOKENS)
    for engine_name in ("ort-cpu", "native-host"):
        engine = get_engine_class(engine_name)(pkg)
        greedy = greedy_decode(engine, prompt, TOKENS).tokens
        assert compare_tokens(oracle.tokens, oracle.margins, greedy, 1e-2) is None
        for width in range(1, 5):
            result = speculative_decode(engine, prompt, TOKENS, width)
            assert result.tokens == greedy, (engine_name, width)
            assert result.ledger.proposals > 0
        engine.close()


def test_draft_layers_are_part_of_the_conversion_key(tiny_gguf, tmp_path):
    plain = convert(tiny_gguf, tmp_path / "a")
    drafted = convert(tiny_gguf, tmp_path / "a", draft_layers=1)
    assert not drafted.reused and drafted.key != plain.key
    assert convert(tiny_gguf, tmp_path / "a", draft_layers=1).reused
    other = convert(tiny_gguf, tmp_path / "a", draft_layers=2)
    assert not other.reused and other.key not in (plain.key, drafted.key)
    assert len(load_package(other.folder).spec.state_of("drafter")) == 4
    assert load_package(convert(tiny_gguf, tmp_path / "a").folder).spec.decoding.speculative \
        is None


# -- tokenizer ---------------------------------------------------------------------------

def test_gguf_tokenizer_splits_digits_keeps_specials_and_round_trips(gguf_package):
    from engines.tokenizer import package_tokenizer

    tok = package_tokenizer(gguf_package)
    text = "<|im_start|>user\nthe 12 cats<|im_end|>\n"
    ids = tok.encode(text)
    assert ids[0] == 1 and 2 in ids  # ChatML markers are single special ids
    assert tok.encode(" the") == [261]  # merges "Ġ t" then "Ġt he" apply
    assert tok.encode("12") == [tok.token_to_id("1"), tok.token_to_id("2")]  # digits alone
    assert tok.decode(ids) == text


# -- cache and errors ----------------------------------------------------------------------

def test_conversions_are_reused_by_content_and_redone_for_other_options(tiny_gguf, tmp_path):
    first = convert(tiny_gguf, tmp_path / "a")
    again = convert(tiny_gguf, tmp_path / "a")
    assert not first.reused and again.reused and again.key == first.key
    copy = tmp_path / "renamed.gguf"
    copy.write_bytes(tiny_gguf.read_bytes())
    assert convert(copy, tmp_path / "a").reused  # same bytes, other name: same conversion
    other = convert(tiny_gguf, tmp_path / "a", max_context=64)
    assert not other.reused and other.key != first.key
    assert load_package(other.folder).spec.max_context == 64


def test_output_folder_that_is_not_a_conversion_is_never_replaced(tiny_gguf, tmp_path):
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("precious")
    with pytest.raises(InputError, match="not a lockstep conversion"):
        convert(tiny_gguf, keep)
    assert (keep / "notes.txt").read_text() == "precious"


def test_unsupported_architecture_is_named(tmp_path):
    path = write_tiny_gguf(tmp_path / "gpt2.gguf", arch="gpt2")
    with pytest.raises(InputError) as err:
        read_checkpoint(path)
    assert "'gpt2'" in str(err.value) and err.value.field == "general.architecture"
    folder = write_tiny_hf(tmp_path / "hf", arch="GPTNeoXForCausalLM")
    with pytest.raises(InputError, match="GPTNeoXForCausalLM"):
        read_checkpoint(folder)


def test_unsupported_tensor_type_is_named(tmp_path):
    path = write_tiny_gguf(tmp_path / "i32.gguf", override_type=("blk.1.attn_k.weight", "I32"))
    with pytest.raises(InputError) as err:
        read_checkpoint(path)
    assert err.value.value == "I32" and "blk.1.attn_k.weight" in str(err.value)


def test_rope_scaling_and_missing_weights_are_refused(tmp_path):
    scaled = write_tiny_hf(tmp_path / "s", extra_config={"rope_scaling": {"rope_type": "yarn",
                                                                          "factor": 4.0}})
    with pytest.raises(InputError, match="yarn"):
        read_checkpoint(scaled)
    untied = write_tiny_hf(tmp_path / "u", tied=False)
    config = __import__("json").loads((untied / "config.json").read_text())
    from safetensors.numpy import load_file, save_file

    weights = load_file(str(untied / "model.safetensors"))
    del weights["lm_head.weight"]
    save_file(weights, str(untied / "model.safetensors"))
    assert config["tie_word_embeddings"] is False
    with pytest.raises(InputError, match="lacks 1 weight"):
        convert(untied, tmp_path / "out")


def test_cli_converts_and_reports_errors_without_traceback(tiny_gguf, tmp_path, capsys):
    from harness.cli import main

    assert main(["convert", str(tiny_gguf), "-o", str(tmp_path / "p"), "--cache", "static",
                 "--max-context", "48"]) == 0
    assert load_package(tmp_path / "p").spec.max_context == 48
    assert "converted" in capsys.readouterr().out
    assert main(["convert", str(tmp_path / "absent.gguf"), "-o", str(tmp_path / "q")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main(["convert", str(tiny_gguf), "-o", str(tmp_path / "d"), "--draft-layers", "1"]) == 0
    assert load_package(tmp_path / "d").spec.decoding.speculative.proposer == "drafter"
    assert "--mode speculative" in capsys.readouterr().out
    for bad in ("3", "0"):  # the tiny checkpoint has 2 blocks
        assert main(["convert", str(tiny_gguf), "-o", str(tmp_path / "e"),
                     "--draft-layers", bad]) == 2
        err = capsys.readouterr().err
        assert "--draft-layers" in err and bad in err


def test_shipped_real_prompts_cover_every_kind_and_topic():
    from fixtures.real_checkpoints import KINDS, TOPICS, load_prompts

    prompts = load_prompts()
    assert {p.kind for p in prompts} == set(KINDS)
    assert {p.topic for p in prompts} == set(TOPICS)
    assert len({p.name for p in prompts}) == len(prompts)
    chat = next(p for p in prompts if p.kind == "chat")
    assert chat.render() == f"<|im_start|>user\n{chat.text}<|im_end|>\n<|im_start|>assistant\n"
