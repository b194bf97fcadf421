// swiglu.cu: the gate of a SwiGLU MLP (libgpu/ops/swiglu.go; Shazeer 2020,
// "GLU Variants Improve Transformer"; sapientinc/HRM's models/layers.py
// SwiGLU): from the fused projection gu = [gate | up] (each I wide, what
// PyTorch's gate_up_proj(x).chunk(2, dim=-1) splits),
//
//   forward:  y = silu(gate)·up,  silu(g) = g·σ(g)
//   backward: dgate = dy·up·σ(g)(1 + g(1 − σ(g))),  dup = dy·silu(g)
//
// Rows are row-strided (ld*, elements): gu [rows, 2I], y and dy [rows, I],
// dgu [rows, 2I]. One thread per V consecutive columns of a row,
// grid-stride; with V = 8, I, the row strides and every pointer are
// 16-byte aligned multiples (the Go side checks).
#include "common.cuh"
#include "vec.cuh"

struct swiglu_args {
  void* out;       // forward: y; backward: dgu
  const void* gu;  // [rows, 2I]
  const void* dy;  // backward: [rows, I]
  long long rows;
  long long ldo, ldg, lddy;
  int I;
  int acc;  // backward: add to dgu
};
static_assert(sizeof(swiglu_args) == 64, "swiglu_args layout: launch.SwigluArgs is generated from it (go generate ./libgpu/kernels/launch)");

__device__ __forceinline__ float swiglu_sig(float g) { return 1.0f / (1.0f + expf(-g)); }

template <typename T, int V>
__device__ void swiglu_fwd(const swiglu_args& a) {
  const int nv = a.I / V;
  GPUKIT_GRID_STRIDE(k, a.rows * nv) {
    const long long r = (long long)(k / nv), j = (long long)(k % nv) * V;
    const T* g = static_cast<const T*>(a.gu) + r * a.ldg + j;
    float gv[V], uv[V], o[V];
    gpukit_ldv<V>(g, gv);
    gpukit_ldv<V>(g + a.I, uv);
#pragma unroll
    for (int i = 0; i < V; i++) o[i] = gv[i] / (1.0f + expf(-gv[i])) * uv[i];
    gpukit_stv<V>(static_cast<T*>(a.out) + r * a.ldo + j, o);
  }
}

template <typename T, int V>
__device__ void swiglu_bwd(const swiglu_args& a) {
  const int nv = a.I / V;
  GPUKIT_GRID_STRIDE(k, a.rows * nv) {
    const long long r = (long long)(k / nv), j = (long long)(k % nv) * V;
    const T* g = static_cast<const T*>(a.gu) + r * a.ldg + j;
    T* dg = static_cast<T*>(a.out) + r * a.ldo + j;
    float gv[V], uv[V], d[V], og[V], ou[V];
    gpukit_ldv<V>(g, gv);
    gpukit_ldv<V>(g + a.I, uv);
    gpukit_ldv<V>(static_cast<const T*>(a.dy) + r * a.lddy + j, d);
    if (a.acc) {
      gpukit_ldv<V>(dg, og);
      gpukit_ldv<V>(dg + a.I, ou);
    }
#pragma unroll
    for (int i = 0; i < V; i++) {
      const float s = swiglu_sig(gv[i]);
      const float dgate = d[i] * uv[i] * s * (1.0f + gv[i] * (1.0f - s));
      const float dup = d[i] * gv[i] * s;
      og[i] = a.acc ? og[i] + dgate : dgate;
      ou[i] = a.acc ? ou[i] + dup : dup;
    }
    gpukit_stv<V>(dg, og);
    gpukit_stv<V>(dg + a.I, ou);
  }
}

#define SWIGLU_INSTANCE(SUF, T, V)                                                                       \
  extern "C" __global__ void swiglu_fwd_##SUF(const __grid_constant__ swiglu_args a) { swiglu_fwd<T, V>(a); } \
  extern "C" __global__ void swiglu_bwd_##SUF(const __grid_constant__ swiglu_args a) { swiglu_bwd<T, V>(a); }

SWIGLU_INSTANCE(s_f32, float, 1)
SWIGLU_INSTANCE(v_f32, float, 8)
SWIGLU_INSTANCE(s_bf16, gpukit_bf16, 1)
SWIGLU_INSTANCE(v_bf16, gpukit_bf16, 8)
