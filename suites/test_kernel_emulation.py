"""native-cuda's kernels without a GPU: the very ``.cu`` source and launchers on the CPU
emulator (``engines/native/emulation``), so CI checks what the GPU suites check of them.

Claims held here, bit for bit on the emulator: a GEMV with a norm prologue is the norm then
the GEMV; ``norm_glu`` is ``norm_gemv`` over gate and up then SwiGLU; the rotation, cache
write and attention in one launch are the two launches; row i of an M-row launch is the
one-row launch (batch invariance); the result does not depend on the order threads and
blocks run in. Against a float64 numpy reference, the tolerance table's bound for the dtype.
Weight runs loaded into registers before the wait give the bits of runs loaded after it.
Planted: a barrier removed, a row-dependent accumulation, a barrier in a branch, a
preloaded run paired with the wrong activations, each caught; the shim's float16 and
bfloat16 conversions are numpy's and ml_dtypes'.
"""
from __future__ import annotations

import dataclasses

import ml_dtypes
import numpy as np
import pytest

from engines.cuda_module import CudaModule
from engines.errors import ExecutionError
from engines.native.cuda_kernels import CudaKernels
from engines.native.emulation.cpu_module import CpuModule
from engines.native.emulation.host_device import emulated, to_device, to_host
from engines.native.fused_kernels import FusedKernels
from engines.native.launch.attention import AttentionKernels
from engines.native.launch.gemv import GemvKernels
from engines.native.launch.prologue_gemv import WIDE_ENV, PrologueGemvKernels
from engines.native.program_module import program_family
from engines.tolerances import TABLE
from suites.decode_chain import np_dtype, rand
from suites.support import kernel_folder

DTYPES = ("float32", "float16", "bfloat16")
K = 64  # a row: four 16-byte runs of float32, two of float16
EPS = 1e-5


@pytest.fixture(scope="module")
def fused():
    return emulated(FusedKernels)


@pytest.fixture(scope="module")
def fused_descending():
    return emulated(FusedKernels, descending=True)


@pytest.fixture(scope="module")
def dense():
    return emulated(CudaKernels)


def _rand(rng, shape, dtype, scale=1.0):
    return rand(rng, shape, dtype, to_device, scale)


def _norm_case(dtype: str, rows: int, seed: int = 0, widths=(96, 32, 32)):
    rng = np.random.default_rng(seed)
    residual = _rand(rng, (1, rows, K), dtype)
    delta = _rand(rng, (1, rows, K), dtype)
    gain = to_device((1 + 0.1 * rng.standard_normal(K)).astype(np_dtype(dtype)))
    weights = [_rand(rng, (n, K), dtype, 0.1) for n in widths]
    return residual, delta, gain, weights


def _same(a, b) -> bool:
    a, b = to_host(a), to_host(b)
    return a.shape == b.shape and a.tobytes() == b.tobytes()


def _rows(value, rows: int) -> np.ndarray:
    return to_host(value).reshape(rows, -1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("add", [True, False], ids=["add", "plain"])
def test_norm_gemv_is_the_norm_then_the_gemv(fused, dense, dtype, add):
    residual, delta, gain, weights = _norm_case(dtype, 5)
    out = np.dtype(np_dtype(dtype))
    got = fused.norm_gemv(residual, delta if add else None, gain, EPS, out, weights,
                          stream=None)
    if add:
        total, normed = fused.add_rms_norm(residual, delta, gain, EPS, out, stream=None)
        two = (total,)
    else:
        normed = fused.rms_norm(residual, gain, EPS, out, stream=None)
        two = ()
    two += tuple(dense.gemv_many(normed.reshape(5, K), weights, stream=None))
    assert len(got) == len(two)
    assert all(_same(a.reshape(-1), b.reshape(-1)) for a, b in zip(got, two))
    # and the arithmetic is a norm and a product, within the table's bound for the dtype
    x = to_host(residual).astype(np.float64).reshape(5, K)
    if add:
        x = x + to_host(delta).astype(np.float64).reshape(5, K)
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + EPS) * to_host(gain).astype(np.float64)
    tol = TABLE[dtype]
    for w, product in zip(weights, got[1 if add else 0:]):
        ref = y @ to_host(w).astype(np.float64).T
        np.testing.assert_allclose(_rows(product, 5).astype(np.float64), ref,
                                   atol=tol.max_abs * 10, rtol=tol.max_rel * 10)


@pytest.mark.parametrize("dtype", DTYPES)
def test_norm_glu_is_norm_gemv_then_swiglu(fused, dtype):
    residual, delta, gain, weights = _norm_case(dtype, 3, seed=1, widths=(48, 48))
    out = np.dtype(np_dtype(dtype))
    compute = out  # a uniform graph's SwiGLU computes in its dtype
    got = fused.norm_glu(residual, delta, gain, EPS, out, weights, compute, out, stream=None)
    assert got is not None
    total, gate, up = fused.norm_gemv(residual, delta, gain, EPS, out, weights, stream=None)
    glu = fused.swiglu(gate, up, compute, out, stream=None)
    assert _same(got[0], total) and _same(got[1].reshape(-1), glu.reshape(-1))


def _launchers(fused, dense):
    """name -> (launch over rows, the rows' count): each launcher a forward uses for decode
    and verification rows, and a GEMV over prefill-sized rows (its tile path)."""
    def norm_gemv(case):
        residual, delta, gain, weights = case
        return fused.norm_gemv(residual, delta, gain, EPS, residual.dtype, weights,
                               stream=None)

    def norm_glu(case):
        residual, delta, gain, weights = case
        return fused.norm_glu(residual, delta, gain, EPS, residual.dtype, weights[:2],
                              residual.dtype, residual.dtype, stream=None)

    def gemv(case):
        residual, _, _, weights = case
        return (dense.gemv_rows(residual.reshape(-1, K), weights[0], stream=None),)

    return {"norm_gemv": (norm_gemv, (96, 32, 32)), "norm_glu": (norm_glu, (48, 48)),
            "gemv": (gemv, (96,))}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("which,rows", [("norm_gemv", 5), ("norm_glu", 8), ("gemv", 3),
                                        ("gemv", 20)])
def test_row_i_is_the_one_row_launch(fused, dense, dtype, which, rows):
    launch, widths = _launchers(fused, dense)[which]
    residual, delta, gain, weights = _norm_case(dtype, rows, seed=2, widths=widths)
    many = launch((residual, delta, gain, weights))
    for i in range(rows):
        one = launch((to_device(to_host(residual)[:, i:i + 1]),
                      to_device(to_host(delta)[:, i:i + 1]), gain, weights))
        for a, b in zip(many, one):
            assert _rows(a, rows)[i].tobytes() == to_host(b).tobytes(), (which, i)


def _attention_case(dtype: str, rows: int, start: int, seed: int = 3, slots: int = 32,
                    positions=None):
    """SmolLM2's heads scaled down: 6 query heads over 2 KV heads of 64 channels, a static
    cache of ``slots`` slots whose first ``start`` hold earlier positions; the rows at
    ``start``, ``start + 1``, ... unless ``positions`` names them."""
    rng = np.random.default_rng(seed)
    hq, hk, d = 6, 2, 64
    xq = _rand(rng, (1, hq, rows, d), dtype)
    xk = _rand(rng, (1, hk, rows, d), dtype)
    new_v = _rand(rng, (1, hk, rows, d), dtype)
    angles = np.arange(start, start + rows)[:, None] * (1e-2 * np.arange(d)[None] + 0.1)
    cos = to_device(np.cos(angles).astype(np.float32)[None, None])
    sin = to_device(np.sin(angles).astype(np.float32)[None, None])
    old_k = _rand(rng, (1, hk, slots, d), dtype)
    old_v = _rand(rng, (1, hk, slots, d), dtype)
    at = np.arange(start, start + rows) if positions is None else np.asarray(positions)
    positions = to_device(at.astype(np.int64)[None])
    return xq, xk, cos, sin, old_k, old_v, new_v, positions


def _rotary_kv_attention(fused, case, dtype):
    xq, xk, cos, sin, old_k, old_v, new_v, positions = case
    return fused.rotary_kv_attention(xq, xk, cos, sin, "halves", np.dtype(np.float32), None,
                                     None, np_dtype(dtype), old_k, old_v, new_v, positions, 2, 3,
                                     0.125, np.dtype(np.float32), stream=None)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("rows,start,slots,positions", [
    (4, 9, 32, None),
    # keys past one batch of value runs a thread (8 x 32 groups of float16, 16 of float32)
    # and past one key a thread for the scores: 300 slots read, the last rows written
    (2, 298, 320, None),
    # positions that are not a run: the row that wrote a slot is searched for (the last of
    # two rows at one position wins, a row past the cache writes nothing)
    (4, 0, 64, [40, 7, 40, 70]),
], ids=["short", "long", "scattered"])
def test_rotary_kv_attention_is_the_two_launches(fused, dtype, rows, start, slots, positions):
    case = _attention_case(dtype, rows, start, slots=slots, positions=positions)
    xq, xk, cos, sin, old_k, old_v, new_v, positions = case
    got = _rotary_kv_attention(fused, case, dtype)
    assert got is not None
    q, cache_k, cache_v = fused.rotary_kv(xq, xk, cos, sin, "halves", np.dtype(np.float32),
                                          None, None, np_dtype(dtype), old_k, old_v, new_v,
                                          positions, stream=None)
    att = fused.attention(q, cache_k, cache_v, positions, 2, 3, 0.125, np.dtype(np.float32),
                          stream=None)
    assert _same(got[0], cache_k) and _same(got[1], cache_v)
    assert _same(got[2].reshape(-1), att.reshape(-1))


@pytest.fixture(scope="module")
def fused_program_block():
    return emulated(program_family(FusedKernels))


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("block", [256, 128])
def test_a_verification_row_is_the_decode_at_its_position(fused, fused_program_block, dtype,
                                                          block):
    # at both block sizes of attention (128: the one a launch program runs)
    fused = fused if block == 256 else fused_program_block
    assert fused.BLOCK == block
    rows, start = 5, 11
    case = _attention_case(dtype, rows, start, seed=4)
    xq, xk, cos, sin, old_k, old_v, new_v, positions = case
    cache_k, cache_v, many = _rotary_kv_attention(fused, case, dtype)
    for m in range(rows):
        one = _rotary_kv_attention(fused, tuple(to_device(to_host(a)[:, :, m:m + 1])
                                                for a in (xq, xk, cos, sin))
                                   + (cache_k, cache_v,
                                      to_device(to_host(new_v)[:, :, m:m + 1]),
                                      to_device(to_host(positions)[:, m:m + 1])), dtype)
        assert _rows(many, rows)[m].tobytes() == to_host(one[2]).tobytes(), m


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_rotary_kv_is_the_rotation_then_the_cache_write(fused, dtype):
    xq, xk, cos, sin, old_k, old_v, new_v, positions = _attention_case(dtype, 3, 6, seed=10)
    f32 = np.dtype(np.float32)
    q, cache_k, cache_v = fused.rotary_kv(xq, xk, cos, sin, "halves", f32, None, None,
                                          np_dtype(dtype), old_k, old_v, new_v, positions,
                                          stream=None)
    rq, rk = fused.rotary2(xq, xk, cos, sin, "halves", f32, None, None, np_dtype(dtype),
                           stream=None)
    two_k, two_v = fused.kv_write2(old_k, rk, old_v, new_v, positions, stream=None)
    assert _same(q, rq) and _same(cache_k, two_k) and _same(cache_v, two_v)


@pytest.mark.parametrize("dtype", DTYPES)
def test_swiglu_gemv_is_swiglu_then_the_gemv(fused, dense, dtype):
    rng = np.random.default_rng(11)
    gate, up = _rand(rng, (1, 4, 96), dtype), _rand(rng, (1, 4, 96), dtype)
    weight = _rand(rng, (K, 96), dtype, 0.1)
    out = np_dtype(dtype)
    got = fused.swiglu_gemv(gate, up, out, out, weight, stream=None)
    assert got is not None
    glu = fused.swiglu(gate, up, out, out, stream=None)
    two = dense.gemv_rows(glu.reshape(4, 96), weight, stream=None)
    assert _same(got.reshape(-1), two.reshape(-1))


@pytest.mark.parametrize("dtype", DTYPES)
def test_a_prefill_rows_attention_is_the_decode_at_each_position(fused, dtype):
    # 12 rows (more than a decode's or verification's 8): attention_rows, a key load shared
    # by up to 8 rows; each row against the one-row attention at its position
    rng = np.random.default_rng(9)
    heads, kv_heads, d, slots, rows = 6, 2, 64, 24, 12
    q = _rand(rng, (1, heads, rows, d), dtype)
    k = _rand(rng, (1, kv_heads, slots, d), dtype)
    v = _rand(rng, (1, kv_heads, slots, d), dtype)
    positions = np.arange(3, 3 + rows, dtype=np.int64)[None]
    score = np.dtype(np.float32)
    many = _rows(fused.attention(q, k, v, to_device(positions), kv_heads, 3, 0.125, score,
                                 stream=None), rows)
    for m in range(rows):
        one = fused.attention(to_device(to_host(q)[:, :, m:m + 1]), k, v,
                              to_device(positions[:, m:m + 1]), kv_heads, 3, 0.125, score,
                              stream=None)
        assert many[m].tobytes() == to_host(one).tobytes(), m


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_no_result_depends_on_the_order_threads_run_in(fused, fused_descending, dtype):
    residual, delta, gain, weights = _norm_case(dtype, 6, seed=5)
    out = residual.dtype
    for kernels in (fused, fused_descending):
        got = kernels.norm_gemv(residual, delta, gain, EPS, out, weights, stream=None)
        glu = kernels.norm_glu(residual, delta, gain, EPS, out, weights[1:], out, out,
                               stream=None)
        att = _rotary_kv_attention(kernels, _attention_case(dtype, 3, 7), dtype)
        if kernels is fused:
            first = [to_host(v).tobytes() for v in (*got, *glu, *att)]
    assert [to_host(v).tobytes() for v in (*got, *glu, *att)] == first


# -- planted ---------------------------------------------------------------------------------

def _planted(tmp_path, family, file: str, old: str, new: str):
    """``family`` whose ``file`` has ``old`` replaced by ``new``."""
    module = dataclasses.replace(family.MODULE,
                                 folder=kernel_folder(tmp_path, (file, old, new)))
    return type(f"Planted{family.__name__}", (family,), {"MODULE": module})


def test_a_missing_barrier_is_caught(tmp_path):
    # norm_gemv's GEMV reads the rows its prologue staged without waiting for every warp
    planted = _planted(tmp_path, PrologueGemvKernels, "prologue_gemv.cu",
                       "lk_norm_prologue<TI, TD, TO>(res, delta, gain, sum_out, xs, M, K, eps);\n"
                       "    __syncthreads();",
                       "lk_norm_prologue<TI, TD, TO>(res, delta, gain, sum_out, xs, M, K, eps);")
    residual, delta, gain, weights = _norm_case("float16", 6, seed=6)
    honest = emulated(PrologueGemvKernels).norm_gemv(residual, delta, gain, EPS,
                                                     residual.dtype, weights, stream=None)
    differs = []
    for descending in (False, True):
        got = emulated(planted, descending=descending).norm_gemv(
            residual, delta, gain, EPS, residual.dtype, weights, stream=None)
        differs.append(not all(_same(a, b) for a, b in zip(got, honest)))
    assert any(differs)


def test_a_row_dependent_accumulation_is_caught(tmp_path):
    # rows after the first add their products unfused: row 0 is the one-row launch, no other
    planted = _planted(tmp_path, GemvKernels, "gemv_vec.cuh",
                       "for (int v = 0; v < V; ++v) acc[i] = __fmaf_rn(xf[v], wf[v], acc[i]);",
                       "for (int v = 0; v < V; ++v) acc[i] = i ? acc[i] + xf[v] * wf[v] "
                       ": __fmaf_rn(xf[v], wf[v], acc[i]);")
    kernels = emulated(planted)
    residual, _, _, weights = _norm_case("float32", 4, seed=7)
    many = _rows(kernels.gemv_rows(residual.reshape(-1, K), weights[0], stream=None), 4)
    ones = [to_host(kernels.gemv_rows(to_device(to_host(residual)[:, i:i + 1]).reshape(-1, K),
                                      weights[0], stream=None)).reshape(-1)
            for i in range(4)]
    assert many[0].tobytes() == ones[0].tobytes()
    assert any(many[i].tobytes() != ones[i].tobytes() for i in range(1, 4))


def _one_row_and_many(family, dtype: str, rows: int = 5):
    """Each row of x [rows, K] through ``family``'s ``gemv_rows`` alone, and all of them in
    one launch; with the kernels each runs (recorded in a second pass: a recording family
    records its launches instead of running them)."""
    rng = np.random.default_rng(11)
    x, w = _rand(rng, (rows, K), dtype), _rand(rng, (40, K), dtype, 0.1)
    launches: list = []

    def run(kernels):
        many = _rows(kernels.gemv_rows(x, w, stream=None), rows)
        return many, [to_host(kernels.gemv_rows(to_device(to_host(x)[i:i + 1]), w,
                                                stream=None)) for i in range(rows)]

    many, ones = run(emulated(family))
    run(emulated(family, record=launches))
    return many, ones, [launch.name.split("<")[0] for launch in launches]


@pytest.mark.parametrize("dtype", DTYPES)
def test_one_row_runs_gemv_vec1_with_a_row_of_many_s_bits(dtype):
    # a decode step's GEMV takes the one-row instance (fewer registers), the same arithmetic
    many, ones, kernels = _one_row_and_many(GemvKernels, dtype)
    assert kernels == ["gemv_vec"] + ["gemv_vec1"] * 5
    assert all(many[i].tobytes() == ones[i].reshape(-1).tobytes() for i in range(5))


def test_a_one_row_gemv_with_another_team_is_caught(tmp_path):
    # gemv_vec1 runs its columns with two warps a column where gemv_vec runs one
    planted = _planted(tmp_path, GemvKernels, "gemv.cu",
                       "x, w, out, M, K, N, w_nstep, w_kstep, vec, team, blockIdx.x, part, &pre",
                       "x, w, out, M, K, N, w_nstep, w_kstep, vec, 2 * team, blockIdx.x, part, "
                       "&pre")
    many, ones, _ = _one_row_and_many(planted, "float16")
    assert any(many[i].tobytes() != ones[i].reshape(-1).tobytes() for i in range(5))


_PRELOAD_DEFINES = "#define LK_GEMV_PRELOAD 4\n#define LK_PROLOGUE_PRELOAD 4\n"


def _preloading(tmp_path, family, runs: int):
    """``family`` whose threads load ``runs`` weight runs into registers before the wait."""
    return _planted(tmp_path / f"p{runs}", family, "gemv_vec.cuh", _PRELOAD_DEFINES,
                    _PRELOAD_DEFINES.replace(" 4\n", f" {runs}\n"))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("runs", [1, 4])
def test_weight_runs_loaded_before_the_wait_keep_every_bit(tmp_path, fused, dense, dtype, runs):
    # at K = 1536 a thread holds several runs: the first preloaded, the rest loaded in the
    # loop (1; 4 at float32's six runs a thread), or fewer than the registers hold (4 at
    # float16's three): each product in its place
    wide = 1536
    rng = np.random.default_rng(17)
    residual, delta = (_rand(rng, (1, 5, wide), dtype) for _ in range(2))
    gain = to_device((1 + 0.1 * rng.standard_normal(wide)).astype(np_dtype(dtype)))
    weights = [_rand(rng, (n, wide), dtype, 0.05) for n in (48, 16, 16)]
    out = np.dtype(np_dtype(dtype))
    prologue = emulated(_preloading(tmp_path, PrologueGemvKernels, runs))
    total, normed = fused.add_rms_norm(residual, delta, gain, EPS, out, stream=None)
    plain = dense.gemv_many(normed.reshape(5, wide), weights, stream=None)  # nothing preloaded
    got = prologue.norm_gemv(residual, delta, gain, EPS, out, weights, stream=None)
    assert all(_same(a.reshape(-1), b.reshape(-1)) for a, b in zip(got, (total, *plain)))
    pair = [_rand(rng, (512, wide), dtype, 0.05) for _ in range(2)]  # teams of two warps
    glu = prologue.norm_glu(residual, delta, gain, EPS, out, pair, out, out, stream=None)
    gate, up = dense.gemv_many(normed.reshape(5, wide), pair, stream=None)
    assert _same(glu[1].reshape(-1), fused.swiglu(gate, up, out, out, stream=None).reshape(-1))
    one_row = emulated(_preloading(tmp_path, GemvKernels, runs))
    x = normed.reshape(5, wide)
    many = _rows(dense.gemv_rows(x, weights[0], stream=None), 5)  # gemv_vec: none preloaded
    for i in (0, 4):
        row = one_row.gemv_rows(to_device(to_host(x)[i:i + 1]), weights[0], stream=None)
        assert to_host(row).reshape(-1).tobytes() == many[i].tobytes()


def test_a_preloaded_run_paired_with_another_runs_activations_is_caught(tmp_path, dense):
    # the planted bug: the preloaded runs taken in reverse against the activations' runs
    planted = _planted(tmp_path, GemvKernels, "gemv_vec.cuh",
                       "const long long c = tt + (long long)p * team_threads;",
                       "const long long c = tt + (long long)(P - 1 - p) * team_threads;")
    rng = np.random.default_rng(18)
    x = _rand(rng, (1, 1536), "float32")
    w = _rand(rng, (48, 1536), "float32", 0.05)
    honest = to_host(dense.gemv_rows(x, w, stream=None))
    got = to_host(emulated(planted).gemv_rows(x, w, stream=None))
    assert got.tobytes() != honest.tobytes()


_RKA_DEFINES = "#define LK_RKA_PRELOAD_KEYS 0\n#define LK_RKA_PRELOAD_VALUES 0\n"


def _attention_preloading(tmp_path, keys: int, values: int, *plants: tuple[str, str]):
    """``AttentionKernels`` whose attention blocks load the old caches' key runs (``keys``)
    and value runs (``values``) into registers before the wait, with ``plants`` (old, new)
    of attention.cu replaced too."""
    folder = kernel_folder(tmp_path / f"rka{keys}{values}{len(plants)}",
                           ("attention.cu", _RKA_DEFINES,
                            f"#define LK_RKA_PRELOAD_KEYS {keys}\n"
                            f"#define LK_RKA_PRELOAD_VALUES {values}\n"))
    source = folder / "attention.cu"
    for old, new in plants:
        text = source.read_text()
        assert text.count(old) == 1, old
        source.write_text(text.replace(old, new))
    module = dataclasses.replace(AttentionKernels.MODULE, folder=folder)
    return emulated(type("PreloadingAttention", (AttentionKernels,), {"MODULE": module}))


def _attention_bytes(kernels, dtype: str) -> list[bytes]:
    """The caches and output of rotary_kv_attention over a short case (two rows at 9) and a
    long one (keys past a key a thread and past a batch of value runs: 300 slots read)."""
    cases = (_attention_case(dtype, 2, 9), _attention_case(dtype, 2, 298, slots=320))
    return [to_host(v).tobytes() for case in cases
            for v in _rotary_kv_attention(kernels, case, dtype)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_cache_runs_loaded_before_the_wait_keep_every_bit(tmp_path, fused, dtype):
    # the tree loads none (fused: every test above holds it to the two launches); keys
    # alone, values alone and both give the same bytes
    expected = _attention_bytes(fused, dtype)
    for keys, values in ((1, 0), (0, 1), (1, 1)):
        assert _attention_bytes(_attention_preloading(tmp_path, keys, values), dtype) \
            == expected, (keys, values)


def test_a_preloaded_cache_run_of_another_slot_is_caught(tmp_path, fused):
    # the planted bugs: a thread's preloaded key row is its neighbour's slot; its preloaded
    # value runs are the next key's
    expected = _attention_bytes(fused, "float16")
    wrong_key = ("const TO* kr = old_k + head + (long long)tid * D;",
                 "const TO* kr = old_k + head + (long long)(tid ^ 1) * D;")
    wrong_value = ("const long long j = g + b * (long long)groups;\n            if (j < C)",
                   "const long long j = g + 1 + b * (long long)groups;\n            if (j < C)")
    for keys, values, plant in ((1, 0, wrong_key), (0, 1, wrong_value)):
        got = _attention_bytes(_attention_preloading(tmp_path, keys, values, plant), "float16")
        assert got != expected, plant


def _norm_prologues(kernels, dtype: str, rows: int = 5) -> list[bytes]:
    """``norm_gemv`` over (96, 32, 32) and ``norm_glu`` over (48, 48) of ``rows`` rows (five: a
    verification), every output's bytes."""
    residual, delta, gain, weights = _norm_case(dtype, rows, seed=9)
    glu_weights = _norm_case(dtype, rows, seed=9, widths=(48, 48))[3]
    out = residual.dtype
    gemv = kernels.norm_gemv(residual, delta, gain, EPS, out, weights, stream=None)
    glu = kernels.norm_glu(residual, delta, gain, EPS, out, glu_weights, out, out, stream=None)
    return [to_host(v).tobytes() for v in (*gemv, *glu)]


@pytest.mark.parametrize("dtype", DTYPES)
def test_wide_verify_blocks_give_the_narrow_blocks_bits(monkeypatch, dtype):
    # LOCKSTEP_WIDE_VERIFY: a verification's norm prologues in blocks of eight warps
    monkeypatch.setenv(WIDE_ENV, "off")
    narrow = _norm_prologues(emulated(PrologueGemvKernels), dtype)
    monkeypatch.setenv(WIDE_ENV, "on")
    launches: list = []
    _norm_prologues(emulated(PrologueGemvKernels, record=launches), dtype)
    _norm_prologues(emulated(PrologueGemvKernels, record=launches), dtype, rows=1)
    assert [(launch.name.split("<")[0], launch.block) for launch in launches] == [
        ("norm_gemv", (256,)), ("norm_glu", (256,)), ("norm_gemv", (128,)),
        ("norm_glu", (128,))]
    assert [launch.name.endswith(", 8>") for launch in launches] == [True, True, False, False]
    assert _norm_prologues(emulated(PrologueGemvKernels), dtype) == narrow


def test_a_verification_takes_the_wide_blocks_unless_switched_off(monkeypatch):
    # on by default (the H200's VERIFY replay 8% shorter); LOCKSTEP_WIDE_VERIFY=off gives
    # the narrow blocks back
    def blocks() -> list:
        launches: list = []
        _norm_prologues(emulated(PrologueGemvKernels, record=launches), "float16")
        return [launch.block for launch in launches]

    monkeypatch.delenv(WIDE_ENV, raising=False)
    assert blocks() == [(256,), (256,)]
    monkeypatch.setenv(WIDE_ENV, "off")
    assert blocks() == [(128,), (128,)]


def test_a_wide_block_that_maps_its_columns_as_a_narrow_one_is_caught(tmp_path, monkeypatch):
    planted = _planted(tmp_path, PrologueGemvKernels, "gemv_vec.cuh",
                       "const long long n = blk * (WARPS / team) + warp / team;\n"
                       "    const bool valid",
                       "const long long n = blk * (LK_GEMV_WARPS / team) + warp / team;\n"
                       "    const bool valid")
    monkeypatch.setenv(WIDE_ENV, "off")
    narrow = _norm_prologues(emulated(planted), "float16")
    assert narrow == _norm_prologues(emulated(PrologueGemvKernels), "float16")
    monkeypatch.setenv(WIDE_ENV, "on")
    assert _norm_prologues(emulated(planted), "float16") != narrow


def _probes(tmp_path, *instances) -> dict:
    """``suites/kernels/emulator_probes.cu``'s ``instances`` on the emulator."""
    folder = kernel_folder(tmp_path, extra=["emulator_probes.cu"])
    return CpuModule(CudaModule(folder, "emulator_probes.cu", instances)).functions()


def test_a_barrier_in_a_branch_is_an_error_not_a_hang(tmp_path):
    # half a warp waits at the block's barrier, the other half at a shuffle: a GPU hangs
    kernel = _probes(tmp_path, "diverge")["diverge"]
    with pytest.raises(ExecutionError, match="different barriers"):
        kernel((1,), (64,), (to_device(np.zeros(64, np.float32)),))


def test_the_shims_conversions_are_numpys(tmp_path):
    kernels = _probes(tmp_path, "convert<lk_half>", "convert<lk_bf16>")
    rng = np.random.default_rng(8)
    every = np.arange(1 << 16, dtype=np.uint16)
    with np.errstate(invalid="ignore", over="ignore"):
        x = np.concatenate([rng.standard_normal(20000) * s
                            for s in (1e-8, 1e-5, 1.0, 1e4, 1e6)]
                           + [every.view(np.float16).astype(np.float32)]).astype(np.float32)
    x = np.concatenate([x, np.nextafter(x, np.float32(np.inf)),
                        np.nextafter(x, np.float32(-np.inf))])  # ties' neighbours
    n = 1 << 16
    for name, dtype in (("convert<lk_half>", np.float16),
                        ("convert<lk_bf16>", ml_dtypes.bfloat16)):
        narrow = to_device(np.zeros(x.size, np.uint16))
        back = to_device(np.zeros(x.size, np.float32))
        widened = to_device(np.zeros(x.size, np.float32))
        bits = to_device(np.resize(every, x.size))
        kernels[name]((-(-x.size // 256),), (256,),
                      (to_device(x), narrow, back, bits, widened, np.int64(x.size)))
        finite = ~np.isnan(x)
        with np.errstate(over="ignore"):
            expected = x.astype(dtype).view(np.uint16)
        assert np.array_equal(to_host(narrow)[finite], expected[finite]), name
        assert np.array_equal(to_host(back)[finite].view(np.uint32),
                              expected[finite].view(dtype).astype(np.float32).view(np.uint32))
        want = every.view(dtype).astype(np.float32)
        got = to_host(widened)[:n]
        numbers = ~np.isnan(want)
        assert np.array_equal(got[numbers].view(np.uint32), want[numbers].view(np.uint32))
        assert np.isnan(got[~numbers]).all()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", ["int64", "int32"])
def test_gather_is_onnx_gather_in_one_launch(fused, dtype, index_dtype):
    """``gather_wrap`` against numpy's take with ONNX's rule (an index below zero counts from
    the end), bit for bit: an embedding row by token ids, rotary rows by positions, a middle
    axis, a 0-d index; an index outside [-extent, extent) wraps instead of reading past the
    table."""
    rng = np.random.default_rng(12)
    table = _rand(rng, (2, 7, 5), dtype)
    host = to_host(table)
    cases = [(0, np.array([[1, 0, -1]])), (1, np.array([[6, -7, 3], [0, 2, -2]])),
             (2, np.array(4)), (2, np.array([-5, 1]))]
    for axis, idx in cases:
        idx = idx.astype(index_dtype)
        got = fused.gather(table, to_device(idx), axis, stream=None)
        want = np.take(host, np.where(idx < 0, idx + host.shape[axis], idx), axis=axis)
        assert to_host(got).shape == want.shape and to_host(got).tobytes() == want.tobytes()
    wrapped = fused.gather(table, to_device(np.array([9, -10], index_dtype)), 1, stream=None)
    assert to_host(wrapped).tobytes() == np.take(host, [2, 4], axis=1).tobytes()
