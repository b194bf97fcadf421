// matmul.cu: the element-wise halves of the GEMM family (libgpu/ops/matmul.go)
// for when cuBLASLt's fused epilogues are not used: bias and activation after
// a plain GEMM, and the bias gradient as column sums.
#include "common.cuh"

// tanh-form GELU (Hendrycks & Gimpel 2016), what cuBLASLt's GELU epilogues
// compute, in full-precision f32.
__device__ __forceinline__ float mm_gelu_tanh(float z) {
  const float c = 0.7978845608028654f, a = 0.044715f;
  return 0.5f * z * (1.0f + tanhf(c * (z + a * z * z * z)));
}

// act: 0 none, 1 relu, 2 gelu (tanh form): ops.Act's values.
__device__ __forceinline__ float mm_act(float z, int act) {
  if (act == 1) return z > 0.0f ? z : 0.0f;
  if (act == 2) return mm_gelu_tanh(z);
  return z;
}

// mm_bias_act: for every element of d[rows, cols] (row stride ldd):
// z = d + bias[col] (bias may be null); aux[row*cols+col] = z when aux is
// not null; d = act(z).
template <typename T>
__device__ void mm_bias_act(T* d, T* aux, const T* bias, long long rows, int cols,
                            long long ldd, int act) {
  GPUKIT_GRID_STRIDE(i, rows * cols) {
    long long r = (long long)(i / cols);
    int c = (int)(i % cols);
    T* p = d + r * ldd + c;
    float z = gpukit_ld(p);
    if (bias) z += gpukit_ld(bias + c);
    if (aux) gpukit_st(aux + i, z);
    gpukit_st(p, mm_act(z, act));
  }
}

extern "C" __global__ void mm_bias_act_f32(float* d, float* aux, const float* bias, long long rows,
                                           int cols, long long ldd, int act) {
  mm_bias_act<float>(d, aux, bias, rows, cols, ldd, act);
}
extern "C" __global__ void mm_bias_act_bf16(gpukit_bf16* d, gpukit_bf16* aux, const gpukit_bf16* bias,
                                            long long rows, int cols, long long ldd, int act) {
  mm_bias_act<gpukit_bf16>(d, aux, bias, rows, cols, ldd, act);
}

// mm_colsum: out[c] (+)= Σ_r a[r*lda + c] over r in [0, rows), for c in
// [0, cols). Block (32, 8): 32 columns, 8 row groups summed in a fixed
// order through shared memory, so the result is deterministic.
template <typename T>
__device__ void mm_colsum(T* out, const T* a, long long rows, int cols, long long lda, int acc) {
  __shared__ float sh[8][33];
  int c = blockIdx.x * 32 + threadIdx.x;
  float s = 0.0f;
  if (c < cols) {
    for (long long r = threadIdx.y; r < rows; r += 8) s += gpukit_ld(a + r * lda + c);
  }
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < cols) {
    float t = 0.0f;
    for (int k = 0; k < 8; k++) t += sh[k][threadIdx.x];
    if (acc) t += gpukit_ld(out + c);
    gpukit_st(out + c, t);
  }
}

extern "C" __global__ void mm_colsum_f32(float* out, const float* a, long long rows, int cols,
                                         long long lda, int acc) {
  mm_colsum<float>(out, a, rows, cols, lda, acc);
}
extern "C" __global__ void mm_colsum_bf16(gpukit_bf16* out, const gpukit_bf16* a, long long rows,
                                          int cols, long long lda, int acc) {
  mm_colsum<gpukit_bf16>(out, a, rows, cols, lda, acc);
}

// d/dz of the tanh-form GELU: 0.5(1+t) + 0.5 z (1−t²) c (1 + 3a z²),
// t = tanh(c (z + a z³)).
__device__ __forceinline__ float mm_gelu_tanh_grad(float z) {
  const float c = 0.7978845608028654f, a = 0.044715f;
  float t = tanhf(c * (z + a * z * z * z));
  return 0.5f * (1.0f + t) + 0.5f * z * (1.0f - t * t) * c * (1.0f + 3.0f * a * z * z);
}

// mm_act_bwd: dz[i] = dy[i] · act'(z[i]) for i in [0, n) (dz may be dy).
template <typename T>
__device__ void mm_act_bwd(T* dz, const T* dy, const T* z, long long n, int act) {
  GPUKIT_GRID_STRIDE(i, n) {
    float g = gpukit_ld(dy + i), x = gpukit_ld(z + i);
    float d = act == 1 ? (x > 0.0f ? g : 0.0f) : g * mm_gelu_tanh_grad(x);
    gpukit_st(dz + i, d);
  }
}

extern "C" __global__ void mm_act_bwd_f32(float* dz, const float* dy, const float* z, long long n, int act) {
  mm_act_bwd<float>(dz, dy, z, n, act);
}
extern "C" __global__ void mm_act_bwd_bf16(gpukit_bf16* dz, const gpukit_bf16* dy, const gpukit_bf16* z,
                                           long long n, int act) {
  mm_act_bwd<gpukit_bf16>(dz, dy, z, n, act);
}
