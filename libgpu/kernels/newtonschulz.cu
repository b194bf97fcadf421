// newtonschulz.cu: Muon's element-wise and reduction steps around the
// Newton–Schulz orthogonalisation (libgpu/ops/newtonschulz.go; the
// iteration itself is batched GEMMs of the GEMM family). The orthogonalised
// matrix X is f32 or bf16 (one instance per dtype); parameters, gradients
// and momentum buffers are f32. Reductions are deterministic.
#include "common.cuh"

// muon_momentum: over the n elements of one parameter, in chunks slices
// (grid: chunks blocks, blockDim.x a multiple of 32):
//   buf ← μ·buf + g;   u = g + μ·buf (nesterov) or buf
// and part[c] = Σ u² over slice c.
extern "C" __global__ void muon_momentum(const float* g, float* buf, float* part, long long n, int chunks, float mu,
                                         int nesterov) {
  __shared__ float sh[32];
  long long len = (n + chunks - 1) / chunks;
  long long lo = len * blockIdx.x, hi = lo + len < n ? lo + len : n;
  float s = 0.0f;
  for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    float gv = g[i];
    float b = mu * buf[i] + gv;
    buf[i] = b;
    float u = nesterov ? gv + mu * b : b;
    s += u * u;
  }
  s = gpukit_blk_sum(s, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// muon_scale: one thread: out[0] = 1/(√(Σ_c part[c]) + eps).
extern "C" __global__ void muon_scale(const float* part, int chunks, float eps, float* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double s = 0.0;
  for (int c = 0; c < chunks; c++) s += part[c];
  out[0] = (float)(1.0 / (sqrt(s) + (double)eps));
}

// muon_normalize: X = u·scale[0] for the m×n parameter's u (recomputed from
// g and the updated buf as muon_momentum defines it), stored as X[i, j]
// ([m, n]) or, with transpose, X[j, i] ([n, m]).
template <typename T>
__device__ void muon_normalize(const float* g, const float* buf, const float* scale, T* x, int m, int n,
                               int transpose, float mu, int nesterov) {
  long long total = (long long)m * n;
  float s = scale[0];
  GPUKIT_GRID_STRIDE(k, total) {
    float b = buf[k];
    float u = nesterov ? g[k] + mu * b : b;
    long long i = (long long)k / n, j = (long long)k % n;
    long long o = transpose ? j * m + i : (long long)k;
    gpukit_st(x + o, u * s);
  }
}

extern "C" __global__ void muon_normalize_f32(const float* g, const float* buf, const float* scale, float* x, int m,
                                              int n, int transpose, float mu, int nesterov) {
  muon_normalize(g, buf, scale, x, m, n, transpose, mu, nesterov);
}

extern "C" __global__ void muon_normalize_bf16(const float* g, const float* buf, const float* scale,
                                               gpukit_bf16* x, int m, int n, int transpose, float mu, int nesterov) {
  muon_normalize(g, buf, scale, x, m, n, transpose, mu, nesterov);
}

// muon_apply: p ← p·(1 − lr·decay) − lr·scale·o for the m×n parameter, o =
// X[i, j] or, with transpose, X[j, i]; lr is multiplied by lr_scale[0]
// when lr_scale is not null (a schedule a captured graph follows).
template <typename T>
__device__ void muon_apply(float* p, const T* x, int m, int n, int transpose, float lr, float scale, float decay,
                           const float* lr_scale) {
  long long total = (long long)m * n;
  if (lr_scale) lr *= lr_scale[0];
  GPUKIT_GRID_STRIDE(k, total) {
    long long i = (long long)k / n, j = (long long)k % n;
    long long o = transpose ? j * m + i : (long long)k;
    float pv = p[k];
    p[k] = pv * (1.0f - lr * decay) - lr * scale * gpukit_ld(x + o);
  }
}

extern "C" __global__ void muon_apply_f32(float* p, const float* x, int m, int n, int transpose, float lr,
                                          float scale, float decay, const float* lr_scale) {
  muon_apply(p, x, m, n, transpose, lr, scale, decay, lr_scale);
}

extern "C" __global__ void muon_apply_bf16(float* p, const gpukit_bf16* x, int m, int n, int transpose, float lr,
                                           float scale, float decay, const float* lr_scale) {
  muon_apply(p, x, m, n, transpose, lr, scale, decay, lr_scale);
}
