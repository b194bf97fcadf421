// routing.cu: dropless token-choice routing of a Mixture-of-Experts layer
// (libgpu/ops/routing.go), all on the device so that a training step needs
// no host synchronisation:
//
//   moe_topk:      per token, the k largest router logits (ties: the lower
//                  expert first) and their softmax over the k chosen, i.e.
//                  the renormalised top-k probabilities (Shazeer et al.
//                  2017; Mixtral's and nanoMoE's router);
//   moe_topk_bwd:  dz[t, e_j] (+)= w_j (dw_j − Σ_i w_i dw_i), 0 elsewhere;
//   moe_count, moe_scan, moe_scatter: a stable counting sort of the T·k
//                  assignments a = t·k + j by expert: per-chunk histograms,
//                  one block scanning them into per-expert counts, offsets
//                  and per-chunk bases, and a scatter giving each assignment
//                  its row in expert order (perm) and each row its
//                  assignment (rows) — within an expert, rows keep token
//                  order, so every launch gives the same permutation;
//   moe_permute:   xs[r] = x[rows[r] / k] (tokens to expert order);
//   moe_permute_bwd: dx[t] (+)= Σ_j dxs[perm[t, j]];
//   moe_combine:   y[t] = Σ_j w[t, j]·ys[perm[t, j]] (back to token order);
//   moe_combine_bwd: dys[perm[t, j]] (+)= w[t, j]·dy[t], dw[t, j] (+)=
//                  ⟨dy[t], ys[perm[t, j]]⟩;
//   moe_aux_rows, moe_aux_cols, moe_aux_final: the Switch load-balancing
//                  loss E·Σ_i f_i·P_i (Fedus et al. 2021, eq. 4; f_i the
//                  assignments to expert i over T, so Σ f_i = k as in
//                  nanoMoE and Mixtral; P_i the mean router probability)
//                  and the router z-loss mean_t logsumexp(z_t)² (Zoph et
//                  al. 2022, ST-MoE, eq. 5), with the gradient
//                  aux·∂L_aux/∂z + zc·∂L_z/∂z of the logits in the same
//                  row pass. Sums are in fixed orders (deterministic).
//
// Expert ids outside [0, E) are clamped into it (memory safety; the router
// never makes them).
#include "common.cuh"
#include "vec.cuh"

#ifndef MOE_DYN_SMEM
#define MOE_DYN_SMEM(name) extern __shared__ int name[]
#endif

#define MOE_KMAX 32
#define MOE_CHUNK 256

__device__ __forceinline__ int moe_clamp(int e, int E) { return min(max(e, 0), E - 1); }

// moe_better: (v, i) beats (u, j): larger value, or equal and lower index.
__device__ __forceinline__ bool moe_better(float v, int i, float u, int j) { return v > u || (v == u && i < j); }

// moe_topk: one warp per token (grid-stride over tokens).
extern "C" __global__ void moe_topk(float* __restrict__ weights, int* __restrict__ experts,
                                    const float* __restrict__ logits, int T, int E, int k) {
  const int lane = threadIdx.x & 31;
  const int warps = gridDim.x * (blockDim.x >> 5);
  for (int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); t < T; t += warps) {
    const float* z = logits + (long long)t * E;
    int chosen[MOE_KMAX];
    float val[MOE_KMAX];
    for (int r = 0; r < k; r++) {
      float bv = -__int_as_float(0x7f800000);
      int bi = 0x7fffffff;
      for (int i = lane; i < E; i += 32) {
        bool taken = false;
        for (int q = 0; q < r; q++) taken = taken || chosen[q] == i;
        if (taken) continue;
        float v = z[i];
        if (v != v) v = -__int_as_float(0x7f800000);  // NaN loses
        if (moe_better(v, i, bv, bi)) bv = v, bi = i;
      }
      for (int o = 16; o > 0; o >>= 1) {
        const float u = __shfl_xor_sync(0xffffffffu, bv, o);
        const int j = __shfl_xor_sync(0xffffffffu, bi, o);
        if (moe_better(u, j, bv, bi)) bv = u, bi = j;
      }
      chosen[r] = bi;
      val[r] = bv;
    }
    float s = 0.0f;
    for (int r = 0; r < k; r++) s += expf(val[r] - val[0]);
    for (int r = lane; r < k; r += 32) {
      float mine = val[0];
      int who = chosen[0];
      for (int q = 1; q < k; q++)
        if (q == r) mine = val[q], who = chosen[q];
      weights[(long long)t * k + r] = expf(mine - val[0]) / s;
      experts[(long long)t * k + r] = who;
    }
  }
}

// moe_topk_bwd: one warp per token; lane i of the row writes the columns
// i, i + 32, ...
extern "C" __global__ void moe_topk_bwd(float* __restrict__ dlogits, const float* __restrict__ dweights,
                                        const float* __restrict__ weights, const int* __restrict__ experts, int T,
                                        int E, int k, int acc) {
  const int lane = threadIdx.x & 31;
  const int warps = gridDim.x * (blockDim.x >> 5);
  for (int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); t < T; t += warps) {
    const float* w = weights + (long long)t * k;
    const float* dw = dweights + (long long)t * k;
    const int* ex = experts + (long long)t * k;
    float s = 0.0f;
    for (int q = 0; q < k; q++) s += w[q] * dw[q];
    float* dz = dlogits + (long long)t * E;
    for (int i = lane; i < E; i += 32) {
      float g = 0.0f;
      for (int q = 0; q < k; q++)
        if (moe_clamp(ex[q], E) == i) g += w[q] * (dw[q] - s);
      dz[i] = acc ? dz[i] + g : g;
    }
  }
}

// moe_count: block c counts the experts of assignments [c·256, c·256 + 256)
// into cc[c][0..E) (dynamic shared memory: E ints).
extern "C" __global__ void moe_count(int* __restrict__ cc, const int* __restrict__ experts, int n, int E) {
  MOE_DYN_SMEM(moe_hist);
  for (int i = threadIdx.x; i < E; i += blockDim.x) moe_hist[i] = 0;
  __syncthreads();
  const int a = blockIdx.x * MOE_CHUNK + threadIdx.x;
  if (a < n) atomicAdd(&moe_hist[moe_clamp(experts[a], E)], 1);
  __syncthreads();
  for (int i = threadIdx.x; i < E; i += blockDim.x) cc[(long long)blockIdx.x * E + i] = moe_hist[i];
}

// moe_scan: one block of 1024 threads. Thread e sums expert e's chunk
// counts (counts[e]); an exclusive scan over experts gives offsets; thread
// e then turns cc[c][e] into the first row of chunk c's assignments to e:
// offsets[e] + Σ_{c' < c} cc[c'][e].
extern "C" __global__ void moe_scan(int* __restrict__ counts, int* __restrict__ offsets, int* __restrict__ cc,
                                    int chunks, int E) {
  __shared__ int sc[1024];
  const int e = threadIdx.x;
  int total = 0;
  if (e < E)
    for (int c = 0; c < chunks; c++) total += cc[(long long)c * E + e];
  sc[e] = e < E ? total : 0;
  __syncthreads();
  for (int o = 1; o < 1024; o <<= 1) {  // inclusive scan (Hillis–Steele)
    const int v = e >= o ? sc[e - o] : 0;
    __syncthreads();
    sc[e] += v;
    __syncthreads();
  }
  if (e < E) {
    const int off = sc[e] - total;
    counts[e] = total;
    offsets[e] = off;
    if (e == E - 1) offsets[E] = sc[e];
    int run = off;
    for (int c = 0; c < chunks; c++) {
      const int v = cc[(long long)c * E + e];
      cc[(long long)c * E + e] = run;
      run += v;
    }
  }
}

// moe_scatter: block c places its 256 assignments: an assignment's rank
// among the chunk's earlier assignments to the same expert, plus the
// chunk's base for that expert.
extern "C" __global__ void moe_scatter(int* __restrict__ perm, int* __restrict__ rows,
                                       const int* __restrict__ experts, const int* __restrict__ cc, int n, int E) {
  __shared__ int ex[MOE_CHUNK];
  const int a = blockIdx.x * MOE_CHUNK + threadIdx.x;
  const int e = a < n ? moe_clamp(experts[a], E) : -1;
  ex[threadIdx.x] = e;
  __syncthreads();
  if (a >= n) return;
  int rank = 0;
  for (int i = 0; i < (int)threadIdx.x; i++) rank += ex[i] == e;
  const int r = cc[(long long)blockIdx.x * E + e] + rank;
  perm[a] = r;
  rows[r] = a;
}

// moe_permute: xs[r, :] = x[rows[r] / k, :] in V-element vectors (V = 1,
// or 16 bytes when the row and both pointers allow).
template <typename T, int V>
__device__ __forceinline__ void moe_permute(T* xs, const T* x, const int* rows, long long nrows, int d, int k) {
  const int dv = d / V;
  GPUKIT_GRID_STRIDE(i, nrows * dv) {
    const long long r = (long long)i / dv;
    const int c = (int)((long long)i % dv) * V;
    const long long t = rows[r] / k;
    if constexpr (V == 1) {
      xs[r * d + c] = x[t * d + c];
    } else {
      *reinterpret_cast<gpukit_u32x4*>(xs + r * d + c) = *reinterpret_cast<const gpukit_u32x4*>(x + t * d + c);
    }
  }
}

// moe_permute_bwd: dx[t, c] (+)= Σ_j dxs[perm[t, j], c], in f32.
template <typename T, int V>
__device__ __forceinline__ void moe_permute_bwd(T* dx, const T* dxs, const int* perm, long long ntok, int d, int k,
                                                int acc) {
  const int dv = d / V;
  GPUKIT_GRID_STRIDE(i, ntok * dv) {
    const long long t = (long long)i / dv;
    const int c = (int)((long long)i % dv) * V;
    float s[V], u[V];
    if (acc) {
      gpukit_ldv<V>(dx + t * d + c, s);
    } else {
#pragma unroll
      for (int v = 0; v < V; v++) s[v] = 0.0f;
    }
    for (int j = 0; j < k; j++) {
      gpukit_ldv<V>(dxs + (long long)perm[t * k + j] * d + c, u);
#pragma unroll
      for (int v = 0; v < V; v++) s[v] += u[v];
    }
    gpukit_stv<V>(dx + t * d + c, s);
  }
}

// moe_combine: y[t, c] = Σ_j w[t, j]·ys[perm[t, j], c], in f32.
template <typename T, int V>
__device__ __forceinline__ void moe_combine(T* y, const T* ys, const float* w, const int* perm, long long ntok, int d,
                                            int k) {
  const int dv = d / V;
  GPUKIT_GRID_STRIDE(i, ntok * dv) {
    const long long t = (long long)i / dv;
    const int c = (int)((long long)i % dv) * V;
    float s[V], u[V];
#pragma unroll
    for (int v = 0; v < V; v++) s[v] = 0.0f;
    for (int j = 0; j < k; j++) {
      const float wj = w[t * k + j];
      gpukit_ldv<V>(ys + (long long)perm[t * k + j] * d + c, u);
#pragma unroll
      for (int v = 0; v < V; v++) s[v] = fmaf(wj, u[v], s[v]);
    }
    gpukit_stv<V>(y + t * d + c, s);
  }
}

// moe_combine_bwd: one warp per token: for each choice j, the dot
// ⟨dy[t], ys[r]⟩ (r = perm[t, j]; lanes over columns, then a warp sum) into
// dw[t, j], and w[t, j]·dy[t] into dys[r].
template <typename T>
__device__ __forceinline__ void moe_combine_bwd(T* dys, float* dw, const T* dy, const T* ys, const float* w,
                                                const int* perm, int ntok, int d, int k, int acc_ys, int acc_w) {
  const int lane = threadIdx.x & 31;
  const int warps = gridDim.x * (blockDim.x >> 5);
  for (int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); t < ntok; t += warps) {
    const T* g = dy + (long long)t * d;
    for (int j = 0; j < k; j++) {
      const long long r = perm[(long long)t * k + j];
      const float wj = w[(long long)t * k + j];
      float s = 0.0f;
      for (int c = lane; c < d; c += 32) {
        const float gv = gpukit_ld(g + c);
        s = fmaf(gv, gpukit_ld(ys + r * d + c), s);
        if (dys) {
          T* p = dys + r * d + c;
          gpukit_st(p, acc_ys ? gpukit_ld(p) + wj * gv : wj * gv);
        }
      }
      s = gpukit_warp_sum(s);
      if (dw && lane == 0) {
        float* p = dw + (long long)t * k + j;
        *p = acc_w ? *p + s : s;
      }
    }
  }
}

#define MOE_INSTANCE(DT, T)                                                                                       \
  extern "C" __global__ void moe_permute_s_##DT(T* xs, const T* x, const int* rows, long long n, int d, int k) {   \
    moe_permute<T, 1>(xs, x, rows, n, d, k);                                                                      \
  }                                                                                                               \
  extern "C" __global__ void moe_permute_v_##DT(T* xs, const T* x, const int* rows, long long n, int d, int k) {   \
    moe_permute<T, 16 / sizeof(T)>(xs, x, rows, n, d, k);                                                         \
  }                                                                                                               \
  extern "C" __global__ void moe_permute_bwd_s_##DT(T* dx, const T* dxs, const int* perm, long long n, int d,      \
                                                    int k, int acc) {                                             \
    moe_permute_bwd<T, 1>(dx, dxs, perm, n, d, k, acc);                                                           \
  }                                                                                                               \
  extern "C" __global__ void moe_permute_bwd_v_##DT(T* dx, const T* dxs, const int* perm, long long n, int d,      \
                                                    int k, int acc) {                                             \
    moe_permute_bwd<T, 8>(dx, dxs, perm, n, d, k, acc);                                                           \
  }                                                                                                               \
  extern "C" __global__ void moe_combine_s_##DT(T* y, const T* ys, const float* w, const int* perm, long long n,   \
                                                int d, int k) {                                                   \
    moe_combine<T, 1>(y, ys, w, perm, n, d, k);                                                                   \
  }                                                                                                               \
  extern "C" __global__ void moe_combine_v_##DT(T* y, const T* ys, const float* w, const int* perm, long long n,   \
                                                int d, int k) {                                                   \
    moe_combine<T, 8>(y, ys, w, perm, n, d, k);                                                                   \
  }                                                                                                               \
  extern "C" __global__ void moe_combine_bwd_##DT(T* dys, float* dw, const T* dy, const T* ys, const float* w,    \
                                                  const int* perm, int n, int d, int k, int acc_ys, int acc_w) {  \
    moe_combine_bwd<T>(dys, dw, dy, ys, w, perm, n, d, k, acc_ys, acc_w);                                         \
  }
MOE_INSTANCE(f32, float)
MOE_INSTANCE(bf16, gpukit_bf16)

// moe_aux_rows: one warp per token: lse[t] = logsumexp(z_t) and, when
// dlogits is given, dz_ti (+)= p_ti·(g_i − Σ_j p_tj g_j) + zc·(2/T)·lse_t·p_ti
// with g_i = aux·E·counts_i/T² (the derivative of aux·E·Σ_i f_i·P_i with
// respect to p_ti, f constant) — the aux and z losses' gradients.
extern "C" __global__ void moe_aux_rows(float* __restrict__ dlogits, float* __restrict__ lse,
                                        const float* __restrict__ logits, const int* __restrict__ counts, int T, int E,
                                        float aux, float zc, int acc) {
  const int lane = threadIdx.x & 31;
  const int warps = gridDim.x * (blockDim.x >> 5);
  const float invT = 1.0f / (float)T;
  const float gscale = aux * (float)E * invT * invT;
  for (int t = blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5); t < T; t += warps) {
    const float* z = logits + (long long)t * E;
    float m = -__int_as_float(0x7f800000);
    for (int i = lane; i < E; i += 32) m = fmaxf(m, z[i]);
    m = gpukit_warp_max(m);
    float s = 0.0f, sg = 0.0f;
    for (int i = lane; i < E; i += 32) {
      const float p = expf(z[i] - m);
      s += p;
      sg += p * (gscale * (float)counts[i]);
    }
    s = gpukit_warp_sum(s);
    sg = gpukit_warp_sum(sg) / s;  // Σ_j p_j g_j
    const float l = m + logf(s);
    if (lane == 0) lse[t] = l;
    if (!dlogits) continue;
    float* dz = dlogits + (long long)t * E;
    const float zs = zc * 2.0f * invT * l;
    for (int i = lane; i < E; i += 32) {
      const float p = expf(z[i] - m) / s;
      const float g = p * (gscale * (float)counts[i] - sg) + zs * p;
      dz[i] = acc ? dz[i] + g : g;
    }
  }
}

// moe_aux_cols: colsum[i] = Σ_t softmax(z_t)_i = Σ_t exp(z_ti − lse_t);
// grid ⌈E/32⌉, block (32, 8): rows strided by 8, the 8 partial sums added
// in a fixed order.
extern "C" __global__ void moe_aux_cols(float* __restrict__ colsum, const float* __restrict__ logits,
                                        const float* __restrict__ lse, int T, int E) {
  __shared__ float part[8][33];
  const int i = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (i < E)
    for (int t = threadIdx.y; t < T; t += 8) s += expf(logits[(long long)t * E + i] - lse[t]);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && i < E) {
    float u = 0.0f;
    for (int r = 0; r < 8; r++) u += part[r][threadIdx.x];
    colsum[i] = u;
  }
}

// moe_aux_final: one block of 256 threads: losses[0] = E·Σ_i (counts_i/T)·
// (colsum_i/T), losses[1] = Σ_t lse_t²/T.
extern "C" __global__ void moe_aux_final(float* __restrict__ losses, const float* __restrict__ colsum,
                                         const int* __restrict__ counts, const float* __restrict__ lse, int T, int E) {
  __shared__ float sh[32];
  const float invT = 1.0f / (float)T;
  float a = 0.0f, z = 0.0f;
  for (int i = threadIdx.x; i < E; i += blockDim.x) a += ((float)counts[i] * invT) * (colsum[i] * invT);
  for (int t = threadIdx.x; t < T; t += blockDim.x) z += lse[t] * lse[t];
  a = gpukit_blk_sum(a, sh);
  z = gpukit_blk_sum(z, sh);
  if (threadIdx.x == 0) {
    losses[0] = (float)E * a;
    losses[1] = z * invT;
  }
}
