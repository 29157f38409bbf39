"""native-cuda's kernels and array backend on the device (claim 2 at the kernel level), and
ONNX's node tests through the plan on CuPy. The engine end to end (tokens, staging,
readback, memory, batch invariance of whole forwards) is ``test_native_cuda_decode.py``.

The ``gpu`` tests skip without CUDA (and fail under ``--require-gpu``). Bit-for-bit where
the arithmetic is defined to be the same: a row of an M-row product equals the M=1 row,
trailing zero terms change nothing, and the batched matmul and the sum repeat the host
backend's arithmetic exactly. The GEMV splits K over 32 lanes, so against float64 and the
host it agrees within the tolerance table (``engines/tolerances.py``).

The few tests without the marker check what CI can: the kernel source's families, the
weight-shape scan, and that the engine reports a missing CUDA cleanly.
"""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from engines.cuda_support import cuda_availability
from engines.errors import EngineUnavailable, ExecutionError, ResidencyError
from engines.ledger import Ledger
from engines.native import cuda_kernels
from engines.native.launch.bmm import MATMUL_DTYPES
from engines.native.launch.gemv import GEMV_DTYPES, gemv_tile_rows
from engines.native.launch.sum_axis import SUM_DTYPES
from engines.native.array_backend import NumpyArrayBackend
from harness.compare import compare_tensors

GEMV_SHAPES = [(1536, 576), (576, 1536), (2048, 64), (100, 77)]  # weights as N x K
M_RANGE = range(1, 10)
# [N, K] of the tile kernel's checks: SmolLM2's q, gate, down and head (teams of 2, 1, 2, 1
# warps), and N = 203, K = 1536 (a team of 4; 203 is no multiple of a block's columns)
TILE_SHAPES = [(960, 576), (3072, 576), (576, 1536), (49152, 576), (203, 1536)]


# -- fixtures ------------------------------------------------------------------------------





@pytest.fixture(scope="module")
def kernels(cp):
    return cuda_kernels.get_kernels(0)


@pytest.fixture(scope="module")
def backend(cp, stream):
    from engines.native.cupy_array_backend import CupyArrayBackend

    return CupyArrayBackend(stream, Ledger(), device_id=0)


def host(value, stream) -> np.ndarray:
    """Test-side readback (the suite may read; the engine may not), ordered on ``stream``:
    the copy must follow the kernels queued there, and a non-blocking stream does not
    synchronise with the default one."""
    import cupy

    return cupy.asnumpy(value, stream=stream)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def assert_close(actual: np.ndarray, expected: np.ndarray, dtype) -> None:
    result = compare_tensors(actual, expected, dtype=np.dtype(dtype).name)
    assert result.ok, result.reason


def weights(rng, n: int, k: int, dtype) -> np.ndarray:
    """W as [K, N], scaled like a trained layer so outputs are O(1)."""
    return (rng.standard_normal((k, n)) / np.sqrt(k)).astype(dtype)


# -- CPU: what CI can check ----------------------------------------------------------------

def test_kernel_source_has_every_family_for_every_dtype():
    modules = cuda_kernels.CudaKernels.modules()
    names = [i for module in modules for i in module.instances]
    for dtype in GEMV_DTYPES:
        assert cuda_kernels.kernel_name("gemv_rows", dtype) in names
    for dtype in MATMUL_DTYPES:
        assert cuda_kernels.kernel_name("bmm", dtype) in names
    for dtype in SUM_DTYPES:
        assert cuda_kernels.kernel_name("sum_axis", dtype) in names
    assert len(set(names)) == len(names), "an instance is named twice"
    for module in modules:
        assert "cuBLAS" not in module.text().replace("no cuBLAS", ""), module.file


def test_kernel_name_refuses_unsupported_dtypes():
    with pytest.raises(ExecutionError) as info:
        cuda_kernels.kernel_name("gemv_rows", np.float64)
    assert info.value.field == "dtype" and info.value.value == "float64"
    assert "float32" in info.value.remedy
    with pytest.raises(ExecutionError):
        cuda_kernels.kernel_name("sum_axis", np.bool_)


def test_matmul_weight_shapes_picks_matmul_and_untransposed_gemm_weights():
    from engines.backends.native_cuda import matmul_weight_shapes

    def init(name, shape):
        return numpy_helper.from_array(np.zeros(shape, np.float32), name)

    nodes = [
        helper.make_node("MatMul", ["x", "w_mm"], ["a"]),
        helper.make_node("Gemm", ["x", "w_gemm_t"], ["b"], transB=1),
        helper.make_node("Gemm", ["x", "w_gemm"], ["c"]),
        helper.make_node("MatMul", ["a", "y"], ["d"]),  # activation x activation
        helper.make_node("Gather", ["w_embed", "ids"], ["e"]),
        helper.make_node("MatMul", ["x", "w_3d"], ["f"]),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8]),
         helper.make_tensor_value_info("y", TensorProto.FLOAT, [5, 3]),
         helper.make_tensor_value_info("ids", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in "abcdef"],
        [init("w_mm", (8, 5)), init("w_gemm_t", (6, 8)), init("w_gemm", (8, 7)),
         init("w_embed", (11, 8)), init("w_3d", (2, 8, 4))])
    assert matmul_weight_shapes(helper.make_model(graph)) == {(8, 5), (8, 7)}


def test_engine_without_cuda_is_unavailable_with_a_reason():
    from engines.backends.native_cuda import NativeCudaEngine

    ok, reason = cuda_availability()
    if ok:
        pytest.skip("CUDA is available here; this checks the machine without it")
    avail = NativeCudaEngine.availability()
    assert not avail.ok and avail.reason == reason and "CuPy" in avail.reason
    with pytest.raises(EngineUnavailable) as info:
        NativeCudaEngine(None)  # refuses before it touches the package
    assert info.value.remedy and "cupy" in info.value.remedy.lower()


# -- GEMV ----------------------------------------------------------------------------------

@pytest.mark.claim("batch_invariance")
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", GEMV_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gemv_rows_are_bitwise_independent_of_m(cp, stream, kernels, shape, dtype):
    n, k = shape
    rng = np.random.default_rng(n * 7 + k)
    w = weights(rng, n, k, dtype)
    x = rng.standard_normal((33, k)).astype(dtype)
    with stream:
        xd, wd = cp.asarray(x), cp.asarray(w)
        w_nk = cp.ascontiguousarray(wd.T)
    singles = [host(kernels.gemv_rows(xd[i:i + 1], w_nk, stream=stream, w_layout="nk"), stream)[0]
               for i in range(33)]
    for m in list(M_RANGE) + [16, 17, 33]:  # 17 and 33 cross the 16-row chunk
        out = host(kernels.gemv_rows(xd[:m], w_nk, stream=stream, w_layout="nk"), stream)
        for i in range(m):
            assert same_bits(out[i], singles[i]), f"row {i} of M={m} differs from M=1"
    # the [K, N] layout runs the same arithmetic in the same order
    out_kn = host(kernels.gemv_rows(xd[:9], wd, stream=stream, w_layout="kn"), stream)
    assert same_bits(out_kn, np.stack(singles[:9]))


@pytest.mark.claim("batch_invariance")
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", TILE_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_prefill_rows_through_the_tile_kernel_equal_single_rows(cp, stream, kernels, shape,
                                                                dtype):
    """A prefill's M (more rows than a chunk) runs ``gemv_tile`` (x staged in shared memory
    as float32, a partial last tile: 7 rows a tile for K = 1536; teams of 1, 2 and 4 warps;
    a last block with fewer columns than its teams compute); each of its rows equals the
    M = 1 GEMV's bit for bit. The launch is checked to be the tile kernel."""

    n, k = shape
    name = cuda_kernels.kernel_name("gemv_tile", dtype)
    m = 45
    assert gemv_tile_rows(m, k) > 0
    rng = np.random.default_rng(n + k)
    w = np.ascontiguousarray(weights(rng, n, k, dtype).T)
    x = rng.standard_normal((m, k)).astype(dtype)
    with stream:
        xd, w_nk = cp.asarray(x), cp.asarray(w)
    launched = []
    real = kernels._functions[name]
    kernels._functions[name] = lambda *a, **kw: launched.append(1) or real(*a, **kw)
    try:
        out = host(kernels.gemv_rows(xd, w_nk, stream=stream, w_layout="nk"), stream)
    finally:
        kernels._functions[name] = real
    assert launched == [1]
    for i in (0, 6, 7, 15, 16, 31, 44):  # both sides of every tile edge that occurs
        single = host(kernels.gemv_rows(xd[i:i + 1], w_nk, stream=stream, w_layout="nk"),
                      stream)[0]
        assert same_bits(out[i], single), f"row {i} of M={m} differs from M=1"
    assert_close(out, x.astype(np.float64) @ w.T.astype(np.float64), dtype)


@pytest.mark.claim("batch_invariance")
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("ns, k", [((960, 192, 192), 576), ((1536, 1536), 576),
                                   ((203, 576, 64), 1536)], ids=["qkv", "gate-up", "odd"])
def test_prefill_siblings_share_one_tile_launch_with_their_own_bits(cp, stream, kernels, ns,
                                                                     k, dtype):
    """A prefill's q/k/v (or gate/up) through ``gemv_many``: one ``gemv_tile3`` launch (each
    weight with its own team: 1, 2 and 4 warps occur), and each output equal bit for bit to
    the weight's own tiled launch and, row by row, to the M = 1 GEMV."""

    m = 45
    assert gemv_tile_rows(m, k) > 0
    rng = np.random.default_rng(sum(ns) + k)
    ws = [np.ascontiguousarray(weights(rng, n, k, dtype).T) for n in ns]
    x = rng.standard_normal((m, k)).astype(dtype)
    with stream:
        xd = cp.asarray(x)
        wds = [cp.asarray(w) for w in ws]
    name = cuda_kernels.kernel_name("gemv_tile3", dtype)
    launched = []
    real = kernels._functions[name]
    kernels._functions[name] = lambda *a, **kw: launched.append(1) or real(*a, **kw)
    try:
        outs = [host(o, stream) for o in kernels.gemv_many(xd, wds, stream=stream)]
    finally:
        kernels._functions[name] = real
    assert launched == [1]
    for out, wd in zip(outs, wds):
        alone = host(kernels.gemv_rows(xd, wd, stream=stream, w_layout="nk"), stream)
        assert same_bits(out, alone)
        for i in (0, 15, 16, 44):
            single = host(kernels.gemv_rows(xd[i:i + 1], wd, stream=stream, w_layout="nk"),
                          stream)[0]
            assert same_bits(out[i], single), f"row {i} of M={m} differs from M=1"


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16"])
@pytest.mark.parametrize("shape", GEMV_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
def test_gemv_rows_agrees_with_float64(cp, stream, kernels, shape, dtype):
    n, k = shape
    rng = np.random.default_rng(n + 13 * k)
    w = weights(rng, n, k, dtype)
    x = rng.standard_normal((8, k)).astype(dtype)
    with stream:
        out = kernels.gemv_rows(cp.asarray(x), cp.asarray(np.ascontiguousarray(w.T)),
                                stream=stream, w_layout="nk")
    got = host(out, stream)
    assert got.dtype == np.dtype(dtype) and got.shape == (8, n)
    assert_close(got, x.astype(np.float64) @ w.astype(np.float64), dtype)


@pytest.mark.gpu
def test_gemv_rows_checks_its_operands(cp, stream, kernels):
    with stream:
        x = cp.zeros((2, 8), cp.float32)
        w = cp.zeros((5, 7), cp.float32)
    with pytest.raises(ExecutionError):
        kernels.gemv_rows(x, w, stream=stream, w_layout="nk")  # K 8 vs 7
    with pytest.raises(ExecutionError):
        kernels.gemv_rows(x, cp.zeros((5, 8), cp.float16), stream=stream)
    with pytest.raises(ResidencyError):
        kernels.gemv_rows(np.zeros((2, 8), np.float32), cp.zeros((5, 8), cp.float32),
                          stream=stream)


# -- batched matmul ------------------------------------------------------------------------

@pytest.mark.claim("batch_invariance")
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int32"])
def test_batched_matmul_rows_and_trailing_zeros(cp, stream, kernels, dtype):
    rng = np.random.default_rng(5)
    heads, m_max, d, t = 4, 9, 16, 11
    q = (rng.standard_normal((1, heads, m_max, d)) * 3).astype(dtype)
    kt = (rng.standard_normal((1, heads, d, t)) * 3).astype(dtype)
    with stream:
        qd, ktd = cp.asarray(q), cp.asarray(kt)
    singles = [host(kernels.batched_matmul(qd[:, :, i:i + 1], ktd, stream=stream), stream)
               for i in range(m_max)]
    for m in M_RANGE:
        out = host(kernels.batched_matmul(qd[:, :, :m], ktd, stream=stream), stream)
        for i in range(m):
            assert same_bits(out[:, :, i:i + 1], singles[i]), f"row {i} of M={m}"
    # P @ V with zero probabilities on appended keys: the same bits
    p = (rng.random((1, heads, 3, t)) * 5).astype(dtype)
    v = rng.standard_normal((1, heads, t, d)).astype(dtype)
    p_pad = np.concatenate([p, np.zeros((1, heads, 3, 5), dtype)], axis=-1)
    v_pad = np.concatenate([v, rng.standard_normal((1, heads, 5, d)).astype(dtype)], axis=-2)
    with stream:
        short = kernels.batched_matmul(cp.asarray(p), cp.asarray(v), stream=stream)
        padded = kernels.batched_matmul(cp.asarray(p_pad), cp.asarray(v_pad), stream=stream)
    assert same_bits(host(short, stream), host(padded, stream))


@pytest.mark.claim("batch_invariance")
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int64"])
def test_batched_matmul_repeats_the_host_arithmetic(cp, stream, kernels, dtype):
    """Broadcast batch axes, a transposed view and a sliced view: no copies, same bits."""
    rng = np.random.default_rng(11)
    a = (rng.standard_normal((2, 1, 5, 7)) * 4).astype(dtype)
    b = (rng.standard_normal((1, 3, 7, 6)) * 4).astype(dtype)
    bt = np.ascontiguousarray(np.swapaxes(b, -1, -2))  # stored [.., N, K]
    big = (rng.standard_normal((2, 1, 9, 12)) * 4).astype(dtype)
    reference = NumpyArrayBackend()
    with stream:
        ad, btd, bigd = cp.asarray(a), cp.asarray(bt), cp.asarray(big)
        cases = [
            (kernels.batched_matmul(ad, cp.swapaxes(btd, -1, -2), stream=stream),
             reference.matmul(a, b)),
            (kernels.batched_matmul(bigd[:, :, 2:7, 3:10], cp.swapaxes(btd, -1, -2), stream=stream),
             reference.matmul(big[:, :, 2:7, 3:10], b)),
        ]
    for got, want in cases:
        assert same_bits(host(got, stream), want)


# -- sum -----------------------------------------------------------------------------------

@pytest.mark.claim("batch_invariance")
@pytest.mark.gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "float64", "int32", "int64"])
def test_sum_axis_repeats_the_host_arithmetic(cp, stream, backend, dtype):
    rng = np.random.default_rng(3)
    x = (rng.standard_normal((3, 4, 37, 5)) * 10).astype(dtype)
    reference = NumpyArrayBackend()
    with stream:
        xd = cp.asarray(x)
    for axis in range(-4, 4):
        for keepdims in (False, True):
            got = host(backend.sum(xd, axis, keepdims=keepdims), stream)
            assert same_bits(got, reference.sum(x, axis, keepdims=keepdims)), (axis, keepdims)
    strided = xd[:, ::2, 5:30]  # a non-contiguous view
    assert same_bits(host(backend.sum(strided, 2), stream), reference.sum(x[:, ::2, 5:30], 2))


@pytest.mark.claim("batch_invariance")
@pytest.mark.gpu
def test_sum_rows_and_trailing_zeros(cp, stream, kernels):
    rng = np.random.default_rng(8)
    x = rng.standard_normal((9, 300)).astype(np.float32)
    with stream:
        xd = cp.asarray(x)
        singles = [host(kernels.sum_axis(cp.ascontiguousarray(xd[i:i + 1]), 1, 2,
                                             stream=stream), stream) for i in range(9)]
        for m in M_RANGE:
            out = host(kernels.sum_axis(cp.ascontiguousarray(xd[:m]), 1, 2, stream=stream), stream)
            for i in range(m):
                assert same_bits(out[i:i + 1], singles[i])
        padded = cp.concatenate([xd, cp.zeros((9, 45), cp.float32)], axis=1)
        assert same_bits(host(kernels.sum_axis(padded, 1, 2, stream=stream), stream),
                         np.concatenate(singles))
    assert_close(np.concatenate(singles), x.astype(np.float64).sum(axis=1), np.float32)


# -- the backend ---------------------------------------------------------------------------

@pytest.mark.claim("batch_invariance")
@pytest.mark.gpu
@given(data=st.data())
def test_backend_matmul_matches_the_host_backend(cp, stream, backend, data):
    """ONNX MatMul shapes (1-D operands, batch broadcasting): a 1-D or 2-D ``b`` runs the
    GEMV (within tolerance of float64), a batched ``b`` the host's arithmetic exactly."""
    dtype = data.draw(st.sampled_from(["float32", "float16"]), label="dtype")
    k = data.draw(st.integers(1, 70), label="K")
    n = data.draw(st.integers(1, 40), label="N")
    m = data.draw(st.integers(1, 5), label="M")
    batch = data.draw(st.lists(st.integers(1, 3), max_size=2), label="batch of a")
    a_vector = data.draw(st.booleans(), label="a is 1-D")
    b_rank = data.draw(st.sampled_from([1, 2, 3]), label="rank of b")
    rng = np.random.default_rng(data.draw(st.integers(0, 2**16), label="seed"))
    a_shape = (k,) if a_vector else tuple(batch) + (m, k)
    b_batch = (batch[-1] if batch and not a_vector else data.draw(st.integers(1, 3)),)
    b_shape = {1: (k,), 2: (k, n), 3: b_batch + (k, n)}[b_rank]
    a = rng.standard_normal(a_shape).astype(dtype)
    b = (rng.standard_normal(b_shape) / np.sqrt(k)).astype(dtype)
    want = NumpyArrayBackend().matmul(a, b)
    with stream:
        got = host(backend.matmul(cp.asarray(a), cp.asarray(b)), stream)
    assert got.shape == want.shape and got.dtype == want.dtype
    if b_rank < 3:
        assert_close(got, np.matmul(a.astype(np.float64), b.astype(np.float64)), dtype)
    else:
        assert same_bits(got, want)


@pytest.mark.gpu
def test_backend_adopts_once_and_uses_the_cached_transpose(cp, stream):
    from engines.native.cupy_array_backend import CupyArrayBackend

    ledger = Ledger()
    backend = CupyArrayBackend(stream, ledger, device_id=0)
    rng = np.random.default_rng(2)
    w = weights(rng, 48, 96, np.float32)
    embed = rng.standard_normal((50, 96)).astype(np.float32)
    with backend.weight_loading({w.shape}):
        wd = backend.adopt(w)
        backend.adopt(embed)  # not a MatMul weight's shape: no transpose
    assert ledger.h2d_bytes == w.nbytes + embed.nbytes and ledger.h2d_count == 2
    assert backend.transposed_weights == 1
    assert backend.adopt(wd) is wd and ledger.h2d_count == 2  # already on the device
    x = rng.standard_normal((5, 96)).astype(np.float32)
    with stream:
        xd = cp.asarray(x)
        plain = cp.asarray(w)  # the same values, not adopted: used in its [K, N] layout
        via_cache = host(backend.matmul(xd, wd), stream)
        via_plain = host(backend.matmul(xd, plain), stream)
        via_view = host(backend.matmul(xd, cp.ascontiguousarray(plain.T).T), stream)
    assert same_bits(via_cache, via_plain) and same_bits(via_cache, via_view)
    after = backend.adopt(w)  # outside weight_loading: no transpose cached
    assert backend.transposed_weights == 1 and after is not wd


@pytest.mark.gpu
def test_backend_refuses_host_operands(cp, stream, backend):
    with stream:
        w = cp.zeros((4, 3), cp.float32)
    with pytest.raises(ResidencyError) as info:
        backend.matmul(np.zeros((2, 4), np.float32), w)
    assert info.value.field == "a" and "adopt" in info.value.remedy
    with pytest.raises(ResidencyError):
        backend.sum(np.zeros(3, np.float32), 0)
    with pytest.raises(ExecutionError):
        backend.matmul(cp.zeros((2, 5), cp.float32), w)  # inner extents differ


# -- ONNX node conformance on the device ---------------------------------------------------

CUPY_DTYPES = {np.dtype(t) for t in (np.bool_, np.int8, np.int16, np.int32, np.int64, np.uint8,
                                     np.uint16, np.uint32, np.uint64, np.float16, np.float32,
                                     np.float64)}


def _conformance_cases():
    """The host conformance suite's selection (``suites/test_op_conformance.py``), less its
    known gaps, the cases holding values CuPy cannot (strings, sequences, float8, bfloat16)
    and those whose output shape is read from device values (NonZero over a graph input: a
    device plan refuses it by design, ``suites/test_value_dependent_shapes.py``)."""
    from engines.native.ops import kernel_for
    from suites import test_op_conformance as host_suite

    def plain(values):
        # some cases (Cast's) keep their tensors as TensorProto: read them as the host does
        # numpy's own dtypes only: ml_dtypes' float8 types report kind "f" too
        return all(isinstance(v, (np.ndarray, np.generic)) and v.dtype in CUPY_DTYPES
                   for v in map(host_suite._host, values))

    return [case for case in host_suite.SELECTED
            if case.name not in host_suite.KNOWN_GAPS
            and not any(kernel_for(n).value_dependent_shape for n in case.model.graph.node)
            and all(plain(inputs) and plain(outputs) for inputs, outputs in case.data_sets)]


def _host_value(value):
    from suites.test_op_conformance import _host

    return _host(value)


def _run_case(case, backend, stream) -> None:
    """Plan on the CuPy backend; outputs compared as the host suite compares them."""
    from engines.native.plan import Plan, required_host_inputs
    from suites.test_op_conformance import assert_matches

    host_inputs = required_host_inputs(case.model)
    plan = Plan(case.model, backend, host_inputs=host_inputs)
    for index, (inputs, outputs) in enumerate(case.data_sets):
        inputs, outputs = ([_host_value(v) for v in inputs], [_host_value(v) for v in outputs])
        feeds = {name: (np.asarray(value) if name in host_inputs else backend.adopt(value))
                 for name, value in zip(plan.input_names, inputs)}
        result = plan.run(feeds)
        assert len(plan.output_names) == len(outputs)
        for name, want in zip(plan.output_names, outputs):
            assert_matches(host(result[name], stream), want, case.rtol, case.atol,
                           f"{case.name}[{index}] output {name}")


@pytest.mark.gpu
def test_onnx_node_cases_pass_on_the_device(cp, stream, backend):
    """Every case the host suite selects (and CuPy can hold) passes on the device too, and
    every op the fixtures use is among those run."""
    from suites.test_op_conformance import FIXTURE_OPS, main_op

    cases = _conformance_cases()
    failures = []
    for case in cases:
        try:
            _run_case(case, backend, stream)
        except Exception as exc:  # noqa: BLE001 - report every case, not the first
            failures.append(f"{case.name}: {type(exc).__name__}: {str(exc)[:300]}")
    missing = sorted(FIXTURE_OPS - {main_op(case) for case in cases})
    assert not missing, f"no device case for fixture ops {missing}"
    assert not failures, (f"{len(failures)} of {len(cases)} cases fail on the device:\n"
                          + "\n".join(failures))
