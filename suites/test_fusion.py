"""The fusion pass on the host: which subgraphs become ``lockstep.fused`` nodes, which are
left alone, and that native-host fused computes bit for bit what native-host unfused does
(every built-in LLaMA fixture; generated configs in float32, float16 and mixed precision,
with the converter's optional features mixed in). The device kernels are
``test_fused_kernels_cuda.py``; their source compiles here when nvcc is installed."""
from __future__ import annotations

import dataclasses
import functools

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper

from engines.errors import ExecutionError
from engines.native.cuda_kernels import CudaKernels
from engines.native.fused_kernels import FusedKernels
from engines.native.array_backend import NumpyArrayBackend
from engines.native.fusion import FUSED_DOMAIN
from engines.native.kernel_source import instance
from engines.native.launch.fused_dtypes import FUSED_DTYPES
from engines.native.launch.gemv import GEMV_WARPS_PER_BLOCK
from engines.native.launch.prologue_gemv import PROLOGUE_WIDE_WARPS, with_warps
from engines.native.plan import Plan, unsupported_ops
from harness.convert.llama_config import LlamaConfig
from harness.convert.llama_config import llama_weights
from harness.convert.llama_graph import llama_graph, llama_model
from fixtures.strategies import decoder_configs
from suites.nvcc_check import NVCC, compile_module, entry_instances
from suites.support import fixture_names

PRECISIONS = [("float32", "uniform"), ("float16", "uniform"), ("float16", "mixed"),
              ("bfloat16", "mixed")]


def _np_type(value_info: onnx.ValueInfoProto) -> np.dtype:
    return np.dtype(helper.tensor_dtype_to_np_dtype(value_info.type.tensor_type.elem_type))


def _feeds(model: onnx.ModelProto, tokens, start: int, cache: dict | None) -> dict:
    """input_ids/position_ids for ``tokens`` at ``start``; kv inputs from ``cache`` (the
    previous forward's presents) or empty/zero cells."""
    feeds = {"input_ids": np.asarray([tokens], np.int64),
             "position_ids": np.arange(start, start + len(tokens), dtype=np.int64)[None]}
    for vi in model.graph.input:
        if vi.name in feeds:
            continue
        if cache is not None:
            feeds[vi.name] = cache[vi.name.replace("past_", "present_")]
            continue
        dims = [d.dim_value if d.HasField("dim_value") else 0
                for d in vi.type.tensor_type.shape.dim]
        feeds[vi.name] = np.zeros(dims, _np_type(vi))
    return feeds


def _same_bits(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for name in a:
        x, y = np.asarray(a[name]), np.asarray(b[name])
        assert x.dtype == y.dtype and x.shape == y.shape, name
        assert x.tobytes() == y.tobytes(), f"{name} differs fused vs unfused"


def assert_fused_equals_unfused(model: onnx.ModelProto, prompt, steps: int = 2):
    """Prefill, ``steps`` decodes and one 3-row verify, fused and unfused, bit for bit."""
    be = NumpyArrayBackend()
    fused, plain = Plan(model, be), Plan(model, be, fuse=False)
    assert not plain.fusions
    tokens, cache, pos = list(prompt), None, 0
    vocab = model.graph.output[0].type.tensor_type.shape.dim[2].dim_value
    for step in range(steps + 2):
        if step == 0:
            batch = tokens
        elif step <= steps:
            batch = [(7 * step + 3) % vocab]
        else:
            batch = [(5 * i + 1) % vocab for i in range(3)]  # a verify-shaped forward
        feeds = _feeds(model, batch, pos, cache)
        got, want = fused.run(feeds), plain.run(feeds)
        _same_bits(got, want)
        cache, pos = want, pos + len(batch)
    return fused


# -- every built-in llama fixture ------------------------------------------------------------

LLAMA_FIXTURES = [n for n in fixture_names() if "llama" in n]


@pytest.mark.parametrize("name", LLAMA_FIXTURES)
def test_builtin_fixtures_fused_equal_unfused_bitwise(packages, name):
    package = packages[name]
    for component in package.spec.components:
        model = package.component_model(component)
        layers = sum(1 for i in model.graph.input if i.name.startswith("past_key_"))
        fused = assert_fused_equals_unfused(model, package.spec.prompts[0])
        static = any(d.HasField("dim_value") for i in model.graph.input
                     if i.name.startswith("past_key_")
                     for d in list(i.type.tensor_type.shape.dim)[2:3])
        # every norm but the last becomes its q/k/v GEMV's prologue or its gate/up GEMV's
        # with SwiGLU as the epilogue (the first reads the embedding); the head reads the last
        want = {"Attention": layers, "Rotary2": layers, "NormGLU": layers,
                "NormMatMul": layers, "AddRMSNorm": 1}
        if static:  # a layer's rotation, its key and value writes and its attention, one node
            want["RotaryKVAttention"] = want.pop("Rotary2")
            del want["Attention"]
        assert dict(fused.fusions) == want, component


@pytest.mark.parametrize("name", fixture_names())
def test_native_host_decodes_fused_as_unfused_on_every_fixture(packages, name):
    """End to end on every built-in package (hybrid and lookup ones too): greedy tokens
    and every step's logits row, fused and unfused, bit for bit."""
    from engines.backends import native_host
    from engines.native import plan as plan_module
    from engines.workflow import greedy_decode

    package = packages[name]
    fused = native_host.NativeHostEngine(package)
    with pytest.MonkeyPatch.context() as mp:  # the engine builds Plan(model, backend)
        mp.setattr(native_host, "Plan", functools.partial(plan_module.Plan, fuse=False))
        plain = native_host.NativeHostEngine(package)
    assert not any(p.fusions for p in plain._plans.values())
    prompt = list(package.spec.prompts[0])
    a = greedy_decode(fused, prompt, 8, audit=True)
    b = greedy_decode(plain, prompt, 8, audit=True)
    assert a.tokens == b.tokens
    assert len(a.logits) == len(b.logits) == 8
    assert all(x.tobytes() == y.tobytes() for x, y in zip(a.logits, b.logits))


# -- generated configs -----------------------------------------------------------------------

@st.composite
def fusable_configs(draw):
    """A generated decoder in one of the four precisions, either rotary layout, and some of
    the converter's optional features (which the recognisers must fuse around or leave)."""
    case = draw(decoder_configs(dtypes=("float32",)))
    dtype, precision = draw(st.sampled_from(PRECISIONS))
    extras = draw(st.fixed_dictionaries({}, optional={
        "attention_bias": st.booleans(),
        "output_bias": st.booleans(),
        "mlp_bias": st.booleans(),
        "qk_norm": st.sampled_from(["none", "head", "full"]),
        "norm_placement": st.sampled_from(["pre", "post", "sandwich"]),
        "activation": st.sampled_from(["silu", "gelu_tanh"]),
        "attn_softcap": st.sampled_from([None, 30.0]),
        "sliding_window": st.sampled_from([None, 1, 3]),
    }))
    config = dataclasses.replace(case.config, dtype=dtype, precision=precision,
                                 rope_layout=draw(st.sampled_from(["halves", "pairs"])),
                                 **extras)
    return config, case.prompt


def _model(c: LlamaConfig) -> onnx.ModelProto:
    """``llama_model`` plus seeded weights for the optional features, which
    ``llama_weights`` leaves to the converter (biases, q/k norm and post-norm gains)."""
    w = llama_weights(c)
    rng = np.random.default_rng(c.seed + 1)
    q, kv = c.heads * c.head_dim, c.kv_heads * c.head_dim
    for i in range(c.layers):
        extra = {"bq": q, "bk": kv, "bv": kv, "bo": c.hidden, "b_gate": c.ffn, "b_up": c.ffn,
                 "b_down": c.hidden}
        for key, width in extra.items():
            w[f"l{i}.{key}"] = rng.standard_normal(width) * 0.1
        for key in ("attn_post_norm", "mlp_post_norm"):
            w[f"l{i}.{key}"] = 1.0 + rng.standard_normal(c.hidden) * 0.1
        full = c.qk_norm == "full"
        w[f"l{i}.q_norm"] = 1.0 + rng.standard_normal(q if full else c.head_dim) * 0.1
        w[f"l{i}.k_norm"] = 1.0 + rng.standard_normal(kv if full else c.head_dim) * 0.1
    return llama_graph(c, w)[0]


def _kinds(plan) -> dict:
    """The plan's fusions, with RMSNorm and AddRMSNorm counted together as ``norms`` (which
    norm reads a residual add depends on the placement and the biases), and the GEMVs with
    a prologue counted as what they fold: a NormMatMul as a norm (and a MatMulN when it has
    two or three weights), a NormGLU as a norm, a MatMulN and a SwiGLU, a SwiGLUMatMul as a
    SwiGLU, a RotaryKVWrite as a Rotary2 and a KVWrite2, a RotaryKVAttention as those two
    and an Attention."""
    kinds = dict(plan.fusions)
    folded = [s.node for s in plan.steps if s.node.domain == FUSED_DOMAIN
              and s.node.op_type in ("NormMatMul", "NormGLU")]
    glus = kinds.pop("NormGLU", 0)
    assert kinds.pop("NormMatMul", 0) + glus == len(folded)
    groups = sum(1 for n in folded if len(n.input) - (3 if _attr(n, "add") else 2) >= 2)
    if groups:
        kinds["MatMulN"] = kinds.get("MatMulN", 0) + groups
    swiglus = kinds.pop("SwiGLUMatMul", 0) + glus
    if swiglus:
        kinds["SwiGLU"] = kinds.get("SwiGLU", 0) + swiglus
    attended = kinds.pop("RotaryKVAttention", 0)  # a RotaryKVWrite and an Attention
    if attended:
        kinds["Attention"] = kinds.get("Attention", 0) + attended
    writes = kinds.pop("RotaryKVWrite", 0) + attended  # a Rotary2 and a KVWrite2
    for kind in ("Rotary2", "KVWrite2") if writes else ():
        kinds[kind] = kinds.get(kind, 0) + writes
    norms = kinds.pop("RMSNorm", 0) + kinds.pop("AddRMSNorm", 0) + len(folded)
    return {**kinds, "norms": norms} if norms else kinds


def _attr(node, name: str):
    return next((helper.get_attribute_value(a) for a in node.attribute if a.name == name), None)


def _expected_fusions(c: LlamaConfig) -> dict:
    plain_layers = sum(1 for i in range(c.layers) if not c.is_sliding(i))
    per_layer = {"pre": 2, "post": 2, "sandwich": 4}[c.norm_placement] \
        + {"none": 0, "head": 2, "full": 2}[c.qk_norm]
    want = {"Rotary2": c.layers, "norms": c.layers * per_layer + 1,  # q and k paired
            "MatMulN": 2 * c.layers}  # q/k/v and gate/up
    if c.activation == "silu":
        want["SwiGLU"] = c.layers
    if c.attn_softcap is None and plain_layers:
        want["Attention"] = plain_layers
    if c.cache == "static":
        want["KVWrite2"] = c.layers
    return want


@given(fusable_configs())
def test_generated_configs_fused_equal_unfused_bitwise(drawn):
    config, prompt = drawn
    fused = assert_fused_equals_unfused(_model(config), prompt)
    assert _kinds(fused) == _expected_fusions(config), config


@pytest.mark.parametrize("dtype, precision", PRECISIONS)
@pytest.mark.parametrize("layout", ["halves", "pairs"])
def test_each_precision_and_layout_fuses_everything(dtype, precision, layout):
    c = LlamaConfig(cache="static", dtype=dtype, precision=precision, rope_layout=layout)
    fused = assert_fused_equals_unfused(llama_model(c), [1, 17, 42, 5])
    assert _kinds(fused) == _expected_fusions(c)
    # every norm but the head's is its GEMV's prologue, every SwiGLU the gate/up GEMV's
    # epilogue (so the down projection is a plain MatMul)
    assert fused.fusions["NormMatMul"] == c.layers and fused.fusions["AddRMSNorm"] == 1
    assert fused.fusions["NormGLU"] == c.layers and "SwiGLUMatMul" not in fused.fusions
    # the static cache's writes rotate, and each layer's attention reads them in the same node
    assert fused.fusions["RotaryKVAttention"] == c.layers
    kinds = {s.node.op_type for s in fused.steps if s.node.domain == FUSED_DOMAIN}
    assert kinds == {"RotaryKVAttention", "NormGLU", "NormMatMul", "AddRMSNorm"}
    # nothing the fused nodes replaced is left: no Softmax, Sigmoid, Sqrt, Neg, Where or Add
    left = {s.node.op_type for s in fused.steps}
    assert not left & {"Softmax", "Sigmoid", "Sqrt", "Reciprocal", "Neg", "Where", "Equal",
                       "LessOrEqual", "ReduceMean", "ReduceMax", "Concat", "Slice", "Add"}


# -- what is left alone ----------------------------------------------------------------------

def test_sliding_window_mask_is_never_fused_into_causal_attention():
    c = LlamaConfig(cache="static", sliding_window=3, sliding_layers=(1,))
    fused = assert_fused_equals_unfused(llama_model(c), [1, 17, 42, 5, 9, 11], steps=3)
    # layer 0 (plain causal) only: its attention, in the node of its rotation and writes
    assert fused.fusions["RotaryKVAttention"] == 1 and "Attention" not in fused.fusions
    windowed = [s for s in fused.steps if s.node.op_type == "Softmax"]
    assert len(windowed) == 1  # layer 1 runs node by node


def test_soft_capped_scores_are_left_alone():
    c = LlamaConfig(attn_softcap=20.0)
    fused = assert_fused_equals_unfused(llama_model(c), [1, 2, 3])
    assert "Attention" not in fused.fusions
    assert fused.fusions["Rotary2"] == c.layers


def test_an_intermediate_read_elsewhere_blocks_its_fusion():
    """Exposing a pattern's inner value (the softmax probabilities) as a graph output
    leaves that attention unfused; the rest still fuses and the output is still right."""
    model = llama_model(LlamaConfig())
    softmax = next(n for n in model.graph.node if n.op_type == "Softmax")
    model.graph.output.append(helper.make_tensor_value_info(softmax.output[0],
                                                            onnx.TensorProto.FLOAT, None))
    fused = assert_fused_equals_unfused(model, [1, 5, 7])
    assert fused.fusions["Attention"] == 1 and _kinds(fused)["SwiGLU"] == 2
    assert _kinds(fused)["MatMulN"] == 4


def test_a_gate_read_elsewhere_keeps_swiglu_as_the_down_gemvs_prologue():
    """A layer whose gate projection is also a graph output cannot store only SwiGLU of the
    pair (NormGLU): its SwiGLU becomes the down GEMV's prologue instead (SwiGLUMatMul), the
    other layers keep NormGLU, and every output is still the unfused graph's."""
    model = llama_model(LlamaConfig())
    gate = next(n for n in model.graph.node if n.op_type == "Sigmoid").input[0]
    model.graph.output.append(helper.make_tensor_value_info(gate, onnx.TensorProto.FLOAT,
                                                            None))
    fused = assert_fused_equals_unfused(model, [1, 5, 7])
    layers = LlamaConfig().layers
    assert fused.fusions["SwiGLUMatMul"] == 1 and fused.fusions["NormGLU"] == layers - 1
    assert fused.fusions["NormMatMul"] == layers + 1  # q/k/v of each, and that gate/up


def test_unfused_plan_is_the_graph_node_for_node():
    model = llama_model(LlamaConfig(cache="static"))
    plain = Plan(model, NumpyArrayBackend(), fuse=False)
    assert not any(s.node.domain == FUSED_DOMAIN for s in plain.steps)
    assert plain.node_count == len(model.graph.node)


def test_fused_domain_is_supported_and_observe_sees_the_graph_as_written():
    model = llama_model(LlamaConfig(cache="static"))
    fused = Plan(model, NumpyArrayBackend())
    nodes = [s.node for s in fused.steps if s.node.domain == FUSED_DOMAIN]
    rebuilt = helper.make_model(helper.make_graph(nodes, "g", [], []))
    assert unsupported_ops(rebuilt) == []
    seen = []
    fused.run(_feeds(model, [1, 2], 0, None), observe=lambda node, name, value: seen.append(node))
    assert {n.op_type for n in seen} >= {"Softmax", "Sigmoid", "ReduceMean"}
    assert not any(n.domain == FUSED_DOMAIN for n in seen)


def test_profile_wraps_every_step_of_the_fused_plan_and_changes_nothing():
    model = llama_model(LlamaConfig(cache="static"))
    fused = Plan(model, NumpyArrayBackend())
    feeds = _feeds(model, [1, 2], 0, None)
    seen = []

    def profile(node, call):
        seen.append(node.op_type)
        return call()

    _same_bits(fused.run(feeds, profile=profile), fused.run(feeds))
    assert seen == [s.node.op_type for s in fused.steps]
    assert {"RotaryKVAttention", "NormMatMul", "NormGLU", "AddRMSNorm"} <= set(seen)


def test_a_fused_node_given_a_shape_it_cannot_take_names_the_field():
    model = llama_model(LlamaConfig())
    rotary = next(s for s in Plan(model, NumpyArrayBackend()).steps
                  if s.node.op_type == "Rotary2")
    x = np.zeros((1, 4, 2, 10), np.float32)  # head_dim 10, the node was recognised at 16
    cos = np.zeros((1, 1, 2, 10), np.float32)
    with pytest.raises(ExecutionError) as err:
        rotary.kernel(NumpyArrayBackend(), x, x, cos, cos)
    assert err.value.field == "Rotary2.x" and "16" in err.value.remedy


# -- the device source compiles ----------------------------------------------------------------

@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("module", FusedKernels.modules() + CudaKernels.modules(),
                         ids=lambda m: m.file)
def test_kernel_sources_compile_with_nvcc(tmp_path, module):
    """Each module's .cu file compiles, and every instance its launcher calls is an entry."""
    ptx = compile_module(module, "sm_90", tmp_path)
    assert set(entry_instances(ptx, module)) == set(module.instances)


def test_fused_source_has_every_kernel_for_every_dtype():
    names = {i for m in FusedKernels.modules() + CudaKernels.modules() for i in m.instances}
    for dtype in FUSED_DTYPES:
        assert {instance("kv_write", dtype), instance("rms_norm", dtype, dtype),
                instance("attention", dtype, dtype), instance("add_rms_norm", *[dtype] * 3),
                instance("kv_write2", dtype), instance("rotary2", *[dtype] * 3),
                instance("gemv_vec", dtype), instance("gemv_vec3", dtype),
                instance("rotary", *[dtype] * 3), instance("swiglu", *[dtype] * 3),
                instance("swiglu_gemv", *[dtype] * 3)} <= names
        for warps in (GEMV_WARPS_PER_BLOCK, PROLOGUE_WIDE_WARPS):  # the norm prologues
            assert {with_warps(instance("norm_gemv", *[dtype] * 3), warps),
                    with_warps(instance("norm_glu", *[dtype] * 3), warps)} <= names
        if dtype != "float32":  # a mixed graph: residual stream and SwiGLU in float32
            assert {with_warps(instance("norm_gemv", "float32", dtype, dtype),
                               GEMV_WARPS_PER_BLOCK),
                    instance("swiglu_gemv", dtype, "float32", dtype),
                    with_warps(instance("norm_glu", "float32", dtype, "float32"),
                               GEMV_WARPS_PER_BLOCK)} <= names
