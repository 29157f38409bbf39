"""CUDA kernels for the ``lockstep.fused`` nodes (``ops/fused.py``), one launch per node.

Written against ``cuda_kernels``' prelude (storage types with ``lk_load``/``lk_store``), its
type table and compile options, so a storage type added there is one more instance here.
``lk_round(T, v)`` rounds a float through storage type T and back: the kernels round where
the unfused graph stores a value in a narrower dtype, so a float16 graph's chain of
float16 ops keeps its roundings; only reduction orders differ from the host.

Every kernel is batch-invariant (a row's arithmetic depends on its own operands only: one
warp per norm row, one block per (head, query) pair, fixed strides and fixed trees) and
capture-safe (shapes from metadata, positions read on the device, outputs and
scratch from the current allocator on the backend's stream, no host synchronisation).

The GEMVs with a prologue (``norm_gemv``, ``swiglu_gemv``) stage a norm's or SwiGLU's rows in
shared memory with the standalone kernels' own device functions, then run ``gemv_vec``'s
column code (``cuda_kernels.gemv_vec_device_source``) over them: one launch where there were
two, every bit the same.
Attention reads key slots 0..p for the query at position p and no others; its order over
keys depends only on the key index, so a verify row and a decode at the same position do
the same arithmetic.
"""
from __future__ import annotations

import functools
import itertools
import re
from string import Template

import numpy as np

from engines.errors import ExecutionError, ResidencyError
from engines.native.cuda_kernels import (_TYPES, COMPILE_OPTIONS, GEMV_WARPS_PER_BLOCK,
                                         _elem_strides, gemv_team, gemv_vec_defines,
                                         gemv_vec_device_source, prelude)
from engines.native.dtype_names import dtype_name
from engines.native.kernel_launch import KernelLauncher, note_allocation

FUSED_DTYPES = tuple(d for d in ("float32", "float16", "bfloat16") if d in _TYPES)
BLOCK = 256  # threads for the elementwise kernels
NORM_ROWS_PER_BLOCK = 4  # a norm kernel's block: one warp a row (lk_norm_row)
PROLOGUE_BLOCK = 32 * GEMV_WARPS_PER_BLOCK  # threads of a GEMV block with a prologue
PROLOGUE_BYTES = 40 * 1024  # shared memory for the rows a GEMV's prologue stages
PROLOGUE_ROWS = 8  # rows a GEMV with a prologue takes (decode, verification up to width 7)
assert PROLOGUE_ROWS <= 2 * GEMV_WARPS_PER_BLOCK  # lk_norm_prologue: two rows a warp at most
# (wide, narrow): a GEMV with a prologue in dtype `narrow` whose norm keeps its residual
# stream (or whose SwiGLU computes) in `wide`: uniform graphs, and mixed ones over float32
PROLOGUE_PAIRS = tuple(sorted({(d, d) for d in FUSED_DTYPES}
                              | {("float32", d) for d in FUSED_DTYPES}))
ATTENTION_BLOCK = 256  # threads per (head, query) block: a key each, for up to 256 keys
ATTENTION_MAX_HEAD_DIM = 512
ATTENTION_SMEM_KEYS = 4096  # caches of up to this many slots keep their scores in shared memory
ATTENTION_ROWS = 8  # most rows attention_rows (a prefill) takes a block
# dynamic shared memory of an attention_rows block, in floats (its rows' q and scores): under
# the 48 KiB a launch takes without an opt-in, beside the static part and reduction buffers
ATTENTION_ROWS_SMEM_FLOATS = 9 * 1024
ROTARY_ATTENTION_MAX_ROWS = 8  # rows rotary_kv_attention takes (decode, verification)
ROTARY_ATTENTION_MAX_HEAD_DIM = 128  # its staged new rows: 8 x 128 keys and values, 8 KiB

_COMMON = r"""
// ---- lockstep fused kernels: shared helpers ----
// A fixed tree over a block: butterfly inside each warp, then warp 0 adds the warps'
// partials in index order. Every thread gets the result.
__device__ __forceinline__ float lk_block_sum(float v, float* smem) {
    v = lk_warp_sum(v);
    const int warps = blockDim.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float total = 0.0f;
        for (int w = 0; w < warps; ++w) total += smem[w];
        smem[32] = total;
    }
    __syncthreads();
    return smem[32];
}

// Element idx of a cache [B, H, C, D]: its batch *b, head *h and channel *d, and the row of
// this forward that writes its slot (the last m with pos[m] == the slot), or -1: what every
// static-cache write asks of each element or 16-byte run it stores.
__device__ __forceinline__ long long lk_cache_slot(long long idx, long long H, long long C,
                                                   long long D,
                                                   const long long* __restrict__ pos,
                                                   long long M, long long* b, long long* h,
                                                   long long* d) {
    *d = idx % D;
    long long t = idx / D;
    const long long c = t % C;
    t /= C;
    *h = t % H;
    *b = t / H;
    long long hit = -1;
    for (long long m = 0; m < M; ++m) if (pos[m] == c) hit = m;
    return hit;
}

__device__ __forceinline__ float lk_block_max(float v, float* smem) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    const int warps = blockDim.x >> 5;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) smem[threadIdx.x >> 5] = v;
    __syncthreads();
    if (threadIdx.x == 0) {
        float m = smem[0];
        for (int w = 1; w < warps; ++w) m = fmaxf(m, smem[w]);
        smem[32] = m;
    }
    __syncthreads();
    return smem[32];
}
"""

_ROUND = r"""
// v rounded to $T's precision (identity for float)
__device__ __forceinline__ float lk_round(const $T*, float v) {
    $T t;
    lk_store(&t, 0, v);
    return lk_load(&t, 0);
}
"""

_SOFTMAX = r"""
// A block's softmax of its scores s[0, L) in place (mx: this thread's largest score), for
// attention and the fused rotary attention alike: the block's max, each exponential in TC,
// a sum whose order depends on j only (thread j % blockDim, then the block tree), and each
// probability rounded to TC, then to T. o and c are lk_round's tags for T and TC.
template <typename T, typename TC>
__device__ __forceinline__ void lk_softmax_block(float* s, long long L, float mx, float* smem,
                                                 int tid, const T* o, const TC* c) {
    mx = lk_block_max(mx, smem);
    float acc = 0.0f;
    for (long long j = tid; j < L; j += blockDim.x) {
        const float e = lk_round(c, expf(lk_round(c, s[j] - mx)));
        s[j] = e;
        acc += e;
    }
    const float total = lk_round(c, lk_block_sum(acc, smem));
    for (long long j = tid; j < L; j += blockDim.x) s[j] = lk_round(o, lk_round(c, s[j] / total));
}
"""

_NORM_ROW = r"""
// P rows of n by one warp, row p at res + p * stride (delta, sum_out and out likewise):
// lane l takes i = l, l + 32, ...; a fixed butterfly adds the lanes. s = res (+ delta read
// as $TD, the folded Cast up, the sum rounded to $TI when delta is given), stored to sum_out
// when given; then y = s * (1 / sqrt(mean(s * s) + eps)) * gain, rounded to $TI after each
// op as the unfused graph stores it, stored as $TO (the folded Cast) to out, in global or
// shared memory. The second pass recomputes s exactly as the first stored it. The rows of
// one warp only share the loop (their loads overlap); each row's arithmetic is its own, so
// rms_norm, add_rms_norm and the GEMVs with a norm prologue give a row the same bits
// whichever of them ran it, with however many rows and rows a warp.
template <int P>
__device__ __forceinline__ void lk_norm_rows_${SI}_${SD}_${SO}(
        const $TI* __restrict__ res, const $TD* __restrict__ delta,
        const $TI* __restrict__ gain, $TI* __restrict__ sum_out, $TO* out, long long n,
        long long stride, float eps, int lane) {
    const $TI* R = 0;
    float acc[P];
#pragma unroll
    for (int p = 0; p < P; ++p) acc[p] = 0.0f;
#pragma unroll 6
    for (long long i = lane; i < n; i += 32) {  // loads run ahead; the adds stay in order
#pragma unroll
        for (int p = 0; p < P; ++p) {
            float s = lk_load(res, p * stride + i);
            if (delta) s = lk_round(R, s + lk_round(R, lk_load(delta, p * stride + i)));
            if (sum_out) lk_store(sum_out, p * stride + i, s);
            acc[p] += lk_round(R, s * s);
        }
    }
    float inv[P];
#pragma unroll
    for (int p = 0; p < P; ++p) {
        const float total = lk_round(R, lk_warp_sum(acc[p]));
        const float mean = lk_round(R, total / (float)n);
        inv[p] = lk_round(R, 1.0f / lk_round(R, sqrtf(lk_round(R, mean + eps))));
    }
#pragma unroll 6
    for (long long i = lane; i < n; i += 32) {
        const float g = lk_load(gain, i);
#pragma unroll
        for (int p = 0; p < P; ++p) {
            float s = lk_load(res, p * stride + i);
            if (delta) s = lk_round(R, s + lk_round(R, lk_load(delta, p * stride + i)));
            const float y = lk_round(R, s * inv[p]);
            lk_store(out, p * stride + i, lk_round(R, y * g));
        }
    }
}

// One row (lk_norm_rows with P = 1).
__device__ __forceinline__ void lk_norm_row_${SI}_${SD}_${SO}(
        const $TI* __restrict__ res, const $TD* __restrict__ delta,
        const $TI* __restrict__ gain, $TI* __restrict__ sum_out, $TO* out, long long n,
        float eps, int lane) {
    lk_norm_rows_${SI}_${SD}_${SO}<1>(res, delta, gain, sum_out, out, n, 0, eps, lane);
}

// A GEMV's norm prologue: M <= 2 * warps rows of K normalised into xs by the block; warp w
// takes row w and, when M > warps, row w + warps in the same pass (lk_norm_rows<2>), so 5
// to 8 rows cost about the latency of one, not of two in turn. Block 0 stores the sums.
__device__ __forceinline__ void lk_norm_prologue_${SI}_${SD}_${SO}(
        const $TI* __restrict__ res, const $TD* __restrict__ delta,
        const $TI* __restrict__ gain, $TI* __restrict__ sum_out, $TO* xs, long long M,
        long long K, float eps) {
    const int warps = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long at = (long long)w * K;
    $TI* sums = (sum_out && blockIdx.x == 0) ? sum_out + at : ($TI*)0;
    const $TD* d = delta ? delta + at : delta;
    if (w + warps < M) {
        lk_norm_rows_${SI}_${SD}_${SO}<2>(res + at, d, gain, sums, xs + at, K,
                                          (long long)warps * K, eps, lane);
    } else if (w < M) {
        lk_norm_rows_${SI}_${SD}_${SO}<1>(res + at, d, gain, sums, xs + at, K, 0, eps, lane);
    }
}

// One warp per row of n (NORM_ROWS_PER_BLOCK rows a block): s = residual + delta stored as
// the first output, RMSNorm of s as the second (lk_norm_row).
extern "C" __global__ void add_rms_norm_${SI}_${SD}_${SO}(
        const $TI* __restrict__ res, const $TD* __restrict__ delta,
        const $TI* __restrict__ gain, $TI* __restrict__ sum_out, $TO* __restrict__ out,
        long long rows, long long n, float eps) {
    lk_grid_wait();
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // whole warps only: no barrier follows
    const long long base = row * n;
    lk_norm_row_${SI}_${SD}_${SO}(res + base, delta + base, gain, sum_out + base, out + base, n,
                                  eps, threadIdx.x & 31);
}
"""

_RMS_NORM = r"""
// One warp per row of n: RMSNorm of x (lk_norm_row without a delta or a sum).
extern "C" __global__ void rms_norm_${SI}_${SO}(const $TI* __restrict__ x,
                                                const $TI* __restrict__ gain,
                                                $TO* __restrict__ out, long long rows,
                                                long long n, float eps) {
    lk_grid_wait();
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // whole warps only: no barrier follows
    const long long base = row * n;
    lk_norm_row_${SI}_${SI}_${SO}(x + base, (const $TI*)0, gain, ($TI*)0, out + base, n, eps,
                                  threadIdx.x & 31);
}
"""

_NORM_GEMV = r"""
// RMSNorm (after the residual add when delta is given) of M <= LK_PROLOGUE_ROWS rows of K,
// staged as $TO in shared memory by every block (lk_norm_prologue), then up to three
// GEMVs over the staged rows exactly as gemv_vec3 runs them (lk_gemv3): one launch where
// the norm and the q/k/v (or gate/up, or the head) were two, the same bits. The block's weight rows are asked into L2 first, so
// their reads from memory overlap the norm.
extern "C" __global__ void norm_gemv_${SI}_${SD}_${SO}(
        const $TI* __restrict__ res, const $TD* __restrict__ delta,
        const $TI* __restrict__ gain, $TI* __restrict__ sum_out, float eps,
        const $TO* __restrict__ w0, const $TO* __restrict__ w1, const $TO* __restrict__ w2,
        $TO* __restrict__ out0, $TO* __restrict__ out1, $TO* __restrict__ out2, long long M,
        long long K, long long N0, long long N1, long long N2, int team0, int team1,
        int team2, long long blocks0, long long blocks1) {
    extern __shared__ __align__(16) unsigned char lk_prologue_smem[];
    __shared__ float part[LK_GEMV_ROWS * LK_GEMV_WARPS];
    $TO* xs = reinterpret_cast<$TO*>(lk_prologue_smem);
    lk_gemv3_prefetch_${SO}(w0, w1, w2, K, N0, N1, N2, team0, team1, team2, blocks0, blocks1);
    lk_grid_wait();
    lk_norm_prologue_${SI}_${SD}_${SO}(res, delta, gain, sum_out, xs, M, K, eps);
    __syncthreads();
    lk_gemv3_${SO}<LK_PROLOGUE_ROWS>(xs, w0, w1, w2, out0, out1, out2, M, K, N0, N1, N2,
                                     team0, team1, team2, blocks0, blocks1, part);
}
"""

_NORM_GLU = r"""
// RMSNorm (after the residual add when delta is given) of M <= LK_PROLOGUE_ROWS rows of K
// staged as $TO in shared memory (lk_norm_prologue), then the gate and the up projections
// side by side: the block's first LK_GEMV_WARPS / 2 warps compute its gate columns, the
// others the same columns of up (teams of `team` warps, 1 or 2: gemv_vec's column code),
// staged as $TO exactly as the two GEMVs store them; then SwiGLU of each pair (lk_swiglu,
// the swiglu kernel's element, in $TC), stored as $TO. Bit for bit norm_gemv over (gate,
// up) then swiglu: one launch where there were two, and SwiGLU computed once an element,
// where swiglu_gemv's every block computes it for every row.
// The gate or up column this warp's team of norm_glu computes (gate in the block's first
// LK_GEMV_WARPS / 2 warps, up in the others), or -1 past N.
__device__ __forceinline__ long long lk_glu_column_${SI}_${SO}_${SC}(long long N, int team) {
    const int warp = threadIdx.x >> 5;
    const long long n = (long long)blockIdx.x * (LK_GEMV_WARPS / 2 / team)
                        + (warp % (LK_GEMV_WARPS / 2)) / team;
    return n < N ? n : -1;
}

// Ask L2 for the weight row of this warp's column (lk_gemv_prefetch for norm_glu's split):
// a hint only, issued before the kernel waits for the one ahead.
__device__ __forceinline__ void lk_glu_prefetch_${SI}_${SO}_${SC}(
        const $TO* __restrict__ wg, const $TO* __restrict__ wu, long long K, long long N,
        int team) {
    constexpr int V = 16 / sizeof($TO);
    const long long n = lk_glu_column_${SI}_${SO}_${SC}(N, team);
    if (n < 0) return;
    const $TO* wr = ((threadIdx.x >> 5) < LK_GEMV_WARPS / 2 ? wg : wu) + n * K;
    const int tt = ((threadIdx.x >> 5) % team) * 32 + (threadIdx.x & 31);
    for (long long c = tt; c < K / V; c += 32 * team) {
        asm volatile("prefetch.global.L2 [%0];" :: "l"(wr + c * V));
    }
}

extern "C" __global__ void norm_glu_${SI}_${SO}_${SC}(
        const $TI* __restrict__ res, const $TO* __restrict__ delta,
        const $TI* __restrict__ gain, $TI* __restrict__ sum_out, float eps,
        const $TO* __restrict__ wg, const $TO* __restrict__ wu, $TO* __restrict__ out,
        long long M, long long K, long long N, int team) {
    extern __shared__ __align__(16) unsigned char lk_prologue_smem[];
    __shared__ float part[LK_GEMV_ROWS * LK_GEMV_WARPS];
    __shared__ $TO staged[LK_PROLOGUE_ROWS * LK_GEMV_WARPS];
    constexpr int HALF = LK_GEMV_WARPS / 2;
    $TO* xs = reinterpret_cast<$TO*>(lk_prologue_smem);
    lk_glu_prefetch_${SI}_${SO}_${SC}(wg, wu, K, N, team);
    lk_grid_wait();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int pairs = HALF / team;
    const long long n = lk_glu_column_${SI}_${SO}_${SC}(N, team);
    const bool valid = n >= 0;  // every thread stays for the block's barriers
    const int tt = (warp % team) * 32 + lane;
    const $TO* wr = (warp < HALF ? wg : wu) + (valid ? n : 0) * K;
    lk_norm_prologue_${SI}_${SO}_${SO}(res, delta, gain, sum_out, xs, M, K, eps);
    __syncthreads();
    // a team's total lands at staged[m * LK_GEMV_WARPS + its first warp]
    switch (M) {
$gcases
    }
    // (the chunk ends with a barrier: every staged value is in)
    for (int t = threadIdx.x; t < M * pairs; t += blockDim.x) {
        const int m = t / pairs, j = t % pairs;
        const long long col = (long long)blockIdx.x * pairs + j;
        if (col < N) {
            const $TO* g = staged + m * LK_GEMV_WARPS + j * team;
            lk_store(out, m * N + col, lk_swiglu_${SO}_${SC}_${SO}(g, g + HALF, 0));
        }
    }
}
"""

_ROTARY = r"""
// One output element of [B, H, M, D] (C order). x is read through its strides (a
// transposed view is fine) as $TX and computed in $TC (cos/sin's type: the folded Cast
// up); a channel's partner is d +- D/2 (halves) or d ^ 1 (pairs), negated when first.
// The value lk_rotary stores at (b, h, m, d) (computed in $TC, not yet rounded to $TO).
__device__ __forceinline__ float lk_rotary_at_${SX}_${SC}_${SO}(
        const $TX* __restrict__ x, const $TC* __restrict__ cosv, const $TC* __restrict__ sinv,
        long long b, long long h, long long m, long long d, long long D,
        long long xb, long long xh, long long xm, long long xd,
        long long cb, long long ch, long long cm, long long cd,
        long long sb, long long sh, long long sm, long long sd,
        int pairs, int has_scale, float scale) {
    const $TC* C = 0;
    const long long half = D / 2;
    long long partner;
    bool negate;
    if (pairs) { partner = d ^ 1; negate = (d & 1) == 0; }
    else if (d < half) { partner = d + half; negate = true; }
    else { partner = d - half; negate = false; }
    const long long row = b * xb + h * xh + m * xm;
    const float xv = lk_round(C, lk_load(x, row + d * xd));
    float rv = lk_round(C, lk_load(x, row + partner * xd));
    if (negate) rv = -rv;
    const float c = lk_load(cosv, b * cb + h * ch + m * cm + d * cd);
    const float s = lk_load(sinv, b * sb + h * sh + m * sm + d * sd);
    float y = lk_round(C, lk_round(C, xv * c) + lk_round(C, rv * s));
    if (has_scale) y = lk_round(C, y * scale);
    return y;
}

// The same at the C-order index idx of [B, H, M, D].
__device__ __forceinline__ float lk_rotary_val_${SX}_${SC}_${SO}(
        const $TX* __restrict__ x, const $TC* __restrict__ cosv, const $TC* __restrict__ sinv,
        long long idx, long long H, long long M, long long D,
        long long xb, long long xh, long long xm, long long xd,
        long long cb, long long ch, long long cm, long long cd,
        long long sb, long long sh, long long sm, long long sd,
        int pairs, int has_scale, float scale) {
    const long long d = idx % D;
    long long t = idx / D;
    const long long m = t % M;
    t /= M;
    const long long h = t % H;
    return lk_rotary_at_${SX}_${SC}_${SO}(x, cosv, sinv, t / H, h, m, d, D, xb, xh, xm, xd, cb,
                                          ch, cm, cd, sb, sh, sm, sd, pairs, has_scale, scale);
}

__device__ __forceinline__ void lk_rotary_${SX}_${SC}_${SO}(
        const $TX* __restrict__ x, const $TC* __restrict__ cosv, const $TC* __restrict__ sinv,
        $TO* __restrict__ out, long long idx, long long H, long long M, long long D,
        long long xb, long long xh, long long xm, long long xd,
        long long cb, long long ch, long long cm, long long cd,
        long long sb, long long sh, long long sm, long long sd,
        int pairs, int has_scale, float scale) {
    lk_store(out, idx, lk_rotary_val_${SX}_${SC}_${SO}(x, cosv, sinv, idx, H, M, D, xb, xh, xm,
                                                       xd, cb, ch, cm, cd, sb, sh, sm, sd,
                                                       pairs, has_scale, scale));
}

// One thread per output element.
extern "C" __global__ void rotary_${SX}_${SC}_${SO}(
        const $TX* __restrict__ x, const $TC* __restrict__ cosv, const $TC* __restrict__ sinv,
        $TO* __restrict__ out, long long total, long long H, long long M, long long D,
        long long xb, long long xh, long long xm, long long xd,
        long long cb, long long ch, long long cm, long long cd,
        long long sb, long long sh, long long sm, long long sd,
        int pairs, int has_scale, float scale) {
    lk_grid_wait();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    lk_rotary_${SX}_${SC}_${SO}(x, cosv, sinv, out, idx, H, M, D, xb, xh, xm, xd, cb, ch, cm,
                                cd, sb, sh, sm, sd, pairs, has_scale, scale);
}

// Two rotations over the same cos/sin rows (a layer's queries and keys) in one launch:
// threads [0, total_a) rotate a, the rest b; each with its own heads, strides and scale.
extern "C" __global__ void rotary2_${SX}_${SC}_${SO}(
        const $TX* __restrict__ xa, $TO* __restrict__ out_a, long long total_a, long long Ha,
        long long ab, long long ah, long long am, long long ad, int scaled_a, float scale_a,
        const $TX* __restrict__ xb, $TO* __restrict__ out_b, long long total_b, long long Hb,
        long long bb, long long bh, long long bm, long long bd, int scaled_b, float scale_b,
        const $TC* __restrict__ cosv, const $TC* __restrict__ sinv, long long M, long long D,
        long long cb, long long ch, long long cm, long long cd,
        long long sb, long long sh, long long sm, long long sd, int pairs) {
    lk_grid_wait();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < total_a) {
        lk_rotary_${SX}_${SC}_${SO}(xa, cosv, sinv, out_a, idx, Ha, M, D, ab, ah, am, ad, cb,
                                    ch, cm, cd, sb, sh, sm, sd, pairs, scaled_a, scale_a);
    } else if (idx - total_a < total_b) {
        lk_rotary_${SX}_${SC}_${SO}(xb, cosv, sinv, out_b, idx - total_a, Hb, M, D, bb, bh, bm,
                                    bd, cb, ch, cm, cd, sb, sh, sm, sd, pairs, scaled_b,
                                    scale_b);
    }
}
"""

_ROTARY_KV = r"""
// Run v of the two static caches a layer's write fills (runs [0, runs_k) the key cache, the
// next runs_v the value cache): as kv_write2v writes them, a written key slot taking the key
// row rotated in place (lk_rotary_at at that row, rounded to $TO as the rotated keys were
// stored, then + 0 as the write stores it). rotary_kv and rotary_kv_attention both run it.
__device__ __forceinline__ void lk_rotary_kv_store_${SX}_${SC}_${SO}(
        long long v, const $TX* __restrict__ xk, long long Hk, long long kb, long long kh,
        long long km, long long kd, int scaled_k, float scale_k,
        const $TC* __restrict__ cosv, const $TC* __restrict__ sinv, long long M, long long D,
        long long cb, long long ch, long long cm, long long cd,
        long long sb, long long sh, long long sm, long long sd, int pairs,
        const $TO* __restrict__ old_k, $TO* __restrict__ cache_k, long long runs_k,
        const $TO* __restrict__ old_v, const $TO* __restrict__ new_v, $TO* __restrict__ cache_v,
        long long runs_v, long long Hv, long long vb, long long vh, long long vm,
        const long long* __restrict__ pos, long long C) {
    if (v >= runs_k) {
        if (v - runs_k < runs_v) {
            lk_kv_write_vec_${SO}(old_v, new_v, pos, cache_v, v - runs_k, Hv, C, D, M, vb, vh,
                                  vm);
        }
        return;
    }
    constexpr int V = 16 / sizeof($TO);
    const $TO* O = 0;
    const long long e0 = v * V;
    long long b, h, d;
    const long long hit = lk_cache_slot(e0, Hk, C, D, pos, M, &b, &h, &d);
    if (hit < 0) {
        reinterpret_cast<lk_vec16*>(cache_k)[v] = reinterpret_cast<const lk_vec16*>(old_k)[v];
        return;
    }
#pragma unroll
    for (int e = 0; e < V; ++e) {  // the rotated key row `hit`, channel d + e
        const float y = lk_rotary_at_${SX}_${SC}_${SO}(xk, cosv, sinv, b, h, hit, d + e, D, kb,
                                                        kh, km, kd, cb, ch, cm, cd, sb, sh, sm,
                                                        sd, pairs, scaled_k, scale_k);
        lk_store(cache_k, e0 + e, lk_round(O, y) + 0.0f);
    }
}

// A layer's rotation of queries and keys and its static-cache write in one launch: threads
// [0, total_q) rotate xq into out_q as rotary2 does (lk_rotary); the rest write the caches
// (lk_rotary_kv_store). Every element is the bits of rotary2 then kv_write2; one launch where
// there were two.
extern "C" __global__ void rotary_kv_${SX}_${SC}_${SO}(
        const $TX* __restrict__ xq, $TO* __restrict__ out_q, long long total_q, long long Hq,
        long long qb, long long qh, long long qm, long long qd, int scaled_q, float scale_q,
        const $TX* __restrict__ xk, long long Hk, long long kb, long long kh, long long km,
        long long kd, int scaled_k, float scale_k,
        const $TC* __restrict__ cosv, const $TC* __restrict__ sinv, long long M, long long D,
        long long cb, long long ch, long long cm, long long cd,
        long long sb, long long sh, long long sm, long long sd, int pairs,
        const $TO* __restrict__ old_k, $TO* __restrict__ cache_k, long long runs_k,
        const $TO* __restrict__ old_v, const $TO* __restrict__ new_v, $TO* __restrict__ cache_v,
        long long runs_v, long long Hv, long long vb, long long vh, long long vm,
        const long long* __restrict__ pos, long long C) {
    lk_grid_wait();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < total_q) {
        lk_rotary_${SX}_${SC}_${SO}(xq, cosv, sinv, out_q, idx, Hq, M, D, qb, qh, qm, qd, cb,
                                    ch, cm, cd, sb, sh, sm, sd, pairs, scaled_q, scale_q);
        return;
    }
    lk_rotary_kv_store_${SX}_${SC}_${SO}(idx - total_q, xk, Hk, kb, kh, km, kd, scaled_k,
                                         scale_k, cosv, sinv, M, D, cb, ch, cm, cd, sb, sh, sm,
                                         sd, pairs, old_k, cache_k, runs_k, old_v, new_v,
                                         cache_v, runs_v, Hv, vb, vh, vm, pos, C);
}
"""

_SWIGLU = r"""
// Element i: g * sigmoid(g) * up in $TC (sigmoid split by sign), as $TO would store it.
__device__ __forceinline__ float lk_swiglu_${SG}_${SC}_${SO}(const $TG* __restrict__ gate,
                                                            const $TG* __restrict__ up,
                                                            long long i) {
    const $TC* C = 0;
    const float g = lk_round(C, lk_load(gate, i));
    const float u = lk_round(C, lk_load(up, i));
    const float e = lk_round(C, expf(-fabsf(g)));
    const float denom = lk_round(C, 1.0f + e);
    const float sig = g >= 0.0f ? lk_round(C, 1.0f / denom) : lk_round(C, e / denom);
    return lk_round(C, lk_round(C, g * sig) * u);
}

// One thread per element.
extern "C" __global__ void swiglu_${SG}_${SC}_${SO}(const $TG* __restrict__ gate,
                                                   const $TG* __restrict__ up,
                                                   $TO* __restrict__ out, long long n) {
    lk_grid_wait();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    lk_store(out, i, lk_swiglu_${SG}_${SC}_${SO}(gate, up, i));
}
"""

_SWIGLU_GEMV = r"""
// SwiGLU of M <= LK_PROLOGUE_ROWS rows of K staged as $TO in shared memory by every block
// (lk_swiglu, the swiglu kernel's element; gate and up read 16 bytes at a time when GVEC),
// then the down projection's GEMV over the staged rows exactly as gemv_vec runs it: one
// launch where SwiGLU and the MatMul were two. The weight rows are asked into L2 first.
extern "C" __global__ void swiglu_gemv_${SG}_${SC}_${SO}(
        const $TG* __restrict__ gate, const $TG* __restrict__ up, const $TO* __restrict__ w,
        $TO* __restrict__ out, long long M, long long K, long long N, int team, int gvec) {
    extern __shared__ __align__(16) unsigned char lk_prologue_smem[];
    __shared__ float part[LK_GEMV_ROWS * LK_GEMV_WARPS];
    constexpr int VG = 16 / sizeof($TG);
    $TO* xs = reinterpret_cast<$TO*>(lk_prologue_smem);
    lk_gemv_prefetch_${SO}(w, K, N, team, blockIdx.x);
    lk_grid_wait();
    if (gvec) {
#pragma unroll 2
        for (long long c = threadIdx.x; c < M * K / VG; c += blockDim.x) {
            const lk_vec16 gv = *reinterpret_cast<const lk_vec16*>(gate + c * VG);
            const lk_vec16 uv = *reinterpret_cast<const lk_vec16*>(up + c * VG);
            const $TG* gp = reinterpret_cast<const $TG*>(&gv);
            const $TG* upp = reinterpret_cast<const $TG*>(&uv);
#pragma unroll
            for (int e = 0; e < VG; ++e) {
                lk_store(xs, c * VG + e, lk_swiglu_${SG}_${SC}_${SO}(gp, upp, e));
            }
        }
    } else {
        for (long long i = threadIdx.x; i < M * K; i += blockDim.x) {
            lk_store(xs, i, lk_swiglu_${SG}_${SC}_${SO}(gate, up, i));
        }
    }
    __syncthreads();
    lk_gemv_vec_block_${SO}<LK_PROLOGUE_ROWS, false>(xs, w, out, M, K, N, K, 1, 1, team,
                                                     blockIdx.x, part);
}
"""

_KV_WRITE = r"""
// One element of the cache [B, H, C, D] (C order): slot c takes the row of new
// [B, H, M, D] (read through its strides) whose position is c, stored as row + 0 (-0
// becomes +0, as the one-hot product's sum makes it); every other slot is copied.
__device__ __forceinline__ void lk_kv_write_${S}(const $T* __restrict__ old,
                                                 const $T* __restrict__ nw,
                                                 const long long* __restrict__ pos,
                                                 $T* __restrict__ out, long long idx,
                                                 long long H, long long C, long long D,
                                                 long long M, long long nb, long long nh,
                                                 long long nm, long long nd) {
    long long b, h, d;
    const long long hit = lk_cache_slot(idx, H, C, D, pos, M, &b, &h, &d);
    if (hit < 0) { out[idx] = old[idx]; return; }
    lk_store(out, idx, lk_load(nw, b * nb + h * nh + hit * nm + d * nd) + 0.0f);
}

// The same for the 16-byte run v of the cache (V elements along D, which V divides): a copy
// of the run, or the new row's run (its D axis contiguous, its start 16-byte aligned), each
// element stored as row + 0 as lk_kv_write stores it.
__device__ __forceinline__ void lk_kv_write_vec_${S}(const $T* __restrict__ old,
                                                     const $T* __restrict__ nw,
                                                     const long long* __restrict__ pos,
                                                     $T* __restrict__ out, long long v,
                                                     long long H, long long C, long long D,
                                                     long long M, long long nb, long long nh,
                                                     long long nm) {
    constexpr int V = 16 / sizeof($T);
    const long long idx = v * V;
    long long b, h, d;
    const long long hit = lk_cache_slot(idx, H, C, D, pos, M, &b, &h, &d);
    if (hit < 0) {
        reinterpret_cast<lk_vec16*>(out)[v] = reinterpret_cast<const lk_vec16*>(old)[v];
        return;
    }
    const lk_vec16 src = *reinterpret_cast<const lk_vec16*>(nw + b * nb + h * nh + hit * nm + d);
    const $T* sp = reinterpret_cast<const $T*>(&src);
#pragma unroll
    for (int e = 0; e < V; ++e) lk_store(out, idx + e, lk_load(sp, e) + 0.0f);
}

// Two caches as kv_write2 writes them, one thread per 16-byte run (lk_kv_write_vec):
// threads [0, runs_a) write cache a, the rest cache b.
extern "C" __global__ void kv_write2v_${S}(
        const $T* __restrict__ old_a, const $T* __restrict__ new_a, $T* __restrict__ out_a,
        long long runs_a, long long H_a, long long D_a, long long ab, long long ah,
        long long am,
        const $T* __restrict__ old_b, const $T* __restrict__ new_b, $T* __restrict__ out_b,
        long long runs_b, long long H_b, long long D_b, long long bb, long long bh,
        long long bm,
        const long long* __restrict__ pos, long long C, long long M) {
    lk_grid_wait();
    const long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (v < runs_a) {
        lk_kv_write_vec_${S}(old_a, new_a, pos, out_a, v, H_a, C, D_a, M, ab, ah, am);
    } else if (v - runs_a < runs_b) {
        lk_kv_write_vec_${S}(old_b, new_b, pos, out_b, v - runs_a, H_b, C, D_b, M, bb, bh, bm);
    }
}

// One thread per element of one cache.
extern "C" __global__ void kv_write_${S}(const $T* __restrict__ old, const $T* __restrict__ nw,
                                         const long long* __restrict__ pos,
                                         $T* __restrict__ out, long long total, long long H,
                                         long long C, long long D, long long M,
                                         long long nb, long long nh, long long nm,
                                         long long nd) {
    lk_grid_wait();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    lk_kv_write_${S}(old, nw, pos, out, idx, H, C, D, M, nb, nh, nm, nd);
}

// Two caches written at the same positions (a layer's keys and values) in one launch:
// threads [0, total_a) write cache a, the rest cache b.
extern "C" __global__ void kv_write2_${S}(
        const $T* __restrict__ old_a, const $T* __restrict__ new_a, $T* __restrict__ out_a,
        long long total_a, long long H_a, long long D_a, long long ab, long long ah,
        long long am, long long ad,
        const $T* __restrict__ old_b, const $T* __restrict__ new_b, $T* __restrict__ out_b,
        long long total_b, long long H_b, long long D_b, long long bb, long long bh,
        long long bm, long long bd,
        const long long* __restrict__ pos, long long C, long long M) {
    lk_grid_wait();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < total_a) {
        lk_kv_write_${S}(old_a, new_a, pos, out_a, idx, H_a, C, D_a, M, ab, ah, am, ad);
    } else if (idx - total_a < total_b) {
        lk_kv_write_${S}(old_b, new_b, pos, out_b, idx - total_a, H_b, C, D_b, M, bb, bh, bm,
                         bd);
    }
}
"""

_ATTENTION = r"""
// One block per (head h, query m): the query at position p reads key slots j in [0, p]
// (and < T) of KV head h / group, nothing else. Scores (in shared memory where T is at most
// LK_ATT_SMEM_KEYS, else in the block's scratch row): thread t takes keys j = t, t +
// blockDim, ... and adds q[d] * k[j, d] over d ascending with fused multiply-adds in float32
// (KVEC: the key row loaded 16 bytes at a time, the same arithmetic); rounded to $T (the
// MatMul's output), then either scaled in $T (uniform) or taken as float32 ($TC, mixed).
// Softmax in $TC: max, exp, a sum whose order depends on j only (thread j % blockDim, then
// the block tree); probabilities rounded to $TC then to $T. Output (KVEC): a value row is
// D / V runs of V channels; thread t takes run t % (D / V) of keys j = g, g + G, ...
// ascending (g = t / (D / V), G = blockDim / (D / V)), 16-byte loads; the groups' partials
// are then added in group order. Otherwise thread group g of G = blockDim / D adds keys
// j = g, g + G, ... one channel at a time, the same way. Stored to out[0, m, h * D + d] as
// $T. Every order depends on (p, D) alone: a verify row is the decode at its position.
extern "C" __global__ void attention_${S}_${SC}(
        const $T* __restrict__ q, const $T* __restrict__ k, const $T* __restrict__ v,
        const long long* __restrict__ pos, $T* __restrict__ out, float* __restrict__ scratch,
        long long H, long long M, long long T, long long D, long long group,
        long long qh, long long qm, long long qd, int has_scale, float scale, int G,
        int kvec) {
    __shared__ float qs[LK_ATT_MAX_D];
    __shared__ float part[LK_ATT_BLOCK * (16 / sizeof($T))];  // groups x D partial sums
    __shared__ float smem[33];
    __shared__ float s_keys[LK_ATT_SMEM_KEYS];  // the scores, where T fits (else scratch)
    lk_grid_wait();
    const $T* S = 0;
    const $TC* C = 0;
    constexpr int V = 16 / sizeof($T);
    const long long h = blockIdx.x / M;
    const long long m = blockIdx.x % M;
    const long long p = pos[m];
    const long long L = p < 0 ? 0 : (p + 1 < T ? p + 1 : T);
    const long long kvh = h / group;
    const $T* kh = k + kvh * T * D;
    const $T* vh = v + kvh * T * D;
    float* s = T <= LK_ATT_SMEM_KEYS ? s_keys : scratch + blockIdx.x * T;
    const int tid = threadIdx.x;
    for (long long d = tid; d < D; d += blockDim.x) qs[d] = lk_load(q, h * qh + m * qm + d * qd);
    __syncthreads();
    float mx = __int_as_float(0xff800000);  // -inf
    for (long long j = tid; j < L; j += blockDim.x) {
        const $T* kr = kh + j * D;
        float acc = 0.0f;
        if (kvec) {
#pragma unroll 4
            for (long long c = 0; c < D; c += V) {
                float kf[V];
                lk_unpack16_words(*reinterpret_cast<const lk_vec16*>(kr + c), kf, $T());
#pragma unroll
                for (int e = 0; e < V; ++e) acc = __fmaf_rn(qs[c + e], kf[e], acc);
            }
        } else {
            for (long long d = 0; d < D; ++d) acc = __fmaf_rn(qs[d], lk_load(kr, d), acc);
        }
        float score = lk_round(S, acc);
        if (has_scale) score = lk_round(C, score * scale);
        s[j] = score;
        mx = fmaxf(mx, score);
    }
    lk_softmax_block(s, L, mx, smem, tid, S, C);
    __syncthreads();
    if (kvec) {
        const int runs = (int)(D / V);
        const int groups = blockDim.x / runs;
        const int c = tid % runs;
        const int g = tid / runs;
        if (g < groups) {
            float o[V];
#pragma unroll
            for (int e = 0; e < V; ++e) o[e] = 0.0f;
#pragma unroll 2
            for (long long j = g; j < L; j += groups) {
                float vf[V];
                lk_unpack16_words(*reinterpret_cast<const lk_vec16*>(vh + j * D + c * V), vf,
                                  $T());
                const float pj = s[j];
#pragma unroll
                for (int e = 0; e < V; ++e) o[e] = o[e] + pj * vf[e];
            }
#pragma unroll
            for (int e = 0; e < V; ++e) part[g * D + c * V + e] = o[e];
        }
        __syncthreads();
        for (long long d = tid; d < D; d += blockDim.x) {
            float r = 0.0f;
            for (int i = 0; i < groups; ++i) r = r + part[i * D + d];
            lk_store(out, (m * H + h) * D + d, r);
        }
    } else if (G > 1) {
        const long long d = tid % D;
        const int g = tid / D;
        float o = 0.0f;
        if (g < G) {
#pragma unroll 4
            for (long long j = g; j < L; j += G) o = o + s[j] * lk_load(vh, j * D + d);
            part[tid] = o;
        }
        __syncthreads();
        if (g == 0) {
            float r = 0.0f;
            for (int i = 0; i < G; ++i) r = r + part[i * D + d];
            lk_store(out, (m * H + h) * D + d, r);
        }
    } else {
        for (long long d = tid; d < D; d += blockDim.x) {
            float o = 0.0f;
#pragma unroll 4
            for (long long j = 0; j < L; ++j) o = o + s[j] * lk_load(vh, j * D + d);
            lk_store(out, (m * H + h) * D + d, o);
        }
    }
}
"""


_ATTENTION_ROWS = r"""
// A prefill's attention, up to R rows of one head a block (rows m0 .. m0 + R - 1 of head h,
// R = min(LK_ATT_ROWS, what the dynamic shared memory holds)): every row's arithmetic is
// attention_'s for that row, bit for bit: thread t owns keys j = t, t + blockDim, ... for
// the scores and the sum, the block trees run row by row (lk_softmax_block), and thread t
// owns value run t % (D / V) of keys j = g, g + G, ... as there. What changes is that a key
// or value run loaded once serves every row of the block. KVEC operands only (D a whole
// number of 16-byte runs, both caches aligned). Dynamic shared memory: qs[R][D], then the
// rows' scores s[R][T].
extern "C" __global__ void attention_rows_${S}_${SC}(
        const $T* __restrict__ q, const $T* __restrict__ k, const $T* __restrict__ v,
        const long long* __restrict__ pos, $T* __restrict__ out, long long H, long long M,
        long long T, long long D, long long group, long long qh, long long qm, long long qd,
        int has_scale, float scale, int R) {
    extern __shared__ __align__(16) float lk_rows_smem[];
    __shared__ float part[LK_ATT_BLOCK * (16 / sizeof($T))];  // groups x D partial sums
    __shared__ float smem[33];
    __shared__ long long Ls[LK_ATT_ROWS];
    lk_grid_wait();
    const $T* S = 0;
    const $TC* C = 0;
    constexpr int V = 16 / sizeof($T);
    const long long per_head = (M + R - 1) / R;
    const long long h = blockIdx.x / per_head;
    const long long m0 = (blockIdx.x % per_head) * R;
    const int rows = (int)((M - m0) < R ? (M - m0) : R);
    float* qs = lk_rows_smem;
    float* s = lk_rows_smem + (long long)R * D;
    const long long kvh = h / group;
    const $T* kh = k + kvh * T * D;
    const $T* vh = v + kvh * T * D;
    const int tid = threadIdx.x;
    for (long long i = tid; i < rows * D; i += blockDim.x) {
        const long long r = i / D, d = i % D;
        qs[i] = lk_load(q, h * qh + (m0 + r) * qm + d * qd);
    }
    if (tid < rows) {
        const long long p = pos[m0 + tid];
        Ls[tid] = p < 0 ? 0 : (p + 1 < T ? p + 1 : T);
    }
    __syncthreads();
    long long Lmax = 0;
    long long L[LK_ATT_ROWS];
    float mx[LK_ATT_ROWS];
#pragma unroll
    for (int r = 0; r < LK_ATT_ROWS; ++r) {
        L[r] = r < rows ? Ls[r] : 0;
        Lmax = L[r] > Lmax ? L[r] : Lmax;
        mx[r] = __int_as_float(0xff800000);  // -inf
    }
    for (long long j = tid; j < Lmax; j += blockDim.x) {
        const $T* kr = kh + j * D;
        float acc[LK_ATT_ROWS];
#pragma unroll
        for (int r = 0; r < LK_ATT_ROWS; ++r) acc[r] = 0.0f;
#pragma unroll 2
        for (long long c = 0; c < D; c += V) {
            float kf[V];
            lk_unpack16_words(*reinterpret_cast<const lk_vec16*>(kr + c), kf, $T());
#pragma unroll
            for (int e = 0; e < V; ++e) {
#pragma unroll
                for (int r = 0; r < LK_ATT_ROWS; ++r)
                    if (r < rows) acc[r] = __fmaf_rn(qs[r * D + c + e], kf[e], acc[r]);
            }
        }
#pragma unroll
        for (int r = 0; r < LK_ATT_ROWS; ++r) {
            if (j < L[r]) {
                float score = lk_round(S, acc[r]);
                if (has_scale) score = lk_round(C, score * scale);
                s[r * T + j] = score;
                mx[r] = fmaxf(mx[r], score);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < LK_ATT_ROWS; ++r) {
        if (r < rows) lk_softmax_block(s + r * T, L[r], mx[r], smem, tid, S, C);
    }
    __syncthreads();
    const int runs = (int)(D / V);
    const int groups = blockDim.x / runs;
    const int c = tid % runs;
    const int g = tid / runs;
    float o[LK_ATT_ROWS][V];
#pragma unroll
    for (int r = 0; r < LK_ATT_ROWS; ++r)
#pragma unroll
        for (int e = 0; e < V; ++e) o[r][e] = 0.0f;
    if (g < groups) {
        for (long long j = g; j < Lmax; j += groups) {
            float vf[V];
            lk_unpack16_words(*reinterpret_cast<const lk_vec16*>(vh + j * D + c * V), vf, $T());
#pragma unroll
            for (int r = 0; r < LK_ATT_ROWS; ++r) {
                if (j < L[r]) {
                    const float pj = s[r * T + j];
#pragma unroll
                    for (int e = 0; e < V; ++e) o[r][e] = o[r][e] + pj * vf[e];
                }
            }
        }
    }
#pragma unroll
    for (int r = 0; r < LK_ATT_ROWS; ++r) {
        if (r < rows) {
            if (g < groups) {
#pragma unroll
                for (int e = 0; e < V; ++e) part[g * D + c * V + e] = o[r][e];
            }
            __syncthreads();
            for (long long d = tid; d < D; d += blockDim.x) {
                float total = 0.0f;
                for (int i = 0; i < groups; ++i) total = total + part[i * D + d];
                lk_store(out, ((m0 + r) * H + h) * D + d, total);
            }
            __syncthreads();
        }
    }
}
"""

_ROTARY_KV_ATTENTION = r"""
// A decode's or verification's RotaryKVWrite and the Attention that reads its rotated
// queries and its two caches, in one launch. Blocks [0, Hq * M) are attention's blocks
// (head h, query m): the query row is rotated in the block (lk_rotary_at, rounded to $TO as
// the rotated queries were stored); the rows this forward writes (at most LK_RKA_MAX_M, of
// the block's KV head) are staged in shared memory as the cache would hold them (keys
// rotated, rounded to $TO, + 0; values + 0), and a key slot written by this forward is read
// from there, any other from the old cache: the values attention would read from the new
// cache. Then attention's own arithmetic (the attention kernel's KVEC path: scores in
// shared memory, softmax in $TC, the value sum in 16-byte runs, groups added in order). The
// remaining blocks write the two caches (lk_rotary_kv_store). Nothing reads what this launch
// writes, so every element is the bits of rotary_kv then attention.
extern "C" __global__ void rotary_kv_attention_${SX}_${SC}_${SO}(
        const $TX* __restrict__ xq, long long Hq, long long qb, long long qh, long long qm,
        long long qd, int scaled_q, float scale_q,
        const $TX* __restrict__ xk, long long Hk, long long kb, long long kh, long long km,
        long long kd, int scaled_k, float scale_k,
        const $TC* __restrict__ cosv, const $TC* __restrict__ sinv, long long M, long long D,
        long long cb, long long ch, long long cm, long long cd,
        long long sb, long long sh, long long sm, long long sd, int pairs,
        const $TO* __restrict__ old_k, $TO* __restrict__ cache_k, long long runs_k,
        const $TO* __restrict__ old_v, const $TO* __restrict__ new_v, $TO* __restrict__ cache_v,
        long long runs_v, long long Hv, long long vb, long long vh, long long vm,
        const long long* __restrict__ pos, long long C, long long group, int has_scale,
        float scale, $TO* __restrict__ out) {
    lk_grid_wait();
    const long long att_blocks = Hq * M;
    if ((long long)blockIdx.x >= att_blocks) {
        const long long v = ((long long)blockIdx.x - att_blocks) * blockDim.x + threadIdx.x;
        lk_rotary_kv_store_${SX}_${SC}_${SO}(v, xk, Hk, kb, kh, km, kd, scaled_k, scale_k, cosv,
                                             sinv, M, D, cb, ch, cm, cd, sb, sh, sm, sd, pairs,
                                             old_k, cache_k, runs_k, old_v, new_v, cache_v,
                                             runs_v, Hv, vb, vh, vm, pos, C);
        return;
    }
    __shared__ float qs[LK_RKA_MAX_D];
    __shared__ float knew[LK_RKA_MAX_M * LK_RKA_MAX_D];
    __shared__ float vnew[LK_RKA_MAX_M * LK_RKA_MAX_D];
    __shared__ long long spos[LK_RKA_MAX_M];
    __shared__ float part[LK_ATT_BLOCK * (16 / sizeof($TO))];
    __shared__ float smem[33];
    __shared__ float s[LK_ATT_SMEM_KEYS];
    const $TO* O = 0;
    const $TC* SC = 0;
    constexpr int V = 16 / sizeof($TO);
    const long long h = blockIdx.x / M;
    const long long m = blockIdx.x % M;
    const long long kvh = h / group;
    const int tid = threadIdx.x;
    // The two staging loops take few turns a thread (D at most 128 of a 256-thread block,
    // M * D at most four turns): kept rolled, so the compiler does not unroll them into code
    // no thread runs (unrolled, bfloat16's kernel was 1.5 times float16's, and slower).
#pragma unroll 1
    for (long long d = tid; d < D; d += blockDim.x) {
        qs[d] = lk_round(O, lk_rotary_at_${SX}_${SC}_${SO}(xq, cosv, sinv, 0, h, m, d, D, qb, qh,
                                                             qm, qd, cb, ch, cm, cd, sb, sh, sm,
                                                             sd, pairs, scaled_q, scale_q));
    }
#pragma unroll 1
    for (long long i = tid; i < M * D; i += blockDim.x) {
        const long long r = i / D, d = i % D;
        knew[i] = lk_round(O, lk_rotary_at_${SX}_${SC}_${SO}(xk, cosv, sinv, 0, kvh, r, d, D, kb,
                                                               kh, km, kd, cb, ch, cm, cd, sb, sh,
                                                               sm, sd, pairs, scaled_k, scale_k))
                  + 0.0f;
        vnew[i] = lk_load(new_v, kvh * vh + r * vm + d) + 0.0f;
    }
    if (tid < M) spos[tid] = pos[tid];
    __syncthreads();
    const long long p = spos[m];
    const long long L = p < 0 ? 0 : (p + 1 < C ? p + 1 : C);
    const $TO* kh_old = old_k + kvh * C * D;
    const $TO* vh_old = old_v + kvh * C * D;
    float mx = __int_as_float(0xff800000);  // -inf
    for (long long j = tid; j < L; j += blockDim.x) {
        long long hit = -1;
        for (long long r = 0; r < M; ++r) if (spos[r] == j) hit = r;
        float acc = 0.0f;
        if (hit >= 0) {
            for (long long d = 0; d < D; ++d) acc = __fmaf_rn(qs[d], knew[hit * D + d], acc);
        } else {
            const $TO* kr = kh_old + j * D;
#pragma unroll 4
            for (long long c = 0; c < D; c += V) {
                float kf[V];
                lk_unpack16_words(*reinterpret_cast<const lk_vec16*>(kr + c), kf, $TO());
#pragma unroll
                for (int e = 0; e < V; ++e) acc = __fmaf_rn(qs[c + e], kf[e], acc);
            }
        }
        float score = lk_round(O, acc);
        if (has_scale) score = lk_round(SC, score * scale);
        s[j] = score;
        mx = fmaxf(mx, score);
    }
    lk_softmax_block(s, L, mx, smem, tid, O, SC);
    __syncthreads();
    const int runs = (int)(D / V);
    const int groups = blockDim.x / runs;
    const int c = tid % runs;
    const int g = tid / runs;
    if (g < groups) {
        float o[V];
#pragma unroll
        for (int e = 0; e < V; ++e) o[e] = 0.0f;
#pragma unroll 2
        for (long long j = g; j < L; j += groups) {
            long long hit = -1;
            for (long long r = 0; r < M; ++r) if (spos[r] == j) hit = r;
            const float pj = s[j];
            if (hit >= 0) {
#pragma unroll
                for (int e = 0; e < V; ++e) o[e] = o[e] + pj * vnew[hit * D + c * V + e];
            } else {
                float vf[V];
                lk_unpack16_words(*reinterpret_cast<const lk_vec16*>(vh_old + j * D + c * V),
                                  vf, $TO());
#pragma unroll
                for (int e = 0; e < V; ++e) o[e] = o[e] + pj * vf[e];
            }
        }
#pragma unroll
        for (int e = 0; e < V; ++e) part[g * D + c * V + e] = o[e];
    }
    __syncthreads();
    for (long long d = tid; d < D; d += blockDim.x) {
        float r = 0.0f;
        for (int i = 0; i < groups; ++i) r = r + part[i * D + d];
        lk_store(out, (m * Hq + h) * D + d, r);
    }
}
"""


def _fields(**dtypes: str) -> dict[str, str]:
    """{"SI": suffix, "TI": storage type, ...} for each role -> dtype name."""
    out = {}
    for role, dtype in dtypes.items():
        suffix, storage, _acc = _TYPES[dtype]
        out[f"S{role}"], out[f"T{role}"] = suffix, storage
    return out


def _glu_cases(dtype: str) -> str:
    """norm_glu's switch over M: gemv_vec's column chunk for M rows, its totals stored to
    the block's staging array (row stride LK_GEMV_WARPS, at the team's first warp)."""
    suffix = _TYPES[dtype][0]
    return "\n".join(
        f"        case {r}: lk_gemv_vec_chunk_{suffix}<{r}, true, LK_GEMV_WARPS>(xs, wr, staged, "
        f"K, LK_GEMV_WARPS, 1, warp, 0, valid, tt, team * 32, warp, team, lane, part); break;"
        for r in range(1, PROLOGUE_ROWS + 1))


def fused_source() -> str:
    """The module: the shared prelude, then every fused kernel for every dtype combination
    the fused nodes can carry (storage, compute, output)."""
    parts = [prelude(), f"#define LK_ATT_MAX_D {ATTENTION_MAX_HEAD_DIM}",
             f"#define LK_ATT_BLOCK {ATTENTION_BLOCK}",
             f"#define LK_ATT_SMEM_KEYS {ATTENTION_SMEM_KEYS}",
             f"#define LK_ATT_ROWS {ATTENTION_ROWS}",
             f"#define LK_RKA_MAX_D {ROTARY_ATTENTION_MAX_HEAD_DIM}",
             f"#define LK_RKA_MAX_M {ROTARY_ATTENTION_MAX_ROWS}",
             gemv_vec_defines(), f"#define LK_PROLOGUE_ROWS {PROLOGUE_ROWS}", _COMMON]
    for dtype in FUSED_DTYPES:
        parts.append(Template(_ROUND).substitute(T=_TYPES[dtype][1]))
        parts.append(gemv_vec_device_source(dtype))
    parts.append(_SOFTMAX)  # after every lk_round it calls
    for a, b, c in itertools.product(FUSED_DTYPES, repeat=3):
        parts.append(Template(_NORM_ROW).substitute(_fields(I=a, D=b, O=c)))
        parts.append(Template(_ROTARY).substitute(_fields(X=a, C=b, O=c)))
        parts.append(Template(_SWIGLU).substitute(_fields(G=a, C=b, O=c)))
    for wide, narrow in PROLOGUE_PAIRS:
        # the graphs' own combinations only (each GEMV is large): the residual stream in the
        # GEMV's dtype or in float32 (a mixed graph), the delta and the output in the GEMV's
        parts.append(Template(_NORM_GEMV).substitute(_fields(I=wide, D=narrow, O=narrow)))
        parts.append(Template(_SWIGLU_GEMV).substitute(_fields(G=narrow, C=wide, O=narrow)))
        parts.append(Template(_NORM_GLU).substitute(_fields(I=wide, O=narrow, C=wide),
                                                    gcases=_glu_cases(narrow)))
    for a, b in itertools.product(FUSED_DTYPES, repeat=2):
        parts.append(Template(_RMS_NORM).substitute(_fields(I=a, O=b)))
        parts.append(Template(_ATTENTION).substitute(_fields(C=b), S=_TYPES[a][0],
                                                      T=_TYPES[a][1]))
        parts.append(Template(_ATTENTION_ROWS).substitute(_fields(C=b), S=_TYPES[a][0],
                                                           T=_TYPES[a][1]))
    for dtype in FUSED_DTYPES:
        parts.append(Template(_KV_WRITE).substitute(S=_TYPES[dtype][0], T=_TYPES[dtype][1]))
    for a, b, c in itertools.product(FUSED_DTYPES, repeat=3):
        parts.append(Template(_ROTARY_KV).substitute(_fields(X=a, C=b, O=c)))
    for wide, narrow in PROLOGUE_PAIRS:  # the graphs' own: x and caches narrow, math wide
        parts.append(Template(_ROTARY_KV_ATTENTION).substitute(_fields(X=narrow, C=wide,
                                                                       O=narrow)))
    return "\n".join(parts)


FUSED_SOURCE = fused_source()
FUSED_NAMES = tuple(re.findall(r'extern "C" __global__ void (\w+)\(', FUSED_SOURCE))


def _i64(value: int) -> np.int64:
    return np.int64(value)


def _suffix(dtype, what: str) -> str:
    name = dtype_name(dtype)
    if name not in FUSED_DTYPES:
        raise ExecutionError(f"no fused CUDA kernel for {what} of dtype {name}",
                             field=what, value=name,
                             remedy=f"use one of {', '.join(FUSED_DTYPES)}, or build the plan "
                                    "with fuse=False")
    return _TYPES[name][0]


def _runs_fit(x, per: int) -> bool:
    """Whether a cache or its new rows [B, H, *, D] can move in runs of ``per`` elements
    (16 bytes): D a whole number of runs, contiguous along D, every row start aligned."""
    strides = [st // x.itemsize for st in x.strides]
    return (x.shape[3] % per == 0 and (x.shape[3] == 1 or strides[3] == 1)
            and all(st % per == 0 for st in strides[:3]) and x.data.ptr % 16 == 0)


@functools.lru_cache(maxsize=256)
def broadcast_element_strides(table_shape: tuple, table_strides: tuple, itemsize: int,
                              shape: tuple) -> tuple[int, ...] | None:
    """What ``broadcast_to(table, shape).strides`` gives, in elements, with 0 along every
    axis of extent 1; None where the table does not broadcast to ``shape``. Arithmetic on
    the metadata (and remembered): a prefill asks about 120 times with the same shapes,
    and a broadcast view costs microseconds to build only to read its strides."""
    lead = len(shape) - len(table_shape)
    if lead < 0:
        return None
    out = []
    for axis, extent in enumerate(shape):
        j = axis - lead
        own = table_shape[j] if j >= 0 else 1
        if own != extent and own != 1:
            return None
        out.append(0 if extent == 1 or own == 1 else table_strides[j] // itemsize)
    return tuple(out)


def _prologue_rows(x) -> int:
    """The rows of x [..., K] if a GEMV with a prologue takes that many (1 to
    PROLOGUE_ROWS), else 0."""
    k = x.shape[-1]
    rows = x.size // k if k else 0
    return rows if 0 < rows <= PROLOGUE_ROWS else 0


def _blocks(count: int, threads: int) -> int:
    return (count + threads - 1) // threads


class FusedKernels:
    """The compiled module for one device and a launcher per fused node.

    Launchers check shapes and dtypes from metadata, allocate their output (and attention's
    score scratch) inside ``with device, stream`` so the current allocator serves it, and
    launch on ``stream``; nothing is read from the device."""

    def __init__(self, device_id: int = 0):
        from engines.cuda_support import import_cupy

        cupy = import_cupy()
        self._cupy = cupy
        self.device_id = int(device_id)
        self._device = cupy.cuda.Device(self.device_id)  # one object: a launch enters it often
        with self._device:
            module = cupy.RawModule(code=FUSED_SOURCE, options=COMPILE_OPTIONS)
            self._functions = {name: module.get_function(name) for name in FUSED_NAMES}
        self._launcher = KernelLauncher(cupy, self.device_id, dependent=True)

    def on(self, stream) -> StreamKernels:
        """These kernels with every launch on ``stream`` (what a backend holds)."""
        return StreamKernels(self, stream)

    def _check(self, array, what: str) -> None:
        cupy = self._cupy
        if not isinstance(array, cupy.ndarray) or array.data.device_id != self.device_id:
            raise ResidencyError(f"{what} does not live on cuda:{self.device_id}", field=what,
                                 value=type(array).__name__,
                                 remedy="adopt it to the backend before the forward")

    def _empty(self, shape, dtype, stream):
        with self._device, stream:
            out = self._cupy.empty(shape, dtype=dtype)
        return note_allocation(out, stream)

    def _contiguous(self, array, stream):
        """A C-contiguous copy (or ``array`` itself); a bfloat16 array's bits move as uint16,
        since CuPy computes nothing in bfloat16."""
        if array.flags.c_contiguous:
            return array
        with self._device, stream:
            if dtype_name(array.dtype) == "bfloat16":
                bits = self._cupy.ascontiguousarray(array.view(np.uint16))
                return bits.view(array.dtype)
            return self._cupy.ascontiguousarray(array)

    def _launch(self, name, blocks, threads, args, stream) -> None:
        self._launcher.launch(self._functions[name], (int(blocks),), (int(threads),), args,
                              stream)

    def rms_norm(self, x, gain, eps: float, out_dtype, *, stream):
        """[..., n] rows normalised over n, times gain [n]; the result in ``out_dtype``."""
        self._check(x, "x")
        self._check(gain, "gain")
        n = x.shape[-1]
        if gain.shape != (n,) or gain.dtype != x.dtype:
            raise ExecutionError("RMSNorm's gain must be [n] in x's dtype", field="gain",
                                 value=(tuple(gain.shape), gain.dtype.name),
                                 remedy=f"a {x.dtype.name} gain of shape ({n},)")
        name = f"rms_norm_{_suffix(x.dtype, 'x')}_{_suffix(out_dtype, 'out')}"
        x = self._contiguous(x, stream)
        out = self._empty(x.shape, out_dtype, stream)
        rows = x.size // n if n else 0
        if rows:
            self._launch(name, _blocks(rows, NORM_ROWS_PER_BLOCK), 32 * NORM_ROWS_PER_BLOCK,
                         (x, self._contiguous(gain, stream), out, _i64(rows), _i64(n),
                          np.float32(eps)), stream)
        return out

    def add_rms_norm(self, residual, delta, gain, eps: float, out_dtype, *, stream):
        """(residual + delta, RMSNorm of it): delta of any float dtype is added in
        residual's dtype; both [..., n]."""
        self._check(residual, "residual")
        self._check(delta, "delta")
        self._check(gain, "gain")
        n = residual.shape[-1]
        if delta.shape != residual.shape or gain.shape != (n,) or gain.dtype != residual.dtype:
            raise ExecutionError("AddRMSNorm's operands do not match", field="delta",
                                 value=(tuple(residual.shape), tuple(delta.shape),
                                        tuple(gain.shape)),
                                 remedy=f"residual and delta of one shape, a gain of ({n},)")
        name = (f"add_rms_norm_{_suffix(residual.dtype, 'residual')}_"
                f"{_suffix(delta.dtype, 'delta')}_{_suffix(out_dtype, 'out')}")
        residual = self._contiguous(residual, stream)
        delta = self._contiguous(delta, stream)
        total = self._empty(residual.shape, residual.dtype, stream)
        out = self._empty(residual.shape, out_dtype, stream)
        rows = residual.size // n if n else 0
        if rows:
            self._launch(name, _blocks(rows, NORM_ROWS_PER_BLOCK), 32 * NORM_ROWS_PER_BLOCK,
                         (residual, delta, self._contiguous(gain, stream), total, out,
                          _i64(rows), _i64(n), np.float32(eps)), stream)
        return total, out

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
        rows = _prologue_rows(residual)
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
        if not _prologue_rows(residual):
            return None  # decided first: a prefill's every norm asks
        narrow = _suffix(out_dtype, "out")
        name = f"norm_gemv_{_suffix(residual.dtype, 'residual')}_{narrow}_{narrow}"
        if not 1 <= len(weights) <= 3 or name not in self._functions:
            return None
        operands = self._norm_operands(residual, delta, gain, out_dtype, weights, stream)
        if operands is None:
            return None
        residual, delta, total, rows, k = operands
        lead = tuple(residual.shape[:-1])
        outs = [self._empty(lead + (w.shape[0],), out_dtype, stream) for w in weights]
        itemsize = np.dtype(out_dtype).itemsize
        ws = list(weights) + [weights[-1]] * (3 - len(weights))
        os_ = outs + [outs[-1]] * (3 - len(outs))
        ns = [w.shape[0] for w in weights] + [0] * (3 - len(weights))
        teams = [gemv_team(n, k, itemsize) if n else 1 for n in ns]
        blocks = [-(-n // (GEMV_WARPS_PER_BLOCK // t)) for n, t in zip(ns, teams)]
        null = np.uint64(0)
        self._launcher.launch(
            self._functions[name], (sum(blocks),), (PROLOGUE_BLOCK,),
            (residual, null if delta is None else delta, self._contiguous(gain, stream),
             null if total is None else total, np.float32(eps), *ws, *os_, _i64(rows),
             _i64(k), *map(_i64, ns), *map(np.int32, teams), _i64(blocks[0]),
             _i64(blocks[1])),
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
        if not _prologue_rows(residual) or len(weights) != 2 \
                or weights[0].shape != weights[1].shape \
                or np.dtype(glu_dtype) != np.dtype(out_dtype):
            return None
        name = (f"norm_glu_{_suffix(residual.dtype, 'residual')}_{_suffix(out_dtype, 'out')}_"
                f"{_suffix(compute_dtype, 'compute')}")
        if name not in self._functions:
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
        out = self._empty(tuple(residual.shape[:-1]) + (n,), out_dtype, stream)
        pairs = GEMV_WARPS_PER_BLOCK // 2 // team
        null = np.uint64(0)
        self._launcher.launch(
            self._functions[name], (-(-n // pairs),), (PROLOGUE_BLOCK,),
            (residual, null if delta is None else delta, self._contiguous(gain, stream),
             null if total is None else total, np.float32(eps), weights[0], weights[1], out,
             _i64(rows), _i64(k), _i64(n), np.int32(team)),
            stream, rows * k * itemsize)
        return ((total,) if total is not None else ()) + (out,)

    def swiglu_gemv(self, gate, up, compute_dtype, out_dtype, weight, *, stream):
        """``swiglu(gate, up) @ W^T`` for a cached [N, K] weight in one launch, bit for bit
        ``swiglu`` then ``gemv_rows``; None where the launch cannot take the operands."""
        k = gate.shape[-1]
        rows = _prologue_rows(gate)
        if not rows:
            return None  # decided first: a prefill's every layer asks
        self._check(gate, "gate")
        self._check(up, "up")
        if up.shape != gate.shape or up.dtype != gate.dtype \
                or not self._prologue_fits(rows, k, out_dtype, [weight]):
            return None
        name = (f"swiglu_gemv_{_suffix(gate.dtype, 'gate')}_"
                f"{_suffix(compute_dtype, 'compute')}_{_suffix(out_dtype, 'out')}")
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
            (gate, up, weight, out, _i64(rows), _i64(k), _i64(n), np.int32(team),
             np.int32(gvec)), stream, rows * k * itemsize)
        return out

    def rotary(self, x, cos, sin, layout: str, compute_dtype, scale, out_dtype, *, stream):
        """x [B, H, M, D] (any strides) rotated with cos/sin broadcast to it."""
        for value, what in ((x, "x"), (cos, "cos"), (sin, "sin")):
            self._check(value, what)
        shape = tuple(x.shape)
        try:
            cos_b = self._cupy.broadcast_to(cos, shape)
            sin_b = self._cupy.broadcast_to(sin, shape)
        except ValueError:
            raise ExecutionError("cos/sin do not broadcast to x", field="cos",
                                 value=(tuple(cos.shape), shape),
                                 remedy="feed tables of shape [1, 1, M, head_dim]") from None
        name = (f"rotary_{_suffix(x.dtype, 'x')}_{_suffix(compute_dtype, 'cos')}_"
                f"{_suffix(out_dtype, 'out')}")
        out = self._empty(shape, out_dtype, stream)
        total = out.size
        if total:
            strides = [s // a.itemsize for a in (x, cos_b, sin_b) for s in a.strides]
            self._launch(name, _blocks(total, BLOCK), BLOCK,
                         (x, cos_b, sin_b, out, _i64(total), _i64(shape[1]), _i64(shape[2]),
                          _i64(shape[3]), *map(_i64, strides), np.int32(layout == "pairs"),
                          np.int32(scale is not None),
                          np.float32(0.0 if scale is None else scale)), stream)
        return out

    def _broadcast_strides(self, table, shape, what: str) -> list[int]:
        """The table's element strides broadcast to ``shape``; 0 along every axis of extent
        1 (only index 0 is read there), so tables broadcast to shapes that differ only in
        such axes (queries and a single KV head) compare equal."""
        strides = broadcast_element_strides(tuple(table.shape), tuple(table.strides),
                                            table.itemsize, tuple(shape))
        if strides is None:
            raise ExecutionError(f"{what} does not broadcast to x", field=what,
                                 value=(tuple(table.shape), shape),
                                 remedy="feed tables of shape [1, 1, M, head_dim]")
        return list(strides)

    def _tables(self, cos, sin, shape) -> list[int]:
        """cos's then sin's element strides broadcast to ``shape`` (a rotation's launch
        arguments)."""
        return (self._broadcast_strides(cos, shape, "cos")
                + self._broadcast_strides(sin, shape, "sin"))

    def rotary2(self, xa, xb, cos, sin, layout: str, compute_dtype, scale_a, scale_b,
                out_dtype, *, stream):
        """Two ``rotary``s over the same cos/sin in one launch (queries and keys: their
        heads and scales may differ; dtype, M and head_dim may not, else two launches)."""
        for value, what in ((xa, "xa"), (xb, "xb"), (cos, "cos"), (sin, "sin")):
            self._check(value, what)
        shape_a, shape_b = tuple(xa.shape), tuple(xb.shape)
        tables_a, tables_b = self._tables(cos, sin, shape_a), self._tables(cos, sin, shape_b)
        if xa.dtype != xb.dtype or shape_a[0] != shape_b[0] or shape_a[2:] != shape_b[2:] \
                or tables_a != tables_b:
            return (self.rotary(xa, cos, sin, layout, compute_dtype, scale_a, out_dtype,
                                stream=stream),
                    self.rotary(xb, cos, sin, layout, compute_dtype, scale_b, out_dtype,
                                stream=stream))
        name = (f"rotary2_{_suffix(xa.dtype, 'x')}_{_suffix(compute_dtype, 'cos')}_"
                f"{_suffix(out_dtype, 'out')}")
        out_a = self._empty(shape_a, out_dtype, stream)
        out_b = self._empty(shape_b, out_dtype, stream)
        total = out_a.size + out_b.size
        if total:
            def part(x, out, scale):
                strides = [st // x.itemsize for st in x.strides]
                return (x, out, _i64(out.size), _i64(x.shape[1]), *map(_i64, strides),
                        np.int32(scale is not None),
                        np.float32(0.0 if scale is None else scale))

            self._launch(name, _blocks(total, BLOCK), BLOCK,
                         (*part(xa, out_a, scale_a), *part(xb, out_b, scale_b),
                          cos, sin, _i64(shape_a[2]),
                          _i64(shape_a[3]), *map(_i64, tables_a),
                          np.int32(layout == "pairs")), stream)
        return out_a, out_b

    def rotary_kv(self, xq, xk, cos, sin, layout: str, compute_dtype, scale_q, scale_k,
                  out_dtype, old_k, old_v, new_v, positions, *, stream):
        """``rotary2(xq, xk, ...)`` then ``kv_write2(old_k, rotated keys, old_v, new_v,
        positions)`` in one launch: (rotated queries, key cache, value cache), bit for bit
        the two launches'. None where one launch cannot take the operands (the caller runs
        the two)."""
        for value, what in ((xq, "xq"), (xk, "xk"), (cos, "cos"), (sin, "sin"),
                            (old_k, "old_k"), (old_v, "old_v"), (new_v, "new_v")):
            self._check(value, what)
        shape_q, shape_k = tuple(xq.shape), tuple(xk.shape)
        tables = self._tables(cos, sin, shape_q)
        if xq.dtype != xk.dtype or shape_q[0] != shape_k[0] or shape_q[2:] != shape_k[2:] \
                or tables != self._tables(cos, sin, shape_k):
            return None
        b, hk, m, d = shape_k
        dtype = np.dtype(out_dtype)
        if old_k.ndim != 4 or old_v.ndim != 4 or new_v.ndim != 4 \
                or (old_k.shape[0], old_k.shape[1], old_k.shape[3]) != (b, hk, d) \
                or old_v.shape[2] != old_k.shape[2] \
                or (new_v.shape[0], new_v.shape[1], new_v.shape[2], new_v.shape[3]) \
                != (old_v.shape[0], old_v.shape[1], m, old_v.shape[3]) or old_v.shape[3] != d \
                or not (old_k.dtype == old_v.dtype == new_v.dtype == dtype):
            return None
        old_k, old_v = self._contiguous(old_k, stream), self._contiguous(old_v, stream)
        per = 16 // dtype.itemsize
        if not all(_runs_fit(x, per) for x in (old_k, old_v, new_v)):
            return None
        name = (f"rotary_kv_{_suffix(xq.dtype, 'x')}_{_suffix(compute_dtype, 'cos')}_"
                f"{_suffix(dtype, 'out')}")
        pos = self._positions(positions, m, stream)
        out_q = self._empty(shape_q, dtype, stream)
        cache_k = self._empty(old_k.shape, dtype, stream)
        cache_v = self._empty(old_v.shape, dtype, stream)
        runs_k, runs_v = cache_k.size // per, cache_v.size // per
        total = out_q.size + runs_k + runs_v
        if total:
            vb, vh, vm, _ = _elem_strides(new_v)
            self._launch(name, _blocks(total, BLOCK), BLOCK,
                         (xq, out_q, _i64(out_q.size), _i64(shape_q[1]),
                          *map(_i64, _elem_strides(xq)), np.int32(scale_q is not None),
                          np.float32(0.0 if scale_q is None else scale_q),
                          xk, _i64(hk), *map(_i64, _elem_strides(xk)),
                          np.int32(scale_k is not None),
                          np.float32(0.0 if scale_k is None else scale_k),
                          cos, sin, _i64(m), _i64(d),
                          *map(_i64, tables), np.int32(layout == "pairs"),
                          old_k, cache_k, _i64(runs_k), old_v, new_v, cache_v, _i64(runs_v),
                          _i64(old_v.shape[1]), _i64(vb), _i64(vh), _i64(vm), pos,
                          _i64(old_k.shape[2])), stream)
        return out_q, cache_k, cache_v

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
        name = (f"rotary_kv_attention_{_suffix(xq.dtype, 'x')}_{_suffix(compute_dtype, 'cos')}_"
                f"{_suffix(dtype, 'out')}")
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
        tables = self._tables(cos, sin, tuple(xq.shape))
        if tables != self._tables(cos, sin, tuple(xk.shape)):
            return None
        per = 16 // dtype.itemsize
        if not all(_runs_fit(x, per) for x in (old_k, old_v, new_v)):
            return None
        pos = self._positions(positions, m, stream)
        cache_k = self._empty(old_k.shape, dtype, stream)
        cache_v = self._empty(old_v.shape, dtype, stream)
        out = self._empty((1, m, hq * d), dtype, stream)
        runs_k, runs_v = cache_k.size // per, cache_v.size // per
        _, vh, vm, _ = _elem_strides(new_v)
        self._launch(name, hq * m + _blocks(runs_k + runs_v, ATTENTION_BLOCK), ATTENTION_BLOCK,
                     (xq, _i64(hq), *map(_i64, _elem_strides(xq)),
                      np.int32(scale_q is not None),
                      np.float32(0.0 if scale_q is None else scale_q),
                      xk, _i64(hk), *map(_i64, _elem_strides(xk)), np.int32(scale_k is not None),
                      np.float32(0.0 if scale_k is None else scale_k),
                      cos, sin, _i64(m), _i64(d), *map(_i64, tables),
                      np.int32(layout == "pairs"), old_k, cache_k, _i64(runs_k), old_v, new_v,
                      cache_v, _i64(runs_v), _i64(old_v.shape[1]), _i64(0), _i64(vh),
                      _i64(vm), pos, _i64(t), _i64(group), np.int32(scale is not None),
                      np.float32(0.0 if scale is None else scale), out), stream)
        return cache_k, cache_v, out

    def swiglu(self, gate, up, compute_dtype, out_dtype, *, stream):
        self._check(gate, "gate")
        self._check(up, "up")
        name = (f"swiglu_{_suffix(gate.dtype, 'gate')}_{_suffix(compute_dtype, 'compute')}_"
                f"{_suffix(out_dtype, 'out')}")
        gate, up = self._contiguous(gate, stream), self._contiguous(up, stream)
        out = self._empty(gate.shape, out_dtype, stream)
        if out.size:
            self._launch(name, _blocks(out.size, BLOCK), BLOCK,
                         (gate, up, out, _i64(out.size)), stream)
        return out

    def _positions(self, positions, count: int, stream):
        self._check(positions, "positions")
        if positions.dtype != np.int64 or positions.size != count:
            raise ExecutionError(f"positions must be {count} int64 values",
                                 field="positions",
                                 value=(tuple(positions.shape), positions.dtype.name),
                                 remedy="feed position_ids as int64 [1, M]")
        return self._contiguous(positions, stream)

    def kv_write(self, old, new, positions, *, stream):
        """A copy of the cache old [B, H, C, D] with slot positions[m] = new[:, :, m]."""
        old, out, (total, h, d, *strides) = self._kv_operands(old, new, stream)
        m = new.shape[2]
        pos = self._positions(positions, m, stream)
        if out.size:
            self._launch(f"kv_write_{_suffix(old.dtype, 'old')}", _blocks(out.size, BLOCK),
                         BLOCK, (old, new, pos, out, total, h, _i64(old.shape[2]), d, _i64(m),
                                 *strides), stream)
        return out

    def _kv_operands(self, old, new, stream):
        """The checked operands of one cache write: old (C-contiguous), a fresh output, and
        the launch's (total, H, D, new's four element strides)."""
        self._check(old, "old")
        self._check(new, "new")
        b, h, c, d = old.shape
        if new.ndim != 4 or (new.shape[0], new.shape[1], new.shape[3]) != (b, h, d) \
                or new.dtype != old.dtype:
            raise ExecutionError("new rows do not fit the cache", field="new",
                                 value=(tuple(new.shape), new.dtype.name),
                                 remedy=f"[{b}, {h}, M, {d}] rows in {old.dtype.name}")
        old = self._contiguous(old, stream)
        out = self._empty(old.shape, old.dtype, stream)
        strides = [s // new.itemsize for s in new.strides]
        return old, out, (_i64(out.size), _i64(h), _i64(d), *map(_i64, strides))

    def kv_write2(self, old_a, new_a, old_b, new_b, positions, *, stream):
        """Two ``kv_write``s at the same positions in one launch (same dtype, slots and
        rows; otherwise two launches)."""
        if old_a.dtype != old_b.dtype or old_a.ndim != 4 or old_b.ndim != 4 \
                or old_a.shape[2] != old_b.shape[2] or new_a.shape[2:3] != new_b.shape[2:3]:
            return (self.kv_write(old_a, new_a, positions, stream=stream),
                    self.kv_write(old_b, new_b, positions, stream=stream))
        old_a, out_a, args_a = self._kv_operands(old_a, new_a, stream)
        old_b, out_b, args_b = self._kv_operands(old_b, new_b, stream)
        m = new_a.shape[2]
        pos = self._positions(positions, m, stream)
        total = out_a.size + out_b.size
        per = 16 // old_a.itemsize
        if total and all(_runs_fit(x, per) for x in (old_a, new_a, old_b, new_b)):
            # 16-byte runs: caches and rows aligned, D whole runs, rows contiguous along D
            runs_a, runs_b = out_a.size // per, out_b.size // per
            self._launch(f"kv_write2v_{_suffix(old_a.dtype, 'old')}",
                         _blocks(runs_a + runs_b, BLOCK), BLOCK,
                         (old_a, new_a, out_a, _i64(runs_a), *args_a[1:6], old_b, new_b,
                          out_b, _i64(runs_b), *args_b[1:6], pos, _i64(old_a.shape[2]),
                          _i64(m)), stream)
            return out_a, out_b
        name = f"kv_write2_{_suffix(old_a.dtype, 'old')}"
        if total:
            self._launch(name, _blocks(total, BLOCK), BLOCK,
                         (old_a, new_a, out_a, *args_a, old_b, new_b, out_b, *args_b, pos,
                          _i64(old_a.shape[2]), _i64(m)), stream)
        return out_a, out_b

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
        kinds = f"{_suffix(q.dtype, 'q')}_{_suffix(score_dtype, 'scores')}"
        name = f"attention_{kinds}"
        k, v = self._contiguous(k, stream), self._contiguous(v, stream)
        out = self._empty((1, m, heads * d), q.dtype, stream)
        if out.size == 0:
            return out
        # key and value rows in 16-byte loads where each row is whole vectors and both caches
        # are aligned
        kvec = (d * k.itemsize) % 16 == 0 and k.data.ptr % 16 == 0 and v.data.ptr % 16 == 0
        qs = _elem_strides(q)[1:]
        rows = min(ATTENTION_ROWS, ATTENTION_ROWS_SMEM_FLOATS // (t + d))
        if kvec and m > PROLOGUE_ROWS and rows >= 2:  # a prefill: rows share key loads
            self._launcher.launch(
                self._functions[f"attention_rows_{kinds}"],
                (heads * -(-m // rows),), (ATTENTION_BLOCK,),
                (q, k, v, pos, out, _i64(heads), _i64(m), _i64(t), _i64(d), _i64(group),
                 *map(_i64, qs), np.int32(scale is not None),
                 np.float32(0.0 if scale is None else scale), np.int32(rows)),
                stream, rows * (d + t) * 4)
            return out
        # scores in global scratch only for caches longer than the shared array holds
        scratch = self._empty((heads * m * t if t > ATTENTION_SMEM_KEYS else 1,),
                              np.float32, stream)
        groups = ATTENTION_BLOCK // d if d <= ATTENTION_BLOCK else 1
        self._launch(name, heads * m, ATTENTION_BLOCK,
                     (q, k, v, pos, out, scratch, _i64(heads), _i64(m), _i64(t), _i64(d),
                      _i64(group), *map(_i64, qs), np.int32(scale is not None),
                      np.float32(0.0 if scale is None else scale), np.int32(groups),
                      np.int32(kvec)), stream)
        return out


class StreamKernels:
    """``FusedKernels`` bound to one stream: the op kernels call these."""

    def __init__(self, kernels: FusedKernels, stream):
        self.kernels = kernels
        self.stream = stream

    def rms_norm(self, x, gain, eps, out_dtype):
        return self.kernels.rms_norm(x, gain, eps, out_dtype, stream=self.stream)

    def add_rms_norm(self, residual, delta, gain, eps, out_dtype):
        return self.kernels.add_rms_norm(residual, delta, gain, eps, out_dtype,
                                         stream=self.stream)

    def norm_gemv(self, residual, delta, gain, eps, out_dtype, weights):
        return self.kernels.norm_gemv(residual, delta, gain, eps, out_dtype, weights,
                                      stream=self.stream)

    def swiglu_gemv(self, gate, up, compute_dtype, out_dtype, weight):
        return self.kernels.swiglu_gemv(gate, up, compute_dtype, out_dtype, weight,
                                        stream=self.stream)

    def norm_glu(self, residual, delta, gain, eps, out_dtype, weights, compute_dtype,
                 glu_dtype):
        return self.kernels.norm_glu(residual, delta, gain, eps, out_dtype, weights,
                                     compute_dtype, glu_dtype, stream=self.stream)

    def rotary(self, x, cos, sin, layout, compute_dtype, scale, out_dtype):
        return self.kernels.rotary(x, cos, sin, layout, compute_dtype, scale, out_dtype,
                                   stream=self.stream)

    def rotary2(self, xa, xb, cos, sin, layout, compute_dtype, scale_a, scale_b, out_dtype):
        return self.kernels.rotary2(xa, xb, cos, sin, layout, compute_dtype, scale_a, scale_b,
                                    out_dtype, stream=self.stream)

    def rotary_kv(self, xq, xk, cos, sin, layout, compute_dtype, scale_q, scale_k, out_dtype,
                  old_k, old_v, new_v, positions):
        return self.kernels.rotary_kv(xq, xk, cos, sin, layout, compute_dtype, scale_q,
                                      scale_k, out_dtype, old_k, old_v, new_v, positions,
                                      stream=self.stream)

    def rotary_kv_attention(self, xq, xk, cos, sin, layout, compute_dtype, scale_q, scale_k,
                            out_dtype, old_k, old_v, new_v, positions, kv_heads, group, scale,
                            score_dtype):
        return self.kernels.rotary_kv_attention(
            xq, xk, cos, sin, layout, compute_dtype, scale_q, scale_k, out_dtype, old_k, old_v,
            new_v, positions, kv_heads, group, scale, score_dtype, stream=self.stream)

    def swiglu(self, gate, up, compute_dtype, out_dtype):
        return self.kernels.swiglu(gate, up, compute_dtype, out_dtype, stream=self.stream)

    def kv_write(self, old, new, positions):
        return self.kernels.kv_write(old, new, positions, stream=self.stream)

    def kv_write2(self, old_a, new_a, old_b, new_b, positions):
        return self.kernels.kv_write2(old_a, new_a, old_b, new_b, positions,
                                      stream=self.stream)

    def attention(self, q, k, v, positions, kv_heads, group, scale, score_dtype):
        return self.kernels.attention(q, k, v, positions, kv_heads, group, scale, score_dtype,
                                      stream=self.stream)


_COMPILED: dict[int, FusedKernels] = {}


def get_fused_kernels(device_id: int = 0) -> FusedKernels:
    """The compiled fused kernels for ``device_id``, compiled once per process."""
    kernels = _COMPILED.get(int(device_id))
    if kernels is None:
        kernels = _COMPILED[int(device_id)] = FusedKernels(device_id)
    return kernels
