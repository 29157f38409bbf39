// Activation x activation products: bmm, one instance per storage type T.
#include "prelude.cuh"

// out[b0, b1, b2, b3, m, n] = sum_k a(b, m, k) * b(b, k, n), strides in elements (0: broadcast).
// Each product is rounded, then added (no fusion), k ascending from +0: the arithmetic of
// NumpyArrayBackend.matmul, so the two backends agree bit for bit here.
template <typename T>
__global__ void bmm(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ out,
                    long long total, long long M, long long N, long long K, long long d1,
                    long long d2, long long d3, long long as0, long long as1, long long as2,
                    long long as3, long long a_sm, long long a_sk, long long bs0,
                    long long bs1, long long bs2, long long bs3, long long b_sk,
                    long long b_sn) {
    lk_grid_wait();
    typedef typename lk_acc<T>::type A;
    const long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= total) return;
    const long long n = idx % N;
    long long t = idx / N;
    const long long m = t % M;
    t /= M;
    const long long i3 = t % d3;
    t /= d3;
    const long long i2 = t % d2;
    t /= d2;
    const long long i1 = t % d1;
    const long long i0 = t / d1;
    const long long a_off = i0 * as0 + i1 * as1 + i2 * as2 + i3 * as3 + m * a_sm;
    const long long b_off = i0 * bs0 + i1 * bs1 + i2 * bs2 + i3 * bs3 + n * b_sn;
    A acc = 0;
#pragma unroll 8
    for (long long k = 0; k < K; ++k) {  // unrolled loads run ahead; the adds stay in order
        const A prod = lk_load(a, a_off + k * a_sk) * lk_load(b, b_off + k * b_sk);
        acc = acc + prod;
    }
    lk_store(out, idx, acc);
}
