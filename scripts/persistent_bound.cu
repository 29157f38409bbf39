// What a decode step built as one persistent kernel could cost at best (issue 37): the step's
// shape without its arithmetic. Stage s of a chain reads a weight slice (the bytes that stage
// of SmolLM2 reads), then, after every block finished stage s - 1, the activations stage
// s - 1 wrote (from L2), reduces them with its weights and writes one value a block for stage
// s + 1. No value means anything; only the bytes moved and the waits are real. Timed by
// scripts/gpu_persistent_bound.py, beside the same stages as one launch each.
//
// MODE 0: the waits alone; 1: + the activation round trip; 2: + the weights read after the
// wait; 3: + the next stage's weights (up to LK_BOUND_REGS 16-byte runs a thread) loaded
// into registers before the wait, as a persistent kernel would stream them, the rest after.
// SLEEP: a waiting block polls the barrier word every SLEEP nanoseconds (0: a tight loop).
// AHEAD (launches only; 0: none): before its wait, stage s also asks L2 for its share of
// stage (s + AHEAD) % stages' weights, one 128-byte line at a time, so that a stage's reads
// find L2 where an earlier stage asked for them (weights depend on nothing computed).
#ifndef LK_BOUND_REGS
#define LK_BOUND_REGS 4
#endif

struct alignas(16) lk_word4 { unsigned int x, y, z, w; };

__device__ __forceinline__ unsigned int lk_ld_acquire(const unsigned int* p) {
    unsigned int v;
    asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ float lk_ldcg(const float* p) {
    float v;
    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p));
    return v;
}

// The launch programs' barrier (kernels/program_tail.cuh): one add a block, then a wait for
// the count's top bit to flip; polled tight or with a sleep between reads.
__device__ __forceinline__ void lk_bound_sync(unsigned int* bar, int sleep_ns) {
    __syncthreads();
    if (threadIdx.x == 0) {
        const unsigned int add = blockIdx.x == 0 ? 0x80000000u - (gridDim.x - 1u) : 1u;
        __threadfence();
        const unsigned int old = atomicAdd(bar, add);
        if (sleep_ns > 0) {
            while (((old ^ lk_ld_acquire(bar)) & 0x80000000u) == 0u) __nanosleep(sleep_ns);
        } else {
            volatile unsigned int* count = bar;
            while (((old ^ *count) & 0x80000000u) == 0u) {
            }
        }
        __threadfence();
    }
    __syncthreads();
}

__device__ __forceinline__ unsigned int lk_fold4(lk_word4 v) { return v.x ^ v.y ^ v.z ^ v.w; }

// This block's runs [lo, hi) of a stage's weight words (a block-sized share of the stage).
__device__ __forceinline__ void lk_bound_share(const long long* start, int s, long long& lo,
                                               long long& hi) {
    const long long a = start[s], n = start[s + 1] - a;
    const long long per = (n + gridDim.x - 1) / gridDim.x;
    lo = a + per * blockIdx.x;
    hi = lo + per < a + n ? lo + per : a + n;
}

// One stage's work after its wait: the weight runs not already in registers, the
// activations of the stage before (width A, from L2), a block sum, one value written.
__device__ __forceinline__ void lk_bound_stage(const lk_word4* __restrict__ w,
                                               const long long* start, int s, float* act,
                                               int A, int mode, unsigned int held,
                                               int first_run, float* red) {
    unsigned int acc = held;
    if (mode >= 2) {
        long long lo, hi;
        lk_bound_share(start, s, lo, hi);
        for (long long i = lo + first_run + threadIdx.x; i < hi; i += blockDim.x)
            acc ^= lk_fold4(w[i]);
    }
    float x = 0.0f;
    if (mode >= 1) {
        const float* in = act + (s & 1) * A;
        for (int i = threadIdx.x; i < A; i += blockDim.x) x += lk_ldcg(in + i);
    }
    x += (float)(acc & 1u);
#pragma unroll
    for (int m = 16; m > 0; m >>= 1) x += __shfl_xor_sync(0xffffffffu, x, m);
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = x;
    __syncthreads();
    if (threadIdx.x == 0 && mode >= 1) {
        float t = 0.0f;
        for (int i = 0; i < (int)(blockDim.x >> 5); ++i) t += red[i];
        if ((int)blockIdx.x < A) act[((s + 1) & 1) * A + blockIdx.x] = t * 0.5f;
    }
}

// Mode 3's registers: the first LK_BOUND_REGS * blockDim runs of this block's share of
// stage s, loaded (not yet used) so their reads overlap the wait.
__device__ __forceinline__ unsigned int lk_bound_hold(const lk_word4* __restrict__ w,
                                                      const long long* start, int s,
                                                      int stages) {
    if (s >= stages) return 0u;
    long long lo, hi;
    lk_bound_share(start, s, lo, hi);
    lk_word4 r[LK_BOUND_REGS];
#pragma unroll
    for (int j = 0; j < LK_BOUND_REGS; ++j) {
        const long long i = lo + j * (long long)blockDim.x + threadIdx.x;
        r[j] = i < hi ? w[i] : lk_word4{0u, 0u, 0u, 0u};
    }
    unsigned int acc = 0u;
#pragma unroll
    for (int j = 0; j < LK_BOUND_REGS; ++j) acc ^= lk_fold4(r[j]);
    return acc;
}

extern "C" __global__ void lk_bound_persistent(const lk_word4* __restrict__ w,
                                               const long long* start, int stages, float* act,
                                               int A, unsigned int* bar, int mode,
                                               int sleep_ns) {
    __shared__ float red[32];
    const int first_run = mode == 3 ? LK_BOUND_REGS * (int)blockDim.x : 0;
    for (int s = 0; s < stages; ++s) {
        // mode 3 issues stage s's loads before the wait; their use comes after it
        const unsigned int held = mode == 3 ? lk_bound_hold(w, start, s, stages) : 0u;
        lk_bound_sync(bar, sleep_ns);
        lk_bound_stage(w, start, s, act, A, mode, held, first_run, red);
    }
}

// Ask L2 for this block's share of stage s's weights, a 128-byte line (8 runs) at a time.
__device__ __forceinline__ void lk_bound_prefetch(const lk_word4* w, const long long* start,
                                                  int s) {
    long long lo, hi;
    lk_bound_share(start, s, lo, hi);
    for (long long i = lo + 8 * (long long)threadIdx.x; i < hi; i += 8 * (long long)blockDim.x)
        asm volatile("prefetch.global.L2 [%0];" ::"l"(w + i));
}

// Stage s as a launch of its own (the launch chain's shape): the same work, the stream's
// order in place of the barrier. Launched as a dependent launch (the driver may start it
// while the kernel ahead runs), mode 3 loads its registers before griddepcontrol.wait, as
// native-cuda's kernels prefetch their weights before lk_grid_wait; launched plain, the
// wait returns at once.
extern "C" __global__ void lk_bound_launch(const lk_word4* __restrict__ w,
                                           const long long* start, int s, int stages,
                                           float* act, int A, int mode, int ahead) {
    __shared__ float red[32];
    if (ahead > 0) lk_bound_prefetch(w, start, (s + ahead) % stages);
    const unsigned int held = mode == 3 ? lk_bound_hold(w, start, s, stages) : 0u;
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
    lk_bound_stage(w, start, s, act, A, mode, held,
                   mode == 3 ? LK_BOUND_REGS * (int)blockDim.x : 0, red);
}
