// The greedy step's kernels (engines/tensor_ops/cuda.py): each row's argmax, a
// verification's argmaxes and draft acceptance in one launch, and a test hook. Instances: one
// per dtype tag below.
#if !defined(LK_ARGMAX_BLOCK) || !defined(LK_ARGMAX_UNROLL)
#error "LK_ARGMAX_BLOCK and LK_ARGMAX_UNROLL come from the launcher (-D options)"
#endif

// IEEE half -> float from the bits, exact (every half is a float); no cuda_fp16.h needed.
__device__ __forceinline__ float lockstep_f16_to_f32(unsigned short h) {
    unsigned int sign = ((unsigned int)h & 0x8000u) << 16;
    unsigned int e = ((unsigned int)h >> 10) & 0x1fu;
    unsigned int m = (unsigned int)h & 0x3ffu;
    unsigned int bits;
    if (e == 0u) {
        float mag = (float)m * 5.9604644775390625e-08f;  // zero or subnormal: m * 2^-24
        bits = __float_as_uint(mag);
    } else if (e == 31u) {
        bits = 0x7f800000u | (m << 13);                  // inf (m == 0) or NaN
    } else {
        bits = ((e + 112u) << 23) | (m << 13);           // normal: rebias 15 -> 127
    }
    return __uint_as_float(bits | sign);
}

// A dtype's tag: the type of a stored element, the type of its ordering key, and the key of
// element j (float16 and bfloat16 are both 16-bit words: the tag tells them apart).
#define LK_ARGMAX_TAG(NAME, VALUE, KEY, LOAD) \
    struct NAME { \
        typedef VALUE value; \
        typedef KEY key; \
        static __device__ __forceinline__ KEY load(const VALUE* p, long long j) { return LOAD; } \
    };
LK_ARGMAX_TAG(lk_argmax_float32, float, float, p[j])
LK_ARGMAX_TAG(lk_argmax_float16, unsigned short, float, lockstep_f16_to_f32(p[j]))
LK_ARGMAX_TAG(lk_argmax_bfloat16, unsigned short, float,
              __uint_as_float(((unsigned int)p[j]) << 16))
LK_ARGMAX_TAG(lk_argmax_int32, int, int, p[j])
LK_ARGMAX_TAG(lk_argmax_int64, long long, long long, p[j])
LK_ARGMAX_TAG(lk_argmax_bool, unsigned char, int, (int)p[j])
#undef LK_ARGMAX_TAG

struct alignas(16) lk_argmax_run { unsigned int words[4]; };  // one 16-byte load

// One block of B = LK_ARGMAX_BLOCK threads per row. Thread t scans columns j = t, t + B, ...
// ascending, LK_ARGMAX_UNROLL at a time (every load of a group issued before its compares, so
// a row of a vocabulary's width is read in a few round trips, not one per column), keeping
// the first maximum it sees; a tree then keeps (larger value, else lower index). With `vec`
// (the row starts on 16 bytes) thread t scans 16-byte runs r = t, t + B, ... instead, each
// run's columns ascending, LK_ARGMAX_UNROLL runs loaded at once (SmolLM2's 49152 float16
// logits: 6 runs a thread, one round trip), then the columns past the last whole run one
// at a time. NaN (v != v) is skipped; a row with no non-NaN value yields -1. Every scan order
// and tree gives the same answer: the lowest index of the row's largest value, which every
// thread returns.
template <typename D>
__device__ __forceinline__ void lk_argmax_keep(typename D::key v, long long j,
                                               typename D::key& bv, int& bi) {
    if (!(v != v) && (bi < 0 || v > bv)) { bv = v; bi = (int)j; }
}

template <typename D>
__device__ __forceinline__ int lk_block_argmax(const typename D::value* __restrict__ p,
                                               int cols, int vec) {
    typedef typename D::key lk_key;
    typedef typename D::value lk_value;
    constexpr int V = 16 / sizeof(lk_value);
    __shared__ lk_key best_v[LK_ARGMAX_BLOCK];
    __shared__ int best_i[LK_ARGMAX_BLOCK];
    lk_key bv = (lk_key)0;
    int bi = -1;
    const long long runs = vec ? cols / V : 0;  // whole 16-byte runs, read as such
    for (long long base = threadIdx.x; base < runs;
         base += (long long)LK_ARGMAX_BLOCK * LK_ARGMAX_UNROLL) {
        lk_argmax_run w[LK_ARGMAX_UNROLL];
#pragma unroll
        for (int u = 0; u < LK_ARGMAX_UNROLL; ++u) {
            const long long r = base + (long long)u * LK_ARGMAX_BLOCK;
            if (r < runs) w[u] = reinterpret_cast<const lk_argmax_run*>(p)[r];
        }
#pragma unroll
        for (int u = 0; u < LK_ARGMAX_UNROLL; ++u) {
            const long long r = base + (long long)u * LK_ARGMAX_BLOCK;
            if (r < runs) {
                const lk_value* q = reinterpret_cast<const lk_value*>(&w[u]);
#pragma unroll
                for (int e = 0; e < V; ++e) lk_argmax_keep<D>(D::load(q, e), r * V + e, bv, bi);
            }
        }
    }
    for (long long base = runs * V + threadIdx.x; base < cols;
         base += (long long)LK_ARGMAX_BLOCK * LK_ARGMAX_UNROLL) {
        lk_key v[LK_ARGMAX_UNROLL];
#pragma unroll
        for (int u = 0; u < LK_ARGMAX_UNROLL; ++u) {
            const long long j = base + (long long)u * LK_ARGMAX_BLOCK;
            if (j < cols) v[u] = D::load(p, j);
        }
#pragma unroll
        for (int u = 0; u < LK_ARGMAX_UNROLL; ++u) {
            const long long j = base + (long long)u * LK_ARGMAX_BLOCK;
            if (j < cols) lk_argmax_keep<D>(v[u], j, bv, bi);
        }
    }
    best_v[threadIdx.x] = bv;
    best_i[threadIdx.x] = bi;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) {
            lk_key ov = best_v[threadIdx.x + s];
            int oi = best_i[threadIdx.x + s];
            lk_key cv = best_v[threadIdx.x];
            int ci = best_i[threadIdx.x];
            if (oi >= 0 && (ci < 0 || ov > cv || (ov == cv && oi < ci))) {
                best_v[threadIdx.x] = ov;
                best_i[threadIdx.x] = oi;
            }
        }
        __syncthreads();
    }
    return best_i[0];
}

// Each row's argmax into out (and, when given, out64: the same ids as int64, a next forward's
// tokens feed, with no cast launched after this kernel).
// __launch_bounds__: a 1024-thread block leaves 64 registers a thread; the compiler keeps the
// kernels within them (16-byte runs in flight take registers) rather than fail the launch.
template <typename D>
__global__ void __launch_bounds__(LK_ARGMAX_BLOCK) lockstep_argmax_rows(
        const typename D::value* __restrict__ x, long long row_stride, int cols,
        int* __restrict__ out, long long* __restrict__ out64, int vec) {
    const int best = lk_block_argmax<D>(x + (long long)blockIdx.x * row_stride, cols, vec);
    if (threadIdx.x == 0) {
        out[blockIdx.x] = best;
        if (out64) out64[blockIdx.x] = best;
    }
}

// A verification's accept in one launch of width + 1 blocks: block r takes row r's argmax
// into best[r]; the block that finishes last (a ticket from *done, after a fence) counts the
// prefix where they equal the drafts (out[0], the accepted n), writes the argmax of row n (the
// bonus token, -1 for an all-NaN row) to out[1], and puts *done back to 0 for the next launch.
// With head (a shifted round) row 0 is that row and row r > 0 is x's row r - 1; else row r
// is x's row r. vec: every row (the head's too) starts on 16 bytes.
template <typename D>
__global__ void __launch_bounds__(LK_ARGMAX_BLOCK) lockstep_accept_rows(
        const typename D::value* __restrict__ x, long long row_stride, int cols,
        const typename D::value* __restrict__ head, const long long* __restrict__ drafts,
        int width, int* best, unsigned int* done, int* __restrict__ out, int vec) {
    __shared__ bool last;
    const long long r = head ? (long long)blockIdx.x - 1 : (long long)blockIdx.x;
    const int mine = lk_block_argmax<D>(r < 0 ? head : x + r * row_stride, cols, vec);
    if (threadIdx.x == 0) {
        best[blockIdx.x] = mine;
        __threadfence();
        last = atomicAdd(done, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last || threadIdx.x != 0) return;
    __threadfence();
    const volatile int* seen = best;
    int n = 0;
    while (n < width && (long long)seen[n] == drafts[n]) n++;
    out[0] = n;
    out[1] = seen[n];
    *done = 0u;
}

// Test hook: the ordering key of every element, so the bit decoding can be checked
// against numpy for all 65536 half and bfloat16 patterns.
template <typename D>
__global__ void lockstep_keys(const typename D::value* __restrict__ x, long long n,
                              typename D::key* __restrict__ out) {
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = D::load(x, i);
}
