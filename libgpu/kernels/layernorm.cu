// layernorm.cu: layer normalisation over the last dimension, forward and
// backward, alone or after a residual add (libgpu/ops/layernorm.go; Ba,
// Kiros & Hinton 2016, with the biased variance of PyTorch's
// F.layer_norm):
//
//   forward:  s = x (+ r, rounded to the dtype and stored: AddLayerNorm),
//             μ = Σs/C, σ² = Σ(s−μ)²/C, ρ = 1/√(σ² + eps), ŝ = (s−μ)·ρ,
//             y = ŝ·w + b;
//   backward: g = dy·w, d = ρ·(g − Σg/C − ŝ·Σ(g·ŝ)/C), t = d (+ gsum, the
//             gradient of the stored s), dx (+)= t, dr (+)= t,
//             dw (+)= Σ_rows dy·ŝ, db (+)= Σ_rows dy.
//
// Every kernel takes one ln_args (ops/layernorm.go mirrors it: lnKArgs).
// Rows are row-strided (ld*, in elements); mean and rstd contiguous f32
// [rows]; w, b, dw, db f32 [C] (w, b null: ones, zeros; dw, db null: not
// wanted); any of r/sum, gsum, dx, dr null: absent.
//
// Two geometries.
//
//   - Fast (ln_fwdf_*, ln_bwdf_*): a warp per row, rows of C ≤ 32·V·NV
//     held in registers as NV vectors of V elements per lane (V = 4 or 8:
//     8- or 16-byte accesses; every pointer aligned to V elements, C and
//     the row strides multiples of V). 256-thread blocks, as many as fit
//     on the GPU at once (ops sizes the grid); each warp loops over rows
//     and loads its next row (raw bits) before working on the current
//     one, so two rows per warp are in flight.
//   - General (ln_fwd_e*, ln_bwd_e*): any C and alignment. A row goes to a
//     group of G threads (a warp, or the whole block when block != 0,
//     vec.cuh); thread t owns the vectors j = t + k·G of V elements
//     (V = 1, or 8 with 16-byte alignment), those with k < NV cached in
//     registers; wider rows (block mode past G·NV·V) are read again per
//     pass.
//
// The backward's dw and db are deterministic and use no float atomics:
// each block adds its rows' dy·ŝ and dy in a fixed order into one row of
// partials, part[blockIdx][2C] (dw then db); then a ticket fold
// (ln_fold) sums them: the last block of each group of a.group blocks to
// finish adds its group's rows into a group row, and the last group to
// finish adds the group rows into dw and db. Which block folds depends on
// timing, the order of every sum does not: the same bits on every run, no
// separate reduce kernel, and only the last group's fold after the rows
// are done. The tickets are zero between launches (each folder resets the
// one it used).
#include "common.cuh"
#include "vec.cuh"

// LN_DYN_SMEM declares the dynamic shared memory (the host emulation,
// scripts/cudaemu, defines its own).
#ifndef LN_DYN_SMEM
#define LN_DYN_SMEM(name) extern __shared__ __align__(16) float name[]
#endif

struct ln_args {
  void* y;            // forward: [rows, C] (ldy)
  void* sum;          // forward: s = x + r, stored (lds); null without r
  const void* x;      // forward: x (ldx); backward: the normalised input s
  const void* r;      // forward: residual addend (ldr); null: none
  const void* dy;     // backward: gradient of y (lddy)
  const void* gsum;   // backward: gradient of the stored s, added to dx/dr (ldg); null: zero
  void* dx;           // backward (lddx); null: not wanted
  void* dr;           // backward: a second copy of dx (lddr); null: not wanted
  const float* w;     // [C]; null: ones
  const float* b;     // [C]; null: zeros
  float* mean;        // [rows]: the forward writes (null: not kept), the backward reads
  float* rstd;        // [rows]
  float* dw;          // backward [C]; null: not wanted
  float* db;          // backward [C]; null: not wanted
  float* part;        // backward: [gridDim + groups][2C] partials; null: neither dw nor db
  unsigned int* tickets;  // backward: [groups + 1], zero between launches
  long long rows;
  long long ldy, lds, ldx, ldr, lddy, ldg, lddx, lddr;
  long long rpb;  // backward: rows per block (block b: [b·rpb, (b+1)·rpb))
  int C;
  int block;  // general kernels: a whole block per row
  float eps;
  int acc_dx, acc_dr, acc_w, acc_b;
  int group;  // backward: blocks per fold group
};
static_assert(sizeof(ln_args) == 240, "ln_args layout: launch.LnArgs is generated from it (go generate ./libgpu/kernels/launch)");

// ---- shared pieces ----

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

// ln_round rounds v[0..V) to T's precision and back (the stored sum's
// values), with the same rounding as the store.
template <typename T, int V>
__device__ __forceinline__ void ln_round(float* v) {
  if constexpr (sizeof(T) == 2) {
    if constexpr (V % 2 == 0) {
#pragma unroll
      for (int i = 0; i < V; i += 2) gpukit_unpack_bf16x2(gpukit_pack_bf16x2(v[i], v[i + 1]), v + i);
    } else {
#pragma unroll
      for (int i = 0; i < V; i++) v[i] = gpukit_bf16_to_f32(gpukit_f32_to_bf16(v[i]));
    }
  }
}

// ln_ldcg loads from L2, past the SM's L1 (which other SMs' writes do not
// reach): the fold reads partials other blocks wrote.
__device__ __forceinline__ float ln_ldcg(const float* p) {
#ifdef GPUKIT_EMU
  return *p;
#else
  float v;
  asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
#endif
}

// ln_colsums: out(c, Σ_{k<n} p[k·ld + c]) for every column c < C2, each
// sum in order of k. A thread takes the columns c, c + B, c + 2B, c + 3B
// (B = blockDim.x) together and eight rows at a time: up to 32 loads in
// flight, so a fold of n rows costs about n/8 trips to L2.
template <typename F>
__device__ __forceinline__ void ln_colsums(const float* p, int n, int ld, int C2, F out) {
  const int B = blockDim.x;
  for (int c0 = threadIdx.x; c0 < C2; c0 += 4 * B) {
    float s[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int k = 0;
    for (; k + 8 <= n; k += 8) {
      float v[4][8];
#pragma unroll
      for (int q = 0; q < 4; q++) {
#pragma unroll
        for (int u = 0; u < 8; u++) v[q][u] = c0 + q * B < C2 ? ln_ldcg(p + (long long)(k + u) * ld + c0 + q * B) : 0.0f;
      }
#pragma unroll
      for (int q = 0; q < 4; q++) {
#pragma unroll
        for (int u = 0; u < 8; u++) s[q] += v[q][u];
      }
    }
    for (; k < n; k++) {
#pragma unroll
      for (int q = 0; q < 4; q++) {
        if (c0 + q * B < C2) s[q] += ln_ldcg(p + (long long)k * ld + c0 + q * B);
      }
    }
#pragma unroll
    for (int q = 0; q < 4; q++) {
      if (c0 + q * B < C2) out(c0 + q * B, s[q]);
    }
  }
}

// ln_fold: called by every thread of every block of a backward once the
// block's partial row part[blockIdx][2C] is written. See the top.
__device__ void ln_fold(const ln_args& a) {
  __shared__ int last;
  const int C2 = 2 * a.C, nb = gridDim.x, S = a.group;
  const int gi = blockIdx.x / S, ng = (nb + S - 1) / S;
  const int g0 = gi * S, g1 = g0 + S < nb ? g0 + S : nb;
  __threadfence();  // this thread's partials before the block's ticket
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&a.tickets[gi], 1u) == (unsigned int)(g1 - g0 - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  float* grow = a.part + (long long)(nb + gi) * C2;
  ln_colsums(a.part + (long long)g0 * C2, g1 - g0, C2, C2, [&](int c, float v) { grow[c] = v; });
  if (threadIdx.x == 0) a.tickets[gi] = 0u;  // every block of the group has taken its ticket
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(&a.tickets[ng], 1u) == (unsigned int)(ng - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  ln_colsums(a.part + (long long)nb * C2, ng, C2, C2, [&](int c, float v) {
    if (c < a.C) {
      if (a.dw) a.dw[c] = a.acc_w ? a.dw[c] + v : v;
    } else if (a.db) {
      a.db[c - a.C] = a.acc_b ? a.db[c - a.C] + v : v;
    }
  });
  if (threadIdx.x == 0) a.tickets[ng] = 0u;
}

// ln_out writes t (+ the old values when acc) to p[0..V): dx and dr.
template <typename T, int V>
__device__ __forceinline__ void ln_out(T* p, const float* t, int acc) {
  float o[V];
  if (acc) {
    gpukit_ldv<V>(p, o);
#pragma unroll
    for (int i = 0; i < V; i++) o[i] += t[i];
  } else {
#pragma unroll
    for (int i = 0; i < V; i++) o[i] = t[i];
  }
  gpukit_stv<V>(p, o);
}

// ---- general geometry ----

template <typename T, int V, int NV>
__device__ void ln_fwd(const ln_args& a) {
  __shared__ float sh[32];
  const gpukit_group g = gpukit_group_of(a.block);
  const int C = a.C, nv = C / V;
  const T* x = (const T*)a.x;
  const T* res = (const T*)a.r;
  T* y = (T*)a.y;
  T* sm = (T*)a.sum;
  const long long g0 = (long long)blockIdx.x * g.gpb + g.gi, ng = (long long)gridDim.x * g.gpb;
  for (long long r = g0; r < a.rows; r += ng) {  // uniform over a block in block mode
    const T* xr = x + r * a.ldx;
    const T* rr = res ? res + r * a.ldr : nullptr;
    T* sr = res ? sm + r * a.lds : nullptr;
    // Passes after the first read the stored sum (this thread wrote the
    // elements it reads).
    const T* src = res ? (const T*)sr : xr;
    T* yr = y + r * a.ldy;
    float xv[NV][V];
    float s[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
        gpukit_ldv<V>(xr + (long long)j * V, xv[k]);
        if (rr) {
          float u[V];
          gpukit_ldv<V>(rr + (long long)j * V, u);
#pragma unroll
          for (int i = 0; i < V; i++) xv[k][i] += u[i];
          ln_round<T, V>(xv[k]);
          gpukit_stv<V>(sr + (long long)j * V, xv[k]);
        }
#pragma unroll
        for (int i = 0; i < V; i++) s[0] += xv[k][i];
      }
    }
    for (int j = g.t + NV * g.G; j < nv; j += g.G) {
      float u[V];
      gpukit_ldv<V>(xr + (long long)j * V, u);
      if (rr) {
        float v[V];
        gpukit_ldv<V>(rr + (long long)j * V, v);
#pragma unroll
        for (int i = 0; i < V; i++) u[i] += v[i];
        ln_round<T, V>(u);
        gpukit_stv<V>(sr + (long long)j * V, u);
      }
#pragma unroll
      for (int i = 0; i < V; i++) s[0] += u[i];
    }
    gpukit_group_sum<1>(s, a.block, sh);
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
      gpukit_ldv<V>(src + (long long)j * V, u);
#pragma unroll
      for (int i = 0; i < V; i++) {
        const float d = u[i] - mu;
        s[0] += d * d;
      }
    }
    gpukit_group_sum<1>(s, a.block, sh);
    const float rs = rsqrtf(s[0] / (float)C + a.eps);
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
        float wv[V], bv[V], o[V];
        ln_w<V>(a.w, j * V, wv);
        ln_b<V>(a.b, j * V, bv);
#pragma unroll
        for (int i = 0; i < V; i++) o[i] = (xv[k][i] - mu) * rs * wv[i] + bv[i];
        gpukit_stv<V>(yr + (long long)j * V, o);
      }
    }
    for (int j = g.t + NV * g.G; j < nv; j += g.G) {
      float u[V], wv[V], bv[V], o[V];
      gpukit_ldv<V>(src + (long long)j * V, u);
      ln_w<V>(a.w, j * V, wv);
      ln_b<V>(a.b, j * V, bv);
#pragma unroll
      for (int i = 0; i < V; i++) o[i] = (u[i] - mu) * rs * wv[i] + bv[i];
      gpukit_stv<V>(yr + (long long)j * V, o);
    }
    if (g.t == 0) {
      if (a.mean) a.mean[r] = mu;
      if (a.rstd) a.rstd[r] = rs;
    }
  }
}

template <typename T, int V, int NV>
__device__ void ln_bwd(const ln_args& a) {
  // Where a thread keeps its columns' partial dw, db: in registers for
  // E = NV·V = 8 (warp or block mode), in shared memory for E ≥ 16 (warp
  // mode only: C ≤ 1024, four warps per block), one row per warp, element
  // i of vector j at i·nv + j so that the lanes of a warp touch
  // consecutive words. That keeps 2E registers free where E is large, so
  // more blocks fit on an SM.
  constexpr bool SP = NV * V > 8;
  __shared__ float sh[64];
  __shared__ float acc[SP ? 4 : 1][2][1024];
  const gpukit_group g = gpukit_group_of(a.block);
  const int C = a.C, nv = C / V;
  const T* x = (const T*)a.x;
  const T* dy = (const T*)a.dy;
  const T* gs = (const T*)a.gsum;
  T* dx = (T*)a.dx;
  T* dr = (T*)a.dr;
  const long long r0 = (long long)blockIdx.x * a.rpb;
  const long long r1 = r0 + a.rpb < a.rows ? r0 + a.rpb : a.rows;
  float* prow_w = a.part ? a.part + (long long)blockIdx.x * 2 * C : nullptr;
  float* prow_b = a.part ? prow_w + C : nullptr;
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
      if (prow_w) prow_w[j * V + i] = prow_b[j * V + i] = 0.0f;
    }
  }
  for (long long r = r0 + g.gi; r < r1; r += g.gpb) {  // uniform over a block in block mode
    const T* xr = x + r * a.ldx;
    const T* gr = dy + r * a.lddy;
    const T* gsr = gs ? gs + r * a.ldg : nullptr;
    T* dxr = dx ? dx + r * a.lddx : nullptr;
    T* drr = dr ? dr + r * a.lddr : nullptr;
    const float mu = a.mean[r], rs = a.rstd[r];
    float xv[NV][V], gv[NV][V];
    float s[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
        float wv[V];
        gpukit_ldv<V>(xr + (long long)j * V, xv[k]);
        gpukit_ldv<V>(gr + (long long)j * V, gv[k]);
        ln_w<V>(a.w, j * V, wv);
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
      ln_w<V>(a.w, j * V, wv);
#pragma unroll
      for (int i = 0; i < V; i++) {
        const float xh = (u[i] - mu) * rs, gw = d[i] * wv[i];
        s[0] += gw;
        s[1] += gw * xh;
      }
    }
    gpukit_group_sum<2>(s, a.block, sh);
    const float m1 = s[0] / (float)C, m2 = s[1] / (float)C;
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
        float wv[V], t[V];
        ln_w<V>(a.w, j * V, wv);
        if (gsr) gpukit_ldv<V>(gsr + (long long)j * V, t);
#pragma unroll
        for (int i = 0; i < V; i++) {
          const float xh = (xv[k][i] - mu) * rs;
          const float d = rs * (gv[k][i] * wv[i] - m1 - xh * m2);
          t[i] = gsr ? t[i] + d : d;
          if constexpr (SP) {
            sw[i * nv + j] += gv[k][i] * xh;
            sb[i * nv + j] += gv[k][i];
          } else {
            aw[k][i] += gv[k][i] * xh;
            ab[k][i] += gv[k][i];
          }
        }
        if (dxr) ln_out<T, V>(dxr + (long long)j * V, t, a.acc_dx);
        if (drr) ln_out<T, V>(drr + (long long)j * V, t, a.acc_dr);
      }
    }
    for (int j = g.t + NV * g.G; j < nv; j += g.G) {
      float u[V], dd[V], wv[V], t[V];
      gpukit_ldv<V>(xr + (long long)j * V, u);
      gpukit_ldv<V>(gr + (long long)j * V, dd);
      ln_w<V>(a.w, j * V, wv);
      if (gsr) gpukit_ldv<V>(gsr + (long long)j * V, t);
#pragma unroll
      for (int i = 0; i < V; i++) {
        const float xh = (u[i] - mu) * rs;
        const float d = rs * (dd[i] * wv[i] - m1 - xh * m2);
        t[i] = gsr ? t[i] + d : d;
        if (prow_w) {
          prow_w[j * V + i] += dd[i] * xh;
          prow_b[j * V + i] += dd[i];
        }
      }
      if (dxr) ln_out<T, V>(dxr + (long long)j * V, t, a.acc_dx);
      if (drr) ln_out<T, V>(drr + (long long)j * V, t, a.acc_dr);
    }
  }
  if (!prow_w) return;  // uniform: no dw or db wanted, no fold
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
      prow_w[c] = tw;
      prow_b[c] = tb;
    }
  } else if (a.block) {
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
#pragma unroll
        for (int i = 0; i < V; i++) {
          prow_w[j * V + i] = aw[k][i];
          prow_b[j * V + i] = ab[k][i];
        }
      }
    }
  } else {
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
      prow_w[c] = sw[c];
      prow_b[c] = sb[c];
    }
  }
  ln_fold(a);
}

// ---- fast geometry: a warp per row, rows in registers ----

#define LNF_THREADS 256
#define LNF_WARPS (LNF_THREADS / 32)

// lnf_raw is one lane's vector of V elements of T as raw 32-bit words,
// loaded with 8- or 16-byte accesses and widened to f32 only where used,
// so a prefetched row costs no wait until then.
template <typename T, int V>
struct lnf_raw {
  static constexpr int W = V * (int)sizeof(T) / 4;
  unsigned int u[W];
};

template <typename T, int V>
__device__ __forceinline__ void lnf_ld(lnf_raw<T, V>& r, const T* p) {
  constexpr int W = lnf_raw<T, V>::W;
  if constexpr (W % 4 == 0) {
#pragma unroll
    for (int k = 0; k < W; k += 4) {
      const gpukit_u32x4 v = reinterpret_cast<const gpukit_u32x4*>(p)[k / 4];
      r.u[k] = v.a;
      r.u[k + 1] = v.b;
      r.u[k + 2] = v.c;
      r.u[k + 3] = v.d;
    }
  } else {
    static_assert(W == 2, "lnf vectors are 8 or 16·k bytes");
    const gpukit_u32x2 v = *reinterpret_cast<const gpukit_u32x2*>(p);
    r.u[0] = v.a;
    r.u[1] = v.b;
  }
}

template <typename T, int V>
__device__ __forceinline__ void lnf_f(const lnf_raw<T, V>& r, float* v) {
  if constexpr (sizeof(T) == 2) {
#pragma unroll
    for (int k = 0; k < V / 2; k++) gpukit_unpack_bf16x2(r.u[k], v + 2 * k);
  } else {
#pragma unroll
    for (int k = 0; k < V; k++) v[k] = __uint_as_float(r.u[k]);
  }
}

// LNF_PF: whether a lane loads its next row while working on the current
// one. Up to 64 bytes per tensor per lane (bf16 rows up to 1024, f32 up
// to 512): the two rows' raw words stay within the registers; wider f32
// rows load at the top of each iteration (their rows are long enough to
// keep memory busy from more warps).
#define LNF_PF(T, V, NV) ((NV) * (V) * (int)sizeof(T) <= 64)

// One row of a lane: NV vectors (j = lane + k·32 < nv valid) of each
// tensor the kernel reads, plus the row's saved statistics (backward).
template <typename T, int V, int NV>
struct lnf_row {
  lnf_raw<T, V> p[NV], q[NV], s[NV];
  float mu, rs;
};

// ln_fwdf: see the top. RES: with a residual addend (AddLayerNorm).
template <typename T, int V, int NV, bool RES>
__device__ __forceinline__ void ln_fwdf(const ln_args& a) {
  const int lane = threadIdx.x & 31, C = a.C, nv = C / V;
  const long long gw = (long long)blockIdx.x * LNF_WARPS + (threadIdx.x >> 5);
  const long long nw = (long long)gridDim.x * LNF_WARPS;
  const T* x = (const T*)a.x;
  const T* rr = (const T*)a.r;
  auto load = [&](lnf_row<T, V, NV>& row, long long r) {
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = lane + 32 * k;
      if (j < nv) {
        lnf_ld<T, V>(row.p[k], x + r * a.ldx + (long long)j * V);
        if constexpr (RES) lnf_ld<T, V>(row.q[k], rr + r * a.ldr + (long long)j * V);
      }
    }
  };
  lnf_row<T, V, NV> cur{}, nxt{};
  if (LNF_PF(T, V, NV) && gw < a.rows) load(cur, gw);
  for (long long r = gw; r < a.rows; r += nw) {  // uniform over a warp
    if (!LNF_PF(T, V, NV)) {
      load(cur, r);
    } else if (r + nw < a.rows) {
      load(nxt, r + nw);
    }
    float v[NV][V];
    float s = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = lane + 32 * k;
      if (j < nv) {
        lnf_f<T, V>(cur.p[k], v[k]);
        if constexpr (RES) {
          float u[V];
          lnf_f<T, V>(cur.q[k], u);
#pragma unroll
          for (int i = 0; i < V; i++) v[k][i] += u[i];
          ln_round<T, V>(v[k]);
          gpukit_stv<V>((T*)a.sum + r * a.lds + (long long)j * V, v[k]);
        }
#pragma unroll
        for (int i = 0; i < V; i++) s += v[k][i];
      } else {
#pragma unroll
        for (int i = 0; i < V; i++) v[k][i] = 0.0f;
      }
    }
    const float mu = gpukit_warp_sum(s) / (float)C;
    s = 0.0f;
#pragma unroll
    for (int k = 0; k < NV; k++) {
      if (lane + 32 * k < nv) {
#pragma unroll
        for (int i = 0; i < V; i++) {
          const float d = v[k][i] - mu;
          s += d * d;
        }
      }
    }
    const float rs = rsqrtf(gpukit_warp_sum(s) / (float)C + a.eps);
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = lane + 32 * k;
      if (j < nv) {
        float wv[V], bv[V];
        ln_w<V>(a.w, j * V, wv);
        ln_b<V>(a.b, j * V, bv);
#pragma unroll
        for (int i = 0; i < V; i++) v[k][i] = (v[k][i] - mu) * rs * wv[i] + bv[i];
        gpukit_stv<V>((T*)a.y + r * a.ldy + (long long)j * V, v[k]);
      }
    }
    if (lane == 0) {
      if (a.mean) a.mean[r] = mu;
      if (a.rstd) a.rstd[r] = rs;
    }
    if (LNF_PF(T, V, NV)) cur = nxt;
  }
}

// ln_bwdf: see the top. Block b takes rows [b·rpb, (b+1)·rpb), its warps
// every LNF_WARPS-th of them. A lane keeps its columns' partial dw, db in
// registers when E = NV·V ≤ 16, else in its warp's row of the dynamic
// shared memory (LNF_WARPS × 2C floats, which the block's partial row is
// summed from in either case, in warp order).
template <typename T, int V, int NV>
__device__ __forceinline__ void ln_bwdf(const ln_args& a) {
  constexpr bool REG = NV * V <= 16;
  LN_DYN_SMEM(lnf_sh);
  const int lane = threadIdx.x & 31, wi = threadIdx.x >> 5, C = a.C, nv = C / V;
  float* pw = lnf_sh + wi * 2 * C;  // this warp's partial dw; db at pw + C
  const long long r0 = (long long)blockIdx.x * a.rpb;
  const long long r1 = r0 + a.rpb < a.rows ? r0 + a.rpb : a.rows;
  const T* x = (const T*)a.x;
  const T* dy = (const T*)a.dy;
  const T* gs = (const T*)a.gsum;
  const bool part = a.part != nullptr;
  float aw[REG ? NV : 1][V], ab[REG ? NV : 1][V];
#pragma unroll
  for (int k = 0; k < NV; k++) {
    const int j = lane + 32 * k;
#pragma unroll
    for (int i = 0; i < V; i++) {
      if constexpr (REG) {
        aw[k][i] = ab[k][i] = 0.0f;
      } else if (j < nv) {
        pw[j * V + i] = pw[C + j * V + i] = 0.0f;
      }
    }
  }
  auto load = [&](lnf_row<T, V, NV>& row, long long r) {
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = lane + 32 * k;
      if (j < nv) {
        lnf_ld<T, V>(row.p[k], x + r * a.ldx + (long long)j * V);
        lnf_ld<T, V>(row.q[k], dy + r * a.lddy + (long long)j * V);
        if (gs) lnf_ld<T, V>(row.s[k], gs + r * a.ldg + (long long)j * V);
      }
    }
    row.mu = a.mean[r];
    row.rs = a.rstd[r];
  };
  lnf_row<T, V, NV> cur{}, nxt{};
  if (LNF_PF(T, V, NV) && r0 + wi < r1) load(cur, r0 + wi);
  for (long long r = r0 + wi; r < r1; r += LNF_WARPS) {  // uniform over a warp
    if (!LNF_PF(T, V, NV)) {
      load(cur, r);
    } else if (r + LNF_WARPS < r1) {
      load(nxt, r + LNF_WARPS);
    }
    const float mu = cur.mu, rs = cur.rs;
    float xh[NV][V], gw[NV][V];
    float s[2] = {0.0f, 0.0f};
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = lane + 32 * k;
      if (j < nv) {
        float wv[V];
        ln_w<V>(a.w, j * V, wv);
        lnf_f<T, V>(cur.p[k], xh[k]);
        lnf_f<T, V>(cur.q[k], gw[k]);
#pragma unroll
        for (int i = 0; i < V; i++) {
          xh[k][i] = (xh[k][i] - mu) * rs;
          const float g = gw[k][i] * wv[i];
          if (part) {  // dy·ŝ and dy, before gw becomes dy·w
            if constexpr (REG) {
              aw[k][i] = fmaf(gw[k][i], xh[k][i], aw[k][i]);
              ab[k][i] += gw[k][i];
            } else {
              pw[j * V + i] = fmaf(gw[k][i], xh[k][i], pw[j * V + i]);
              pw[C + j * V + i] += gw[k][i];
            }
          }
          gw[k][i] = g;
          s[0] += g;
          s[1] = fmaf(g, xh[k][i], s[1]);
        }
      }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
      s[0] += __shfl_xor_sync(0xffffffffu, s[0], o);
      s[1] += __shfl_xor_sync(0xffffffffu, s[1], o);
    }
    const float m1 = s[0] / (float)C, m2 = s[1] / (float)C;
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = lane + 32 * k;
      if (j < nv) {
        float t[V];
        if (gs) {
          lnf_f<T, V>(cur.s[k], t);
        } else {
#pragma unroll
          for (int i = 0; i < V; i++) t[i] = 0.0f;
        }
#pragma unroll
        for (int i = 0; i < V; i++) t[i] += rs * (gw[k][i] - m1 - xh[k][i] * m2);
        if (a.dx) ln_out<T, V>((T*)a.dx + r * a.lddx + (long long)j * V, t, a.acc_dx);
        if (a.dr) ln_out<T, V>((T*)a.dr + r * a.lddr + (long long)j * V, t, a.acc_dr);
      }
    }
    if (LNF_PF(T, V, NV)) cur = nxt;
  }
  if (!part) return;  // uniform: no dw or db wanted, no fold
  if constexpr (REG) {
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = lane + 32 * k;
      if (j < nv) {
#pragma unroll
        for (int i = 0; i < V; i++) {
          pw[j * V + i] = aw[k][i];
          pw[C + j * V + i] = ab[k][i];
        }
      }
    }
  }
  __syncthreads();
  float* prow = a.part + (long long)blockIdx.x * 2 * C;
  for (int c = threadIdx.x; c < 2 * C; c += LNF_THREADS) {
    float t = 0.0f;
#pragma unroll
    for (int w = 0; w < LNF_WARPS; w++) t += lnf_sh[w * 2 * C + c];
    prow[c] = t;
  }
  ln_fold(a);
}

// Instances.
//
// General: ln_fwd_e<E><s|v>_<dt> and ln_bwd_e<E><s|v>_<dt>, E cached
// elements per thread (8, 16, 32), s: scalar (V = 1), v: vectors of V = 8.
// E = 8 instances also serve block mode (up to 1024 threads).
#define LN_INSTANCE(SUF, T, V, NV, LB)                                                     \
  extern "C" __global__ void __launch_bounds__(LB) ln_fwd_##SUF(const ln_args a) {       \
    if constexpr (GPUKIT_KEEP(ln_fwd_##SUF)) ln_fwd<T, V, NV>(a);                          \
  }                                                                                        \
  extern "C" __global__ void __launch_bounds__(LB) ln_bwd_##SUF(const ln_args a) {       \
    if constexpr (GPUKIT_KEEP(ln_bwd_##SUF)) ln_bwd<T, V, NV>(a);                          \
  }

#define LN_DTYPE(DT, T)                \
  LN_INSTANCE(e8s_##DT, T, 1, 8, 1024) \
  LN_INSTANCE(e16s_##DT, T, 1, 16, 128) \
  LN_INSTANCE(e32s_##DT, T, 1, 32, 128) \
  LN_INSTANCE(e8v_##DT, T, 8, 1, 1024) \
  LN_INSTANCE(e16v_##DT, T, 8, 2, 128) \
  LN_INSTANCE(e32v_##DT, T, 8, 4, 128)

LN_DTYPE(f32, float)
LN_DTYPE(bf16, gpukit_bf16)

// Fast: ln_fwdf_v<V>n<NV>_<dt> (LayerNorm), ln_addf_v<V>n<NV>_<dt>
// (AddLayerNorm) and ln_bwdf_v<V>n<NV>_<dt>, 256 threads, rows of up to
// 32·V·NV elements.
// Rows of up to 16 elements a lane (V·NV ≤ 16) ask for two resident
// blocks a multiprocessor (≤ 128 registers a thread): on an H100 the
// backward at C = 384 ran at 1.2 TB/s with one, its registers (≈ 130)
// leaving half the multiprocessor's warps idle.
#define LNF_MINB(V, NV) ((V) * (NV) <= 16 ? 2 : 1)
#define LNF_INSTANCE(SUF, T, V, NV)                                                                   \
  extern "C" __global__ void __launch_bounds__(LNF_THREADS, LNF_MINB(V, NV))                        \
      ln_fwdf_##SUF(const ln_args a) {                                                                \
    if constexpr (GPUKIT_KEEP(ln_fwdf_##SUF)) ln_fwdf<T, V, NV, false>(a);                            \
  }                                                                                                   \
  extern "C" __global__ void __launch_bounds__(LNF_THREADS, LNF_MINB(V, NV))                        \
      ln_addf_##SUF(const ln_args a) {                                                                \
    if constexpr (GPUKIT_KEEP(ln_addf_##SUF)) ln_fwdf<T, V, NV, true>(a);                             \
  }                                                                                                   \
  extern "C" __global__ void __launch_bounds__(LNF_THREADS, LNF_MINB(V, NV))                        \
      ln_bwdf_##SUF(const ln_args a) {                                                                \
    if constexpr (GPUKIT_KEEP(ln_bwdf_##SUF)) ln_bwdf<T, V, NV>(a);                                   \
  }

#define LNF_DTYPE(DT, T)            \
  LNF_INSTANCE(v4n1_##DT, T, 4, 1) \
  LNF_INSTANCE(v4n2_##DT, T, 4, 2) \
  LNF_INSTANCE(v4n3_##DT, T, 4, 3) \
  LNF_INSTANCE(v4n4_##DT, T, 4, 4) \
  LNF_INSTANCE(v8n1_##DT, T, 8, 1) \
  LNF_INSTANCE(v8n2_##DT, T, 8, 2) \
  LNF_INSTANCE(v8n3_##DT, T, 8, 3) \
  LNF_INSTANCE(v8n4_##DT, T, 8, 4)

LNF_DTYPE(f32, float)
LNF_DTYPE(bf16, gpukit_bf16)
