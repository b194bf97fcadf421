// layernorm.cu: layer normalisation over the last dimension, forward and
// backward (libgpu/ops/layernorm.go; Ba, Kiros & Hinton 2016, with the
// biased variance of PyTorch's F.layer_norm):
//
//   μ = Σx/C, σ² = Σ(x−μ)²/C, r = 1/√(σ² + eps), x̂ = (x−μ)·r,
//   y = x̂·w + b;
//   g = dy·w, dx = r·(g − Σg/C − x̂·Σ(g·x̂)/C), dw = Σ_rows dy·x̂,
//   db = Σ_rows dy.
//
// Geometry (vec.cuh): a row of C elements is handled by a group of G threads
// (a warp, or the whole block when block != 0). Thread t of a group owns the
// vectors j = t + k·G (k = 0, 1, ...) of V elements, columns [jV, jV+V);
// those with k < NV are cached in registers, so x (and dy) are read once.
// Further vectors exist only in block mode when C > G·NV·V; they are read
// again from global memory (the Go side keeps that for C > 8192). Rows are
// row-strided (ldx, ldy, ...); mean and rstd are contiguous f32 [rows]; w
// and b f32 [C] (null: ones and zeros). With V > 1 every pointer is
// 16-byte aligned and C and the row strides are multiples of V.
//
// The backward is deterministic and uses no atomics: block b takes rows
// [b·rpb, min((b+1)·rpb, rows)); each thread keeps its columns' partial dw
// and db (in registers, or in its warp's row of shared memory); the groups
// of a block add theirs in a fixed order and the block writes row b of the
// partials pdw, pdb [gridDim.x, C]; ln_bwd_reduce sums the partials over
// blocks.
#include "common.cuh"
#include "vec.cuh"

// ln_w loads w at columns [c, c+V) (ones where w is null); ln_b likewise
// b (zeros where null).
template <int V>
__device__ __forceinline__ void ln_w(const float* w, int c, float* wv) {
  if (w) {
    gpukit_ldv<V>(w + c, wv);
  } else {
#pragma unroll
    for (int i = 0; i < V; i++) wv[i] = 1.0f;
  }
}
template <int V>
__device__ __forceinline__ void ln_b(const float* b, int c, float* bv) {
  if (b) {
    gpukit_ldv<V>(b + c, bv);
  } else {
#pragma unroll
    for (int i = 0; i < V; i++) bv[i] = 0.0f;
  }
}

template <typename T, int V, int NV>
__device__ void ln_fwd(T* y, float* mean, float* rstd, const T* x, const float* w, const float* b,
                       long long rows, int C, long long ldx, long long ldy, float eps, int block) {
  __shared__ float sh[32];
  const gpukit_group g = gpukit_group_of(block);
  const int nv = C / V;
  const long long g0 = (long long)blockIdx.x * g.gpb + g.gi, ng = (long long)gridDim.x * g.gpb;
  for (long long r = g0; r < rows; r += ng) {  // uniform over a block in block mode
    const T* xr = x + r * ldx;
    T* yr = y + r * ldy;
    float xv[NV][V];
    float s[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
        gpukit_ldv<V>(xr + (long long)j * V, xv[k]);
#pragma unroll
        for (int i = 0; i < V; i++) s[0] += xv[k][i];
      }
    }
    for (int j = g.t + NV * g.G; j < nv; j += g.G) {
      float u[V];
      gpukit_ldv<V>(xr + (long long)j * V, u);
#pragma unroll
      for (int i = 0; i < V; i++) s[0] += u[i];
    }
    gpukit_group_sum<1>(s, block, sh);
    const float mu = s[0] / (float)C;
    // Two passes over the cached row: Σ(x−μ)² loses nothing to cancellation.
    s[0] = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
      if (g.t + k * g.G < nv) {
#pragma unroll
        for (int i = 0; i < V; i++) {
          const float d = xv[k][i] - mu;
          s[0] += d * d;
        }
      }
    }
    for (int j = g.t + NV * g.G; j < nv; j += g.G) {
      float u[V];
      gpukit_ldv<V>(xr + (long long)j * V, u);
#pragma unroll
      for (int i = 0; i < V; i++) {
        const float d = u[i] - mu;
        s[0] += d * d;
      }
    }
    gpukit_group_sum<1>(s, block, sh);
    const float rs = rsqrtf(s[0] / (float)C + eps);
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
        float wv[V], bv[V], o[V];
        ln_w<V>(w, j * V, wv);
        ln_b<V>(b, j * V, bv);
#pragma unroll
        for (int i = 0; i < V; i++) o[i] = (xv[k][i] - mu) * rs * wv[i] + bv[i];
        gpukit_stv<V>(yr + (long long)j * V, o);
      }
    }
    for (int j = g.t + NV * g.G; j < nv; j += g.G) {
      float u[V], wv[V], bv[V], o[V];
      gpukit_ldv<V>(xr + (long long)j * V, u);
      ln_w<V>(w, j * V, wv);
      ln_b<V>(b, j * V, bv);
#pragma unroll
      for (int i = 0; i < V; i++) o[i] = (u[i] - mu) * rs * wv[i] + bv[i];
      gpukit_stv<V>(yr + (long long)j * V, o);
    }
    if (g.t == 0) {
      if (mean) mean[r] = mu;
      if (rstd) rstd[r] = rs;
    }
  }
}

template <typename T, int V, int NV>
__device__ void ln_bwd(T* dx, float* pdw, float* pdb, const T* dy, const T* x, const float* w,
                       const float* mean, const float* rstd, long long rows, int C, long long lddx,
                       long long lddy, long long ldx, long long rpb, int block, int accdx) {
  // Where a thread keeps its columns' partial dw, db: in registers for
  // E = NV·V = 8 (warp or block mode), in shared memory for E ≥ 16 (warp
  // mode only: C ≤ 1024, four warps per block), one row per warp, element
  // i of vector j at i·nv + j so that the lanes of a warp touch
  // consecutive words. That keeps 2E registers free where E is large, so
  // more blocks fit on an SM.
  constexpr bool SP = NV * V > 8;
  __shared__ float sh[64];
  __shared__ float acc[SP ? 4 : 1][2][1024];
  const gpukit_group g = gpukit_group_of(block);
  const int nv = C / V;
  const long long r0 = (long long)blockIdx.x * rpb;
  const long long r1 = r0 + rpb < rows ? r0 + rpb : rows;
  float* prow_w = pdw ? pdw + (long long)blockIdx.x * C : nullptr;
  float* prow_b = pdb ? pdb + (long long)blockIdx.x * C : nullptr;
  float* sw = acc[SP ? g.gi : 0][0];
  float* sb = acc[SP ? g.gi : 0][1];
  float aw[NV][V], ab[NV][V];
#pragma unroll
  for (int k = 0; k < NV; k++) {
    const int j = g.t + k * g.G;
#pragma unroll
    for (int i = 0; i < V; i++) {
      if constexpr (SP) {
        if (j < nv) sw[i * nv + j] = sb[i * nv + j] = 0.0f;
      } else {
        aw[k][i] = ab[k][i] = 0.0f;
      }
    }
  }
  // Columns past the cache (block mode only) accumulate in the block's
  // partial row itself; this thread alone touches them.
  for (int j = g.t + NV * g.G; j < nv; j += g.G) {
#pragma unroll
    for (int i = 0; i < V; i++) {
      if (prow_w) prow_w[j * V + i] = 0.0f;
      if (prow_b) prow_b[j * V + i] = 0.0f;
    }
  }
  for (long long r = r0 + g.gi; r < r1; r += g.gpb) {  // uniform over a block in block mode
    const T* xr = x + r * ldx;
    const T* gr = dy + r * lddy;
    T* dxr = dx ? dx + r * lddx : nullptr;
    const float mu = mean[r], rs = rstd[r];
    float xv[NV][V], gv[NV][V];
    float s[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
        float wv[V];
        gpukit_ldv<V>(xr + (long long)j * V, xv[k]);
        gpukit_ldv<V>(gr + (long long)j * V, gv[k]);
        ln_w<V>(w, j * V, wv);
#pragma unroll
        for (int i = 0; i < V; i++) {
          const float xh = (xv[k][i] - mu) * rs, gw = gv[k][i] * wv[i];
          s[0] += gw;
          s[1] += gw * xh;
        }
      }
    }
    for (int j = g.t + NV * g.G; j < nv; j += g.G) {
      float u[V], d[V], wv[V];
      gpukit_ldv<V>(xr + (long long)j * V, u);
      gpukit_ldv<V>(gr + (long long)j * V, d);
      ln_w<V>(w, j * V, wv);
#pragma unroll
      for (int i = 0; i < V; i++) {
        const float xh = (u[i] - mu) * rs, gw = d[i] * wv[i];
        s[0] += gw;
        s[1] += gw * xh;
      }
    }
    gpukit_group_sum<2>(s, block, sh);
    const float m1 = s[0] / (float)C, m2 = s[1] / (float)C;
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
        float wv[V], o[V];
        ln_w<V>(w, j * V, wv);
        if (dxr && accdx) gpukit_ldv<V>(dxr + (long long)j * V, o);
#pragma unroll
        for (int i = 0; i < V; i++) {
          const float xh = (xv[k][i] - mu) * rs;
          const float d = rs * (gv[k][i] * wv[i] - m1 - xh * m2);
          o[i] = (dxr && accdx) ? o[i] + d : d;
          if constexpr (SP) {
            sw[i * nv + j] += gv[k][i] * xh;
            sb[i * nv + j] += gv[k][i];
          } else {
            aw[k][i] += gv[k][i] * xh;
            ab[k][i] += gv[k][i];
          }
        }
        if (dxr) gpukit_stv<V>(dxr + (long long)j * V, o);
      }
    }
    for (int j = g.t + NV * g.G; j < nv; j += g.G) {
      float u[V], dd[V], wv[V], o[V];
      gpukit_ldv<V>(xr + (long long)j * V, u);
      gpukit_ldv<V>(gr + (long long)j * V, dd);
      ln_w<V>(w, j * V, wv);
      if (dxr && accdx) gpukit_ldv<V>(dxr + (long long)j * V, o);
#pragma unroll
      for (int i = 0; i < V; i++) {
        const float xh = (u[i] - mu) * rs;
        const float d = rs * (dd[i] * wv[i] - m1 - xh * m2);
        o[i] = (dxr && accdx) ? o[i] + d : d;
        if (prow_w) prow_w[j * V + i] += dd[i] * xh;
        if (prow_b) prow_b[j * V + i] += dd[i];
      }
      if (dxr) gpukit_stv<V>(dxr + (long long)j * V, o);
    }
  }
  if (!prow_w && !prow_b) return;
  if constexpr (SP) {
    // The warps' shared rows, added in warp order.
    __syncthreads();
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
      const int idx = (c % V) * nv + c / V;
      float tw = 0.0f, tb = 0.0f;
      for (int wi = 0; wi < g.gpb; wi++) {
        tw += acc[wi][0][idx];
        tb += acc[wi][1][idx];
      }
      if (prow_w) prow_w[c] = tw;
      if (prow_b) prow_b[c] = tb;
    }
    return;
  }
  if (block) {
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
#pragma unroll
        for (int i = 0; i < V; i++) {
          if (prow_w) prow_w[j * V + i] = aw[k][i];
          if (prow_b) prow_b[j * V + i] = ab[k][i];
        }
      }
    }
    return;
  }
  // Warp mode: the block's warps add their register partials in warp order.
  for (int wi = 0; wi < g.gpb; wi++) {
    if (g.gi == wi) {
#pragma unroll
      for (int k = 0; k < NV; k++) {
        const int j = g.t + k * g.G;
        if (j < nv) {
#pragma unroll
          for (int i = 0; i < V; i++) {
            const int c = j * V + i;
            sw[c] = wi ? sw[c] + aw[k][i] : aw[k][i];
            sb[c] = wi ? sb[c] + ab[k][i] : ab[k][i];
          }
        }
      }
    }
    __syncthreads();
  }
  for (int c = threadIdx.x; c < C; c += blockDim.x) {
    if (prow_w) prow_w[c] = sw[c];
    if (prow_b) prow_b[c] = sb[c];
  }
}

// ln_bwd_reduce: dw[c] (+)= Σ_b pdw[b·C + c] and db[c] (+)= Σ_b pdb[b·C + c]
// over b in [0, nb), for c in [0, C) (dw, db null: skipped). Block (32, 8):
// 32 columns, 8 interleaved sums added in a fixed order.
extern "C" __global__ void ln_bwd_reduce(float* dw, float* db, const float* pdw, const float* pdb,
                                         int nb, int C, int accw, int accb) {
  __shared__ float sh[2][8][33];
  const int c = blockIdx.x * 32 + threadIdx.x;
  float sw = 0.0f, sb = 0.0f;
  if (c < C) {
    for (int b = threadIdx.y; b < nb; b += 8) {
      if (dw) sw += pdw[(long long)b * C + c];
      if (db) sb += pdb[(long long)b * C + c];
    }
  }
  sh[0][threadIdx.y][threadIdx.x] = sw;
  sh[1][threadIdx.y][threadIdx.x] = sb;
  __syncthreads();
  if (threadIdx.y != 0 || c >= C) return;
  float tw = 0.0f, tb = 0.0f;
  for (int k = 0; k < 8; k++) {
    tw += sh[0][k][threadIdx.x];
    tb += sh[1][k][threadIdx.x];
  }
  if (dw) dw[c] = accw ? dw[c] + tw : tw;
  if (db) db[c] = accb ? db[c] + tb : tb;
}

// Instances: ln_fwd_e<E><s|v>_<dt> and ln_bwd_e<E><s|v>_<dt>, E cached
// elements per thread (8, 16, 32), s: scalar (V = 1), v: vectors of V = 8.
// E = 8 instances also serve block mode (up to 1024 threads).
#define LN_INSTANCE(SUF, T, V, NV, LB)                                                             \
  extern "C" __global__ void __launch_bounds__(LB)                                                \
      ln_fwd_##SUF(T* y, float* mean, float* rstd, const T* x, const float* w, const float* b,    \
                   long long rows, int C, long long ldx, long long ldy, float eps, int block) {   \
    ln_fwd<T, V, NV>(y, mean, rstd, x, w, b, rows, C, ldx, ldy, eps, block);                      \
  }                                                                                                \
  extern "C" __global__ void __launch_bounds__(LB)                                                \
      ln_bwd_##SUF(T* dx, float* pdw, float* pdb, const T* dy, const T* x, const float* w,        \
                   const float* mean, const float* rstd, long long rows, int C, long long lddx,   \
                   long long lddy, long long ldx, long long rpb, int block, int accdx) {          \
    ln_bwd<T, V, NV>(dx, pdw, pdb, dy, x, w, mean, rstd, rows, C, lddx, lddy, ldx, rpb, block,   \
                     accdx);                                                                       \
  }

#define LN_DTYPE(DT, T)                        \
  LN_INSTANCE(e8s_##DT, T, 1, 8, 1024)         \
  LN_INSTANCE(e16s_##DT, T, 1, 16, 128)        \
  LN_INSTANCE(e32s_##DT, T, 1, 32, 128)        \
  LN_INSTANCE(e8v_##DT, T, 8, 1, 1024)         \
  LN_INSTANCE(e16v_##DT, T, 8, 2, 128)         \
  LN_INSTANCE(e32v_##DT, T, 8, 4, 128)

LN_DTYPE(f32, float)
LN_DTYPE(bf16, gpukit_bf16)
