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
// A cooperative launch (a kernel with a grid-wide barrier, lk_cpu_grid_sync) makes every
// block's fibers at once and runs one block at a time up to the grid barrier, then the
// next; when every block waits there, all go on. Its blocks share the function statics, so
// what a block keeps in shared memory across a grid barrier must be registered
// (register_block_state): the scheduler saves and restores that region per block.
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

// Internal linkage: each compiled module keeps its own scheduler (a static of an inline
// function would be one object across every loaded library, GNU_UNIQUE).
namespace lk_cpu {
namespace {

constexpr std::size_t kStack = 256 * 1024;  // a fiber's stack (mapped lazily)

enum State { kRunning, kAtBlock, kAtWarp, kAtGrid, kDone };

struct Fiber {
    ucontext_t context;
    void* stack = nullptr;
    lk_cpu_dim3 thread{0, 0, 0};
    lk_cpu_dim3 block{0, 0, 0};
    int linear = 0;  // the thread's index in the block
    int first = 0;  // the index of its block's thread 0 in Run::fibers
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
    void* state = nullptr;  // a cooperative kernel's per-block shared region, and its size
    std::size_t state_size = 0;
    std::vector<unsigned char> saved;  // each block's copy of it
};

inline Run& run() {
    static Run r;
    return r;
}
inline Fiber*& current() {
    static Fiber* f = nullptr;
    return f;
}
inline lk_cpu_dim3& block_index() { return current()->block; }

// The region of shared memory a cooperative kernel keeps across a grid barrier.
inline int register_block_state(void* region, std::size_t size) {
    run().state = region;
    run().state_size = size;
    return 0;
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
    r.exchange[self->first + self->linear] = bits;
    wait(kAtWarp);  // every lane has written
    const int source = self->first + base + (lane ^ (lane_mask & 31));
    T out;
    bits = r.exchange[source];
    std::memcpy(&out, &bits, sizeof(T));
    wait(kAtWarp);  // every lane has read: the next shuffle may write
    return out;
}

enum Outcome { kFinished, kParked, kStuck };

// Fibers [lo, hi) of one block, run until every one has ended (kFinished) or waits at the
// grid barrier with the others of its block waiting behind it (kParked); kStuck (and
// run().error) when they wait at different barriers with none to release: a barrier not
// every thread reaches, which hangs a GPU.
inline Outcome run_block(int lo, int hi, bool descending) {
    Run& r = run();
    const int n = hi - lo;
    for (;;) {
        for (int k = 0; k < n; ++k) {
            Fiber& f = r.fibers[lo + (descending ? n - 1 - k : k)];
            if (f.state != kRunning) continue;
            current() = &f;
            swapcontext(&r.scheduler, &f.context);
        }
        current() = nullptr;
        bool live = false, released = false, all_at_block = true, at_grid = false;
        for (int w = lo; w < hi; w += 32) {
            bool warp_live = false, warp_at_warp = true;
            for (int i = w; i < hi && i < w + 32; ++i) {
                const State s = r.fibers[i].state;
                if (s == kDone) continue;
                if (s == kAtGrid) {
                    at_grid = true;
                    continue;
                }
                warp_live = true;
                if (s != kAtWarp) warp_at_warp = false;
                if (s != kAtBlock) all_at_block = false;
            }
            live = live || warp_live;
            if (warp_live && warp_at_warp) {
                for (int i = w; i < hi && i < w + 32; ++i)
                    if (r.fibers[i].state == kAtWarp) r.fibers[i].state = kRunning;
                released = true;
            }
        }
        if (!live) return at_grid ? kParked : kFinished;
        if (released) continue;
        if (all_at_block && !at_grid) {
            for (int i = lo; i < hi; ++i)
                if (r.fibers[i].state == kAtBlock) r.fibers[i].state = kRunning;
            continue;
        }
        if (all_at_block && at_grid) return kParked;  // the block waits behind the grid
        r.error = "threads wait at different barriers (a __syncthreads or a shuffle not every "
                  "live thread of the block or warp reaches)";
        return kStuck;
    }
}

inline void start(Fiber& f) {
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = f.stack;
    f.context.uc_stack.ss_size = kStack;
    f.context.uc_link = &run().scheduler;
    makecontext(&f.context, trampoline, 0);
    f.state = kRunning;
}

// Every block's fibers at once, a block at a time up to each grid barrier.
inline bool run_cooperative(long long blocks, int threads, bool descending) {
    Run& r = run();
    for (Fiber& f : r.fibers) start(f);
    if (r.state) r.saved.assign((std::size_t)blocks * r.state_size, 0xA5);
    for (;;) {
        bool finished = true, all_parked = true;
        for (long long k = 0; k < blocks; ++k) {
            const long long b = descending ? blocks - 1 - k : k;
            unsigned char* copy = r.state ? r.saved.data() + b * r.state_size : nullptr;
            if (copy) std::memcpy(r.state, copy, r.state_size);
            const Outcome o = run_block((int)(b * threads), (int)((b + 1) * threads),
                                        descending);
            if (copy) std::memcpy(copy, r.state, r.state_size);
            if (o == kStuck) return false;
            if (o != kFinished) finished = false;
            if (o != kParked) all_parked = false;
        }
        if (finished) return true;
        if (!all_parked) {
            r.error = "a grid barrier that not every block reaches (some ended, others wait)";
            return false;
        }
        for (Fiber& f : r.fibers)
            if (f.state == kAtGrid) f.state = kRunning;
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

inline bool make_fibers(std::size_t count) {
    Run& r = run();
    if (r.fibers.size() == count) return true;
    for (Fiber& f : r.fibers) munmap(f.stack, kStack);
    r.fibers.assign(count, Fiber());
    for (Fiber& f : r.fibers) {
        f.stack = mmap(nullptr, kStack, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (f.stack == MAP_FAILED) {
            f.stack = nullptr;
            r.fibers.clear();
            r.error = "no memory for the fibers' stacks";
            return false;
        }
    }
    return true;
}

inline lk_cpu_dim3 unflatten(long long i, const unsigned int* dims) {
    return {(unsigned)(i % dims[0]), (unsigned)((i / dims[0]) % dims[1]),
            (unsigned)(i / ((long long)dims[0] * dims[1]))};
}

// Runs kernel<<<grid, block, smem>>>(args) to its end; 0, or 1 with lk_cpu_error() saying
// why. descending: blocks and threads taken in descending order; cooperative: every block
// at once (a kernel with grid barriers).
template <typename... A>
inline int launch(void (*kernel)(A...), const unsigned int* grid, const unsigned int* block,
                  unsigned long long smem, void** args, int descending, int cooperative = 0) {
    Run& r = run();
    r.error.clear();
    const int threads = (int)(block[0] * block[1] * block[2]);
    const long long blocks = (long long)grid[0] * grid[1] * grid[2];
    if (threads <= 0 || threads > 1024 || threads % 32 != 0) {
        r.error = "a block of " + std::to_string(threads) +
                  " threads: the emulator runs whole warps, at most 1024 threads";
        return 1;
    }
    if (cooperative && blocks * threads > 65536) {
        r.error = "a cooperative grid of " + std::to_string(blocks * threads) +
                  " threads: the emulator takes at most 65536";
        return 1;
    }
    const long long resident = cooperative ? blocks : 1;
    if (!make_fibers((std::size_t)(resident * threads))) return 1;
    r.exchange.assign((std::size_t)(resident * threads), 0);
    r.dynamic_smem.assign(smem + 16, 0xA5);
    for (long long i = 0; i < resident * threads; ++i) {
        Fiber& f = r.fibers[i];
        f.linear = (int)(i % threads);
        f.first = (int)(i - f.linear);
        f.thread = unflatten(f.linear, block);
        f.block = unflatten(i / threads, grid);
    }
    Closure<A...> closure{kernel, args};
    r.body = &Closure<A...>::invoke;
    r.closure = &closure;
    block_dim() = {block[0], block[1], block[2]};
    grid_dim() = {grid[0], grid[1], grid[2]};
    if (cooperative) return run_cooperative(blocks, threads, descending != 0) ? 0 : 1;
    for (long long k = 0; k < blocks; ++k) {
        const long long b = descending ? blocks - 1 - k : k;
        for (Fiber& f : r.fibers) {
            f.block = unflatten(b, grid);
            start(f);
        }
        std::fill(r.dynamic_smem.begin(), r.dynamic_smem.end(), (unsigned char)0xA5);
        const Outcome o = run_block(0, threads, descending != 0);
        if (o == kStuck) return 1;
        if (o == kParked) {
            r.error = "a grid barrier in a kernel not launched cooperatively";
            return 1;
        }
    }
    return 0;
}

template <typename T>
inline T bit_cast(const void* p) {
    T out;
    std::memcpy(&out, p, sizeof(T));
    return out;
}

}  // namespace
}  // namespace lk_cpu

#define threadIdx (lk_cpu::current()->thread)
#define blockIdx (lk_cpu::block_index())
#define blockDim (lk_cpu::block_dim())
#define gridDim (lk_cpu::grid_dim())
#define LK_DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(lk_cpu::dynamic_smem())

inline void __syncthreads() { lk_cpu::wait(lk_cpu::kAtBlock); }
// The whole grid's barrier (one thread of each block calls it; the others wait at the block's)
inline void lk_cpu_grid_sync() { lk_cpu::wait(lk_cpu::kAtGrid); }
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
