"""The fused nodes' CUDA kernels (``engines/native/fused_kernels.py``, the families of
``engines/native/launch``) on the device.

Each kernel is fed the inputs its node really gets in a llama forward (recorded from a
native-host run) and checked against the host implementation within the tolerance table
(the KV write, a copy, bit for bit); each is batch-invariant bit for bit at M = 1, 2, 5;
native-cuda fused and unfused produce the same tokens on the llama fixtures; with graphs
on, a fused decode stages nothing and reads back 4 bytes a token. The decode timings are
printed (run with ``-s``) and kept as a figure, never asserted."""
from __future__ import annotations

import functools
import time

import numpy as np
import pytest

from engines.ledger import Ledger
from engines.native import plan as plan_module
from engines.native.array_backend import NumpyArrayBackend
from engines.native.fusion import FUSED_DOMAIN
from engines.native.kernel_source import instance
from engines.native.ops.fused import KVWrite, Rotary
from fixtures.llama_config import LlamaConfig
from fixtures.llama_graph import llama_model
from harness.compare import compare_tensors
from suites.support import device_greedy_matches_oracle, fixture_names, write_figure

pytestmark = pytest.mark.gpu
ENGINE = "native-cuda"
CONFIGS = {
    f"{dtype}-{precision}-{layout}": LlamaConfig(cache="static", dtype=dtype,
                                                 precision=precision, rope_layout=layout)
    for dtype, precision in (("float32", "uniform"), ("float16", "uniform"),
                             ("float16", "mixed"))
    for layout in ("halves", "pairs")}
# SmolLM2's head shape (head_dim 64, 3 query heads a KV head) and head_dim 128 (one thread
# group over keys in attention's output phase)
CONFIGS["float32-uniform-d64"] = LlamaConfig(cache="static", heads=6, kv_heads=2, head_dim=64)
CONFIGS["float16-mixed-d64"] = LlamaConfig(cache="static", heads=6, kv_heads=2, head_dim=64,
                                           dtype="float16", precision="mixed")
CONFIGS["float16-mixed-d128"] = LlamaConfig(cache="static", heads=2, kv_heads=1,
                                            head_dim=128, dtype="float16", precision="mixed")
# bfloat16 storage (CuPy 14 holds ml_dtypes' bfloat16; the kernels see lk_bf16 bits)
CONFIGS["bfloat16-mixed-halves"] = LlamaConfig(cache="static", dtype="bfloat16",
                                               precision="mixed")
CONFIGS["bfloat16-mixed-d64"] = LlamaConfig(cache="static", heads=6, kv_heads=2, head_dim=64,
                                            dtype="bfloat16", precision="mixed")
ROWS = 5  # the recorded forward's M
# the kinds a plan without the GEMV prologues records, then those a default plan adds
KINDS = ("RMSNorm", "AddRMSNorm", "Rotary2", "SwiGLU", "Attention", "KVWrite2", "MatMulN")
PROLOGUE_KINDS = ("NormMatMul", "SwiGLUMatMul", "NormGLU", "RotaryKVWrite",
                  "RotaryKVAttention")
# each one-launch kind -> its launcher (FusedKernels), which answers None when it cannot
LAUNCHERS = {"NormMatMul": "norm_gemv", "SwiGLUMatMul": "swiglu_gemv", "NormGLU": "norm_glu",
             "RotaryKVWrite": "rotary_kv", "RotaryKVAttention": "rotary_kv_attention"}
ROW_KINDS = [k for k in KINDS if k != "KVWrite2"] + ["Rotary", "NormMatMul", "SwiGLUMatMul",
                                                     "NormGLU"]


@pytest.fixture(scope="module")
def backend(cp, stream):
    from engines.native.cupy_array_backend import CupyArrayBackend

    return CupyArrayBackend(stream, Ledger(), device_id=0)


def to_host(value, stream) -> np.ndarray:
    import cupy

    if value.dtype.name == "bfloat16":  # its bits, read back as uint16
        return cupy.asnumpy(value.view(np.uint16), stream=stream).view(value.dtype)
    return cupy.asnumpy(value, stream=stream)


def _feeds(config: LlamaConfig, tokens, start: int, cache=None) -> dict:
    dtype = np.dtype(config.dtype)
    feeds = {"input_ids": np.asarray([tokens], np.int64),
             "position_ids": np.arange(start, start + len(tokens), dtype=np.int64)[None]}
    for i in range(config.layers):
        for kind in ("key", "value"):
            feeds[f"past_{kind}_{i}"] = (
                cache[f"present_{kind}_{i}"] if cache is not None else
                np.zeros((1, config.kv_heads, config.max_context, config.head_dim), dtype))
    return feeds


def _record(config: LlamaConfig, plan) -> dict:
    """Op kind -> (bound kernel, host inputs) of its last call in the second of two
    ROWS-row forwards of ``plan`` on native-host (a filled cache, positions
    ROWS..2*ROWS-1)."""
    calls: dict = {}
    for step in plan.steps:
        if step.node.domain != FUSED_DOMAIN:
            continue
        kernel, kind = step.kernel, step.node.op_type

        def record(be, *args, _kernel=kernel, _kind=kind):
            calls[_kind] = (_kernel, [np.array(a, copy=True) for a in args])
            return _kernel(be, *args)

        step.kernel = record
    first = plan.run(_feeds(config, [1, 17, 42, 5, 9], 0))
    plan.run(_feeds(config, [3, 8, 13, 21, 34], ROWS, first))
    return calls


@functools.lru_cache(maxsize=None)
def recorded_calls(name: str) -> dict:
    """Every fused kind's last call (``_record``): the norms, SwiGLU, MatMulN, Rotary2,
    KVWrite2 and Attention from a plan without the one-launch pairs (so each kernel is tested
    alone), the pairs from a plan without RotaryKVAttention (which takes RotaryKVWrite in)
    and NormGLU (which takes the gate/up NormMatMul and SwiGLUMatMul's SwiGLU), and
    RotaryKVAttention and NormGLU from the default plan."""
    from engines.native.fusion import driver

    config = CONFIGS[name]
    model = llama_model(config)
    pairs = (driver.norm_matmul.match, driver.norm_glu.match, driver.swiglu_matmul.match,
             driver.rotary_kv.match, driver.rotary_kv_attention.match)

    def without(*recognisers):
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(driver, "RECOGNISERS", tuple(r for r in driver.RECOGNISERS
                                                    if r not in recognisers))
            return _record(config, plan_module.Plan(model, NumpyArrayBackend()))

    calls = without(*pairs)
    assert set(calls) == set(KINDS), sorted(calls)
    prologues = without(driver.rotary_kv_attention.match, driver.norm_glu.match)
    prologues.update(_record(config, plan_module.Plan(model, NumpyArrayBackend())))
    assert set(PROLOGUE_KINDS) <= set(prologues), sorted(prologues)
    calls.update({kind: prologues[kind] for kind in PROLOGUE_KINDS})
    pair, (old_k, new_k, _, _, positions) = calls["KVWrite2"]
    calls["KVWrite"] = (KVWrite(pair.node, pair.opset), [old_k, new_k, positions])  # unpaired
    pair, (x_q, _, cos, sin) = calls["Rotary2"]
    one = Rotary(pair.node, pair.opset)  # unpaired: the query's rotation, its scale included
    one.scale_value = pair.scale_a
    calls["Rotary"] = (one, [x_q, cos, sin])
    return calls


def _device(args, backend):
    """The inputs on the device, through the backend's adopt (which places bfloat16); 2-D
    ones adopted as weights are (a cached [N, K] transpose: MatMulN's one-launch GEMV)."""
    with backend.weight_loading():
        return [backend.adopt(a) for a in args]


def _rows(kind: str, args, a: int, b: int, kernel=None):
    """The inputs of rows [a, b) of a row-structured fused node."""
    if kind in ("NormMatMul", "NormGLU"):
        kind = "AddRMSNorm" if kernel.add else "RMSNorm"
    if kind in ("RMSNorm", "MatMulN"):
        return [args[0][:, a:b]] + list(args[1:])
    if kind in ("SwiGLU", "AddRMSNorm", "SwiGLUMatMul"):
        return [args[0][:, a:b], args[1][:, a:b]] + list(args[2:])
    if kind in ("Rotary", "Rotary2"):
        return [x[:, :, a:b] for x in args]
    if kind in ("RotaryKVWrite", "RotaryKVAttention"):  # x_keep, x_cache, cos, sin, old
        # caches, new rows, positions
        return ([x[:, :, a:b] for x in args[:4]] + list(args[4:6])
                + [args[6][:, :, a:b], args[7][:, a:b]])
    if kind == "Attention":
        return [args[0][:, :, a:b], args[1], args[2], args[3][:, a:b]]
    raise AssertionError(kind)


def _out_row(kind: str, out, r: int):
    return out[:, :, r:r + 1] if kind.startswith("Rotary") else out[:, r:r + 1]


# -- each kernel against its host implementation -------------------------------------------

@pytest.mark.claim("batch_invariance")
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("kind", KINDS + ("KVWrite", "Rotary") + PROLOGUE_KINDS)
def test_kernel_matches_host(cp, stream, backend, name, kind):
    kernel, args = recorded_calls(name)[kind]
    wants = kernel(NumpyArrayBackend(), *args)
    gots = kernel(backend, *_device(args, backend))
    assert len(gots) == len(wants)
    for i, (got, want) in enumerate(zip(gots, wants)):
        got = to_host(got, stream)
        assert got.shape == want.shape and got.dtype == want.dtype, (kind, i)
        if kind.startswith("KVWrite"):  # a copy: exact
            assert got.tobytes() == want.tobytes()
            continue
        result = compare_tensors(got, want, dtype=want.dtype.name)
        assert result.ok, (kind, name, i, result.reason)


@pytest.mark.claim("batch_invariance")
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("kind", ROW_KINDS)
def test_kernel_rows_are_batch_invariant(cp, stream, backend, name, kind):
    """Row r of an M-row launch equals the one-row launch of row r, bit for bit (every
    output of the node)."""
    kernel, args = recorded_calls(name)[kind]
    dev = _device(args, backend)
    for m in (1, 2, ROWS):
        batched = [to_host(y, stream)
                   for y in kernel(backend, *_rows(kind, dev, 0, m, kernel))]
        for r in range(m):
            singles = kernel(backend, *_rows(kind, dev, r, r + 1, kernel))
            for i, (full, single) in enumerate(zip(batched, singles)):
                row = _out_row(kind, full, r)
                assert row.tobytes() == to_host(single, stream).tobytes(), (kind, name, m, r, i)


@pytest.mark.parametrize("name", list(CONFIGS))
def test_kv_write_of_m_rows_equals_m_single_writes(cp, stream, backend, name):
    """Writing M rows at once (keys and values in one launch) equals M one-row writes, and
    the paired launch equals two single ones."""
    pair, args = recorded_calls(name)["KVWrite2"]
    single, _ = recorded_calls(name)["KVWrite"]
    old_k, new_k, old_v, new_v, positions = _device(args, backend)
    for m in (1, 2, ROWS):
        rows = (slice(None), slice(None), slice(0, m))
        batched = pair(backend, old_k, new_k[rows], old_v, new_v[rows], positions[:, :m])
        k, v = old_k, old_v
        for r in range(m):
            one = (slice(None), slice(None), slice(r, r + 1))
            k, v = pair(backend, k, new_k[one], v, new_v[one], positions[:, r:r + 1])
        assert to_host(batched[0], stream).tobytes() == to_host(k, stream).tobytes(), (name, m)
        assert to_host(batched[1], stream).tobytes() == to_host(v, stream).tobytes(), (name, m)
        alone = single(backend, old_v, new_v[rows], positions[:, :m])[0]
        assert to_host(alone, stream).tobytes() == to_host(batched[1], stream).tobytes()


@pytest.mark.claim("batch_invariance")
@pytest.mark.parametrize("name", list(CONFIGS))
def test_one_launch_matmuls_equal_their_own_matmuls(cp, stream, backend, name):
    """MatMulN's outputs (q/k/v or gate/up in one launch) equal each weight's own
    ``backend.matmul`` bit for bit, and the launch really is the shared one."""
    kernel, args = recorded_calls(name)["MatMulN"]
    a, *weights = _device(args, backend)
    launches = []
    real = backend.kernels.gemv_many
    backend.kernels.gemv_many = lambda *x, **k: launches.append(1) or real(*x, **k)
    try:
        together = kernel(backend, a, *weights)
    finally:
        del backend.kernels.gemv_many  # the class's method again
    assert launches == [1]
    for out, w in zip(together, weights):
        assert to_host(out, stream).tobytes() == to_host(backend.matmul(a, w), stream).tobytes()


@pytest.mark.claim("batch_invariance")
@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("kind", PROLOGUE_KINDS)
def test_one_launch_pair_has_the_two_launches_bits(cp, stream, backend, name, kind):
    """A GEMV with a norm or SwiGLU prologue, and a rotation fused into its cache write (one
    launch each), give every output bit for bit what the two kernels give (the path prefills
    take, forced here by the launcher declining), at M = 1, 2, 5; and the one launch really
    ran."""
    kernel, args = recorded_calls(name)[kind]
    dev = _device(args, backend)
    device = backend.fused_kernels()
    launcher = LAUNCHERS[kind]
    for m in (1, 2, ROWS):
        rows = _rows(kind, dev, 0, m, kernel)
        launched = []
        real = getattr(device, launcher)
        setattr(device, launcher, lambda *a, **k: launched.append(real(*a, **k)) or launched[-1])
        try:
            one = [to_host(y, stream) for y in kernel(backend, *rows)]
        finally:
            delattr(device, launcher)  # the class's method again
        assert len(launched) == 1 and launched[0] is not None, (kind, name, m)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(device, launcher, lambda *a, **k: None)
            two = [to_host(y, stream) for y in kernel(backend, *rows)]
        assert len(one) == len(two)
        for i, (a, b) in enumerate(zip(one, two)):
            assert a.shape == b.shape and a.tobytes() == b.tobytes(), (kind, name, m, i)


def test_attention_reads_no_slot_past_the_position(cp, stream, backend):
    """Poison every cache slot past the largest position with NaN: the output is unchanged
    (a masked key never read, not merely weighted zero)."""
    kernel, args = recorded_calls("float32-uniform-halves")["Attention"]
    q, k, v, positions = args
    last = int(positions.max())
    k2, v2 = k.copy(), v.copy()
    k2[:, :, last + 1:] = np.nan
    v2[:, :, last + 1:] = np.nan
    clean = to_host(kernel(backend, *_device(args, backend))[0], stream)
    poisoned = to_host(kernel(backend, *_device([q, k2, v2, positions], backend))[0],
                       stream)
    assert np.isfinite(poisoned).all() and poisoned.tobytes() == clean.tobytes()


@pytest.mark.claim("batch_invariance")
@pytest.mark.parametrize("dtype,score", [("float16", "float32"), ("float16", "float16"),
                                         ("float32", "float32")])
@pytest.mark.parametrize("d,t,scale", [(64, 2048, 0.125), (128, 96, None), (64, 40, 0.125)])
def test_prefill_attention_rows_equal_each_row_alone(cp, stream, backend, dtype, score, d, t,
                                                      scale):
    """A prefill's attention (attention_rows: rows of one head share each key and value
    load) gives every row bit for bit what the row alone gives (the decode kernel, M = 1),
    at positions in order, out of order, repeated, past the cache (clamped) and negative
    (no key); and the rows kernel really ran."""
    fk = backend.fused_kernels()
    heads, kv_heads, m = 6, 2, 21
    rng = np.random.default_rng(d + t)
    with stream:
        q = cp.asarray(rng.standard_normal((1, heads, m, d)).astype(dtype))
        k = cp.asarray(rng.standard_normal((1, kv_heads, t, d)).astype(dtype))
        v = cp.asarray(rng.standard_normal((1, kv_heads, t, d)).astype(dtype))
        positions = np.arange(m, dtype=np.int64) + min(5, t - m)
        positions[3], positions[4] = positions[4], positions[3]  # out of order
        positions[7] = positions[6]  # one position twice
        positions[10], positions[11] = t + 3, -1  # past the cache (clamped), no key
        pos = cp.asarray(positions[None])
    launched = []
    real = fk._launcher.launch

    def spy(function, *a, **kw):
        launched.append(function)
        return real(function, *a, **kw)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(fk._launcher, "launch", spy)
        rows = to_host(fk.attention(q, k, v, pos, kv_heads, heads // kv_heads, scale,
                                    np.dtype(score), stream=stream), stream)
    name = instance("attention_rows", dtype, score)
    assert launched == [fk._functions[name]]
    for i in range(m):
        one = to_host(fk.attention(q[:, :, i:i + 1], k, v, pos[:, i:i + 1], kv_heads,
                                   heads // kv_heads, scale, np.dtype(score), stream=stream),
                      stream)
        assert one[0, 0].tobytes() == rows[0, i].tobytes(), (i, int(positions[i]))


# -- a replay's feed copies in one launch -----------------------------------------------------

def test_copy_many_moves_every_byte_in_one_launch_and_reuses_its_table(cp, stream):
    """``CupyGraphDevice.copy_many`` (a graph slot's replay): the bytes of each pair land as
    ``copy`` puts them, aligned or not, odd sizes included; 130 copies are two launches (the
    argument limit); the same pointers again build no new table; a strided pair has no
    ``copy_entry`` and still copies (by ``copy``)."""
    from engines.native.batched_copy import MAX_ENTRIES
    from engines.native.graph_slots import CupyGraphDevice

    device = CupyGraphDevice(stream)
    rng = np.random.default_rng(5)
    with stream:
        raw = cp.asarray(rng.integers(0, 256, 5000, dtype=np.uint8))
        pairs = [(cp.empty((1, 3, 512, 64), cp.float16),
                  cp.asarray(rng.standard_normal((1, 3, 512, 64)).astype(np.float16))),
                 (cp.empty((1, 1), cp.int64), cp.asarray(np.array([[123456789]], np.int64))),
                 (cp.empty(37, cp.uint8), raw[:37]),
                 (cp.empty(1000, cp.uint8), raw[3:1003]),  # source 3 bytes off alignment
                 (cp.empty((8, 6), cp.float32),  # a transposed (strided) source
                  cp.asarray(rng.standard_normal((6, 8)).astype(np.float32)).T)]
        pairs += [(cp.empty(24, cp.float32), cp.asarray(rng.standard_normal(24), cp.float32))
                  for _ in range(MAX_ENTRIES - 2)]
        for dst, _src in pairs:
            dst.fill(0)
    copies = [(dst, src, device.copy_entry(dst, src)) for dst, src in pairs]
    assert [entry is None for *_pair, entry in copies[:5]] == [False] * 4 + [True]
    device.copy_many(copies)
    batched = device._batched
    assert batched.launches == 2 and batched.builds == 1  # 130 contiguous copies, 1 strided
    for dst, src in pairs:
        assert cp.asnumpy(dst, stream=stream).tobytes() == cp.asnumpy(src, stream=stream).tobytes()
    with stream:
        for _dst, src in pairs[:2]:
            src[...] = src * 2 + 1  # new values, same pointers
    device.copy_many(copies)
    assert batched.launches == 4 and batched.builds == 1
    for dst, src in pairs[:2]:
        assert cp.asnumpy(dst, stream=stream).tobytes() == cp.asnumpy(src, stream=stream).tobytes()


# -- the engine, fused and unfused ---------------------------------------------------------

def _engine(package, fuse: bool, **kwargs):
    from engines.registry import get_engine_class

    cls = get_engine_class(ENGINE)
    if fuse:
        return cls(package, **kwargs)
    with pytest.MonkeyPatch.context() as mp:  # the engine builds Plan(model, backend)
        mp.setattr(plan_module, "Plan", functools.partial(plan_module.Plan, fuse=False))
        return cls(package, **kwargs)


FUSED_FIXTURES = [n for n in fixture_names() if "llama" in n or n == "hybrid_mtp"]


@pytest.mark.claim("token_identity")
@pytest.mark.parametrize("package_name", FUSED_FIXTURES)
def test_fused_and_unfused_native_cuda_tokens_are_identical(packages, package_name):
    from engines.workflow import greedy_decode

    package = packages[package_name]
    fused, plain = _engine(package, True), _engine(package, False)
    try:
        assert all(p.fusions for p in fused._plans.values())
        assert not any(p.fusions for p in plain._plans.values())
        for prompt in package.spec.prompts:
            a = greedy_decode(fused, list(prompt), 24).tokens
            b = greedy_decode(plain, list(prompt), 24).tokens
            assert a == b, (package_name, prompt)
    finally:
        fused.close()
        plain.close()


@pytest.mark.claim("zero_staging", "readback_budget", "token_identity")
@pytest.mark.parametrize("package_name, graphs", [("tiny_llama_static", True),
                                                   ("tiny_llama", False)])
def test_fused_decode_stages_nothing(packages, package_name, graphs):
    """Static cache with graphs on (both slots replay the fused plan), append cache eager."""
    package = packages[package_name]
    engine = _engine(package, True, graphs=graphs)
    try:
        assert engine.graphs == graphs and all(p.fusions for p in engine._plans.values())
        for prompt in package.spec.prompts:
            device_greedy_matches_oracle(engine, package, list(prompt), 24)
    finally:
        engine.close()


# -- timings: printed, never asserted --------------------------------------------------------

SMOLLM2_SHAPE = dict(layers=30, hidden=576, heads=9, kv_heads=3, head_dim=64, ffn=1536,
                     vocab=49152, tied=True, cache="static", max_context=512)


def _decode_ms(engine, prompt, steps: int) -> float:
    from engines.workflow import greedy_decode

    greedy_decode(engine, prompt, 4)  # warm-up: captures both graphs' signatures
    t0 = time.perf_counter()
    greedy_decode(engine, prompt, 1)
    t1 = time.perf_counter()
    greedy_decode(engine, prompt, steps + 1)
    t2 = time.perf_counter()
    return 1e3 * ((t2 - t1) - (t1 - t0)) / steps


def _forward_ms(engine, prompt, m: int, phase: str, repeats: int = 20) -> float:
    from engines.workflow.session import DecodeSession

    session = DecodeSession(engine)
    session.forward(prompt, "prefill")
    start = session.position
    tokens = [(3 * i + 1) % engine.package.spec.vocab_size for i in range(m)]
    for _ in range(3):
        session.position = start
        session.forward(tokens, phase)
    engine.stream.synchronize()
    t0 = time.perf_counter()
    for _ in range(repeats):
        session.position = start
        session.forward(tokens, phase)
    engine.stream.synchronize()
    return 1e3 * (time.perf_counter() - t0) / repeats


def _smollm2_package(tmp_path, dtype: str):
    """A random package of SmolLM2-135M's shape (float16: mixed precision)."""
    from engines.package import load_package
    from fixtures.llama_graph import build_llama

    config = LlamaConfig(**SMOLLM2_SHAPE, dtype=dtype,
                         precision="mixed" if dtype == "float16" else "uniform")
    return load_package(build_llama(tmp_path / f"smollm2-{dtype}", config, [[1, 2, 3, 4]],
                                    name=f"smollm2_shape_{dtype}"))


@pytest.mark.parametrize("shape", ["tiny_llama_static", "smollm2-float32", "smollm2-float16"])
def test_print_decode_ms_fused_vs_unfused(packages, tmp_path, evidence_dir, shape):
    package = (packages[shape] if shape == "tiny_llama_static"
               else _smollm2_package(tmp_path, shape.split("-")[1]))
    prompt = list(package.spec.prompts[0])
    steps = min(64, package.spec.max_context - len(prompt) - 2)  # room for steps + 1 tokens
    figures = {}
    for fuse in (True, False):
        engine = _engine(package, fuse)
        try:
            label = "fused" if fuse else "unfused"
            figures[label] = {
                "decode_ms_per_token": _decode_ms(engine, prompt, steps),
                "forward_ms_m1": _forward_ms(engine, prompt, 1, "decode"),
                "forward_ms_m4": _forward_ms(engine, prompt, 4, "verify"),
                "steps_per_forward": len(engine._plans["target"].steps),
            }
        finally:
            engine.close()
    for label, f in figures.items():
        print(f"\n[{shape}] {label}: decode {f['decode_ms_per_token']:.3f} ms/token "
              f"({1e3 / f['decode_ms_per_token']:.0f} tok/s); forward M=1 "
              f"{f['forward_ms_m1']:.3f} ms, M=4 {f['forward_ms_m4']:.3f} ms "
              f"(x{f['forward_ms_m4'] / f['forward_ms_m1']:.2f}); "
              f"{f['steps_per_forward']} plan steps")
    write_figure(evidence_dir, f"fused_decode_{shape}", figures)


def test_print_device_ms_per_fused_op(tmp_path, evidence_dir):
    """One eager M=1 decode forward of the SmolLM2-shaped float16 package, each plan step
    between two CUDA events (after a warm-up): device ms and host us per op type, printed
    (run with ``-s``) and kept as a figure, never asserted."""
    import cupy

    from engines.workflow.session import DecodeSession

    package = _smollm2_package(tmp_path, "float16")
    engine = _engine(package, True, graphs=False)
    try:
        plan = engine._plans["target"]
        session = DecodeSession(engine)
        session.forward(list(package.spec.prompts[0]), "prefill")
        start = session.position
        for _ in range(3):  # warm-up: every kernel compiled, every host value on the device
            session.position = start
            session.forward([5], "decode")
        records = []

        def profile(node, call):
            begin, end = cupy.cuda.Event(), cupy.cuda.Event()
            t0 = time.perf_counter()
            begin.record(engine.stream)
            values = call()
            end.record(engine.stream)
            records.append((node.op_type if node is not None else "?", begin, end,
                            time.perf_counter() - t0))
            return values

        plan.run = functools.partial(type(plan).run, plan, profile=profile)
        try:
            session.position = start
            session.forward([5], "decode")
        finally:
            del plan.run  # the class's method again
        engine.stream.synchronize()
    finally:
        engine.close()
    table: dict[str, dict] = {}
    for op, begin, end, host_s in records:
        row = table.setdefault(op, {"steps": 0, "device_ms": 0.0, "host_us": 0.0})
        row["steps"] += 1
        row["device_ms"] += cupy.cuda.get_elapsed_time(begin, end)
        row["host_us"] += 1e6 * host_s
    total = sum(r["device_ms"] for r in table.values())
    print(f"\n[smollm2-float16] one eager decode forward: {len(records)} steps, "
          f"{total:.3f} ms device time between events")
    for op, r in sorted(table.items(), key=lambda kv: -kv[1]["device_ms"]):
        print(f"  {op:>12}: {r['steps']:4d} steps, {r['device_ms']:.4f} ms device "
              f"({100 * r['device_ms'] / max(total, 1e-9):.1f}%), {r['host_us']:.0f} us host")
    write_figure(evidence_dir, "fused_profile_smollm2-float16", table)


LAYOUT_OPS = ("Reshape", "Transpose", "Identity", "Unsqueeze")


@pytest.mark.parametrize("package_name", ["tiny_llama_static"])
def test_layout_steps_of_a_fused_forward_launch_nothing(packages, package_name):
    """What the fusion pass leaves between the fused nodes (a layer's Reshapes, Transposes,
    Identities) are views on the device: each output starts inside its input's buffer, so
    no step of theirs copies (the fused kernels read the strides)."""
    from engines.workflow.session import DecodeSession

    package = packages[package_name]
    engine = _engine(package, True, graphs=False)
    try:
        plan = engine._plans["target"]
        session = DecodeSession(engine)
        session.forward(list(package.spec.prompts[0]), "prefill")
        values, checked = {}, []

        def profile(node, call):
            outs = call()
            for name, value in zip(node.output, outs):
                if name:
                    values[name] = value
            if node.op_type in LAYOUT_OPS and node.input[0] in values:
                checked.append((node.op_type, values[node.input[0]], outs[0]))
            return outs

        plan.run = functools.partial(type(plan).run, plan, profile=profile)
        try:
            session.forward([5], "decode")
        finally:
            del plan.run
        engine.stream.synchronize()
    finally:
        engine.close()
    assert {op for op, *_ in checked} >= {"Reshape", "Transpose", "Identity"}
    for op, source, out in checked:
        start = source.data.ptr
        assert start <= out.data.ptr < start + max(source.nbytes, 1), f"{op} copied"
