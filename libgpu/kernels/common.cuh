// common.cuh: small helpers shared by gpukit's kernels.
//
// Self-contained on purpose: it includes nothing, so NVRTC compiles every
// kernel without an include path to the CUDA toolkit. bf16 is handled as its
// raw 16-bit pattern (the upper half of an IEEE-754 binary32), the layout
// libgpu/tensor uses on the host, so kernels need no cuda_bf16.h.
#pragma once

typedef unsigned long long gpukit_u64;
typedef long long gpukit_i64;
typedef unsigned short gpukit_bf16;

// GPUKIT_GRID_STRIDE(i, n): loop i over [0, n) with a grid-stride loop, so
// any grid size covers any n (see the CUDA C++ Programming Guide's
// grid-stride pattern). i is a gpukit_u64.
#define GPUKIT_GRID_STRIDE(i, n)                                              \
  for (gpukit_u64 i = (gpukit_u64)blockIdx.x * blockDim.x + threadIdx.x;      \
       i < (gpukit_u64)(n); i += (gpukit_u64)gridDim.x * blockDim.x)

// gpukit_bf16_to_f32 widens a bf16 bit pattern exactly.
__device__ __forceinline__ float gpukit_bf16_to_f32(gpukit_bf16 h) {
  return __uint_as_float(((unsigned int)h) << 16);
}

// gpukit_f32_to_bf16 rounds to nearest, ties to even; NaN stays a quiet NaN.
__device__ __forceinline__ gpukit_bf16 gpukit_f32_to_bf16(float f) {
  unsigned int u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    return (gpukit_bf16)((u >> 16) | 0x0040u);
  }
  u += 0x7fffu + ((u >> 16) & 1u);
  return (gpukit_bf16)(u >> 16);
}

// gpukit_warp_sum returns the sum of v over the 32 lanes of a full warp.
__device__ __forceinline__ float gpukit_warp_sum(float v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// gpukit_mt_find returns the tensor of a multi-tensor launch that owns block
// blk: the largest i with start[i] <= blk (start is non-decreasing over the
// count tensors, start[count] is the grid size).
__device__ __forceinline__ int gpukit_mt_find(const int* start, int count, int blk) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (start[mid] <= blk) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}
