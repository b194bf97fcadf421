// selftest.cu: tiny kernels the tests of libgpu/kernels and kernelc compile,
// load and launch. Not used by ops.
#include "common.cuh"

// y[i] = a*x[i] + y[i] for i in [0, n).
extern "C" __global__ void gpukit_axpy(float a, const float* x, float* y,
                                       gpukit_u64 n) {
  GPUKIT_GRID_STRIDE(i, n) { y[i] = a * x[i] + y[i]; }
}

// Block-wise sums of x through static shared memory: out[blockIdx.x] is the
// sum of x[blockIdx.x*256 : blockIdx.x*256+256] (missing elements count as 0).
// Launch with 256 threads per block. Its static shared memory (1 KiB) is what
// the info tests compare against the driver.
extern "C" __global__ void __launch_bounds__(256)
    gpukit_block_sum(const float* x, float* out, gpukit_u64 n) {
  __shared__ float tile[256];
  gpukit_u64 i = (gpukit_u64)blockIdx.x * 256 + threadIdx.x;
  tile[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (int s = 128; s > 0; s >>= 1) {
    if (threadIdx.x < s) tile[threadIdx.x] += tile[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[blockIdx.x] = tile[0];
}

// x[i] *= s; a template, reached through NVRTC name expressions
// ("gpukit_scale<float>", "gpukit_scale<double>").
template <typename T>
__global__ void gpukit_scale(T* x, T s, gpukit_u64 n) {
  GPUKIT_GRID_STRIDE(i, n) { x[i] *= s; }
}
