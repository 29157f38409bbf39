"""The GEMVs' launchers (``kernels/gemv.cu``): activations [M, K] times a weight ([K, N],
or pre-transposed [N, K]), and the choices of which kernel runs.

- ``gemv_rows``: one warp per output column; lane l accumulates k = l, l+32, ... in float32
  with fused multiply-adds, then a fixed butterfly (``shfl_xor`` 16, 8, 4, 2, 1) adds the 32
  partial sums. The rows of a chunk (at most 16) share each weight load; the chunk's row
  count is a template constant (one instantiation per count, nothing predicated), larger M
  loops over chunks, and a row's arithmetic never depends on where it sits or how many rows
  there are.
- When K is a whole number of 16-byte vectors (``gemv_k_vector_order``), ``gemv_vec`` runs
  instead: runs of 4 float32 or 8 16-bit k per lane, a team of 1, 2 or 4 warps per column
  chosen from N, K and the dtype alone (``gemv_team``), a fixed butterfly per warp and the
  team's warps added in order: one order per (K, N), whatever M, the weight's layout or the
  alignment. A cached [N, K] weight with 16-byte aligned operands (``gemv_vectorised``) is
  loaded 16 bytes at a time; a [K, N] weight element by element, with the same arithmetic.
  One row (a decode step) runs ``gemv_vec1``: the same code without the cases of more rows,
  so fewer registers and more resident blocks.
- ``gemv_vec3`` runs two or three such GEMVs over one x in one launch (the fusion pass's
  q/k/v and gate/up), each weight's blocks exactly as its own launch would run them.
- ``gemv_tile`` takes over for more rows than one chunk (a prefill, ``gemv_tile_rows``): a
  block stages up to 16 rows of x in shared memory once, as float32, and each team of warps
  computes four adjacent columns for all of them at once (an x value read serves four
  columns, a weight value every row); each column's additions are ``gemv_vec``'s, in its
  order, so the bits are too. ``gemv_tile3`` is to ``gemv_tile`` what ``gemv_vec3`` is to
  ``gemv_vec``: a prefill's q/k/v or gate/up in one launch.
"""
from __future__ import annotations

import numpy as np

from engines.errors import ExecutionError
from engines.native.kernel_source import instance, instance_for, module
from engines.native.launch.family import KernelFamily, i64

GEMV_ROWS_PER_CHUNK = 16  # rows that share one pass over the weights
GEMV_WARPS_PER_BLOCK = 4  # output columns per block of 128 threads
# warps of a gemv_tile block (many rows): they share one x tile. 8 (not 16) so that an SM
# holds several blocks and one block's staging of x overlaps another's multiply-adds
GEMV_TILE_WARPS = 8
GEMV_TILE_COLS = 4  # adjacent columns a gemv_tile team computes at once (16 rows x 4: 64 sums)
GEMV_TILE_BYTES = 45 * 1024  # shared memory for a gemv_tile block's rows of x
GEMV_TILE_ITEM = 4  # bytes a staged x value takes: gemv_tile stages x as float32, any dtype
GEMV_DTYPES = ("float32", "float16", "bfloat16")
# what gemv_vec.cuh needs (the GEMVs with a prologue compile it too)
GEMV_DEFINES = {"LK_GEMV_ROWS": GEMV_ROWS_PER_CHUNK, "LK_GEMV_WARPS": GEMV_WARPS_PER_BLOCK}
GEMV_KERNELS = ("gemv_rows", "gemv_vec", "gemv_vec1", "gemv_vec3", "gemv_tile", "gemv_tile3")


def gemv_vectorised(x, w) -> bool:
    """Whether the 16-byte-load GEMV can take x [M, K] and W^T [N, K]: K a whole number of
    16-byte vectors and both base addresses 16-byte aligned (array metadata only)."""
    per = 16 // x.itemsize
    return (x.shape[1] % per == 0 and x.data.ptr % 16 == 0 and w.data.ptr % 16 == 0)


def gemv_tile_rows(m: int, k: int) -> int:
    """Rows of x a ``gemv_tile`` block stages (0: run ``gemv_vec``): only for more rows than
    one chunk (a prefill; decode and verification keep ``gemv_vec``) and only as many as
    ``GEMV_TILE_BYTES`` of shared memory hold as float32, whatever the dtype. The arithmetic
    is the same either way."""
    if m <= GEMV_ROWS_PER_CHUNK:
        return 0
    return min(GEMV_ROWS_PER_CHUNK, GEMV_TILE_BYTES // (k * GEMV_TILE_ITEM))


def gemv_k_vector_order(k: int, itemsize: int) -> bool:
    """Whether a GEMV with inner extent K runs the K-vector order (``gemv_vec``): K a whole
    number of 16-byte vectors. A function of K and the dtype alone, so the weight's layout
    and the operands' alignment change the loads, never the arithmetic."""
    return k % (16 // itemsize) == 0


GEMV_MIN_WARPS = 1024  # warps a GEMV launch should keep busy before its columns share them


def gemv_team(n: int, k: int, itemsize: int) -> int:
    """Warps per output column of the vectorised GEMV: the fewest (1, 2 or 4) that give the
    N columns at least ``GEMV_MIN_WARPS`` warps, so a narrow projection still spreads over
    the GPU while a wide one does not pay for block-wide waits it does not need, and never
    so many that a whole warp has no 16-byte run of K. On the H200 (SmolLM2 decode, float16,
    K = 576) four warps a column cost 6.3 us a q/k/v or gate/up launch, one warp 4.8 us,
    and one warp for the 576-column o projection was slower than four. A function of N, K
    and the dtype (never of M), so the arithmetic of a row is fixed by the weight."""
    runs = -(-k // (16 // itemsize))
    team = 1
    while team < 4 and n * team < GEMV_MIN_WARPS and runs > 32 * (2 * team - 1):
        team *= 2
    return team


class GemvKernels(KernelFamily):
    MODULE = module("gemv.cu", [instance(k, d) for d in GEMV_DTYPES for k in GEMV_KERNELS],
                    GEMV_DEFINES | {"LK_TILE_WARPS": GEMV_TILE_WARPS,
                                    "LK_TILE_COLS": GEMV_TILE_COLS})

    def gemv_rows(self, x, w, out=None, *, stream, w_layout: str = "nk"):
        """out[M, N] = x[M, K] @ W; ``w`` is W as [K, N] (``w_layout="kn"``) or W^T as [N, K]
        (``"nk"``, coalesced: the layout to cache at load time). All C-contiguous, one dtype
        (float32 or float16), accumulated in float32."""
        for array, what in ((x, "x"), (w, "w")):
            self._on_device(array, what)
            self._require_contiguous(array, what)
        if w_layout not in ("kn", "nk"):
            raise ExecutionError("w_layout must be 'kn' or 'nk'", field="w_layout",
                                 value=w_layout, remedy="'nk' for W^T [N, K], 'kn' for W [K, N]")
        if x.ndim != 2 or w.ndim != 2:
            raise ExecutionError("gemv_rows takes a 2-D x and a 2-D w", field="shape",
                                 value=(tuple(x.shape), tuple(w.shape)),
                                 remedy="flatten leading axes of x into rows first")
        if x.dtype != w.dtype:
            raise ExecutionError(f"x is {x.dtype} but w is {w.dtype}", field="dtype",
                                 value=(x.dtype.name, w.dtype.name),
                                 remedy="cast one operand so both share a dtype")
        m, k = x.shape
        n, wk = (w.shape if w_layout == "nk" else w.shape[::-1])
        if wk != k:
            raise ExecutionError(f"x has K={k} but w ({w_layout}) has K={wk}", field="shape",
                                 value=(tuple(x.shape), tuple(w.shape), w_layout),
                                 remedy="pass matching inner extents")
        name = instance_for("gemv_rows", x.dtype, GEMV_DTYPES)
        out = self._out(out, (m, n), x.dtype, stream)
        if m == 0 or n == 0:
            return out
        if gemv_k_vector_order(k, x.itemsize):
            # One arithmetic for every layout and alignment; only the loads differ.
            team = gemv_team(n, k, x.itemsize)
            cols = GEMV_WARPS_PER_BLOCK // team
            nk = w_layout == "nk"
            vec = nk and gemv_vectorised(x, w)
            tile = gemv_tile_rows(m, k) if vec else 0
            if tile:  # many rows: x staged once per block in shared memory, as float32
                cols = GEMV_TILE_WARPS // team * GEMV_TILE_COLS
                self._launcher.launch(
                    self._functions[instance_for("gemv_tile", x.dtype, GEMV_DTYPES)],
                    ((n + cols - 1) // cols, (m + tile - 1) // tile), (32 * GEMV_TILE_WARPS,),
                    (x, w, out, i64(m), i64(k), i64(n), np.int32(team), np.int32(tile)),
                    stream, tile * k * GEMV_TILE_ITEM)
                return out
            # one row: gemv_vec1, the same arithmetic in a third of the registers
            kernel = "gemv_vec1" if m == 1 else "gemv_vec"
            self._launch(instance_for(kernel, x.dtype, GEMV_DTYPES), (n + cols - 1) // cols,
                         32 * GEMV_WARPS_PER_BLOCK,
                         (x, w, out, i64(m), i64(k), i64(n), i64(k if nk else 1),
                          i64(1 if nk else n), np.int32(vec), np.int32(team)), stream)
            return out
        blocks = (n + GEMV_WARPS_PER_BLOCK - 1) // GEMV_WARPS_PER_BLOCK
        self._launch(name, blocks, 32 * GEMV_WARPS_PER_BLOCK,
                     (x, w, out, i64(m), i64(k), i64(n), i64(w_layout == "nk")), stream)
        return out

    def gemv_many(self, x, weights, *, stream):
        """[x @ W_i^T for each W^T_i [N_i, K]] in one launch, two or three weights: each
        output bit for bit ``gemv_rows(x, W^T_i, w_layout="nk")`` (the vectorised path:
        every operand must pass ``gemv_vectorised``, which the caller checks)."""
        if not 2 <= len(weights) <= 3:
            raise ExecutionError("gemv_many takes two or three weights", field="weights",
                                 value=len(weights), remedy="call gemv_rows for one weight")
        self._on_device(x, "x")
        self._require_contiguous(x, "x")
        m, k = x.shape
        for w in weights:
            self._on_device(w, "w")
            self._require_contiguous(w, "w")
            if w.ndim != 2 or w.shape[1] != k or w.dtype != x.dtype \
                    or not gemv_vectorised(x, w):
                raise ExecutionError("a weight does not fit the one-launch GEMV",
                                     field="weights", value=(tuple(w.shape), w.dtype.name),
                                     remedy=f"[N, {k}] {x.dtype.name} weights, 16-byte "
                                            "aligned rows, or one gemv_rows each")
        outs = [self._out(None, (m, w.shape[0]), x.dtype, stream) for w in weights]
        if m == 0:
            return outs
        ws = list(weights) + [weights[-1]] * (3 - len(weights))
        os_ = outs + [outs[-1]] * (3 - len(outs))
        ns = [w.shape[0] for w in weights] + [0] * (3 - len(weights))
        teams = [gemv_team(n, k, x.itemsize) if n else 1 for n in ns]
        tile = gemv_tile_rows(m, k)
        if tile:  # a prefill: each weight's gemv_tile blocks, in one launch
            blocks = [-(-n // (GEMV_TILE_WARPS // t * GEMV_TILE_COLS))
                      for n, t in zip(ns, teams)]
            self._launcher.launch(
                self._functions[instance_for("gemv_tile3", x.dtype, GEMV_DTYPES)],
                (sum(blocks), (m + tile - 1) // tile), (32 * GEMV_TILE_WARPS,),
                (x, *ws, *os_, i64(m), i64(k), *map(i64, ns), *map(np.int32, teams),
                 i64(blocks[0]), i64(blocks[1]), np.int32(tile)),
                stream, tile * k * GEMV_TILE_ITEM)
            return outs
        blocks = [-(-n // (GEMV_WARPS_PER_BLOCK // t)) for n, t in zip(ns, teams)]
        self._launch(instance_for("gemv_vec3", x.dtype, GEMV_DTYPES), sum(blocks),
                     32 * GEMV_WARPS_PER_BLOCK,
                     (x, *ws, *os_, i64(m), i64(k), *map(i64, ns), *map(np.int32, teams),
                      i64(blocks[0]), i64(blocks[1])), stream)
        return outs
