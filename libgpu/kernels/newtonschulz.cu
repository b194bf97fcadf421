// newtonschulz.cu: Muon's element-wise and reduction steps around the
// Newton–Schulz orthogonalisation (libgpu/ops/newtonschulz.go; the
// iteration itself is batched GEMMs of the GEMM family). The orthogonalised
// matrix X is f32 or bf16 (one instance per dtype); parameters, gradients
// and momentum buffers are f32. Reductions are deterministic.
#include "common.cuh"

// Several weights per launch (multi-tensor, as ops_optim.cu's): the
// weights travel by value in a __grid_constant__ struct, MUON_MT_MAX per
// launch; weight i owns blocks [start[i], start[i+1]), each block
// MUON_MT_CHUNK consecutive elements of it. The Go mirrors are generated
// (libgpu/kernels/launch).
#define MUON_MT_MAX 32
#define MUON_MT_CHUNK 2048

struct muon_tensor {
  const float* g;   // [m, n] gradient (prep)
  float* buf;       // [m, n] momentum buffer (prep, updated)
  float* p;         // [m, n] parameter (apply, updated)
  void* x;          // the orthogonalised matrix: [m, n] or, with transpose, [n, m]; f32 or bf16
  int m, n;
  int transpose;
  float scale;      // apply: the weight's step scale, √max(1, m/n)
};

struct muon_args {
  muon_tensor t[MUON_MT_MAX];
  int start[MUON_MT_MAX + 1];
  int count;
  float mu, eps;
  int nesterov;
  float* part;            // [grid]: each block's Σu² (prep)
  float* inv;             // [count]: each weight's 1/(‖u‖_F + ε) (prep)
  float lr, decay;        // apply
  const float* lr_scale;  // apply: null, or a device scalar multiplying lr
};
static_assert(sizeof(muon_tensor) == 48, "muon_tensor layout: launch.MuonTensor is generated from it");

// muon_tensor_range is block blockIdx.x's weight and element range.
__device__ __forceinline__ int muon_range(const muon_args& a, long long* lo, long long* hi) {
  int ti = gpukit_mt_find(a.start, a.count, blockIdx.x);
  long long total = (long long)a.t[ti].m * a.t[ti].n;
  *lo = (long long)(blockIdx.x - a.start[ti]) * MUON_MT_CHUNK;
  *hi = *lo + MUON_MT_CHUNK < total ? *lo + MUON_MT_CHUNK : total;
  return ti;
}

// muon_momentum_multi: over each weight's elements (blockDim.x a multiple
// of 32):
//   buf ← μ·buf + g;   u = g + μ·buf (nesterov) or buf
// and part[blockIdx.x] = Σ u² over the block's elements.
extern "C" __global__ void muon_momentum_multi(const __grid_constant__ muon_args a) {
  __shared__ float sh[32];
  long long lo, hi;
  const muon_tensor& T = a.t[muon_range(a, &lo, &hi)];
  float s = 0.0f;
  for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    float gv = T.g[i];
    float b = a.mu * T.buf[i] + gv;
    T.buf[i] = b;
    float u = a.nesterov ? gv + a.mu * b : b;
    s += u * u;
  }
  s = gpukit_blk_sum(s, sh);
  if (threadIdx.x == 0) a.part[blockIdx.x] = s;
}

// muon_scale_multi: one thread per weight: inv[i] = 1/(√(Σ part over the
// weight's blocks) + eps), summed in double in block order.
extern "C" __global__ void muon_scale_multi(const __grid_constant__ muon_args a) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= a.count) return;
  double s = 0.0;
  for (int c = a.start[i]; c < a.start[i + 1]; c++) s += a.part[c];
  a.inv[i] = (float)(1.0 / (sqrt(s) + (double)a.eps));
}

// muon_normalize_multi: X = u·inv[i] for each weight's u (recomputed from
// g and the updated buf as muon_momentum_multi defines it), stored as
// X[r, c] ([m, n]) or, with transpose, X[c, r] ([n, m]).
template <typename T>
__device__ void muon_normalize_multi(const muon_args& a) {
  long long lo, hi;
  int ti = muon_range(a, &lo, &hi);
  const muon_tensor& W = a.t[ti];
  T* x = (T*)W.x;
  float s = a.inv[ti];
  for (long long k = lo + threadIdx.x; k < hi; k += blockDim.x) {
    float b = W.buf[k];
    float u = a.nesterov ? W.g[k] + a.mu * b : b;
    long long i = k / W.n, j = k % W.n;
    long long o = W.transpose ? j * W.m + i : k;
    gpukit_st(x + o, u * s);
  }
}

extern "C" __global__ void muon_normalize_multi_f32(const __grid_constant__ muon_args a) {
  muon_normalize_multi<float>(a);
}

extern "C" __global__ void muon_normalize_multi_bf16(const __grid_constant__ muon_args a) {
  muon_normalize_multi<gpukit_bf16>(a);
}

// muon_apply_multi: p ← p·(1 − lr·decay) − lr·scale·o for each weight, o =
// X[r, c] or, with transpose, X[c, r]; lr is multiplied by lr_scale[0]
// when lr_scale is not null (a schedule a captured graph follows).
template <typename T>
__device__ void muon_apply_multi(const muon_args& a) {
  long long lo, hi;
  const muon_tensor& W = a.t[muon_range(a, &lo, &hi)];
  const T* x = (const T*)W.x;
  float lr = a.lr_scale ? a.lr * a.lr_scale[0] : a.lr;
  for (long long k = lo + threadIdx.x; k < hi; k += blockDim.x) {
    long long i = k / W.n, j = k % W.n;
    long long o = W.transpose ? j * W.m + i : k;
    float pv = W.p[k];
    W.p[k] = pv * (1.0f - lr * a.decay) - lr * W.scale * gpukit_ld(x + o);
  }
}

extern "C" __global__ void muon_apply_multi_f32(const __grid_constant__ muon_args a) { muon_apply_multi<float>(a); }

extern "C" __global__ void muon_apply_multi_bf16(const __grid_constant__ muon_args a) {
  muon_apply_multi<gpukit_bf16>(a);
}
