// kfac.cu: K-FAC's element-wise and reduction steps (libgpu/ops/kfac.go;
// the factor products and the preconditioning are GEMMs of the GEMM
// family, the inverses the matroot family). Factors, inverses, gradients
// and momentum buffers are f32; activations and output gradients f32 or
// bf16 (one instance per dtype). Reductions are deterministic.
#include "common.cuh"

// kfac_colsum: part[chunk·cols + j] = Σ x[i, j] over the rows i of chunk
// blockIdx.y (rows split in gridDim.y equal slices), x [rows, cols] with
// row stride ld. Block (32, 8): 32 columns, 8 row lanes.
template <typename T>
__device__ void kfac_colsum(const T* x, float* part, long long rows, int cols, long long ld) {
  __shared__ float sh[8][33];
  int j = blockIdx.x * 32 + threadIdx.x;
  long long per = (rows + gridDim.y - 1) / gridDim.y;
  long long lo = per * blockIdx.y, hi = lo + per < rows ? lo + per : rows;
  float s = 0.0f;
  if (j < cols) {
    for (long long i = lo + threadIdx.y; i < hi; i += 8) s += gpukit_ld(x + i * ld + j);
  }
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && j < cols) {
    float t = 0.0f;
    for (int k = 0; k < 8; k++) t += sh[k][threadIdx.x];
    part[(long long)blockIdx.y * cols + j] = t;
  }
}

extern "C" __global__ void kfac_colsum_f32(const float* x, float* part, long long rows, int cols, long long ld) {
  kfac_colsum(x, part, rows, cols, ld);
}

extern "C" __global__ void kfac_colsum_bf16(const gpukit_bf16* x, float* part, long long rows, int cols,
                                            long long ld) {
  kfac_colsum(x, part, rows, cols, ld);
}

// kfac_bias_finish: the homogeneous coordinate's row and column of the
// factor f ([d+1, d+1]): with s_j = Σ_c part[c·d + j], for j < d
//   f[d, j] = f[j, d] = beta·f[d, j] + alpha·s_j    (accumulate)
//   f[d, j] = f[j, d] = alpha·s_j                   (not)
// and f[d, d] = beta·f[d, d] + alpha·rows (or alpha·rows).
extern "C" __global__ void kfac_bias_finish(const float* part, int chunks, float* f, int d, long long rows,
                                            float alpha, float beta, int accumulate) {
  int j = blockIdx.x * blockDim.x + threadIdx.x;
  long long ld = (long long)d + 1;
  if (j < d) {
    float s = 0.0f;
    for (int c = 0; c < chunks; c++) s += part[(long long)c * d + j];
    float v = alpha * s;
    if (accumulate) v += beta * f[(long long)d * ld + j];
    f[(long long)d * ld + j] = v;
    f[(long long)j * ld + d] = v;
  } else if (j == d) {
    float v = alpha * (float)rows;
    if (accumulate) v += beta * f[(long long)d * ld + d];
    f[(long long)d * ld + d] = v;
  }
}

// kfac_damping: one block; traces of a ([da, da]) and g ([dg, dg]), then
// π = √((tr a/da)/(tr g/dg)) (1 when either trace is not positive) and
// ridge_a[0] = π·√λ, ridge_g[0] = √λ/π (Martens & Grosse 2015, §6.3).
extern "C" __global__ void kfac_damping(const float* a, int da, const float* g, int dg, float lambda,
                                        float* ridge_a, float* ridge_g) {
  __shared__ float sh[32];
  float ta = 0.0f, tg = 0.0f;
  for (int i = threadIdx.x; i < da; i += blockDim.x) ta += a[(long long)i * da + i];
  for (int i = threadIdx.x; i < dg; i += blockDim.x) tg += g[(long long)i * dg + i];
  ta = gpukit_blk_sum(ta, sh);
  tg = gpukit_blk_sum(tg, sh);
  if (threadIdx.x == 0) {
    double pi = 1.0;
    if (ta > 0.0f && tg > 0.0f) pi = sqrt(((double)ta / da) / ((double)tg / dg));
    double s = sqrt((double)lambda);
    ridge_a[0] = (float)(pi * s);
    ridge_g[0] = (float)(s / pi);
  }
}

// kfac_gather: out [rows, cols+1] = [gw | gb] (gw [rows, cols], gb [rows]).
extern "C" __global__ void kfac_gather(const float* gw, const float* gb, float* out, int rows, int cols) {
  long long total = (long long)rows * (cols + 1);
  GPUKIT_GRID_STRIDE(k, total) {
    long long i = (long long)k / (cols + 1), j = (long long)k % (cols + 1);
    out[k] = j < cols ? gw[i * cols + j] : gb[i];
  }
}

// kfac_dot: part[blockIdx.x] = Σ v·g over slice blockIdx.x of n elements
// (gridDim.x slices; blockDim.x a multiple of 32).
extern "C" __global__ void kfac_dot(const float* v, const float* g, float* part, long long n) {
  __shared__ float sh[32];
  long long per = (n + gridDim.x - 1) / gridDim.x;
  long long lo = per * blockIdx.x, hi = lo + per < n ? lo + per : n;
  float s = 0.0f;
  for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) s += v[i] * g[i];
  s = gpukit_blk_sum(s, sh);
  if (threadIdx.x == 0) part[blockIdx.x] = s;
}

// kfac_sum: one thread: out[0] = Σ_{c < count} part[c] (in order).
extern "C" __global__ void kfac_sum(const float* part, int count, float* out) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double s = 0.0;
  for (int c = 0; c < count; c++) s += part[c];
  out[0] = (float)s;
}

// kl_clip: one thread: ν = min(1, √(κ/(lr²·Σ_l dots[l]))), 1 when the sum
// is not positive (Ba, Grosse & Martens 2017, "Distributed second-order
// optimization using Kronecker-factored approximations", §5).
extern "C" __global__ void kl_clip(const float* dots, int count, float lr, float kappa, float* nu) {
  if (blockIdx.x != 0 || threadIdx.x != 0) return;
  double s = 0.0;
  for (int l = 0; l < count; l++) s += dots[l];
  double v = 1.0;
  double q = (double)lr * lr * s;
  if (q > 0.0) v = fmin(1.0, sqrt((double)kappa / q));
  nu[0] = (float)v;
}

// kfac_apply: SGD with momentum from the preconditioned gradient v
// ([rows, ld], ld = cols + 1 with a bias, else cols), scaled by ν:
//   u = ν·v + wd·p;  buf ← μ·buf + u;  p ← p − lr·buf
// for the weight p [rows, cols] (and, when b is not null, the bias b
// [rows] from v's last column, without weight decay). nu may be null (1).
extern "C" __global__ void kfac_apply(float* w, float* b, float* bufw, float* bufb, const float* v,
                                      const float* nu, int rows, int cols, float lr, float mu, float wd) {
  int ld = b ? cols + 1 : cols;
  float n = nu ? nu[0] : 1.0f;
  long long total = (long long)rows * ld;
  GPUKIT_GRID_STRIDE(k, total) {
    long long i = (long long)k / ld, j = (long long)k % ld;
    float vv = n * v[k];
    if (j < cols) {
      long long o = i * cols + j;
      float p = w[o];
      float bb = mu * bufw[o] + vv + wd * p;
      bufw[o] = bb;
      w[o] = p - lr * bb;
    } else {
      float bb = mu * bufb[i] + vv;
      bufb[i] = bb;
      b[i] = b[i] - lr * bb;
    }
  }
}
