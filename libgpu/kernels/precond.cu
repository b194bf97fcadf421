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

// Element-wise steps over several parameters per launch (multi-tensor, as
// ops_optim.cu's): the parameters travel by value in a __grid_constant__
// struct, PC_MT_MAX per launch; parameter i owns blocks [start[i],
// start[i+1]), each block PC_MT_CHUNK consecutive elements of its range
// (blocked elements for the preps and soap_adam, the parameter's own for
// block_apply). The Go mirrors are generated (libgpu/kernels/launch).
#define PC_MT_MAX 32
#define PC_MT_CHUNK 2048

// pc_mt_range is block blockIdx.x's parameter in a multi-tensor launch
// of args a (any of the pc_*_args: t[i].total elements each) and its
// element range [lo, hi).
template <typename A>
__device__ __forceinline__ int pc_mt_range(const A& a, long long* lo, long long* hi) {
  int ti = gpukit_mt_find(a.start, a.count, blockIdx.x);
  *lo = (long long)(blockIdx.x - a.start[ti]) * PC_MT_CHUNK;
  *hi = *lo + PC_MT_CHUNK < a.t[ti].total ? *lo + PC_MT_CHUNK : a.t[ti].total;
  return ti;
}

struct pc_prep_tensor {
  pc_geom geo;
  const float* g;
  float* m;
  float* v;
  float* gs;
  float* gb;
  float* ga;
  long long total;  // blocked elements: rows·cols·br·bc
};

struct pc_prep_args {
  pc_prep_tensor t[PC_MT_MAX];
  int start[PC_MT_MAX + 1];
  int count;
  float beta1, beta2, bc1, bc2, eps;
  const float* bc;
  int adagrad;
};
static_assert(sizeof(pc_prep_tensor) == 80, "pc_prep_tensor layout: launch.PcPrepTensor is generated from it");

// shampoo_prep_multi: per element of each parameter's blocked layout,
// for the real elements (g = G[i,j]):
//   m ← β1·m + (1−β1)·g                    (when beta1 > 0)
//   v ← v + g² (adagrad) or β2·v + (1−β2)·g²
//   mh = m/bc1 (g when beta1 = 0);  a = mh/(√(v/bc2) + eps)
//   gs = g, gb = mh, ga = a     (blocked; padding gets 0)
// bc1 = 1−β1ᵗ, bc2 = 1−β2ᵗ (1 for adagrad): the arguments, or, when bc is
// not null, bc[0] and bc[1] as a step counter's kernel left them on the
// device (adamw_step), so a replayed graph follows the counter.
extern "C" __global__ void shampoo_prep_multi(const __grid_constant__ pc_prep_args a) {
  long long lo, hi;
  const pc_prep_tensor& T = a.t[pc_mt_range(a, &lo, &hi)];
  float bc1 = a.bc1, bc2 = a.bc2;
  if (a.bc) {
    bc1 = a.bc[0];
    bc2 = a.adagrad ? 1.0f : a.bc[1];
  }
  for (long long e = lo + threadIdx.x; e < hi; e += blockDim.x) {
    int i, j;
    if (!pc_locate(T.geo, e, &i, &j)) {
      T.gs[e] = 0.0f;
      T.gb[e] = 0.0f;
      T.ga[e] = 0.0f;
      continue;
    }
    long long k = (long long)i * T.geo.n + j;
    float gv = T.g[k];
    float mh = gv;
    if (a.beta1 > 0.0f) {
      float mv = a.beta1 * T.m[k] + (1.0f - a.beta1) * gv;
      T.m[k] = mv;
      mh = mv / bc1;
    }
    float vv = a.adagrad ? T.v[k] + gv * gv : a.beta2 * T.v[k] + (1.0f - a.beta2) * gv * gv;
    T.v[k] = vv;
    T.gs[e] = gv;
    T.gb[e] = mh;
    T.ga[e] = mh / (sqrtf(vv / bc2) + a.eps);
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

struct pc_apply_tensor {
  pc_geom geo;
  float* p;
  const float* d;
  const float* scale;  // per block, or null (1)
  long long total;     // m·n
};

struct pc_apply_args {
  pc_apply_tensor t[PC_MT_MAX];
  int start[PC_MT_MAX + 1];
  int count;
  float lr, coef, wd;
  const float* lr_scale;
  const float* bc;
};
static_assert(sizeof(pc_apply_tensor) == 56, "pc_apply_tensor layout: launch.PcApplyTensor is generated from it");

// block_apply_multi: per real element (i, j) of each parameter P:
//   p ← p − lr·(coef·scale[b]·d[blocked(i, j)] + wd·p)
// scale may be null (1); lr_scale, when not null, multiplies lr (a device
// learning-rate schedule, as adamw_multi's); bc, when not null, holds bias
// corrections {1−β1ᵗ, 1−β2ᵗ} (adamw_step's) and coef is multiplied by
// √bc[1]/bc[0] (Adam's step-size correction, SOAP's).
extern "C" __global__ void block_apply_multi(const __grid_constant__ pc_apply_args a) {
  long long lo, hi;
  const pc_apply_tensor& T = a.t[pc_mt_range(a, &lo, &hi)];
  float lr = a.lr_scale ? a.lr * *a.lr_scale : a.lr;
  float coef = a.bc ? a.coef * (sqrtf(a.bc[1]) / a.bc[0]) : a.coef;
  const pc_geom geo = T.geo;
  for (long long k = lo + threadIdx.x; k < hi; k += blockDim.x) {
    int i = (int)(k / geo.n), j = (int)(k % geo.n);
    int bi = i / geo.br, bj = j / geo.bc;
    long long b = (long long)bi * geo.cols + bj;
    long long e = (b * geo.br + (i - bi * geo.br)) * geo.bc + (j - bj * geo.bc);
    float s = T.scale ? T.scale[b] : 1.0f;
    float pv = T.p[k];
    T.p[k] = pv - lr * (coef * s * T.d[e] + a.wd * pv);
  }
}

struct pc_soap_tensor {
  pc_geom geo;
  const float* x;  // soap_prep_multi: g [m, n];    soap_adam_multi: gr (blocked)
  const float* u;  //                 unused;       mr (blocked)
  float* y;        //                 m [m, n];     v (blocked)
  float* w;        //                 gs (blocked); out (blocked)
  float* z;        //                 gm (blocked); unused
  long long total; // blocked elements: rows·cols·br·bc
};

struct pc_soap_args {
  pc_soap_tensor t[PC_MT_MAX];
  int start[PC_MT_MAX + 1];
  int count;
  float beta, eps;
};
static_assert(sizeof(pc_soap_tensor) == 72, "pc_soap_tensor layout: launch.PcSoapTensor is generated from it");

// soap_prep_multi: m ← β·m + (1−β)·g over the real elements, and the
// blocked copies gs = g, gm = m (padding 0).
extern "C" __global__ void soap_prep_multi(const __grid_constant__ pc_soap_args a) {
  long long lo, hi;
  const pc_soap_tensor& T = a.t[pc_mt_range(a, &lo, &hi)];
  for (long long e = lo + threadIdx.x; e < hi; e += blockDim.x) {
    int i, j;
    if (!pc_locate(T.geo, e, &i, &j)) {
      T.w[e] = 0.0f;
      T.z[e] = 0.0f;
      continue;
    }
    long long k = (long long)i * T.geo.n + j;
    float gv = T.x[k];
    float mv = a.beta * T.y[k] + (1.0f - a.beta) * gv;
    T.y[k] = mv;
    T.w[e] = gv;
    T.z[e] = mv;
  }
}

// soap_adam_multi: Adam in the eigenbasis, per element (r, c) of block b
// of the rotated gradient gr and first moment mr: when r and c are below
// the block's real row and column counts,
//   v ← β·v + (1−β)·gr²;  out = mr/(√v + eps)
// else out = 0 (the padded coordinates, whose eigenvalues PadDiag made
// the largest, so they come last in the ascending eigenbasis).
extern "C" __global__ void soap_adam_multi(const __grid_constant__ pc_soap_args a) {
  long long lo, hi;
  const pc_soap_tensor& T = a.t[pc_mt_range(a, &lo, &hi)];
  const pc_geom geo = T.geo;
  long long per = (long long)geo.br * geo.bc;
  for (long long e = lo + threadIdx.x; e < hi; e += blockDim.x) {
    long long b = e / per, k = e % per;
    int bi = (int)(b / geo.cols), bj = (int)(b % geo.cols);
    int rr = geo.m - bi * geo.br, rc = geo.n - bj * geo.bc;
    int r = (int)(k / geo.bc), c = (int)(k % geo.bc);
    if (r >= rr || c >= rc) {
      T.w[e] = 0.0f;
      continue;
    }
    float g = T.x[e];
    float vv = a.beta * T.y[e] + (1.0f - a.beta) * g * g;
    T.y[e] = vv;
    T.w[e] = T.u[e] / (sqrtf(vv) + a.eps);
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
