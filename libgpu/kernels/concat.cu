// concat.cu: concatenation along the last dimension and its split
// (libgpu/ops/concat.go): rows of Ca + Cb elements,
//
//   cat_fwd: y[r, j] = j < Ca ? a[r, j] : b[r, j − Ca]
//   cat_bwd: da[r, j] (+)= dy[r, j] (j < Ca);  db[r, j − Ca] (+)= dy[r, j]
//
// one thread per element of y (da or db null: that part is skipped).
#include "common.cuh"

template <typename T>
__device__ void cat_fwd(T* y, const T* a, const T* b, long long rows, int ca, int cb) {
  const int ct = ca + cb;
  GPUKIT_GRID_STRIDE(i, rows * ct) {
    const long long r = (long long)i / ct;
    const int j = (int)((long long)i % ct);
    y[i] = j < ca ? a[r * ca + j] : b[r * cb + (j - ca)];
  }
}

template <typename T>
__device__ void cat_bwd(T* da, T* db, const T* dy, long long rows, int ca, int cb, int acca, int accb) {
  const int ct = ca + cb;
  GPUKIT_GRID_STRIDE(i, rows * ct) {
    const long long r = (long long)i / ct;
    const int j = (int)((long long)i % ct);
    T* d = j < ca ? da : db;
    if (!d) continue;
    const long long k = j < ca ? r * ca + j : r * cb + (j - ca);
    if (j < ca ? acca : accb) {
      gpukit_st(d + k, gpukit_ld(d + k) + gpukit_ld(dy + i));
    } else {
      d[k] = dy[i];
    }
  }
}

#define CAT_INSTANCE(DT, T)                                                                            \
  extern "C" __global__ void cat_fwd_##DT(T* y, const T* a, const T* b, long long rows, int ca, int cb) { \
    cat_fwd<T>(y, a, b, rows, ca, cb);                                                                 \
  }                                                                                                    \
  extern "C" __global__ void cat_bwd_##DT(T* da, T* db, const T* dy, long long rows, int ca, int cb,   \
                                          int acca, int accb) {                                        \
    cat_bwd<T>(da, db, dy, rows, ca, cb, acca, accb);                                                  \
  }

CAT_INSTANCE(f32, float)
CAT_INSTANCE(bf16, gpukit_bf16)
