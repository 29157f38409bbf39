// The GEMVs: activations [M, K] times a weight, one fixed reduction order per (K, N)
// (cuda_kernels.py says which kernel runs when). Instances: one per storage type T.
#include "gemv_vec.cuh"

#if !defined(LK_TILE_WARPS) || !defined(LK_TILE_COLS)
#error "LK_TILE_WARPS and LK_TILE_COLS come from the launcher (-D options)"
#endif

// One chunk of R rows (R a compile-time constant, so nothing is predicated): lane l adds
// x[i, k] * w(k, n) for k = l, l+32, ... with fused multiply-adds, in that order, then a
// fixed butterfly sums the 32 lanes. Row i's arithmetic is the same for every R.
template <typename T, int R>
__device__ __forceinline__ void lk_gemv_chunk(const T* __restrict__ xr, const T* __restrict__ w,
                                              T* __restrict__ out, long long K, long long N,
                                              long long n, long long w_base, long long w_step,
                                              long long m0, int lane) {
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
#define LK_ROWS_CASE(r) \
    case r: lk_gemv_chunk<T, r>(xr, w, out, K, N, n, w_base, w_step, m0, lane); break;
template <typename T>
__global__ void gemv_rows(const T* __restrict__ x, const T* __restrict__ w,
                          T* __restrict__ out, long long M, long long K, long long N,
                          long long w_is_nk) {
    lk_grid_wait();
    const int lane = threadIdx.x & 31;
    const long long n = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (n >= N) return;  // uniform across the warp: the shuffles see all 32 lanes
    const long long w_base = w_is_nk ? n * K : n;
    const long long w_step = w_is_nk ? 1 : N;
    for (long long m0 = 0; m0 < M; m0 += LK_GEMV_ROWS) {
        const long long rows = (M - m0) < LK_GEMV_ROWS ? (M - m0) : LK_GEMV_ROWS;
        const T* xr = x + m0 * K;
        switch (rows) {
            LK_ROWS_16(LK_ROWS_CASE)
        }
    }
}
#undef LK_ROWS_CASE

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

// The parameters of a launch over up to three weights sharing x (gemv_vec3, gemv_tile3).
#define LK_GEMV3_PARAMS(T) const T* __restrict__ x, const T* __restrict__ w0, \
    const T* __restrict__ w1, const T* __restrict__ w2, T* __restrict__ out0, \
    T* __restrict__ out1, T* __restrict__ out2, long long M, long long K, long long N0, \
    long long N1, long long N2, int team0, int team1, int team2, long long blocks0, \
    long long blocks1

template <typename T>
__global__ void gemv_vec(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out,
                         long long M, long long K, long long N, long long w_nstep,
                         long long w_kstep, int vec, int team) {
    __shared__ float part[LK_GEMV_ROWS * LK_GEMV_WARPS];
    if (vec && w_kstep == 1 && w_nstep == K) lk_gemv_prefetch<T>(w, K, N, team, blockIdx.x);
    lk_grid_wait();
    lk_gemv_vec_block<T, LK_GEMV_ROWS, true>(x, w, out, M, K, N, w_nstep, w_kstep, vec, team,
                                             blockIdx.x, part);
}

// gemv_vec for one row (a decode step's o and down projections and its head): a row's
// arithmetic is the same in every instance, and this one, without the cases of 2 to 16
// rows, takes 32 registers a thread where gemv_vec takes 84, so an SM holds 16 of its
// blocks, not 6, and the head's 49,152 columns keep more weight bytes on their way.
// Its first LK_GEMV_PRELOAD weight runs a thread are in registers before it waits.
template <typename T>
__global__ void gemv_vec1(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out,
                          long long M, long long K, long long N, long long w_nstep,
                          long long w_kstep, int vec, int team) {
    __shared__ float part[LK_GEMV_WARPS];
    lk_preloaded<LK_GEMV_PRELOAD> pre;
    lk_gemv_preload<T, LK_GEMV_PRELOAD>(pre, vec && w_kstep == 1 && w_nstep == K, w, K, N,
                                        team, blockIdx.x);
    lk_grid_wait();
    lk_gemv_vec_block<T, 1, true, LK_GEMV_WARPS, LK_GEMV_PRELOAD>(
        x, w, out, M, K, N, w_nstep, w_kstep, vec, team, blockIdx.x, part, &pre);
}

// Up to three weights sharing x (a layer's q/k/v, or gate/up) in one launch: the first
// blocks0 blocks compute weight 0 exactly as gemv_vec would, the next blocks1 weight 1, the
// rest weight 2; each with its own team, so every column's arithmetic is the single launch's.
template <typename T>
__global__ void gemv_vec3(LK_GEMV3_PARAMS(T)) {
    __shared__ float part[LK_GEMV_ROWS * LK_GEMV_WARPS];
    lk_gemv3_prefetch<T>(w0, w1, w2, K, N0, N1, N2, team0, team1, team2, blocks0, blocks1);
    lk_grid_wait();
    lk_gemv3<T, LK_GEMV_ROWS>(x, w0, w1, w2, out0, out1, out2, M, K, N0, N1, N2, team0, team1,
                              team2, blocks0, blocks1, part);
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
template <typename T>
__device__ __forceinline__ void lk_gemv_tile_block(const T* __restrict__ x, const T* __restrict__ w,
                                                   T* __restrict__ out, long long M, long long K,
                                                   long long N, int team, int tile_rows,
                                                   long long bx, float* xs, float* part) {
    constexpr int V = 16 / sizeof(T);
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
        lk_unpack16_words(src[r], f, T());
        float4* dst = reinterpret_cast<float4*>(xs + r * V);
#pragma unroll
        for (int v = 0; v < V; v += 4) dst[v / 4] = make_float4(f[v], f[v + 1], f[v + 2], f[v + 3]);
    }
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int warp = threadIdx.x >> 5;
    const long long n0 = (bx * (LK_TILE_WARPS / team) + warp / team) * C;
    const int tt = (warp % team) * 32 + lane;
    const T* wr[C];
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
            lk_unpack16_words(*reinterpret_cast<const lk_vec16*>(wr[j] + c * V), wf[j], T());
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

template <typename T>
__global__ void gemv_tile(const T* __restrict__ x, const T* __restrict__ w, T* __restrict__ out,
                          long long M, long long K, long long N, int team, int tile_rows) {
    LK_DYNAMIC_SHARED(unsigned char, lk_tile_smem);
    __shared__ float part[LK_GEMV_ROWS * LK_TILE_COLS * LK_TILE_WARPS];
    lk_grid_wait();
    lk_gemv_tile_block<T>(x, w, out, M, K, N, team, tile_rows, blockIdx.x,
                          reinterpret_cast<float*>(lk_tile_smem), part);
}

// Up to three weights sharing x (a prefill's q/k/v, or gate/up) in one launch, split as
// gemv_vec3 splits them: block columns [0, blocks0) compute weight 0 exactly as gemv_tile
// would, the next blocks1 weight 1, the rest weight 2, each with its own team.
template <typename T>
__global__ void gemv_tile3(LK_GEMV3_PARAMS(T), int tile_rows) {
    LK_DYNAMIC_SHARED(unsigned char, lk_tile_smem);
    __shared__ float part[LK_GEMV_ROWS * LK_TILE_COLS * LK_TILE_WARPS];
    lk_grid_wait();
    const long long blk = blockIdx.x;
    const bool first = blk < blocks0, second = !first && blk < blocks0 + blocks1;
    const long long b = first ? blk : (second ? blk - blocks0 : blk - blocks0 - blocks1);
    lk_gemv_tile_block<T>(x, first ? w0 : (second ? w1 : w2),
                          first ? out0 : (second ? out1 : out2), M, K,
                          first ? N0 : (second ? N1 : N2),
                          first ? team0 : (second ? team1 : team2), tile_rows, b,
                          reinterpret_cast<float*>(lk_tile_smem), part);
}
