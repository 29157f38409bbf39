// RMSNorm rows, one warp a row: norm.cu's kernels, and the norm prologue of the GEMVs in
// prologue_gemv.cu (a row gets the same bits whichever of them ran it).
#pragma once
#include "round.cuh"

// P rows of n by one warp, row p at res + p * stride (delta, sum_out and out likewise):
// lane l takes i = l, l + 32, ...; a fixed butterfly adds the lanes. s = res (+ delta read
// as TD, the folded Cast up, the sum rounded to TI when delta is given), stored to sum_out
// when given; then y = s * (1 / sqrt(mean(s * s) + eps)) * gain, rounded to TI after each
// op as the unfused graph stores it, stored as TO (the folded Cast) to out, in global or
// shared memory. The second pass recomputes s exactly as the first stored it. The rows of
// one warp only share the loop (their loads overlap); each row's arithmetic is its own, so
// rms_norm, add_rms_norm and the GEMVs with a norm prologue give a row the same bits
// whichever of them ran it, with however many rows and rows a warp.
template <typename TI, typename TD, typename TO, int P>
__device__ __forceinline__ void lk_norm_rows(
        const TI* __restrict__ res, const TD* __restrict__ delta,
        const TI* __restrict__ gain, TI* __restrict__ sum_out, TO* out, long long n,
        long long stride, float eps, int lane) {
    const TI* R = 0;
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
template <typename TI, typename TD, typename TO>
__device__ __forceinline__ void lk_norm_row(
        const TI* __restrict__ res, const TD* __restrict__ delta,
        const TI* __restrict__ gain, TI* __restrict__ sum_out, TO* out, long long n,
        float eps, int lane) {
    lk_norm_rows<TI, TD, TO, 1>(res, delta, gain, sum_out, out, n, 0, eps, lane);
}

// A GEMV's norm prologue: M <= 2 * warps rows of K normalised into xs by the block; warp w
// takes row w and, when M > warps, row w + warps in the same pass (lk_norm_rows<2>), so 5
// to 8 rows cost about the latency of one, not of two in turn. Block 0 stores the sums.
template <typename TI, typename TD, typename TO>
__device__ __forceinline__ void lk_norm_prologue(
        const TI* __restrict__ res, const TD* __restrict__ delta,
        const TI* __restrict__ gain, TI* __restrict__ sum_out, TO* xs, long long M,
        long long K, float eps) {
    const int warps = blockDim.x >> 5, w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const long long at = (long long)w * K;
    TI* sums = (sum_out && blockIdx.x == 0) ? sum_out + at : (TI*)0;
    const TD* d = delta ? delta + at : delta;
    if (w + warps < M) {
        lk_norm_rows<TI, TD, TO, 2>(res + at, d, gain, sums, xs + at, K,
                                    (long long)warps * K, eps, lane);
    } else if (w < M) {
        lk_norm_rows<TI, TD, TO, 1>(res + at, d, gain, sums, xs + at, K, 0, eps, lane);
    }
}
