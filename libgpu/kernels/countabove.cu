// countabove.cu: Engine.CountAbove (libgpu/ops/while.go), the reduction a
// While loop's body uses to compute its flag.
#include "common.cuh"

// count_above: out[0] = the number of the n elements of x greater than thr
// (n < 2³¹), one block (a loop's flag: the sequences still running).
template <typename T>
__device__ void count_above(int* out, const T* x, long long n, float thr) {
  __shared__ int sh[32];
  int k = 0;
  for (long long i = threadIdx.x; i < n; i += blockDim.x) k += (float)x[i] > thr ? 1 : 0;
  for (int o = 16; o > 0; o >>= 1) k += __shfl_xor_sync(0xffffffffu, k, o);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) sh[warp] = k;
  __syncthreads();
  if (warp == 0) {
    k = lane < nw ? sh[lane] : 0;
    for (int o = 16; o > 0; o >>= 1) k += __shfl_xor_sync(0xffffffffu, k, o);
    if (lane == 0) out[0] = k;
  }
}

extern "C" __global__ void __launch_bounds__(1024) count_above_f32(int* out, const float* x, long long n, float thr) {
  count_above<float>(out, x, n, thr);
}
extern "C" __global__ void __launch_bounds__(1024) count_above_i32(int* out, const int* x, long long n, float thr) {
  count_above<int>(out, x, n, thr);
}
