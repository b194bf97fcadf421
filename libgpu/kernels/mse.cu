// mse.cu: mean squared error and its gradient in one pass
// (libgpu/ops/mse.go):
//
//   mse_partial: part[b] = Σ_{i of block b} (p_i − y_i)²;  dp_i (+)= 2(p_i − y_i)/n
//   mse_final:   loss = (Σ_b part[b])/n
//
// Block b takes the grid-stride elements b·256 + t + k·gridDim·256; the
// sums are in f32 in a fixed order for a given grid (deterministic).
#include "common.cuh"

template <typename T>
__device__ void mse_partial(float* part, T* dp, const T* p, const T* y, long long n, float inv, int acc) {
  __shared__ float sh[32];
  float s = 0.0f;
  GPUKIT_GRID_STRIDE(i, n) {
    const float d = gpukit_ld(p + i) - gpukit_ld(y + i);
    s += d * d;
    if (dp) {
      const float g = 2.0f * d * inv;
      gpukit_st(dp + i, acc ? gpukit_ld(dp + i) + g : g);
    }
  }
  s = gpukit_blk_sum(s, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

extern "C" __global__ void mse_final(float* loss, const float* part, int blocks, float inv) {
  __shared__ float sh[32];
  float s = 0.0f;
  for (int b = threadIdx.x; b < blocks; b += blockDim.x) s += part[b];
  s = gpukit_blk_sum(s, sh);
  if (threadIdx.x == 0) loss[0] = s * inv;
}

extern "C" __global__ void mse_partial_f32(float* part, float* dp, const float* p, const float* y, long long n,
                                           float inv, int acc) {
  mse_partial<float>(part, dp, p, y, n, inv, acc);
}
extern "C" __global__ void mse_partial_bf16(float* part, gpukit_bf16* dp, const gpukit_bf16* p,
                                            const gpukit_bf16* y, long long n, float inv, int acc) {
  mse_partial<gpukit_bf16>(part, dp, p, y, n, inv, acc);
}
