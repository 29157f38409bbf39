// The K-vector GEMV's column code (gemv_vec's order), for gemv.cu's kernels and for the
// GEMVs with a prologue (prologue_gemv.cu), which run it over rows they staged themselves:
// their columns are gemv_vec's bit for bit.
#pragma once
#include "vec16.cuh"

#if !defined(LK_GEMV_ROWS) || !defined(LK_GEMV_WARPS)
#error "LK_GEMV_ROWS and LK_GEMV_WARPS come from the launcher (-D options)"
#endif
// The cases of a switch over a chunk's row count, 1 to LK_GEMV_ROWS: one instance per count.
static_assert(LK_GEMV_ROWS == 16, "LK_ROWS_16 lists the cases 1 to 16");
#define LK_ROWS_16(CASE) CASE(1) CASE(2) CASE(3) CASE(4) CASE(5) CASE(6) CASE(7) CASE(8) \
    CASE(9) CASE(10) CASE(11) CASE(12) CASE(13) CASE(14) CASE(15) CASE(16)

// Weight runs a team thread of the one-row GEMV (LK_GEMV_PRELOAD) and of the GEMVs with a
// prologue (LK_PROLOGUE_PRELOAD) loads into registers before its kernel waits for the one
// ahead: weights are written by no kernel, so under a dependent launch they travel from
// memory while the kernel ahead still runs, and after the wait only the activations are
// read. 4 runs cover a thread's share of SmolLM2's float16 and bfloat16 weights (K = 576
// with teams of 1 or 2 warps: 3 runs at most; K = 1536 with 2: 3); the runs past them are
// asked into L2 instead.
#define LK_GEMV_PRELOAD 4
#define LK_PROLOGUE_PRELOAD 4

// A team thread's first P weight runs of its column, loaded before the wait (`have`: they
// were; otherwise the chunk loads them itself). P = 0: none.
template <int P>
struct lk_preloaded {
    lk_vec16 run[P > 0 ? P : 1];
    bool have;
};

// Load the first P of a team thread's weight runs c = tt, tt + team_threads, ... of row wr
// (W^T [N, K], 16-byte aligned) into pre, and ask L2 for the rest: weights only, so it may
// come before the kernel waits for the one ahead. ok false (no such column, or a weight
// the chunk loads element by element): nothing is loaded.
template <typename T, int P>
__device__ __forceinline__ void lk_preload_runs(lk_preloaded<P>& pre, bool ok,
                                                const T* __restrict__ wr, long long K, int tt,
                                                int team_threads) {
    constexpr int V = 16 / sizeof(T);
    const long long chunks = K / V;
    pre.have = ok && P > 0;
    if (!ok) return;
#pragma unroll
    for (int i = 0; i < P; ++i) {
        const long long c = tt + (long long)i * team_threads;
        if (c < chunks) pre.run[i] = *reinterpret_cast<const lk_vec16*>(wr + c * V);
    }
    for (long long c = tt + (long long)P * team_threads; c < chunks; c += team_threads) {
        lk_prefetch_l2(wr + c * V);
    }
}

// Run c's products for R rows (its weights wf as floats): row i adds x[i, k] * w(k) for the
// run's V k ascending with fused multiply-adds. VEC: x's run is one 16-byte load.
template <typename T, int R, bool VEC>
__device__ __forceinline__ void lk_gemv_run(const float (&wf)[16 / sizeof(T)],
                                            const T* __restrict__ xr, long long K, long long c,
                                            float (&acc)[R]) {
    constexpr int V = 16 / sizeof(T);
#pragma unroll
    for (int i = 0; i < R; ++i) {
        float xf[V];
        if (VEC) {
            lk_unpack16_words(*reinterpret_cast<const lk_vec16*>(xr + i * K + c * V), xf, T());
        } else {
#pragma unroll
            for (int v = 0; v < V; ++v) xf[v] = lk_load(xr, i * K + c * V + v);
        }
#pragma unroll
        for (int v = 0; v < V; ++v) acc[i] = __fmaf_rn(xf[v], wf[v], acc[i]);
    }
}

// The K-vector GEMV order (K a multiple of V = 16 bytes' worth of T). A team of `team`
// warps (1, 2 or 4, chosen from N alone) owns a column: team thread t takes the runs of V
// consecutive k in runs c = t, t + 32 * team, ..., and adds their products with fused
// multiply-adds, k ascending within a run; a fixed butterfly sums each warp, and the
// team's warps are then added in warp order. A row's arithmetic depends on K and N only.
// VEC: both operands are loaded 16 bytes at a time (W^T [N, K] rows, both 16-byte
// aligned); otherwise each element is loaded alone, w(k, n) = wr[k * w_kstep]. The loads
// differ, the arithmetic does not, so a [K, N] weight gives the [N, K] one's bits.
// pre: the thread's first P runs when they were loaded before the wait (VEC only); the
// same products in the same order, wherever a run's bytes came from.
template <typename T, int R, bool VEC, int WARPS, int P = 0>
__device__ __forceinline__ void lk_gemv_vec_chunk(
        const T* __restrict__ xr, const T* __restrict__ wr, T* __restrict__ out,
        long long K, long long N, long long w_kstep, long long n, long long m0, bool valid,
        int tt, int team_threads, int warp, int team, int lane, float* part,
        const lk_preloaded<P>* pre = nullptr) {
    constexpr int V = 16 / sizeof(T);
    static_assert(VEC || P == 0, "preloaded runs are 16-byte runs of W^T rows");
    float acc[R];
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] = 0.0f;
    if (valid) {
        const long long chunks = K / V;
        const bool have = pre != nullptr && pre->have;
#pragma unroll
        for (int p = 0; p < P; ++p) {  // the first P runs: in registers where preloaded
            const long long c = tt + (long long)p * team_threads;
            if (c < chunks) {
                float wf[V];
                lk_unpack16_words(have ? pre->run[p]
                                       : *reinterpret_cast<const lk_vec16*>(wr + c * V),
                                  wf, T());
                lk_gemv_run<T, R, VEC>(wf, xr, K, c, acc);
            }
        }
#pragma unroll 2
        for (long long c = tt + (long long)P * team_threads; c < chunks; c += team_threads) {
            float wf[V];
            if (VEC) {
                lk_unpack16_words(*reinterpret_cast<const lk_vec16*>(wr + c * V), wf, T());
            } else {
#pragma unroll
                for (int v = 0; v < V; ++v) wf[v] = lk_load(wr, (c * V + v) * w_kstep);
            }
            lk_gemv_run<T, R, VEC>(wf, xr, K, c, acc);
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
// (W^T [N, K]: w_nstep K, w_kstep 1; W [K, N]: 1 and N); WARPS / team columns a block (a
// block of WARPS warps: LK_GEMV_WARPS unless a wider block asks; a column's arithmetic is
// its team's, whichever block and warp it falls to).
// MAXR: the most rows a chunk of this instance takes (M <= MAXR unless MAXR is
// LK_GEMV_ROWS); SCALAR: whether it has the element-wise loads. Both only trim what is
// compiled: a row's arithmetic is the same in every instance.
// pre: the thread's weight runs loaded before the wait (lk_gemv_preload), or none.
#define LK_CHUNK_CASE(r, VEC, PV, PRE) case r: if constexpr (r <= MAXR) \
    lk_gemv_vec_chunk<T, r, VEC, WARPS, PV>(xr, wr, out, K, N, w_kstep, n, m0, valid, tt, \
                                            team * 32, warp, team, lane, part, PRE); break;
#define LK_VEC_CASE(r) LK_CHUNK_CASE(r, true, P, pre)
#define LK_SCALAR_CASE(r) LK_CHUNK_CASE(r, false, 0, nullptr)
template <typename T, int MAXR, bool SCALAR, int WARPS = LK_GEMV_WARPS, int P = 0>
__device__ __forceinline__ void lk_gemv_vec_block(const T* __restrict__ x, const T* __restrict__ w,
                                                  T* __restrict__ out, long long M, long long K,
                                                  long long N, long long w_nstep,
                                                  long long w_kstep, int vec, int team,
                                                  long long blk, float* part,
                                                  const lk_preloaded<P>* pre = nullptr) {
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long n = blk * (WARPS / team) + warp / team;
    const bool valid = n < N;  // every thread stays for the block's barriers
    const int tt = (warp % team) * 32 + lane;
    const T* wr = w + (valid ? n : 0) * w_nstep;
    for (long long m0 = 0; m0 < M; m0 += LK_GEMV_ROWS) {
        const long long rows = (M - m0) < LK_GEMV_ROWS ? (M - m0) : LK_GEMV_ROWS;
        const T* xr = x + m0 * K;
        if (vec || !SCALAR) {
            switch (rows) {
                LK_ROWS_16(LK_VEC_CASE)
            }
        } else if (SCALAR) {
            switch (rows) {
                LK_ROWS_16(LK_SCALAR_CASE)
            }
        }
    }
}
#undef LK_SCALAR_CASE
#undef LK_VEC_CASE
#undef LK_CHUNK_CASE


// The first P weight runs of this thread's column in block `blk` of lk_gemv_vec_block
// (W^T [N, K]) into registers, the rest asked into L2 (lk_preload_runs): issued before the
// kernel waits, so the rows travel from memory while the kernel ahead (and a prologue) run.
// ok false: nothing (a weight the block reads element by element).
template <typename T, int P, int WARPS = LK_GEMV_WARPS>
__device__ __forceinline__ void lk_gemv_preload(lk_preloaded<P>& pre, bool ok,
                                                const T* __restrict__ w, long long K,
                                                long long N, int team, long long blk) {
    const int warp = threadIdx.x >> 5;
    const long long n = blk * (WARPS / team) + warp / team;
    const int tt = (warp % team) * 32 + (threadIdx.x & 31);
    lk_preload_runs<T, P>(pre, ok && n < N, w + (n < N ? n : 0) * K, K, tt, 32 * team);
}

// Ask L2 for the weight rows block `blk` of lk_gemv_vec_block will read, each thread its
// own 16-byte runs (lk_gemv_preload of none into registers). A hint: nothing is computed.
template <typename T, int WARPS = LK_GEMV_WARPS>
__device__ __forceinline__ void lk_gemv_prefetch(const T* __restrict__ w, long long K,
                                                 long long N, int team, long long blk) {
    lk_preloaded<0> none;
    lk_gemv_preload<T, 0, WARPS>(none, true, w, K, N, team, blk);
}

// lk_gemv_preload for this block's weight of gemv_vec3's split.
template <typename T, int P, int WARPS = LK_GEMV_WARPS>
__device__ __forceinline__ void lk_gemv3_preload(lk_preloaded<P>& pre, const T* __restrict__ w0,
                                                 const T* __restrict__ w1,
                                                 const T* __restrict__ w2, long long K,
                                                 long long N0, long long N1, long long N2,
                                                 int team0, int team1, int team2,
                                                 long long blocks0, long long blocks1) {
    const long long blk = blockIdx.x;
    const bool first = blk < blocks0, second = !first && blk < blocks0 + blocks1;
    lk_gemv_preload<T, P, WARPS>(pre, true, first ? w0 : (second ? w1 : w2), K,
                                 first ? N0 : (second ? N1 : N2),
                                 first ? team0 : (second ? team1 : team2),
                                 first ? blk : (second ? blk - blocks0 : blk - blocks0 - blocks1));
}

// lk_gemv_prefetch for this block's weight of gemv_vec3's split.
template <typename T, int WARPS = LK_GEMV_WARPS>
__device__ __forceinline__ void lk_gemv3_prefetch(const T* __restrict__ w0,
                                                  const T* __restrict__ w1,
                                                  const T* __restrict__ w2, long long K,
                                                  long long N0, long long N1, long long N2,
                                                  int team0, int team1, int team2,
                                                  long long blocks0, long long blocks1) {
    lk_preloaded<0> none;
    lk_gemv3_preload<T, 0, WARPS>(none, w0, w1, w2, K, N0, N1, N2, team0, team1, team2,
                                  blocks0, blocks1);
}

// This block's share of up to three GEMVs over one x (gemv_vec3's split of the blocks);
// pre: lk_gemv3_preload's runs, or none.
template <typename T, int MAXR, int WARPS = LK_GEMV_WARPS, int P = 0>
__device__ __forceinline__ void lk_gemv3(const T* __restrict__ x, const T* __restrict__ w0,
                                         const T* __restrict__ w1, const T* __restrict__ w2,
                                         T* __restrict__ out0, T* __restrict__ out1,
                                         T* __restrict__ out2, long long M, long long K,
                                         long long N0, long long N1, long long N2, int team0,
                                         int team1, int team2, long long blocks0,
                                         long long blocks1, float* part,
                                         const lk_preloaded<P>* pre = nullptr) {
    const long long blk = blockIdx.x;
    const bool first = blk < blocks0, second = !first && blk < blocks0 + blocks1;
    const T* w = first ? w0 : (second ? w1 : w2);
    T* out = first ? out0 : (second ? out1 : out2);
    const long long N = first ? N0 : (second ? N1 : N2);
    const int team = first ? team0 : (second ? team1 : team2);
    const long long b = first ? blk : (second ? blk - blocks0 : blk - blocks0 - blocks1);
    lk_gemv_vec_block<T, MAXR, false, WARPS, P>(x, w, out, M, K, N, K, 1, 1, team, b, part,
                                                pre);
}
