// Kernels for suites/test_kernel_emulation.py's checks of the CPU emulator itself: compiled
// beside engines/native/kernels (whose prelude they include) by suites.support.kernel_folder.
#include "prelude.cuh"

// Half a warp waits at the block's barrier, the other half at a shuffle: a GPU hangs, the
// emulator says so.
__global__ void diverge(float* out) {
    float v = 1.0f;
    if (threadIdx.x < 16) __syncthreads();
    else v = lk_warp_sum(v);
    out[threadIdx.x] = v;
}

// Each float of x stored as T and loaded back, and each T pattern of bits widened: the
// prelude's conversions, which the shim answers on the CPU.
template <typename T>
__global__ void convert(const float* x, T* narrow, float* back, const T* bits, float* widened,
                        long long n) {
    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
    if (i >= n) return;
    lk_store(narrow, i, x[i]);
    back[i] = lk_load(narrow, i);
    widened[i] = lk_load(bits, i);
}
