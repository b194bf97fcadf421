// cast.cu: dtype conversion between f32 and bf16 (libgpu/ops/cast.go).
#include "common.cuh"

// cast_f32_to_bf16: dst[i] = round-to-nearest-even(src[i]), i in [0, n).
extern "C" __global__ void cast_f32_to_bf16(gpukit_bf16* dst, const float* src, long long n) {
  GPUKIT_GRID_STRIDE(i, n) { dst[i] = gpukit_f32_to_bf16(src[i]); }
}

// cast_bf16_to_f32: dst[i] = src[i] widened exactly.
extern "C" __global__ void cast_bf16_to_f32(float* dst, const gpukit_bf16* src, long long n) {
  GPUKIT_GRID_STRIDE(i, n) { dst[i] = gpukit_bf16_to_f32(src[i]); }
}
