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
// rotate, v passes). One thread per (x1, x2) pair, grid-stride; x and y are
// [B, T, H, D] with element strides for B, T, H (the last dimension
// contiguous), so views of a fused projection need no copy. Computed in
// f32 (HRM casts q and k to the tables' f32 first).
#include "common.cuh"

struct rope_args {
  void* y;
  const void* x;
  const float* cos;  // [T', D] contiguous, T' ≥ T: row t is position t
  const float* sin;
  long long n;              // pairs: B·T·H·D/2
  long long xs0, xs1, xs2;  // x's strides of B, T, H (elements)
  long long ys0, ys1, ys2;
  int T, H, half, rot;
  int bwd;  // the transpose (backward)
  int acc;  // add to y
};
static_assert(sizeof(rope_args) == 112, "rope_args layout: launch.RopeArgs is generated from it (go generate ./libgpu/kernels/launch)");

template <typename T>
__device__ void rope(const rope_args& a) {
  const T* x = static_cast<const T*>(a.x);
  T* y = static_cast<T*>(a.y);
  GPUKIT_GRID_STRIDE(k, a.n) {
    const long long i = (long long)(k % (gpukit_u64)a.half);
    long long rest = (long long)(k / (gpukit_u64)a.half);
    const long long h = rest % a.H;
    rest /= a.H;
    const long long t = rest % a.T;
    const long long b = rest / a.T;
    const long long xo = b * a.xs0 + t * a.xs1 + h * a.xs2 + i;
    const long long yo = b * a.ys0 + t * a.ys1 + h * a.ys2 + i;
    const float p1 = gpukit_ld(x + xo), p2 = gpukit_ld(x + xo + a.half);
    float o1 = p1, o2 = p2;
    if (h < a.rot) {
      const long long c = t * 2 * a.half + i;
      const float c1 = a.cos[c], c2 = a.cos[c + a.half], s1 = a.sin[c], s2 = a.sin[c + a.half];
      if (a.bwd) {
        o1 = p1 * c1 + p2 * s2;
        o2 = p2 * c2 - p1 * s1;
      } else {
        o1 = p1 * c1 - p2 * s1;
        o2 = p2 * c2 + p1 * s2;
      }
    }
    if (a.acc) {
      o1 += gpukit_ld(y + yo);
      o2 += gpukit_ld(y + yo + a.half);
    }
    gpukit_st(y + yo, o1);
    gpukit_st(y + yo + a.half, o2);
  }
}

extern "C" __global__ void rope_f32(const __grid_constant__ rope_args a) { rope<float>(a); }
extern "C" __global__ void rope_bf16(const __grid_constant__ rope_args a) { rope<gpukit_bf16>(a); }
