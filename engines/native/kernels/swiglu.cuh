// SwiGLU's element: swiglu.cu's kernel and the GEMVs with a SwiGLU in prologue_gemv.cu.
#pragma once
#include "round.cuh"

// Element i: g * sigmoid(g) * up in TC (sigmoid split by sign), not yet rounded to the
// output's type.
template <typename TG, typename TC>
__device__ __forceinline__ float lk_swiglu(const TG* __restrict__ gate,
                                           const TG* __restrict__ up,
                                           long long i) {
    const TC* C = 0;
    const float g = lk_round(C, lk_load(gate, i));
    const float u = lk_round(C, lk_load(up, i));
    const float e = lk_round(C, expf(-fabsf(g)));
    const float denom = lk_round(C, 1.0f + e);
    const float sig = g >= 0.0f ? lk_round(C, 1.0f / denom) : lk_round(C, e / denom);
    return lk_round(C, lk_round(C, g * sig) * u);
}
