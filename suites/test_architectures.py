"""Every architecture the converter supports, checked against transformers' own class.

Facts: for random tiny configurations of each architecture (layers, heads, KV heads,
head_dim, vocabulary, tying, biases, RoPE variants, sliding windows, checkpoint dtype, cache
kind), the converted package computes transformers' logits within the float32 tolerance,
transformers' greedy stream passes lockstep's oracle on its own prefix, and ort-cpu and
native-host decode what the oracle decodes; each modelled feature matters (the package with
that one feature knocked out disagrees with transformers), so the checks above can fail;
every config field that changes numerics is modelled or refused by name.
"""
from __future__ import annotations

import dataclasses
import json
import warnings

import numpy as np
import pytest

pytest.importorskip("safetensors", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("transformers", reason="the architecture suite needs the 'hf' extra")
pytest.importorskip("torch", reason="the architecture suite needs the 'hf' extra")

from hypothesis import example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from engines.errors import InputError  # noqa: E402
from engines.oracle import Oracle  # noqa: E402
from engines.package import load_package  # noqa: E402
from engines.registry import get_engine_class  # noqa: E402
from engines.tolerances import tolerance_for  # noqa: E402
from engines.workflow import greedy_decode  # noqa: E402
from harness.compare import compare_tensors  # noqa: E402
from harness.convert import convert, read_checkpoint  # noqa: E402
from harness.convert.writer import ConvertOptions, write_converted  # noqa: E402
from harness.judge import judge_stream  # noqa: E402
from suites.architecture_checkpoints import (FAMILIES, GEMMA, TinySpec,  # noqa: E402
                                             build_model, save_checkpoint,
                                             transformers_greedy, write_gguf)

warnings.filterwarnings("ignore", module="transformers")
TOKENS = 6
PROMPT = [1, 5, 9, 17, 33, 60, 2, 44, 7, 11]  # 10 + 6 positions: past every sampled window
WINDOWED = ("mistral", "phi3", "mixtral", *GEMMA)
# the RoPE variants sampled per family (Gemma3: linear scaling on its full-attention layers)
ROPE_VARIANTS = {"llama": ["default", "linear", "llama3"],
                 "granite": ["default", "linear", "llama3"], "gemma3": ["default", "linear"]}
# a handful of examples per architecture (two per cache kind) under the ci profile, more at night
EXAMPLES = max(2, settings().max_examples // 6)


def logits_of(pkg, prompt) -> np.ndarray:
    """The target's prompt logits on ort-cpu, from empty state."""
    engine = get_engine_class("ort-cpu")(pkg)
    comp = pkg.spec.components["target"]
    n = len(prompt)
    feeds = {comp.inputs["tokens"]: np.asarray([prompt], dtype=np.int64),
             comp.inputs["positions"]: np.arange(n, dtype=np.int64).reshape(1, n)}
    for cell in pkg.spec.state_of("target").values():
        feeds[cell.input] = np.zeros(cell.shape, dtype=np.float32)
    return engine.run_component("target", feeds)[comp.outputs["logits"]][0]


@st.composite
def tiny_specs(draw, family: str):
    kv_heads = draw(st.sampled_from([1, 2]))
    spec = TinySpec(
        family=family, layers=draw(st.integers(1, 3)),
        heads=kv_heads * draw(st.sampled_from([1, 2])), kv_heads=kv_heads,
        head_dim=draw(st.sampled_from([8, 16, 32])), vocab=draw(st.integers(64, 300)),
        tied=draw(st.booleans()), bias=draw(st.booleans()),
        window=draw(st.sampled_from([None, 2, 3, 5])) if family in WINDOWED else None,
        rope=draw(st.sampled_from(ROPE_VARIANTS.get(family, ["default"]))))
    return spec, draw(st.sampled_from(["float32", "bfloat16"])), draw(st.integers(0, 2 ** 16))


def everything_on(family: str):
    """The explicit example every run includes: each feature the family has, switched on."""
    spec = TinySpec(family, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=200, tied=True,
                    bias=True, window=3 if family in WINDOWED else None,
                    rope=ROPE_VARIANTS.get(family, ["default"])[-1])
    return spec, "bfloat16", 1


def _agrees_with_transformers(tmp_path, spec: TinySpec, storage: str, cache: str, seed: int):
    folder, model = save_checkpoint(spec, seed, tmp_path / "hf")
    if storage == "bfloat16":  # the checkpoint as most are shipped, saved by transformers
        import copy

        import torch

        copy.deepcopy(model).to(torch.bfloat16).save_pretrained(str(folder))
        with torch.no_grad():  # the reference: the same rounded weights, float32 buffers
            for param in model.parameters():
                param.copy_(param.to(torch.bfloat16).float())
    pkg = load_package(convert(folder, tmp_path / "pkg", cache=cache, max_context=32,
                               force=True).folder)
    assert pkg.spec.vocab_size == spec.vocab
    tol = tolerance_for(pkg.spec.dtype)
    expected, hf_logits = transformers_greedy(model, PROMPT, TOKENS)
    cmp = compare_tensors(logits_of(pkg, PROMPT), hf_logits, "float32")
    assert cmp.ok, (spec, cmp.reason)
    oracle = Oracle(pkg)
    j = judge_stream(oracle, PROMPT, expected, TOKENS, tol)
    assert j.defects == 0, (spec, "transformers' stream", j.findings)
    for name in ("ort-cpu", "native-host"):
        got = greedy_decode(get_engine_class(name)(pkg), PROMPT, TOKENS).tokens
        j = judge_stream(oracle, PROMPT, got, TOKENS, tol)
        assert j.defects == 0, (spec, name, j.findings)


@pytest.mark.claim("token_identity", "logits_within_tolerance")
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {"llama3"}))
def test_converted_architecture_computes_what_transformers_computes(family, cache,
                                                                     tmp_path_factory):
    @settings(max_examples=EXAMPLES)
    @given(drawn=tiny_specs(family))
    @example(drawn=everything_on(family))
    def check(drawn):
        spec, storage, seed = drawn
        _agrees_with_transformers(tmp_path_factory.mktemp(family), spec, storage, cache, seed)

    check()


# -- the same checkpoints from GGUF ------------------------------------------------------------

@pytest.mark.claim("token_identity", "logits_within_tolerance")
@pytest.mark.parametrize("cache", ["dynamic", "static"])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3", "granite", "olmo2", "phi3"])
def test_converted_gguf_architecture_computes_what_transformers_computes(family, cache,
                                                                          tmp_path_factory):
    """The transformers model written as llama.cpp lays a GGUF out (Llama's and Granite's
    Q/K rows interleaved for pair-wise RoPE, Llama 3 scaling as the rope_freqs tensor, Granite's
    multipliers as metadata, Phi3's fused tensors kept fused)."""
    pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")

    @settings(max_examples=EXAMPLES)
    @given(drawn=tiny_specs(family))
    @example(drawn=everything_on(family))
    def check(drawn):
        spec, _, seed = drawn
        folder = tmp_path_factory.mktemp(family)
        model = build_model(spec, seed)
        path = write_gguf(model, spec, folder / "model.gguf")
        pkg = load_package(convert(path, folder / "pkg", cache=cache, max_context=32,
                                   tokenizer=False).folder)
        expected, hf_logits = transformers_greedy(model, PROMPT, TOKENS)
        cmp = compare_tensors(logits_of(pkg, PROMPT), hf_logits, "float32")
        assert cmp.ok, (spec, cmp.reason)
        oracle = Oracle(pkg)
        tol = tolerance_for(pkg.spec.dtype)
        assert judge_stream(oracle, PROMPT, expected, TOKENS, tol).defects == 0, spec
        got = greedy_decode(get_engine_class("native-host")(pkg), PROMPT, TOKENS).tokens
        assert judge_stream(oracle, PROMPT, got, TOKENS, tol).defects == 0, spec

    check()


def test_gguf_metadata_that_is_not_modelled_is_refused_by_name(tmp_path):
    gguf = pytest.importorskip("gguf", reason="the converter needs the 'real' extra")
    spec = TinySpec("llama")
    model = build_model(spec, 1)
    for key, add in (("llama.attention.sliding_window", lambda w: w.add_sliding_window(4)),
                     ("llama.rope.scaling.type",
                      lambda w: w.add_rope_scaling_type(gguf.RopeScalingType.YARN))):
        path = tmp_path / f"{key}.gguf"
        original = gguf.GGUFWriter.write_header_to_file

        def with_extra(self, *args, **kwargs):
            add(self)
            return original(self, *args, **kwargs)

        gguf.GGUFWriter.write_header_to_file = with_extra
        try:
            write_gguf(model, spec, path)
        finally:
            gguf.GGUFWriter.write_header_to_file = original
        with pytest.raises(InputError) as err:
            read_checkpoint(path, with_tokenizer=False)
        assert err.value.field == key, str(err.value)


@pytest.mark.claim("token_identity", "logits_within_tolerance")
def test_a_vocabulary_past_65536_ids_converts_and_decodes(tmp_path):
    """Gemma-sized vocabularies (262k): ids past any 16-bit index, a tied head, and a prompt
    whose ids sit at the top of the range."""
    spec = TinySpec("gemma3", heads=2, kv_heads=1, head_dim=16, vocab=70_001, tied=True,
                    window=3)
    folder, model = save_checkpoint(spec, 5, tmp_path / "hf")
    pkg = load_package(convert(folder, tmp_path / "pkg", max_context=32).folder)
    prompt = [1, 70_000, 65_536, 65_535, 40_000, 69_999]
    expected, hf_logits = transformers_greedy(model, prompt, TOKENS)
    assert compare_tensors(logits_of(pkg, prompt), hf_logits, "float32").ok
    oracle = Oracle(pkg)
    tol = tolerance_for(pkg.spec.dtype)
    assert judge_stream(oracle, prompt, expected, TOKENS, tol).defects == 0
    got = greedy_decode(get_engine_class("native-host")(pkg), prompt, TOKENS).tokens
    assert judge_stream(oracle, prompt, got, TOKENS, tol).defects == 0


# -- every modelled feature matters --------------------------------------------------------

KNOCKOUTS = [
    ("llama3", {}, {"rope_scaling": None}),
    ("mistral", {"window": 3}, {"sliding_window": None}),
    ("phi3", {"window": 3}, {"sliding_window": None}),
    ("qwen3", {}, {"qk_norm": "none"}),
    ("olmo2", {}, {"qk_norm": "none"}),
    ("granite", {}, {"embed_scale": None}),
    ("granite", {}, {"attn_scale": None}),
    ("granite", {}, {"residual_scale": None}),
    ("granite", {}, {"logits_divisor": None}),
    ("gemma2", {"window": 3}, {"sliding_window": None, "sliding_layers": None}),
    ("gemma2", {}, {"attn_softcap": None}),
    ("gemma2", {}, {"final_softcap": None}),
    ("gemma2", {}, {"embed_scale": None}),
    ("gemma2", {}, {"attn_scale": None}),
    ("gemma2", {}, {"activation": "silu"}),
    ("gemma3", {"window": 3}, {"rope_local_base": None}),
    ("gemma3", {}, {"qk_norm": "none"}),
    ("mixtral", {}, {"experts_per_token": 1}),
]


@pytest.mark.parametrize("family,dims,knockout", KNOCKOUTS,
                         ids=[f"{f}-{next(iter(k))}" for f, _, k in KNOCKOUTS])
def test_each_feature_matters(family, dims, knockout, tmp_path):
    """The same checkpoint converted with one feature knocked out (its weights dropped)
    disagrees with transformers beyond the float32 tolerance, where the full conversion
    agrees: the property test above would catch a converter that dropped it."""
    spec = TinySpec(family, **dims)
    folder, model = save_checkpoint(spec, 7, tmp_path / "hf")
    _, hf_logits = transformers_greedy(model, PROMPT, 1)
    ckpt = read_checkpoint(folder, with_tokenizer=False)
    full = load_package(convert(folder, tmp_path / "full", max_context=32).folder)
    assert compare_tensors(logits_of(full, PROMPT), hf_logits, "float32").ok
    ckpt.arch = dataclasses.replace(ckpt.arch, **knockout)
    ckpt.weights = {k: v for k, v in ckpt.weights.items() if k in ckpt.expected_keys()}
    opts = ConvertOptions(max_context=32)
    broken = load_package(write_converted(ckpt, tmp_path / "broken", opts, "sha256:x", "k"))
    cmp = compare_tensors(logits_of(broken, PROMPT), hf_logits, "float32")
    assert not cmp.ok, f"{family} without {knockout} still matches transformers"


def test_sliding_window_is_a_mask_that_only_matters_past_the_window(tmp_path):
    """Mistral, window 3: positions 0..2 see their whole prefix either way, so the package
    without the window agrees there; from position 3 on it must not."""
    spec = TinySpec("mistral", window=3)
    folder, model = save_checkpoint(spec, 11, tmp_path / "hf")
    _, hf_logits = transformers_greedy(model, PROMPT, 1)
    ckpt = read_checkpoint(folder, with_tokenizer=False)
    assert ckpt.arch.sliding_window == 3 and ckpt.arch.sliding_layers is None
    ckpt.arch = dataclasses.replace(ckpt.arch, sliding_window=None)
    full_attention = load_package(write_converted(ckpt, tmp_path / "f",
                                                  ConvertOptions(max_context=32), "sha256:x",
                                                  "k"))
    ours = logits_of(full_attention, PROMPT)
    assert compare_tensors(ours[:3], hf_logits[:3], "float32").ok
    for position in range(3, len(PROMPT)):
        assert not compare_tensors(ours[position], hf_logits[position], "float32").ok, position


# -- the mixture of experts' router ties ---------------------------------------------------

def _tied_router_checkpoint(tmp_path, name: str, copy_expert: int | None):
    """Mixtral, 4 experts, top 1, whose router rows for experts 1 and 2 are equal and
    dominant in every layer: every token's choice is an exact tie between them. With
    ``copy_expert`` the two experts' SwiGLU weights are both that expert's, so which one
    a tie picks cannot matter: transformers' result is the rule's reference."""
    import torch

    spec = TinySpec("mixtral", layers=2, extra={"num_experts_per_tok": 1})
    model = build_model(spec, 13)
    with torch.no_grad():
        for layer in model.model.layers:
            router = layer.mlp.gate.weight
            router[2] = router[1] = router[1] * 8.0
            if copy_expert is not None:
                for weights in (layer.mlp.experts.gate_up_proj, layer.mlp.experts.down_proj):
                    weights[1] = weights[2] = weights[copy_expert].clone()
    folder = tmp_path / name
    model.save_pretrained(str(folder))
    return folder, model


@pytest.mark.claim("token_identity", "logits_within_tolerance")
def test_router_ties_go_to_the_lowest_expert_index(tmp_path):
    """The stated rule: among experts of exactly equal router probability the lower index
    is chosen (ONNX TopK's order, the one lockstep's greedy argmax keeps). transformers
    routes with ``torch.topk``, which leaves the order of equal values unspecified (on the
    CPU it falls where its selection's partition puts them: [0.25] * 4 with k=2 gives
    experts 2 and 3, [0.1, 0.3, 0.3, 0.3, 0.0] gives 1 and 3), so the rule is checked
    against transformers on twins where the choice cannot matter: the package converted
    from the tied checkpoint computes what transformers computes when both tied experts
    hold expert 1's weights, and not what it computes when both hold expert 2's."""
    folder, _ = _tied_router_checkpoint(tmp_path, "tied", None)
    pkg = load_package(convert(folder, tmp_path / "pkg", max_context=32).folder)
    ours = logits_of(pkg, PROMPT)
    _, lowest = _tied_router_checkpoint(tmp_path, "as-expert-1", 1)
    _, highest = _tied_router_checkpoint(tmp_path, "as-expert-2", 2)
    _, want = transformers_greedy(lowest, PROMPT, 1)
    _, other = transformers_greedy(highest, PROMPT, 1)
    assert compare_tensors(ours, want, "float32").ok
    assert not compare_tensors(ours, other, "float32").ok  # the tie decides something
    native = greedy_decode(get_engine_class("native-host")(pkg), PROMPT, TOKENS).tokens
    assert native == transformers_greedy(lowest, PROMPT, TOKENS)[0]


# -- mixed precision over the new features -------------------------------------------------

REDUCED = [*((f, "float16") for f in sorted(set(FAMILIES) - {"llama3"})),
           ("olmo2", "bfloat16"), ("gemma3", "bfloat16"), ("llama3", "bfloat16")]


@pytest.mark.claim("token_identity")
@pytest.mark.parametrize("family,dtype", REDUCED)
def test_reduced_precision_conversions_pass_their_float32_twin(family, dtype, tmp_path):
    from engines.oracle import oracle_for

    spec = TinySpec(family, window=3 if family in WINDOWED else None)
    folder, _ = save_checkpoint(spec, 3, tmp_path / "hf")
    pkg = load_package(convert(folder, tmp_path / "pkg", dtype=dtype, max_context=32).folder)
    assert pkg.spec.dtype == dtype and pkg.spec.reference is not None
    oracle = oracle_for(pkg)
    engines = ("native-host",) if dtype == "bfloat16" else ("ort-cpu", "native-host")
    for name in engines:
        got = greedy_decode(get_engine_class(name)(pkg), PROMPT, TOKENS).tokens
        j = judge_stream(oracle, PROMPT, got, TOKENS, tolerance_for(dtype))
        assert j.defects == 0, (name, j.findings)


# -- refusals --------------------------------------------------------------------------------

def _folder_with(tmp_path, family: str, **config_changes):
    folder, _ = save_checkpoint(TinySpec(family), 1, tmp_path / "hf")
    path = folder / "config.json"
    config = json.loads(path.read_text())
    for key, value in config_changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    path.write_text(json.dumps(config))
    return folder


REFUSALS = [
    # Granite's multipliers relabelled as Llama: an unknown field, refused by name
    ("granite", {"architectures": ["LlamaForCausalLM"]}, "attention_multiplier"),
    ("llama", {"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 4.0}},
     "rope_parameters.rope_type"),
    ("llama", {"rope_parameters": None, "rope_theta": 1e4,
               "rope_scaling": {"type": "dynamic", "factor": 2.0}}, "rope_scaling.rope_type"),
    ("llama", {"rope_parameters": {"rope_type": "llama3", "rope_theta": 1e4, "factor": 8.0}},
     "rope_parameters.low_freq_factor"),
    ("phi3", {"rope_parameters": {"rope_type": "default", "rope_theta": 1e4,
                                  "partial_rotary_factor": 0.5}},
     "rope_parameters.partial_rotary_factor"),
    ("llama", {"hidden_act": "gelu"}, "hidden_act"),
    ("gemma2", {"hidden_activation": "gelu"}, "hidden_activation"),
    ("qwen2", {"use_sliding_window": True}, "use_sliding_window"),
    ("llama", {"pretraining_tp": 2}, "pretraining_tp"),
    ("llama", {"some_new_scaling": 0.5}, "some_new_scaling"),
    ("gemma2", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("gemma3", {"architectures": ["Gemma3ForConditionalGeneration"]}, "architectures"),
    # fields transformers honours for any class, which change the model: refused by name
    ("llama", {"pruned_heads": {"0": [1]}}, "pruned_heads"),
    ("qwen2", {"quantization_config": {"quant_method": "gptq", "bits": 4}},
     "quantization_config"),
]


@pytest.mark.parametrize("family,changes,field", REFUSALS,
                         ids=[f"{f}-{field}" for f, _, field in REFUSALS])
def test_config_fields_that_are_not_modelled_are_refused_by_name(tmp_path, family, changes,
                                                                 field):
    folder = _folder_with(tmp_path, family, **changes)
    with pytest.raises(InputError) as err:
        read_checkpoint(folder, with_tokenizer=False)
    assert err.value.field == field, str(err.value)
    assert err.value.remedy


def test_fields_transformers_ignores_for_the_class_are_accepted(tmp_path):
    """SmolLM2's nanotron fields and Phi-3's auto_map are on every hub copy of those models."""
    folder = _folder_with(tmp_path, "llama", is_llama_config=True, rope_interleaved=False,
                          auto_map={"AutoModelForCausalLM": "modeling_x.X"})
    assert read_checkpoint(folder, with_tokenizer=False).arch.family == "LlamaForCausalLM"


# what transformers itself writes into config.json besides the model's hyperparameters: token
# ids the tokenizer owns, the dtype, task labels (passed to the config class as a hub config
# holds them, then saved by save_pretrained)
TRANSFORMERS_BOOKKEEPING = {"unk_token_id": 0, "sep_token_id": 2, "cls_token_id": 1,
                            "mask_token_id": 3, "torch_dtype": "float32",
                            "id2label": {0: "NEGATIVE", 1: "POSITIVE"}}


@pytest.mark.claim("token_identity", "logits_within_tolerance")
@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {"llama3"}))
def test_a_config_saved_by_transformers_converts_without_edits(family, tmp_path):
    """A config.json holding what transformers writes for a real checkpoint (unk_token_id,
    sep_token_id, ...: fields that cannot change the computation) converts as it is, decodes
    as transformers does, and keeps those fields in the package's checkpoint.json."""
    spec = TinySpec(family, extra=TRANSFORMERS_BOOKKEEPING)
    _agrees_with_transformers(tmp_path, spec, "float32", "dynamic", 4)
    saved = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert {"unk_token_id", "sep_token_id", "cls_token_id", "mask_token_id"} <= set(saved)
    sidecar = json.loads((tmp_path / "pkg" / "checkpoint.json").read_text())
    for key in ("unk_token_id", "sep_token_id", "cls_token_id", "mask_token_id", "dtype",
                "transformers_version"):
        assert sidecar["bookkeeping"][key] == saved[key], key


def test_bookkeeping_older_transformers_wrote_is_accepted_and_recorded(tmp_path):
    """transformers 4 kept the model's name, torch_dtype and generation defaults in
    config.json: none changes what a forward computes."""
    fields = {"_name_or_path": "org/tiny", "torch_dtype": "bfloat16", "max_length": 20,
              "temperature": 0.7, "output_past": True, "forced_eos_token_id": 2,
              "pad_token_id": 0}
    ckpt = read_checkpoint(_folder_with(tmp_path, "llama", **fields), with_tokenizer=False)
    assert {k: ckpt.bookkeeping[k] for k in fields} == fields
    assert ckpt.name == "org/tiny"


def test_a_tokenizer_larger_than_the_vocabulary_is_an_error(tmp_path):
    from tokenizers import Tokenizer, models

    folder, _ = save_checkpoint(TinySpec("llama", vocab=64), 1, tmp_path / "hf")
    vocab = {f"t{i}": i for i in range(80)}
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(folder / "tokenizer.json"))
    with pytest.raises(InputError) as err:
        convert(folder, tmp_path / "pkg")
    assert err.value.field == "tokenizer" and err.value.value == 80
    assert "64" in str(err.value)
