// rope.cu: rotary position embedding in the rotate_half convention
// (libgpu/ops/rope.go; Su et al. 2021, "RoFormer"; sapientinc/HRM's
// models/layers.py apply_rotary_pos_emb, GPT-NeoX's layout): for a head
// vector x of D elements at position t, x1 = x[:D/2], x2 = x[D/2:],
// c = cos[t], s = sin[t] (rows of D f32),
//
//   forward:  y1 = x1·c1 − x2·s1,  y2 = x2·c2 + x1·s2
//   backward: dx1 = dy1·c1 + dy2·s2,  dx2 = dy2·c2 − dy1·s1   (the transpose)
//
// for heads h < rot; heads h ≥ rot are copied (q and k of a fused qkv
// rotate, v passes). Each thread takes V consecutive pairs (x1[i..i+V),
// x2[i..i+V)) of one head vector, grid-stride, with vector loads and stores
// where the host found the addresses aligned (vec = 4; else 1), and the
// head vector's (b, t, h) decomposed once per item in 32-bit arithmetic
// where the item count allows (narrow): the element-per-thread kernel with
// 64-bit divisions ran at 0.36 ms on HRM's [768, 82, 24, 64] bf16 qkv on a
// GPU machine (2026-11-28, ncu), over five times its memory traffic's time.
// x and y are [B, T, H, D] with element strides for B, T, H (the last
// dimension contiguous), so views of a fused projection need no copy.
// Computed in f32 (HRM casts q and k to the tables' f32 first).
#include "common.cuh"
#include "vec.cuh"

struct rope_args {
  void* y;
  const void* x;
  const float* cos;  // [T', D] contiguous, T' ≥ T: row t is position t
  const float* sin;
  long long n;              // pairs: B·T·H·D/2
  long long xs0, xs1, xs2;  // x's strides of B, T, H (elements)
  long long ys0, ys1, ys2;
  int T, H, half, rot;
  int bwd;     // the transpose (backward)
  int acc;     // add to y
  int vec;     // pairs per thread: 4 (x, y, cos and sin aligned to 4 elements, half % 4 == 0) or 1
  int narrow;  // n / vec + the grid's threads < 2^31: 32-bit indices
};
static_assert(sizeof(rope_args) == 120, "rope_args layout: launch.RopeArgs is generated from it (go generate ./libgpu/kernels/launch)");

template <typename T, int V, typename I>
__device__ void rope_v(const rope_args& a) {
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  const I hv = (I)(a.half / V), H = (I)a.H, TT = (I)a.T;
  const I n = (I)(a.n / V);
  for (I k = (I)blockIdx.x * blockDim.x + threadIdx.x; k < n; k += (I)gridDim.x * blockDim.x) {
    const I i = (k % hv) * V;
    I rest = k / hv;
    const I h = rest % H;
    rest /= H;
    const I t = rest % TT;
    const I b = rest / TT;
    const long long xo = (long long)b * a.xs0 + (long long)t * a.xs1 + (long long)h * a.xs2 + i;
    const long long yo = (long long)b * a.ys0 + (long long)t * a.ys1 + (long long)h * a.ys2 + i;
    float p1[V], p2[V], o1[V], o2[V];
    gpukit_ldv<V>(x + xo, p1);
    gpukit_ldv<V>(x + xo + a.half, p2);
    if ((int)h < a.rot) {
      const long long c = (long long)t * 2 * a.half + i;
      float c1[V], c2[V], s1[V], s2[V];
      gpukit_ldv<V>(a.cos + c, c1);
      gpukit_ldv<V>(a.cos + c + a.half, c2);
      gpukit_ldv<V>(a.sin + c, s1);
      gpukit_ldv<V>(a.sin + c + a.half, s2);
#pragma unroll
      for (int j = 0; j < V; j++) {
        if (a.bwd) {
          o1[j] = p1[j] * c1[j] + p2[j] * s2[j];
          o2[j] = p2[j] * c2[j] - p1[j] * s1[j];
        } else {
          o1[j] = p1[j] * c1[j] - p2[j] * s1[j];
          o2[j] = p2[j] * c2[j] + p1[j] * s2[j];
        }
      }
    } else {
#pragma unroll
      for (int j = 0; j < V; j++) o1[j] = p1[j], o2[j] = p2[j];
    }
    if (a.acc) {
      float q1[V], q2[V];
      gpukit_ldv<V>(y + yo, q1);
      gpukit_ldv<V>(y + yo + a.half, q2);
#pragma unroll
      for (int j = 0; j < V; j++) o1[j] += q1[j], o2[j] += q2[j];
    }
    gpukit_stv<V>(y + yo, o1);
    gpukit_stv<V>(y + yo + a.half, o2);
  }
}

template <typename T>
__device__ void rope(const rope_args& a) {
  if (a.vec == 4) {
    if (a.narrow) {
      rope_v<T, 4, unsigned>(a);
    } else {
      rope_v<T, 4, gpukit_u64>(a);
    }
  } else if (a.narrow) {
    rope_v<T, 1, unsigned>(a);
  } else {
    rope_v<T, 1, gpukit_u64>(a);
  }
}

extern "C" __global__ void rope_f32(const __grid_constant__ rope_args a) { rope<float>(a); }
extern "C" __global__ void rope_bf16(const __grid_constant__ rope_args a) { rope<gpukit_bf16>(a); }
