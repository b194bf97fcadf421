// silu.cu: SiLU y = x·σ(x) element-wise and its backward
// dx = dy·σ(x)(1 + x(1 − σ(x))) (libgpu/ops/silu.go; Elfwing et al. 2018).
// x/(1 + e^(−x)) stays exact in sign and goes to −0 for large negative x.
// Contiguous tensors of n elements; V = 8 instances need 16-byte aligned
// pointers (the last n mod 8 elements are done one by one).
#include "common.cuh"
#include "vec.cuh"

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }
__device__ __forceinline__ float silu_grad(float x) {
  const float s = 1.0f / (1.0f + expf(-x));
  return s * (1.0f + x * (1.0f - s));
}

template <typename T, int V>
__device__ void silu_fwd(T* y, const T* x, long long n) {
  const long long nv = n / V;
  GPUKIT_GRID_STRIDE(j, nv) {
    float u[V];
    gpukit_ldv<V>(x + j * V, u);
#pragma unroll
    for (int i = 0; i < V; i++) u[i] = silu_f(u[i]);
    gpukit_stv<V>(y + j * V, u);
  }
  GPUKIT_GRID_STRIDE(i, n - nv * V) {
    const long long k = nv * V + (long long)i;
    gpukit_st(y + k, silu_f(gpukit_ld(x + k)));
  }
}

template <typename T, int V>
__device__ void silu_bwd(T* dx, const T* dy, const T* x, long long n, int acc) {
  const long long nv = n / V;
  GPUKIT_GRID_STRIDE(j, nv) {
    float u[V], d[V], o[V];
    gpukit_ldv<V>(x + j * V, u);
    gpukit_ldv<V>(dy + j * V, d);
    if (acc) gpukit_ldv<V>(dx + j * V, o);
#pragma unroll
    for (int i = 0; i < V; i++) {
      const float g = d[i] * silu_grad(u[i]);
      o[i] = acc ? o[i] + g : g;
    }
    gpukit_stv<V>(dx + j * V, o);
  }
  GPUKIT_GRID_STRIDE(i, n - nv * V) {
    const long long k = nv * V + (long long)i;
    float g = gpukit_ld(dy + k) * silu_grad(gpukit_ld(x + k));
    if (acc) g += gpukit_ld(dx + k);
    gpukit_st(dx + k, g);
  }
}

#define SILU_INSTANCE(SUF, T, V)                                                                  \
  extern "C" __global__ void silu_fwd_##SUF(T* y, const T* x, long long n) { silu_fwd<T, V>(y, x, n); } \
  extern "C" __global__ void silu_bwd_##SUF(T* dx, const T* dy, const T* x, long long n, int acc) { \
    silu_bwd<T, V>(dx, dy, x, n, acc);                                                           \
  }

SILU_INSTANCE(s_f32, float, 1)
SILU_INSTANCE(v_f32, float, 8)
SILU_INSTANCE(s_bf16, gpukit_bf16, 1)
SILU_INSTANCE(v_bf16, gpukit_bf16, 8)
