"""bfloat16 on native-cuda (``engines/native/bf16.py``): 16-bit storage on the device, the
``lk_bf16`` kernels, and the tiny converted checkpoints decoded end to end.

Facts: the device conversions equal the host reference (itself ml_dtypes', see
``test_bf16_storage.py``) for every bfloat16 pattern and every float32 rounding tie; the
bfloat16 GEMV's rows do not depend on M, the batched matmul and the sum repeat the host
backend's arithmetic bit for bit; Cast nodes to and from bfloat16 equal ml_dtypes; an op with
no bfloat16 kernel is an error naming it. The tiny GGUF converted to bfloat16 (mixed
precision, append and static cache) decodes on native-cuda with no defect (identical or
near-tie against the float32 twin, and a divergence from native-host only at a near-tie),
finite logits within the bfloat16 row, zero host staging, exactly 4 bytes read back a token,
and, where graphs are on (static by default, append with ``graphs=True`` through capacity
buffers), PRIMARY captured once and replayed every later step, poison or not.

Every test here needs CUDA (``gpu`` marker, skipped without it).
"""
from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

pytest.importorskip("gguf", reason="the converter needs the 'real' extra (make real)")
pytest.importorskip("tokenizers", reason="the converter needs the 'real' extra (make real)")

import ml_dtypes  # noqa: E402

from engines.errors import ExecutionError  # noqa: E402
from engines.ledger import Ledger  # noqa: E402
from engines.native import bf16  # noqa: E402
from engines.native.array_backend import NumpyArrayBackend  # noqa: E402
from engines.native.graph_slots import GraphSlot  # noqa: E402
from engines.native.plan import Plan  # noqa: E402

pytestmark = pytest.mark.gpu
BF = np.dtype(ml_dtypes.bfloat16)
NEW_TOKENS = 16
CACHES = ["dynamic", "static"]


# -- fixtures --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def backend(cp, stream):
    from engines.native.cupy_array_backend import CupyArrayBackend

    return CupyArrayBackend(stream, Ledger(), device_id=0)


def host(value, stream) -> np.ndarray:
    """Test-side readback of the bits, ordered on ``stream``."""
    import cupy

    if value.dtype == BF:
        return cupy.asnumpy(value.view(np.uint16), stream=stream).view(BF)
    return cupy.asnumpy(value, stream=stream)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


def _same_values(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit, except that a NaN need only be a NaN where the other is: CUDA's float32
    to float16/float64 conversion makes every NaN the canonical one (seen on the H200),
    ml_dtypes keeps the payload."""
    nan = np.isnan(a)
    return (a.dtype == b.dtype and a.shape == b.shape and np.array_equal(nan, np.isnan(b))
            and a[~nan].tobytes() == b[~nan].tobytes())


@pytest.fixture(scope="module")
def converted(cp, tmp_path_factory):
    """The tiny GGUF converted to bfloat16 (with its float32 twin), one per cache kind."""
    from engines.package import load_package
    from harness.convert import convert
    from suites.convert_support import write_tiny_gguf

    root = tmp_path_factory.mktemp("bf16")
    gguf_path = write_tiny_gguf(root / "tiny.gguf")
    return {cache: load_package(convert(gguf_path, root / cache, dtype="bfloat16",
                                        cache=cache).folder) for cache in CACHES}


# -- conversions and kernels ---------------------------------------------------------------------

def test_gpu_conversions_equal_the_host_reference(backend, stream):
    import cupy

    bits = np.arange(1 << 16, dtype=np.uint16)
    with stream:
        wide = backend.bf16_to_float32(cupy.asarray(bits).view(BF))
    assert _same(host(wide, stream), bf16.bits_to_float32(bits))
    high = bits.astype(np.uint32) << np.uint32(16)
    rng = np.random.default_rng(3).integers(0, 1 << 32, 1 << 20, dtype=np.uint64)
    f32 = np.concatenate([high, high | 0x8000, high | 0x7FFF, high | 0x8001,
                          rng.astype(np.uint32)]).view(np.float32)
    with stream:
        narrow = backend.float32_to_bf16(cupy.asarray(f32))
    got = host(narrow, stream)
    assert got.dtype == BF
    assert _same(got.view(np.uint16), bf16.float32_to_bits(f32))


def test_gpu_bf16_gemv_rows_do_not_depend_on_m(backend, stream):
    rng = np.random.default_rng(7)
    w = rng.standard_normal((77, 100)).astype(BF)  # [K, N]
    x = rng.standard_normal((9, 77)).astype(BF)
    with stream:
        dw = backend.adopt(w)
        full = host(backend.matmul(backend.adopt(x), dw), stream)
        for m in range(1, 10):
            part = host(backend.matmul(backend.adopt(x[:m]), dw), stream)
            assert _same(part, full[:m]), m
    exact = x.astype(np.float64) @ w.astype(np.float64)
    err = np.abs(full.astype(np.float64) - exact)
    assert (err <= 2.0 ** -7 * np.abs(exact) + 1e-4).all()  # one bfloat16 rounding


@pytest.mark.claim("batch_invariance")
@pytest.mark.parametrize("shape", [(960, 576), (576, 1536), (49152, 576), (203, 1536)],
                         ids=lambda s: f"{s[0]}x{s[1]}")
def test_gpu_bf16_prefill_rows_through_the_tile_kernel_equal_single_rows(backend, stream,
                                                                         shape):
    """A bfloat16 prefill's 45 rows through ``gemv_tile`` (teams of 1, 2 and 4 warps, a
    partial last tile and block): each row is the M = 1 GEMV's bits."""
    from engines.native.cuda_kernels import get_kernels, kernel_name
    from engines.native.launch.gemv import gemv_tile_rows

    kernels = get_kernels(0)
    n, k = shape
    m = 45
    assert gemv_tile_rows(m, k) > 0
    rng = np.random.default_rng(n + k)
    w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(BF)  # W^T [N, K]
    x = rng.standard_normal((m, k)).astype(BF)
    name = kernel_name("gemv_tile", BF)
    with stream:
        xd, wd = backend.adopt(x), backend.adopt(w)
    launched = []
    real = kernels._functions[name]
    kernels._functions[name] = lambda *a, **kw: launched.append(1) or real(*a, **kw)
    try:
        out = host(kernels.gemv_rows(xd, wd, stream=stream, w_layout="nk"), stream)
    finally:
        kernels._functions[name] = real
    assert launched == [1]
    for i in (0, 6, 7, 15, 16, 31, 44):
        single = host(kernels.gemv_rows(xd[i:i + 1], wd, stream=stream, w_layout="nk"), stream)
        assert _same(out[i], single[0]), i
    exact = x.astype(np.float64) @ w.astype(np.float64).T
    err = np.abs(out.astype(np.float64) - exact)
    assert (err <= 2.0 ** -7 * np.abs(exact) + 1e-4).all()  # one bfloat16 rounding


def test_gpu_bf16_batched_matmul_and_sum_repeat_the_host(backend, stream):
    rng = np.random.default_rng(8)
    a = rng.standard_normal((2, 3, 5, 33)).astype(BF)
    b = rng.standard_normal((2, 3, 33, 6)).astype(BF)
    ref = NumpyArrayBackend()
    with stream:
        got = host(backend.matmul(backend.adopt(a), backend.adopt(b)), stream)
        summed = host(backend.sum(backend.adopt(a), 3), stream)
    assert _same(got, ref.matmul(a, b))
    assert _same(summed, ref.sum(a, 3))


def _one_node(op, inputs, out_type, **attrs):
    names = [f"x{i}" for i in range(len(inputs))]
    graph = helper.make_graph(
        [helper.make_node(op, names, ["y"], **attrs)], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in zip(names, inputs)],
        [helper.make_tensor_value_info("y", out_type, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])


CAST_SOURCES = {
    "float32": np.array([1.0, -2.5, 1 + 2 ** -8, 3.3e38, np.inf, np.nan, 1e-40], np.float32),
    "float16": np.array([1.0, -0.333, 65504.0, -np.inf, np.nan, 6e-8], np.float16),
    "float64": np.array([1.0 + 2 ** -9 + 2 ** -30, -1e300, 1e-300, np.nan], np.float64),
    "int64": np.array([0, -7, 2 ** 40 + 1, 255, 257], np.int64),
}


@pytest.mark.parametrize("source", sorted(CAST_SOURCES))
def test_gpu_casts_to_and_from_bfloat16_equal_ml_dtypes(backend, stream, source):
    x = CAST_SOURCES[source]
    down_type = TensorProto.BFLOAT16
    back_type = helper.np_dtype_to_tensor_dtype(x.dtype)
    with stream, np.errstate(over="ignore", invalid="ignore"):
        plan = bf16.Bf16Plan(_one_node("Cast", [x], down_type, to=down_type), backend)
        down = plan.run({"x0": backend.adopt(x)})["y"]
        assert down.dtype == BF and _same(host(down, stream), x.astype(BF))
        plan = bf16.Bf16Plan(_one_node("Cast", [x.astype(BF)], back_type, to=back_type), backend)
        up = host(plan.run({"x0": down})["y"], stream)
    assert _same_values(up, x.astype(BF).astype(x.dtype))


def test_gpu_an_op_without_a_bfloat16_kernel_is_an_error_naming_it(backend, stream):
    x = np.linspace(0.5, 2.0, 8).astype(BF)[None]
    plan = bf16.Bf16Plan(_one_node("Exp", [x], TensorProto.BFLOAT16), backend)
    with stream, pytest.raises(ExecutionError) as info:
        plan.run({"x0": backend.adopt(x)})
    assert info.value.field == "Exp.inputs" and "native-host" in info.value.remedy


def test_gpu_comparisons_and_additions_equal_the_host(backend, stream):
    rng = np.random.default_rng(9)
    a, b = (rng.standard_normal((4, 16)).astype(BF) for _ in range(2))
    b[0] = a[0]
    for op, out in (("Add", TensorProto.BFLOAT16), ("Greater", TensorProto.BOOL),
                    ("Mul", TensorProto.BFLOAT16)):
        model = _one_node(op, [a, b], out)
        with stream:
            got = host(bf16.Bf16Plan(model, backend).run(
                {"x0": backend.adopt(a), "x1": backend.adopt(b)})["y"], stream)
        assert _same(got, Plan(model, NumpyArrayBackend()).run({"x0": a, "x1": b})["y"]), op


# -- the converted checkpoint, end to end ----------------------------------------------------------

def _judged(oracle, prompt, tokens, tol):
    from harness.judge import judge_stream

    return judge_stream(oracle, prompt, tokens, NEW_TOKENS, tol)


@pytest.mark.claim("token_identity", "zero_staging", "readback_budget", "graph_replay")
@pytest.mark.parametrize("cache,graphs", [("dynamic", None), ("dynamic", True),
                                          ("static", None)],
                         ids=["dynamic-default", "dynamic-capacity-graphs", "static-graphs"])
def test_gpu_bf16_greedy_passes_the_verdict_rules_with_zero_staging(converted, cache, graphs):
    from engines.backends.native_cuda import NativeCudaEngine
    from engines.oracle import oracle_for
    from engines.registry import get_engine_class
    from engines.tolerances import tolerance_for
    from engines.workflow import greedy_decode
    from harness.judge import IDENTICAL, NEAR_TIE
    from harness.transfer_guard import transfer_guard

    package = converted[cache]
    assert package.spec.dtype == "bfloat16"
    tol = tolerance_for("bfloat16")
    oracle = oracle_for(package)
    engine = NativeCudaEngine(package, graphs=graphs)
    assert engine.graph_stable == (graphs is True or cache == "static"), \
        engine.capacity_refusals
    native_host = get_engine_class("native-host")(package)
    try:
        for prompt in package.spec.prompts[:2]:
            engine.reset_graphs()  # each prompt captures afresh
            with transfer_guard("disallow") as guard:
                result = greedy_decode(engine, prompt, NEW_TOKENS)
            led = result.ledger
            assert led.host_staging == 0 and guard.staging_count == 0, guard.staging_sites
            assert led.readback_bytes["token_id"] == 4 * len(result.tokens) > 0
            assert guard.readback_bytes["token_id"] == led.readback_bytes["token_id"]
            if engine.graphs:  # claim 6: capture once, replay every later decode step
                steps = led.forwards["decode"]
                c = led.slot(GraphSlot.PRIMARY.value)
                assert (c.captures, c.replays, c.fallbacks) == (1, steps - 1, 0), \
                    engine.slots[GraphSlot.PRIMARY].describe()
            device = _judged(oracle, prompt, result.tokens, tol)
            assert device.verdict in (IDENTICAL, NEAR_TIE), device.findings
            reference = greedy_decode(native_host, prompt, NEW_TOKENS).tokens
            hosted = _judged(oracle, prompt, reference, tol)
            assert hosted.verdict in (IDENTICAL, NEAR_TIE), hosted.findings
            if result.tokens != reference:  # the streams may part only at a near-tie
                split = next(i for i, (a, b) in enumerate(zip(result.tokens, reference))
                             if a != b)
                near = {f.step for f in device.findings + hosted.findings
                        if f.verdict == NEAR_TIE}
                assert split in near, (split, device.findings, hosted.findings)
    finally:
        engine.close()
        native_host.close()


@pytest.mark.claim("finite_logits", "logits_within_tolerance")
@pytest.mark.parametrize("cache", CACHES)
def test_gpu_bf16_logits_are_finite_and_within_the_row(converted, cache):
    from engines.backends.native_cuda import NativeCudaEngine
    from engines.oracle import oracle_for
    from engines.tolerances import tolerance_for
    from engines.workflow import greedy_decode
    from harness.judge import audit_logits

    package = converted[cache]
    engine = NativeCudaEngine(package)
    try:
        prompt = package.spec.prompts[0]
        result = greedy_decode(engine, prompt, NEW_TOKENS, audit=True)
    finally:
        engine.close()
    assert len(result.logits) == len(result.tokens) > 0
    audit = audit_logits(oracle_for(package), prompt, result.tokens, result.logits,
                         tolerance_for("bfloat16"))
    assert audit.non_finite_steps == 0
    assert audit.within_tolerance, [(s.step, s.max_abs, s.nmse) for s in audit.steps]


@pytest.mark.claim("graph_replay", "token_identity")
def test_gpu_bf16_poisoned_replays_decode_the_same_tokens(converted):
    from engines.backends.native_cuda import NativeCudaEngine
    from engines.workflow import greedy_decode

    package = converted["static"]
    plain, poisoned = NativeCudaEngine(package), NativeCudaEngine(package, poison_outputs=True)
    try:
        assert plain.graphs and poisoned.graphs
        prompt = package.spec.prompts[0]
        want = greedy_decode(plain, prompt, NEW_TOKENS)
        got = greedy_decode(poisoned, prompt, NEW_TOKENS)
        assert got.tokens == want.tokens
        assert got.ledger.slot(GraphSlot.PRIMARY.value).replays == len(got.tokens) - 2 > 0
    finally:
        plain.close()
        poisoned.close()
