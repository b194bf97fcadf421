// stablemax.cu: stablemax cross-entropy (libgpu/ops/stablemax.go; Prieto
// et al. 2025, "Grokking at the Edge of Numerical Stability";
// sapientinc/HRM's models/losses.py stablemax_cross_entropy, which
// computes in float64): with s(x) = x + 1 for x ≥ 0 and 1/(1 − x) for
// x < 0, p_j = s(x_j)/Σ_k s(x_k),
//
//   ce_i       = log Σ_k s(x_ik) − log s(x_it)              (t = target_i ≥ 0; 0 otherwise)
//   loss       = scale · Σ_g (1/max(n_g, 1)) Σ_{i ∈ g} ce_i  (groups of `group` rows, n_g valid rows)
//   dlogits_ij = scale/max(n_g, 1) · (s'(x_ij)/Σ_k s(x_ik) − [j = t]·s'(x_it)/s(x_it))
//
// with s'(x) = 1 for x ≥ 0, 1/(1 − x)² for x < 0. Every row's arithmetic
// is in double, as HRM's; the loss is summed in double in a fixed order
// (bitwise reproducible). Logits and dlogits are [B, T, V] with element
// strides for B and T (the last dimension contiguous): row i is
// (i / T, i % T). Three kernels on one stream: smx_count (valid rows per
// group), smx_rows (one warp per row: row loss and gradient), smx_reduce
// (one block: the loss).
#include "common.cuh"

struct smx_args {
  float* loss;         // [1]; null: no loss
  double* rl;          // [rows] row losses (scratch)
  float* rowloss;      // [rows] f32 copy for the caller; null: not wanted
  void* dl;            // dlogits; null: none
  const void* x;       // logits
  const int* targets;  // [rows], negative: ignored
  int* counts;         // [ngroups] valid rows per group (smx_count writes)
  long long B, T;      // rows = B·T
  long long xs0, xs1, ds0, ds1;
  long long group;     // rows per group
  int V, ngroups;
  float scale;
  int acc;  // add the gradient to dlogits
};
static_assert(sizeof(smx_args) == 128, "smx_args layout: launch.SmxArgs is generated from it (go generate ./libgpu/kernels/launch)");

__device__ __forceinline__ double smx_s(double x) { return x >= 0.0 ? x + 1.0 : 1.0 / (1.0 - x); }
__device__ __forceinline__ double smx_ds(double x) {
  if (x >= 0.0) return 1.0;
  const double d = 1.0 - x;
  return 1.0 / (d * d);
}

__device__ __forceinline__ double smx_warp_sum(double v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// smx_count: block g counts the rows of group g with a target ≥ 0.
extern "C" __global__ void __launch_bounds__(256) smx_count(const __grid_constant__ smx_args a) {
  __shared__ float sh[32];
  for (long long gi = blockIdx.x; gi < a.ngroups; gi += gridDim.x) {
    float n = 0.0f;
    for (long long i = threadIdx.x; i < a.group; i += blockDim.x) n += a.targets[gi * a.group + i] >= 0 ? 1.0f : 0.0f;
    n = gpukit_blk_sum(n, sh);
    if (threadIdx.x == 0) a.counts[gi] = (int)n;
    __syncthreads();
  }
}

// smx_rows: one warp per row (8 per block), grid-stride over rows.
template <typename TX, typename TG>
__device__ void smx_rows(const smx_args& a) {
  const int lane = threadIdx.x & 31;
  const long long rows = a.B * a.T;
  const long long w0 = (long long)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const long long nw = (long long)gridDim.x * (blockDim.x >> 5);
  for (long long i = w0; i < rows; i += nw) {
    const long long b = i / a.T, t = i % a.T;
    const TX* xr = static_cast<const TX*>(a.x) + b * a.xs0 + t * a.xs1;
    TG* dr = a.dl ? static_cast<TG*>(a.dl) + b * a.ds0 + t * a.ds1 : nullptr;
    const int tg = a.targets[i];
    if (tg < 0 || tg >= a.V) {
      // Ignored (negative), or out of range: NaN (the GPU cannot report it).
      const double ce = tg < 0 ? 0.0 : __longlong_as_double(0x7ff8000000000000LL);
      if (lane == 0) {
        a.rl[i] = ce;
        if (a.rowloss) a.rowloss[i] = (float)ce;
      }
      if (dr && !a.acc) {
        for (int j = lane; j < a.V; j += 32) gpukit_st(dr + j, 0.0f);
      }
      continue;
    }
    double S = 0.0;
    for (int j = lane; j < a.V; j += 32) S += smx_s((double)gpukit_ld(xr + j));
    S = smx_warp_sum(S);
    const double xt = (double)gpukit_ld(xr + tg);
    const double st = smx_s(xt);
    const double ce = log(S) - log(st);
    if (lane == 0) {
      a.rl[i] = ce;
      if (a.rowloss) a.rowloss[i] = (float)ce;
    }
    if (!dr) continue;
    const double w = (double)a.scale / (double)max(a.counts[i / a.group], 1);
    const double invS = 1.0 / S, dt = smx_ds(xt) / st;
    for (int j = lane; j < a.V; j += 32) {
      double d = smx_ds((double)gpukit_ld(xr + j)) * invS;
      if (j == tg) d -= dt;
      float o = (float)(w * d);
      if (a.acc) o += gpukit_ld(dr + j);
      gpukit_st(dr + j, o);
    }
  }
}

// smx_reduce: one block sums rl[i]/max(n_g(i), 1) in double, each thread
// over rows tid, tid + blockDim, ... and then the block in a fixed tree:
// loss = scale·sum.
extern "C" __global__ void __launch_bounds__(1024) smx_reduce(const __grid_constant__ smx_args a) {
  __shared__ double sh[32];
  const long long rows = a.B * a.T;
  double s = 0.0;
  for (long long i = threadIdx.x; i < rows; i += blockDim.x) s += a.rl[i] / (double)max(a.counts[i / a.group], 1);
  s = smx_warp_sum(s);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  if (lane == 0) sh[warp] = s;
  __syncthreads();
  if (warp == 0) {
    s = smx_warp_sum(lane < nw ? sh[lane] : 0.0);
    if (lane == 0) a.loss[0] = (float)((double)a.scale * s);
  }
}

#define SMX_INSTANCE(SUF, TX, TG) \
  extern "C" __global__ void __launch_bounds__(256) smx_rows_##SUF(const __grid_constant__ smx_args a) { smx_rows<TX, TG>(a); }

SMX_INSTANCE(f32_f32, float, float)
SMX_INSTANCE(f32_bf16, float, gpukit_bf16)
SMX_INSTANCE(bf16_f32, gpukit_bf16, float)
SMX_INSTANCE(bf16_bf16, gpukit_bf16, gpukit_bf16)
