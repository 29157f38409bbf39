// A launch program's last part (program.cu): the grid barrier, the instruction's call and
// the persistent kernel. LK_PROGRAM_OPS(OP) (from the launcher) lists OP(code, instance) for
// every kernel instance a program may run.
#pragma once
#undef blockIdx
#undef gridDim
#ifdef LK_CPU_EMULATION
#define blockIdx (lk_cpu::block_index())
#define gridDim (lk_cpu::grid_dim())
#endif
// __global__ again as CUDA's host_defines.h spells it (NVRTC ignores #pragma pop_macro: on
// the H200 lk_program stayed a device function); the emulator's shim spells it as nothing
#undef __global__
#ifdef LK_CPU_EMULATION
#define __global__
#else
#define __global__ __attribute__((global))
#endif

#ifndef LK_PROGRAM_OPS
#error "LK_PROGRAM_OPS comes from the launcher (the program module's instance list)"
#endif

// Every block of the program: thread 0 arrives with one atomic add and waits for the count's
// top bit to flip. Block 0 adds 2^31 - (blocks - 1) and every other block 1, so the bit flips
// when the last block arrives and the count's low bits are back where they were: no reset,
// no second atomic on the last arrival's path (cooperative groups' grid sync does the same),
// and the barrier can be reused with any grid. The program is launched cooperatively (every
// block resident), so the wait ends.
__device__ __forceinline__ void lk_program_grid_sync(unsigned int* bar, unsigned int blocks) {
#ifdef LK_CPU_EMULATION
    (void)bar;
    (void)blocks;
    lk_cpu_grid_sync();
#else
    const unsigned int add = lk_program_block() == 0 ? 0x80000000u - (blocks - 1u) : 1u;
    __threadfence();
    const unsigned int old = atomicAdd(bar, add);
    volatile unsigned int* count = bar;
    while (((old ^ *count) & 0x80000000u) == 0u) {
    }
    __threadfence();
#endif
}

// A kernel's lk_grid_wait inside a program: the first call of an instruction waits until
// every block has finished the instruction before it; later calls (the block's next blocks
// of the same kernel) return at once. Every thread of the block calls it, as every thread of
// a kernel calls lk_grid_wait.
__device__ void lk_program_wait() {
    __syncthreads();
    const bool behind = lk_ps.passed < lk_ps.turn;
    __syncthreads();  // every thread has read before thread 0 writes
    if (!behind) return;
    if (threadIdx.x == 0) {
        lk_program_grid_sync(lk_ps.barrier, lk_program_blocks());
        lk_ps.passed = lk_ps.turn;
    }
    __syncthreads();
}

// The parameters of a kernel, read from its packed argument record: each at its C offset
// (aligned to its type), as the launcher packs them with struct's native layout.
template <unsigned long long... I>
struct lk_index_list {};
template <unsigned long long N, unsigned long long... I>
struct lk_make_index_list : lk_make_index_list<N - 1, N - 1, I...> {};
template <unsigned long long... I>
struct lk_make_index_list<0, I...> {
    typedef lk_index_list<I...> type;
};

template <typename... A>
__host__ __device__ constexpr unsigned long long lk_param_offset(unsigned long long i) {
    const unsigned long long size[] = {sizeof(A)..., 0};
    const unsigned long long align[] = {alignof(A)..., 1};
    unsigned long long offset = 0;
    for (unsigned long long j = 0;; ++j) {
        offset = (offset + align[j] - 1) / align[j] * align[j];
        if (j == i) return offset;
        offset += size[j];
    }
}

template <typename T>
__device__ __forceinline__ T lk_param(const unsigned char* record, unsigned long long offset) {
    return *reinterpret_cast<const T*>(record + offset);
}

template <typename... A, unsigned long long... I>
__device__ __forceinline__ void lk_program_invoke(void (*kernel)(A...),
                                                  const unsigned char* record,
                                                  lk_index_list<I...>) {
    kernel(lk_param<A>(record, lk_param_offset<A...>(I))...);
}

template <typename... A>
__device__ __forceinline__ void lk_program_call(void (*kernel)(A...),
                                                const unsigned char* record) {
    lk_program_invoke(kernel, record, typename lk_make_index_list<sizeof...(A)>::type());
}

#define LK_PROGRAM_CASE(code, ...) \
    case code: lk_program_call(&__VA_ARGS__, record); break;

// One persistent launch running `count` instructions in order: instruction i is a kernel
// launch (table row i: the kernel's code, its grid, its shared memory, the offset of its
// argument record in `records`); this block runs that kernel's blocks b, b + gridDim, ...
// and the kernel's own lk_grid_wait is the barrier between instructions. Blocks of one
// instruction run one after another with a barrier between them, so each finds the shared
// memory as a fresh block would. Every kernel of a program has the program's block size.
// LK_PROGRAM_MIN_BLOCKS (a -D option, where given): the blocks a multiprocessor must hold at
// once, so the compiler caps each thread's registers to fit them (spilling if it must)
#ifdef LK_PROGRAM_MIN_BLOCKS
#define LK_PROGRAM_BOUNDS __launch_bounds__(32 * LK_GEMV_WARPS, LK_PROGRAM_MIN_BLOCKS)
#else
#define LK_PROGRAM_BOUNDS
#endif
__global__ void LK_PROGRAM_BOUNDS lk_program(const long long* __restrict__ table, int count,
                           const unsigned char* __restrict__ records, unsigned int* barrier) {
    if (threadIdx.x == 0) {
        lk_ps.turn = 0;
        lk_ps.passed = 0;
        lk_ps.barrier = barrier;
    }
    __syncthreads();
    const unsigned int mine = lk_program_block(), blocks = lk_program_blocks();
    for (int i = 0; i < count; ++i) {
        const long long code = table[4 * i];
        const long long grid = table[4 * i + 1];
        const unsigned char* record = records + table[4 * i + 3];
        if (threadIdx.x == 0) {
            lk_ps.turn = i;
            lk_ps.grid = {(unsigned int)grid, 1u, 1u};
        }
        __syncthreads();
        for (long long b = mine; b < grid; b += blocks) {
            if (threadIdx.x == 0) lk_ps.block = {(unsigned int)b, 0u, 0u};
            __syncthreads();
            switch (code) {
                LK_PROGRAM_OPS(LK_PROGRAM_CASE)
            }
            __syncthreads();
        }
        lk_program_wait();  // a block that ran none of this kernel's blocks arrives here
    }
}
