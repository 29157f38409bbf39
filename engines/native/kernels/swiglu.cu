// SwiGLU (the SwiGLU node): swiglu<TG, TC, TO> (gate/up, compute and output types).
#include "swiglu.cuh"

// One thread per element.
template <typename TG, typename TC, typename TO>
__global__ void swiglu(const TG* __restrict__ gate,
                       const TG* __restrict__ up,
                       TO* __restrict__ out, long long n) {
    lk_grid_wait();
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    lk_store(out, i, lk_swiglu<TG, TC>(gate, up, i));
}
