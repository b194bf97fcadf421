// matroot.cu: the element-wise and reduction steps of batched inverse
// matrix roots and symmetric eigendecompositions (libgpu/ops/matroot.go;
// the products run through the GEMM family, the eigensolver is cuSOLVER's
// syevd). Every matrix is f32, row-major, n×n, batch item b at b·n².
// Reductions are deterministic: fixed partial order, no float atomics.
#include "common.cuh"

// root_upper: out[b][i][j] = a[b][min(i,j)][max(i,j)], the symmetric
// matrix of a's upper triangle, total = count·n².
extern "C" __global__ void root_upper(const float* a, float* out, long long total, int n) {
  long long nn = (long long)n * n;
  GPUKIT_GRID_STRIDE(i, total) {
    long long b = (long long)i / nn, k = (long long)i % nn;
    long long r = k / n, c = k % n;
    out[i] = r <= c ? a[i] : a[b * nn + c * n + r];
  }
}

// root_partials: for batch item b = blockIdx.y, chunk c = blockIdx.x of
// `chunks` equal slices of its n² elements, part[(b·chunks + c)·2] =
// Σ (a_ij − shift·δ_ij)² and part[(b·chunks + c)·2 + 1] = Σ a_ii over the
// slice. blockDim.x is a multiple of 32.
extern "C" __global__ void root_partials(const float* a, float* part, int n, int chunks, float shift) {
  __shared__ float sh[32];
  long long nn = (long long)n * n;
  long long b = blockIdx.y;
  long long per = (nn + chunks - 1) / chunks;
  long long lo = per * blockIdx.x, hi = lo + per < nn ? lo + per : nn;
  const float* ab = a + b * nn;
  float sq = 0.0f, tr = 0.0f;
  for (long long i = lo + threadIdx.x; i < hi; i += blockDim.x) {
    float v = ab[i];
    bool diag = (i / n) == (i % n);
    float d = diag ? v - shift : v;
    sq += d * d;
    if (diag) tr += v;
  }
  sq = gpukit_blk_sum(sq, sh);
  tr = gpukit_blk_sum(tr, sh);
  if (threadIdx.x == 0) {
    part[(b * chunks + blockIdx.x) * 2] = sq;
    part[(b * chunks + blockIdx.x) * 2 + 1] = tr;
  }
}

// root_scalars: one thread per batch item b (of count): from the partials
// of A (shift 0), the ridge r = eps + releps·‖A‖_F (+ ridge[b] when ridge
// is not null), ‖A + rI‖_F = √(‖A‖_F² + 2r·tr A + n r²), and the coupled
// Newton iteration's scale z = (p+1)/(2‖A + rI‖_F):
// scal[b·4 ..] = {r, z, z^(1/p), ‖A + rI‖_F}.
extern "C" __global__ void root_scalars(const float* part, int chunks, int count, int n, int p, float eps,
                                        float releps, const float* ridge, float* scal) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= count) return;
  double sq = 0.0, tr = 0.0;
  for (int c = 0; c < chunks; c++) {
    sq += part[((long long)b * chunks + c) * 2];
    tr += part[((long long)b * chunks + c) * 2 + 1];
  }
  double r = (double)eps + (double)releps * sqrt(sq);
  if (ridge) r += (double)ridge[b];
  double nrm = sqrt(fmax(sq + 2.0 * r * tr + (double)n * r * r, 1e-300));
  double z = (p + 1.0) / (2.0 * nrm);
  scal[b * 4] = (float)r;
  scal[b * 4 + 1] = (float)z;
  scal[b * 4 + 2] = (float)pow(z, 1.0 / p);
  scal[b * 4 + 3] = (float)nrm;
}

// root_newton_init: M = z(A + rI), X = z^(1/p)·I over total = count·n²
// elements (scal from root_scalars).
extern "C" __global__ void root_newton_init(const float* a, float* m, float* x, const float* scal,
                                            long long total, int n) {
  long long nn = (long long)n * n;
  GPUKIT_GRID_STRIDE(i, total) {
    long long b = (long long)i / nn, k = (long long)i % nn;
    bool diag = (k / n) == (k % n);
    float r = scal[b * 4], z = scal[b * 4 + 1];
    float v = a[i];
    if (diag) v += r;
    m[i] = z * v;
    x[i] = diag ? scal[b * 4 + 2] : 0.0f;
  }
}

// root_newton_t: T = ((p+1)I − M)/p over total elements.
extern "C" __global__ void root_newton_t(const float* m, float* t, long long total, int n, int p) {
  long long nn = (long long)n * n;
  float inv = 1.0f / (float)p;
  GPUKIT_GRID_STRIDE(i, total) {
    long long k = (long long)i % nn;
    float v = -m[i];
    if ((k / n) == (k % n)) v += (float)(p + 1);
    t[i] = v * inv;
  }
}

// root_err: err[b] = √(Σ_c part[(b·chunks + c)·2]) for b < count (the
// Frobenius norm of Y − I from root_partials with shift 1).
extern "C" __global__ void root_err(const float* part, int chunks, int count, float* err) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= count) return;
  double sq = 0.0;
  for (int c = 0; c < chunks; c++) sq += part[((long long)b * chunks + c) * 2];
  err[b] = (float)sqrt(sq);
}

// root_add_ridge: y += r_b·p per batch item (r_b = scal[b·4]), total =
// count·n²: y = X^p·A becomes X^p·(A + rI).
extern "C" __global__ void root_add_ridge(float* y, const float* p, const float* scal, long long total, int n) {
  long long nn = (long long)n * n;
  GPUKIT_GRID_STRIDE(i, total) { y[i] += scal[((long long)i / nn) * 4] * p[i]; }
}

// root_symmetrize: out = (x + xᵀ)/2 per batch item, total = count·n².
extern "C" __global__ void root_symmetrize(const float* x, float* out, long long total, int n) {
  long long nn = (long long)n * n;
  GPUKIT_GRID_STRIDE(i, total) {
    long long b = (long long)i / nn, k = (long long)i % nn;
    long long r = k / n, c = k % n;
    out[i] = 0.5f * (x[i] + x[b * nn + c * n + r]);
  }
}

// root_eig_scale: S[b,i,:] = (max(w[b,i], 0) + r_b)^expo · Q[b,i,:] (rows
// of Q are eigenvectors), total = count·n², r_b = scal[b·4].
extern "C" __global__ void root_eig_scale(const float* q, const float* w, const float* scal, float* s,
                                          long long total, int n, float expo) {
  long long nn = (long long)n * n;
  GPUKIT_GRID_STRIDE(i, total) {
    long long b = (long long)i / nn, row = ((long long)i % nn) / n;
    float lam = fmaxf(w[b * n + row], 0.0f) + scal[b * 4];
    s[i] = powf(lam, expo) * q[i];
  }
}

// root_eig_status: one thread per batch item: ok when syevd's info is 0 and
// every eigenvalue is finite; status[b] = 0 (ok) or 1, and err[b] (when not
// null) 0 or +Inf.
extern "C" __global__ void root_eig_status(const int* info, const float* w, int n, int count, int* status,
                                           float* err) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= count) return;
  bool ok = info[b] == 0;
  for (int i = 0; i < n && ok; i++) {
    float v = w[(long long)b * n + i];
    ok = v == v && fabsf(v) <= 3.402823466e38f;
  }
  status[b] = ok ? 0 : 1;
  if (err) err[b] = ok ? 0.0f : __int_as_float(0x7f800000);
}

// root_status_err: err[b] = 0 where status[b] is 0, else +Inf.
extern "C" __global__ void root_status_err(const int* status, int count, float* err) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b < count) err[b] = status[b] == 0 ? 0.0f : __int_as_float(0x7f800000);
}

// root_err_status: status[b] = 0 where err[b] is below ops.ResidualAccept
// = max(1, 4·2⁻²⁴·√n·‖A + rI‖_F/r) (a usable Newton root; scal from
// root_scalars: r = scal[b·4], ‖A + rI‖_F = scal[b·4 + 3]), else 1 (NaN
// included).
extern "C" __global__ void root_err_status(const float* err, const float* scal, int count, int n, int* status) {
  int b = blockIdx.x * blockDim.x + threadIdx.x;
  if (b >= count) return;
  double r = scal[b * 4], nrm = scal[b * 4 + 3];
  double accept = 1.0;
  if (r > 0.0) accept = fmax(1.0, 4.0 * 5.9604644775390625e-8 * sqrt((double)n) * nrm / r);
  status[b] = (double)err[b] < accept ? 0 : 1;
}

// root_commit: dst[b] = src[b] (per items of `per` elements) for every
// batch item whose status is 0; the others keep what they hold.
extern "C" __global__ void root_commit(const float* src, float* dst, const int* status, long long total,
                                       long long per) {
  GPUKIT_GRID_STRIDE(i, total) {
    if (status[i / per] == 0) dst[i] = src[i];
  }
}

// root_widen / root_narrow: f32 ↔ f64 copies for the double-precision
// eigensolver.
extern "C" __global__ void root_widen(const float* src, double* dst, long long total) {
  GPUKIT_GRID_STRIDE(i, total) { dst[i] = (double)src[i]; }
}

extern "C" __global__ void root_narrow(const double* src, float* dst, long long total) {
  GPUKIT_GRID_STRIDE(i, total) { dst[i] = (float)src[i]; }
}

// qr_signs_f32 / qr_signs_f64: after geqrf over count/n column-major n×n
// matrices at a (R in the upper triangle), sgn[b·n + j] = −1 where
// R[j][j] < 0, else 1 (one thread per diagonal entry, cnt = batch·n).
template <typename T>
__device__ __forceinline__ void qr_signs(const T* a, float* sgn, int n, long long cnt) {
  GPUKIT_GRID_STRIDE(i, cnt) {
    long long b = (long long)i / n, j = (long long)i % n;
    sgn[i] = a[b * n * n + j * n + j] < (T)0 ? -1.0f : 1.0f;
  }
}
extern "C" __global__ void qr_signs_f32(const float* a, float* sgn, int n, long long cnt) { qr_signs(a, sgn, n, cnt); }
extern "C" __global__ void qr_signs_f64(const double* a, float* sgn, int n, long long cnt) { qr_signs(a, sgn, n, cnt); }

// qr_apply_f32 / qr_apply_f64: after orgqr, q (f32, row-major [batch, n,
// n]) = the orthogonal factors at a with column j (row j read row-major)
// multiplied by sgn[b·n + j], so that diag(R) ≥ 0.
template <typename T>
__device__ __forceinline__ void qr_apply(const T* a, const float* sgn, float* q, int n, long long total) {
  long long nn = (long long)n * n;
  GPUKIT_GRID_STRIDE(i, total) {
    long long b = (long long)i / nn, j = ((long long)i % nn) / n;
    q[i] = (float)a[i] * sgn[b * n + j];
  }
}
extern "C" __global__ void qr_apply_f32(const float* a, const float* sgn, float* q, int n, long long total) {
  qr_apply(a, sgn, q, n, total);
}
extern "C" __global__ void qr_apply_f64(const double* a, const float* sgn, float* q, int n, long long total) {
  qr_apply(a, sgn, q, n, total);
}

// qr_status: one block per matrix b of q (nn elements each): status[b] = 0
// when geqrf's and orgqr's infos (info[2b], info[2b + 1]) are 0 and every
// element is finite, else 1.
extern "C" __global__ void qr_status(const int* info, const float* q, long long nn, int* status) {
  __shared__ int bad;
  long long b = blockIdx.x;
  if (threadIdx.x == 0) bad = info[2 * b] != 0 || info[2 * b + 1] != 0;
  __syncthreads();
  for (long long i = threadIdx.x; i < nn; i += blockDim.x) {
    float v = q[b * nn + i];
    if (!(v == v && fabsf(v) <= 3.402823466e38f)) bad = 1;
  }
  __syncthreads();
  if (threadIdx.x == 0) status[b] = bad ? 1 : 0;
}
