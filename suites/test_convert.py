"""The checkpoint converter on tiny synthetic checkpoints: GGUF (written and quantized by
the gguf package itself) and Hugging Face folders (written by safetensors).

Facts: dequantization equals ``gguf.quants.dequantize`` bit for bit and the block layouts
match their specification; converted packages decode identically on every host engine;
transformers (``hf``) computes the same logits from the same weights, which checks the
RoPE pairing, the GGUF Q/K permutation and the weight mapping; the tokenizer splits as the
checkpoint says; conversions are cached by content; bad checkpoints fail naming the cause.
"""
from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto

gguf = pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("tokenizers", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("safetensors", reason="the converter needs the 'real' extra (make real)")

from engines.errors import InputError  # noqa: E402
from engines.oracle import Oracle, oracle_decode, oracle_for, reference_package  # noqa: E402
from engines.package import load_package, package_content_hash  # noqa: E402
from engines.registry import get_engine_class  # noqa: E402
from engines.tolerances import tolerance_for  # noqa: E402
from engines.workflow import greedy_decode  # noqa: E402
from harness.convert.conversion import convert, read_checkpoint  # noqa: E402
from engines.gguf_header import field_value, tensor_table  # noqa: E402
from harness.convert.gguf_reader import dequantize_tensor, open_gguf, weight_key  # noqa: E402
from harness.compare import compare_tensors  # noqa: E402
from harness.judgement import IDENTICAL, audit_logits, judge_stream  # noqa: E402
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


def test_the_header_walk_reads_the_tensor_table_the_full_reader_reads(tiny_gguf, tmp_path):
    """``tensor_table`` (what ``gguf_scheme`` reads) agrees with gguf's own parse on every
    tensor's name, type and element count and on the scalar metadata; a file it cannot
    follow (cut short in the tensor infos, not GGUF) is None, never a wrong table."""
    reader = gguf.GGUFReader(str(tiny_gguf))
    table = tensor_table(tiny_gguf)
    assert table.tensors == [(t.name, int(t.tensor_type), int(t.n_elements))
                             for t in reader.tensors]
    scalars = {name: field_value(reader, name) for name, f in reader.fields.items()
               if not name.startswith("GGUF.") and f.types[0] != gguf.GGUFValueType.ARRAY}
    assert table.metadata == scalars and table.metadata["general.architecture"] == "llama"
    data = tiny_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[:data.index(b"blk.0.attn_q.weight") + 8])
    assert tensor_table(cut) is None
    cut.write_bytes(b"PK\x03\x04" + data[4:])
    assert tensor_table(cut) is None


def test_a_gguf_is_parsed_once_until_it_is_written_again(tiny_gguf, tmp_path):
    """``open_gguf`` keeps the last readers by the file's identity: the same file opens to
    the same reader; a copy written over it is read afresh."""
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(tiny_gguf.read_bytes())
    first = open_gguf(copy)
    assert open_gguf(copy) is first and open_gguf(str(copy)) is first
    copy.unlink()
    write_tiny_gguf(copy)
    assert open_gguf(copy) is not first


# -- converted packages run --------------------------------------------------------------

@pytest.mark.claim("token_identity")
@pytest.mark.parametrize("engine_name", ["ort-cpu", "native-host", "onnx-reference"])
def test_converted_gguf_decodes_like_the_oracle(gguf_package, engine_name):
    pkg = gguf_package
    tol = tolerance_for(pkg.spec.dtype)
    oracle = Oracle(pkg)
    engine = get_engine_class(engine_name)(pkg)
    for prompt in pkg.spec.prompts[:2]:
        result = greedy_decode(engine, prompt, TOKENS)
        j = judge_stream(oracle, prompt, result.tokens, TOKENS, tol)
        assert j.defects == 0, (engine_name, j.findings)


def _logits(engine, prompt):
    comp = engine.package.spec.components["target"]
    n = len(prompt)
    feeds = {comp.inputs["tokens"]: np.asarray([prompt], dtype=np.int64),
             comp.inputs["positions"]: np.arange(n, dtype=np.int64).reshape(1, n)}
    for cell in engine.package.spec.state_of("target").values():
        feeds[cell.input] = np.zeros(cell.shape, dtype=np.float32)
    return engine.run_component("target", feeds)[comp.outputs["logits"]]


@pytest.mark.claim("logits_within_tolerance", "token_identity")
@pytest.mark.skipif(not hf_available(), reason="hf engine needs the 'hf' extra (torch, "
                                                "transformers)")
def test_transformers_computes_the_same_logits_from_a_gguf(gguf_package):
    """GGUF Q/K are permuted for adjacent-pair RoPE; hf un-permutes them and rotates halves."""
    ort = get_engine_class("ort-cpu")(gguf_package)
    hf = get_engine_class("hf")(gguf_package)
    prompt = gguf_package.spec.prompts[0]
    cmp = compare_tensors(_logits(hf, prompt), _logits(ort, prompt), "float32")
    assert cmp.ok, cmp.reason
    result = hf.greedy(prompt, TOKENS)
    j = judge_stream(Oracle(gguf_package), prompt, result.tokens, TOKENS,
                     tolerance_for(gguf_package.spec.dtype))
    assert j.defects == 0, j.findings


@pytest.mark.claim("token_identity")
def test_static_cache_and_float16_variants_decode_the_same_stream(tiny_gguf, gguf_package,
                                                                  tmp_path):
    static = load_package(convert(tiny_gguf, tmp_path / "s", cache="static").folder)
    assert static.spec.state["k0"].update == "static"
    assert static.spec.state["k0"].shape[2] == static.spec.max_context
    prompt = gguf_package.spec.prompts[1]
    result = greedy_decode(get_engine_class("native-host")(static), prompt, TOKENS)
    j = judge_stream(Oracle(gguf_package), prompt, result.tokens, TOKENS,
                     tolerance_for(gguf_package.spec.dtype))
    assert j.defects == 0, j.findings

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


@pytest.mark.claim("token_identity")
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
    result = greedy_decode(get_engine_class("native-host")(pkg), prompt, TOKENS)
    j = judge_stream(Oracle(pkg), prompt, result.tokens, TOKENS, tolerance_for(pkg.spec.dtype))
    assert j.defects == 0, j.findings
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


def test_layer_skip_drafter_keeps_no_second_copy_of_the_target_weights(tiny_gguf, tmp_path):
    """The drafter's initializers point into target.onnx.data (one copy on disk) and every
    one of them loads (their values: a drafter of every block computes the target's logits,
    the test above); a tensor whose bytes differ from the donor's keeps its own copy."""
    from onnx.external_data_helper import ExternalDataInfo, uses_external_data

    from harness.convert.writer import point_at_donor_data

    folder = convert(tiny_gguf, tmp_path / "d", draft_layers=1).folder
    drafter = onnx.load(str(folder / "drafter.onnx"), load_external_data=False)
    external = [t for t in drafter.graph.initializer if uses_external_data(t)]
    assert external and {ExternalDataInfo(t).location for t in external} == {"target.onnx.data"}
    assert not (folder / "drafter.onnx.data").exists()
    loaded = onnx.load(str(folder / "drafter.onnx"))
    for tensor in loaded.graph.initializer:
        assert tensor.raw_data  # every shared tensor loads from the target's file

    # the drafter with its bytes in memory, shared with a copy of the target whose largest
    # tensor has four bytes changed: that tensor keeps its own bytes, every other is shared
    own = onnx.load(str(folder / "drafter.onnx"))
    donor = tmp_path / "donor"
    donor.mkdir()
    target = onnx.load(str(folder / "target.onnx"))
    victim = max(target.graph.initializer, key=lambda t: len(t.raw_data))
    victim.raw_data = bytes(b ^ 0xFF for b in victim.raw_data[:4]) + victim.raw_data[4:]
    changed, changed_bytes = victim.name, len(victim.raw_data)
    onnx.save_model(target, str(donor / "target.onnx"), save_as_external_data=True,
                    all_tensors_to_one_file=True, location="target.onnx.data",
                    size_threshold=1024)
    total = sum(len(t.raw_data) for t in own.graph.initializer if len(t.raw_data) >= 1024)
    shared = point_at_donor_data(own, donor / "target.onnx")
    kept = {t.name for t in own.graph.initializer if t.HasField("raw_data")}
    assert changed in kept and 0 < shared == total - changed_bytes


@pytest.mark.claim("token_identity", "spec_equals_greedy")
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
    oracle = Oracle(pkg)
    trace = oracle.decode(prompt, TOKENS)
    tol = tolerance_for(pkg.spec.dtype)
    for engine_name in ("ort-cpu", "native-host"):
        engine = get_engine_class(engine_name)(pkg)
        greedy = greedy_decode(engine, prompt, TOKENS).tokens
        assert greedy == trace.tokens, (engine_name, greedy, trace.tokens)  # exact
        j = judge_stream(oracle, prompt, greedy, TOKENS, tol)
        assert j.verdict == IDENTICAL, (engine_name, j.findings)
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
    with pytest.raises(InputError, match="already holds notes.txt") as err:
        convert(tiny_gguf, keep)
    assert err.value.field == "-o" and "--force" in err.value.remedy
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
    assert main(["convert", str(tiny_gguf), "-o", str(tmp_path / "b"), "--dtype",
                 "bfloat16"]) == 0
    out = capsys.readouterr().out
    assert "bfloat16" in out and "reference (the oracle runs it)" in out
    assert load_package(tmp_path / "b").spec.reference is not None
    assert main(["convert", str(tiny_gguf), "-o", str(tmp_path / "n"), "--dtype", "float16",
                 "--no-twin"]) == 0
    assert load_package(tmp_path / "n").spec.reference is None
    assert "reference" not in capsys.readouterr().out
    for bad in ("3", "0"):  # the tiny checkpoint has 2 blocks
        assert main(["convert", str(tiny_gguf), "-o", str(tmp_path / "e"),
                     "--draft-layers", bad]) == 2
        err = capsys.readouterr().err
        assert "--draft-layers" in err and bad in err


def test_shipped_real_prompts_cover_every_kind_and_topic():
    from harness.real_prompts import KINDS, TOPICS, load_prompts

    prompts = load_prompts()
    assert {p.kind for p in prompts} == set(KINDS)
    assert {p.topic for p in prompts} == set(TOPICS)
    assert len({p.name for p in prompts}) == len(prompts)
    chat = next(p for p in prompts if p.kind == "chat")
    assert chat.render() == f"<|im_start|>user\n{chat.text}<|im_end|>\n<|im_start|>assistant\n"


# -- reduced precision: where the casts go, and the float32 twin ---------------------------

REDUCED = {"float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}
# ops that only ever compute in float32 in a mixed graph: RMSNorm (square, mean, rsqrt),
# rotary (Neg of the rotated half), softmax, SwiGLU's sigmoid
FLOAT32_ONLY = ("ReduceMean", "Sqrt", "Reciprocal", "Softmax", "Sigmoid", "Neg")


def elem_types(model) -> dict[str, int]:
    """Every value's element type (graph ports, initializers, inferred intermediates)."""
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=True)
    g = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in (*g.input, *g.output, *g.value_info)}
    types.update({t.name: t.data_type for t in g.initializer})
    return types


def float_values(node, types) -> list[tuple[str, int]]:
    floats = (TensorProto.FLOAT, *REDUCED.values())
    return [(v, types[v]) for v in (*node.input, *node.output) if v and types.get(v) in floats]


@pytest.mark.parametrize("dtype,cache", [("float16", "dynamic"), ("bfloat16", "dynamic"),
                                         ("float16", "static")])
def test_reduced_graph_keeps_norms_softmax_rotary_and_residual_in_float32(tiny_gguf, tmp_path,
                                                                          dtype, cache):
    """The mixed-precision contract, node by node on the converted graph: every MatMul
    reads and writes the reduced dtype (weights included); norms, rotary, softmax and
    SwiGLU compute in float32 with float32 gains and tables; every Add and Mul (residual
    stream, eps, rotary, scale, SwiGLU) is float32; Casts sit only at those boundaries, 7 up
    and 6 down per block plus the embedding's and the final norm's; KV cells, hidden and
    logits are the reduced dtype, which the package's dtype names."""
    pkg = load_package(convert(tiny_gguf, tmp_path / "r", dtype=dtype, cache=cache).folder)
    low, f32 = REDUCED[dtype], TensorProto.FLOAT
    assert pkg.spec.dtype == dtype
    assert all(c.dtype == dtype for c in pkg.spec.state.values())
    model = pkg.component_model("target")
    types = elem_types(model)
    ops = {}
    for node in model.graph.node:
        ops[node.op_type] = ops.get(node.op_type, 0) + 1
        values = float_values(node, types)
        if node.op_type == "MatMul":
            assert all(t == low for _, t in values), (node.name, values)
        elif node.op_type in FLOAT32_ONLY + ("Add", "Mul"):
            assert all(t == f32 for _, t in values), (node.name, values)
        elif node.op_type == "Cast":
            (src, a), (dst, b) = values
            assert {a, b} == {low, f32}, (node.name, values)
    up = sum(1 for n in model.graph.node if n.op_type == "Cast" and
             types[n.output[0]] == f32)
    down = ops["Cast"] - up
    blocks = 2
    assert (up, down) == (1 + 7 * blocks, 6 * blocks + 1)
    inits = {t.name: t.data_type for t in model.graph.initializer}
    names = json.loads((pkg.root / "checkpoint.json").read_text())["weights"]["target"]
    for key, name in names.items():
        norm = key.endswith("norm")
        assert inits[name] == (f32 if norm else low), (key, inits[name])
    rope = [t for n, t in inits.items() if n.startswith("rope_")]
    assert rope and all(t == f32 for t in rope)
    outs = {o.name: o.type.tensor_type.elem_type for o in model.graph.output}
    assert outs["logits"] == outs["hidden"] == outs["present_key_0"] == low


def test_float32_conversion_has_no_cast_and_no_reference(gguf_package):
    model = gguf_package.component_model("target")
    assert not any(n.op_type == "Cast" for n in model.graph.node)
    assert gguf_package.spec.reference is None
    assert reference_package(gguf_package) is gguf_package


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_reduced_conversion_declares_its_float32_twin_as_the_reference(tiny_gguf, tmp_path,
                                                                       dtype):
    pkg = load_package(convert(tiny_gguf, tmp_path / "r", dtype=dtype).folder)
    ref = pkg.spec.reference
    twin_folder = tmp_path / ref.folder  # a sibling of the package
    plain = convert(tiny_gguf, twin_folder)  # the plain float32 conversion is the twin
    assert plain.reused and package_content_hash(twin_folder) == ref.content_hash
    twin = reference_package(pkg)
    assert twin.root == twin_folder.resolve() and twin.spec.dtype == "float32"
    assert twin.spec.reference is None and twin.spec.state["k0"].update == "append"
    oracle = oracle_for(pkg)
    assert oracle.package.root == twin.root and oracle.name == "ort-cpu"
    alone = load_package(convert(tiny_gguf, tmp_path / "alone", dtype=dtype, twin=False).folder)
    assert alone.spec.reference is None and reference_package(alone) is alone
    if dtype == "float16":  # without a twin the package judges itself (ort-cpu has no bf16)
        assert oracle_for(alone).package is alone


def test_a_reference_that_changed_or_went_missing_is_refused(tiny_gguf, tmp_path):
    from engines.errors import PackageError

    pkg = load_package(convert(tiny_gguf, tmp_path / "r", dtype="float16").folder)
    twin = tmp_path / pkg.spec.reference.folder
    (twin / "package.yaml").write_text((twin / "package.yaml").read_text() + "\n")
    with pytest.raises(PackageError) as err:
        oracle_for(pkg)
    assert err.value.field == "reference.content_hash" and "has changed" in str(err.value)
    import shutil

    shutil.rmtree(twin)
    with pytest.raises(PackageError) as err:
        oracle_for(pkg)
    assert err.value.field == "reference.folder" and "--dtype float16" in err.value.remedy
    again = load_package(convert(tiny_gguf, tmp_path / "r", dtype="float16").folder)
    assert oracle_for(again).package.spec.dtype == "float32"  # converting again restores it


@pytest.mark.claim("token_identity", "logits_within_tolerance", "finite_logits")
@pytest.mark.parametrize("dtype,engine_name,cache", [
    ("float16", "ort-cpu", "dynamic"), ("float16", "native-host", "dynamic"),
    ("float16", "onnx-reference", "dynamic"), ("bfloat16", "native-host", "dynamic"),
    ("bfloat16", "onnx-reference", "dynamic"), ("float16", "ort-cpu", "static"),
    ("bfloat16", "native-host", "static")])
def test_reduced_conversion_follows_its_float32_twin(tiny_gguf, tmp_path, dtype, engine_name,
                                                     cache):
    """Judged against the twin (the oracle oracle_for picks; dynamic cache whatever the
    package's) with the reduced dtype's row: no defect, logits finite and within the row's
    logits bounds at every step."""
    pkg = load_package(convert(tiny_gguf, tmp_path / "r", dtype=dtype, cache=cache).folder)
    tol = tolerance_for(dtype)
    oracle = oracle_for(pkg)
    engine = get_engine_class(engine_name)(pkg)
    for prompt in pkg.spec.prompts[:2]:
        result = greedy_decode(engine, prompt, TOKENS, audit=True)
        j = judge_stream(oracle, prompt, result.tokens, TOKENS, tol, result.logits)
        assert j.defects == 0, (engine_name, j.findings)
        audit = audit_logits(oracle, prompt, result.tokens, result.logits, tol)
        assert audit.non_finite_steps == 0 and audit.within_tolerance, (
            engine_name, [(s.step, s.max_abs, s.nmse) for s in audit.steps])


def test_ort_cpu_cannot_run_bfloat16_and_says_why(tiny_gguf, tmp_path):
    """onnxruntime's CPU provider has no bfloat16 MatMul (and its Python binding takes no
    ml_dtypes.bfloat16 array): the engine must refuse the package at load, naming why."""
    from engines.errors import EngineUnavailable

    pkg = load_package(convert(tiny_gguf, tmp_path / "r", dtype="bfloat16").folder)
    with pytest.raises(Exception) as err:
        get_engine_class("ort-cpu")(pkg)
    if not isinstance(err.value, EngineUnavailable):
        pytest.xfail(f"ort-cpu raises {type(err.value).__name__}, not EngineUnavailable, on a "
                     f"bfloat16 package (the backend change is pending): {err.value}")
    assert "bfloat16" in str(err.value)


def _scaled_tiny(dtype: str, precision: str, scale: float):
    """A random tiny decoder whose embedding rows are ``scale`` times larger: a residual
    stream in the hundreds, as a trained checkpoint's, whose square overflows float16."""
    from harness.convert.llama_config import LlamaConfig, llama_weights
    from harness.convert.llama_graph import llama_graph

    c = LlamaConfig(dtype=dtype, precision=precision, head_scale=None, seed=5)
    w = llama_weights(c)
    w["embed"] = w["embed"] * scale
    return c, llama_graph(c, w)[0]


@pytest.mark.claim("finite_logits")
def test_mixed_float16_survives_a_residual_stream_whose_square_overflows(tmp_path):
    """The bug this fixes, planted: with embeddings of magnitude ~400 a uniform float16
    graph's RMSNorm squares past 65504 and its logits collapse on native-host; the mixed
    graph raises no numpy warning, its logits are finite and its argmax is the float32
    graph's at every position."""
    import warnings

    from engines.native.array_backend import NumpyArrayBackend
    from engines.native.plan import Plan

    prompt = np.asarray([[1, 17, 42, 5]], dtype=np.int64)

    def run(dtype, precision):
        c, model = _scaled_tiny(dtype, precision, 400.0)
        feeds = {"input_ids": prompt, "position_ids": np.arange(4, dtype=np.int64)[None]}
        for i in range(c.layers):
            for kind in ("key", "value"):
                feeds[f"past_{kind}_{i}"] = np.zeros((1, c.kv_heads, 0, c.head_dim),
                                                     dtype=np.float16 if dtype != "float32"
                                                     else np.float32)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore" if precision == "uniform" else "error")
            return Plan(model, NumpyArrayBackend()).run(feeds)["logits"][0].astype(np.float64)

    uniform = run("float16", "uniform")
    # the planted failure, as SmolLM2's uniform float16 package did: the square overflows to
    # inf, rsqrt(inf) is 0, every logit collapses to 0 (or NaN) and greedy emits token 0
    assert not np.isfinite(uniform).all() or (uniform == 0).all()
    mixed, exact = run("float16", "mixed"), run("float32", "uniform")
    assert np.isfinite(mixed).all()
    assert (mixed.argmax(-1) == exact.argmax(-1)).all()
    assert np.abs(mixed - exact).max() <= 0.05 * np.abs(exact).max()
