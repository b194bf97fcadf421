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

// GPUKIT_KEEP(name): whether this compilation generates the code of kernel
// name. A file whose kernels wrap their bodies in
//   if constexpr (GPUKIT_KEEP(kernel_name)) { ... }
// can be compiled one kernel at a time: libgpu/kernels (DeviceCompiler)
// passes -DGPUKIT_ONLY=kernel_name for the kernel a run needs, and every
// other kernel of the file compiles to an empty body (the template it
// calls is never instantiated), so a run pays NVRTC only for what it
// launches. Without GPUKIT_ONLY every kernel is kept (kernelc build
// --libgpu, the emulator, cuda-check). The name is a token, spelled as the
// extern "C" kernel is; pasting (attn_fwd_tc##SUF##_d64) works.
#define GPUKIT_STR_(x) #x
#define GPUKIT_STR(x) GPUKIT_STR_(x)
constexpr bool gpukit_streq(const char* a, const char* b) {
  return *a == *b && (*a == 0 || gpukit_streq(a + 1, b + 1));
}
#ifdef GPUKIT_ONLY
#define GPUKIT_KEEP(name) gpukit_streq(GPUKIT_STR(name), GPUKIT_STR(GPUKIT_ONLY))
#else
#define GPUKIT_KEEP(name) true
#endif

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

// Element load and store for the dtypes ops take (f32, bf16), so one
// template serves both instances of a kernel (<name>_f32, <name>_bf16):
// gpukit_ld widens to f32, gpukit_st rounds from f32.
__device__ __forceinline__ float gpukit_ld(const float* p) { return *p; }
__device__ __forceinline__ float gpukit_ld(const gpukit_bf16* p) { return gpukit_bf16_to_f32(*p); }
__device__ __forceinline__ void gpukit_st(float* p, float v) { *p = v; }
__device__ __forceinline__ void gpukit_st(gpukit_bf16* p, float v) { *p = gpukit_f32_to_bf16(v); }

// gpukit_blk_sum returns the sum of v over a block whose size is a
// multiple of 32 (at most 1024), to every thread. The order of additions
// depends only on blockDim.x, so results are bitwise reproducible. sh
// needs 32 floats; the function synchronises before reusing it.
__device__ __forceinline__ float gpukit_blk_sum(float v, float* sh) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = gpukit_warp_sum(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float t = lane < nw ? sh[lane] : 0.0f;
  return gpukit_warp_sum(t);
}

// gpukit_warp_max returns the maximum of v over the 32 lanes of a warp.
__device__ __forceinline__ float gpukit_warp_max(float v) {
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// gpukit_blk_max is gpukit_blk_sum for the maximum.
__device__ __forceinline__ float gpukit_blk_max(float v, float* sh) {
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = gpukit_warp_max(v);
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  float t = lane < nw ? sh[lane] : -__int_as_float(0x7f800000);
  return gpukit_warp_max(t);
}
