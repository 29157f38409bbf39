"""onnxruntime's com.microsoft contrib ops (and its ONNX-domain SimplifiedLayerNormalization)
on native-host against onnxruntime's CPU provider, the op's defining implementation.

ONNX ships no node tests for these, so each case is a one-node model built with
``onnx.helper`` from Hypothesis-drawn shapes, attributes and data, run on both; every
output must agree within the tolerance table (``engines/tolerances.py``). The strategies
are shared with ``test_ops_cuda.py``, which runs the same cases on native-cuda.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field

import numpy as np
import onnx
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper

from engines.errors import ExecutionError
from engines.native.array_backend import NumpyArrayBackend
from engines.native.ops import KERNELS
from engines.native.plan import Plan, required_host_inputs, unsupported_ops
from harness.compare import compare_tensors

ort = pytest.importorskip("onnxruntime")

MS = "com.microsoft"
# onnxruntime 1.31 reads models up to IR 13 and onnx 1.23 writes IR 14 unless told.
IR_VERSION = 10


@dataclass
class OpCase:
    """One single-node model, its feeds, and the outputs to compare."""

    model: onnx.ModelProto
    feeds: dict[str, np.ndarray]
    outputs: list[str]
    label: str = ""
    host_inputs: frozenset = field(default_factory=frozenset)
    # environment onnxruntime's kernel reads when the session is made (a path switch)
    ort_env: dict = field(default_factory=dict)


def one_node(op: str, domain: str, inputs: dict, outputs: list[str], label: str = "",
             **attrs) -> OpCase:
    """A model of one node; ``inputs`` maps names to arrays (None: the slot left empty)."""
    names = [name if value is not None else "" for name, value in inputs.items()]
    feeds = {n: v for n, v in inputs.items() if v is not None}
    node = helper.make_node(op, names, [o or "" for o in outputs], domain=domain, **attrs)
    graph = helper.make_graph(
        [node], f"{op}_case",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in feeds.items()],
        [helper.make_empty_tensor_value_info(o) for o in outputs if o])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 22),
                                                    helper.make_opsetid(MS, 1)])
    model.ir_version = IR_VERSION
    return OpCase(model, feeds, [o for o in outputs if o], label or op,
                  frozenset(required_host_inputs(model)))


def run_ort(case: OpCase) -> dict[str, np.ndarray]:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    saved = {key: os.environ.get(key) for key in case.ort_env}
    os.environ.update(case.ort_env)
    try:
        session = ort.InferenceSession(case.model.SerializeToString(), options,
                                       providers=["CPUExecutionProvider"])
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return dict(zip(case.outputs, session.run(case.outputs, case.feeds)))


def run_native_host(case: OpCase) -> dict[str, np.ndarray]:
    plan = Plan(case.model, NumpyArrayBackend(), host_inputs=case.host_inputs)
    return {name: np.asarray(value) for name, value in plan.run(case.feeds).items()
            if name in case.outputs}


def assert_agree(got: dict, want: dict, label: str) -> None:
    for name, expected in want.items():
        actual = got[name]
        assert actual.dtype == expected.dtype, f"{label} {name}: {actual.dtype} != {expected.dtype}"
        result = compare_tensors(actual, expected, dtype=expected.dtype)
        assert result.ok, f"{label} {name}: {result.reason}"


def _normal(draw, shape, scale=1.0, dtype=np.float32):
    seed = draw(st.integers(0, 2**31 - 1))
    return (np.random.default_rng(seed).standard_normal(shape) * scale).astype(dtype)


FLOAT_DTYPES = st.sampled_from([np.float32, np.float16])


def _in_dtype(inputs: dict, dtype) -> dict:
    """The float32 arrays of ``inputs`` in ``dtype`` (integers and absent slots as they are)."""
    return {k: v.astype(dtype) if v is not None and v.dtype == np.float32 else v
            for k, v in inputs.items()}


def _rope_caches(max_pos: int, half: int):
    inv = 1.0 / (10000 ** (np.arange(half) / half))
    angles = np.outer(np.arange(max_pos), inv)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


# ---- strategies --------------------------------------------------------------------------

@st.composite
def gqa_cases(draw) -> OpCase:
    """GroupQueryAttention as exporters use it: a first prompt, a decode step with per-row
    lengths inside a longer cache buffer, or a continued prompt (batch 1), packed or split
    QKV, with or without rotary, a local window, softcap, an explicit scale."""
    kv_heads = draw(st.integers(1, 2))
    heads = kv_heads * draw(st.integers(1, 3))
    head = draw(st.sampled_from([16, 32]))
    mode = draw(st.sampled_from(["prompt", "decode", "continue"]))
    batch = 1 if mode == "continue" else draw(st.integers(1, 2))
    if mode == "prompt":
        seq = draw(st.integers(1, 6))
        totals = [seq] * batch
        past_len = draw(st.sampled_from([None, 0]))
    elif mode == "decode":
        seq = 1
        totals = [draw(st.integers(1, 7)) for _ in range(batch)]
        past_len = max(totals) - 1 + draw(st.integers(0, 2))
    else:
        seq = draw(st.integers(2, 5))
        past_len = draw(st.integers(1, 5))
        totals = [past_len + seq]
    total = max(totals)
    packed = draw(st.booleans())
    rotary = draw(st.booleans())
    attrs = dict(num_heads=heads, kv_num_heads=kv_heads,
                 local_window_size=draw(st.sampled_from([-1, 1, 3])),
                 softcap=draw(st.sampled_from([0.0, 4.0])),
                 scale=draw(st.sampled_from([0.0, 0.3])),
                 smooth_softmax=draw(st.sampled_from([-1, 1])),
                 do_rotary=int(rotary),
                 rotary_interleaved=int(rotary and draw(st.booleans())))
    q = _normal(draw, (batch, seq, heads * head))
    k = _normal(draw, (batch, seq, kv_heads * head))
    v = _normal(draw, (batch, seq, kv_heads * head))
    if packed:
        q, k, v = np.concatenate([q, k, v], axis=-1), None, None
    past_k = past_v = None
    if past_len is not None:
        past_k = _normal(draw, (batch, kv_heads, past_len, head))
        past_v = _normal(draw, (batch, kv_heads, past_len, head))
    cos = sin = positions = None
    if rotary:
        half = draw(st.sampled_from([h for h in (8, 16) if h <= head // 2]))
        cos, sin = _rope_caches(total + draw(st.integers(0, 3)), half)
        if draw(st.booleans()):  # explicit rotary positions, anywhere in the tables
            rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
            start = rng.integers(0, len(cos) - seq + 1, size=(batch, 1))
            # a first prompt rotates from position_ids[0, 0] on: keep that run in the table
            contiguous = mode == "prompt" or draw(st.booleans())
            positions = start + (np.arange(seq) if contiguous
                                 else rng.integers(0, len(cos) - start, size=(batch, seq)))
            positions = positions.astype(np.int64)
    inputs = {"query": q, "key": k, "value": v, "past_key": past_k, "past_value": past_v,
              "seqlens_k": np.array(totals, np.int32) - 1,
              "total_sequence_length": np.array(total, np.int32),
              "cos_cache": cos, "sin_cache": sin, "position_ids": positions}
    dtype = draw(FLOAT_DTYPES)
    inputs = _in_dtype(inputs, dtype)
    label = (f"GQA {np.dtype(dtype).name} {mode} B{batch} S{seq} T{total} P{past_len} "
             f"packed={packed} position_ids={positions is not None} {attrs}")
    return one_node("GroupQueryAttention", MS, inputs, ["out", "present_key", "present_value"],
                    label, **attrs)


@st.composite
def skip_norm_cases(draw) -> OpCase:
    simplified = draw(st.booleans())
    shape = (draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.sampled_from([8, 24, 64])))
    hidden = shape[-1]
    inputs = {"input": _normal(draw, shape), "skip": _normal(draw, shape),
              "gamma": _normal(draw, (hidden,))}
    if not simplified:
        inputs["beta"] = _normal(draw, (hidden,)) if draw(st.booleans()) else None
    inputs["bias"] = _normal(draw, (hidden,)) if draw(st.booleans()) else None
    op = "SkipSimplifiedLayerNormalization" if simplified else "SkipLayerNormalization"
    inputs = _in_dtype(inputs, draw(FLOAT_DTYPES))
    epsilon = draw(st.sampled_from([1e-5, 1e-6]))
    # output 1 (mean) and 2 (inv_std_var) are training outputs onnxruntime's CPU kernel
    # leaves unwritten; the fused sum (3) is what exporters read
    return one_node(op, MS, inputs, ["y", "", "", "sum"], op, epsilon=epsilon)


@st.composite
def simplified_norm_cases(draw) -> OpCase:
    rank = draw(st.integers(2, 3))
    lead = tuple(draw(st.integers(1, 4)) for _ in range(rank - 1))
    shape = lead + (draw(st.sampled_from([8, 40])),)
    axis = draw(st.sampled_from([-1, rank - 1]))
    # X and scale may differ in type (onnxruntime's T and V); Y takes scale's
    x_dtype, scale_dtype = draw(FLOAT_DTYPES), draw(FLOAT_DTYPES)
    inputs = {"x": _normal(draw, shape, 3.0, x_dtype),
              "scale": _normal(draw, shape[-1:], 1.0, scale_dtype)}
    return one_node("SimplifiedLayerNormalization", "", inputs, ["y"],
                    f"SimplifiedLayerNormalization x {np.dtype(x_dtype)} scale "
                    f"{np.dtype(scale_dtype)}", axis=axis, epsilon=1e-5)


@st.composite
def rotary_cases(draw) -> OpCase:
    """com.microsoft RotaryEmbedding: [B, S, hidden] or [B, N, S, H]; position ids per token
    or one start position; full or partial rotation; halves or interleaved pairs."""
    batch, seq, heads = draw(st.integers(1, 2)), draw(st.integers(1, 5)), draw(st.integers(1, 3))
    head = draw(st.sampled_from([8, 16]))
    rotary_dim = draw(st.sampled_from([0, head // 2])) if head >= 16 else 0
    half = (rotary_dim or head) // 2
    max_pos = seq + draw(st.integers(0, 8))
    cos, sin = _rope_caches(max_pos, half)
    four_d = draw(st.booleans())
    x = _normal(draw, (batch, heads, seq, head) if four_d else (batch, seq, heads * head))
    if draw(st.booleans()):
        rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
        pos = rng.integers(0, max_pos, size=(batch, seq)).astype(np.int64)
    else:
        pos = np.array([draw(st.integers(0, max_pos - seq))], np.int64)
    attrs = dict(interleaved=int(draw(st.booleans())))
    if rotary_dim:
        attrs.update(rotary_embedding_dim=rotary_dim, num_heads=heads)
    elif not four_d and draw(st.booleans()):
        attrs.update(num_heads=heads)
    inputs = _in_dtype({"input": x, "position_ids": pos, "cos_cache": cos, "sin_cache": sin},
                       draw(FLOAT_DTYPES))
    return one_node("RotaryEmbedding", MS, inputs, ["y"], f"RotaryEmbedding(ms) {attrs}", **attrs)


def pack_bits(values: np.ndarray, bits: int) -> np.ndarray:
    """uint [..., n] of ``bits``-bit values -> uint8 [..., n * bits / 8], low bits first."""
    per = 8 // bits
    v = values.astype(np.uint8).reshape(values.shape[:-1] + (-1, per))
    out = np.zeros(v.shape[:-1], np.uint8)
    for i in range(per):
        out |= (v[..., i] << (i * bits)).astype(np.uint8)
    return out


@st.composite
def matmul_nbits_cases(draw) -> OpCase:
    bits = draw(st.sampled_from([4, 8]))
    block = draw(st.sampled_from([16, 32]))
    k = draw(st.integers(block // 2, 3 * block))
    n = draw(st.integers(1, 9))
    blocks = -(-k // block)
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    q = rng.integers(0, 1 << bits, size=(n, blocks * block))
    b = pack_bits(q, bits).reshape(n, blocks, block * bits // 8)
    scales = (rng.random((n * blocks,)) * 0.1 + 0.01).astype(np.float32)
    # onnxruntime's CPU kernel takes float zero points for 4-bit weights only
    zp_kind = draw(st.sampled_from(["none", "packed"] + (["float"] if bits == 4 else [])))
    zp = None
    if zp_kind == "float":
        zp = (rng.random(n * blocks) * (1 << bits)).astype(np.float32)
    elif zp_kind == "packed":
        per = 8 // bits
        padded = -(-blocks // per) * per
        zq = rng.integers(0, 1 << bits, size=(n, padded))
        zp = pack_bits(zq, bits).reshape(-1)
    lead = draw(st.sampled_from([(1,), (3,), (2, 2)]))
    a = _normal(draw, lead + (k,))
    bias = _normal(draw, (n,)) if draw(st.booleans()) else None
    inputs = _in_dtype({"A": a, "B": b, "scales": scales, "zero_points": zp, "g_idx": None,
                        "bias": bias}, draw(FLOAT_DTYPES))
    label = (f"MatMulNBits bits={bits} block={block} K={k} N={n} zp={zp_kind} "
             f"bias={bias is not None}")
    return one_node("MatMulNBits", MS, inputs, ["Y"], label, K=k, N=n, bits=bits,
                    block_size=block, accuracy_level=0)


@st.composite
def gather_block_quantized_cases(draw) -> OpCase:
    """The builder's quantised embedding: uint8 rows packed along the last axis, blocks of
    scales (and optional packed zero points) along it, gathered by token ids."""
    bits = draw(st.sampled_from([4, 8]))
    block = draw(st.sampled_from([16, 32]))
    per = 8 // bits
    width = per * draw(st.integers(block // per // 2, 3 * block // per))
    rows, blocks = draw(st.integers(2, 12)), -(-width // block)
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    data = pack_bits(rng.integers(0, 1 << bits, size=(rows, width)), bits)
    scales = (rng.random((rows, blocks)) * 0.1 + 0.01).astype(draw(FLOAT_DTYPES))
    zp = None
    if draw(st.booleans()):
        padded = -(-blocks // per) * per
        zp = pack_bits(rng.integers(0, 1 << bits, size=(rows, padded)), bits)
    ids = rng.integers(0, rows, size=(draw(st.integers(1, 2)), draw(st.integers(1, 5))))
    inputs = {"data": data, "indices": ids.astype(draw(st.sampled_from([np.int32, np.int64]))),
              "scales": scales, "zero_points": zp}
    label = f"GatherBlockQuantized bits={bits} block={block} width={width} zp={zp is not None}"
    return one_node("GatherBlockQuantized", MS, inputs, ["y"], label, bits=bits,
                    block_size=block, gather_axis=0, quantize_axis=1)


@st.composite
def gelu_family_cases(draw) -> OpCase:
    """FastGelu (tanh form, optional bias), BiasGelu (erf form of A + B), QuickGelu
    (x * sigmoid(alpha x)) over values wide enough to reach both tails."""
    op = draw(st.sampled_from(["FastGelu", "BiasGelu", "QuickGelu"]))
    shape = (draw(st.integers(1, 3)), draw(st.integers(1, 4)), draw(st.sampled_from([8, 24])))
    inputs = {"X" if op != "BiasGelu" else "A": _normal(draw, shape, 4.0)}
    attrs = {}
    if op == "BiasGelu" or (op == "FastGelu" and draw(st.booleans())):
        inputs["bias"] = _normal(draw, shape[-1:])
    if op == "QuickGelu":
        attrs["alpha"] = draw(st.sampled_from([1.702, 1.0, 0.5]))
    inputs = _in_dtype(inputs, draw(FLOAT_DTYPES))
    return one_node(op, MS, inputs, ["Y"], f"{op} {attrs} bias={'bias' in inputs}", **attrs)


def _router_logits(draw, rows: int, experts: int) -> np.ndarray:
    """Router logits, sometimes with planted ties (a row's values drawn from two levels)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    if draw(st.booleans()):
        return rng.choice(np.array([0.5, -1.0], np.float32), size=(rows, experts))
    return rng.standard_normal((rows, experts)).astype(np.float32)


@st.composite
def moe_shape(draw) -> dict:
    experts = draw(st.integers(2, 5))
    return dict(experts=experts, k=draw(st.integers(1, min(experts, 3))),
                hidden=draw(st.sampled_from([8, 16])),
                lead=draw(st.sampled_from([(1,), (3,), (2, 2)])),
                activation=draw(st.sampled_from(["relu", "gelu", "silu", "identity", "swiglu"])),
                normalize=int(draw(st.booleans())))


def _swiglu_attrs(draw, p: dict) -> dict:
    if p["activation"] != "swiglu":
        return {}
    attrs = dict(swiglu_fusion=1)  # onnxruntime's CPU kernels take the interleaved form only
    if draw(st.booleans()):  # gpt-oss's clamped form
        attrs.update(activation_alpha=1.702, activation_beta=1.0, swiglu_limit=0.7)
    return attrs


@st.composite
def moe_cases(draw) -> OpCase:
    """com.microsoft MoE as onnxruntime's CPU kernel takes it: fc1/fc2 (fc1 gate and up
    interleaved for swiglu), optional biases, 2-D or 3-D tokens, router ties planted."""
    p = draw(moe_shape())
    e, h = p["experts"], p["hidden"]
    inter = draw(st.integers(2, 12))
    fused = 2 if p["activation"] == "swiglu" else 1
    rows = int(np.prod(p["lead"]))
    inputs = {"input": _normal(draw, p["lead"] + (h,)),
              "router_probs": _router_logits(draw, rows, e),
              "fc1_experts_weights": _normal(draw, (e, fused * inter, h), 0.3),
              "fc1_experts_bias": (_normal(draw, (e, fused * inter)) if draw(st.booleans())
                                   else None),
              "fc2_experts_weights": _normal(draw, (e, h, inter), 0.3),
              "fc2_experts_bias": _normal(draw, (e, h)) if draw(st.booleans()) else None}
    attrs = dict(k=p["k"], activation_type=p["activation"],
                 normalize_routing_weights=p["normalize"], **_swiglu_attrs(draw, p))
    inputs = _in_dtype(inputs, draw(FLOAT_DTYPES))
    return one_node("MoE", MS, inputs, ["output"], f"MoE {p} inter={inter} {attrs}", **attrs)


@st.composite
def qmoe_cases(draw) -> OpCase:
    """com.microsoft QMoE with integer experts: 4 or 8 bits, a scale per row or per block,
    optional packed zero points, optional router_weights, onnxruntime's CPU types."""
    p = draw(moe_shape())
    e, h = p["experts"], p["hidden"] * 2
    bits = draw(st.sampled_from([4, 8]))
    block = draw(st.sampled_from([0, 16]))
    inter = draw(st.sampled_from([16, 32]))
    fused = 2 if p["activation"] == "swiglu" else 1
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    dtype = draw(FLOAT_DTYPES)
    inputs = {"input": _normal(draw, p["lead"] + (h,)),
              "router_probs": _router_logits(draw, int(np.prod(p["lead"])), e)}

    def projection(name, n, k):
        blocks = k // block if block else 1
        q = pack_bits(rng.integers(0, 1 << bits, size=(e, n, k)), bits)
        scales = (rng.random((e, n, blocks) if block else (e, n)) * 0.05 + 0.01)
        zp = None
        if draw(st.booleans()):
            per = 8 // bits
            if not block:  # a zero point a row, packed along the rows
                zp = pack_bits(rng.integers(0, 1 << bits, size=(e, -(-n // per) * per)), bits)
            else:
                zp = pack_bits(rng.integers(0, 1 << bits, size=(e, n, -(-blocks // per) * per)),
                               bits)
        inputs[f"{name}_experts_weights"] = q
        inputs[f"{name}_scales"] = scales.astype(np.float32)
        inputs[f"{name}_experts_bias"] = _normal(draw, (e, n)) if draw(st.booleans()) else None
        return zp

    zp1 = projection("fc1", fused * inter, h)
    zp2 = projection("fc2", h, inter)
    inputs.update({"fc3_experts_weights": None, "fc3_scales": None, "fc3_experts_bias": None,
                   "fc1_zero_points": zp1, "fc2_zero_points": zp2, "fc3_zero_points": None,
                   "router_weights": (rng.random((int(np.prod(p["lead"])), e)).astype(np.float32)
                                      if draw(st.booleans()) else None)})
    attrs = dict(k=p["k"], activation_type=p["activation"], expert_weight_bits=bits,
                 normalize_routing_weights=p["normalize"], **_swiglu_attrs(draw, p))
    if block:
        attrs["block_size"] = block
    inputs = _in_dtype(inputs, dtype)
    label = (f"QMoE {p} bits={bits} block={block} zp={zp1 is not None}/{zp2 is not None} "
             f"router_weights={inputs['router_weights'] is not None} {attrs}")
    case = one_node("QMoE", MS, inputs, ["output"], label, **attrs)
    # onnxruntime's default 4-bit CPU path (MLAS Q4 GEMM) requantises weights with zero
    # points to its own symmetric blocks; this switch keeps its exact dequantising path
    case.ort_env = {"ORT_USE_MLAS_Q4_GEMM_MOE": "0"}
    return case


def _padding_mask(draw, batch: int, seq: int, total: int):
    """None, key lengths [B], or a 0/1 mask [B, T] or [B, S, T], key 0 always visible (a
    row that sees no key is a rounding contest at -10000, not a semantic check)."""
    rng = np.random.default_rng(draw(st.integers(0, 2**31 - 1)))
    kind = draw(st.sampled_from(["none", "lengths", "2d", "3d"]))
    if kind == "lengths":
        return rng.integers(1, total + 1, size=batch).astype(np.int32)
    if kind == "none":
        return None
    mask = (rng.random((batch, total) if kind == "2d" else (batch, seq, total)) < 0.7)
    mask[..., 0] = True
    return mask.astype(np.int32)


@st.composite
def mha_cases(draw) -> OpCase:
    """com.microsoft MultiHeadAttention: self attention over [B, S, D] with an optional
    bias, padding mask, attention bias, past key/value and the causal rule, or cross
    attention on keys and values already split by head."""
    batch, seq, heads = draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    head = draw(st.sampled_from([8, 16]))
    d = heads * head
    cross = draw(st.booleans())
    past = 0 if cross else draw(st.sampled_from([0, 0, 3]))
    kv_len = draw(st.integers(1, 5)) if cross else seq
    total = past + kv_len
    inputs = {"query": _normal(draw, (batch, seq, d))}
    if cross:
        inputs.update(key=_normal(draw, (batch, heads, kv_len, head)),
                      value=_normal(draw, (batch, heads, kv_len, head)), bias=None)
    else:
        inputs.update(key=_normal(draw, (batch, seq, d)), value=_normal(draw, (batch, seq, d)),
                      bias=_normal(draw, (3 * d,)) if draw(st.booleans()) else None)
    inputs.update(key_padding_mask=_padding_mask(draw, batch, seq, total),
                  attention_bias=(_normal(draw, (1, heads, seq, total))
                                  if draw(st.booleans()) else None),
                  past_key=_normal(draw, (batch, heads, past, head)) if past else None,
                  past_value=_normal(draw, (batch, heads, past, head)) if past else None)
    attrs = dict(num_heads=heads, unidirectional=int(not cross and draw(st.booleans())))
    if draw(st.booleans()):
        attrs["scale"] = 0.2
    if draw(st.booleans()):
        attrs["mask_filter_value"] = -3.0  # finite enough to matter in every masked row
    outputs = ["out"] + (["present_key", "present_value"] if past else [])
    mask = inputs["key_padding_mask"]
    return one_node("MultiHeadAttention", MS, inputs, outputs,
                    f"MHA B{batch} S{seq} L{kv_len} P{past} cross={cross} {attrs} "
                    f"mask={None if mask is None else mask.shape}", **attrs)


@st.composite
def contrib_attention_cases(draw) -> OpCase:
    """com.microsoft Attention: its own Q/K/V projection (equal or qkv_hidden_sizes), a
    key-length or 0/1 mask, a past [2, B, N, P, H] or an attention bias (onnxruntime takes
    one or the other), the causal rule."""
    batch, seq, heads = draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.integers(1, 3))
    head = draw(st.sampled_from([8, 16]))
    d, d_in = heads * head, draw(st.sampled_from([8, 24]))
    v_head = draw(st.sampled_from([head, 8]))
    past = draw(st.sampled_from([0, 0, 2]))
    if past:
        v_head = head  # with a past, K and V share a width
    sizes = [d, d, heads * v_head]
    total = past + seq
    inputs = {"input": _normal(draw, (batch, seq, d_in)),
              "weights": _normal(draw, (d_in, sum(sizes)), 0.5),
              "bias": _normal(draw, (sum(sizes),)),
              "mask_index": _padding_mask(draw, batch, seq, total),
              "past": _normal(draw, (2, batch, heads, past, head)) if past else None,
              "attention_bias": (_normal(draw, (1, heads, seq, total))
                                 if not past and draw(st.booleans()) else None)}
    attrs = dict(num_heads=heads, unidirectional=int(draw(st.booleans())))
    if sizes[2] != d:
        attrs["qkv_hidden_sizes"] = sizes
    if draw(st.booleans()):
        attrs["mask_filter_value"] = -3.0
    outputs = ["out"] + (["present"] if past else [])
    return one_node("Attention", MS, inputs, outputs,
                    f"Attention(ms) B{batch} S{seq} P{past} sizes={sizes} {attrs}", **attrs)


CASES = {
    "Attention(ms)": contrib_attention_cases,
    "GatherBlockQuantized": gather_block_quantized_cases,
    "MultiHeadAttention": mha_cases,
    "MoE": moe_cases,
    "QMoE": qmoe_cases,
    "GeluFamily": gelu_family_cases,
    "GroupQueryAttention": gqa_cases,
    "SkipNormalization": skip_norm_cases,
    "SimplifiedLayerNormalization": simplified_norm_cases,
    "RotaryEmbedding": rotary_cases,
    "MatMulNBits": matmul_nbits_cases,
}


# ---- native-host against onnxruntime ------------------------------------------------------

@pytest.mark.parametrize("family", sorted(CASES))
@given(data=st.data())
def test_contrib_op_matches_onnxruntime_cpu(family, data):
    case = data.draw(CASES[family](), label="case")
    assert_agree(run_native_host(case), run_ort(case), case.label)


def test_exporter_ops_are_supported_by_domain():
    """The contrib ops resolve under their domain only; an unknown contrib op is reported
    domain-qualified, and the ONNX op of the same name stays the ONNX one."""
    for key in ("com.microsoft:GroupQueryAttention", "com.microsoft:MatMulNBits",
                "com.microsoft:SkipSimplifiedLayerNormalization",
                "com.microsoft:RotaryEmbedding", "SimplifiedLayerNormalization",
                "RotaryEmbedding"):
        assert key in KERNELS, key
    assert KERNELS["RotaryEmbedding"] is not KERNELS["com.microsoft:RotaryEmbedding"]
    assert "GroupQueryAttention" not in KERNELS  # not an ONNX-domain op
    model = helper.make_model(helper.make_graph(
        [helper.make_node("GroupQueryAttention", ["q"], ["y"], domain=MS, num_heads=1,
                          kv_num_heads=1),
         helper.make_node("FusedConv", ["y"], ["z"], domain=MS),
         helper.make_node("GroupQueryAttention", ["z"], ["w"], num_heads=1, kv_num_heads=1)],
        "g", [helper.make_tensor_value_info("q", TensorProto.FLOAT, None)],
        [helper.make_tensor_value_info("w", TensorProto.FLOAT, None)]))
    assert unsupported_ops(model) == ["GroupQueryAttention", "com.microsoft:FusedConv"]


def test_gqa_total_sequence_length_is_a_host_input():
    """total_sequence_length sets present's shape, so it is read on the host; seqlens_k is
    not (it stays a device value on native-cuda)."""
    case = one_node("GroupQueryAttention", MS, {
        "query": np.zeros((1, 1, 16), np.float32), "key": np.zeros((1, 1, 16), np.float32),
        "value": np.zeros((1, 1, 16), np.float32), "past_key": None, "past_value": None,
        "seqlens_k": np.zeros(1, np.int32), "total_sequence_length": np.array(1, np.int32)},
        ["y"], num_heads=1, kv_num_heads=1)
    assert case.host_inputs == {"total_sequence_length"}


def test_gqa_refuses_inputs_it_does_not_implement():
    q = np.zeros((1, 1, 16), np.float32)
    case = one_node("GroupQueryAttention", MS, {
        "query": q, "key": q, "value": q, "past_key": None, "past_value": None,
        "seqlens_k": np.zeros(1, np.int32), "total_sequence_length": np.array(1, np.int32),
        "cos_cache": None, "sin_cache": None, "position_ids": None,
        "attention_bias": np.zeros((1, 1, 1, 1), np.float32)}, ["y"], num_heads=1,
        kv_num_heads=1)
    with pytest.raises(ExecutionError) as info:
        Plan(case.model, NumpyArrayBackend(), host_inputs=case.host_inputs)
    assert info.value.field == "GroupQueryAttention.input[10]"
    assert info.value.value == "attention_bias" and "ort-cpu" in info.value.remedy


def _gqa_rotary_prompt(positions: np.ndarray) -> OpCase:
    rng = np.random.default_rng(7)
    batch, seq = positions.shape
    cos, sin = _rope_caches(16, 8)
    return one_node("GroupQueryAttention", MS, {
        "query": rng.standard_normal((batch, seq, 64)).astype(np.float32), "key": None,
        "value": None, "past_key": None, "past_value": None,
        "seqlens_k": np.full(batch, seq - 1, np.int32),
        "total_sequence_length": np.array(seq, np.int32), "cos_cache": cos, "sin_cache": sin,
        "position_ids": positions}, ["out", "present_key", "present_value"], num_heads=2,
        kv_num_heads=1, do_rotary=1)


def test_gqa_first_prompt_rotates_every_row_from_the_first_position_id():
    """onnxruntime reads only position_ids[0, 0] on a first prompt: row 1's own start (7)
    is ignored, so its keys equal those of a batch whose rows both start at 2."""
    own = run_native_host(_gqa_rotary_prompt(np.array([[2, 3, 4], [7, 8, 9]], np.int64)))
    want = run_ort(_gqa_rotary_prompt(np.array([[2, 3, 4], [7, 8, 9]], np.int64)))
    assert_agree(own, want, "first prompt with position_ids")
    same = run_native_host(_gqa_rotary_prompt(np.array([[2, 3, 4], [2, 3, 4]], np.int64)))
    assert own["present_key"].tobytes() == same["present_key"].tobytes()


def test_matmul_nbits_names_a_weight_of_the_wrong_shape():
    case = one_node("MatMulNBits", MS, {
        "A": np.zeros((1, 32), np.float32), "B": np.zeros((4, 1, 8), np.uint8),
        "scales": np.ones(4, np.float32)}, ["Y"], K=32, N=4, bits=4, block_size=32)
    with pytest.raises(ExecutionError) as info:
        run_native_host(case)
    assert info.value.field == "B.shape" and info.value.value == (4, 1, 8)
    assert "[4, 1, 16]" in info.value.remedy


# ---- claim 2 at the op level: a verify block equals its decode steps, bit for bit --------

@st.composite
def gqa_block_params(draw) -> dict:
    kv_heads = draw(st.integers(1, 2))
    return dict(kv_heads=kv_heads, heads=kv_heads * draw(st.integers(1, 3)),
                head=draw(st.sampled_from([16, 32])), past=draw(st.integers(1, 6)),
                rows=draw(st.integers(2, 5)), rotary=draw(st.booleans()),
                window=draw(st.sampled_from([-1, 2])), softcap=draw(st.sampled_from([0.0, 4.0])),
                seed=draw(st.integers(0, 2**31 - 1)))


def gqa_block_and_steps(be, p: dict):
    """GroupQueryAttention over ``rows`` new tokens at once after a cache of ``past``, and
    the same tokens one decode step at a time (each on the cache the previous returned):
    (block output, block present key, [step outputs], last step's present key), on ``be``."""
    from engines.native.ops import KERNELS

    rng = np.random.default_rng(p["seed"])
    heads, kv_heads, head, past, rows = p["heads"], p["kv_heads"], p["head"], p["past"], p["rows"]
    node = helper.make_node("GroupQueryAttention", [], [], domain=MS, num_heads=heads,
                            kv_num_heads=kv_heads, do_rotary=int(p["rotary"]),
                            local_window_size=p["window"], softcap=p["softcap"])
    kernel = KERNELS[f"{MS}:GroupQueryAttention"](node, 1)
    qkv = be.adopt(rng.standard_normal((1, rows, (heads + 2 * kv_heads) * head)).astype(np.float32))
    cache_k = be.adopt(rng.standard_normal((1, kv_heads, past, head)).astype(np.float32))
    cache_v = be.adopt(rng.standard_normal((1, kv_heads, past, head)).astype(np.float32))
    cos = sin = None
    if p["rotary"]:
        cos, sin = (be.adopt(c) for c in _rope_caches(past + rows, head // 2))

    def call(x, pk, pv, total):
        seqlens = be.adopt(np.array([total - 1], np.int32))
        return kernel(be, x, None, None, pk, pv, seqlens, np.array(total, np.int32), cos, sin)

    block, block_k, _ = call(qkv, cache_k, cache_v, past + rows)
    steps, pk, pv = [], cache_k, cache_v
    for j in range(rows):
        out, pk, pv = call(qkv[:, j:j + 1], pk, pv, past + j + 1)
        steps.append(out)
    return block, block_k, steps, pk


@given(params=gqa_block_params())
def test_gqa_verify_block_rows_equal_decode_steps_bitwise(params):
    be = NumpyArrayBackend()
    block, block_k, steps, step_k = gqa_block_and_steps(be, params)
    for j, out in enumerate(steps):
        assert block[:, j:j + 1].tobytes() == out.tobytes(), f"row {j} differs: {params}"
    assert block_k.tobytes() == step_k.tobytes()


def _swiglu_moe(fusion: int, w_gate, w_up, rows=slice(None)) -> OpCase:
    """MoE with swiglu's gate and up projections laid out as ``fusion`` says, over four
    tokens (or the ``rows`` of them)."""
    rng = np.random.default_rng(8)
    experts, inter, hidden = w_gate.shape
    fc1 = {1: np.stack([w_gate, w_up], axis=2).reshape(experts, 2 * inter, hidden),
           2: np.concatenate([w_gate, w_up], axis=1), 0: w_gate}[fusion]
    inputs = {"input": rng.standard_normal((4, hidden)).astype(np.float32)[rows],
              "router_probs": rng.standard_normal((4, experts)).astype(np.float32)[rows],
              "fc1_experts_weights": fc1, "fc1_experts_bias": None,
              "fc2_experts_weights": (rng.standard_normal((experts, hidden, inter))
                                      .astype(np.float32)),
              "fc2_experts_bias": None,
              "fc3_experts_weights": w_up if fusion == 0 else None}
    return one_node("MoE", MS, inputs, ["output"], k=2, activation_type="swiglu",
                    swiglu_fusion=fusion, swiglu_limit=1.5, activation_alpha=1.702)


def test_moe_swiglu_layouts_onnxruntime_cpu_lacks_compute_the_interleaved_result():
    """onnxruntime's CPU kernel takes swiglu_fusion=1 only: fusion 2 ([gate | up]) and 0
    (fc3 the up projection) hold the same weights laid out otherwise, so they must give its
    bits exactly; the interleaved form is the one checked against onnxruntime."""
    rng = np.random.default_rng(9)
    gate, up = (rng.standard_normal((3, 5, 8)).astype(np.float32) for _ in range(2))
    interleaved = _swiglu_moe(1, gate, up)
    want = run_native_host(interleaved)["output"]
    assert_agree({"output": want}, run_ort(interleaved), "swiglu fusion 1")
    for fusion in (0, 2):
        got = run_native_host(_swiglu_moe(fusion, gate, up))["output"]
        assert got.tobytes() == want.tobytes(), f"fusion {fusion}"


@pytest.mark.parametrize("op, attrs, field, value", [
    ("MoE", dict(activation_type="geglu"), "activation_type", "geglu"),
    ("MoE", dict(use_sparse_mixer=1), "use_sparse_mixer", 1),
    ("QMoE", dict(quant_type="fp4"), "quant_type", "fp4"),
    ("QMoE", dict(expert_weight_bits=3), "expert_weight_bits", 3),
    ("QMoE", dict(weights_prepacked=1), "weights_prepacked", 1),
])
def test_moe_refuses_what_it_does_not_implement_by_name(op, attrs, field, value):
    model = one_node(op, MS, {"input": np.zeros((1, 8), np.float32),
                              "router_probs": np.zeros((1, 2), np.float32)},
                     ["output"], k=1, **attrs).model
    with pytest.raises(ExecutionError) as info:
        Plan(model, NumpyArrayBackend())
    assert info.value.field == field and info.value.value == value
    assert info.value.remedy


def test_moe_rows_of_a_block_are_the_rows_computed_alone_bitwise():
    """Claim 2 for MoE: every expert runs over every row, so a row's bits do not depend on
    the other rows of the call (nor on which experts they chose)."""
    gate, up = np.random.default_rng(10).standard_normal((2, 4, 3, 8)).astype(np.float32)
    block = run_native_host(_swiglu_moe(1, gate, up))["output"]
    for row in range(block.shape[0]):
        alone = run_native_host(_swiglu_moe(1, gate, up, slice(row, row + 1)))["output"]
        assert alone.tobytes() == block[row:row + 1].tobytes(), f"row {row}"


@pytest.mark.parametrize("op, inputs, attrs, field, value", [
    ("MultiHeadAttention", ["query", "key", "value", "", "", "", "", "", "", "beams"], {},
     "MultiHeadAttention.input[9]", "cache_indirection"),
    ("Attention", ["input", "weights"], dict(do_rotary=1), "do_rotary", 1),
    ("Attention", ["input", "weights"], dict(past_present_share_buffer=1),
     "past_present_share_buffer", 1),
])
def test_contrib_attention_refuses_what_it_does_not_implement_by_name(op, inputs, attrs,
                                                                       field, value):
    node = helper.make_node(op, inputs, ["y"], domain=MS, num_heads=2, **attrs)
    model = helper.make_model(helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
                      for n in inputs if n], [helper.make_empty_tensor_value_info("y")]))
    with pytest.raises(ExecutionError) as info:
        Plan(model, NumpyArrayBackend())
    assert info.value.field == field and info.value.value == value


def test_multihead_attention_names_a_mask_form_it_does_not_take():
    q = np.zeros((2, 3, 16), np.float32)
    case = one_node("MultiHeadAttention", MS, {
        "query": q, "key": q, "value": q, "bias": None,
        "key_padding_mask": np.array([3, 3, 0, 0, 0, 0, 0, 0], np.int32)}, ["out"],
        num_heads=2)
    with pytest.raises(ExecutionError) as info:
        run_native_host(case)
    assert info.value.field == "mask.shape" and info.value.value == (8,)


def test_matmul_nbits_dequantises_a_weight_once():
    """B and scales are initializers: the first forward dequantises them, later forwards
    reuse that weight; it is (q - 8) * scale, the default zero point of 4 bits."""
    q = np.random.default_rng(0).integers(0, 16, size=(3, 32))
    b, scales = pack_bits(q, 4).reshape(3, 1, 16), np.full(3, 0.5, np.float32)
    a = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    model = one_node("MatMulNBits", MS, {"A": a, "B": b, "scales": scales}, ["Y"], K=32, N=3,
                     bits=4, block_size=32).model
    for name, value in (("B", b), ("scales", scales)):  # as an exporter stores them
        model.graph.initializer.append(onnx.numpy_helper.from_array(value, name))
        model.graph.input.remove(next(i for i in model.graph.input if i.name == name))
    plan = Plan(model, NumpyArrayBackend())
    (step,) = plan.steps
    first = plan.run({"A": a})["Y"]
    weight = step.kernel._cached[3]
    np.testing.assert_array_equal(weight, ((q - 8) * 0.5).astype(np.float32))
    second = plan.run({"A": a})["Y"]
    assert step.kernel._cached[3] is weight
    assert first.tobytes() == second.tobytes()
    result = compare_tensors(first, a.astype(np.float64) @ weight.T.astype(np.float64),
                             dtype="float32")
    assert result.ok, result.reason


# ---- the comparisons catch planted bugs --------------------------------------------------

def _window_case() -> OpCase:
    rng = np.random.default_rng(3)
    q = rng.standard_normal((1, 6, 64)).astype(np.float32)  # packed QKV: 2 + 2 * 1 heads of 16
    return one_node("GroupQueryAttention", MS, {
        "query": q, "key": None, "value": None, "past_key": None, "past_value": None,
        "seqlens_k": np.array([5], np.int32), "total_sequence_length": np.array(6, np.int32)},
        ["out", "present_key", "present_value"], num_heads=2, kv_num_heads=1,
        local_window_size=2)


def _rotary_case() -> OpCase:
    cos, sin = _rope_caches(8, 8)
    x = np.random.default_rng(4).standard_normal((1, 3, 32)).astype(np.float32)
    return one_node("RotaryEmbedding", MS, {"input": x, "position_ids": np.array([2], np.int64),
                                             "cos_cache": cos, "sin_cache": sin}, ["y"])


def _nbits_case() -> OpCase:
    rng = np.random.default_rng(5)
    b = pack_bits(rng.integers(0, 16, size=(4, 32)), 4).reshape(4, 1, 16)
    return one_node("MatMulNBits", MS, {"A": rng.standard_normal((2, 32)).astype(np.float32),
                                        "B": b, "scales": np.full(4, 0.1, np.float32)},
                    ["Y"], K=32, N=4, bits=4, block_size=32)


def _plant_window_off_by_one(monkeypatch):
    from engines.native.ops import attention

    class Planted(attention.GroupQueryAttention):
        def setup(self):
            super().setup()
            self.window += 1  # sees one key too many: the older reading of the attribute

    monkeypatch.setitem(KERNELS, f"{MS}:GroupQueryAttention", Planted)


def _plant_rotary_pairing(monkeypatch):
    from engines.native.ops import rotary

    class Planted(rotary.ContribRotaryEmbedding):
        def setup(self):
            super().setup()
            self.interleaved = not self.interleaved  # pairs neighbours instead of halves

    monkeypatch.setitem(KERNELS, f"{MS}:RotaryEmbedding", Planted)


def _plant_nibble_order(monkeypatch):
    from engines.native.ops import quantized

    real = quantized.unpack

    def high_nibble_first(xp, packed, bits):
        values = real(xp, packed, bits)
        return values.reshape(values.shape[:-1] + (-1, 2))[..., ::-1].reshape(values.shape)

    monkeypatch.setattr(quantized, "unpack", high_nibble_first)


def _moe_tie_case() -> OpCase:
    """Four experts, every router logit equal: onnxruntime takes the two highest indices."""
    rng = np.random.default_rng(6)
    return one_node("MoE", MS, {
        "input": rng.standard_normal((3, 8)).astype(np.float32),
        "router_probs": np.zeros((3, 4), np.float32),
        "fc1_experts_weights": rng.standard_normal((4, 6, 8)).astype(np.float32),
        "fc1_experts_bias": None,
        "fc2_experts_weights": rng.standard_normal((4, 8, 6)).astype(np.float32)},
        ["output"], k=2, activation_type="identity")


def _plant_moe_ties_to_lower_index(monkeypatch):
    from engines.native.ops import moe

    def lower_index_first(self, be, scores):
        order = np.argsort(-scores, axis=-1, kind="stable")[:, : self.k]
        chosen = np.zeros(scores.shape, bool)
        np.put_along_axis(chosen, order, True, axis=-1)
        return chosen

    monkeypatch.setattr(moe.MoE, "chosen", lower_index_first)


def _mha_causal_case() -> OpCase:
    rng = np.random.default_rng(11)
    x = rng.standard_normal((3, 2, 4, 16)).astype(np.float32)
    return one_node("MultiHeadAttention", MS, {
        "query": x[0], "key": x[1], "value": x[2], "bias": None,
        "key_padding_mask": np.array([[1, 0, 1, 1], [0, 1, 1, 0]], np.int32)[:, :4]},
        ["out"], num_heads=2, unidirectional=1, mask_filter_value=-3.0)


def _plant_causal_uses_the_mask_filter(monkeypatch):
    from engines.native.ops import contrib_attention

    monkeypatch.setattr(contrib_attention, "CAUSAL_FILTER", -3.0)


PLANTED = {"gqa-window-off-by-one": (_window_case, _plant_window_off_by_one),
           "mha-causal-filter-is-mask-filter": (_mha_causal_case,
                                                _plant_causal_uses_the_mask_filter),
           "moe-ties-to-lower-index": (_moe_tie_case, _plant_moe_ties_to_lower_index),
           "rotary-pairs-swapped": (_rotary_case, _plant_rotary_pairing),
           "nbits-nibble-order": (_nbits_case, _plant_nibble_order)}


@pytest.mark.parametrize("bug", sorted(PLANTED))
def test_a_planted_kernel_bug_is_caught_and_the_control_passes(bug, monkeypatch):
    make_case, plant = PLANTED[bug]
    case = make_case()
    want = run_ort(case)
    assert_agree(run_native_host(case), want, f"control for {bug}")
    plant(monkeypatch)
    with pytest.raises(AssertionError):
        assert_agree(run_native_host(case), want, bug)
