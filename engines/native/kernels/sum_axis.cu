// Sums over a run of axes: sum_axis, one instance per storage type T.
#include "prelude.cuh"

// x viewed as [outer, L, inner] (C order); out[o, i] = sum_l x[o, l, i], l ascending.
template <typename T>
__global__ void sum_axis(const T* __restrict__ x, T* __restrict__ out, long long outer,
                         long long L, long long inner) {
    lk_grid_wait();
    typedef typename lk_acc<T>::type A;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= outer * inner) return;
    const long long o = idx / inner;
    const long long i = idx % inner;
    const long long base = o * L * inner + i;
    A acc = 0;
    // unrolled loads run ahead; the adds stay in order
#pragma unroll 16
    for (long long l = 0; l < L; ++l) acc = acc + lk_load(x, base + l * inner);
    lk_store(out, idx, acc);
}
