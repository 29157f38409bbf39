// lockstep native-cuda kernels: fixed reduction orders, no cuBLAS, no host synchronisation.
// The storage types, their loads and stores, and what every kernel calls first. Included by
// every .cu file of this folder; needs no CUDA header (NVRTC finds none on some installs).
#pragma once

typedef unsigned short lk_half;  // float16 as raw bits; converted with PTX cvt below
// bfloat16 as raw bits, in a struct so its overloads differ from lk_half's: a bfloat16 is
// the high half of a float32, so loading is a shift; storing rounds to nearest even.
struct lk_bf16 { unsigned short bits; };  // size 2, alignment 2

__device__ __forceinline__ float lk_load(const float* p, long long i) { return p[i]; }
__device__ __forceinline__ double lk_load(const double* p, long long i) { return p[i]; }
__device__ __forceinline__ long long lk_load(const int* p, long long i) { return (long long)p[i]; }
__device__ __forceinline__ long long lk_load(const long long* p, long long i) { return p[i]; }
__device__ __forceinline__ float lk_load(const lk_half* p, long long i) {
#ifdef LK_CPU_EMULATION
    return lk_cpu_half_to_float(p[i]);
#else
    float f;
    const lk_half h = p[i];
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
#endif
}
__device__ __forceinline__ float lk_bf16_to_float(unsigned short b) {
    return __uint_as_float(((unsigned int)b) << 16);
}
__device__ __forceinline__ float lk_load(const lk_bf16* p, long long i) {
    return lk_bf16_to_float(p[i].bits);
}

__device__ __forceinline__ void lk_store(float* p, long long i, float v) { p[i] = v; }
__device__ __forceinline__ void lk_store(double* p, long long i, double v) { p[i] = v; }
__device__ __forceinline__ void lk_store(int* p, long long i, long long v) { p[i] = (int)v; }
__device__ __forceinline__ void lk_store(long long* p, long long i, long long v) { p[i] = v; }
__device__ __forceinline__ void lk_store(lk_half* p, long long i, float v) {
#ifdef LK_CPU_EMULATION
    p[i] = lk_cpu_float_to_half(v);
#else
    lk_half h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(v));
    p[i] = h;
#endif
}
// float -> bfloat16, round to nearest even; a NaN stays a NaN (quiet, sign kept), as
// ml_dtypes converts it; overflow rounds to infinity. From sm_80 the hardware conversion
// rounds (one instruction; the integer rounding below made a bfloat16 decode step about 8%
// slower on the H200) and only a NaN takes ml_dtypes' pattern; older devices round in
// integers. Both give the same bits for every float.
__device__ __forceinline__ unsigned short lk_float_to_bf16(float v) {
    const unsigned int u = __float_as_uint(v);
    const unsigned short nan = (unsigned short)(((u >> 16) & 0x8000u) | 0x7fc0u);
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    unsigned short h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(v));
    return (u & 0x7fffffffu) > 0x7f800000u ? nan : h;
#else
    if ((u & 0x7fffffffu) > 0x7f800000u) return nan;
    return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
#endif
}
__device__ __forceinline__ void lk_store(lk_bf16* p, long long i, float v) {
    p[i].bits = lk_float_to_bf16(v);
}

// Dynamic shared memory of the launch, as an array of T (the CPU emulator's is one buffer).
#ifndef LK_CPU_EMULATION
#define LK_DYNAMIC_SHARED(T, name) extern __shared__ __align__(16) T name[]
#endif

// Ask L2 for the 16 bytes at p: a hint, nothing is computed (nothing on a CPU).
__device__ __forceinline__ void lk_prefetch_l2(const void* p) {
#ifndef LK_CPU_EMULATION
    asm volatile("prefetch.global.L2 [%0];" :: "l"(p));
#endif
}

// The type a storage type's values are computed in: what lk_load returns (float for the
// three float types, double, long long for the integers).
template <typename T>
struct lk_acc { typedef decltype(lk_load((const T*)0, 0)) type; };

// Programmatic dependent launch (dependent_launch.py): a kernel launched with the
// programmatic serialization attribute may start while the kernel ahead of it on the stream
// still runs. Every kernel calls this before it reads or writes anything another kernel
// touches (only weight prefetches, hints, come first): it waits until the kernel ahead has
// finished and its writes are visible, then lets the next kernel's blocks start, so their
// prefetches overlap this kernel's work. Launched without the attribute it returns at once.
//
// Inside a launch program (program.cu: one persistent launch running many kernels' blocks)
// the wait is the program's grid-wide barrier instead: every block has finished the kernel
// before this one.
#ifdef LK_PROGRAM
__device__ void lk_program_wait();
#endif
__device__ __forceinline__ void lk_grid_wait() {
#ifdef LK_PROGRAM
    lk_program_wait();
#elif defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// A warp's 32 values added in one fixed butterfly (xor 16, 8, 4, 2, 1): every lane gets
// the sum. Every GEMV and block reduction sums its lanes this way.
__device__ __forceinline__ float lk_warp_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 16);
    v += __shfl_xor_sync(0xffffffffu, v, 8);
    v += __shfl_xor_sync(0xffffffffu, v, 4);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v;
}
