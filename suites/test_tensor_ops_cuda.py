"""Claim 8 on the device: CudaTensorOps equals HostTensorOps element for element.

The draws, the cases and the error table are the ones in ``test_tensor_ops.py``; here each
case runs on both backends and the results must have the same shape, dtype and bits (and
live where the rules say). Also: argmax reads back exactly 4 bytes a row and the ledger
agrees with the transfer guard; no other op moves a byte to the host; the view-or-copy rule.
"""
from __future__ import annotations

import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from engines.cuda_module import CudaModule
from engines.errors import InputError, ResidencyError
from engines.ledger import Ledger
from engines.tensor_ops import SUPPORTED_DTYPES, HostTensorOps
from engines.tensor_ops.cuda import _BITS_AS, ARGMAX_MODULES, kernel_layout
from harness.transfer_guard import transfer_guard
from suites.nvcc_check import NVCC, compile_module, entry_instances
from suites.test_tensor_ops import (
    CASES,
    ERROR_CASES,
    assert_same,
    draw_argmax,
    draw_slice,
    materialize,
)

pytestmark = pytest.mark.claim("tensor_ops")


# -- host-side pieces of the CUDA backend (run in CI) ----------------------------------------
def test_every_supported_dtype_has_a_kernel_type():
    assert set(ARGMAX_MODULES) == set(SUPPORTED_DTYPES)
    for name, module in ARGMAX_MODULES.items():  # the module defines the tag it instantiates
        assert f"LK_ARGMAX_TAG(lk_argmax_{name}," in module.text()
        assert module.instances[0] == f"lockstep_argmax_rows<lk_argmax_{name}>"
    for name, as_ in _BITS_AS.items():
        assert np.dtype(as_).itemsize == SUPPORTED_DTYPES[name].itemsize


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", sorted(ARGMAX_MODULES))
def test_the_argmax_kernels_compile_with_nvcc(tmp_path, name):
    module = ARGMAX_MODULES[name]
    ptx = compile_module(module, "sm_90", tmp_path)
    assert set(entry_instances(ptx, module)) == set(module.instances)


@pytest.mark.parametrize("shape,strides,itemsize,expected", [
    ((3, 5), (20, 4), 4, (5, True)),         # C-contiguous
    ((3, 5), (40, 4), 4, (10, True)),        # row-strided view (every other row)
    ((3, 5), (-20, 4), 4, (-5, True)),       # reversed rows
    ((3, 5), (4, 12), 4, (1, False)),        # transposed: columns not unit-stride
    ((3, 5), (20, -4), 4, (5, False)),       # reversed columns
    ((1, 5), (999, 2), 2, (0, True)),        # one row: its stride is never used
    ((3, 1), (6, 77), 2, (3, True)),         # one column: its stride is never used
])
def test_kernel_layout(shape, strides, itemsize, expected):
    assert kernel_layout(shape, strides, itemsize) == expected


# -- GPU ---------------------------------------------------------------------------------------




def cuda_ops(cp, stream):
    from engines.tensor_ops import CudaTensorOps

    return CudaTensorOps(Ledger(), stream, device_id=0)


def to_host(cp, value):
    if isinstance(value, cp.ndarray):
        return cp.asnumpy(value)
    return value


def where(value) -> str:
    from engines.residency import residency_of

    return residency_of(value)


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(CASES))
@given(data=st.data())
def test_gpu_cuda_ops_equal_host_ops(cp, stream, name, data):
    case = CASES[name]
    inputs = case.draw(data)
    host, dev = HostTensorOps(Ledger()), cuda_ops(cp, stream)
    expected = case.apply(host, materialize(inputs, host))
    result = case.apply(dev, materialize(inputs, dev))
    stream.synchronize()
    if isinstance(expected, np.ndarray):
        if expected.size == 0:
            assert isinstance(result, np.ndarray), "an empty result is host-empty numpy"
        else:
            assert where(result) == "cuda:0", "a result lives where its principal input lives"
        assert_same(to_host(cp, result), expected)
    else:
        assert result == expected


@pytest.mark.gpu
@given(data=st.data())
def test_gpu_slice_is_a_view_exactly_when_leading_extents_are_one(cp, stream, data):
    inputs = draw_slice(data)
    ops = cuda_ops(cp, stream)
    v = inputs["v"].on(ops)
    out = ops.slice_axis(v, inputs["axis"], inputs["start"], inputs["length"])
    axis = inputs["axis"] % v.ndim
    if out.size == 0:
        assert isinstance(out, np.ndarray)
    elif math.prod(v.shape[:axis]) == 1:
        assert out.data.mem is v.data.mem, "zero-copy view"
    else:
        assert out.data.mem is not v.data.mem and out.flags.c_contiguous, "a copy"


@pytest.mark.claim("readback_budget")
@pytest.mark.gpu
@given(data=st.data())
def test_gpu_argmax_reads_back_exactly_4_bytes_a_row(cp, stream, data):
    inputs = draw_argmax(data)
    ops = cuda_ops(cp, stream)
    logits = inputs["logits2d"].on(ops)
    rows = inputs["rows"]
    with transfer_guard("disallow") as g:
        try:
            ops.argmax_rows(logits, rows)
        except InputError:
            pass  # an all-NaN row: the ids were still read back once, and counted
    read = 4 * rows if rows and logits.shape[1] else 0
    assert ops.ledger.readback_bytes["token_id"] == read
    assert ops.ledger.readback_count["token_id"] == (1 if read else 0)
    assert g.readback_bytes["token_id"] == read
    assert g.readback_count["token_id"] == (1 if read else 0)
    assert g.staging_count == 0 and ops.ledger.host_staging == 0


@pytest.mark.claim("zero_staging", "readback_budget")
@pytest.mark.gpu
def test_gpu_no_op_but_argmax_moves_a_byte_to_the_host(cp, stream):
    ops = cuda_ops(cp, stream)
    with transfer_guard("disallow") as g:
        x = ops.adopt(np.arange(24, dtype=np.float32).reshape(2, 3, 4))
        ops.slice_axis(x, 1, 1, 2)
        ops.last_along_axis(x[:1], 1)
        ops.truncate_axis(x, 2, 3)
        ops.gather_rows(x, [1, 0, 1])
        ops.gather_rows(x, cp.asarray(np.array([1, 0], np.int64)))
        ops.scatter_into_last_axis(x, 1, ops.zeros((2, 3, 2), "float32"))
        ops.zeros((3, 3), "bfloat16")
        stream.synchronize()
    assert g.events == []
    assert ops.ledger.readback_total == 0
    assert ops.ledger.h2d_bytes == 96 + 24 and ops.ledger.h2d_count == 2  # x, then host ids


# spins, then writes x: suites/kernels/slow_fill.cu
SLOW_FILL = CudaModule(Path(__file__).resolve().parent / "kernels", "slow_fill.cu", ("slow_fill",))


@pytest.mark.gpu
def test_gpu_ops_are_ordered_on_the_engine_stream(cp, stream):
    """A kernel that spins ~50 ms and then writes x is queued on the engine's stream; every
    op issued after it must see the written values, which holds only if the op runs on that
    stream (an op on any other non-blocking stream would read x before it is written)."""
    ops = cuda_ops(cp, stream)
    x = ops.zeros((4, 64), "float32")
    dst = ops.zeros((4, 8), "float32")
    dev_ids = ops.zeros((2,), "int64")  # device ids [0, 0]: no host-to-device sync on gather
    slow = SLOW_FILL.load(0)["slow_fill"]

    def run(cycles):
        with cp.cuda.Device(0), stream:
            slow((1,), (256,), (x, np.int64(x.size), np.float32(5.0), np.int64(cycles)))
        sliced = ops.slice_axis(x, 1, 56, 8)          # a copy (leading extent 4)
        ops.scatter_into_last_axis(dst, 0, x[:, :8])  # reads x directly
        gathered = ops.gather_rows(x, dev_ids)
        return sliced, gathered, ops.argmax_rows(x, 4)  # its readback syncs the stream

    # Warm-up: CUDA loads kernels lazily, and loading one waits for the device to go idle,
    # which would hide a wrong stream; after this every kernel below is already loaded.
    run(0)
    stream.synchronize()
    x.fill(0)
    dst.fill(0)
    cp.cuda.Device(0).synchronize()
    sliced, gathered, top = run(100_000_000)  # ~50 ms of spinning before x is written
    assert top == [37, 37, 37, 37]
    stream.synchronize()
    assert cp.asnumpy(sliced).tolist() == [[5.0] * 8] * 4
    assert cp.asnumpy(dst).tolist() == [[5.0] * 8] * 4
    assert cp.asnumpy(gathered).tolist() == [[5.0] * 37 + [10.0] + [5.0] * 26] * 2


@pytest.mark.gpu
def test_gpu_adopt_feeds_keep_their_buffers_and_land_in_stream_order(cp, stream):
    """A step's ids and positions are staged in one copy into buffers kept by key and
    shape: the same addresses every call (a graph slot's feed copy is reused), every value
    counted as adopted, nothing read back. A copy queued between two calls, behind ~50 ms
    of spinning, still reads the first call's values (the second waits for the pinned side,
    and its device write lands in stream order); another key or width has its own buffers,
    and a feed past FEED_STAGE_BYTES is adopted as ``adopt`` does it."""
    from engines.tensor_ops.cuda import FEED_STAGE_BYTES

    ops = cuda_ops(cp, stream)
    x = ops.zeros((4, 64), "float32")
    slow = SLOW_FILL.load(0)["slow_fill"]
    ids, pos = np.array([[1, 2, 3]], np.int64), np.array([[40, 41, 42]], np.int64)
    with transfer_guard("disallow") as g:
        first = ops.adopt_feeds([ids, pos], "target")
        seen = ops.zeros((2, 3), "int64")
        with cp.cuda.Device(0), stream:
            slow((1,), (256,), (x, np.int64(x.size), np.float32(5.0), np.int64(100_000_000)))
            seen[0:1] = first[0]  # queued behind the spinning, on the engine's stream
            seen[1:2] = first[1]
        second = ops.adopt_feeds([ids + 10, pos + 3], "target")
        other = ops.adopt_feeds([ids, pos], "draft")
        wide = [np.arange(FEED_STAGE_BYTES // 8 + 1, dtype=np.int64).reshape(1, -1)]
        big = (ops.adopt_feeds(wide, "target")[0], ops.adopt_feeds(wide, "target")[0])
        stream.synchronize()
    assert [v.data.ptr for v in second] == [v.data.ptr for v in first]
    assert other[0].data.ptr not in {v.data.ptr for v in first}
    assert big[0].data.ptr != big[1].data.ptr  # not staged: a fresh array each
    assert cp.asnumpy(seen).tolist() == [[1, 2, 3], [40, 41, 42]]
    assert [cp.asnumpy(v).tolist() for v in second] == [[[11, 12, 13]], [[43, 44, 45]]]
    assert cp.asnumpy(big[1]).tolist() == wide[0].tolist()
    assert g.events == [] and ops.ledger.readback_total == 0
    assert ops.ledger.h2d_count == 8 and ops.ledger.h2d_bytes == 6 * 24 + 2 * wide[0].nbytes


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["float16", "bfloat16"])
def test_gpu_kernel_decodes_every_half_and_bfloat16_pattern(cp, stream, name):
    bits = np.arange(1 << 16, dtype=np.uint16)
    expected = bits.view(SUPPORTED_DTYPES[name]).astype(np.float32)
    fn = ARGMAX_MODULES[name].load(0)[f"lockstep_keys<lk_argmax_{name}>"]
    with cp.cuda.Device(0), stream:
        src = cp.asarray(bits)
        out = cp.empty(bits.size, dtype=cp.float32)
        fn(((bits.size + 255) // 256,), (256,), (src, np.int64(bits.size), out))
    got = cp.asnumpy(out, stream=stream)
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(got), nan)
    assert np.array_equal(got[~nan].view(np.uint32), expected[~nan].view(np.uint32))


@pytest.mark.gpu
# both sides of a block's width (1024 threads) and of one group of loads (8 columns a thread)
@pytest.mark.parametrize("vocab", [1, 255, 257, 1023, 1025, 4099, 8191, 8193, 49152])
@pytest.mark.parametrize("name", ["float32", "float16", "bfloat16", "int32", "int64", "bool"])
def test_gpu_argmax_ties_go_to_the_lowest_index_at_any_width(cp, stream, vocab, name):
    rng = np.random.default_rng(vocab)
    x = rng.integers(0, 3, size=(5, vocab)).astype(SUPPORTED_DTYPES[name])  # many ties
    if name in ("float32", "float16", "bfloat16"):
        x[1, :] = np.nan
        x[1, vocab - 1] = -np.inf
        x[2, rng.integers(0, vocab, size=vocab // 2)] = np.nan
    host = HostTensorOps(Ledger()).argmax_rows(x, 5)
    assert cuda_ops(cp, stream).argmax_rows(cuda_ops(cp, stream).adopt(x), 5) == host


@pytest.mark.gpu
@pytest.mark.parametrize("name,call,error,field", ERROR_CASES, ids=[c[0] for c in ERROR_CASES])
def test_gpu_error_rules(cp, stream, name, call, error, field):
    ops = cuda_ops(cp, stream)
    with pytest.raises(error) as info:
        call(ops, ops.adopt)
    assert info.value.field == field


@pytest.mark.gpu
def test_gpu_residency_errors_name_both_remedies(cp, stream):
    ops, host = cuda_ops(cp, stream), HostTensorOps(Ledger())
    d = ops.adopt(np.ones((2, 3), np.float32))
    h = np.ones((2, 3), np.float32)
    for call in (lambda: ops.slice_axis(h, 0, 0, 1), lambda: ops.argmax_rows(h, 1),
                 lambda: ops.scatter_into_last_axis(d, 0, h[:, :1]),
                 lambda: ops.gather_rows(h, [0]), lambda: ops.adopt(d),
                 lambda: host.slice_axis(d, 0, 0, 1),
                 lambda: host.gather_rows(h, cp.zeros(1, int))):
        with pytest.raises(ResidencyError) as info:
            call()
        text = str(info.value)
        assert "adopt" in text and "readback" in text and "host tensor ops" in text


@pytest.mark.gpu
def test_gpu_host_ids_are_validated_then_adopted_device_ids_trusted(cp, stream):
    ops = cuda_ops(cp, stream)
    table = ops.adopt(np.arange(12, dtype=np.int32).reshape(4, 3))
    h2d = ops.ledger.h2d_bytes
    with pytest.raises(InputError, match="never clamped"):
        ops.gather_rows(table, [0, 4])
    assert ops.ledger.h2d_bytes == h2d, "refused ids are not adopted"
    out = ops.gather_rows(table, [3, 0])
    assert ops.ledger.h2d_bytes == h2d + 16
    assert cp.asnumpy(out).tolist() == [[9, 10, 11], [0, 1, 2]]
    dev_ids = cp.asarray(np.array([2], np.int32))
    assert cp.asnumpy(ops.gather_rows(table, dev_ids)).tolist() == [[6, 7, 8]]
    with pytest.raises(InputError, match="1-D integer"):
        ops.gather_rows(table, cp.zeros(2, dtype=cp.float32))


@pytest.mark.gpu
def test_gpu_bfloat16_round_trips_bit_exactly(cp, stream):
    ops = cuda_ops(cp, stream)
    bits = np.arange(1 << 16, dtype=np.uint16).reshape(256, 256)
    x = bits.view(ml_dtypes.bfloat16)
    d = ops.adopt(x)
    assert d.dtype == ml_dtypes.bfloat16
    back = ops.slice_axis(d, 1, 3, 100)  # a device-to-device copy
    assert np.array_equal(cp.asnumpy(back).view(np.uint16), bits[:, 3:103])
