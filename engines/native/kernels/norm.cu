// RMSNorm (the RMSNorm and AddRMSNorm nodes): add_rms_norm<TI, TD, TO> (residual, delta,
// output types) and rms_norm<TI, TO>.
#include "norm.cuh"

// One warp per row of n (NORM_ROWS_PER_BLOCK rows a block): s = residual + delta stored as
// the first output, RMSNorm of s as the second (lk_norm_row).
template <typename TI, typename TD, typename TO>
__global__ void add_rms_norm(
        const TI* __restrict__ res, const TD* __restrict__ delta,
        const TI* __restrict__ gain, TI* __restrict__ sum_out, TO* __restrict__ out,
        long long rows, long long n, float eps) {
    lk_grid_wait();
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // whole warps only: no barrier follows
    const long long base = row * n;
    lk_norm_row<TI, TD, TO>(res + base, delta + base, gain, sum_out + base, out + base, n,
                            eps, threadIdx.x & 31);
}

// One warp per row of n: RMSNorm of x (lk_norm_row without a delta or a sum).
template <typename TI, typename TO>
__global__ void rms_norm(const TI* __restrict__ x,
                         const TI* __restrict__ gain,
                         TO* __restrict__ out, long long rows,
                         long long n, float eps) {
    lk_grid_wait();
    const long long row = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
    if (row >= rows) return;  // whole warps only: no barrier follows
    const long long base = row * n;
    lk_norm_row<TI, TI, TO>(x + base, (const TI*)0, gain, (TI*)0, out + base, n, eps,
                            threadIdx.x & 31);
}
