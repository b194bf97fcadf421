// rmsnorm.cu: root-mean-square normalisation over the last dimension,
// forward and backward, alone or after a residual add
// (libgpu/ops/rmsnorm.go; Zhang & Sennrich 2019, "Root Mean Square Layer
// Normalization"; sapientinc/HRM's models/layers.py rms_norm, computed in
// f32 as there):
//
//   forward:  s = x (+ r, rounded to the dtype and stored: AddRMSNorm),
//             ρ = 1/√(Σs²/C + eps), ŝ = s·ρ, y = ŝ·w;
//   backward: g = dy·w, d = ρ·(g − ŝ·Σ(g·ŝ)/C), dx (+)= d, dr (+)= d,
//             gw[row] = dy·ŝ (the rows the Go side sums into dw).
//
// Every kernel takes one rms_args (ops/rmsnorm.go mirrors it: rmsKArgs).
// Rows are row-strided (ld*, in elements); rstd contiguous f32 [rows]; w
// f32 [C] (null: ones); any of r/sum, dx, dr, gw null: absent.
//
// Geometry as softmax.cu (vec.cuh's row groups): a warp or a whole block
// per row, NV vectors of V elements per thread cached in registers, the
// rest (block mode, C > G·NV·V) read again from global memory. With V > 1
// pointers are 16-byte aligned and C and the row strides multiples of V.
#include "common.cuh"
#include "vec.cuh"

struct rms_args {
  void* y;          // forward: [rows, C] (ldy)
  void* sum;        // forward: s = x + r, stored (lds); null without r
  const void* x;    // forward: x (ldx); backward: the normalised input s (ldx)
  const void* r;    // forward: residual addend (ldr); null: none
  const float* w;   // [C]; null: ones
  float* rstd;      // [rows]: the forward writes it (null: not kept), the backward reads it
  const void* dy;   // backward (lddy)
  void* dx;         // backward (lddx); null: not wanted
  void* dr;         // backward: a second copy of dx (lddr); null: not wanted
  float* gw;        // backward: [rows, C] contiguous f32, dy·ŝ; null: no dw wanted
  long long rows;
  long long ldy, lds, ldx, ldr, lddy, lddx, lddr;
  int C;
  int block;  // a whole block per row (else a warp)
  float eps;
  int acc_dx, acc_dr;
};
static_assert(sizeof(rms_args) == 168, "rms_args layout: launch.RmsArgs is generated from it (go generate ./libgpu/kernels/launch)");

// rms_round rounds v[0..V) to T's precision and back (the stored sum).
template <typename T, int V>
__device__ __forceinline__ void rms_round(float* v) {
  if constexpr (sizeof(T) == 2) {
#pragma unroll
    for (int i = 0; i < V; i++) v[i] = gpukit_bf16_to_f32(gpukit_f32_to_bf16(v[i]));
  }
}

// rms_w loads w at columns [c, c+V) (ones where w is null).
template <int V>
__device__ __forceinline__ void rms_w(const float* w, int c, float* wv) {
  if (w) {
    gpukit_ldv<V>(w + c, wv);
  } else {
#pragma unroll
    for (int i = 0; i < V; i++) wv[i] = 1.0f;
  }
}

// rms_load loads the forward's input vector j of row r: x, or x + r
// (rounded to T and stored into sum, when r is given).
template <typename T, int V>
__device__ __forceinline__ void rms_load(const rms_args& a, long long r, int j, float* u) {
  gpukit_ldv<V>(static_cast<const T*>(a.x) + r * a.ldx + (long long)j * V, u);
  if (a.r) {
    float q[V];
    gpukit_ldv<V>(static_cast<const T*>(a.r) + r * a.ldr + (long long)j * V, q);
#pragma unroll
    for (int i = 0; i < V; i++) u[i] += q[i];
    rms_round<T, V>(u);
    gpukit_stv<V>(static_cast<T*>(a.sum) + r * a.lds + (long long)j * V, u);
  }
}

template <typename T, int V, int NV>
__device__ void rms_fwd(const rms_args& a) {
  __shared__ float sh[32];
  const gpukit_group g = gpukit_group_of(a.block);
  const int nv = a.C / V;
  const long long g0 = (long long)blockIdx.x * g.gpb + g.gi, ng = (long long)gridDim.x * g.gpb;
  for (long long r = g0; r < a.rows; r += ng) {  // uniform over a block in block mode
    float xv[NV][V];
    float ss[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
        rms_load<T, V>(a, r, j, xv[k]);
#pragma unroll
        for (int i = 0; i < V; i++) ss[0] += xv[k][i] * xv[k][i];
      }
    }
    for (int j = g.t + NV * g.G; j < nv; j += g.G) {
      float u[V];
      rms_load<T, V>(a, r, j, u);
#pragma unroll
      for (int i = 0; i < V; i++) ss[0] += u[i] * u[i];
    }
    gpukit_group_sum<1>(ss, a.block, sh);
    const float rs = 1.0f / sqrtf(ss[0] / (float)a.C + a.eps);
    if (a.rstd && g.t == 0) a.rstd[r] = rs;
    T* yr = static_cast<T*>(a.y) + r * a.ldy;
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
        float wv[V], o[V];
        rms_w<V>(a.w, j * V, wv);
#pragma unroll
        for (int i = 0; i < V; i++) o[i] = xv[k][i] * rs * wv[i];
        gpukit_stv<V>(yr + (long long)j * V, o);
      }
    }
    for (int j = g.t + NV * g.G; j < nv; j += g.G) {
      float u[V], wv[V];
      // Read back what this thread loaded (the stored sum with r).
      if (a.r) {
        gpukit_ldv<V>(static_cast<const T*>(a.sum) + r * a.lds + (long long)j * V, u);
      } else {
        gpukit_ldv<V>(static_cast<const T*>(a.x) + r * a.ldx + (long long)j * V, u);
      }
      rms_w<V>(a.w, j * V, wv);
#pragma unroll
      for (int i = 0; i < V; i++) u[i] = u[i] * rs * wv[i];
      gpukit_stv<V>(yr + (long long)j * V, u);
    }
  }
}

// rms_out writes d to dx and dr (each added to what it holds with its acc
// flag) for vector j of row r.
template <typename T, int V>
__device__ __forceinline__ void rms_out(const rms_args& a, long long r, int j, const float* d) {
  if (a.dx) {
    T* p = static_cast<T*>(a.dx) + r * a.lddx + (long long)j * V;
    float o[V];
    if (a.acc_dx) {
      gpukit_ldv<V>(p, o);
#pragma unroll
      for (int i = 0; i < V; i++) o[i] += d[i];
      gpukit_stv<V>(p, o);
    } else {
      gpukit_stv<V>(p, d);
    }
  }
  if (a.dr) {
    T* p = static_cast<T*>(a.dr) + r * a.lddr + (long long)j * V;
    float o[V];
    if (a.acc_dr) {
      gpukit_ldv<V>(p, o);
#pragma unroll
      for (int i = 0; i < V; i++) o[i] += d[i];
      gpukit_stv<V>(p, o);
    } else {
      gpukit_stv<V>(p, d);
    }
  }
}

template <typename T, int V, int NV>
__device__ void rms_bwd(const rms_args& a) {
  __shared__ float sh[32];
  const gpukit_group g = gpukit_group_of(a.block);
  const int nv = a.C / V;
  const float invC = 1.0f / (float)a.C;
  const long long g0 = (long long)blockIdx.x * g.gpb + g.gi, ng = (long long)gridDim.x * g.gpb;
  for (long long r = g0; r < a.rows; r += ng) {
    const T* xr = static_cast<const T*>(a.x) + r * a.ldx;
    const T* dyr = static_cast<const T*>(a.dy) + r * a.lddy;
    const float rs = a.rstd[r];
    float xh[NV][V], gv[NV][V];
    float s[1] = {0.0f};
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
        float d[V], wv[V];
        gpukit_ldv<V>(xr + (long long)j * V, xh[k]);
        gpukit_ldv<V>(dyr + (long long)j * V, d);
        rms_w<V>(a.w, j * V, wv);
#pragma unroll
        for (int i = 0; i < V; i++) {
          xh[k][i] *= rs;
          gv[k][i] = d[i] * wv[i];
          s[0] += gv[k][i] * xh[k][i];
        }
        if (a.gw) {
          float p[V];
#pragma unroll
          for (int i = 0; i < V; i++) p[i] = d[i] * xh[k][i];
          gpukit_stv<V>(a.gw + r * (long long)a.C + (long long)j * V, p);
        }
      }
    }
    for (int j = g.t + NV * g.G; j < nv; j += g.G) {
      float u[V], d[V], wv[V];
      gpukit_ldv<V>(xr + (long long)j * V, u);
      gpukit_ldv<V>(dyr + (long long)j * V, d);
      rms_w<V>(a.w, j * V, wv);
#pragma unroll
      for (int i = 0; i < V; i++) s[0] += d[i] * wv[i] * (u[i] * rs);
    }
    gpukit_group_sum<1>(s, a.block, sh);
    const float m = s[0] * invC;
#pragma unroll
    for (int k = 0; k < NV; k++) {
      const int j = g.t + k * g.G;
      if (j < nv) {
        float d[V];
#pragma unroll
        for (int i = 0; i < V; i++) d[i] = rs * (gv[k][i] - xh[k][i] * m);
        rms_out<T, V>(a, r, j, d);
      }
    }
    for (int j = g.t + NV * g.G; j < nv; j += g.G) {
      float u[V], dd[V], wv[V], d[V];
      gpukit_ldv<V>(xr + (long long)j * V, u);
      gpukit_ldv<V>(dyr + (long long)j * V, dd);
      rms_w<V>(a.w, j * V, wv);
#pragma unroll
      for (int i = 0; i < V; i++) {
        const float xhat = u[i] * rs;
        d[i] = rs * (dd[i] * wv[i] - xhat * m);
        u[i] = dd[i] * xhat;
      }
      if (a.gw) gpukit_stv<V>(a.gw + r * (long long)a.C + (long long)j * V, u);
      rms_out<T, V>(a, r, j, d);
    }
  }
}

// Instances: rms_fwd_e<E><s|v>_<dt>, rms_bwd_e<E><s|v>_<dt> as
// softmax.cu's (E elements per thread cached: e8 with block mode).
#define RMS_INSTANCE(SUF, T, V, NV, LB)                                                              \
  extern "C" __global__ void __launch_bounds__(LB) rms_fwd_##SUF(const __grid_constant__ rms_args a) { \
    rms_fwd<T, V, NV>(a);                                                                             \
  }                                                                                                   \
  extern "C" __global__ void __launch_bounds__(LB) rms_bwd_##SUF(const __grid_constant__ rms_args a) { \
    rms_bwd<T, V, NV>(a);                                                                             \
  }

#define RMS_DTYPE(DT, T)                 \
  RMS_INSTANCE(e8s_##DT, T, 1, 8, 1024)  \
  RMS_INSTANCE(e16s_##DT, T, 1, 16, 128) \
  RMS_INSTANCE(e32s_##DT, T, 1, 32, 128) \
  RMS_INSTANCE(e8v_##DT, T, 8, 1, 1024)  \
  RMS_INSTANCE(e16v_##DT, T, 8, 2, 128)  \
  RMS_INSTANCE(e32v_##DT, T, 8, 4, 128)

RMS_DTYPE(f32, float)
RMS_DTYPE(bf16, gpukit_bf16)
