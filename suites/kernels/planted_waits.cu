// Kernels for suites/test_dependent_launch.py's check of where lk_grid_wait comes: read as
// text, never compiled.

// waits after declaring shared memory, asking L2 for weights and loading weight runs into
// registers: the control
__global__ void fine(const float* w, float* y) {
    __shared__ float part[32];
    lk_gemv_prefetch<lk_half>(w, K, N, team, b);
    lk_preloaded<LK_GEMV_PRELOAD> pre;
    lk_gemv_preload<lk_half, LK_GEMV_PRELOAD>(pre, true, w, K, N, team, b);
    lk_grid_wait();
    y[threadIdx.x] = part[0];
}

// reads its input before the wait: the planted bug
__global__ void early(const float* x, float* y) {
    const float v = x[threadIdx.x];
    lk_grid_wait();
    y[threadIdx.x] = v;
}

// never waits
__global__ void never(const float* x, float* y) {
    y[threadIdx.x] = x[threadIdx.x];
}
