"""bfloat16 as 16-bit storage on a device backend (``engines/native/bf16.py``), checked on the
CPU: the bit conversions against ml_dtypes (every bfloat16 pattern, every rounding tie, NaN,
infinities, subnormals, overflow), the CUDA sources compiled by nvcc where it is installed,
and the plan's bfloat16 dispatch run on a host stand-in for the device backend whose array
module refuses to compute on a bfloat16 array: mixed-precision LLaMA graphs (append and
static cache) then equal native-host bit for bit, and an op without a bfloat16 kernel is an
error naming the op. The device itself is ``test_native_cuda_bf16.py``.
"""
from __future__ import annotations

import types

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper

from engines.errors import ExecutionError
from engines.native import bf16, cuda_kernels
from engines.native.array_backend import NumpyArrayBackend
from engines.native.cuda_kernels import CudaKernels
from engines.native.cupy_array_backend import CASTS, TO_BF16, TO_FLOAT32
from engines.native.plan import Plan
from fixtures.llama_config import LlamaConfig
from fixtures.llama_graph import llama_model
from suites.nvcc_check import NVCC, compile_module, entry_instances

BF = np.dtype(ml_dtypes.bfloat16)
ALL_BITS = np.arange(1 << 16, dtype=np.uint16)


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes()


# -- the conversions -----------------------------------------------------------------------------

def test_every_bfloat16_pattern_widens_as_ml_dtypes_does():
    ours = bf16.bits_to_float32(ALL_BITS)
    assert _same(ours, ALL_BITS.view(BF).astype(np.float32))


def _ties_and_neighbours() -> np.ndarray:
    """float32 patterns halfway between two bfloat16 values (both parities of the kept
    bit), one ulp either side of the tie, and the exact bfloat16 values."""
    high = ALL_BITS.astype(np.uint32) << np.uint32(16)
    return np.concatenate([high, high | 0x8000, high | 0x7FFF, high | 0x8001, high | 0x0001])


SPECIALS = np.array([0x00000000, 0x80000000, 0x7F800000, 0xFF800000,  # +-0, +-inf
                     0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001,  # quiet, signalling NaN
                     0x7FFFFFFF, 0x7FA00000, 0xFFFF0001,              # NaN payloads
                     0x7F7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0xFF7FFFFF,  # max finite: rounds up
                     0x00000001, 0x00008000, 0x00018000, 0x807FFFFF,  # subnormals, ties there
                     0x3F808000, 0x3F818000, 0x3F800001],             # 1 + ties to even
                    dtype=np.uint32)


@pytest.mark.parametrize("case", ["specials", "ties", "random"])
def test_float32_narrows_as_ml_dtypes_does(case):
    if case == "specials":
        bits = SPECIALS
    elif case == "ties":
        bits = _ties_and_neighbours()
    else:
        bits = np.random.default_rng(12).integers(0, 1 << 32, 1 << 18, dtype=np.uint64)
        bits = bits.astype(np.uint32)
    x = bits.view(np.float32)
    with np.errstate(invalid="ignore", over="ignore"):
        expected = x.astype(BF).view(np.uint16)
    ours = bf16.float32_to_bits(x)
    assert _same(ours, expected), np.flatnonzero(ours != expected)[:8]
    nan = np.isnan(x)
    assert np.isnan(bf16.bits_to_float32(ours[nan])).all()  # a NaN stays a NaN
    assert (ours[nan] >> 15 == bits[nan] >> 31).all()       # with its sign


def test_rounding_is_to_nearest_even_at_the_ties():
    one = np.float32(1.0).view(np.uint32)
    tie_down, tie_up = one | 0x8000, one | 0x18000  # 1 + 2^-8 rounds to 1; 1 + 3*2^-8 up
    got = bf16.float32_to_bits(np.array([tie_down, tie_up], np.uint32).view(np.float32))
    assert got.tolist() == [0x3F80, 0x3F82]


# -- the CUDA sources compile (nvcc -ptx; the GPU module runs them) --------------------------------

@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed here")
@pytest.mark.parametrize(("which", "arch"), [("executor", "sm_90"), ("casts", "sm_90"),
                                             ("casts", "sm_75")])
def test_cuda_sources_compile_with_the_bfloat16_type(tmp_path, which, arch):
    """From sm_80 the rounding to bfloat16 is the hardware's cvt; before, integers."""
    modules = CudaKernels.modules() if which == "executor" else (CASTS,)
    wanted = ({"gemv_rows<lk_bf16>", "bmm<lk_bf16>", "sum_axis<lk_bf16>"}
              if which == "executor" else {TO_FLOAT32, TO_BF16})
    found = set()
    for module in modules:
        text = compile_module(module, arch, tmp_path)
        found |= set(entry_instances(text, module))
        assert ("cvt.rn.bf16.f32" in text) == (arch != "sm_75"), module.file
    assert wanted <= found


def test_the_executor_kernels_cover_bfloat16():
    instances = {i for module in CudaKernels.modules() for i in module.instances}
    for family in ("gemv_rows", "bmm", "sum_axis"):
        name = cuda_kernels.kernel_name(family, BF)
        assert name == f"{family}<lk_bf16>" and name in instances


# -- the plan's bfloat16 dispatch, on a host stand-in for the device -------------------------------

class _StrictXp(types.ModuleType):
    """numpy, except that any function handed a bfloat16 array raises: the stand-in for a
    device where computing on the 16-bit storage would be wrong."""

    def __init__(self):
        super().__init__("strict_numpy")
        self.touched: list[str] = []

    def __getattr__(self, name):
        value = getattr(np, name)
        if isinstance(value, type) or not callable(value):
            return value

        def guarded(*args, **kwargs):
            flat = list(args) + list(kwargs.values())
            flat += [x for a in flat if isinstance(a, (list, tuple)) for x in a]
            if any(bf16.is_bf16(a) for a in flat):
                self.touched.append(name)
                raise AssertionError(f"xp.{name} was handed a bfloat16 array")
            return value(*args, **kwargs)

        return guarded


class StorageBackend(NumpyArrayBackend):
    """The host backend with the device backend's bfloat16 contract: conversions through the
    reference bit helpers, an array module that refuses bfloat16 operands."""

    def __init__(self):
        super().__init__()
        self.xp = _StrictXp()
        self.conversions = 0

    def bf16_to_float32(self, x):
        self.conversions += 1
        return bf16.bits_to_float32(np.asarray(x, order="C").view(np.uint16))

    def float32_to_bf16(self, x):
        self.conversions += 1
        return bf16.float32_to_bits(x).view(BF)


def _feeds(c: LlamaConfig, tokens, start: int, past=None):
    seq = 0 if c.cache == "append" else c.max_context
    feeds = {"input_ids": np.asarray([tokens], np.int64),
             "position_ids": np.arange(start, start + len(tokens), dtype=np.int64)[None]}
    for i in range(c.layers):
        for kind in ("key", "value"):
            name = f"past_{kind}_{i}"
            feeds[name] = (past[f"present_{kind}_{i}"] if past is not None else
                           np.zeros((1, c.kv_heads, seq, c.head_dim), BF))
    return feeds


@pytest.mark.parametrize("cache", ["append", "static"])
def test_mixed_graphs_run_on_storage_bit_for_bit_as_on_the_host(cache):
    c = LlamaConfig(dtype="bfloat16", precision="mixed", cache=cache, seed=3)
    model = llama_model(c)
    assert bf16.model_uses_bf16(model)
    backend = StorageBackend()
    # unfused: the fused nodes' device kernels read lk_bf16 themselves (the GPU module)
    stored = bf16.Bf16Plan(model, backend, fuse=False)
    host = Plan(model, NumpyArrayBackend(), fuse=False)
    prompt = [1, 17, 42, 5, 9]
    a, b = stored.run(_feeds(c, prompt, 0)), host.run(_feeds(c, prompt, 0))
    for step, token in enumerate([3, 11, 7]):  # decode steps over the grown or written cells
        for name in b:
            assert _same(a[name], b[name]), (step, name)
        a = stored.run(_feeds(c, [token], len(prompt) + step, a))
        b = host.run(_feeds(c, [token], len(prompt) + step, b))
    assert a["logits"].dtype == BF and a["present_key_0"].dtype == BF
    assert backend.conversions > 0 and backend.xp.touched == []


def test_a_plain_plan_on_the_strict_backend_would_compute_on_bfloat16():
    """The control: without the dispatch, the same graph hands bfloat16 to the array module
    (so the mixed-graph test above really exercises the dispatch)."""
    c = LlamaConfig(dtype="bfloat16", precision="mixed", seed=3)
    with pytest.raises(ExecutionError, match="bfloat16 array"):
        Plan(llama_model(c), StorageBackend(), fuse=False).run(_feeds(c, [1, 2], 0))


def test_an_op_without_a_bfloat16_kernel_is_an_error_naming_it():
    """A uniform bfloat16 graph runs RMSNorm (ReduceMean) and the softmax in bfloat16: there
    is no such kernel, so the run stops there, naming the op and the remedy."""
    c = LlamaConfig(dtype="bfloat16", precision="uniform", seed=3)
    plan = bf16.Bf16Plan(llama_model(c), StorageBackend(), fuse=False)
    with pytest.raises(ExecutionError) as info:
        plan.run(_feeds(c, [1, 2], 0))
    err = info.value
    assert err.field == "ReduceMean.inputs" and err.value == "bfloat16"
    assert "float32" in err.remedy and "native-host" in err.remedy


def _one_node(op: str, inputs, out_type, **attrs):
    names = [f"x{i}" for i in range(len(inputs))]
    node = helper.make_node(op, names, ["y"], **attrs)
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(v.dtype), v.shape)
         for n, v in zip(names, inputs)],
        [helper.make_tensor_value_info("y", out_type, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 19)])
    return model, dict(zip(names, inputs))


CAST_SOURCES = {
    "float32": np.array([1.0, -2.5, 1 + 2**-8, 3.3e38, np.inf, np.nan, 1e-40], np.float32),
    "float16": np.array([1.0, -0.333, 65504.0, -np.inf, np.nan, 6e-8], np.float16),
    "float64": np.array([1.0 + 2**-9 + 2**-30, -1e300, 1e-300, np.nan], np.float64),
    "int64": np.array([0, -7, 2**40 + 1, 255, 257], np.int64),
    "bool": np.array([True, False, True]),
}


@pytest.mark.parametrize("source", sorted(CAST_SOURCES))
def test_casts_to_and_from_bfloat16_equal_ml_dtypes(source):
    x = CAST_SOURCES[source]
    model, feeds = _one_node("Cast", [x], TensorProto.BFLOAT16, to=TensorProto.BFLOAT16)
    with np.errstate(invalid="ignore", over="ignore"):
        down = bf16.Bf16Plan(model, StorageBackend()).run(feeds)["y"]
        assert _same(down, x.astype(BF))
        back_type = helper.np_dtype_to_tensor_dtype(x.dtype)
        model, feeds = _one_node("Cast", [down], back_type, to=back_type)
        up = bf16.Bf16Plan(model, StorageBackend()).run(feeds)["y"]
        assert _same(up, down.astype(x.dtype))


@pytest.mark.parametrize("op", ["Add", "Mul", "Sub", "Div", "Greater", "LessOrEqual", "Max"])
def test_single_rounding_ops_equal_the_host_bit_for_bit(op):
    rng = np.random.default_rng(5)
    a, b = (rng.standard_normal(64).astype(BF) for _ in range(2))
    b[:4] = a[:4]  # ties for the comparisons
    out_type = TensorProto.BOOL if op in ("Greater", "LessOrEqual") else TensorProto.BFLOAT16
    model, feeds = _one_node(op, [a, b], out_type)
    ours = bf16.Bf16Plan(model, StorageBackend()).run(feeds)["y"]
    assert _same(ours, Plan(model, NumpyArrayBackend()).run(feeds)["y"])


@pytest.mark.parametrize("op", ["Exp", "Sqrt", "Softmax", "Sigmoid"])
def test_ops_without_a_single_rounding_refuse_bfloat16(op):
    x = np.linspace(0.5, 2.0, 8).astype(BF)[None]
    model, feeds = _one_node(op, [x], TensorProto.BFLOAT16)
    with pytest.raises(ExecutionError) as info:
        bf16.Bf16Plan(model, StorageBackend()).run(feeds)
    assert info.value.field == f"{op}.inputs" and op in str(info.value)


# -- the engine's refusal is now about CuPy, not the dtype -----------------------------------------

@pytest.mark.parametrize("holds", [True, False], ids=["cupy-14", "cupy-13"])
def test_native_cuda_refuses_bfloat16_only_where_cupy_cannot_hold_it(holds):
    """CuPy 14 holds ml_dtypes.bfloat16 arrays (the 16-bit storage); CuPy 13 raises on the
    dtype, and the engine then reports itself unavailable naming the package dtype, the
    CuPy it needs and the engines that can run the package."""
    from engines.backends.native_cuda import _require_bfloat16_arrays
    from engines.errors import EngineUnavailable

    class FakeCupy:
        __version__ = "14.2.0" if holds else "13.6.0"

        @staticmethod
        def empty(shape, dtype):
            if not holds and np.dtype(dtype) == BF:
                raise TypeError("Unsupported type <class 'numpy.dtype[bfloat16]'>")
            return np.empty(shape, dtype)

    if holds:
        _require_bfloat16_arrays(FakeCupy)
        return
    with pytest.raises(EngineUnavailable) as info:
        _require_bfloat16_arrays(FakeCupy)
    err = info.value
    assert err.field == "package.dtype" and err.value == "bfloat16"
    assert "CuPy >= 14" in err.remedy and "native-host" in err.remedy and "13.6.0" in str(err)
