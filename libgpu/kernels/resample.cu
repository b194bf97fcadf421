// resample.cu: k×k average pooling and k× nearest upsampling of
// channels-last images, forward and backward (libgpu/ops/resample.go).
// "small" is [N, h, w, C], "large" [N, k·h, k·w, C]; h, w, C are the
// small image's. Each thread owns one output element and reads its ≤ k²
// inputs in (a, b) order: no atomics, deterministic.
//
//   rs_pool_fwd: small = Σ large / k²       rs_pool_bwd: large = small / k²
//   rs_up_fwd:   large = small              rs_up_bwd:   small = Σ large
#include "common.cuh"

// rs_large is the index in the large image of element (n, y·k+a, x·k+b, c).
__device__ __forceinline__ long long rs_large(long long n, int y, int x, int c, int a, int b, int h, int w, int C,
                                              int k) {
  return ((n * h * k + (long long)y * k + a) * ((long long)w * k) + (long long)x * k + b) * C + c;
}

// rs_small_of splits a small-image index.
__device__ __forceinline__ void rs_small_of(long long i, int h, int w, int C, long long* n, int* y, int* x, int* c) {
  *c = (int)(i % C);
  long long q = i / C;
  *x = (int)(q % w);
  q /= w;
  *y = (int)(q % h);
  *n = q / h;
}

template <typename T>
__device__ void rs_to_small(T* out, const T* in, long long n, int h, int w, int C, int k, int acc, float scale) {
  GPUKIT_GRID_STRIDE(i, n) {
    long long nn;
    int y, x, c;
    rs_small_of((long long)i, h, w, C, &nn, &y, &x, &c);
    float t = 0.0f;
    for (int a = 0; a < k; a++)
      for (int b = 0; b < k; b++) t += gpukit_ld(in + rs_large(nn, y, x, c, a, b, h, w, C, k));
    t *= scale;
    if (acc) t += gpukit_ld(out + i);
    gpukit_st(out + i, t);
  }
}

template <typename T>
__device__ void rs_to_large(T* out, const T* in, long long n, int h, int w, int C, int k, int acc, float scale) {
  GPUKIT_GRID_STRIDE(i, n) {
    const int c = (int)((long long)i % C);
    long long q = (long long)i / C;
    const int X = (int)(q % ((long long)w * k));
    q /= (long long)w * k;
    const int Y = (int)(q % ((long long)h * k));
    const long long nn = q / ((long long)h * k);
    float v = gpukit_ld(in + ((nn * h + Y / k) * w + X / k) * C + c) * scale;
    if (acc) v += gpukit_ld(out + i);
    gpukit_st(out + i, v);
  }
}

#define RS_INSTANCE(DT, T)                                                                                   \
  extern "C" __global__ void rs_pool_fwd_##DT(T* y, const T* x, long long n, int h, int w, int C, int k,     \
                                              int acc) {                                                     \
    rs_to_small<T>(y, x, n, h, w, C, k, acc, 1.0f / (float)(k * k));                                         \
  }                                                                                                          \
  extern "C" __global__ void rs_pool_bwd_##DT(T* dx, const T* dy, long long n, int h, int w, int C, int k,   \
                                              int acc) {                                                     \
    rs_to_large<T>(dx, dy, n, h, w, C, k, acc, 1.0f / (float)(k * k));                                       \
  }                                                                                                          \
  extern "C" __global__ void rs_up_fwd_##DT(T* y, const T* x, long long n, int h, int w, int C, int k,       \
                                            int acc) {                                                       \
    rs_to_large<T>(y, x, n, h, w, C, k, acc, 1.0f);                                                          \
  }                                                                                                          \
  extern "C" __global__ void rs_up_bwd_##DT(T* dx, const T* dy, long long n, int h, int w, int C, int k,     \
                                            int acc) {                                                       \
    rs_to_small<T>(dx, dy, n, h, w, C, k, acc, 1.0f);                                                        \
  }

RS_INSTANCE(f32, float)
RS_INSTANCE(bf16, gpukit_bf16)
