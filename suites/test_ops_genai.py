"""The graph onnxruntime-genai's model builder writes for a LLaMA-style model (its fp32 CPU
build of SmolLM2: SimplifiedLayerNormalization, packed-QKV GroupQueryAttention with rotary
caches and a kv cache, SkipSimplifiedLayerNormalization, SiLU as Sigmoid x Mul), rebuilt
small with ``onnx.helper`` and run on native-host against onnxruntime CPU: a prefill from
an empty cache, then a decode step on the cache it returned.

The attention-mask subgraph is the builder's: seqlens_k = ReduceSum(mask) - 1 (a device
value), total_sequence_length = Shape(mask)[1] (shape arithmetic), so the plan needs no host
input. With ``LOCKSTEP_GENAI_SMOLLM2`` (fp32) or ``LOCKSTEP_GENAI_SMOLLM2_INT4`` (int4:
MatMulNBits, GatherBlockQuantized) naming a builder output folder, the real model is run the
same way and its largest logits difference printed.
"""
from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from engines.native.array_backend import NumpyArrayBackend
from engines.native.plan import Plan, required_host_inputs, unsupported_ops
from engines.tolerances import tolerance_for
from harness.compare import compare_tensors

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD, FFN, VOCAB, MAX_POS = 2, 64, 4, 2, 16, 96, 61, 32


def genai_style_model(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    inits, nodes = [], []

    def weight(name, shape, scale=None):
        scale = scale if scale is not None else 1 / np.sqrt(shape[0])
        inits.append(numpy_helper.from_array(
            (rng.standard_normal(shape) * scale).astype(np.float32), name))
        return name

    def ones_ish(name, n):
        value = (1 + 0.1 * rng.standard_normal(n)).astype(np.float32)
        inits.append(numpy_helper.from_array(value, name))
        return name

    def node(op, ins, outs, domain="", **attrs):
        nodes.append(helper.make_node(op, ins, outs, domain=domain, **attrs))
        return outs[0]

    inits.append(numpy_helper.from_array(np.array([1], np.int64), "one"))
    inits.append(numpy_helper.from_array(np.array(1, np.int64), "axis1"))
    inv = 1.0 / (10000 ** (np.arange(HEAD // 2) / (HEAD // 2)))
    angles = np.outer(np.arange(MAX_POS), inv)
    inits.append(numpy_helper.from_array(np.cos(angles).astype(np.float32), "cos_cache"))
    inits.append(numpy_helper.from_array(np.sin(angles).astype(np.float32), "sin_cache"))
    # the builder's attention-mask subgraph
    node("ReduceSum", ["attention_mask", "one"], ["mask_sum"], keepdims=0)
    node("Sub", ["mask_sum", "one"], ["seqlens"])
    node("Cast", ["seqlens"], ["seqlens_k"], to=TensorProto.INT32)
    node("Shape", ["attention_mask"], ["mask_shape"])
    node("Gather", ["mask_shape", "axis1"], ["total_len"], axis=0)
    node("Cast", ["total_len"], ["total_sequence_length"], to=TensorProto.INT32)

    residual = node("Gather", [weight("embed", (VOCAB, HIDDEN), 1.0), "input_ids"], ["embedded"])
    normed = node("SimplifiedLayerNormalization", [residual, ones_ish("ln_in.0", HIDDEN)],
                  ["normed.0"], axis=-1, epsilon=1e-5)
    qkv_width = (HEADS + 2 * KV_HEADS) * HEAD
    for i in range(LAYERS):
        qkv = node("MatMul", [normed, weight(f"qkv.{i}", (HIDDEN, qkv_width))], [f"qkv_out.{i}"])
        attn = node("GroupQueryAttention",
                    [qkv, "", "", f"past_key_values.{i}.key", f"past_key_values.{i}.value",
                     "seqlens_k", "total_sequence_length", "cos_cache", "sin_cache"],
                    [f"attn.{i}", f"present.{i}.key", f"present.{i}.value"], domain=MS,
                    num_heads=HEADS, kv_num_heads=KV_HEADS, scale=1 / np.sqrt(HEAD),
                    local_window_size=-1, softcap=0.0, do_rotary=1, rotary_interleaved=0)
        o = node("MatMul", [attn, weight(f"o.{i}", (HEADS * HEAD, HIDDEN))], [f"o_out.{i}"])
        normed = node("SkipSimplifiedLayerNormalization",
                      [residual, o, ones_ish(f"ln_post.{i}", HIDDEN)],
                      [f"post.{i}", "", "", f"sum_attn.{i}"], domain=MS, epsilon=1e-5)
        residual = f"sum_attn.{i}"
        gate = node("MatMul", [normed, weight(f"gate.{i}", (HIDDEN, FFN))], [f"gate_out.{i}"])
        sig = node("Sigmoid", [gate], [f"sig.{i}"])
        act = node("Mul", [gate, sig], [f"act.{i}"])
        up = node("MatMul", [normed, weight(f"up.{i}", (HIDDEN, FFN))], [f"up_out.{i}"])
        down = node("MatMul", [node("Mul", [act, up], [f"mlp.{i}"]),
                               weight(f"down.{i}", (FFN, HIDDEN))], [f"down_out.{i}"])
        last = i == LAYERS - 1
        normed = node("SkipSimplifiedLayerNormalization",
                      [residual, down, ones_ish(f"ln_next.{i}", HIDDEN)],
                      [f"normed.{i + 1}", "", "", f"sum_mlp.{i}"], domain=MS, epsilon=1e-5)
        residual = f"sum_mlp.{i}"
        if last:
            node("MatMul", [normed, weight("lm_head", (HIDDEN, VOCAB))], ["logits"])

    kv = ["batch", KV_HEADS, "past", HEAD]
    inputs = [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"]),
              helper.make_tensor_value_info("attention_mask", TensorProto.INT64,
                                            ["batch", "total"])]
    outputs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", VOCAB])]
    for i in range(LAYERS):
        for kind in ("key", "value"):
            inputs.append(helper.make_tensor_value_info(f"past_key_values.{i}.{kind}",
                                                        TensorProto.FLOAT, kv))
            outputs.append(helper.make_tensor_value_info(f"present.{i}.{kind}", TensorProto.FLOAT,
                                                         ["batch", KV_HEADS, "total", HEAD]))
    graph = helper.make_graph(nodes, "genai_style", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = 10
    return model


def kv_input_names(model: onnx.ModelProto) -> list[str]:
    return [i.name for i in model.graph.input if i.name.startswith("past_key_values.")]


def step_feeds(model, ids: np.ndarray, cache: dict | None, total: int, head: int = HEAD) -> dict:
    """Feeds for one forward: ``cache`` maps present names to arrays (None: an empty cache
    of ``head``-wide heads)."""
    feeds = {"input_ids": ids, "attention_mask": np.ones((ids.shape[0], total), np.int64)}
    for name in kv_input_names(model):
        present = name.replace("past_key_values", "present")
        if cache is None:
            dims = model.graph.input[[i.name for i in model.graph.input].index(name)]
            heads = dims.type.tensor_type.shape.dim[1].dim_value
            feeds[name] = np.zeros((ids.shape[0], heads, 0, head), np.float32)
        else:
            feeds[name] = cache[present]
    return feeds


def prefill_and_decode(model, run, prompt: np.ndarray, next_token: np.ndarray, head: int = HEAD):
    """Two forwards through ``run(feeds) -> outputs``: the prompt on an empty cache, then one
    token on the cache it returned."""
    first = run(step_feeds(model, prompt, None, prompt.shape[1], head))
    second = run(step_feeds(model, next_token, first, prompt.shape[1] + 1, head))
    return first, second


def ort_runner(model):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return lambda feeds: dict(zip(names, session.run(None, feeds)))


def native_host_runner(model):
    plan = Plan(model, NumpyArrayBackend())
    return lambda feeds: {k: np.asarray(v) for k, v in plan.run(feeds).items()}


# (domain, op) of every node in onnxruntime-genai 0.18.0's build of SmolLM2-135M-Instruct
# (``-e cpu -p fp32``), read from its model.onnx with onnx (2026-12-01).
GENAI_SMOLLM2_FP32_OPS = frozenset({
    ("", "Cast"), ("", "Constant"), ("", "Gather"), ("", "MatMul"), ("", "Mul"),
    ("", "ReduceSum"), ("", "Shape"), ("", "Sigmoid"), ("", "SimplifiedLayerNormalization"),
    ("", "Sub"), ("", "Transpose"), (MS, "GroupQueryAttention"),
    (MS, "SkipSimplifiedLayerNormalization")})
# and of its ``-e cpu -p int4`` build: every MatMul block-quantised, the tied embedding too
GENAI_SMOLLM2_INT4_OPS = (GENAI_SMOLLM2_FP32_OPS - {("", "MatMul"), ("", "Transpose")}) | {
    ("", "Reshape"), (MS, "MatMulNBits"), (MS, "GatherBlockQuantized")}

PROMPT = np.array([[3, 17, 42, 8, 29, 55]], np.int64)


def test_every_op_of_the_builders_smollm2_builds_has_a_kernel():
    from engines.native.ops import kernel_for

    missing = [op for op in sorted(GENAI_SMOLLM2_FP32_OPS | GENAI_SMOLLM2_INT4_OPS)
               if kernel_for(helper.make_node(op[1], [], [], domain=op[0])) is None]
    assert not missing
    used = {(n.domain, n.op_type) for n in genai_style_model().graph.node}
    assert used <= GENAI_SMOLLM2_FP32_OPS  # the small graph writes nothing the build does not
    assert {(MS, "GroupQueryAttention"), (MS, "SkipSimplifiedLayerNormalization"),
            ("", "SimplifiedLayerNormalization")} <= used
NEXT = np.array([[11]], np.int64)


def test_genai_style_graph_needs_no_host_input():
    """total_sequence_length comes from the mask's shape, so nothing must be fed on the host
    and seqlens_k (from the mask's values) stays a device value."""
    assert required_host_inputs(genai_style_model()) == set()


@pytest.mark.parametrize("batch", [1, 2])
def test_genai_style_graph_prefill_and_decode_match_onnxruntime(batch):
    model = genai_style_model()
    prompt = np.repeat(PROMPT, batch, axis=0) + np.arange(batch)[:, None]
    nxt = np.repeat(NEXT, batch, axis=0)
    want = prefill_and_decode(model, ort_runner(model), prompt, nxt)
    got = prefill_and_decode(model, native_host_runner(model), prompt, nxt)
    for phase, g, w in zip(("prefill", "decode"), got, want):
        assert set(g) == set(w)
        for name in w:
            tol = tolerance_for("float32").logits if name == "logits" else None
            result = compare_tensors(g[name], w[name], dtype="float32", tol=tol)
            assert result.ok, f"{phase} {name}: {result.reason}"
        assert (g["logits"].argmax(-1) == w["logits"].argmax(-1)).all(), phase


# onnxruntime-genai's own SmolLM2 builds to run (-e cpu): a folder named by the variable, else
# the build lockstep's genai engine caches from the installed checkpoint (made on first use)
GENAI_BUILDS = [pytest.param(("fp32", "LOCKSTEP_GENAI_SMOLLM2"), id="fp32"),
                pytest.param(("int4", "LOCKSTEP_GENAI_SMOLLM2_INT4"), id="int4")]


@pytest.fixture(params=GENAI_BUILDS)
def folder(request):
    precision, var = request.param
    if os.environ.get(var):
        return os.environ[var]
    from engines.backends import genai_build
    from engines.backends.checkpoint_source import find_checkpoint
    from suites.genai_support import smollm2_for_genai

    package = smollm2_for_genai()
    return str(genai_build.ensure_build(find_checkpoint(package.root, "ort-genai"), precision,
                                        "cpu").folder)


def float_activations(model: onnx.ModelProto) -> onnx.ModelProto:
    """A copy with MatMulNBits' accuracy_level at 0. At the builder's level 4 onnxruntime's
    CPU kernel quantises the activations to int8 blocks (SmolLM2's logits move by up to 2);
    native computes them in float, level 0's arithmetic, so that is the one to compare."""
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    for node in copy.graph.node:
        for attr in node.attribute:
            if node.op_type == "MatMulNBits" and attr.name == "accuracy_level":
                attr.i = 0
    return copy


def test_genai_builder_model_matches_onnxruntime(folder):
    model = onnx.load(str(Path(folder) / "model.onnx"))
    assert unsupported_ops(model) == []
    prompt = np.array([[1, 9690, 2, 198, 19556, 28, 1073, 314, 253, 2357, 47, 2, 198]], np.int64)
    session = ort_runner(float_activations(model))
    head = 64  # SmolLM2-135M: 576 / 9 heads
    first_ref = session(step_feeds(model, prompt, None, prompt.shape[1], head))
    nxt = first_ref["logits"][:, -1].argmax(-1).reshape(1, 1).astype(np.int64)
    want = (first_ref, session(step_feeds(model, nxt, first_ref, prompt.shape[1] + 1, head)))
    got = prefill_and_decode(model, native_host_runner(model), prompt, nxt, head)
    tol = tolerance_for("float32").logits
    for phase, g, w in zip(("prefill", "decode"), got, want):
        result = compare_tensors(g["logits"], w["logits"], dtype="float32", tol=tol)
        print(f"{phase}: max |native-host - ort-cpu| logits = {result.max_abs:.3g}")
        assert result.ok, f"{phase}: {result.reason}"
        assert (g["logits"].argmax(-1) == w["logits"].argmax(-1)).all(), phase
