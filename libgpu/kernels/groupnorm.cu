// groupnorm.cu: group normalisation of channels-last feature maps, with an
// optional fused SiLU, forward and backward (libgpu/ops/groupnorm.go; Wu &
// He 2018, biased variance as PyTorch's nn.GroupNorm; SiLU x·σ(x),
// Elfwing et al. 2018):
//
//   μ, σ² over the S·C/G values of (n, g);  r = 1/√(σ² + eps);
//   x̂ = (x − μ)·r;  z = x̂·w + b;  y = z or z·σ(z)
//   dz = dy (or dy·σ(z)(1 + z(1 − σ(z))) with SiLU)
//   dx = r·(dz·w − Σ(dz·w)/M − x̂·Σ(dz·w·x̂)/M),  M = S·C/G
//   dw[c] = Σ_{n,s} dz·x̂,  db[c] = Σ_{n,s} dz
//
// Geometry: one block per sample n (blockIdx.x), blockDim.x threads across
// the row of C channels (V consecutive channels each, C = V·blockDim.x),
// blockDim.y rows of positions (row s is read by thread row s mod
// blockDim.y). Per-channel sums go through shared memory: each thread row
// writes its partial sums, then they are added over the rows and over the
// group's channels in a fixed order, so results are bitwise reproducible.
// Dynamic shared memory: (blockDim.y + 2)·C floats (forward) and
// (2·blockDim.y + 2)·C (backward). w, b f32 [C] (null: ones, zeros);
// mean, rstd f32 [N, G] (null in the forward: not stored). The V = 8
// instances need 16-byte aligned x, y, dy, dx, w and b.
#include "common.cuh"
#include "vec.cuh"

#ifndef GN_DYN_SMEM
#define GN_DYN_SMEM(name) extern __shared__ __align__(16) float name[]
#endif

template <int V>
__device__ __forceinline__ void gn_params(const float* w, const float* b, int c0, float* wv, float* bv) {
  if (w) {
    gpukit_ldv<V>(w + c0, wv);
  } else {
#pragma unroll
    for (int k = 0; k < V; k++) wv[k] = 1.0f;
  }
  if (b) {
    gpukit_ldv<V>(b + c0, bv);
  } else {
#pragma unroll
    for (int k = 0; k < V; k++) bv[k] = 0.0f;
  }
}

__device__ __forceinline__ float gn_sigmoid(float z) { return 1.0f / (1.0f + expf(-z)); }

// gn_group_sums: out[g] = Σ_{r < rows} Σ_{c in group g} part[r·C + c], for
// every group (threads of the block share the groups).
__device__ __forceinline__ void gn_group_sums(float* out, const float* part, int rows, int C, int G) {
  const int cg = C / G;
  const int tid = threadIdx.y * blockDim.x + threadIdx.x, nt = blockDim.x * blockDim.y;
  for (int g = tid; g < G; g += nt) {
    float t = 0.0f;
    for (int r = 0; r < rows; r++) {
      for (int c = g * cg; c < (g + 1) * cg; c++) t += part[r * C + c];
    }
    out[g] = t;
  }
}

// gn_write: y = z or z·σ(z), z = (x − μ)·sc + b, over rows s0, s0 + by,
// ... below s1 of one sample (this thread's V channels).
template <typename T, int V>
__device__ __forceinline__ void gn_write(T* yn, const T* xn, int s0, int s1, int C, const float* mu,
                                         const float* sc, const float* bv, int silu) {
  const int c0 = threadIdx.x * V;
  for (int s = s0; s < s1; s += blockDim.y) {
    float u[V];
    gpukit_ldv<V>(xn + (long long)s * C + c0, u);
#pragma unroll
    for (int k = 0; k < V; k++) {
      float z = (u[k] - mu[k]) * sc[k] + bv[k];
      if (silu) z = z * gn_sigmoid(z);
      u[k] = z;
    }
    gpukit_stv<V>(yn + (long long)s * C + c0, u);
  }
}

// gn_moments: the per-group mean (gm[g]) and sum of squared deviations
// from it (gq[g]) of rows [s0, s1) of one sample's positions, in two passes
// (thread row ty reads rows s0 + ty, s0 + ty + by, ...); mu gets this
// thread's V channels' means. pr: [blockDim.y][C] shared scratch. Ends
// synchronised.
template <typename T, int V>
__device__ __forceinline__ void gn_moments(const T* xn, int s0, int s1, int C, int G, float* pr, float* gm, float* gq,
                                           float* mu) {
  const int tx = threadIdx.x, ty = threadIdx.y, by = blockDim.y;
  const int c0 = tx * V, cg = C / G;
  const float cnt = (float)(s1 - s0) * (float)cg;
  float a[V];
#pragma unroll
  for (int k = 0; k < V; k++) a[k] = 0.0f;
  for (int s = s0 + ty; s < s1; s += by) {
    float u[V];
    gpukit_ldv<V>(xn + (long long)s * C + c0, u);
#pragma unroll
    for (int k = 0; k < V; k++) a[k] += u[k];
  }
#pragma unroll
  for (int k = 0; k < V; k++) pr[ty * C + c0 + k] = a[k];
  __syncthreads();
  gn_group_sums(gm, pr, by, C, G);
  __syncthreads();
  {
    const int tid = ty * blockDim.x + tx, nt = blockDim.x * by;
    for (int g = tid; g < G; g += nt) gm[g] /= cnt;
  }
  __syncthreads();
#pragma unroll
  for (int k = 0; k < V; k++) {
    mu[k] = gm[(c0 + k) / cg];
    a[k] = 0.0f;
  }
  for (int s = s0 + ty; s < s1; s += by) {
    float u[V];
    gpukit_ldv<V>(xn + (long long)s * C + c0, u);
#pragma unroll
    for (int k = 0; k < V; k++) {
      const float d = u[k] - mu[k];
      a[k] += d * d;
    }
  }
#pragma unroll
  for (int k = 0; k < V; k++) pr[ty * C + c0 + k] = a[k];
  __syncthreads();
  gn_group_sums(gq, pr, by, C, G);
  __syncthreads();
}

// gn_fwd writes y (AFFINE false), or with AFFINE the normalisation as a
// per-channel affine map of each sample instead of y: scale[n·C + c] = r·w
// and shift[n·C + c] = b − μ·r·w, so z = x·scale + shift (the prologue of
// conv2d's fused convolutions, conv_igemm_args.pro_scale/pro_shift).
template <typename T, int V, bool AFFINE = false>
__device__ void gn_fwd(T* y, float* mean, float* rstd, const T* x, const float* w, const float* b, int S, int C,
                       int G, float eps, int silu, float* scale = nullptr, float* shift = nullptr) {
  GN_DYN_SMEM(gn_sm);
  const int tx = threadIdx.x, ty = threadIdx.y, by = blockDim.y;
  const int c0 = tx * V, cg = C / G;
  const long long n = blockIdx.x;
  const T* xn = x + n * S * C;
  T* yn = AFFINE ? nullptr : y + n * S * C;
  float* part = gn_sm;           // [by][C]
  float* gmean = gn_sm + by * C;  // [G]
  float* grstd = gmean + C;       // [G]
  const float cnt = (float)S * (float)cg;

  float mu[V];
  gn_moments<T, V>(xn, 0, S, C, G, part, gmean, grstd, mu);
  {
    const int tid = ty * blockDim.x + tx, nt = blockDim.x * by;
    for (int g = tid; g < G; g += nt) {
      grstd[g] = rsqrtf(grstd[g] / cnt + eps);
      if (mean) mean[n * G + g] = gmean[g];
      if (rstd) rstd[n * G + g] = grstd[g];
    }
  }
  __syncthreads();

  float wv[V], bv[V], sc[V];
  gn_params<V>(w, b, c0, wv, bv);
#pragma unroll
  for (int k = 0; k < V; k++) sc[k] = grstd[(c0 + k) / cg] * wv[k];  // z = (x − μ)·sc + b
  if constexpr (AFFINE) {
    if (ty == 0) {
#pragma unroll
      for (int k = 0; k < V; k++) {
        scale[n * C + c0 + k] = sc[k];
        shift[n * C + c0 + k] = bv[k] - mu[k] * sc[k];
      }
    }
    return;
  }
  gn_write<T, V>(yn, xn, ty, S, C, mu, sc, bv, silu);
}

// The forward split over positions, for few samples (one block per sample
// leaves most multiprocessors idle: an 880M-parameter U-Net at batch 2
// spent 266 µs a GroupNorm on 2 blocks, H200 2026-11-28). Block (n, k)
// of a (N, K) grid takes rows [k·chunk, min(S, (k+1)·chunk)).
//
// gn_stats: each block's per-group mean and sum of squared deviations of
// its rows (two passes over them, as gn_fwd), into part[((n·K + k)·G + g)·2
// + {0, 1}]. Dynamic shared memory as gn_fwd's.
template <typename T, int V>
__device__ void gn_stats(float* part, const T* x, int S, int C, int G, int chunk) {
  GN_DYN_SMEM(gn_sm);
  const int tx = threadIdx.x, ty = threadIdx.y, by = blockDim.y;
  const long long n = blockIdx.x;
  const int k = blockIdx.y, K = gridDim.y;
  const int s0 = k * chunk, s1 = min(S, s0 + chunk);
  const T* xn = x + n * S * C;
  float* pr = gn_sm;              // [by][C]
  float* gm = gn_sm + by * C;     // [G]
  float* gq = gm + C;             // [G]
  const int tid = ty * blockDim.x + tx, nt = blockDim.x * by;
  float mu[V];
  gn_moments<T, V>(xn, s0, s1, C, G, pr, gm, gq, mu);
  for (int g = tid; g < G; g += nt) {
    float* o = part + ((n * K + k) * G + g) * 2;
    o[0] = gm[g];
    o[1] = gq[g];
  }
}

// gn_norm: every block merges its sample's K partial moments per group in
// order k = 0, 1, ... (Chan, Golub & LeVeque 1979: n = na + nb,
// δ = mb − ma, m = ma + δ·nb/n, M2 = M2a + M2b + δ²·na·nb/n), so every
// block of a sample computes the same μ and r bit for bit; block k = 0
// stores them (mean, rstd: null, not stored); then it writes y over its
// rows as gn_fwd does. Dynamic shared memory: 2·G floats.
template <typename T, int V>
__device__ void gn_norm(T* y, float* mean, float* rstd, const float* part, const T* x, const float* w,
                        const float* b, int S, int C, int G, float eps, int silu, int chunk) {
  GN_DYN_SMEM(gn_sm);
  const int tx = threadIdx.x, ty = threadIdx.y, by = blockDim.y;
  const int c0 = tx * V, cg = C / G;
  const long long n = blockIdx.x;
  const int k = blockIdx.y, K = gridDim.y;
  float* gm = gn_sm;      // [G]
  float* gr = gn_sm + G;  // [G]
  const int tid = ty * blockDim.x + tx, nt = blockDim.x * by;
  for (int g = tid; g < G; g += nt) {
    float na = 0.0f, ma = 0.0f, qa = 0.0f;
    for (int q = 0; q < K; q++) {
      const float nb = (float)(min(S, (q + 1) * chunk) - q * chunk) * (float)cg;
      const float* pb = part + ((n * K + q) * G + g) * 2;
      const float nab = na + nb, d = pb[0] - ma;
      ma += d * (nb / nab);
      qa += pb[1] + d * d * (na * nb / nab);
      na = nab;
    }
    gm[g] = ma;
    gr[g] = rsqrtf(qa / na + eps);
    if (k == 0) {
      if (mean) mean[n * G + g] = ma;
      if (rstd) rstd[n * G + g] = gr[g];
    }
  }
  __syncthreads();
  float mu[V], wv[V], bv[V], sc[V];
  gn_params<V>(w, b, c0, wv, bv);
#pragma unroll
  for (int j = 0; j < V; j++) {
    mu[j] = gm[(c0 + j) / cg];
    sc[j] = gr[(c0 + j) / cg] * wv[j];
  }
  const int s0 = k * chunk, s1 = min(S, s0 + chunk);
  gn_write<T, V>(y + n * S * C, x + n * S * C, s0 + ty, s1, C, mu, sc, bv, silu);
}

template <typename T, int V>
__device__ void gn_bwd(T* dx, float* part_out, const T* dy, const T* x, const float* w, const float* b,
                       const float* mean, const float* rstd, int S, int C, int G, int silu, int accdx) {
  GN_DYN_SMEM(gn_sm);
  const int tx = threadIdx.x, ty = threadIdx.y, by = blockDim.y;
  const int c0 = tx * V, cg = C / G;
  const long long n = blockIdx.x, N = gridDim.x;
  const T* xn = x + n * S * C;
  const T* gn = dy + n * S * C;
  float* pP = gn_sm;              // [by][C]: Σ dz
  float* pQ = gn_sm + by * C;     // [by][C]: Σ dz·x̂
  float* chP = pQ + by * C;       // [C]
  float* chQ = chP + C;           // [C]
  const float M = (float)S * (float)cg;

  float wv[V], bv[V], mu[V], r[V];
  gn_params<V>(w, b, c0, wv, bv);
#pragma unroll
  for (int k = 0; k < V; k++) {
    const int g = (c0 + k) / cg;
    mu[k] = mean[n * G + g];
    r[k] = rstd[n * G + g];
  }
  float P[V], Q[V];
#pragma unroll
  for (int k = 0; k < V; k++) P[k] = Q[k] = 0.0f;
  for (int s = ty; s < S; s += by) {
    float u[V], d[V];
    gpukit_ldv<V>(xn + (long long)s * C + c0, u);
    gpukit_ldv<V>(gn + (long long)s * C + c0, d);
#pragma unroll
    for (int k = 0; k < V; k++) {
      const float h = (u[k] - mu[k]) * r[k];
      float dz = d[k];
      if (silu) {
        const float z = h * wv[k] + bv[k];
        const float sg = gn_sigmoid(z);
        dz *= sg * (1.0f + z * (1.0f - sg));
      }
      P[k] += dz;
      Q[k] += dz * h;
    }
  }
#pragma unroll
  for (int k = 0; k < V; k++) {
    pP[ty * C + c0 + k] = P[k];
    pQ[ty * C + c0 + k] = Q[k];
  }
  __syncthreads();
  const int tid = ty * blockDim.x + tx, nt = blockDim.x * by;
  for (int c = tid; c < C; c += nt) {
    float tp = 0.0f, tq = 0.0f;
    for (int q = 0; q < by; q++) {
      tp += pP[q * C + c];
      tq += pQ[q * C + c];
    }
    chP[c] = tp;
    chQ[c] = tq;
    part_out[n * C + c] = tp;          // db partial
    part_out[(N + n) * C + c] = tq;    // dw partial
  }
  __syncthreads();
  // Per group: A = Σ w·P, B = Σ w·Q over its channels (into pP's row 0,
  // pQ's row 0: the partial rows are no longer read).
  float* gA = pP;
  float* gB = pQ;
  for (int g = tid; g < G; g += nt) {
    float ta = 0.0f, tb = 0.0f;
    for (int c = g * cg; c < (g + 1) * cg; c++) {
      const float wc = w ? w[c] : 1.0f;
      ta += wc * chP[c];
      tb += wc * chQ[c];
    }
    gA[g] = ta / M;
    gB[g] = tb / M;
  }
  __syncthreads();
  if (!dx) return;
  float ga[V], gb[V];
#pragma unroll
  for (int k = 0; k < V; k++) {
    const int g = (c0 + k) / cg;
    ga[k] = gA[g];
    gb[k] = gB[g];
  }
  T* dxn = dx + n * S * C;
  for (int s = ty; s < S; s += by) {
    float u[V], d[V], o[V];
    gpukit_ldv<V>(xn + (long long)s * C + c0, u);
    gpukit_ldv<V>(gn + (long long)s * C + c0, d);
    if (accdx) gpukit_ldv<V>(dxn + (long long)s * C + c0, o);
#pragma unroll
    for (int k = 0; k < V; k++) {
      const float h = (u[k] - mu[k]) * r[k];
      float dz = d[k];
      if (silu) {
        const float z = h * wv[k] + bv[k];
        const float sg = gn_sigmoid(z);
        dz *= sg * (1.0f + z * (1.0f - sg));
      }
      const float v = r[k] * (dz * wv[k] - ga[k] - h * gb[k]);
      o[k] = accdx ? o[k] + v : v;
    }
    gpukit_stv<V>(dxn + (long long)s * C + c0, o);
  }
}

// gn_bwd_reduce: dw[c] (+)= Σ_n part[N + n][c], db[c] (+)= Σ_n part[n][c],
// over n in order.
extern "C" __global__ void gn_bwd_reduce(float* dw, float* db, const float* part, int N, int C, int accw,
                                         int accb) {
  GPUKIT_GRID_STRIDE(i, C) {
    float tp = 0.0f, tq = 0.0f;
    for (int n = 0; n < N; n++) {
      tp += part[(long long)n * C + i];
      tq += part[(long long)(N + n) * C + i];
    }
    if (db) db[i] = accb ? db[i] + tp : tp;
    if (dw) dw[i] = accw ? dw[i] + tq : tq;
  }
}

#define GN_INSTANCE(SUF, T, V)                                                                           \
  extern "C" __global__ void gn_fwd_##SUF(T* y, float* mean, float* rstd, const T* x, const float* w,    \
                                          const float* b, int S, int C, int G, float eps, int silu) {    \
    gn_fwd<T, V>(y, mean, rstd, x, w, b, S, C, G, eps, silu);                                           \
  }                                                                                                      \
  extern "C" __global__ void gn_bwd_##SUF(T* dx, float* part, const T* dy, const T* x, const float* w,   \
                                          const float* b, const float* mean, const float* rstd, int S,   \
                                          int C, int G, int silu, int accdx) {                           \
    gn_bwd<T, V>(dx, part, dy, x, w, b, mean, rstd, S, C, G, silu, accdx);                               \
  }                                                                                                      \
  extern "C" __global__ void gn_stats_##SUF(float* part, const T* x, int S, int C, int G, int chunk) {   \
    gn_stats<T, V>(part, x, S, C, G, chunk);                                                             \
  }                                                                                                      \
  extern "C" __global__ void gn_norm_##SUF(T* y, float* mean, float* rstd, const float* part, const T* x, \
                                           const float* w, const float* b, int S, int C, int G,          \
                                           float eps, int silu, int chunk) {                             \
    gn_norm<T, V>(y, mean, rstd, part, x, w, b, S, C, G, eps, silu, chunk);                              \
  }

#define GN_AFFINE_INSTANCE(SUF, T, V)                                                                          \
  extern "C" __global__ void gn_affine_##SUF(float* scale, float* shift, float* mean, float* rstd, const T* x,  \
                                             const float* w, const float* b, int S, int C, int G, float eps) { \
    gn_fwd<T, V, true>(nullptr, mean, rstd, x, w, b, S, C, G, eps, 0, scale, shift);                            \
  }

GN_AFFINE_INSTANCE(s_bf16, gpukit_bf16, 1)
GN_AFFINE_INSTANCE(v_bf16, gpukit_bf16, 8)

GN_INSTANCE(s_f32, float, 1)
GN_INSTANCE(v_f32, float, 8)
GN_INSTANCE(s_bf16, gpukit_bf16, 1)
GN_INSTANCE(v_bf16, gpukit_bf16, 8)
