// For suites/test_tensor_ops_cuda.py: spins about `cycles` clocks, then writes x (v, and 2v
// at every index 37 mod 64), so an op on another stream would read x before it is written.
__global__ void slow_fill(float* x, long long n, float v, long long cycles) {
    long long t0 = clock64();
    while (clock64() - t0 < cycles) { }
    for (long long i = threadIdx.x; i < n; i += blockDim.x) x[i] = (i % 64 == 37) ? 2.0f * v : v;
}
