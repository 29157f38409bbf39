"""The launchers of the GEMVs with a prologue (``kernels/prologue_gemv.cu``): a norm's or
SwiGLU's rows staged in shared memory by the standalone kernels' own device functions, then
``gemv_vec``'s column code over them, for decode and verification rows (at most
``PROLOGUE_ROWS``). One launch where there were two, every bit the same; each launcher
answers None where it cannot take the operands, and the caller runs the two steps."""
from __future__ import annotations

import numpy as np

from engines.native.env_switch import switch
from engines.native.kernel_source import instance, module
from engines.native.launch.family import KernelFamily, i64
from engines.native.launch.fused_dtypes import FUSED_DTYPES, fused_dtype
from engines.native.launch.gemv import GEMV_DEFINES, GEMV_WARPS_PER_BLOCK, gemv_team

PROLOGUE_BLOCK = 32 * GEMV_WARPS_PER_BLOCK  # threads of a GEMV block with a prologue
PROLOGUE_BYTES = 40 * 1024  # shared memory for the rows a GEMV's prologue stages
PROLOGUE_ROWS = 8  # rows a GEMV with a prologue takes (decode, verification up to width 7)
assert PROLOGUE_ROWS <= 2 * GEMV_WARPS_PER_BLOCK  # lk_norm_prologue: two rows a warp at most
# LOCKSTEP_WIDE_VERIFY=on: a GEMV with a norm prologue over more than one row (a
# verification) runs in blocks of PROLOGUE_WIDE_WARPS warps, not GEMV_WARPS_PER_BLOCK:
# every block normalises all the rows, so half as many blocks read and normalise them (a
# column's bits are its team's, whichever block it falls to). On by default since the
# H200's round probe (2026-12-05, docs/PERFORMANCE.md): a VERIFY replay 1.092 ms against
# 1.190 with it off, the same tokens; =off gives the blocks of GEMV_WARPS_PER_BLOCK back.
WIDE_ENV = "LOCKSTEP_WIDE_VERIFY"
PROLOGUE_WIDE_WARPS = 8
# (wide, narrow): a GEMV with a prologue in dtype `narrow` whose norm keeps its residual
# stream (or whose SwiGLU computes) in `wide`: uniform graphs, and mixed ones over float32
PROLOGUE_PAIRS = tuple(sorted({(d, d) for d in FUSED_DTYPES}
                              | {("float32", d) for d in FUSED_DTYPES}))


def wide_verify_requested() -> bool:
    """``LOCKSTEP_WIDE_VERIFY``: on or off (``env_switch``; default on)."""
    return switch(WIDE_ENV, default=True)


def with_warps(name: str, warps: int) -> str:
    """The name expression of a norm prologue's instance ``name`` (its dtypes) in blocks of
    ``warps`` warps: its last template argument, always spelled (nvcc's entry names spell
    every argument, so a default one would not match the name the launcher calls)."""
    return f"{name[:-1]}, {warps}>"


def prologue_rows(x) -> int:
    """The rows of x [..., K] if a GEMV with a prologue takes that many (1 to
    PROLOGUE_ROWS), else 0."""
    k = x.shape[-1]
    rows = x.size // k if k else 0
    return rows if 0 < rows <= PROLOGUE_ROWS else 0


def _norm_instances(wide: str, narrow: str) -> list[str]:
    """The norm prologues' instances for one of PROLOGUE_PAIRS' dtype pairs (their warps
    not yet spelled: ``with_warps``)."""
    return [instance("norm_gemv", wide, narrow, narrow), instance("norm_glu", wide, narrow, wide)]


class PrologueGemvKernels(KernelFamily):
    # the graphs' own combinations only (each GEMV is large): the residual stream in the
    # GEMV's dtype or in float32 (a mixed graph), the delta and the output in the GEMV's;
    # the norm prologues also in blocks of PROLOGUE_WIDE_WARPS (LOCKSTEP_WIDE_VERIFY)
    MODULE = module("prologue_gemv.cu",
                    [name for wide, narrow in PROLOGUE_PAIRS
                     for name in (instance("swiglu_gemv", narrow, wide, narrow),
                                  *(with_warps(n, warps) for n in _norm_instances(wide, narrow)
                                    for warps in (GEMV_WARPS_PER_BLOCK, PROLOGUE_WIDE_WARPS)))],
                    GEMV_DEFINES | {"LK_PROLOGUE_ROWS": PROLOGUE_ROWS})

    WIDE_VERIFY: bool | None = None  # None: LOCKSTEP_WIDE_VERIFY decides (program_family: off)

    def _warps(self, rows: int) -> int:
        """The warps of a norm prologue's block for ``rows`` rows: PROLOGUE_WIDE_WARPS for
        more than one where ``WIDE_VERIFY``, else ``LOCKSTEP_WIDE_VERIFY``, says so (read
        once per family)."""
        if rows == 1:
            return GEMV_WARPS_PER_BLOCK
        if self.WIDE_VERIFY is not None:
            return PROLOGUE_WIDE_WARPS if self.WIDE_VERIFY else GEMV_WARPS_PER_BLOCK
        wide = self.__dict__.get("_wide_verify")
        if wide is None:
            wide = self.__dict__["_wide_verify"] = wide_verify_requested()
        return PROLOGUE_WIDE_WARPS if wide else GEMV_WARPS_PER_BLOCK

    def _prologue_fits(self, rows: int, k: int, dtype, weights) -> bool:
        """Whether a GEMV with a prologue takes these operands: decode or verify rows (at most
        PROLOGUE_ROWS), their staged copy within ``PROLOGUE_BYTES``, every weight a C-contiguous
        [N, K] of the staged dtype with 16-byte aligned rows."""
        itemsize = np.dtype(dtype).itemsize
        return (0 < rows <= PROLOGUE_ROWS and rows * k * itemsize <= PROLOGUE_BYTES
                and (k * itemsize) % 16 == 0
                and all(w.ndim == 2 and w.shape[1] == k and w.dtype == dtype
                        and w.flags.c_contiguous and w.data.ptr % 16 == 0 for w in weights))

    def _norm_operands(self, residual, delta, gain, out_dtype, weights, stream):
        """A norm prologue's operands, contiguous, and the sum's output (None without a
        delta): (residual, delta, total, rows, k), or None where a GEMV with a norm
        prologue cannot take them."""
        k = residual.shape[-1]
        rows = prologue_rows(residual)
        for value, what in ((residual, "residual"), (gain, "gain")):
            self._check(value, what)
        if delta is not None:
            self._check(delta, "delta")
        if gain.shape != (k,) or gain.dtype != residual.dtype \
                or (delta is not None and (delta.shape != residual.shape
                                           or delta.dtype != out_dtype)) \
                or not self._prologue_fits(rows, k, out_dtype, weights):
            return None
        residual = self._contiguous(residual, stream)
        total = None
        if delta is not None:
            delta = self._contiguous(delta, stream)
            total = self._empty(residual.shape, residual.dtype, stream)
        return residual, delta, total, rows, k

    def norm_gemv(self, residual, delta, gain, eps: float, out_dtype, weights, *, stream):
        """RMSNorm of residual (+ delta) [..., K] followed by ``x @ W_i^T`` for each cached
        [N_i, K] weight (one to three) in one launch: (the sum when delta is given, then)
        each product [..., N_i], bit for bit ``add_rms_norm``/``rms_norm`` then
        ``gemv_many``/``gemv_rows``. None where the launch cannot take the operands (the
        caller runs the two steps)."""
        if not prologue_rows(residual):
            return None  # decided first: a prefill's every norm asks
        narrow = fused_dtype(out_dtype, "out")
        name = instance("norm_gemv", fused_dtype(residual.dtype, "residual"), narrow, narrow)
        if not 1 <= len(weights) <= 3 \
                or with_warps(name, GEMV_WARPS_PER_BLOCK) not in self._functions:
            return None
        operands = self._norm_operands(residual, delta, gain, out_dtype, weights, stream)
        if operands is None:
            return None
        residual, delta, total, rows, k = operands
        warps = self._warps(rows)
        lead = tuple(residual.shape[:-1])
        outs = [self._empty(lead + (w.shape[0],), out_dtype, stream) for w in weights]
        itemsize = np.dtype(out_dtype).itemsize
        ws = list(weights) + [weights[-1]] * (3 - len(weights))
        os_ = outs + [outs[-1]] * (3 - len(outs))
        ns = [w.shape[0] for w in weights] + [0] * (3 - len(weights))
        teams = [gemv_team(n, k, itemsize) if n else 1 for n in ns]
        blocks = [-(-n // (warps // t)) for n, t in zip(ns, teams)]
        null = np.uint64(0)
        self._launcher.launch(
            self._functions[with_warps(name, warps)], (sum(blocks),), (32 * warps,),
            (residual, null if delta is None else delta, self._contiguous(gain, stream),
             null if total is None else total, np.float32(eps), *ws, *os_, i64(rows),
             i64(k), *map(i64, ns), *map(np.int32, teams), i64(blocks[0]),
             i64(blocks[1])),
            stream, rows * k * itemsize)
        return ((total,) if total is not None else ()) + tuple(outs)

    def norm_glu(self, residual, delta, gain, eps: float, out_dtype, weights, compute_dtype,
                 glu_dtype, *, stream):
        """RMSNorm of residual (+ delta) [..., K], then ``x @ Wg^T`` and ``x @ Wu^T`` for the
        cached [N, K] gate and up weights, then SwiGLU of the pair computed in
        ``compute_dtype``, in one launch: (the sum when delta is given, then) the SwiGLU
        [..., N] as ``glu_dtype``, bit for bit ``norm_gemv`` then ``swiglu``. None where the
        launch cannot take the operands: SwiGLU's output in another dtype than the
        projections', a team of four warps a column, or no instance for the dtypes."""
        if not prologue_rows(residual) or len(weights) != 2 \
                or weights[0].shape != weights[1].shape \
                or np.dtype(glu_dtype) != np.dtype(out_dtype):
            return None
        name = instance("norm_glu", fused_dtype(residual.dtype, "residual"),
                        fused_dtype(out_dtype, "out"), fused_dtype(compute_dtype, "compute"))
        if with_warps(name, GEMV_WARPS_PER_BLOCK) not in self._functions:
            return None
        itemsize = np.dtype(out_dtype).itemsize
        n, k = weights[0].shape
        team = gemv_team(n, k, itemsize)  # the team norm_gemv gives each of the two
        if team > GEMV_WARPS_PER_BLOCK // 2:
            return None
        operands = self._norm_operands(residual, delta, gain, out_dtype, weights, stream)
        if operands is None:
            return None
        residual, delta, total, rows, k = operands
        warps = self._warps(rows)
        out = self._empty(tuple(residual.shape[:-1]) + (n,), out_dtype, stream)
        pairs = warps // 2 // team
        null = np.uint64(0)
        self._launcher.launch(
            self._functions[with_warps(name, warps)], (-(-n // pairs),), (32 * warps,),
            (residual, null if delta is None else delta, self._contiguous(gain, stream),
             null if total is None else total, np.float32(eps), weights[0], weights[1], out,
             i64(rows), i64(k), i64(n), np.int32(team)),
            stream, rows * k * itemsize)
        return ((total,) if total is not None else ()) + (out,)

    def swiglu_gemv(self, gate, up, compute_dtype, out_dtype, weight, *, stream):
        """``swiglu(gate, up) @ W^T`` for a cached [N, K] weight in one launch, bit for bit
        ``swiglu`` then ``gemv_rows``; None where the launch cannot take the operands."""
        k = gate.shape[-1]
        rows = prologue_rows(gate)
        if not rows:
            return None  # decided first: a prefill's every layer asks
        self._check(gate, "gate")
        self._check(up, "up")
        if up.shape != gate.shape or up.dtype != gate.dtype \
                or not self._prologue_fits(rows, k, out_dtype, [weight]):
            return None
        name = instance("swiglu_gemv", fused_dtype(gate.dtype, "gate"),
                        fused_dtype(compute_dtype, "compute"), fused_dtype(out_dtype, "out"))
        if name not in self._functions:
            return None
        gate, up = self._contiguous(gate, stream), self._contiguous(up, stream)
        n = weight.shape[0]
        out = self._empty(tuple(gate.shape[:-1]) + (n,), out_dtype, stream)
        itemsize = np.dtype(out_dtype).itemsize
        team = gemv_team(n, k, itemsize)
        # gate and up in 16-byte loads where both are aligned and whole vectors
        gvec = (gate.size * gate.itemsize) % 16 == 0 and gate.data.ptr % 16 == 0 \
            and up.data.ptr % 16 == 0
        self._launcher.launch(
            self._functions[name], (-(-n // (GEMV_WARPS_PER_BLOCK // team)),),
            (PROLOGUE_BLOCK,),
            (gate, up, weight, out, i64(rows), i64(k), i64(n), np.int32(team),
             np.int32(gvec)), stream, rows * k * itemsize)
        return out
