// vec.cuh: vectorised loads and stores and row-group reductions shared by the
// element-wise and row-wise kernels (layernorm.cu, softmax.cu, gelu.cu,
// add.cu, dropout.cu; Go side: libgpu/ops/rowwise.go).
//
// A "vector" is V consecutive elements of one dtype, moved with 16-byte
// accesses where V·sizeof(T) ≥ 16 (two for f32 at V = 8) and one narrower
// access below that. The caller guarantees the alignment: V·sizeof(T)
// bytes, capped at 16 (the Go side checks pointers, row strides and sizes
// and launches the V = 1 instance otherwise).
#pragma once
#include "common.cuh"

struct alignas(16) gpukit_u32x4 {
  unsigned int a, b, c, d;
};
struct alignas(8) gpukit_u32x2 {
  unsigned int a, b;
};

// gpukit_ldv<V>(p, out): out[0..V) = p[0..V) widened to f32.
template <int V>
__device__ __forceinline__ void gpukit_ldv(const float* p, float* out) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int k = 0; k < V; k += 4) {
      gpukit_u32x4 u = *reinterpret_cast<const gpukit_u32x4*>(p + k);
      out[k] = __uint_as_float(u.a);
      out[k + 1] = __uint_as_float(u.b);
      out[k + 2] = __uint_as_float(u.c);
      out[k + 3] = __uint_as_float(u.d);
    }
  } else if constexpr (V == 2) {
    gpukit_u32x2 u = *reinterpret_cast<const gpukit_u32x2*>(p);
    out[0] = __uint_as_float(u.a);
    out[1] = __uint_as_float(u.b);
  } else {
#pragma unroll
    for (int k = 0; k < V; k++) out[k] = p[k];
  }
}

// Two bf16 in one little-endian 32-bit word: element 0 in the low half.
__device__ __forceinline__ void gpukit_unpack_bf16x2(unsigned int w, float* out) {
  out[0] = __uint_as_float(w << 16);
  out[1] = __uint_as_float(w & 0xffff0000u);
}
// gpukit_pack_bf16x2 rounds two f32 to nearest even: one cvt.rn.bf16x2.f32
// (sm_80+; it writes its first source to the upper half) instead of about
// five integer instructions per element; NaN becomes the canonical bf16
// NaN. The host emulation (scripts/cudaemu) rounds the same way in C.
__device__ __forceinline__ unsigned int gpukit_pack_bf16x2(float lo, float hi) {
#ifdef GPUKIT_EMU
  return (unsigned int)gpukit_f32_to_bf16(lo) | ((unsigned int)gpukit_f32_to_bf16(hi) << 16);
#else
  unsigned int r;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));
  return r;
#endif
}

template <int V>
__device__ __forceinline__ void gpukit_ldv(const gpukit_bf16* p, float* out) {
  if constexpr (V % 8 == 0) {
#pragma unroll
    for (int k = 0; k < V; k += 8) {
      gpukit_u32x4 u = *reinterpret_cast<const gpukit_u32x4*>(p + k);
      gpukit_unpack_bf16x2(u.a, out + k);
      gpukit_unpack_bf16x2(u.b, out + k + 2);
      gpukit_unpack_bf16x2(u.c, out + k + 4);
      gpukit_unpack_bf16x2(u.d, out + k + 6);
    }
  } else if constexpr (V == 4) {
    gpukit_u32x2 u = *reinterpret_cast<const gpukit_u32x2*>(p);
    gpukit_unpack_bf16x2(u.a, out);
    gpukit_unpack_bf16x2(u.b, out + 2);
  } else {
#pragma unroll
    for (int k = 0; k < V; k++) out[k] = gpukit_bf16_to_f32(p[k]);
  }
}

// gpukit_stv<V>(p, v): p[0..V) = v[0..V) rounded to p's dtype.
template <int V>
__device__ __forceinline__ void gpukit_stv(float* p, const float* v) {
  if constexpr (V % 4 == 0) {
#pragma unroll
    for (int k = 0; k < V; k += 4) {
      gpukit_u32x4 u;
      u.a = __float_as_uint(v[k]);
      u.b = __float_as_uint(v[k + 1]);
      u.c = __float_as_uint(v[k + 2]);
      u.d = __float_as_uint(v[k + 3]);
      *reinterpret_cast<gpukit_u32x4*>(p + k) = u;
    }
  } else if constexpr (V == 2) {
    gpukit_u32x2 u;
    u.a = __float_as_uint(v[0]);
    u.b = __float_as_uint(v[1]);
    *reinterpret_cast<gpukit_u32x2*>(p) = u;
  } else {
#pragma unroll
    for (int k = 0; k < V; k++) p[k] = v[k];
  }
}

template <int V>
__device__ __forceinline__ void gpukit_stv(gpukit_bf16* p, const float* v) {
  if constexpr (V % 8 == 0) {
#pragma unroll
    for (int k = 0; k < V; k += 8) {
      gpukit_u32x4 u;
      u.a = gpukit_pack_bf16x2(v[k], v[k + 1]);
      u.b = gpukit_pack_bf16x2(v[k + 2], v[k + 3]);
      u.c = gpukit_pack_bf16x2(v[k + 4], v[k + 5]);
      u.d = gpukit_pack_bf16x2(v[k + 6], v[k + 7]);
      *reinterpret_cast<gpukit_u32x4*>(p + k) = u;
    }
  } else if constexpr (V == 4) {
    gpukit_u32x2 u;
    u.a = gpukit_pack_bf16x2(v[0], v[1]);
    u.b = gpukit_pack_bf16x2(v[2], v[3]);
    *reinterpret_cast<gpukit_u32x2*>(p) = u;
  } else {
#pragma unroll
    for (int k = 0; k < V; k++) p[k] = gpukit_f32_to_bf16(v[k]);
  }
}

// Row groups. A row-wise kernel hands each row to a group of threads: one
// warp (several rows per block, group = threadIdx.x / 32) or the whole block
// (block != 0; blockDim.x a multiple of 32, at most 1024). These reduce N
// values at once over the group and give every thread of it the results.
// The order of additions depends only on the group's size, so results are
// bitwise reproducible. With block != 0 every thread of the block must call
// (they synchronise); sh needs 32·N floats.
template <int N>
__device__ __forceinline__ void gpukit_group_sum(float* v, int block, float* sh) {
#pragma unroll
  for (int i = 0; i < N; i++) v[i] = gpukit_warp_sum(v[i]);
  if (!block) return;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();  // sh may still be read by a previous reduction
  if (lane == 0) {
#pragma unroll
    for (int i = 0; i < N; i++) sh[i * 32 + warp] = v[i];
  }
  __syncthreads();
#pragma unroll
  for (int i = 0; i < N; i++) v[i] = gpukit_warp_sum(lane < nw ? sh[i * 32 + lane] : 0.0f);
}

// gpukit_group_max is gpukit_group_sum for the maximum of one value.
__device__ __forceinline__ float gpukit_group_max(float v, int block, float* sh) {
  v = gpukit_warp_max(v);
  if (!block) return v;
  int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  __syncthreads();
  if (lane == 0) sh[warp] = v;
  __syncthreads();
  return gpukit_warp_max(lane < nw ? sh[lane] : -__int_as_float(0x7f800000));
}

// gpukit_group is where a thread sits in a row-wise kernel's groups: G
// threads per group, its index t in the group, its group's index gi in the
// block and gpb groups per block.
struct gpukit_group {
  int G, t, gi, gpb;
};

__device__ __forceinline__ gpukit_group gpukit_group_of(int block) {
  gpukit_group g;
  if (block) {
    g.G = blockDim.x;
    g.t = threadIdx.x;
    g.gi = 0;
    g.gpb = 1;
  } else {
    g.G = 32;
    g.t = threadIdx.x & 31;
    g.gi = threadIdx.x >> 5;
    g.gpb = blockDim.x >> 5;
  }
  return g;
}
