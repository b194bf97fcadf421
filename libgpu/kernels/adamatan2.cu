// adamatan2.cu: multi-tensor Adam-atan2 and sign-SGD (libgpu/ops/adamatan2.go).
//
// Adam-atan2 (Everett et al. 2024, "Scaling Exponents Across
// Parameterizations and Optimizers", §4.4: Adam with the division
// m/(√v + eps) replaced by atan2(m, √v), scale invariant and with no
// eps), as the adam-atan2 package that sapientinc/HRM trains with
// computes it (imoneoi/adam-atan2, csrc/adam_atan2.cu), per element, with
// t the new step and bc1 = 1 − β1ᵗ, bc2 = 1 − β2ᵗ in double:
//
//   p ← p·(1 − lr·wd)                            (decoupled weight decay)
//   m ← m + (1 − β1)(g − m);  v ← v + (1 − β2)(g² − v)   (lerps as fma)
//   p ← p − (a·lr/bc1)·atan2(m, b·√v/√bc2)       (inside = 0: the package)
//   p ← p − a·lr·atan2(m/bc1, b·√v/√bc2)         (inside = 1: the paper's m̂)
//
// with a = b = 1 in the package. sign-SGD with decoupled weight decay
// (HRM's CastedSparseEmbeddingSignSGD_Distributed, dense):
//
//   p ← p·(1 − lr·wd) − lr·sign(g)               (sign(0) = 0)
//
// Lists travel by value as ops_optim.cu's (OPS_MT_MAX tensors per launch,
// OPS_MT_CHUNK elements per block). aa2_step (one thread) advances the
// step counter before aa2_multi; every block of aa2_multi reads the new t
// and forms the corrections itself, so no state is shared between ops.
#include "common.cuh"

#define AA2_MT_MAX 32
#define AA2_MT_CHUNK 2048

struct aa2_tensor {
  float* p;
  const float* g;
  float* m;
  float* v;
  long long n;
  float wd;
  int pad;
};

struct aa2_args {
  aa2_tensor t[AA2_MT_MAX];
  int start[AA2_MT_MAX + 1];
  int count;
  float lr, b1, b2, a, b;
  int inside;
  const int* step;        // the step counter, already advanced (Adam-atan2 only)
  const float* lr_scale;  // null, or a device scalar multiplying lr
  const float* g_scale;   // null, or a device scalar multiplying every gradient
};
static_assert(sizeof(aa2_args) == 1720, "aa2_args layout: launch.Aa2Args is generated from it (go generate ./libgpu/kernels/launch)");

// aa2_powi is b^t, t ≥ 0, by squaring in double.
__device__ __forceinline__ double aa2_powi(double b, int t) {
  double r = 1.0;
  while (t > 0) {
    if (t & 1) r *= b;
    b *= b;
    t >>= 1;
  }
  return r;
}

extern "C" __global__ void aa2_step(int* step) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *step += 1;
}

extern "C" __global__ void __launch_bounds__(256) aa2_multi(const __grid_constant__ aa2_args a) {
  __shared__ float k[3];  // step size, 1 − lr·wd is per tensor, √bc2
  const int ti = gpukit_mt_find(a.start, a.count, blockIdx.x);
  const aa2_tensor& T = a.t[ti];
  const float lr = a.lr_scale ? a.lr * *a.lr_scale : a.lr;
  if (threadIdx.x == 0) {
    const int t = *a.step;
    const double bc1 = 1.0 - aa2_powi((double)a.b1, t), bc2 = 1.0 - aa2_powi((double)a.b2, t);
    k[0] = a.inside ? (float)((double)a.a * (double)lr) : (float)((double)a.a * (double)lr / bc1);
    k[1] = (float)(1.0 / bc1);
    k[2] = (float)sqrt(bc2);
  }
  __syncthreads();
  const float step = k[0], ibc1 = k[1], sbc2 = k[2];
  const float decay = (float)(1.0 - (double)lr * (double)T.wd);
  const float mb1 = 1.0f - a.b1, mb2 = 1.0f - a.b2;
  const float gsc = a.g_scale ? *a.g_scale : 1.0f;
  long long lo = (long long)(blockIdx.x - a.start[ti]) * AA2_MT_CHUNK;
  long long hi = lo + AA2_MT_CHUNK;
  if (hi > T.n) hi = T.n;
  for (long long j = lo + threadIdx.x; j < hi; j += blockDim.x) {
    const float g = a.g_scale ? T.g[j] * gsc : T.g[j];
    float m = T.m[j], v = T.v[j];
    m = fmaf(mb1, g, fmaf(-mb1, m, m));
    v = fmaf(mb2, g * g, fmaf(-mb2, v, v));
    T.m[j] = m;
    T.v[j] = v;
    const float den = a.b * (sqrtf(v) / sbc2);
    const float num = a.inside ? m * ibc1 : m;
    T.p[j] = T.p[j] * decay - step * atan2f(num, den);
  }
}

extern "C" __global__ void __launch_bounds__(256) signsgd_multi(const __grid_constant__ aa2_args a) {
  const int ti = gpukit_mt_find(a.start, a.count, blockIdx.x);
  const aa2_tensor& T = a.t[ti];
  const float lr = a.lr_scale ? a.lr * *a.lr_scale : a.lr;
  const float decay = (float)(1.0 - (double)lr * (double)T.wd);
  long long lo = (long long)(blockIdx.x - a.start[ti]) * AA2_MT_CHUNK;
  long long hi = lo + AA2_MT_CHUNK;
  if (hi > T.n) hi = T.n;
  for (long long j = lo + threadIdx.x; j < hi; j += blockDim.x) {
    const float g = T.g[j];
    const float sg = g > 0.0f ? 1.0f : (g < 0.0f ? -1.0f : 0.0f);
    T.p[j] = T.p[j] * decay - lr * sg;
  }
}
