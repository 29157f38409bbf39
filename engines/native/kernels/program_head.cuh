// A launch program's first part (program.cu): what turns the kernels included after it into
// device functions one persistent block runs for many of their blocks. It must come before
// every other kernel file: blockIdx and gridDim become the kernel's own block and grid (the
// block the persistent block is running, of the grid the kernel was launched with),
// __global__ becomes __device__ (the program kernel itself keeps __global__), and
// __restrict__ goes.
#pragma once
#define LK_PROGRAM 1
#include "prelude.cuh"

__device__ __forceinline__ unsigned int lk_program_block() { return blockIdx.x; }
__device__ __forceinline__ unsigned int lk_program_blocks() { return gridDim.x; }

struct lk_program_dim3 {
    unsigned int x, y, z;
};

// What a persistent block keeps across the program's grid barriers (the CPU emulator saves
// and restores this region per block, cpu_shim.h's register_block_state).
struct lk_program_state {
    lk_program_dim3 block;  // the kernel's block this persistent block runs now
    lk_program_dim3 grid;  // that kernel's grid
    int turn;  // the kernel (the program's instruction) running
    int passed;  // the last instruction whose barrier this block has passed
    unsigned int* barrier;  // the grid barrier's count (program_tail.cuh)
};
__shared__ lk_program_state lk_ps;
#ifdef LK_CPU_EMULATION
static const int lk_ps_registered = lk_cpu::register_block_state(&lk_ps, sizeof(lk_ps));
#endif

// No __restrict__ in the kernels a program runs: a restrict-qualified read-only operand may
// be loaded through the non-coherent path (ld.global.nc), whose data must not change during
// the launch, while in a program another instruction of the same launch wrote it. Aliasing
// hints only: no value changes.
#undef __restrict__
#define __restrict__

// __global__ comes back in program_tail.cuh, spelled out (NVRTC has no push_macro)
#undef __global__
#define __global__ __device__
#undef blockIdx
#undef gridDim
#define blockIdx (lk_ps.block)
#define gridDim (lk_ps.grid)
