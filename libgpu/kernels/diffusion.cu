// diffusion.cu: a diffusion model's noise, forward process and fused
// sampling step (libgpu/ops/diffusion.go):
//
//   diff_noise:   out[i] = z_i                               (standard normal)
//   diff_qsample: eps[i] = z_i;  xt[i] = sab[t_n]·x0[i] + s1mab[t_n]·z_i
//   diff_start:   x = A·prev + S·z; every pass of the model input = x; t = T'
//   diff_step:    ε = ε_u + g·(ε_c − ε_u), ε_u the unconditional pass or, with
//                 one pass and R ≠ 0, the residual noise (x − A·prev)/S of
//                 the previous frame (R-CFG); x̂0 = clip((x − S·ε)/A)
//                 blended with the previous frame; ε' = (x − A·x̂0)/S;
//                 x' = cX·x + cX0·x̂0 + cE·ε' + cD·d + σ·z;  d = x̂0
//   diff_ema:     ema = decay·ema + (1 − decay)·p
//
// z_i is element i mod 4 of gpukit_normal4 (philox.cuh) for group i/4 of
// the stream (seed, stream, step), step read from the i32 counter (null:
// 0) when the kernel runs: one thread per group of four elements, so each
// Philox call serves four draws. The step's coefficients (A, S, cX, ...,
// g, T') are one row of a table in device memory (ops.Coef*), so a
// captured sampling loop can be re-targeted by rewriting the table.
#include "common.cuh"
#include "philox.cuh"
#include "vec.cuh"

struct diff_args {
  float* x;
  float* d;
  const void* eps;
  void* xin;
  int* tin;
  const float* prev;
  const float* coef;
  const int* counter;
  unsigned long long seed;
  long long n;  // elements of x (N·per)
  int per;      // elements per sample
  int passes;   // model passes (1, or 2 with guidance)
  int samples;  // N
  unsigned int stream;
};
static_assert(sizeof(diff_args) == 96, "diff_args layout: launch.DiffArgs is generated from it (go generate ./libgpu/kernels/launch)");

// Coefficient row fields (ops.Coef*).
#define DIFF_A 0
#define DIFF_S 1
#define DIFF_X 2
#define DIFF_X0 3
#define DIFF_EPS 4
#define DIFF_D 5
#define DIFF_SIGMA 6
#define DIFF_G 7
#define DIFF_TNEXT 8
#define DIFF_BLEND 9
#define DIFF_CLIP 10
#define DIFF_RESID 11

__device__ __forceinline__ unsigned int diff_step_of(const int* counter) {
  return counter ? (unsigned int)*counter : 0u;
}

template <typename T>
__device__ void diff_noise(T* out, long long n, unsigned long long seed, unsigned int stream, const int* counter) {
  const unsigned int step = diff_step_of(counter);
  GPUKIT_GRID_STRIDE(q, (n + 3) / 4) {
    float z[4];
    gpukit_normal4(q, seed, stream, step, z);
    const long long i0 = (long long)q * 4;
    for (int k = 0; k < 4 && i0 + k < n; k++) gpukit_st(out + i0 + k, z[k]);
  }
}

template <typename TO, typename TI>
__device__ void diff_qsample(TO* xt, TO* eps, const TI* x0, const int* t, const float* sab, const float* s1mab,
                             long long n, long long per, int T, unsigned long long seed, unsigned int stream,
                             const int* counter) {
  const unsigned int step = diff_step_of(counter);
  GPUKIT_GRID_STRIDE(q, (n + 3) / 4) {
    float z[4];
    gpukit_normal4(q, seed, stream, step, z);
    const long long i0 = (long long)q * 4;
    for (int k = 0; k < 4 && i0 + k < n; k++) {
      const long long i = i0 + k;
      int tt = t[i / per];
      tt = tt < 0 ? 0 : (tt >= T ? T - 1 : tt);
      gpukit_st(eps + i, z[k]);
      gpukit_st(xt + i, sab[tt] * gpukit_ld(x0 + i) + s1mab[tt] * z[k]);
    }
  }
}

template <typename TI>
__device__ void diff_start(const diff_args a) {
  const unsigned int step = diff_step_of(a.counter);
  const float* c = a.coef;
  TI* xin = (TI*)a.xin;
  GPUKIT_GRID_STRIDE(q, (a.n + 3) / 4) {
    float z[4];
    gpukit_normal4(q, a.seed, a.stream, step, z);
    const long long i0 = (long long)q * 4;
    for (int k = 0; k < 4 && i0 + k < a.n; k++) {
      const long long i = i0 + k;
      float v = c[DIFF_S] * z[k];
      if (a.prev) v += c[DIFF_A] * a.prev[i];
      a.x[i] = v;
      if (xin)
        for (int p = 0; p < a.passes; p++) gpukit_st(xin + p * a.n + i, v);
    }
  }
  if (a.tin) {
    GPUKIT_GRID_STRIDE(j, (long long)a.passes * a.samples) a.tin[j] = (int)c[DIFF_TNEXT];
  }
}

template <typename TE, typename TI>
__device__ void diff_step(const diff_args a) {
  const unsigned int step = diff_step_of(a.counter);
  const float* c = a.coef;
  const float A = c[DIFF_A], S = c[DIFF_S], cX = c[DIFF_X], cX0 = c[DIFF_X0], cE = c[DIFF_EPS], cD = c[DIFF_D];
  const float sigma = c[DIFF_SIGMA], g = c[DIFF_G], blend = c[DIFF_BLEND];
  const bool clip = c[DIFF_CLIP] != 0.0f;
  const bool resid = a.passes == 1 && a.prev && c[DIFF_RESID] != 0.0f;
  const TE* eps = (const TE*)a.eps;
  TI* xin = (TI*)a.xin;
  GPUKIT_GRID_STRIDE(q, (a.n + 3) / 4) {
    float z[4];
    if (sigma != 0.0f) {
      gpukit_normal4(q, a.seed, a.stream, step, z);
    } else {
      z[0] = z[1] = z[2] = z[3] = 0.0f;
    }
    const long long i0 = (long long)q * 4;
    for (int k = 0; k < 4 && i0 + k < a.n; k++) {
      const long long i = i0 + k;
      const float x = a.x[i];
      float e = gpukit_ld(eps + i);
      if (a.passes == 2) {
        const float u = gpukit_ld(eps + a.n + i);
        e = u + g * (e - u);
      } else if (resid) {
        const float u = (x - A * a.prev[i]) / S;  // the residual noise of R-CFG's self-negative form
        e = u + g * (e - u);
      }
      float x0 = (x - S * e) / A;
      if (clip) x0 = fminf(fmaxf(x0, -1.0f), 1.0f);
      if (a.prev && blend != 0.0f) x0 = (1.0f - blend) * x0 + blend * a.prev[i];
      float out = cX * x + cX0 * x0 + sigma * z[k];
      if (cE != 0.0f) out += cE * ((x - A * x0) / S);
      if (a.d) {
        if (cD != 0.0f) out += cD * a.d[i];
        a.d[i] = x0;
      }
      a.x[i] = out;
      if (xin)
        for (int p = 0; p < a.passes; p++) gpukit_st(xin + p * a.n + i, out);
    }
  }
  if (a.tin) {
    GPUKIT_GRID_STRIDE(j, (long long)a.passes * a.samples) a.tin[j] = (int)c[DIFF_TNEXT];
  }
}

template <int V>
__device__ void diff_ema(float* ema, const float* p, long long n, float decay) {
  const long long nv = n / V;
  GPUKIT_GRID_STRIDE(j, nv) {
    float e[V], u[V];
    gpukit_ldv<V>(ema + j * V, e);
    gpukit_ldv<V>(p + j * V, u);
#pragma unroll
    for (int k = 0; k < V; k++) e[k] = decay * e[k] + (1.0f - decay) * u[k];
    gpukit_stv<V>(ema + j * V, e);
  }
  GPUKIT_GRID_STRIDE(i, n - nv * V) {
    const long long k = nv * V + (long long)i;
    ema[k] = decay * ema[k] + (1.0f - decay) * p[k];
  }
}

#define DIFF_NOISE(DT, T)                                                                                  \
  extern "C" __global__ void diff_noise_##DT(T* out, long long n, unsigned long long seed, unsigned int stream, \
                                             const int* counter) {                                         \
    diff_noise<T>(out, n, seed, stream, counter);                                                          \
  }
DIFF_NOISE(f32, float)
DIFF_NOISE(bf16, gpukit_bf16)

#define DIFF_QSAMPLE(DO, TO, DI, TI)                                                                       \
  extern "C" __global__ void diff_qsample_##DO##_##DI(TO* xt, TO* eps, const TI* x0, const int* t,          \
                                                      const float* sab, const float* s1mab, long long n,   \
                                                      long long per, int T, unsigned long long seed,       \
                                                      unsigned int stream, const int* counter) {           \
    diff_qsample<TO, TI>(xt, eps, x0, t, sab, s1mab, n, per, T, seed, stream, counter);                    \
  }
DIFF_QSAMPLE(f32, float, f32, float)
DIFF_QSAMPLE(f32, float, bf16, gpukit_bf16)
DIFF_QSAMPLE(bf16, gpukit_bf16, f32, float)
DIFF_QSAMPLE(bf16, gpukit_bf16, bf16, gpukit_bf16)

extern "C" __global__ void diff_start_f32(const diff_args a) { diff_start<float>(a); }
extern "C" __global__ void diff_start_bf16(const diff_args a) { diff_start<gpukit_bf16>(a); }

#define DIFF_STEP(DE, TE, DI, TI) \
  extern "C" __global__ void diff_step_##DE##_##DI(const diff_args a) { diff_step<TE, TI>(a); }
DIFF_STEP(f32, float, f32, float)
DIFF_STEP(f32, float, bf16, gpukit_bf16)
DIFF_STEP(bf16, gpukit_bf16, f32, float)
DIFF_STEP(bf16, gpukit_bf16, bf16, gpukit_bf16)

extern "C" __global__ void diff_ema_s(float* ema, const float* p, long long n, float decay) {
  diff_ema<1>(ema, p, n, decay);
}
extern "C" __global__ void diff_ema_v(float* ema, const float* p, long long n, float decay) {
  diff_ema<8>(ema, p, n, decay);
}
