// gelu.cu: GELU (Hendrycks & Gimpel 2016) element-wise, forward and
// backward, in both forms (libgpu/ops/gelu.go; form 0 tanh, 1 erf):
//
//   tanh: y = ½x(1 + tanh(√(2/π)(x + 0.044715x³)))   (PyTorch approximate="tanh")
//   erf:  y = ½x(1 + erf(x/√2)) = x·Φ(x)             (PyTorch's nn.GELU() default)
//
// Contiguous tensors of n elements; V = 8 instances need 16-byte aligned
// pointers (any n: the last n mod 8 elements are done one by one).
//
// Speed. These kernels must run at memory bandwidth (bf16 forward: 4 bytes
// per element, about 40 issue slots per element on an H100 at 3 TB/s;
// backward 6 bytes, about 60). CUDA's erfcf costs some 40 instructions
// with two reciprocals and an exponential, and the old kernels ran at
// 1.75 TB/s (forward) and 2 TB/s (backward), compute-bound. The erf form
// is now computed from one polynomial and one ex2 (below): about 20
// instructions per element forward, 27 backward. Each thread moves two
// 16-byte vectors per tensor per iteration, both loads issued before the
// first is used.
#include "common.cuh"
#include "vec.cuh"

// gelu_ex2 is 2^p by the special-function unit (ex2.approx.ftz.f32:
// relative error about 2⁻²², results below 2⁻¹²⁶ flushed to zero).
__device__ __forceinline__ float gelu_ex2(float p) {
#ifdef GPUKIT_EMU
  return exp2f(p);
#else
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(p));
  return r;
#endif
}

// The erf form. With t = |x| and Q(t) = ½·erfc(t/√2) = 1 − Φ(t), the
// upper tail of the normal distribution:
//
//   Φ(x) = Q(t) for x < 0, 1 − Q(t) for x ≥ 0,
//
// which never cancels (Q ≤ ½). log₂ Q(t) is smooth on [0, 5.5] (its
// nearest singularities are the complex zeros of erfc, |t| ≈ 3.4 from 0),
// so Q(t) = 2^P(t) with P a degree-11 polynomial in t: the Chebyshev
// interpolant of log₂ Q on [0, 5.5], coefficients rounded to f32, evaluated
// by Horner in f32 (fitted in long double by scripts/gelu-fit.cpp; relative error of Q, simulated
// with f32 arithmetic: 1.5e-7 for t ≤ 1, 4e-7 for t ≤ 2, 1.1e-6 for t ≤ 4,
// 2.5e-6 for t ≤ 5.5 — most of it is the rounding of P, |P| up to 26,
// before the exponential). P(0) = −1 exactly (Φ(0) = ½). Element-wise
// bounds on GELU and GELU', checked by scripts/cudaemu/gelu_test.cpp and
// on the GPU by TestCUDAGELUErfAccuracy: 4e-7 (|x| < 1), 8e-7 (< 2),
// 2e-6 (< 4), 4e-6 (< 5.5), 6e-6 beyond.
//
// Beyond t = 5.5: for x > 5.5, Q < 2⁻²⁵ and 1 − Q rounds to 1, so t is
// clamped there; for x < −5.5 (rare in activations) a branch computes
// ½·erfcf(t/√2) with CUDA's erfcf, so deep negative tails keep their
// relative accuracy.
#define GELU_T 5.5f
__device__ __forceinline__ float gelu_q(float t) {
  float p = 2.752179817e-09f;
  p = fmaf(p, t, -1.005368659e-07f);
  p = fmaf(p, t, 1.636105367e-06f);
  p = fmaf(p, t, -1.549592344e-05f);
  p = fmaf(p, t, 9.170475096e-05f);
  p = fmaf(p, t, -3.090997343e-04f);
  p = fmaf(p, t, 2.932709322e-05f);
  p = fmaf(p, t, 6.938245613e-03f);
  p = fmaf(p, t, -5.244878680e-02f);
  p = fmaf(p, t, -4.592150748e-01f);
  p = fmaf(p, t, -1.151105165e+00f);
  p = fmaf(p, t, -1.0f);
  return gelu_ex2(p);
}

// gelu_phi_v sets phi[i] = Φ(x[i]) for a vector of V elements: 2^P for
// all, then, behind one branch per vector (taken only when some element
// is below −GELU_T, rare in activations), CUDA's erfcf for those. NaN
// stays NaN (through x·Φ and x·φ; fminf skips it here).
template <int V>
__device__ __forceinline__ void gelu_phi_v(const float* x, float* phi) {
  float lo = x[0];
#pragma unroll
  for (int i = 0; i < V; i++) {
    const float q = gelu_q(fminf(fabsf(x[i]), GELU_T));
    phi[i] = x[i] < 0.0f ? q : 1.0f - q;
    lo = fminf(lo, x[i]);
  }
  if (lo < -GELU_T) {
#pragma unroll
    for (int i = 0; i < V; i++) {
      if (x[i] < -GELU_T) phi[i] = 0.5f * erfcf(-x[i] * 0.7071067811865476f);
    }
  }
}

// The tanh form: x·σ(2u) = x/(1 + e^(−2u)), which does not cancel for
// negative x where 1 + tanh(u) does.
__device__ __forceinline__ float gelu_tanh_f(float x) {
  const float c = 0.7978845608028654f, a = 0.044715f;
  return x / (1.0f + expf(-2.0f * c * (x + a * x * x * x)));
}

// d/dx: ½(1+t) + ½x(1−t²)·c(1 + 3a x²) with t = tanh(u), u = c(x + a x³),
// i.e. s + 2x·s(1−s)·c(1 + 3a x²) with s = σ(2u) = 1/(1+e), e = e^(−2u),
// and s(1−s) = 1/(2 + e + 1/e) (which stays finite, going to 0, where e
// over- or underflows).
__device__ __forceinline__ float gelu_tanh_grad(float x) {
  const float c = 0.7978845608028654f, a = 0.044715f;
  const float e = expf(-2.0f * c * (x + a * x * x * x));
  const float s = 1.0f / (1.0f + e), sd = 1.0f / (2.0f + e + 1.0f / e);
  return s + 2.0f * x * sd * c * (1.0f + 3.0f * a * x * x);
}

// gelu_fv: u[i] = GELU(u[i]) over a vector; FORM 0 tanh, 1 erf.
template <int V, int FORM>
__device__ __forceinline__ void gelu_fv(float* u) {
  if constexpr (FORM == 1) {
    float phi[V];
    gelu_phi_v<V>(u, phi);
#pragma unroll
    for (int i = 0; i < V; i++) u[i] *= phi[i];
  } else {
#pragma unroll
    for (int i = 0; i < V; i++) u[i] = gelu_tanh_f(u[i]);
  }
}

// gelu_gv: g[i] = GELU'(u[i]) over a vector. The erf form's is
// Φ(x) + x·φ(x), φ(x) = e^(−x²/2)/√(2π) = 2^(−x²·log₂e/2 − log₂√(2π)).
template <int V, int FORM>
__device__ __forceinline__ void gelu_gv(const float* u, float* g) {
  if constexpr (FORM == 1) {
    gelu_phi_v<V>(u, g);
#pragma unroll
    for (int i = 0; i < V; i++) {
      const float pdf = gelu_ex2(fmaf(u[i] * u[i], -0.7213475204444817f, -1.3257480647361592f));
      g[i] = fmaf(u[i], pdf, g[i]);
    }
  } else {
#pragma unroll
    for (int i = 0; i < V; i++) g[i] = gelu_tanh_grad(u[i]);
  }
}

// Vectorised body: thread i of G = gridDim·blockDim threads takes vectors
// j and j + G of each pair of rounds (so two 16-byte loads per tensor are
// in flight before the first use), then the vector left over, then the
// n mod V tail elements one by one.
template <typename T, int V, int FORM>
__device__ __forceinline__ void gelu_fwd_body(T* y, const T* x, long long n) {
  const long long nv = n / V;
  const long long G = (long long)gridDim.x * blockDim.x;
  long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; j + G < nv; j += 2 * G) {
    float u[V], w[V];
    gpukit_ldv<V>(x + j * V, u);
    gpukit_ldv<V>(x + (j + G) * V, w);
    gelu_fv<V, FORM>(u);
    gpukit_stv<V>(y + j * V, u);
    gelu_fv<V, FORM>(w);
    gpukit_stv<V>(y + (j + G) * V, w);
  }
  if (j < nv) {
    float u[V];
    gpukit_ldv<V>(x + j * V, u);
    gelu_fv<V, FORM>(u);
    gpukit_stv<V>(y + j * V, u);
  }
  GPUKIT_GRID_STRIDE(i, n - nv * V) {
    const long long k = nv * V + (long long)i;
    float u = gpukit_ld(x + k);
    gelu_fv<1, FORM>(&u);
    gpukit_st(y + k, u);
  }
}

template <typename T, int V, int FORM>
__device__ __forceinline__ void gelu_bwd_vec(T* dx, const T* dy, const T* x, long long j, int acc) {
  float u[V], d[V], o[V], g[V];
  gpukit_ldv<V>(x + j * V, u);
  gpukit_ldv<V>(dy + j * V, d);
  if (acc) gpukit_ldv<V>(dx + j * V, o);
  gelu_gv<V, FORM>(u, g);
#pragma unroll
  for (int i = 0; i < V; i++) o[i] = acc ? fmaf(d[i], g[i], o[i]) : d[i] * g[i];
  gpukit_stv<V>(dx + j * V, o);
}

template <typename T, int V, int FORM>
__device__ __forceinline__ void gelu_bwd_body(T* dx, const T* dy, const T* x, long long n, int acc) {
  const long long nv = n / V;
  const long long G = (long long)gridDim.x * blockDim.x;
  long long j = (long long)blockIdx.x * blockDim.x + threadIdx.x;
  for (; j + G < nv; j += 2 * G) {
    float u[V], d[V], o[V], u2[V], d2[V], o2[V];
    gpukit_ldv<V>(x + j * V, u);
    gpukit_ldv<V>(dy + j * V, d);
    gpukit_ldv<V>(x + (j + G) * V, u2);
    gpukit_ldv<V>(dy + (j + G) * V, d2);
    if (acc) {
      gpukit_ldv<V>(dx + j * V, o);
      gpukit_ldv<V>(dx + (j + G) * V, o2);
    }
    float g[V];
    gelu_gv<V, FORM>(u, g);
#pragma unroll
    for (int i = 0; i < V; i++) o[i] = acc ? fmaf(d[i], g[i], o[i]) : d[i] * g[i];
    gpukit_stv<V>(dx + j * V, o);
    gelu_gv<V, FORM>(u2, g);
#pragma unroll
    for (int i = 0; i < V; i++) o2[i] = acc ? fmaf(d2[i], g[i], o2[i]) : d2[i] * g[i];
    gpukit_stv<V>(dx + (j + G) * V, o2);
  }
  if (j < nv) gelu_bwd_vec<T, V, FORM>(dx, dy, x, j, acc);
  GPUKIT_GRID_STRIDE(i, n - nv * V) {
    const long long k = nv * V + (long long)i;
    const float u = gpukit_ld(x + k);
    float g;
    gelu_gv<1, FORM>(&u, &g);
    g *= gpukit_ld(dy + k);
    if (acc) g += gpukit_ld(dx + k);
    gpukit_st(dx + k, g);
  }
}

// The form is uniform over the launch: one branch picks the instance.
template <typename T, int V>
__device__ __forceinline__ void gelu_fwd(T* y, const T* x, long long n, int form) {
  if (form == 1) {
    gelu_fwd_body<T, V, 1>(y, x, n);
  } else {
    gelu_fwd_body<T, V, 0>(y, x, n);
  }
}

template <typename T, int V>
__device__ __forceinline__ void gelu_bwd(T* dx, const T* dy, const T* x, long long n, int form, int acc) {
  if (form == 1) {
    gelu_bwd_body<T, V, 1>(dx, dy, x, n, acc);
  } else {
    gelu_bwd_body<T, V, 0>(dx, dy, x, n, acc);
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
