// add.cu: element-wise sum and scaled copy/accumulate (libgpu/ops/add.go):
//
//   add:   y = a + b                    (y may be a or b)
//   scale: y = s·x, or y += s·x (acc)   (y and x of either float dtype)
//
// Contiguous tensors of n elements; V = 8 instances need 16-byte aligned
// pointers (any n: the last n mod 8 elements are done one by one).
#include "common.cuh"
#include "vec.cuh"

template <typename T, int V>
__device__ void add(T* y, const T* a, const T* b, long long n) {
  const long long nv = n / V;
  GPUKIT_GRID_STRIDE(j, nv) {
    float u[V], w[V];
    gpukit_ldv<V>(a + j * V, u);
    gpukit_ldv<V>(b + j * V, w);
#pragma unroll
    for (int i = 0; i < V; i++) u[i] += w[i];
    gpukit_stv<V>(y + j * V, u);
  }
  GPUKIT_GRID_STRIDE(i, n - nv * V) {
    const long long k = nv * V + (long long)i;
    gpukit_st(y + k, gpukit_ld(a + k) + gpukit_ld(b + k));
  }
}

template <typename TO, typename TI, int V>
__device__ void scale(TO* y, const TI* x, float s, long long n, int acc) {
  const long long nv = n / V;
  GPUKIT_GRID_STRIDE(j, nv) {
    float u[V], o[V];
    gpukit_ldv<V>(x + j * V, u);
    if (acc) gpukit_ldv<V>(y + j * V, o);
#pragma unroll
    for (int i = 0; i < V; i++) o[i] = acc ? o[i] + s * u[i] : s * u[i];
    gpukit_stv<V>(y + j * V, o);
  }
  GPUKIT_GRID_STRIDE(i, n - nv * V) {
    const long long k = nv * V + (long long)i;
    float v = s * gpukit_ld(x + k);
    if (acc) v += gpukit_ld(y + k);
    gpukit_st(y + k, v);
  }
}

// Instances: add_<s|v>_<dt>; scale_<s|v>_<to>_<from> (s: V = 1, v: V = 8).
#define ADD_INSTANCE(SUF, T, V)                                                          \
  extern "C" __global__ void add_##SUF(T* y, const T* a, const T* b, long long n) {      \
    add<T, V>(y, a, b, n);                                                               \
  }
#define SCALE_INSTANCE(SUF, TO, TI, V)                                                                \
  extern "C" __global__ void scale_##SUF(TO* y, const TI* x, float s, long long n, int acc) {       \
    scale<TO, TI, V>(y, x, s, n, acc);                                                               \
  }

ADD_INSTANCE(s_f32, float, 1)
ADD_INSTANCE(v_f32, float, 8)
ADD_INSTANCE(s_bf16, gpukit_bf16, 1)
ADD_INSTANCE(v_bf16, gpukit_bf16, 8)
SCALE_INSTANCE(s_f32_f32, float, float, 1)
SCALE_INSTANCE(v_f32_f32, float, float, 8)
SCALE_INSTANCE(s_f32_bf16, float, gpukit_bf16, 1)
SCALE_INSTANCE(v_f32_bf16, float, gpukit_bf16, 8)
SCALE_INSTANCE(s_bf16_f32, gpukit_bf16, float, 1)
SCALE_INSTANCE(v_bf16_f32, gpukit_bf16, float, 8)
SCALE_INSTANCE(s_bf16_bf16, gpukit_bf16, gpukit_bf16, 1)
SCALE_INSTANCE(v_bf16_bf16, gpukit_bf16, gpukit_bf16, 8)
