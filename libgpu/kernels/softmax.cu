// softmax.cu: softmax over the last dimension, forward and backward
// (libgpu/ops/softmax.go):
//
//   y = exp(x − max x) / Σ exp(x − max x)      (the maximum subtracted for
//                                              stability; it cancels)
//   dx = y·(dy − Σ y·dy)
//
// Geometry as layernorm.cu (vec.cuh's row groups): a warp or a whole block
// per row, NV vectors of V elements per thread cached in registers, the rest
// (block mode, C > G·NV·V) read again from global memory. Rows are
// row-strided; with V > 1 pointers are 16-byte aligned and C and the row
// strides multiples of V.
#include "common.cuh"
#include "vec.cuh"

template <typename T, int V, int NV>
__device__ void sm_fwd(T* y, const T* x, long long rows, int C, long long ldx, long long ldy, int block) {
  __shared__ float sh[32];
  const gpukit_group g = gpukit_group_of(block);
  const int nv = C / V;
  const long long g0 = (long long)blockIdx.x * g.gpb + g.gi, ng = (long long)gridDim.x * g.gpb;
  for (long long r = g0; r < rows; r += ng) {  // uniform over a block in block mode
    const T* xr = x + r * ldx;
    T* yr = y + r * ldy;
    float xv[NV][V];
    float m = -__int_as_float(0x7f800000);
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
        gpukit_ldv<V>(xr + (long long)j * V, xv[k]);
#pragma unroll
        for (int i = 0; i < V; i++) m = fmaxf(m, xv[k][i]);
      }
    }
    for (int j = g.t + NV * g.G; j < nv; j += g.G) {
      float u[V];
      gpukit_ldv<V>(xr + (long long)j * V, u);
#pragma unroll
      for (int i = 0; i < V; i++) m = fmaxf(m, u[i]);
    }
    m = gpukit_group_max(m, block, sh);
    float s[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < NV; k++) {
      if (g.t + k * g.G < nv) {
#pragma unroll
        for (int i = 0; i < V; i++) {
          xv[k][i] = expf(xv[k][i] - m);
          s[0] += xv[k][i];
        }
      }
    }
    for (int j = g.t + NV * g.G; j < nv; j += g.G) {
      float u[V];
      gpukit_ldv<V>(xr + (long long)j * V, u);
#pragma unroll
      for (int i = 0; i < V; i++) s[0] += expf(u[i] - m);
    }
    gpukit_group_sum<1>(s, block, sh);
    const float inv = 1.0f / s[0];
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
        float o[V];
#pragma unroll
        for (int i = 0; i < V; i++) o[i] = xv[k][i] * inv;
        gpukit_stv<V>(yr + (long long)j * V, o);
      }
    }
    for (int j = g.t + NV * g.G; j < nv; j += g.G) {
      float u[V];
      gpukit_ldv<V>(xr + (long long)j * V, u);
#pragma unroll
      for (int i = 0; i < V; i++) u[i] = expf(u[i] - m) * inv;
      gpukit_stv<V>(yr + (long long)j * V, u);
    }
  }
}

template <typename T, int V, int NV>
__device__ void sm_bwd(T* dx, const T* dy, const T* y, long long rows, int C, long long lddx,
                       long long lddy, long long ldy, int block, int acc) {
  __shared__ float sh[32];
  const gpukit_group g = gpukit_group_of(block);
  const int nv = C / V;
  const long long g0 = (long long)blockIdx.x * g.gpb + g.gi, ng = (long long)gridDim.x * g.gpb;
  for (long long r = g0; r < rows; r += ng) {
    const T* yr = y + r * ldy;
    const T* gr = dy + r * lddy;
    T* dxr = dx + r * lddx;
    float yv[NV][V], gv[NV][V];
    float s[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
        gpukit_ldv<V>(yr + (long long)j * V, yv[k]);
        gpukit_ldv<V>(gr + (long long)j * V, gv[k]);
#pragma unroll
        for (int i = 0; i < V; i++) s[0] += yv[k][i] * gv[k][i];
      }
    }
    for (int j = g.t + NV * g.G; j < nv; j += g.G) {
      float u[V], d[V];
      gpukit_ldv<V>(yr + (long long)j * V, u);
      gpukit_ldv<V>(gr + (long long)j * V, d);
#pragma unroll
      for (int i = 0; i < V; i++) s[0] += u[i] * d[i];
    }
    gpukit_group_sum<1>(s, block, sh);
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
        float o[V];
        if (acc) gpukit_ldv<V>(dxr + (long long)j * V, o);
#pragma unroll
        for (int i = 0; i < V; i++) {
          const float d = yv[k][i] * (gv[k][i] - s[0]);
          o[i] = acc ? o[i] + d : d;
        }
        gpukit_stv<V>(dxr + (long long)j * V, o);
      }
    }
    for (int j = g.t + NV * g.G; j < nv; j += g.G) {
      float u[V], d[V], o[V];
      gpukit_ldv<V>(yr + (long long)j * V, u);
      gpukit_ldv<V>(gr + (long long)j * V, d);
      if (acc) gpukit_ldv<V>(dxr + (long long)j * V, o);
#pragma unroll
      for (int i = 0; i < V; i++) {
        const float e = u[i] * (d[i] - s[0]);
        o[i] = acc ? o[i] + e : e;
      }
      gpukit_stv<V>(dxr + (long long)j * V, o);
    }
  }
}

// Instances: sm_fwd_e<E><s|v>_<dt>, sm_bwd_e<E><s|v>_<dt> as layernorm.cu's.
#define SM_INSTANCE(SUF, T, V, NV, LB)                                                          \
  extern "C" __global__ void __launch_bounds__(LB)                                             \
      sm_fwd_##SUF(T* y, const T* x, long long rows, int C, long long ldx, long long ldy,       \
                   int block) {                                                                \
    sm_fwd<T, V, NV>(y, x, rows, C, ldx, ldy, block);                                          \
  }                                                                                             \
  extern "C" __global__ void __launch_bounds__(LB)                                             \
      sm_bwd_##SUF(T* dx, const T* dy, const T* y, long long rows, int C, long long lddx,      \
                   long long lddy, long long ldy, int block, int acc) {                        \
    sm_bwd<T, V, NV>(dx, dy, y, rows, C, lddx, lddy, ldy, block, acc);                         \
  }

#define SM_DTYPE(DT, T)                 \
  SM_INSTANCE(e8s_##DT, T, 1, 8, 1024)  \
  SM_INSTANCE(e16s_##DT, T, 1, 16, 128) \
  SM_INSTANCE(e32s_##DT, T, 1, 32, 128) \
  SM_INSTANCE(e8v_##DT, T, 8, 1, 1024)  \
  SM_INSTANCE(e16v_##DT, T, 8, 2, 128)  \
  SM_INSTANCE(e32v_##DT, T, 8, 4, 128)

SM_DTYPE(f32, float)
SM_DTYPE(bf16, gpukit_bf16)
