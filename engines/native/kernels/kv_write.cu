// Static-cache writes (the KVWrite nodes): kv_write, kv_write2 and kv_write2v, one instance
// per storage type T.
#include "kv_write.cuh"

// Two caches as kv_write2 writes them, one thread per 16-byte run (lk_kv_write_vec):
// threads [0, runs_a) write cache a, the rest cache b.
template <typename T>
__global__ void kv_write2v(
        const T* __restrict__ old_a, const T* __restrict__ new_a, T* __restrict__ out_a,
        long long runs_a, long long H_a, long long D_a, long long ab, long long ah,
        long long am,
        const T* __restrict__ old_b, const T* __restrict__ new_b, T* __restrict__ out_b,
        long long runs_b, long long H_b, long long D_b, long long bb, long long bh,
        long long bm,
        const long long* __restrict__ pos, long long C, long long M) {
    lk_grid_wait();
    const long long v = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (v < runs_a) {
        lk_kv_write_vec<T>(old_a, new_a, pos, out_a, v, H_a, C, D_a, M, ab, ah, am);
    } else if (v - runs_a < runs_b) {
        lk_kv_write_vec<T>(old_b, new_b, pos, out_b, v - runs_a, H_b, C, D_b, M, bb, bh, bm);
    }
}

// One thread per element of one cache.
template <typename T>
__global__ void kv_write(const T* __restrict__ old, const T* __restrict__ nw,
                         const long long* __restrict__ pos,
                         T* __restrict__ out, long long total, long long H,
                         long long C, long long D, long long M,
                         long long nb, long long nh, long long nm,
                         long long nd) {
    lk_grid_wait();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    lk_kv_write<T>(old, nw, pos, out, idx, H, C, D, M, nb, nh, nm, nd);
}

// Two caches written at the same positions (a layer's keys and values) in one launch:
// threads [0, total_a) write cache a, the rest cache b.
template <typename T>
__global__ void kv_write2(
        const T* __restrict__ old_a, const T* __restrict__ new_a, T* __restrict__ out_a,
        long long total_a, long long H_a, long long D_a, long long ab, long long ah,
        long long am, long long ad,
        const T* __restrict__ old_b, const T* __restrict__ new_b, T* __restrict__ out_b,
        long long total_b, long long H_b, long long D_b, long long bb, long long bh,
        long long bm, long long bd,
        const long long* __restrict__ pos, long long C, long long M) {
    lk_grid_wait();
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < total_a) {
        lk_kv_write<T>(old_a, new_a, pos, out_a, idx, H_a, C, D_a, M, ab, ah, am, ad);
    } else if (idx - total_a < total_b) {
        lk_kv_write<T>(old_b, new_b, pos, out_b, idx - total_a, H_b, C, D_b, M, bb, bh, bm,
                       bd);
    }
}
