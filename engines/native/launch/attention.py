"""Attention's launchers (``kernels/attention.cu``): q [1, H, M, D] against a static cache's
keys and values, a block per (head, query) pair (``attention``), up to ``ATTENTION_ROWS``
rows of a head a block in a prefill (``attention_rows``), and a decode's rotation and cache
write in the same launch (``rotary_kv_attention``). The query at position p reads key slots
0..p and no others; its order over keys depends only on the key index, so a verify row and
a decode at the same position do the same arithmetic."""
from __future__ import annotations

import numpy as np

from engines.errors import ExecutionError
from engines.native.kernel_source import instance, module
from engines.native.launch.family import KernelFamily, ceil_div, elem_strides, i64
from engines.native.launch.fused_dtypes import every_instance, fused_dtype
from engines.native.launch.kv_write import runs_fit
from engines.native.launch.prologue_gemv import PROLOGUE_PAIRS, PROLOGUE_ROWS
from engines.native.launch.rotary import table_strides

ATTENTION_BLOCK = 256  # threads per (head, query) block: a key each, for up to 256 keys
ATTENTION_MAX_HEAD_DIM = 512
ATTENTION_SMEM_KEYS = 4096  # caches of up to this many slots keep their scores in shared memory
ATTENTION_ROWS = 8  # most rows attention_rows (a prefill) takes a block
# dynamic shared memory of an attention_rows block, in floats (its rows' q and scores): under
# the 48 KiB a launch takes without an opt-in, beside the static part and reduction buffers
ATTENTION_ROWS_SMEM_FLOATS = 9 * 1024
ROTARY_ATTENTION_MAX_ROWS = 8  # rows rotary_kv_attention takes (decode, verification)
ROTARY_ATTENTION_MAX_HEAD_DIM = 128  # its staged new rows: 8 x 128 keys and values, 8 KiB


def attention_module(block: int):
    """``attention.cu`` for blocks of ``block`` threads (``LK_ATT_BLOCK``): every order over
    keys follows the block size, so each module's launches agree with each other only."""
    return module(
        "attention.cu",
        every_instance("attention", 2) + every_instance("attention_rows", 2)
        # the graphs' own combinations: x and caches narrow, the math wide
        + [instance("rotary_kv_attention", narrow, wide, narrow)
           for wide, narrow in PROLOGUE_PAIRS],
        {"LK_ATT_MAX_D": ATTENTION_MAX_HEAD_DIM, "LK_ATT_BLOCK": block,
         "LK_ATT_SMEM_KEYS": ATTENTION_SMEM_KEYS, "LK_ATT_ROWS": ATTENTION_ROWS,
         "LK_RKA_MAX_D": ROTARY_ATTENTION_MAX_HEAD_DIM,
         "LK_RKA_MAX_M": ROTARY_ATTENTION_MAX_ROWS})


class AttentionKernels(KernelFamily):
    MODULE = attention_module(ATTENTION_BLOCK)
    BLOCK = ATTENTION_BLOCK  # threads of every attention launch: the module's LK_ATT_BLOCK

    def attention(self, q, k, v, positions, kv_heads: int, group: int, scale, score_dtype,
                  *, stream):
        """q [1, H, M, D] (any strides), k/v [1, kv_heads, T, D] -> [1, M, H * D]."""
        for value, what in ((q, "q"), (k, "k_all"), (v, "v_all")):
            self._check(value, what)
        _, heads, m, d = q.shape
        t = k.shape[2]
        if heads != kv_heads * group or k.shape != (1, kv_heads, t, d) or v.shape != k.shape:
            raise ExecutionError("attention operands do not match the recognised heads",
                                 field="k_all", value=(tuple(q.shape), tuple(k.shape),
                                                       tuple(v.shape)),
                                 remedy=f"q [1, {kv_heads * group}, M, D], k/v "
                                        f"[1, {kv_heads}, T, D]")
        if d > ATTENTION_MAX_HEAD_DIM:
            raise ExecutionError("head_dim is larger than the fused attention takes",
                                 field="head_dim", value=d,
                                 remedy=f"at most {ATTENTION_MAX_HEAD_DIM}, or fuse=False")
        if not (q.dtype == k.dtype == v.dtype):
            raise ExecutionError("q, k and v differ in dtype", field="dtype",
                                 value=(q.dtype.name, k.dtype.name, v.dtype.name),
                                 remedy="cast them to one dtype")
        pos = self._positions(positions, m, stream)
        kinds = (fused_dtype(q.dtype, "q"), fused_dtype(score_dtype, "scores"))
        name = instance("attention", *kinds)
        k, v = self._contiguous(k, stream), self._contiguous(v, stream)
        out = self._empty((1, m, heads * d), q.dtype, stream)
        if out.size == 0:
            return out
        # key and value rows in 16-byte loads where each row is whole vectors and both caches
        # are aligned
        kvec = (d * k.itemsize) % 16 == 0 and k.data.ptr % 16 == 0 and v.data.ptr % 16 == 0
        qs = elem_strides(q)[1:]
        rows = min(ATTENTION_ROWS, ATTENTION_ROWS_SMEM_FLOATS // (t + d))
        if kvec and m > PROLOGUE_ROWS and rows >= 2:  # a prefill: rows share key loads
            self._launcher.launch(
                self._functions[instance("attention_rows", *kinds)],
                (heads * -(-m // rows),), (self.BLOCK,),
                (q, k, v, pos, out, i64(heads), i64(m), i64(t), i64(d), i64(group),
                 *map(i64, qs), np.int32(scale is not None),
                 np.float32(0.0 if scale is None else scale), np.int32(rows)),
                stream, rows * (d + t) * 4)
            return out
        # scores in global scratch only for caches longer than the shared array holds
        scratch = self._empty((heads * m * t if t > ATTENTION_SMEM_KEYS else 1,),
                              np.float32, stream)
        groups = self.BLOCK // d if d <= self.BLOCK else 1
        self._launch(name, heads * m, self.BLOCK,
                     (q, k, v, pos, out, scratch, i64(heads), i64(m), i64(t), i64(d),
                      i64(group), *map(i64, qs), np.int32(scale is not None),
                      np.float32(0.0 if scale is None else scale), np.int32(groups),
                      np.int32(kvec)), stream)
        return out

    def rotary_kv_attention(self, xq, xk, cos, sin, layout: str, compute_dtype, scale_q,
                            scale_k, out_dtype, old_k, old_v, new_v, positions, kv_heads: int,
                            group: int, scale, score_dtype, *, stream):
        """``rotary_kv`` then ``attention`` over its rotated queries and caches, in one launch:
        (key cache, value cache, attention output), bit for bit the two launches'. None where
        one launch cannot take the operands: more than ROTARY_ATTENTION_MAX_ROWS rows (a
        prefill), a head wider than ROTARY_ATTENTION_MAX_HEAD_DIM, a cache longer than the
        scores' shared memory, scores in another dtype than the rotation's, caches the
        16-byte loads cannot read (the caller runs the two)."""
        if xq.ndim != 4 or xk.ndim != 4 or old_k.ndim != 4 \
                or not 0 < xq.shape[2] <= ROTARY_ATTENTION_MAX_ROWS:
            return None  # decided first: a prefill's every layer asks
        for value, what in ((xq, "xq"), (xk, "xk"), (cos, "cos"), (sin, "sin"),
                            (old_k, "old_k"), (old_v, "old_v"), (new_v, "new_v")):
            self._check(value, what)
        _, hq, m, d = xq.shape
        b, hk, _, _ = xk.shape
        t = old_k.shape[2]
        dtype = np.dtype(out_dtype)
        name = instance("rotary_kv_attention", fused_dtype(xq.dtype, "x"),
                        fused_dtype(compute_dtype, "cos"), fused_dtype(dtype, "out"))
        fits = (name in self._functions and b == 1
                and np.dtype(score_dtype) == np.dtype(compute_dtype)
                and 0 < m <= ROTARY_ATTENTION_MAX_ROWS and d <= ROTARY_ATTENTION_MAX_HEAD_DIM
                and t <= ATTENTION_SMEM_KEYS and hq == kv_heads * group and hk == kv_heads
                and (d * dtype.itemsize) % 16 == 0 and new_v.ndim == 4
                and new_v.strides[3] == dtype.itemsize)
        if not fits:
            return None
        old_k, old_v = self._contiguous(old_k, stream), self._contiguous(old_v, stream)
        if old_k.data.ptr % 16 or old_v.data.ptr % 16:
            return None
        tables = table_strides(cos, sin, tuple(xq.shape))
        if tables != table_strides(cos, sin, tuple(xk.shape)):
            return None
        per = 16 // dtype.itemsize
        if not all(runs_fit(x, per) for x in (old_k, old_v, new_v)):
            return None
        pos = self._positions(positions, m, stream)
        cache_k = self._empty(old_k.shape, dtype, stream)
        cache_v = self._empty(old_v.shape, dtype, stream)
        out = self._empty((1, m, hq * d), dtype, stream)
        runs_k, runs_v = cache_k.size // per, cache_v.size // per
        _, vh, vm, _ = elem_strides(new_v)
        self._launch(name, hq * m + ceil_div(runs_k + runs_v, self.BLOCK), self.BLOCK,
                     (xq, i64(hq), *map(i64, elem_strides(xq)),
                      np.int32(scale_q is not None),
                      np.float32(0.0 if scale_q is None else scale_q),
                      xk, i64(hk), *map(i64, elem_strides(xk)), np.int32(scale_k is not None),
                      np.float32(0.0 if scale_k is None else scale_k),
                      cos, sin, i64(m), i64(d), *map(i64, tables),
                      np.int32(layout == "pairs"), old_k, cache_k, i64(runs_k), old_v, new_v,
                      cache_v, i64(runs_v), i64(old_v.shape[1]), i64(0), i64(vh),
                      i64(vm), pos, i64(t), i64(group), np.int32(scale is not None),
                      np.float32(0.0 if scale is None else scale), out), stream)
        return cache_k, cache_v, out
