// Attention over a static cache (the Attention and RotaryKVAttention nodes): attention and
// attention_rows<TQ, TC> (q/k/v's and the scores' types), rotary_kv_attention<TX, TC,
// TO>. A block per (head, query) pair, fixed trees: every order depends on the position.
#include "rotary.cuh"

#if !defined(LK_ATT_MAX_D) || !defined(LK_ATT_BLOCK) || !defined(LK_ATT_SMEM_KEYS) \
    || !defined(LK_ATT_ROWS) || !defined(LK_RKA_MAX_D) || !defined(LK_RKA_MAX_M)
#error "the LK_ATT_ and LK_RKA_ sizes come from the launcher (-D options)"
#endif

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

// One block per (head h, query m): the query at position p reads key slots j in [0, p]
// (and < T) of KV head h / group, nothing else. Scores (in shared memory where T is at most
// LK_ATT_SMEM_KEYS, else in the block's scratch row): thread t takes keys j = t, t +
// blockDim, ... and adds q[d] * k[j, d] over d ascending with fused multiply-adds in float32
// (KVEC: the key row loaded 16 bytes at a time, the same arithmetic); rounded to TQ (the
// MatMul's output), then either scaled in TQ (uniform) or taken as float32 (TC, mixed).
// Softmax in TC: max, exp, a sum whose order depends on j only (thread j % blockDim, then
// the block tree); probabilities rounded to TC then to TQ. Output (KVEC): a value row is
// D / V runs of V channels; thread t takes run t % (D / V) of keys j = g, g + G, ...
// ascending (g = t / (D / V), G = blockDim / (D / V)), 16-byte loads; the groups' partials
// are then added in group order. Otherwise thread group g of G = blockDim / D adds keys
// j = g, g + G, ... one channel at a time, the same way. Stored to out[0, m, h * D + d] as
// TQ. Every order depends on (p, D) alone: a verify row is the decode at its position.
template <typename TQ, typename TC>
__global__ void attention(
        const TQ* __restrict__ q, const TQ* __restrict__ k, const TQ* __restrict__ v,
        const long long* __restrict__ pos, TQ* __restrict__ out, float* __restrict__ scratch,
        long long H, long long M, long long T, long long D, long long group,
        long long qh, long long qm, long long qd, int has_scale, float scale, int G,
        int kvec) {
    __shared__ float qs[LK_ATT_MAX_D];
    __shared__ float part[LK_ATT_BLOCK * (16 / sizeof(TQ))];  // groups x D partial sums
    __shared__ float smem[33];
    __shared__ float s_keys[LK_ATT_SMEM_KEYS];  // the scores, where T fits (else scratch)
    lk_grid_wait();
    const TQ* S = 0;
    const TC* C = 0;
    constexpr int V = 16 / sizeof(TQ);
    const long long h = blockIdx.x / M;
    const long long m = blockIdx.x % M;
    const long long p = pos[m];
    const long long L = p < 0 ? 0 : (p + 1 < T ? p + 1 : T);
    const long long kvh = h / group;
    const TQ* kh = k + kvh * T * D;
    const TQ* vh = v + kvh * T * D;
    float* s = T <= LK_ATT_SMEM_KEYS ? s_keys : scratch + blockIdx.x * T;
    const int tid = threadIdx.x;
    for (long long d = tid; d < D; d += blockDim.x) qs[d] = lk_load(q, h * qh + m * qm + d * qd);
    __syncthreads();
    float mx = __int_as_float(0xff800000);  // -inf
    for (long long j = tid; j < L; j += blockDim.x) {
        const TQ* kr = kh + j * D;
        float acc = 0.0f;
        if (kvec) {
#pragma unroll 4
            for (long long c = 0; c < D; c += V) {
                float kf[V];
                lk_unpack16_words(*reinterpret_cast<const lk_vec16*>(kr + c), kf, TQ());
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
                                  TQ());
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

// A prefill's attention, up to R rows of one head a block (rows m0 .. m0 + R - 1 of head h,
// R = min(LK_ATT_ROWS, what the dynamic shared memory holds)): every row's arithmetic is
// attention_'s for that row, bit for bit: thread t owns keys j = t, t + blockDim, ... for
// the scores and the sum, the block trees run row by row (lk_softmax_block), and thread t
// owns value run t % (D / V) of keys j = g, g + G, ... as there. What changes is that a key
// or value run loaded once serves every row of the block. KVEC operands only (D a whole
// number of 16-byte runs, both caches aligned). Dynamic shared memory: qs[R][D], then the
// rows' scores s[R][T].
template <typename TQ, typename TC>
__global__ void attention_rows(
        const TQ* __restrict__ q, const TQ* __restrict__ k, const TQ* __restrict__ v,
        const long long* __restrict__ pos, TQ* __restrict__ out, long long H, long long M,
        long long T, long long D, long long group, long long qh, long long qm, long long qd,
        int has_scale, float scale, int R) {
    LK_DYNAMIC_SHARED(float, lk_rows_smem);
    __shared__ float part[LK_ATT_BLOCK * (16 / sizeof(TQ))];  // groups x D partial sums
    __shared__ float smem[33];
    __shared__ long long Ls[LK_ATT_ROWS];
    lk_grid_wait();
    const TQ* S = 0;
    const TC* C = 0;
    constexpr int V = 16 / sizeof(TQ);
    const long long per_head = (M + R - 1) / R;
    const long long h = blockIdx.x / per_head;
    const long long m0 = (blockIdx.x % per_head) * R;
    const int rows = (int)((M - m0) < R ? (M - m0) : R);
    float* qs = lk_rows_smem;
    float* s = lk_rows_smem + (long long)R * D;
    const long long kvh = h / group;
    const TQ* kh = k + kvh * T * D;
    const TQ* vh = v + kvh * T * D;
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
        const TQ* kr = kh + j * D;
        float acc[LK_ATT_ROWS];
#pragma unroll
        for (int r = 0; r < LK_ATT_ROWS; ++r) acc[r] = 0.0f;
#pragma unroll 2
        for (long long c = 0; c < D; c += V) {
            float kf[V];
            lk_unpack16_words(*reinterpret_cast<const lk_vec16*>(kr + c), kf, TQ());
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
            lk_unpack16_words(*reinterpret_cast<const lk_vec16*>(vh + j * D + c * V), vf, TQ());
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

// 16-byte runs rotary_kv_attention loads before it uses the first of them: a key row's
// (128 bytes of float16 or bfloat16 in one batch), or a value run of that many keys
#define LK_RKA_RUNS 8

// Whether the forward's positions are a run (pos[r] = pos[0] + r, a decode's or a
// verification's), so the row that wrote slot j is found by a subtraction.
__device__ __forceinline__ bool lk_positions_run(const long long* spos, long long M) {
    bool run = true;
    for (long long r = 1; r < M; ++r) run = run && spos[r] == spos[0] + r;
    return run;
}

// The row of this forward whose position is j (the last such row), or -1: over a run of
// positions a subtraction, else a search of them all.
__device__ __forceinline__ long long lk_written_row(const long long* spos, long long M,
                                                   long long first, bool run, long long j) {
    if (run) return j >= first && j - first < M ? j - first : -1;
    long long hit = -1;
    for (long long r = 0; r < M; ++r) if (spos[r] == j) hit = r;
    return hit;
}

// Ask L2 for the old cache's first rows (up to one a thread) of the KV head block `blk` of
// rotary_kv_attention reads, keys and values, before the kernel waits for the one ahead:
// earlier steps wrote them, so they are in memory while the weights streamed since have
// evicted them from L2, and the score and value loads would each wait for memory. The
// position is not read yet (that is memory the kernel ahead may write), so every row up to
// the block size is asked for; one block a KV head asks (its first head's first query). A
// hint only: nothing is read, no value changes.
template <typename TO>
__device__ __forceinline__ void lk_kv_prefetch(const TO* __restrict__ old_k,
                                               const TO* __restrict__ old_v, long long Hq,
                                               long long M, long long C, long long D,
                                               long long group) {
    const long long blk = blockIdx.x;
    if (blk >= Hq * M || blk % M != 0 || (blk / M) % group != 0) return;
    constexpr long long LINE = 128 / sizeof(TO);  // elements in a 128-byte line
    const long long lines = (D + LINE - 1) / LINE;
    const long long rows = C < (long long)blockDim.x ? C : (long long)blockDim.x;
    const long long head = (blk / M) / group * C * D;
    for (long long i = threadIdx.x; i < rows * lines; i += blockDim.x) {
        const long long at = head + (i / lines) * D + (i % lines) * LINE;
        lk_prefetch_l2(old_k + at);
        lk_prefetch_l2(old_v + at);
    }
}

// Whether an attention block of rotary_kv_attention loads its threads' first key-row batch
// (KEYS) and their first batch of value runs (VALUES) into registers before it waits for
// the kernel ahead (lk_rka_preload), 1 or 0. Both off: on the H100 (2026-12-05) the keys
// alone made the PRIMARY replay 2.2% slower and the VERIFY one 2.1% (a thread's registers
// 99 to 102 without, 119 to 123 with them; 157 with the values too), the values alone and
// both slower still (gpu_kernel_variants' rkakeys, rkavalues and rkaboth).
#define LK_RKA_PRELOAD_KEYS 0
#define LK_RKA_PRELOAD_VALUES 0

// What a thread of an attention block loaded before the wait: the first LK_RKA_RUNS runs of
// key row j = threadIdx.x, and value run c of keys j = g, g + groups, ... (the first batch of
// the value sum's loop), of the block's KV head.
struct lk_rka_preloaded {
    lk_vec16 k[LK_RKA_RUNS];
    lk_vec16 v[LK_RKA_RUNS];
};

// Load lk_rka_preloaded's runs of the old caches (slots below C only) before the wait. Safe
// because no kernel of a forward writes an old cache, so the kernel ahead (the only one a
// dependent launch's prologue can overlap, as the instruction ahead in a launch program)
// cannot: the old cache is the last forward's output, or a slot's static input filled
// before its graph launches. The position is not read yet, so rows past it are loaded too
// and not used. The scores and the value sum then take these runs where they would have
// loaded the same bytes: the same products in the same order.
template <typename TO>
__device__ __forceinline__ void lk_rka_preload(lk_rka_preloaded& pre,
                                               const TO* __restrict__ old_k,
                                               const TO* __restrict__ old_v, long long Hq,
                                               long long M, long long C, long long D,
                                               long long group) {
    if ((long long)blockIdx.x >= Hq * M) return;
    constexpr int V = 16 / sizeof(TO);
    const long long head = ((long long)blockIdx.x / M) / group * C * D;
    const int tid = threadIdx.x;
    if (LK_RKA_PRELOAD_KEYS && tid < C) {
        const TO* kr = old_k + head + (long long)tid * D;
#pragma unroll
        for (int b = 0; b < LK_RKA_RUNS; ++b) {
            if (b * V < D) pre.k[b] = *reinterpret_cast<const lk_vec16*>(kr + b * V);
        }
    }
    const int runs = (int)(D / V);
    const int groups = blockDim.x / runs;
    const int c = tid % runs, g = tid / runs;
    if (LK_RKA_PRELOAD_VALUES && g < groups) {
#pragma unroll
        for (int b = 0; b < LK_RKA_RUNS; ++b) {
            const long long j = g + b * (long long)groups;
            if (j < C) pre.v[b] = *reinterpret_cast<const lk_vec16*>(old_v + head + j * D + c * V);
        }
    }
}

// A decode's or verification's RotaryKVWrite and the Attention that reads its rotated
// queries and its two caches, in one launch. Blocks [0, Hq * M) are attention's blocks
// (head h, query m): the query row is rotated in the block (lk_rotary_at, rounded to TO as
// the rotated queries were stored); the rows this forward writes (at most LK_RKA_MAX_M, of
// the block's KV head) are staged in shared memory as the cache would hold them (keys
// rotated, rounded to TO, + 0; values + 0), and a key slot written by this forward is read
// from there, any other from the old cache: the values attention would read from the new
// cache. Then attention's own arithmetic (the attention kernel's KVEC path: scores in
// shared memory, softmax in TC, the value sum in 16-byte runs, groups added in order), its
// loads issued LK_RKA_RUNS at a time before their values are used, in the same order. The
// remaining blocks write the two caches (lk_rotary_kv_store). Nothing reads what this launch
// writes, so every element is the bits of rotary_kv then attention.
template <typename TX, typename TC, typename TO>
__global__ void rotary_kv_attention(
        const TX* __restrict__ xq, long long Hq, long long qb, long long qh, long long qm,
        long long qd, int scaled_q, float scale_q,
        const TX* __restrict__ xk, long long Hk, long long kb, long long kh, long long km,
        long long kd, int scaled_k, float scale_k,
        const TC* __restrict__ cosv, const TC* __restrict__ sinv, long long M, long long D,
        long long cb, long long ch, long long cm, long long cd,
        long long sb, long long sh, long long sm, long long sd, int pairs,
        const TO* __restrict__ old_k, TO* __restrict__ cache_k, long long runs_k,
        const TO* __restrict__ old_v, const TO* __restrict__ new_v, TO* __restrict__ cache_v,
        long long runs_v, long long Hv, long long vb, long long vh, long long vm,
        const long long* __restrict__ pos, long long C, long long group, int has_scale,
        float scale, TO* __restrict__ out) {
    lk_kv_prefetch<TO>(old_k, old_v, Hq, M, C, D, group);
    lk_rka_preloaded pre;
    lk_rka_preload<TO>(pre, old_k, old_v, Hq, M, C, D, group);
    lk_grid_wait();
    const long long att_blocks = Hq * M;
    if ((long long)blockIdx.x >= att_blocks) {
        const long long v = ((long long)blockIdx.x - att_blocks) * blockDim.x + threadIdx.x;
        lk_rotary_kv_store<TX, TC, TO>(v, xk, Hk, kb, kh, km, kd, scaled_k, scale_k, cosv,
                                       sinv, M, D, cb, ch, cm, cd, sb, sh, sm, sd, pairs,
                                       old_k, cache_k, runs_k, old_v, new_v, cache_v,
                                       runs_v, Hv, vb, vh, vm, pos, C);
        return;
    }
    __shared__ float qs[LK_RKA_MAX_D];
    __shared__ float knew[LK_RKA_MAX_M * LK_RKA_MAX_D];
    __shared__ float vnew[LK_RKA_MAX_M * LK_RKA_MAX_D];
    __shared__ long long spos[LK_RKA_MAX_M];
    __shared__ float part[LK_ATT_BLOCK * (16 / sizeof(TO))];
    __shared__ float smem[33];
    __shared__ float s[LK_ATT_SMEM_KEYS];
    const TO* O = 0;
    const TC* SC = 0;
    constexpr int V = 16 / sizeof(TO);
    const long long h = blockIdx.x / M;
    const long long m = blockIdx.x % M;
    const long long kvh = h / group;
    const int tid = threadIdx.x;
    // The two staging loops take few turns a thread (D at most 128 of a 256-thread block,
    // M * D at most four turns): kept rolled, so the compiler does not unroll them into code
    // no thread runs (unrolled, bfloat16's kernel was 1.5 times float16's, and slower).
#pragma unroll 1
    for (long long d = tid; d < D; d += blockDim.x) {
        qs[d] = lk_round(O, lk_rotary_at<TX, TC>(xq, cosv, sinv, 0, h, m, d, D, qb, qh,
                                                 qm, qd, cb, ch, cm, cd, sb, sh, sm,
                                                 sd, pairs, scaled_q, scale_q));
    }
#pragma unroll 1
    for (long long i = tid; i < M * D; i += blockDim.x) {
        const long long r = i / D, d = i % D;
        knew[i] = lk_round(O, lk_rotary_at<TX, TC>(xk, cosv, sinv, 0, kvh, r, d, D, kb,
                                                   kh, km, kd, cb, ch, cm, cd, sb, sh,
                                                   sm, sd, pairs, scaled_k, scale_k))
                  + 0.0f;
        vnew[i] = lk_load(new_v, kvh * vh + r * vm + d) + 0.0f;
    }
    if (tid < M) spos[tid] = pos[tid];
    __syncthreads();
    const long long p = spos[m];
    const long long L = p < 0 ? 0 : (p + 1 < C ? p + 1 : C);
    const long long first = spos[0];
    const bool run = lk_positions_run(spos, M);  // pos[r] = pos[0] + r: a hit is j - pos[0]
    const TO* kh_old = old_k + kvh * C * D;
    const TO* vh_old = old_v + kvh * C * D;
    float mx = __int_as_float(0xff800000);  // -inf
    for (long long j = tid; j < L; j += blockDim.x) {
        const long long hit = lk_written_row(spos, M, first, run, j);
        float acc = 0.0f;
        if (hit >= 0) {
            for (long long d = 0; d < D; ++d) acc = __fmaf_rn(qs[d], knew[hit * D + d], acc);
        } else {
            // the key row in batches of LK_RKA_RUNS 16-byte runs, each batch's loads issued
            // before its first product: the same products in the same order
            const TO* kr = kh_old + j * D;
            for (long long c0 = 0; c0 < D; c0 += LK_RKA_RUNS * V) {
                lk_vec16 kv[LK_RKA_RUNS];
#pragma unroll
                for (int b = 0; b < LK_RKA_RUNS; ++b) {
                    if (c0 + b * V < D)
                        kv[b] = LK_RKA_PRELOAD_KEYS && j == tid && c0 == 0
                                    ? pre.k[b]
                                    : *reinterpret_cast<const lk_vec16*>(kr + c0 + b * V);
                }
#pragma unroll
                for (int b = 0; b < LK_RKA_RUNS; ++b) {
                    if (c0 + b * V < D) {
                        float kf[V];
                        lk_unpack16_words(kv[b], kf, TO());
#pragma unroll
                        for (int e = 0; e < V; ++e)
                            acc = __fmaf_rn(qs[c0 + b * V + e], kf[e], acc);
                    }
                }
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
        // keys j = g, g + groups, ... in batches of LK_RKA_RUNS: a batch's value runs are
        // loaded (a written slot's too, unused) before the first is added, then added in
        // order, so a thread waits on memory once a batch, not once a key
        for (long long j0 = g; j0 < L; j0 += LK_RKA_RUNS * (long long)groups) {
            lk_vec16 vv[LK_RKA_RUNS];
#pragma unroll
            for (int b = 0; b < LK_RKA_RUNS; ++b) {
                const long long j = j0 + b * (long long)groups;
                if (j < L)
                    vv[b] = LK_RKA_PRELOAD_VALUES && j0 == g
                                ? pre.v[b]
                                : *reinterpret_cast<const lk_vec16*>(vh_old + j * D + c * V);
            }
#pragma unroll
            for (int b = 0; b < LK_RKA_RUNS; ++b) {
                const long long j = j0 + b * (long long)groups;
                if (j < L) {
                    const long long hit = lk_written_row(spos, M, first, run, j);
                    const float pj = s[j];
                    if (hit >= 0) {
#pragma unroll
                        for (int e = 0; e < V; ++e)
                            o[e] = o[e] + pj * vnew[hit * D + c * V + e];
                    } else {
                        float vf[V];
                        lk_unpack16_words(vv[b], vf, TO());
#pragma unroll
                        for (int e = 0; e < V; ++e) o[e] = o[e] + pj * vf[e];
                    }
                }
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
