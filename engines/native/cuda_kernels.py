"""Hand-written CUDA kernels for the native-cuda executor, and thin launchers for them.

Why hand-written: cuBLAS cannot be called inside CUDA stream capture, and its float32 rows
change with the number of rows M (both seen on the H200). Every kernel here computes each
output element with one fixed reduction order that depends on nothing but the element's
own operands, so row i of an M-row product is bit-for-bit the M=1 product, and zero terms
appended to a reduction leave its result unchanged.

- ``gemv_rows``: activations [M, K] x a weight ([K, N], or pre-transposed [N, K]). One warp
  per output column; lane l accumulates k = l, l+32, ... in float32 with fused
  multiply-adds, then a fixed butterfly (``shfl_xor`` 16, 8, 4, 2, 1) adds the 32 partial
  sums. The rows of a chunk (at most 16) share each weight load; the chunk's row count is a
  template constant (one instantiation per count, nothing predicated), larger M loops over
  chunks, and a row's arithmetic never depends on where it sits or how many rows there are.
  When K is a whole number of 16-byte vectors (``gemv_k_vector_order``), ``gemv_vec`` runs
  instead: runs of 4 float32 or 8 16-bit k per lane, a team of 1, 2 or 4 warps per column
  chosen from N, K and the dtype alone (``gemv_team``), a fixed butterfly per warp and the
  team's warps added in order: one order per (K, N), whatever M, the weight's layout or the
  alignment.
  A cached [N, K] weight with 16-byte aligned operands (``gemv_vectorised``) is loaded 16
  bytes at a time; a [K, N] weight element by element, with the same arithmetic.
  ``gemv_vec3`` runs two or three such GEMVs over one x in one launch (the fusion pass's
  q/k/v and gate/up), each weight's blocks exactly as its own launch would run them.
  ``gemv_tile`` takes over for more rows than one chunk (a prefill, ``gemv_tile_rows``): a
  block stages up to 16 rows of x in shared memory once, as float32, and each team of warps
  computes four adjacent columns for all of them at once (an x value read serves four
  columns, a weight value every row); each column's additions are ``gemv_vec``'s, in its
  order, so the bits are too. ``gemv_tile3`` is to ``gemv_tile`` what ``gemv_vec3`` is to
  ``gemv_vec``: a prefill's q/k/v or gate/up in one launch.
- ``batched_matmul``: activation x activation ([..., M, K] @ [..., K, N], broadcasting up
  to four batch axes, any strides). One thread per output element, sequential K loop, each
  product rounded then added: the host backend's arithmetic exactly, so the two agree bit
  for bit (the GEMV's lane split cannot; it agrees within the tolerance table).
- ``sum_axis``: one thread per output element, sequential loop over the reduced extent
  from +0 (float16 accumulated in float32, rounded once): again the host's arithmetic.

float16 is stored as raw 16-bit words and converted with PTX ``cvt`` instructions, so the
source needs no header (NVRTC finds none on some installs). Compiled with ``--fmad=false``:
the only fused multiply-adds are the explicit ones. Every launch names the stream; none
synchronises with the host. CuPy is imported lazily, so this module (and its source) loads
on machines without CUDA.
"""
from __future__ import annotations

import re
from string import Template
from typing import Any

import numpy as np

from engines.errors import ExecutionError, ResidencyError
from engines.native.dtype_names import dtype_name
from engines.native.kernel_launch import KernelLauncher, note_allocation

GEMV_ROWS_PER_CHUNK = 16  # rows that share one pass over the weights
GEMV_WARPS_PER_BLOCK = 4  # output columns per block of 128 threads
# warps of a gemv_tile block (many rows): they share one x tile. 8 (not 16) so that an SM
# holds several blocks and one block's staging of x overlaps another's multiply-adds
GEMV_TILE_WARPS = 8
GEMV_TILE_COLS = 4  # adjacent columns a gemv_tile team computes at once (16 rows x 4: 64 sums)
GEMV_TILE_BYTES = 45 * 1024  # shared memory for a gemv_tile block's rows of x
GEMV_TILE_ITEM = 4  # bytes a staged x value takes: gemv_tile stages x as float32, any dtype
LINEAR_BLOCK = 256  # threads per block for the one-thread-per-output kernels
MAX_BATCH_AXES = 4  # batched_matmul broadcasts over at most this many batch axes
COMPILE_OPTIONS = ("--fmad=false",)

# dtype name -> (suffix, storage type, accumulator type)
_TYPES = {
    "float32": ("f32", "float", "float"),
    "float16": ("f16", "lk_half", "float"),
    "bfloat16": ("bf16", "lk_bf16", "float"),
    "float64": ("f64", "double", "double"),
    "int32": ("i32", "int", "long long"),
    "int64": ("i64", "long long", "long long"),
}
GEMV_DTYPES = ("float32", "float16", "bfloat16")
MATMUL_DTYPES = tuple(_TYPES)
SUM_DTYPES = tuple(_TYPES)

_PRELUDE = r"""
// lockstep native-cuda kernels: fixed reduction orders, no cuBLAS, no host synchronisation.
typedef unsigned short lk_half;  // float16 as raw bits; converted with PTX cvt below
// bfloat16 as raw bits, in a struct so its overloads differ from lk_half's: a bfloat16 is
// the high half of a float32, so loading is a shift; storing rounds to nearest even.
struct lk_bf16 { unsigned short bits; };  // size 2, alignment 2
#define LK_GEMV_ROWS $rows

__device__ __forceinline__ float lk_load(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ double lk_load(const double* p, long long i) { return p[i]; }
__device__ __forceinline__ long long lk_load(const int* p, long long i) { return (long long)p[i]; }
__device__ __forceinline__ long long lk_load(const long long* p, long long i) { return p[i]; }
__device__ __forceinline__ float lk_load(const lk_half* p, long long i) {
    float f;
    const lk_half h = p[i];
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}
__device__ __forceinline__ float lk_bf16_to_float(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}
__device__ __forceinline__ float lk_load(const lk_bf16* p, long long i) {
    return lk_bf16_to_float(p[i].bits);
}

__device__ __forceinline__ void lk_store(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void lk_store(double* p, long long i, double v) { p[i] = v; }
__device__ __forceinline__ void lk_store(int* p, long long i, long long v) { p[i] = (int)v; }
__device__ __forceinline__ void lk_store(long long* p, long long i, long long v) { p[i] = v; }
__device__ __forceinline__ void lk_store(lk_half* p, long long i, float v) {
    lk_half h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    p[i] = h;
}
// float -> bfloat16, round to nearest even; a NaN stays a NaN (quiet, sign kept), as
// ml_dtypes converts it; overflow rounds to infinity. From sm_80 the hardware conversion
// rounds (one instruction; the integer rounding below made a bfloat16 decode step about 8%
// slower on the H200) and only a NaN takes ml_dtypes' pattern; older devices round in
// integers. Both give the same bits for every float.
__device__ __forceinline__ unsigned short lk_float_to_bf16(float v) {
    const unsigned int u = __float_as_uint(v);
    const unsigned short nan = (unsigned short)(((u >> 16) & 0x8000u) | 0x7fc0u);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return (u & 0x7fffffffu) > 0x7f800000u ? nan : h;
#else
    if ((u & 0x7fffffffu) > 0x7f800000u) return nan;
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}
__device__ __forceinline__ void lk_store(lk_bf16* p, long long i, float v) {
    p[i].bits = lk_float_to_bf16(v);
}

// Programmatic dependent launch (dependent_launch.py): a kernel launched with the
// programmatic serialization attribute may start while the kernel ahead of it on the stream
// still runs. Every kernel calls this before it reads or writes anything another kernel
// touches (only weight prefetches, hints, come first): it waits until the kernel ahead has
// finished and its writes are visible, then lets the next kernel's blocks start, so their
// prefetches overlap this kernel's work. Launched without the attribute it returns at once.
__device__ __forceinline__ void lk_grid_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A warp's 32 values added in one fixed butterfly (xor 16, 8, 4, 2, 1): every lane gets
// the sum. Every GEMV and block reduction sums its lanes this way.
__device__ __forceinline__ float lk_warp_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 16);
    v += __shfl_xor_sync(0xffffffffu, v, 8);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v;
}

"""

_GEMV = r"""
// One chunk of R rows (R a compile-time constant, so nothing is predicated): lane l adds
// x[i, k] * w(k, n) for k = l, l+32, ... with fused multiply-adds, in that order, then a
// fixed butterfly sums the 32 lanes. Row i's arithmetic is the same for every R.
template <int R>
__device__ __forceinline__ void lk_gemv_chunk_$S(const $T* __restrict__ xr,
                                                 const $T* __restrict__ w,
                                                 $T* __restrict__ out, long long K, long long N,
                                                 long long n, long long w_base,
                                                 long long w_step, long long m0, int lane) {
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] = 0.0f;
#pragma unroll 4
    for (long long k = lane; k < K; k += 32) {
        const float wv = lk_load(w, w_base + k * w_step);
#pragma unroll
        for (int i = 0; i < R; ++i) acc[i] = __fmaf_rn(lk_load(xr, i * K + k), wv, acc[i]);
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const float v = lk_warp_sum(acc[i]);
        if (lane == 0) lk_store(out, (m0 + i) * N + n, v);
    }
}

// out[m, n] = sum_k x[m, k] * w(k, n); w(k, n) = w[k * N + n] (kn) or w[n * K + k] (nk).
// One warp per column n; rows in chunks of LK_GEMV_ROWS share each weight load.
extern "C" __global__ void gemv_rows_$S(const $T* __restrict__ x, const $T* __restrict__ w,
                                        $T* __restrict__ out, long long M, long long K,
                                        long long N, long long w_is_nk) {
    lk_grid_wait();
    const int lane = threadIdx.x & 31;
    const long long n = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;  // uniform across the warp: the shuffles see all 32 lanes
    const long long w_base = w_is_nk ? n * K : n;
    const long long w_step = w_is_nk ? 1 : N;
    for (long long m0 = 0; m0 < M; m0 += LK_GEMV_ROWS) {
        const long long rows = (M - m0) < LK_GEMV_ROWS ? (M - m0) : LK_GEMV_ROWS;
        const $T* xr = x + m0 * K;
        switch (rows) {
$cases
        }
    }
}
"""

_UNPACK = r"""
// The 16 / sizeof(T) values of a 16-byte run of storage type T (the last argument's type, a
// tag) as floats, element 0 the lowest bytes: exactly lk_load's values (every conversion is
// exact), in fewer instructions for bfloat16 (a pair is one shift and one mask of a word,
// not two 16-bit extractions). The run is taken by value: one 16-byte load into registers
// (a reference would let the float16 overload read memory two bytes at a time).
template <int V>
__device__ __forceinline__ void lk_unpack16_words(const lk_vec16 v, float (&f)[V], float) {
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(v.words[i]);
}
template <int V>
__device__ __forceinline__ void lk_unpack16_words(const lk_vec16 v, float (&f)[V], lk_half) {
    const lk_half* h = reinterpret_cast<const lk_half*>(&v);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = lk_load(h, i);
}
template <int V>
__device__ __forceinline__ void lk_unpack16_words(const lk_vec16 v, float (&f)[V], lk_bf16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(v.words[i] << 16);
        f[2 * i + 1] = __uint_as_float(v.words[i] & 0xffff0000u);
    }
}
"""

_FOLD = r"""
// One level of a warp's butterfly over many sums at once: lane l holds 2 * HALF sums, keeps
// the upper half where bit MASK of l is set (the lower otherwise) and adds its partner's
// (l ^ MASK) copy of the kept ones: each kept sum becomes the butterfly's v + shfl_xor(v),
// bit for bit (an addition of two floats does not depend on their order), for half the
// shuffles. After the levels 16, 8, 4, 2, 1 of 32 * P sums, lane l holds sums P * l to
// P * l + P - 1.
template <int HALF, int MASK, int N>
__device__ __forceinline__ void lk_fold(float (&acc)[N], int lane) {
    const bool up = (lane & MASK) != 0;
#pragma unroll
    for (int j = 0; j < HALF; ++j) {
        const float keep = up ? acc[j + HALF] : acc[j];
        const float send = up ? acc[j] : acc[j + HALF];
        acc[j] = keep + __shfl_xor_sync(0xffffffffu, send, MASK);
    }
}
"""

_GEMV_VEC = r"""
// The K-vector GEMV order (K a multiple of V = 16 bytes' worth of $T). A team of `team`
// warps (1, 2 or 4, chosen from N alone) owns a column: team thread t takes the runs of V
// consecutive k in runs c = t, t + 32 * team, ..., and adds their products with fused
// multiply-adds, k ascending within a run; a fixed butterfly sums each warp, and the
// team's warps are then added in warp order. A row's arithmetic depends on K and N only.
// VEC: both operands are loaded 16 bytes at a time (W^T [N, K] rows, both 16-byte
// aligned); otherwise each element is loaded alone, w(k, n) = wr[k * w_kstep]. The loads
// differ, the arithmetic does not, so a [K, N] weight gives the [N, K] one's bits.
template <int R, bool VEC, int WARPS>
__device__ __forceinline__ void lk_gemv_vec_chunk_$S(
        const $T* __restrict__ xr, const $T* __restrict__ wr, $T* __restrict__ out,
        long long K, long long N, long long w_kstep, long long n, long long m0, bool valid,
        int tt, int team_threads, int warp, int team, int lane, float* part) {
    constexpr int V = 16 / sizeof($T);
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] = 0.0f;
    if (valid) {
        const long long chunks = K / V;
#pragma unroll 2
        for (long long c = tt; c < chunks; c += team_threads) {
            float wf[V];
            if (VEC) {
                lk_unpack16_words(*reinterpret_cast<const lk_vec16*>(wr + c * V), wf, $T());
            } else {
#pragma unroll
                for (int v = 0; v < V; ++v) wf[v] = lk_load(wr, (c * V + v) * w_kstep);
            }
#pragma unroll
            for (int i = 0; i < R; ++i) {
                float xf[V];
                if (VEC) {
                    lk_unpack16_words(*reinterpret_cast<const lk_vec16*>(xr + i * K + c * V), xf,
                                      $T());
                } else {
#pragma unroll
                    for (int v = 0; v < V; ++v) xf[v] = lk_load(xr, i * K + c * V + v);
                }
#pragma unroll
                for (int v = 0; v < V; ++v) acc[i] = __fmaf_rn(xf[v], wf[v], acc[i]);
            }
        }
    }
#pragma unroll
    for (int i = 0; i < R; ++i) {
        const float v = lk_warp_sum(acc[i]);
        if (lane == 0) part[i * WARPS + warp] = v;
    }
    __syncthreads();
    if (valid && lane == 0 && warp % team == 0) {
        for (int i = 0; i < R; ++i) {
            float total = part[i * WARPS + warp];
            for (int s = 1; s < team; ++s) total += part[i * WARPS + warp + s];
            lk_store(out, (m0 + i) * N + n, total);
        }
    }
    __syncthreads();  // part is reused by the next chunk of rows
}

// Block `blk` of out[m, n] = sum_k x[m, k] * w(k, n), w(k, n) = w[n * w_nstep + k * w_kstep]
// (W^T [N, K]: w_nstep K, w_kstep 1; W [K, N]: 1 and N); LK_GEMV_WARPS / team columns a block.
// MAXR: the most rows a chunk of this instance takes (M <= MAXR unless MAXR is
// LK_GEMV_ROWS); SCALAR: whether it has the element-wise loads. Both only trim what is
// compiled: a row's arithmetic is the same in every instance.
template <int MAXR, bool SCALAR>
__device__ __forceinline__ void lk_gemv_vec_block_$S(const $T* __restrict__ x,
                                                     const $T* __restrict__ w,
                                                     $T* __restrict__ out, long long M,
                                                     long long K, long long N,
                                                     long long w_nstep, long long w_kstep,
                                                     int vec, int team, long long blk,
                                                     float* part) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long n = blk * (LK_GEMV_WARPS / team) + warp / team;
    const bool valid = n < N;  // every thread stays for the block's barriers
    const int tt = (warp % team) * 32 + lane;
    const $T* wr = w + (valid ? n : 0) * w_nstep;
    for (long long m0 = 0; m0 < M; m0 += LK_GEMV_ROWS) {
        const long long rows = (M - m0) < LK_GEMV_ROWS ? (M - m0) : LK_GEMV_ROWS;
        const $T* xr = x + m0 * K;
        if (vec || !SCALAR) {
            switch (rows) {
$vcases
            }
        } else if (SCALAR) {
            switch (rows) {
$scases
            }
        }
    }
}


// Ask L2 for the weight rows block `blk` of lk_gemv_vec_block will read (W^T [N, K]), each
// thread its own 16-byte runs: a kernel with a prologue issues this first, so the rows
// travel from memory while the prologue computes. A hint only: nothing is computed.
__device__ __forceinline__ void lk_gemv_prefetch_$S(const $T* __restrict__ w, long long K,
                                                    long long N, int team, long long blk) {
    constexpr int V = 16 / sizeof($T);
    const int warp = threadIdx.x >> 5;
    const long long n = blk * (LK_GEMV_WARPS / team) + warp / team;
    if (n >= N) return;
    const int tt = (warp % team) * 32 + (threadIdx.x & 31);
    const $T* wr = w + n * K;
    for (long long c = tt; c < K / V; c += 32 * team) {
        asm volatile("prefetch.global.L2 [%0];" :: "l"(wr + c * V));
    }
}

// lk_gemv_prefetch for this block's weight of gemv_vec3's split.
__device__ __forceinline__ void lk_gemv3_prefetch_$S(const $T* __restrict__ w0,
                                                     const $T* __restrict__ w1,
                                                     const $T* __restrict__ w2, long long K,
                                                     long long N0, long long N1, long long N2,
                                                     int team0, int team1, int team2,
                                                     long long blocks0, long long blocks1) {
    const long long blk = blockIdx.x;
    const bool first = blk < blocks0, second = !first && blk < blocks0 + blocks1;
    lk_gemv_prefetch_$S(first ? w0 : (second ? w1 : w2), K, first ? N0 : (second ? N1 : N2),
                        first ? team0 : (second ? team1 : team2),
                        first ? blk : (second ? blk - blocks0 : blk - blocks0 - blocks1));
}

// This block's share of up to three GEMVs over one x (gemv_vec3's split of the blocks).
template <int MAXR>
__device__ __forceinline__ void lk_gemv3_$S(const $T* __restrict__ x, const $T* __restrict__ w0,
                                            const $T* __restrict__ w1,
                                            const $T* __restrict__ w2, $T* __restrict__ out0,
                                            $T* __restrict__ out1, $T* __restrict__ out2,
                                            long long M, long long K, long long N0,
                                            long long N1, long long N2, int team0, int team1,
                                            int team2, long long blocks0, long long blocks1,
                                            float* part) {
    const long long blk = blockIdx.x;
    const bool first = blk < blocks0, second = !first && blk < blocks0 + blocks1;
    const $T* w = first ? w0 : (second ? w1 : w2);
    $T* out = first ? out0 : (second ? out1 : out2);
    const long long N = first ? N0 : (second ? N1 : N2);
    const int team = first ? team0 : (second ? team1 : team2);
    const long long b = first ? blk : (second ? blk - blocks0 : blk - blocks0 - blocks1);
    lk_gemv_vec_block_$S<MAXR, false>(x, w, out, M, K, N, K, 1, 1, team, b, part);
}
"""

_GEMV_VEC_KERNELS = r"""
#ifndef LK_GEMV3_PARAMS
// The parameters of a launch over up to three weights sharing x (gemv_vec3, gemv_tile3).
#define LK_GEMV3_PARAMS(T) const T* __restrict__ x, const T* __restrict__ w0, \
    const T* __restrict__ w1, const T* __restrict__ w2, T* __restrict__ out0, \
    T* __restrict__ out1, T* __restrict__ out2, long long M, long long K, long long N0, \
    long long N1, long long N2, int team0, int team1, int team2, long long blocks0, \
    long long blocks1
#endif
extern "C" __global__ void gemv_vec_$S(const $T* __restrict__ x, const $T* __restrict__ w,
                                       $T* __restrict__ out, long long M, long long K,
                                       long long N, long long w_nstep, long long w_kstep,
                                       int vec, int team) {
    __shared__ float part[LK_GEMV_ROWS * LK_GEMV_WARPS];
    if (vec && w_kstep == 1 && w_nstep == K) lk_gemv_prefetch_$S(w, K, N, team, blockIdx.x);
    lk_grid_wait();
    lk_gemv_vec_block_$S<LK_GEMV_ROWS, true>(x, w, out, M, K, N, w_nstep, w_kstep, vec, team,
                                              blockIdx.x, part);
}

// Up to three weights sharing x (a layer's q/k/v, or gate/up) in one launch: the first
// blocks0 blocks compute weight 0 exactly as gemv_vec would, the next blocks1 weight 1, the
// rest weight 2; each with its own team, so every column's arithmetic is the single launch's.
extern "C" __global__ void gemv_vec3_$S(LK_GEMV3_PARAMS($T)) {
    __shared__ float part[LK_GEMV_ROWS * LK_GEMV_WARPS];
    lk_gemv3_prefetch_$S(w0, w1, w2, K, N0, N1, N2, team0, team1, team2, blocks0, blocks1);
    lk_grid_wait();
    lk_gemv3_$S<LK_GEMV_ROWS>(x, w0, w1, w2, out0, out1, out2, M, K, N0, N1, N2, team0,
                              team1, team2, blocks0, blocks1, part);
}

// Many rows (a prefill): block (bx, by) converts rows [by * tile_rows, ...) of x to float32
// in shared memory once (exactly: lk_load's values), and each team of warps computes
// LK_TILE_COLS adjacent columns for all of them at once: each x value read from shared
// memory serves LK_TILE_COLS columns, each weight value every row. Every column's arithmetic
// is lk_gemv_vec_chunk's: team thread t adds its runs c = t, t + 32 * team, ... with fused
// multiply-adds, k ascending within a run, from +0; the warp's 32 partial sums are added in
// the butterfly's pairs (transposed: at each level a lane keeps half of its values and
// receives its partner's copy of them, so the R * C sums of a warp take R * C * 31 / 32
// shuffles, not R * C * 5); then the team's warps in warp order. Every element equals
// gemv_vec's bit for bit: only where operands are read from, and how many at once, differ.
// Block column bx of gemv_tile's grid (its rows from blockIdx.y); xs: the block's dynamic
// shared memory, part: LK_GEMV_ROWS * LK_TILE_COLS * LK_TILE_WARPS floats.
__device__ __forceinline__ void lk_gemv_tile_block_$S(const $T* __restrict__ x,
                                                      const $T* __restrict__ w,
                                                      $T* __restrict__ out, long long M,
                                                      long long K, long long N, int team,
                                                      int tile_rows, long long bx, float* xs,
                                                      float* part) {
    constexpr int V = 16 / sizeof($T);
    constexpr int R = LK_GEMV_ROWS;
    constexpr int C = LK_TILE_COLS;
    constexpr int VALS = R * C;
    constexpr int PER_LANE = VALS / 32;  // sums a lane holds after the reduction
    static_assert(VALS % 32 == 0, "a warp's sums must split evenly over its lanes");
    const long long m0 = (long long)blockIdx.y * tile_rows;
    const int rows = (int)((M - m0) < tile_rows ? (M - m0) : tile_rows);
    const long long runs = (long long)rows * K / V;
    const lk_vec16* src = reinterpret_cast<const lk_vec16*>(x + m0 * K);
    for (long long r = threadIdx.x; r < runs; r += blockDim.x) {
        float f[V];
        lk_unpack16_words(src[r], f, $T());
        float4* dst = reinterpret_cast<float4*>(xs + r * V);
#pragma unroll
        for (int v = 0; v < V; v += 4) dst[v / 4] = make_float4(f[v], f[v + 1], f[v + 2], f[v + 3]);
    }
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long n0 = (bx * (LK_TILE_WARPS / team) + warp / team) * C;
    const int tt = (warp % team) * 32 + lane;
    const $T* wr[C];
#pragma unroll
    for (int j = 0; j < C; ++j) wr[j] = w + (n0 + j < N ? n0 + j : N - 1) * K;  // past N: unused
    float acc[VALS];  // acc[i * C + j]: row i, column n0 + j
#pragma unroll
    for (int i = 0; i < VALS; ++i) acc[i] = 0.0f;
    const long long chunks = K / V;
    for (long long c = tt; c < chunks; c += 32 * team) {
        float wf[C][V];
#pragma unroll
        for (int j = 0; j < C; ++j)
            lk_unpack16_words(*reinterpret_cast<const lk_vec16*>(wr[j] + c * V), wf[j], $T());
#pragma unroll
        for (int i = 0; i < R; ++i) {
            if (i < rows) {
                float xf[V];
                const float4* xp = reinterpret_cast<const float4*>(xs + i * K + c * V);
#pragma unroll
                for (int v = 0; v < V; v += 4) {
                    const float4 q = xp[v / 4];
                    xf[v] = q.x;
                    xf[v + 1] = q.y;
                    xf[v + 2] = q.z;
                    xf[v + 3] = q.w;
                }
#pragma unroll
                for (int j = 0; j < C; ++j) {
#pragma unroll
                    for (int v = 0; v < V; ++v)
                        acc[i * C + j] = __fmaf_rn(xf[v], wf[j][v], acc[i * C + j]);
                }
            }
        }
    }
    lk_fold<VALS / 2, 16>(acc, lane);  // the butterfly's xor 16, 8, 4, 2, 1
    lk_fold<VALS / 4, 8>(acc, lane);
    lk_fold<VALS / 8, 4>(acc, lane);
    lk_fold<VALS / 16, 2>(acc, lane);
    lk_fold<VALS / 32, 1>(acc, lane);
    // acc[q] is now the warp's sum of value PER_LANE * lane + q
#pragma unroll
    for (int q = 0; q < PER_LANE; ++q) part[(PER_LANE * lane + q) * LK_TILE_WARPS + warp] = acc[q];
    __syncthreads();
    if (warp % team == 0) {
#pragma unroll
        for (int q = 0; q < PER_LANE; ++q) {
            const int idx = PER_LANE * lane + q;
            const int i = idx / C, j = idx % C;
            float total = part[idx * LK_TILE_WARPS + warp];
            for (int s = 1; s < team; ++s) total += part[idx * LK_TILE_WARPS + warp + s];
            if (i < rows && n0 + j < N) lk_store(out, (m0 + i) * N + n0 + j, total);
        }
    }
}

extern "C" __global__ void gemv_tile_$S(const $T* __restrict__ x, const $T* __restrict__ w,
                                        $T* __restrict__ out, long long M, long long K,
                                        long long N, int team, int tile_rows) {
    extern __shared__ __align__(16) unsigned char lk_tile_smem[];
    __shared__ float part[LK_GEMV_ROWS * LK_TILE_COLS * LK_TILE_WARPS];
    lk_grid_wait();
    lk_gemv_tile_block_$S(x, w, out, M, K, N, team, tile_rows, blockIdx.x,
                          reinterpret_cast<float*>(lk_tile_smem), part);
}

// Up to three weights sharing x (a prefill's q/k/v, or gate/up) in one launch, split as
// gemv_vec3 splits them: block columns [0, blocks0) compute weight 0 exactly as gemv_tile
// would, the next blocks1 weight 1, the rest weight 2, each with its own team.
extern "C" __global__ void gemv_tile3_$S(LK_GEMV3_PARAMS($T), int tile_rows) {
    extern __shared__ __align__(16) unsigned char lk_tile_smem[];
    __shared__ float part[LK_GEMV_ROWS * LK_TILE_COLS * LK_TILE_WARPS];
    lk_grid_wait();
    const long long blk = blockIdx.x;
    const bool first = blk < blocks0, second = !first && blk < blocks0 + blocks1;
    const long long b = first ? blk : (second ? blk - blocks0 : blk - blocks0 - blocks1);
    lk_gemv_tile_block_$S(x, first ? w0 : (second ? w1 : w2),
                          first ? out0 : (second ? out1 : out2), M, K,
                          first ? N0 : (second ? N1 : N2),
                          first ? team0 : (second ? team1 : team2), tile_rows, b,
                          reinterpret_cast<float*>(lk_tile_smem), part);
}
"""

_BMM = r"""
// out[b0, b1, b2, b3, m, n] = sum_k a(b, m, k) * b(b, k, n), strides in elements (0: broadcast).
// Each product is rounded, then added (no fusion), k ascending from +0: the arithmetic of
// NumpyArrayBackend.matmul, so the two backends agree bit for bit here.
extern "C" __global__ void bmm_$S(const $T* __restrict__ a, const $T* __restrict__ b,
                                  $T* __restrict__ out, long long total, long long M,
                                  long long N, long long K, long long d1, long long d2,
                                  long long d3, long long as0, long long as1, long long as2,
                                  long long as3, long long a_sm, long long a_sk, long long bs0,
                                  long long bs1, long long bs2, long long bs3, long long b_sk,
                                  long long b_sn) {
    lk_grid_wait();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const long long n = idx % N;
    long long t = idx / N;
    const long long m = t % M;
    t /= M;
    const long long i3 = t % d3;
    t /= d3;
    const long long i2 = t % d2;
    t /= d2;
    const long long i1 = t % d1;
    const long long i0 = t / d1;
    const long long a_off = i0 * as0 + i1 * as1 + i2 * as2 + i3 * as3 + m * a_sm;
    const long long b_off = i0 * bs0 + i1 * bs1 + i2 * bs2 + i3 * bs3 + n * b_sn;
    $A acc = 0;
#pragma unroll 8
    for (long long k = 0; k < K; ++k) {  // unrolled loads run ahead; the adds stay in order
        const $A prod = lk_load(a, a_off + k * a_sk) * lk_load(b, b_off + k * b_sk);
        acc = acc + prod;
    }
    lk_store(out, idx, acc);
}
"""

_SUM = r"""
// x viewed as [outer, L, inner] (C order); out[o, i] = sum_l x[o, l, i], l ascending.
extern "C" __global__ void sum_axis_$S(const $T* __restrict__ x, $T* __restrict__ out,
                                       long long outer, long long L, long long inner) {
    lk_grid_wait();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= outer * inner) return;
    const long long o = idx / inner;
    const long long i = idx % inner;
    const long long base = o * L * inner + i;
    $A acc = 0;
#pragma unroll 16
    for (long long l = 0; l < L; ++l) acc = acc + lk_load(x, base + l * inner);  // loads ahead, adds in order
    lk_store(out, idx, acc);
}
"""


def prelude() -> str:
    """The storage types and their lk_load/lk_store overloads: the head of every module
    (``fused_kernels`` compiles its own module on it)."""
    return Template(_PRELUDE).substitute(rows=GEMV_ROWS_PER_CHUNK)


def gemv_vec_device_source(dtype: str) -> str:
    """``gemv_vec``'s device functions for one dtype (a column chunk, a block's columns),
    without the kernels: the fused module's GEMVs with a prologue run the same functions, so
    their columns are this module's bit for bit."""
    suffix, storage, acc = _TYPES[dtype]
    vcases, scases = (
        "\n".join(f"            case {r}: if constexpr ({r} <= MAXR) "
                  f"lk_gemv_vec_chunk_{suffix}<{r}, {vec}, "
                  f"LK_GEMV_WARPS>(xr, wr, out, K, N, w_kstep, n, m0, valid, tt, "
                  f"team * 32, warp, team, lane, part); break;"
                  for r in range(1, GEMV_ROWS_PER_CHUNK + 1))
        for vec in ("true", "false"))
    return Template(_GEMV_VEC).substitute(S=suffix, T=storage, A=acc, vcases=vcases,
                                          scases=scases)


def gemv_vec_defines() -> str:
    """What ``gemv_vec_device_source`` needs ahead of it, after the prelude."""
    return "\n".join([f"#define LK_GEMV_WARPS {GEMV_WARPS_PER_BLOCK}",
                      "struct alignas(16) lk_vec16 { unsigned int words[4]; };  // one 16-byte load",
                      _UNPACK, _FOLD])


def kernel_source() -> str:
    """The whole CUDA source: one module, every kernel for every dtype it supports."""
    parts = [prelude(), gemv_vec_defines(), f"#define LK_TILE_WARPS {GEMV_TILE_WARPS}",
             f"#define LK_TILE_COLS {GEMV_TILE_COLS}"]
    for dtype, (suffix, storage, acc) in _TYPES.items():
        fields = {"S": suffix, "T": storage, "A": acc}
        if dtype in GEMV_DTYPES:
            cases = "\n".join(
                f"            case {r}: lk_gemv_chunk_{suffix}<{r}>(xr, w, out, K, N, n, w_base, "
                f"w_step, m0, lane); break;" for r in range(1, GEMV_ROWS_PER_CHUNK + 1))
            parts.append(Template(_GEMV).substitute(fields, cases=cases))
            parts.append(gemv_vec_device_source(dtype))
            parts.append(Template(_GEMV_VEC_KERNELS).substitute(fields))
        parts.append(Template(_BMM).substitute(fields))
        parts.append(Template(_SUM).substitute(fields))
    return "\n".join(parts)


KERNEL_SOURCE = kernel_source()
KERNEL_NAMES = tuple(re.findall(r'extern "C" __global__ void (\w+)\(', KERNEL_SOURCE))


def kernel_name(family: str, dtype) -> str:
    """``gemv_rows``/``bmm``/``sum_axis`` + dtype -> the compiled function's name."""
    name = dtype_name(dtype)
    supported = {"gemv_rows": GEMV_DTYPES, "gemv_vec": GEMV_DTYPES, "gemv_vec3": GEMV_DTYPES,
                 "gemv_tile": GEMV_DTYPES, "gemv_tile3": GEMV_DTYPES, "bmm": MATMUL_DTYPES,
                 "sum_axis": SUM_DTYPES}[family]
    if name not in supported:
        raise ExecutionError(f"{family} has no CUDA kernel for dtype {name}", field="dtype",
                             value=name, remedy=f"use one of: {', '.join(supported)}")
    return f"{family}_{_TYPES[name][0]}"


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


def _i64(value: int) -> np.int64:
    # CuPy passes a Python int as 64-bit; being explicit keeps every argument's width visible.
    return np.int64(value)


def _elem_strides(array) -> tuple[int, ...]:
    return tuple(s // array.itemsize for s in array.strides)


class CudaKernels:
    """The compiled module for one device and one launcher per kernel family.

    Launchers check shapes, dtypes, layout and device from array metadata only (nothing is
    read from the device), allocate the output on ``stream`` when none is given, and
    launch on ``stream``. Empty outputs launch nothing.
    """

    def __init__(self, device_id: int = 0):
        from engines.cuda_support import import_cupy

        cupy = import_cupy()
        self._cupy = cupy
        self.device_id = int(device_id)
        self._device = cupy.cuda.Device(self.device_id)  # one object: a launch enters it often
        with self._device:
            self._module = cupy.RawModule(code=KERNEL_SOURCE, options=COMPILE_OPTIONS)
            # Compile and load now: loading a module inside a stream capture is not allowed.
            self._functions = {name: self._module.get_function(name) for name in KERNEL_NAMES}
        self._launcher = KernelLauncher(cupy, self.device_id, dependent=True)

    # -- checks ------------------------------------------------------------------------------
    def _on_device(self, array, what: str) -> None:
        cupy = self._cupy
        if not isinstance(array, cupy.ndarray):
            raise ResidencyError(f"{what} is a {type(array).__name__}, not a CuPy array on "
                                 f"cuda:{self.device_id}", field=what,
                                 value=type(array).__name__,
                                 remedy="adopt host values once (backend.adopt / "
                                        "tensor_ops.adopt) before the kernel runs")
        if array.data.device_id != self.device_id:  # (array.device builds a Device object)
            raise ResidencyError(f"{what} lives on cuda:{array.device.id}, these kernels run "
                                 f"on cuda:{self.device_id}", field=what,
                                 value=f"cuda:{array.device.id}",
                                 remedy=f"move it with a device-to-device copy, or build the "
                                        f"backend for cuda:{array.device.id}")

    @staticmethod
    def _contiguous(array, what: str) -> None:
        if not array.flags.c_contiguous:
            raise ExecutionError(f"{what} must be C-contiguous", field=what,
                                 value=f"strides {array.strides}",
                                 remedy="pass cupy.ascontiguousarray(...) of it")

    def _out(self, out, shape, dtype, stream, what: str = "out"):
        if out is None:
            with self._device, stream:
                out = self._cupy.empty(shape, dtype=dtype)
            return note_allocation(out, stream)
        self._on_device(out, what)
        self._contiguous(out, what)
        if tuple(out.shape) != tuple(shape) or out.dtype != dtype:
            raise ExecutionError(f"{what} has shape {tuple(out.shape)} and dtype {out.dtype}, "
                                 f"the result needs {tuple(shape)} {np.dtype(dtype).name}",
                                 field=what, value=tuple(out.shape),
                                 remedy="pass an output of the result's shape and dtype, or none")
        return out

    def _launch(self, name: str, blocks: int, threads: int, args: tuple, stream) -> None:
        self._launcher.launch(self._functions[name], (int(blocks),), (int(threads),), args,
                              stream)

    # -- launchers ---------------------------------------------------------------------------
    def gemv_rows(self, x, w, out=None, *, stream, w_layout: str = "nk"):
        """out[M, N] = x[M, K] @ W; ``w`` is W as [K, N] (``w_layout="kn"``) or W^T as [N, K]
        (``"nk"``, coalesced: the layout to cache at load time). All C-contiguous, one dtype
        (float32 or float16), accumulated in float32."""
        for array, what in ((x, "x"), (w, "w")):
            self._on_device(array, what)
            self._contiguous(array, what)
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
        name = kernel_name("gemv_rows", x.dtype)
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
                    self._functions[kernel_name("gemv_tile", x.dtype)],
                    ((n + cols - 1) // cols, (m + tile - 1) // tile), (32 * GEMV_TILE_WARPS,),
                    (x, w, out, _i64(m), _i64(k), _i64(n), np.int32(team), np.int32(tile)),
                    stream, tile * k * GEMV_TILE_ITEM)
                return out
            self._launch(kernel_name("gemv_vec", x.dtype), (n + cols - 1) // cols,
                         32 * GEMV_WARPS_PER_BLOCK,
                         (x, w, out, _i64(m), _i64(k), _i64(n), _i64(k if nk else 1),
                          _i64(1 if nk else n), np.int32(vec), np.int32(team)), stream)
            return out
        blocks = (n + GEMV_WARPS_PER_BLOCK - 1) // GEMV_WARPS_PER_BLOCK
        self._launch(name, blocks, 32 * GEMV_WARPS_PER_BLOCK,
                     (x, w, out, _i64(m), _i64(k), _i64(n), _i64(w_layout == "nk")), stream)
        return out

    def gemv_many(self, x, weights, *, stream):
        """[x @ W_i^T for each W^T_i [N_i, K]] in one launch, two or three weights: each
        output bit for bit ``gemv_rows(x, W^T_i, w_layout="nk")`` (the vectorised path:
        every operand must pass ``gemv_vectorised``, which the caller checks)."""
        if not 2 <= len(weights) <= 3:
            raise ExecutionError("gemv_many takes two or three weights", field="weights",
                                 value=len(weights), remedy="call gemv_rows for one weight")
        self._on_device(x, "x")
        self._contiguous(x, "x")
        m, k = x.shape
        for w in weights:
            self._on_device(w, "w")
            self._contiguous(w, "w")
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
                self._functions[kernel_name("gemv_tile3", x.dtype)],
                (sum(blocks), (m + tile - 1) // tile), (32 * GEMV_TILE_WARPS,),
                (x, *ws, *os_, _i64(m), _i64(k), *map(_i64, ns), *map(np.int32, teams),
                 _i64(blocks[0]), _i64(blocks[1]), np.int32(tile)),
                stream, tile * k * GEMV_TILE_ITEM)
            return outs
        blocks = [-(-n // (GEMV_WARPS_PER_BLOCK // t)) for n, t in zip(ns, teams)]
        self._launch(kernel_name("gemv_vec3", x.dtype), sum(blocks), 32 * GEMV_WARPS_PER_BLOCK,
                     (x, *ws, *os_, _i64(m), _i64(k), *map(_i64, ns), *map(np.int32, teams),
                      _i64(blocks[0]), _i64(blocks[1])), stream)
        return outs

    def batched_matmul(self, a, b, out=None, *, stream):
        """out = a @ b for a [..., M, K], b [..., K, N] with NumPy broadcasting over at most
        four batch axes; any strides (views, transposes, broadcasts) without a copy. The
        output is C-contiguous [*batch, M, N]."""
        self._on_device(a, "a")
        self._on_device(b, "b")
        if a.ndim < 2 or b.ndim < 2:
            raise ExecutionError("batched_matmul takes operands of rank >= 2", field="shape",
                                 value=(tuple(a.shape), tuple(b.shape)),
                                 remedy="add the unit axis of a 1-D operand first")
        if a.dtype != b.dtype:
            raise ExecutionError(f"a is {a.dtype} but b is {b.dtype}", field="dtype",
                                 value=(a.dtype.name, b.dtype.name),
                                 remedy="cast one operand so both share a dtype")
        m, k = a.shape[-2:]
        kb, n = b.shape[-2:]
        if kb != k:
            raise ExecutionError(f"inner extents differ: a has K={k}, b has K={kb}",
                                 field="shape", value=(tuple(a.shape), tuple(b.shape)),
                                 remedy="pass operands with matching inner extents")
        try:
            batch = tuple(np.broadcast_shapes(a.shape[:-2], b.shape[:-2]))
        except ValueError:
            raise ExecutionError("batch axes do not broadcast", field="shape",
                                 value=(tuple(a.shape), tuple(b.shape)),
                                 remedy="give batch axes equal extents or extent 1") from None
        if len(batch) > MAX_BATCH_AXES:
            raise ExecutionError(f"{len(batch)} batch axes; the kernel takes at most "
                                 f"{MAX_BATCH_AXES}", field="shape", value=batch,
                                 remedy="merge batch axes (reshape) before the call")
        name = kernel_name("bmm", a.dtype)
        out = self._out(out, batch + (m, n), a.dtype, stream)
        total = int(np.prod(batch, dtype=np.int64)) * m * n
        if total == 0:
            return out

        def batch_strides(array):
            extents = array.shape[:-2]
            strides = _elem_strides(array)[:-2]
            pad = len(batch) - len(extents)
            own = [0 if e == 1 else s for e, s in zip(extents, strides)]
            full = [0] * pad + own
            return [0] * (MAX_BATCH_AXES - len(full)) + full

        dims = [1] * (MAX_BATCH_AXES - len(batch)) + list(batch)
        a_b, b_b = batch_strides(a), batch_strides(b)
        a_sm, a_sk = _elem_strides(a)[-2:]
        b_sk, b_sn = _elem_strides(b)[-2:]
        args = (a, b, out, _i64(total), _i64(m), _i64(n), _i64(k),
                _i64(dims[1]), _i64(dims[2]), _i64(dims[3]),
                *map(_i64, a_b), _i64(a_sm), _i64(a_sk),
                *map(_i64, b_b), _i64(b_sk), _i64(b_sn))
        self._launch(name, (total + LINEAR_BLOCK - 1) // LINEAR_BLOCK, LINEAR_BLOCK, args, stream)
        return out

    def sum_axis(self, x, start: int, stop: int, out=None, *, stream):
        """Sum a C-contiguous ``x`` over its consecutive axes ``[start, stop)``, ascending
        along the flattened run; the result has shape ``shape[:start] + shape[stop:]``."""
        self._on_device(x, "x")
        self._contiguous(x, "x")
        if not 0 <= start <= stop <= x.ndim:
            raise ExecutionError(f"axes [{start}, {stop}) are not a run of x's {x.ndim} axes",
                                 field="axis", value=(start, stop),
                                 remedy=f"use 0 <= start <= stop <= {x.ndim}")
        name = kernel_name("sum_axis", x.dtype)
        shape = tuple(x.shape)
        outer = int(np.prod(shape[:start], dtype=np.int64))
        length = int(np.prod(shape[start:stop], dtype=np.int64))
        inner = int(np.prod(shape[stop:], dtype=np.int64))
        out = self._out(out, shape[:start] + shape[stop:], x.dtype, stream)
        count = outer * inner
        if count == 0:
            return out
        self._launch(name, (count + LINEAR_BLOCK - 1) // LINEAR_BLOCK, LINEAR_BLOCK,
                     (x, out, _i64(outer), _i64(length), _i64(inner)), stream)
        return out


_COMPILED: dict[int, CudaKernels] = {}


def get_kernels(device_id: int = 0) -> CudaKernels:
    """The compiled kernels for ``device_id``, compiled once per process."""
    kernels = _COMPILED.get(int(device_id))
    if kernels is None:
        kernels = _COMPILED[int(device_id)] = CudaKernels(device_id)
    return kernels


def compile_ptx(arch: str = "compute_90") -> Any:
    """Compile the source with NVRTC alone (no device needed): catches syntax and type
    errors on a machine with CuPy and NVRTC but no GPU. Returns the PTX bytes."""
    from cupy.cuda import compiler

    program = compiler._NVRTCProgram(KERNEL_SOURCE, "lockstep_kernels.cu")
    ptx, _mapping = program.compile(COMPILE_OPTIONS + (f"-arch={arch}", "-std=c++17"))
    return ptx
