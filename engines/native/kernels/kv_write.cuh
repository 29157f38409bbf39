// A static cache's write, element by element or a 16-byte run at a time: kv_write.cu's
// kernels, and the cache writes of rotary_kv and rotary_kv_attention.
#pragma once
#include "vec16.cuh"

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

// One element of the cache [B, H, C, D] (C order): slot c takes the row of new
// [B, H, M, D] (read through its strides) whose position is c, stored as row + 0 (-0
// becomes +0, as the one-hot product's sum makes it); every other slot is copied.
template <typename T>
__device__ __forceinline__ void lk_kv_write(const T* __restrict__ old,
                                            const T* __restrict__ nw,
                                            const long long* __restrict__ pos,
                                            T* __restrict__ out, long long idx,
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
template <typename T>
__device__ __forceinline__ void lk_kv_write_vec(const T* __restrict__ old,
                                                const T* __restrict__ nw,
                                                const long long* __restrict__ pos,
                                                T* __restrict__ out, long long v,
                                                long long H, long long C, long long D,
                                                long long M, long long nb, long long nh,
                                                long long nm) {
    constexpr int V = 16 / sizeof(T);
    const long long idx = v * V;
    long long b, h, d;
    const long long hit = lk_cache_slot(idx, H, C, D, pos, M, &b, &h, &d);
    if (hit < 0) {
        reinterpret_cast<lk_vec16*>(out)[v] = reinterpret_cast<const lk_vec16*>(old)[v];
        return;
    }
    const lk_vec16 src = *reinterpret_cast<const lk_vec16*>(nw + b * nb + h * nh + hit * nm + d);
    const T* sp = reinterpret_cast<const T*>(&src);
#pragma unroll
    for (int e = 0; e < V; ++e) lk_store(out, idx + e, lk_load(sp, e) + 0.0f);
}
