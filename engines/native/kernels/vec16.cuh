// 16-byte runs of storage: one vector load, its values as floats.
#pragma once
#include "prelude.cuh"

struct alignas(16) lk_vec16 { unsigned int words[4]; };  // one 16-byte load

// The 16 / sizeof(T) values of a 16-byte run of storage type T (the last argument's type, a
// tag) as floats, element 0 the lowest bytes: exactly lk_load's values (every conversion is
// exact), in fewer instructions for bfloat16 (a pair is one shift and one mask of a word,
// not two 16-bit extractions). The run is taken by value: one 16-byte load into registers
// (a reference would let the float16 overload read memory two bytes at a time).
template <int V>
__device__ __forceinline__ void lk_unpack16_words(const lk_vec16 v, float (&f)[V], float) {
#pragma unroll
    for (int i = 0; i < 4; ++i) f[i] = __uint_as_float(v.words[i]);
}
template <int V>
__device__ __forceinline__ void lk_unpack16_words(const lk_vec16 v, float (&f)[V], lk_half) {
    const lk_half* h = reinterpret_cast<const lk_half*>(&v);
#pragma unroll
    for (int i = 0; i < 8; ++i) f[i] = lk_load(h, i);
}
template <int V>
__device__ __forceinline__ void lk_unpack16_words(const lk_vec16 v, float (&f)[V], lk_bf16) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
        f[2 * i] = __uint_as_float(v.words[i] << 16);
        f[2 * i + 1] = __uint_as_float(v.words[i] & 0xffff0000u);
    }
}
