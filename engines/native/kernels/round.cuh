// lk_round(T, v): a float rounded through storage type T and back (the identity for float).
// The fused kernels round where the unfused graph stores a value in a narrower dtype, so a
// float16 graph's chain of float16 ops keeps its roundings; T is a typed null pointer's.
#pragma once
#include "prelude.cuh"

template <typename T>
__device__ __forceinline__ float lk_round(const T*, float v) {
    T t;
    lk_store(&t, 0, v);
    return lk_load(&t, 0);
}
