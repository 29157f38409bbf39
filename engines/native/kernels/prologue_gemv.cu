// GEMVs with a prologue (the NormMatMul, NormGLU and SwiGLUMatMul nodes): a norm's or
// SwiGLU's rows staged in shared memory by the standalone kernels' own device functions,
// then gemv_vec's column code over them; one launch where there were two, every bit the same.
// norm_gemv<TI, TD, TO, WARPS> (residual, delta, staged/weight types, the block's warps),
// norm_glu<TI, TO, TC, WARPS> (residual, staged/weight, SwiGLU's compute types, warps),
// swiglu_gemv<TG, TC, TO>.
#include "gemv_vec.cuh"
#include "norm.cuh"
#include "swiglu.cuh"

#ifndef LK_PROLOGUE_ROWS
#error "LK_PROLOGUE_ROWS comes from the launcher (a -D option)"
#endif
// The cases of norm_glu's switch over its row count, 1 to LK_PROLOGUE_ROWS.
static_assert(LK_PROLOGUE_ROWS == 8, "LK_ROWS_8 lists the cases 1 to 8");
#define LK_ROWS_8(CASE) CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8)

// RMSNorm (after the residual add when delta is given) of M <= LK_PROLOGUE_ROWS rows of K,
// staged as TO in shared memory by every block (lk_norm_prologue), then up to three
// GEMVs over the staged rows exactly as gemv_vec3 runs them (lk_gemv3): one launch where
// the norm and the q/k/v (or gate/up, or the head) were two, the same bits. The block's
// weight rows are loaded first (a thread's first LK_PROLOGUE_PRELOAD runs into registers,
// the rest asked into L2), so their reads from memory overlap the kernel ahead and the
// norm. WARPS:
// the block's warps (LK_GEMV_WARPS, or wider for several rows: fewer blocks normalise the
// same rows; a column's bits are its team's either way), spelled in every instance.
template <typename TI, typename TD, typename TO, int WARPS>
__global__ void norm_gemv(
        const TI* __restrict__ res, const TD* __restrict__ delta,
        const TI* __restrict__ gain, TI* __restrict__ sum_out, float eps,
        const TO* __restrict__ w0, const TO* __restrict__ w1, const TO* __restrict__ w2,
        TO* __restrict__ out0, TO* __restrict__ out1, TO* __restrict__ out2, long long M,
        long long K, long long N0, long long N1, long long N2, int team0, int team1,
        int team2, long long blocks0, long long blocks1) {
    LK_DYNAMIC_SHARED(unsigned char, lk_prologue_smem);
    __shared__ float part[LK_GEMV_ROWS * WARPS];
    TO* xs = reinterpret_cast<TO*>(lk_prologue_smem);
    lk_preloaded<LK_PROLOGUE_PRELOAD> pre;
    lk_gemv3_preload<TO, LK_PROLOGUE_PRELOAD, WARPS>(pre, w0, w1, w2, K, N0, N1, N2, team0,
                                                     team1, team2, blocks0, blocks1);
    lk_grid_wait();
    lk_norm_prologue<TI, TD, TO>(res, delta, gain, sum_out, xs, M, K, eps);
    __syncthreads();
    lk_gemv3<TO, LK_PROLOGUE_ROWS, WARPS, LK_PROLOGUE_PRELOAD>(
        xs, w0, w1, w2, out0, out1, out2, M, K, N0, N1, N2, team0, team1, team2, blocks0,
        blocks1, part, &pre);
}

// The gate or up column this warp's team of norm_glu computes (gate in the block's first
// WARPS / 2 warps, up in the others), or -1 past N.
template <int WARPS>
__device__ __forceinline__ long long lk_glu_column(long long N, int team) {
    const int warp = threadIdx.x >> 5;
    const long long n = (long long)blockIdx.x * (WARPS / 2 / team) + (warp % (WARPS / 2)) / team;
    return n < N ? n : -1;
}

// The weight row of this warp's column (lk_gemv_preload for norm_glu's split): the
// thread's first P runs into registers, the rest asked into L2, before the kernel waits.
template <typename TO, int WARPS, int P>
__device__ __forceinline__ void lk_glu_preload(
        lk_preloaded<P>& pre, const TO* __restrict__ wg, const TO* __restrict__ wu,
        long long K, long long N, int team) {
    const long long n = lk_glu_column<WARPS>(N, team);
    const TO* wr = ((threadIdx.x >> 5) < WARPS / 2 ? wg : wu) + (n < 0 ? 0 : n) * K;
    const int tt = ((threadIdx.x >> 5) % team) * 32 + (threadIdx.x & 31);
    lk_preload_runs<TO, P>(pre, n >= 0, wr, K, tt, 32 * team);
}

// RMSNorm (after the residual add when delta is given) of M <= LK_PROLOGUE_ROWS rows of K
// staged as TO in shared memory (lk_norm_prologue), then the gate and the up projections
// side by side: the block's first WARPS / 2 warps compute its gate columns, the
// others the same columns of up (teams of `team` warps, 1 or 2: gemv_vec's column code),
// staged as TO exactly as the two GEMVs store them; then SwiGLU of each pair (lk_swiglu,
// the swiglu kernel's element, in TC), stored as TO. Bit for bit norm_gemv over (gate,
// up) then swiglu: one launch where there were two, and SwiGLU computed once an element,
// where swiglu_gemv's every block computes it for every row.
#define LK_GLU_CASE(r) case r: \
    lk_gemv_vec_chunk<TO, r, true, WARPS, LK_PROLOGUE_PRELOAD>( \
        xs, wr, staged, K, WARPS, 1, warp, 0, valid, tt, team * 32, warp, team, lane, part, \
        &pre); \
    break;
template <typename TI, typename TO, typename TC, int WARPS>
__global__ void norm_glu(
        const TI* __restrict__ res, const TO* __restrict__ delta,
        const TI* __restrict__ gain, TI* __restrict__ sum_out, float eps,
        const TO* __restrict__ wg, const TO* __restrict__ wu, TO* __restrict__ out,
        long long M, long long K, long long N, int team) {
    LK_DYNAMIC_SHARED(unsigned char, lk_prologue_smem);
    __shared__ float part[LK_GEMV_ROWS * WARPS];
    __shared__ TO staged[LK_PROLOGUE_ROWS * WARPS];
    constexpr int HALF = WARPS / 2;
    TO* xs = reinterpret_cast<TO*>(lk_prologue_smem);
    lk_preloaded<LK_PROLOGUE_PRELOAD> pre;
    lk_glu_preload<TO, WARPS, LK_PROLOGUE_PRELOAD>(pre, wg, wu, K, N, team);
    lk_grid_wait();
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int pairs = HALF / team;
    const long long n = lk_glu_column<WARPS>(N, team);
    const bool valid = n >= 0;  // every thread stays for the block's barriers
    const int tt = (warp % team) * 32 + lane;
    const TO* wr = (warp < HALF ? wg : wu) + (valid ? n : 0) * K;
    lk_norm_prologue<TI, TO, TO>(res, delta, gain, sum_out, xs, M, K, eps);
    __syncthreads();
    // a team's total lands at staged[m * WARPS + its first warp]
    switch (M) {
        LK_ROWS_8(LK_GLU_CASE)
    }
    // (the chunk ends with a barrier: every staged value is in)
    for (int t = threadIdx.x; t < M * pairs; t += blockDim.x) {
        const int m = t / pairs, j = t % pairs;
        const long long col = (long long)blockIdx.x * pairs + j;
        if (col < N) {
            const TO* g = staged + m * WARPS + j * team;
            lk_store(out, m * N + col, lk_swiglu<TO, TC>(g, g + HALF, 0));
        }
    }
}
#undef LK_GLU_CASE

// SwiGLU of M <= LK_PROLOGUE_ROWS rows of K staged as TO in shared memory by every block
// (lk_swiglu, the swiglu kernel's element; gate and up read 16 bytes at a time when GVEC),
// then the down projection's GEMV over the staged rows exactly as gemv_vec runs it: one
// launch where SwiGLU and the MatMul were two. The weight rows are asked into L2 first.
template <typename TG, typename TC, typename TO>
__global__ void swiglu_gemv(
        const TG* __restrict__ gate, const TG* __restrict__ up, const TO* __restrict__ w,
        TO* __restrict__ out, long long M, long long K, long long N, int team, int gvec) {
    LK_DYNAMIC_SHARED(unsigned char, lk_prologue_smem);
    __shared__ float part[LK_GEMV_ROWS * LK_GEMV_WARPS];
    constexpr int VG = 16 / sizeof(TG);
    TO* xs = reinterpret_cast<TO*>(lk_prologue_smem);
    lk_gemv_prefetch<TO>(w, K, N, team, blockIdx.x);
    lk_grid_wait();
    if (gvec) {
#pragma unroll 2
        for (long long c = threadIdx.x; c < M * K / VG; c += blockDim.x) {
            const lk_vec16 gv = *reinterpret_cast<const lk_vec16*>(gate + c * VG);
            const lk_vec16 uv = *reinterpret_cast<const lk_vec16*>(up + c * VG);
            const TG* gp = reinterpret_cast<const TG*>(&gv);
            const TG* upp = reinterpret_cast<const TG*>(&uv);
#pragma unroll
            for (int e = 0; e < VG; ++e) {
                lk_store(xs, c * VG + e, lk_swiglu<TG, TC>(gp, upp, e));
            }
        }
    } else {
        for (long long i = threadIdx.x; i < M * K; i += blockDim.x) {
            lk_store(xs, i, lk_swiglu<TG, TC>(gate, up, i));
        }
    }
    __syncthreads();
    lk_gemv_vec_block<TO, LK_PROLOGUE_ROWS, false>(xs, w, out, M, K, N, K, 1, 1, team,
                                                   blockIdx.x, part);
}
