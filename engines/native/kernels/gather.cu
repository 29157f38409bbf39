// Gather (the ONNX node) in one launch: out[o, j, r] = data[o, k(idx[j]), r] over data viewed
// as [outer, extent, inner], where k counts an index below zero from the end (idx + extent,
// ONNX's rule) and takes one still outside [0, extent) modulo the extent, so no read leaves
// the table (a model's out-of-range index is its own error; the array path's cupy.take did not
// report one either). Every element moves as its bits; one thread an element, grid-strided.
// gather_wrap<T, I>: T the data's storage type, I the indices' (int64 or int32).
#include "prelude.cuh"

template <typename T, typename I>
__global__ void gather_wrap(const T* __restrict__ data, const I* __restrict__ idx,
                            T* __restrict__ out, long long outer, long long extent,
                            long long count, long long inner) {
    lk_grid_wait();
    const long long total = outer * count * inner;
    const long long step = (long long)gridDim.x * blockDim.x;
    for (long long e = (long long)blockIdx.x * blockDim.x + threadIdx.x; e < total; e += step) {
        const long long r = e % inner;
        const long long t = e / inner;
        const long long j = t % count;
        const long long o = t / count;
        long long k = (long long)idx[j] % extent;  // ONNX's rule in [-extent, 0), a wrap past
        if (k < 0) k += extent;
        out[e] = data[(o * extent + k) * inner + r];
    }
}
