// precond.cu: element-wise and reduction steps of the block-diagonal
// preconditioners (Shampoo, SOAP) in libgpu/ops/precond.go. A parameter
// P [m, n] is partitioned into rows × cols blocks of br × bc (the last
// block row and column zero-padded); its "blocked" form is a contiguous
// [rows·cols, br, bc] tensor, block b = bi·cols + bj holding rows
// [bi·br, bi·br + br) and columns [bj·bc, bj·bc + bc). Reductions are
// deterministic (fixed partial order, no float atomics).
#include "common.cuh"

struct pc_geom {
  int m, n, br, bc, cols;
};

// pc_locate maps blocked index e (over rows·cols·br·bc) to the element
// (i, j) of the m×n matrix; false for padding.
__device__ __forceinline__ bool pc_locate(pc_geom g, long long e, int* i, int* j) {
  long long per = (long long)g.br * g.bc;
  long long b = e / per, k = e % per;
  int bi = (int)(b / g.cols), bj = (int)(b % g.cols);
  *i = bi * g.br + (int)(k / g.bc);
  *j = bj * g.bc + (int)(k % g.bc);
  return *i < g.m && *j < g.n;
}

// shampoo_prep: per element of the blocked layout (total = rows·cols·br·bc),
// for the real elements (g = G[i,j]):
//   m ← β1·m + (1−β1)·g                    (when beta1 > 0)
//   v ← v + g² (adagrad) or β2·v + (1−β2)·g²
//   mh = m/bc1 (g when beta1 = 0);  a = mh/(√(v/bc2) + eps)
//   gs = g, gb = mh, ga = a     (blocked; padding gets 0)
// bc1 = 1−β1ᵗ, bc2 = 1−β2ᵗ (1 for adagrad): the arguments, or, when bc is
// not null, bc[0] and bc[1] as a step counter's kernel left them on the
// device (adamw_step), so a replayed graph follows the counter.
extern "C" __global__ void shampoo_prep(pc_geom geo, const float* g, float* m, float* v, float* gs, float* gb,
                                        float* ga, long long total, float beta1, float beta2, float bc1, float bc2,
                                        const float* bc, float eps, int adagrad) {
  if (bc) {
    bc1 = bc[0];
    bc2 = adagrad ? 1.0f : bc[1];
  }
  GPUKIT_GRID_STRIDE(e, total) {
    int i, j;
    if (!pc_locate(geo, (long long)e, &i, &j)) {
      gs[e] = 0.0f;
      gb[e] = 0.0f;
      ga[e] = 0.0f;
      continue;
    }
    long long k = (long long)i * geo.n + j;
    float gv = g[k];
    float mh = gv;
    if (beta1 > 0.0f) {
      float mv = beta1 * m[k] + (1.0f - beta1) * gv;
      m[k] = mv;
      mh = mv / bc1;
    }
    float vv = adagrad ? v[k] + gv * gv : beta2 * v[k] + (1.0f - beta2) * gv * gv;
    v[k] = vv;
    gs[e] = gv;
    gb[e] = mh;
    ga[e] = mh / (sqrtf(vv / bc2) + eps);
  }
}

// pc_sumsq: part[(b·chunks + c)·2 + w] = Σ x_w² over slice c of block b's
// per elements, for the two tensors x0, x1 (x1 may be null: 0). grid
// (chunks, blocks); blockDim.x a multiple of 32.
extern "C" __global__ void pc_sumsq(const float* x0, const float* x1, float* part, long long per, int chunks) {
  __shared__ float sh[32];
  long long b = blockIdx.y;
  long long len = (per + chunks - 1) / chunks;
  long long lo = len * blockIdx.x, hi = lo + len < per ? lo + len : per;
  float s0 = 0.0f, s1 = 0.0f;
  for (long long k = lo + threadIdx.x; k < hi; k += blockDim.x) {
    float a = x0[b * per + k];
    s0 += a * a;
    if (x1) {
      float c = x1[b * per + k];
      s1 += c * c;
    }
  }
  s0 = gpukit_blk_sum(s0, sh);
  s1 = gpukit_blk_sum(s1, sh);
  if (threadIdx.x == 0) {
    part[(b * chunks + blockIdx.x) * 2] = s0;
    part[(b * chunks + blockIdx.x) * 2 + 1] = s1;
  }
}

// pc_graft_scale: scale[b] = ‖x1_b‖/‖x0_b‖ from pc_sumsq's partials (0
// when ‖x0_b‖ is 0), one thread per block.
extern "C" __global__ void pc_graft_scale(const float* part, int chunks, int blocks, float* scale) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= blocks) return;
  double s0 = 0.0, s1 = 0.0;
  for (int c = 0; c < chunks; c++) {
    s0 += part[((long long)b * chunks + c) * 2];
    s1 += part[((long long)b * chunks + c) * 2 + 1];
  }
  scale[b] = s0 > 0.0 ? (float)sqrt(s1 / s0) : 0.0f;
}

// block_apply: per real element (i, j) of P (total = m·n):
//   p ← p − lr·(coef·scale[b]·d[blocked(i, j)] + wd·p)
// scale may be null (1); lr_scale, when not null, multiplies lr (a device
// learning-rate schedule, as adamw_multi's); bc, when not null, holds bias
// corrections {1−β1ᵗ, 1−β2ᵗ} (adamw_step's) and coef is multiplied by
// √bc[1]/bc[0] (Adam's step-size correction, SOAP's).
extern "C" __global__ void block_apply(pc_geom geo, float* p, const float* d, const float* scale, long long total,
                                       float lr, const float* lr_scale, float coef, const float* bc, float wd) {
  if (lr_scale) lr *= *lr_scale;
  if (bc) coef *= sqrtf(bc[1]) / bc[0];
  GPUKIT_GRID_STRIDE(k, total) {
    int i = (int)(k / geo.n), j = (int)(k % geo.n);
    int bi = i / geo.br, bj = j / geo.bc;
    long long b = (long long)bi * geo.cols + bj;
    long long e = (b * geo.br + (i - bi * geo.br)) * geo.bc + (j - bj * geo.bc);
    float s = scale ? scale[b] : 1.0f;
    float pv = p[k];
    p[k] = pv - lr * (coef * s * d[e] + wd * pv);
  }
}

// soap_prep: m ← β1·m + (1−β1)·g over the real elements, and the blocked
// copies gs = g, gm = m (padding 0), total = rows·cols·br·bc.
extern "C" __global__ void soap_prep(pc_geom geo, const float* g, float* m, float* gs, float* gm, long long total,
                                     float beta1) {
  GPUKIT_GRID_STRIDE(e, total) {
    int i, j;
    if (!pc_locate(geo, (long long)e, &i, &j)) {
      gs[e] = 0.0f;
      gm[e] = 0.0f;
      continue;
    }
    long long k = (long long)i * geo.n + j;
    float gv = g[k];
    float mv = beta1 * m[k] + (1.0f - beta1) * gv;
    m[k] = mv;
    gs[e] = gv;
    gm[e] = mv;
  }
}

// soap_adam: Adam in the eigenbasis, per element (r, c) of block b of the
// rotated gradient gr and first moment mr (blocked, total elements): when
// r and c are below the block's real row and column counts,
//   v ← β2·v + (1−β2)·gr²;  out = mr/(√v + eps)
// else out = 0 (the padded coordinates, whose eigenvalues PadDiag made
// the largest, so they come last in the ascending eigenbasis).
extern "C" __global__ void soap_adam(pc_geom geo, const float* gr, const float* mr, float* v, float* out,
                                     long long total, float beta2, float eps) {
  long long per = (long long)geo.br * geo.bc;
  GPUKIT_GRID_STRIDE(e, total) {
    long long b = (long long)e / per, k = (long long)e % per;
    int bi = (int)(b / geo.cols), bj = (int)(b % geo.cols);
    int rr = geo.m - bi * geo.br, rc = geo.n - bj * geo.bc;
    int r = (int)(k / geo.bc), c = (int)(k % geo.bc);
    if (r >= rr || c >= rc) {
      out[e] = 0.0f;
      continue;
    }
    float g = gr[e];
    float vv = beta2 * v[e] + (1.0f - beta2) * g * g;
    v[e] = vv;
    out[e] = mr[e] / (sqrtf(vv) + eps);
  }
}

// pad_diag: one block of threads per matrix b of s ([count, d, d]): with
// real[b] the matrix's real order, the diagonal entries i ≥ real[b] are
// set to 2·Σ_{i<real[b]} s_ii + 1 (above every eigenvalue of the real
// part, which is positive semi-definite). blockDim.x a multiple of 32.
extern "C" __global__ void pad_diag(float* s, const int* real, int d) {
  __shared__ float sh[32];
  long long b = blockIdx.x;
  float* sb = s + b * (long long)d * d;
  int re = real[b];
  float tr = 0.0f;
  for (int i = threadIdx.x; i < re; i += blockDim.x) tr += sb[(long long)i * d + i];
  tr = gpukit_blk_sum(tr, sh);
  for (int i = re + threadIdx.x; i < d; i += blockDim.x) sb[(long long)i * d + i] = 2.0f * tr + 1.0f;
}

// soap_est: SOAP's estimated eigenvalues e_r = Σ_k p[r][k]·q[r][k] for the
// rows r < rows of p = Q·S and Q (d columns each), one warp per row
// (blockDim.x a multiple of 32).
extern "C" __global__ void soap_est(const float* p, const float* q, float* est, int d, long long rows) {
  long long lane = threadIdx.x & 31;
  long long stride = ((long long)gridDim.x * blockDim.x) >> 5;
  for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows; r += stride) {
    float acc = 0.0f;
    for (long long k = lane; k < d; k += 32) acc += p[r * d + k] * q[r * d + k];
    for (int o = 16; o > 0; o >>= 1) acc += __shfl_down_sync(0xffffffffu, acc, o);
    if (lane == 0) est[r] = acc;
  }
}

// soap_key orders estimates with NaN as +∞.
__device__ __forceinline__ float soap_key(float v) { return v == v ? v : __int_as_float(0x7f800000); }

// soap_rank: the stable ascending sort of each matrix's d estimates, one
// thread per estimate: perm[b·d + rank] = i.
extern "C" __global__ void soap_rank(const float* est, int* perm, int d, long long rows) {
  GPUKIT_GRID_STRIDE(r, rows) {
    long long b = (long long)r / d;
    int i = (int)((long long)r % d);
    const float* e = est + b * d;
    float ki = soap_key(e[i]);
    int rank = 0;
    for (int j = 0; j < d; j++) {
      float kj = soap_key(e[j]);
      rank += kj < ki || (kj == ki && j < i);
    }
    perm[b * d + rank] = i;
  }
}

// soap_gather_desc: g's row k of matrix b = p's row perm[b·d + d−1−k]
// (the rows of p in descending order of their estimates).
extern "C" __global__ void soap_gather_desc(const float* p, const int* perm, float* g, int d, long long total) {
  long long dd = (long long)d * d;
  GPUKIT_GRID_STRIDE(e, total) {
    long long b = (long long)e / dd, k = ((long long)e % dd) / d, c = (long long)e % d;
    g[e] = p[(b * d + perm[b * d + d - 1 - k]) * d + c];
  }
}

// soap_basis_commit: where status[b] is 0, q's row k of matrix b = g's row
// d−1−k (back to ascending order); elsewhere q is kept and perm[b] is
// reset to the identity.
extern "C" __global__ void soap_basis_commit(const float* g, float* q, int* perm, const int* status, int d,
                                             long long total) {
  long long dd = (long long)d * d;
  GPUKIT_GRID_STRIDE(e, total) {
    long long b = (long long)e / dd, k = ((long long)e % dd) / d, c = (long long)e % d;
    if (status[b] == 0) {
      q[e] = g[(b * d + d - 1 - k) * d + c];
    } else if (c == 0) {
      perm[b * d + k] = (int)k;
    }
  }
}

// soap_permute: v[b][r][c] = tmp[b][rows[b][r]][cols[b][c]] over blocked
// [count, br, bc] tensors.
extern "C" __global__ void soap_permute(const float* tmp, float* v, const int* rows, const int* cols, int br, int bc,
                                        long long total) {
  long long per = (long long)br * bc;
  GPUKIT_GRID_STRIDE(e, total) {
    long long b = (long long)e / per, r = ((long long)e % per) / bc, c = (long long)e % bc;
    v[e] = tmp[b * per + (long long)rows[b * br + r] * bc + cols[b * bc + c]];
  }
}
