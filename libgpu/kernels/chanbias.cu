// chanbias.cu: a per-sample channel bias broadcast over spatial positions,
// and its reduction (libgpu/ops/chanbias.go):
//
//   cb_add:         y[n, s, c] = x[n, s, c] + b[n, c]    (per = S·C elements per sample)
//   cb_sum_partial: part[n][k][c] = Σ_{s in chunk k} x[n, s, c]   (f32)
//   cb_sum_final:   out[n, c] (+)= Σ_k part[n][k][c]
//
// The sums run in a fixed order (rows within a thread, then the block's 8
// row lanes, then the chunks in order): deterministic, no atomics.
#include "common.cuh"
#include "vec.cuh"

template <typename T, int V>
__device__ void cb_add(T* y, const T* x, const T* b, long long n, int C, long long per) {
  const long long nv = n / V;
  GPUKIT_GRID_STRIDE(j, nv) {
    const long long i = (long long)j * V;
    const int c = (int)(i % C);  // V divides C in the vector instance: one row of b
    const long long s = i / per;
    float u[V], w[V];
    gpukit_ldv<V>(x + i, u);
    gpukit_ldv<V>(b + s * C + c, w);
#pragma unroll
    for (int k = 0; k < V; k++) u[k] += w[k];
    gpukit_stv<V>(y + i, u);
  }
  GPUKIT_GRID_STRIDE(t, n - nv * V) {
    const long long i = nv * V + (long long)t;
    gpukit_st(y + i, gpukit_ld(x + i) + gpukit_ld(b + (i / per) * C + i % C));
  }
}

// Block (32, 8) of grid (chunks, ⌈C/32⌉, N): column c = blockIdx.y·32 + tx,
// rows [blockIdx.x·rows, +rows) of sample blockIdx.z, row lane ty.
template <typename T>
__device__ void cb_sum_partial(float* part, const T* x, int S, int C, int rows) {
  __shared__ float sh[8][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int c = blockIdx.y * 32 + tx;
  const long long n = blockIdx.z;
  const int s0 = blockIdx.x * rows, s1 = min(s0 + rows, S);
  float acc = 0.0f;
  if (c < C) {
    for (int s = s0 + ty; s < s1; s += 8) acc += gpukit_ld(x + (n * S + s) * C + c);
  }
  sh[ty][tx] = acc;
  __syncthreads();
  if (ty == 0 && c < C) {
    float t = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; k++) t += sh[k][tx];
    part[(n * gridDim.x + blockIdx.x) * C + c] = t;
  }
}

template <typename T>
__device__ void cb_sum_final(T* out, const float* part, int N, int chunks, int C, int acc) {
  GPUKIT_GRID_STRIDE(i, (long long)N * C) {
    const long long n = (long long)i / C, c = (long long)i % C;
    float t = 0.0f;
    for (int k = 0; k < chunks; k++) t += part[(n * chunks + k) * C + c];
    if (acc) t += gpukit_ld(out + i);
    gpukit_st(out + i, t);
  }
}

#define CB_INSTANCE(DT, T)                                                                             \
  extern "C" __global__ void cb_add_s_##DT(T* y, const T* x, const T* b, long long n, int C,           \
                                           long long per) {                                            \
    cb_add<T, 1>(y, x, b, n, C, per);                                                                  \
  }                                                                                                    \
  extern "C" __global__ void cb_add_v_##DT(T* y, const T* x, const T* b, long long n, int C,           \
                                           long long per) {                                            \
    cb_add<T, 8>(y, x, b, n, C, per);                                                                  \
  }                                                                                                    \
  extern "C" __global__ void cb_sum_partial_##DT(float* part, const T* x, int S, int C, int rows) {    \
    cb_sum_partial<T>(part, x, S, C, rows);                                                            \
  }                                                                                                    \
  extern "C" __global__ void cb_sum_final_##DT(T* out, const float* part, int N, int chunks, int C,    \
                                               int acc) {                                              \
    cb_sum_final<T>(out, part, N, chunks, C, acc);                                                     \
  }

CB_INSTANCE(f32, float)
CB_INSTANCE(bf16, gpukit_bf16)
