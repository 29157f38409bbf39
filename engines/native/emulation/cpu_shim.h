// lockstep's kernels on a CPU: what the .cu files need of CUDA, in C++17, so that g++ compiles
// them unchanged and a test runs them without a GPU (engines/native/emulation/).
//
// Each CUDA thread of a block is a fiber (ucontext) on the calling thread; the scheduler
// runs every fiber in turn until it waits at a barrier or ends, then releases the barriers
// every live thread has reached: __syncthreads for the block, a warp's 32 lanes for each
// shuffle. Blocks run one after another, so `__shared__` is a function's static (one
// block's at a time) and dynamic shared memory one buffer. Nothing runs in parallel: the
// results are the same on every run, and the order (threads and blocks ascending or
// descending) is the caller's choice, so a read that needs a missing barrier reads a value
// not yet written in one of the two orders.
//
// Arithmetic: the kernels are compiled with --fmad=false on the GPU (their only fused
// multiply-adds are explicit), here with -ffp-contract=off and __fmaf_rn as fmaf, so
// additions and products round as the GPU's do; expf and other library functions are the C
// library's, whose last bits may differ from CUDA's. Compare emulated launches with each
// other bit for bit (fused with unfused, a row with the one-row launch), with a reference
// within tolerance.
#pragma once
#define LK_CPU_EMULATION 1

#include <sys/mman.h>
#include <ucontext.h>

#include <atomic>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#define __device__
#define __global__
#define __host__
#define __forceinline__ inline
#define __restrict__ __restrict
#define __align__(n) alignas(n)
#define __shared__ static
#define __launch_bounds__(...)

struct alignas(16) float4 {
    float x, y, z, w;
};

inline float4 make_float4(float x, float y, float z, float w) { return {x, y, z, w}; }

struct lk_cpu_dim3 {
    unsigned int x, y, z;
};

namespace lk_cpu {

constexpr std::size_t kStack = 256 * 1024;  // a fiber's stack (mapped lazily)

enum State { kRunning, kAtBlock, kAtWarp, kDone };

struct Fiber {
    ucontext_t context;
    void* stack = nullptr;
    lk_cpu_dim3 thread{0, 0, 0};
    int linear = 0;  // the thread's index in the block
    State state = kDone;
};

// What a launch is running: one block's fibers, its shared scratch, the failure if any.
struct Run {
    std::vector<Fiber> fibers;
    std::vector<unsigned long long> exchange;  // a lane's value at a shuffle
    std::vector<unsigned char> dynamic_smem;
    ucontext_t scheduler;
    void (*body)(void*) = nullptr;
    void* closure = nullptr;
    std::string error;
};

inline Run& run() {
    static Run r;
    return r;
}
inline Fiber*& current() {
    static Fiber* f = nullptr;
    return f;
}
inline lk_cpu_dim3& block_index() {
    static lk_cpu_dim3 b{0, 0, 0};
    return b;
}
inline lk_cpu_dim3& block_dim() {
    static lk_cpu_dim3 b{1, 1, 1};
    return b;
}
inline lk_cpu_dim3& grid_dim() {
    static lk_cpu_dim3 g{1, 1, 1};
    return g;
}
inline unsigned char* dynamic_smem() { return run().dynamic_smem.data(); }

inline void trampoline() {
    Run& r = run();
    r.body(r.closure);
    current()->state = kDone;  // returning resumes the scheduler (uc_link)
}

// This fiber waits (at the block's barrier or its warp's), the scheduler runs the others.
inline void wait(State at) {
    Fiber* self = current();
    self->state = at;
    swapcontext(&self->context, &run().scheduler);
}

template <typename T>
inline T shfl_xor(unsigned int, T value, int lane_mask) {
    static_assert(sizeof(T) <= 8, "a shuffle moves up to 8 bytes");
    Fiber* self = current();
    Run& r = run();
    const int lane = self->linear & 31;
    const int base = self->linear - lane;
    unsigned long long bits = 0;
    std::memcpy(&bits, &value, sizeof(T));
    r.exchange[self->linear] = bits;
    wait(kAtWarp);  // every lane has written
    const int source = base + (lane ^ (lane_mask & 31));
    T out;
    bits = r.exchange[source];
    std::memcpy(&out, &bits, sizeof(T));
    wait(kAtWarp);  // every lane has read: the next shuffle may write
    return out;
}

// The fibers of one block, run until every one has ended; false (and run().error) when
// the threads wait at different barriers with none to release: a barrier not every
// thread reaches, undefined on a GPU.
inline bool run_block(bool descending) {
    Run& r = run();
    const int n = (int)r.fibers.size();
    for (Fiber& f : r.fibers) {
        getcontext(&f.context);
        f.context.uc_stack.ss_sp = f.stack;
        f.context.uc_stack.ss_size = kStack;
        f.context.uc_link = &r.scheduler;
        makecontext(&f.context, trampoline, 0);
        f.state = kRunning;
    }
    for (;;) {
        for (int k = 0; k < n; ++k) {
            Fiber& f = r.fibers[descending ? n - 1 - k : k];
            if (f.state != kRunning) continue;
            current() = &f;
            swapcontext(&r.scheduler, &f.context);
        }
        current() = nullptr;
        bool live = false, released = false, all_at_block = true;
        for (int w = 0; w < n; w += 32) {
            bool warp_live = false, warp_at_warp = true;
            for (int i = w; i < n && i < w + 32; ++i) {
                const State s = r.fibers[i].state;
                if (s == kDone) continue;
                warp_live = true;
                if (s != kAtWarp) warp_at_warp = false;
                if (s != kAtBlock) all_at_block = false;
            }
            live = live || warp_live;
            if (warp_live && warp_at_warp) {
                for (int i = w; i < n && i < w + 32; ++i)
                    if (r.fibers[i].state == kAtWarp) r.fibers[i].state = kRunning;
                released = true;
            }
        }
        if (!live) return true;
        if (released) continue;
        if (all_at_block) {
            for (Fiber& f : r.fibers)
                if (f.state == kAtBlock) f.state = kRunning;
            continue;
        }
        r.error = "threads wait at different barriers (a __syncthreads or a shuffle not every "
                  "live thread of the block or warp reaches)";
        return false;
    }
}

template <typename T>
struct code_of {
    static constexpr char value = std::is_pointer<T>::value ? 'p'
        : std::is_same<T, float>::value ? 'f'
        : std::is_same<T, double>::value ? 'd'
        : std::is_same<T, long long>::value ? 'q'
        : std::is_same<T, int>::value ? 'i'
        : std::is_same<T, unsigned int>::value ? 'I'
        : '?';
};

// A kernel's parameters as struct codes, in order: what the launcher packs.
template <typename... A>
inline const char* signature(void (*)(A...)) {
    static const char codes[] = {code_of<std::decay_t<A>>::value..., '\0'};
    return codes;
}

template <typename... A, std::size_t... I>
inline void call(void (*kernel)(A...), void** args, std::index_sequence<I...>) {
    kernel(*static_cast<std::decay_t<A>*>(args[I])...);
}

template <typename... A>
struct Closure {
    void (*kernel)(A...);
    void** args;
    static void invoke(void* self) {
        Closure* c = static_cast<Closure*>(self);
        call(c->kernel, c->args, std::index_sequence_for<A...>{});
    }
};

// Runs kernel<<<grid, block, smem>>>(args) to its end; 0, or 1 with lk_cpu_error() saying
// why. descending: blocks and threads taken in descending order.
template <typename... A>
inline int launch(void (*kernel)(A...), const unsigned int* grid, const unsigned int* block,
                  unsigned long long smem, void** args, int descending) {
    Run& r = run();
    r.error.clear();
    const int threads = (int)(block[0] * block[1] * block[2]);
    if (threads <= 0 || threads > 1024 || threads % 32 != 0) {
        r.error = "a block of " + std::to_string(threads) +
                  " threads: the emulator runs whole warps, at most 1024 threads";
        return 1;
    }
    if (r.fibers.size() != (std::size_t)threads) {
        for (Fiber& f : r.fibers) munmap(f.stack, kStack);
        r.fibers.assign(threads, Fiber());
        for (Fiber& f : r.fibers) {
            f.stack = mmap(nullptr, kStack, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
            if (f.stack == MAP_FAILED) {
                f.stack = nullptr;
                r.fibers.clear();
                r.error = "no memory for the fibers' stacks";
                return 1;
            }
        }
    }
    r.exchange.assign(threads, 0);
    r.dynamic_smem.assign(smem + 16, 0);
    for (int i = 0; i < threads; ++i) {
        Fiber& f = r.fibers[i];
        f.linear = i;
        f.thread = {(unsigned)(i % block[0]), (unsigned)((i / block[0]) % block[1]),
                    (unsigned)(i / (block[0] * block[1]))};
    }
    Closure<A...> closure{kernel, args};
    r.body = &Closure<A...>::invoke;
    r.closure = &closure;
    block_dim() = {block[0], block[1], block[2]};
    grid_dim() = {grid[0], grid[1], grid[2]};
    const long long blocks = (long long)grid[0] * grid[1] * grid[2];
    for (long long k = 0; k < blocks; ++k) {
        const long long b = descending ? blocks - 1 - k : k;
        block_index() = {(unsigned)(b % grid[0]), (unsigned)((b / grid[0]) % grid[1]),
                         (unsigned)(b / ((long long)grid[0] * grid[1]))};
        std::fill(r.dynamic_smem.begin(), r.dynamic_smem.end(), (unsigned char)0xA5);
        if (!run_block(descending != 0)) return 1;
    }
    return 0;
}

template <typename T>
inline T bit_cast(const void* p) {
    T out;
    std::memcpy(&out, p, sizeof(T));
    return out;
}

}  // namespace lk_cpu

#define threadIdx (lk_cpu::current()->thread)
#define blockIdx (lk_cpu::block_index())
#define blockDim (lk_cpu::block_dim())
#define gridDim (lk_cpu::grid_dim())
#define LK_DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(lk_cpu::dynamic_smem())

inline void __syncthreads() { lk_cpu::wait(lk_cpu::kAtBlock); }
inline void __threadfence() { std::atomic_thread_fence(std::memory_order_seq_cst); }
template <typename T>
inline T __shfl_xor_sync(unsigned int mask, T value, int lane_mask) {
    return lk_cpu::shfl_xor(mask, value, lane_mask);
}
inline unsigned int atomicAdd(unsigned int* p, unsigned int v) {
    const unsigned int old = *p;
    *p = old + v;
    return old;
}
inline float __fmaf_rn(float a, float b, float c) { return std::fma(a, b, c); }
inline float __uint_as_float(unsigned int u) { return lk_cpu::bit_cast<float>(&u); }
inline float __int_as_float(int i) { return lk_cpu::bit_cast<float>(&i); }
inline unsigned int __float_as_uint(float f) { return lk_cpu::bit_cast<unsigned int>(&f); }
inline int __float_as_int(float f) { return lk_cpu::bit_cast<int>(&f); }

// float16 <-> float32 as the GPU's cvt converts: exact widening, narrowing to nearest even
inline float lk_cpu_half_to_float(unsigned short h) {
    return (float)lk_cpu::bit_cast<_Float16>(&h);
}
inline unsigned short lk_cpu_float_to_half(float f) {
    const _Float16 h = (_Float16)f;
    return lk_cpu::bit_cast<unsigned short>(&h);
}
