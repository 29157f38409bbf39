// Conversions between storage types, one thread an element: the prelude's lk_load of From,
// then its lk_store to To. Instances: lk_cast<lk_bf16, float> (the bits shifted up, exact)
// and lk_cast<float, lk_bf16> (round to nearest even, a NaN kept), bfloat16.py's casts.
#include "prelude.cuh"

template <typename From, typename To>
__global__ void lk_cast(const From* __restrict__ x, To* __restrict__ out, long long n) {
    const long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) lk_store(out, i, lk_load(x, i));
}
