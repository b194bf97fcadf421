// gelu.cu: GELU (Hendrycks & Gimpel 2016) element-wise, forward and
// backward, in both forms (libgpu/ops/gelu.go; form 0 tanh, 1 erf):
//
//   tanh: y = ½x(1 + tanh(√(2/π)(x + 0.044715x³)))   (PyTorch approximate="tanh")
//   erf:  y = ½x(1 + erf(x/√2)) = x·Φ(x)             (PyTorch's nn.GELU() default)
//
// Contiguous tensors of n elements; V = 8 instances need 16-byte aligned
// pointers (any n: the last n mod 8 elements are done one by one).
#include "common.cuh"
#include "vec.cuh"

// Both forms are computed without cancellation for negative x, where
// 1 + tanh(u) and 1 + erf(z) lose every digit in f32: the tanh form as
// x·σ(2u) = x/(1 + e^(−2u)) (½(1 + tanh u) = σ(2u)), the erf form through
// Φ(x) = ½·erfc(−x/√2).
__device__ __forceinline__ float gelu_f(float x, int form) {
  if (form == 1) return 0.5f * x * erfcf(-x * 0.7071067811865476f);
  const float c = 0.7978845608028654f, a = 0.044715f;
  return x / (1.0f + expf(-2.0f * c * (x + a * x * x * x)));
}

// d/dx: erf: Φ(x) + x·φ(x); tanh: ½(1+t) + ½x(1−t²)·c(1 + 3a x²) with
// t = tanh(u), u = c(x + a x³), i.e. s + 2x·s(1−s)·c(1 + 3a x²) with
// s = σ(2u) = 1/(1+e), e = e^(−2u), and s(1−s) = 1/(2 + e + 1/e) (which
// stays finite, going to 0, where e over- or underflows).
__device__ __forceinline__ float gelu_grad(float x, int form) {
  if (form == 1) {
    const float cdf = 0.5f * erfcf(-x * 0.7071067811865476f);
    const float pdf = 0.3989422804014327f * expf(-0.5f * x * x);
    return cdf + x * pdf;
  }
  const float c = 0.7978845608028654f, a = 0.044715f;
  const float e = expf(-2.0f * c * (x + a * x * x * x));
  const float s = 1.0f / (1.0f + e), sd = 1.0f / (2.0f + e + 1.0f / e);
  return s + 2.0f * x * sd * c * (1.0f + 3.0f * a * x * x);
}

template <typename T, int V>
__device__ void gelu_fwd(T* y, const T* x, long long n, int form) {
  const long long nv = n / V;
  GPUKIT_GRID_STRIDE(j, nv) {
    float u[V];
    gpukit_ldv<V>(x + j * V, u);
#pragma unroll
    for (int i = 0; i < V; i++) u[i] = gelu_f(u[i], form);
    gpukit_stv<V>(y + j * V, u);
  }
  GPUKIT_GRID_STRIDE(i, n - nv * V) {
    const long long k = nv * V + (long long)i;
    gpukit_st(y + k, gelu_f(gpukit_ld(x + k), form));
  }
}

template <typename T, int V>
__device__ void gelu_bwd(T* dx, const T* dy, const T* x, long long n, int form, int acc) {
  const long long nv = n / V;
  GPUKIT_GRID_STRIDE(j, nv) {
    float u[V], d[V], o[V];
    gpukit_ldv<V>(x + j * V, u);
    gpukit_ldv<V>(dy + j * V, d);
    if (acc) gpukit_ldv<V>(dx + j * V, o);
#pragma unroll
    for (int i = 0; i < V; i++) {
      const float g = d[i] * gelu_grad(u[i], form);
      o[i] = acc ? o[i] + g : g;
    }
    gpukit_stv<V>(dx + j * V, o);
  }
  GPUKIT_GRID_STRIDE(i, n - nv * V) {
    const long long k = nv * V + (long long)i;
    float g = gpukit_ld(dy + k) * gelu_grad(gpukit_ld(x + k), form);
    if (acc) g += gpukit_ld(dx + k);
    gpukit_st(dx + k, g);
  }
}

// Instances: gelu_fwd_<s|v>_<dt>, gelu_bwd_<s|v>_<dt> (s: V = 1, v: V = 8).
#define GELU_INSTANCE(SUF, T, V)                                                                    \
  extern "C" __global__ void gelu_fwd_##SUF(T* y, const T* x, long long n, int form) {             \
    gelu_fwd<T, V>(y, x, n, form);                                                                 \
  }                                                                                                 \
  extern "C" __global__ void gelu_bwd_##SUF(T* dx, const T* dy, const T* x, long long n, int form, \
                                            int acc) {                                              \
    gelu_bwd<T, V>(dx, dy, x, n, form, acc);                                                       \
  }

GELU_INSTANCE(s_f32, float, 1)
GELU_INSTANCE(v_f32, float, 8)
GELU_INSTANCE(s_bf16, gpukit_bf16, 1)
GELU_INSTANCE(v_bf16, gpukit_bf16, 8)
