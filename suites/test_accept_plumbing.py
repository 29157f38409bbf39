"""``CudaTensorOps``' accept, its Python side checked without a GPU: the kernel
(``lockstep_accept_rows``, ``engines/tensor_ops/kernels/argmax.cu``) is replaced by a numpy
model of what it computes from the arguments it is given, so what is tested is what the
Python passes it: the rows, the head row (a shifted round) or none, and where the drafts start
in the verification's tokens feed (after the pending token, or at once with a head). The
kernel itself runs in the GPU suite (``suites/test_speculative_cuda.py``) and, here, on the
CPU emulator (``engines/native/emulation``): the same checks with the real kernel in place of
the model, in float32, float16 and bfloat16."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest

from engines.dtypes import dtype_of
from engines.ledger import Ledger
from engines.native.emulation.cpu_module import CpuModule
from engines.tensor_ops.base import TensorOps
from engines.tensor_ops.cuda import _BITS_AS, ARGMAX_MODULES, CudaTensorOps
from engines.tensor_ops.host import HostTensorOps
from suites.support import accept_case


class _Readable(np.ndarray):
    """A host array read the way the ops read a device one (``get(stream, out, blocking)``)."""

    def get(self, stream=None, out=None, blocking=True):
        out[...] = self
        return out


class _Event:
    def record(self, stream=None):
        pass

    def synchronize(self):
        pass


def _model_of_accept_rows(grid, block, args):
    """What the kernel computes: block b takes the argmax of row b (with a head, row 0 is the
    head and row b > 0 is x's row b - 1); the accepted prefix against ``drafts``, and the
    argmax of the first row past it."""
    x, row_stride, cols, head, drafts, width, best, done, out, _vec = args
    flat, cols, width = x.reshape(-1), int(cols), int(width)
    has_head = not (isinstance(head, np.integer) and int(head) == 0)
    for b in range(grid[0]):
        r = b - 1 if has_head else b
        row = head.reshape(-1)[:cols] if r < 0 else flat[r * int(row_stride):][:cols]
        best[b] = -1 if np.isnan(row).all() else int(np.nanargmax(row))
    n = 0
    while n < width and int(best[n]) == int(drafts[n]):
        n += 1
    out[0], out[1] = n, best[n]


class _ModelledCudaOps(CudaTensorOps):
    """CudaTensorOps on host arrays, its accept kernel modelled (see the module doc)."""

    def __init__(self):
        TensorOps.__init__(self, Ledger())
        self.residency, self.stream, self._accept_buffers = "host", None, None

    @contextlib.contextmanager
    def on_stream(self):
        yield

    def _argmax_kernel(self, logits2d, instance):
        assert instance == 1  # the accept's instance
        return _model_of_accept_rows

    def _adopt(self, host_array):
        return np.ascontiguousarray(host_array)

    def _accept_scratch(self, rows):
        return {"best": np.empty((max(rows, 16),), np.int32),
                "done": np.zeros((1,), np.uint32),
                "out": np.empty((2,), np.int32).view(_Readable),
                "no_drafts": np.zeros((1,), np.int64), "host": np.empty((2,), np.int32),
                "event": _Event()}


class _EmulatedKernelOps(_ModelledCudaOps):
    """The same ops with ``lockstep_accept_rows`` itself, run on the CPU emulator."""

    def _argmax_kernel(self, logits2d, instance):
        assert instance == 1
        module = ARGMAX_MODULES[np.dtype(logits2d.dtype).name]
        return CpuModule(module, [module.instances[1]]).functions()[module.instances[1]]


@pytest.mark.claim("token_identity")
@pytest.mark.parametrize("width", [1, 3, 7])
@pytest.mark.parametrize("kernel,dtype", [("model", "float32"), ("emulated", "float32"),
                                          ("emulated", "float16"), ("emulated", "bfloat16")])
def test_the_accept_is_handed_its_rows_head_and_drafts_where_they_are(width, kernel, dtype):
    ops = _ModelledCudaOps() if kernel == "model" else _EmulatedKernelOps()
    host = HostTensorOps(Ledger())
    rng = np.random.default_rng(width)
    for _ in range(12):
        rows, drafts, agreed = accept_case(rng, width, 64)
        rows = rows.astype(dtype_of(dtype))
        want = host.accept_drafts(rows, drafts)
        assert want[0] == agreed
        # classic: the feed holds the pending token first, the drafts after it
        assert ops.accept_drafts(rows, drafts, fed=np.array([[9] + drafts])) == want
        assert ops.accept_drafts(rows, drafts) == want  # drafts adopted
        # shifted: the head row apart, the feed the drafts alone
        head, rest = rows[:1].copy(), rows[1:].copy()
        assert ops.accept_drafts(rest, drafts, fed=np.array([drafts]), head=head) == want
    assert ops.ledger.readback_bytes["accept_count"] == 4 * 3 * 12


def test_the_model_catches_drafts_read_from_the_wrong_place(monkeypatch):
    """Planted: the drafts read one place late in a shifted round's feed (as if the pending
    token were still first) give another accept, so the test above can fail."""
    ops = _ModelledCudaOps()
    rows = np.eye(4, 8, dtype=np.float32)  # row i's argmax is i
    drafts = [0, 1, 2]  # all accepted: rows 0..2 agree, the bonus is row 3's argmax
    assert ops.accept_drafts(rows[1:], drafts, fed=np.array([drafts]), head=rows[:1]) == (3, 3)
    real = CudaTensorOps._accept

    def one_late(self, logits2d, drafts, fed=None, head=None):
        fed = np.concatenate([fed.reshape(-1), [0]])[1:] if head is not None else fed
        return real(self, logits2d, drafts, fed, head)

    monkeypatch.setattr(CudaTensorOps, "_accept", one_late)
    assert ops.accept_drafts(rows[1:], drafts, fed=np.array([drafts]), head=rows[:1]) != (3, 3)


def _emulated_argmax_rows(dtype: str):
    module = ARGMAX_MODULES[dtype]
    return CpuModule(module, [module.instances[0]]).functions()[module.instances[0]]


def _numpy_argmax(row: np.ndarray) -> int:
    """The lowest index of the row's largest value, NaN skipped; -1 for an all-NaN row."""
    values = row.astype(np.float64)
    return -1 if np.isnan(values).all() else int(np.nanargmax(values))


@pytest.mark.claim("token_identity")
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("vec", [1, 0], ids=["runs", "columns"])
def test_the_row_argmax_reads_runs_or_columns_and_finds_the_same_id(dtype, vec):
    """``lockstep_argmax_rows`` on the CPU emulator, in 16-byte runs (``vec``: the rows start
    on 16 bytes) and one column at a time: widths on both sides of a run, of a thread's batch
    of runs and of the block's, ties (the lowest index wins), NaNs (skipped), an all-NaN row
    (-1), each against numpy."""
    kernel = _emulated_argmax_rows(dtype)
    rng = np.random.default_rng(7)
    np_type = dtype_of(dtype)
    for cols in (1, 7, 8, 9, 64, 1027, 8 * 1024 * 8 + 13):
        rows = rng.integers(-50, 50, size=(3, cols)).astype(np_type)  # many ties
        rows[1, rng.integers(0, cols, size=max(1, cols // 5))] = np.nan
        rows[2, :] = np.nan
        if cols > 9:  # the largest more than once: the first is the answer, whether a
            # thread meets the others in its run (6), its columns (5 + 1024) or another's
            rows[0, [5, 6, cols - 1] + ([5 + 1024] if cols > 1029 else [])] = 60
        stride = cols + (-cols) % 8  # rows that start on 16 bytes
        padded = np.zeros((3, stride), np_type)
        padded[:, :cols] = rows
        x = padded.view(_BITS_AS.get(dtype, np_type))
        assert x.__array_interface__["data"][0] % 16 == 0
        out = np.full((3,), -7, np.int32)
        feed = np.zeros((3,), np.int64)
        kernel((3,), (1024,), (x, np.int64(stride), np.int32(cols), out, feed, np.int32(vec)))
        want = [_numpy_argmax(r) for r in rows]
        assert out.tolist() == want and feed.tolist() == want, (cols, vec)


def test_a_row_that_does_not_start_on_16_bytes_is_read_column_by_column():
    """What the launcher passes as ``vec``: a row view one element in, or rows whose stride
    is not a whole number of runs, are read a column at a time."""
    rows = np.zeros((2, 40), np.float16)
    assert CudaTensorOps._runs_fit(rows, np.int64(40))
    assert not CudaTensorOps._runs_fit(rows[:, 1:], np.int64(40))
    assert not CudaTensorOps._runs_fit(np.zeros((2, 41), np.float16), np.int64(41))
    assert CudaTensorOps._runs_fit(np.zeros((1, 41), np.float16), np.int64(0))
