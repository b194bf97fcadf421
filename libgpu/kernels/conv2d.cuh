// conv2d.cuh: what the implicit-GEMM convolution kernels of conv2d.cu
// (mma.sync) and conv2d_wg.cu (wgmma) share: their arguments, the gather
// of an output pixel's input (conv_pixel, conv_src), the fused input map
// applied to a landed tile chunk (conv_prologue) and the epilogue's store
// of a pair of output channels (conv_store2, conv_out2).
#pragma once
#include "common.cuh"
#include "vec.cuh"

struct conv_igemm_args {
  const gpukit_bf16* x;     // [N, H, W, Cin]
  const gpukit_bf16* w;     // [Cout, KH, KW, Cin]
  const gpukit_bf16* bias;  // [Cout], or null
  gpukit_bf16* y;           // [N, Ho, Wo, Cout]
  int n, h, w_, cin;
  int ho, wo, cout, kh;
  int kw, stride, pad, acc;
  // The fused input map and output terms (null: none; conv2d.go's
  // Conv2DFused): the convolution reads SiLU?(x·pro_scale[n, c] +
  // pro_shift[n, c]) wherever the window is in the image (zeros in the
  // padding, as for a separate GroupNorm+SiLU before it: gn_affine writes
  // them), and its output gains nbias[n, co] (a per-sample bias: the time
  // embedding's projection) and res[p, co] (a residual).
  const float* pro_scale;    // [N, Cin] f32
  const float* pro_shift;    // [N, Cin] f32
  const gpukit_bf16* nbias;  // [N, Cout]
  const gpukit_bf16* res;    // [N, Ho, Wo, Cout]
  int pro_silu, pad_;
};
static_assert(sizeof(conv_igemm_args) == 120, "conv_igemm_args layout: launch.ConvIgemmArgs is generated from it (go generate ./libgpu/kernels/launch)");

// conv_pix is output pixel p's window in the input: its image's first
// pixel (base, in pixels), the input row and column of the window's top
// left (ih0, iw0: may be negative, in the padding), and whether p is an
// output pixel at all (p < N·Ho·Wo).
struct conv_pix {
  long long base;
  int img, ih0, iw0;
  bool ok;
};

// conv_pixel places output pixel p for any arguments with conv_igemm_args'
// geometry fields (n, h, w_, ho, wo, stride, pad).
template <typename A>
__device__ __forceinline__ conv_pix conv_pixel(const A& a, long long p) {
  const long long hw = (long long)a.ho * a.wo;
  conv_pix q;
  q.ok = p < (long long)a.n * hw;
  const long long r = q.ok ? p : 0;
  const long long img = r / hw;
  const int rem = (int)(r - img * hw);
  q.ih0 = (rem / a.wo) * a.stride - a.pad;
  q.iw0 = (rem % a.wo) * a.stride - a.pad;
  q.base = img * a.h * a.w_;
  q.img = (int)img;
  return q;
}

// conv_src is the address of input channel ci of q's window at tap (dh,
// dw), or null where that is off the image or q is no pixel (the gathered
// value is 0 there).
template <typename A>
__device__ __forceinline__ const gpukit_bf16* conv_src(const A& a, const conv_pix& q, int dh, int dw, int ci) {
  const int ih = q.ih0 + dh, iw = q.iw0 + dw;
  if (!q.ok || ih < 0 || ih >= a.h || iw < 0 || iw >= a.w_) return nullptr;
  return a.x + ((q.base + (long long)ih * a.w_ + iw) * a.cin + ci);
}

// conv_store2 stores v0, v1 (plus what is there, with acc) as the bf16 pair
// at dst (4-byte aligned).
__device__ __forceinline__ void conv_store2(gpukit_bf16* dst, float v0, float v1, int acc) {
  unsigned* u = (unsigned*)dst;
  if (acc) {
    const unsigned old = *u;
    v0 += __uint_as_float(old << 16);
    v1 += __uint_as_float(old & 0xffff0000u);
  }
  *u = (unsigned)gpukit_f32_to_bf16(v0) | ((unsigned)gpukit_f32_to_bf16(v1) << 16);
}

// conv_prologue maps one landed 16-byte chunk of an A tile in place, at
// generic shared-memory pointer p: 8 input channels ci.. of image img, v =
// x·pro_scale + pro_shift, then v·σ(v) with pro_silu, rounded to bf16 (as
// a separate GroupNorm+SiLU would store it). Call it only for chunks in
// the image (the padding stays zero) and only for a.pro_scale non-null.
__device__ __forceinline__ void conv_prologue(unsigned char* p, const conv_igemm_args& a, int img, int ci) {
  gpukit_u32x4 u = *reinterpret_cast<gpukit_u32x4*>(p);
  const float* sc = a.pro_scale + (long long)img * a.cin + ci;
  const float* sh = a.pro_shift + (long long)img * a.cin + ci;
  unsigned w[4] = {u.a, u.b, u.c, u.d};
#pragma unroll
  for (int j = 0; j < 4; j++) {
    float v0 = __uint_as_float(w[j] << 16) * sc[2 * j] + sh[2 * j];
    float v1 = __uint_as_float(w[j] & 0xffff0000u) * sc[2 * j + 1] + sh[2 * j + 1];
    if (a.pro_silu) {
      v0 = v0 * (1.0f / (1.0f + expf(-v0)));
      v1 = v1 * (1.0f / (1.0f + expf(-v1)));
    }
    w[j] = (unsigned)gpukit_f32_to_bf16(v0) | ((unsigned)gpukit_f32_to_bf16(v1) << 16);
  }
  u.a = w[0];
  u.b = w[1];
  u.c = w[2];
  u.d = w[3];
  *reinterpret_cast<gpukit_u32x4*>(p) = u;
}

// conv_out2 stores output channels col, col+1 (col even, Cout even) of
// output pixel row: v0, v1 plus a.nbias of the pixel's image and a.res
// where present (and what is there, with a.acc).
__device__ __forceinline__ void conv_out2(const conv_igemm_args& a, long long row, int col, float v0, float v1) {
  if (a.nbias) {
    const gpukit_bf16* nb = a.nbias + row / ((long long)a.ho * a.wo) * a.cout + col;
    v0 += gpukit_ld(nb);
    v1 += gpukit_ld(nb + 1);
  }
  if (a.res) {
    const gpukit_bf16* r = a.res + row * a.cout + col;
    v0 += gpukit_ld(r);
    v1 += gpukit_ld(r + 1);
  }
  conv_store2(a.y + row * a.cout + col, v0, v1, a.acc);
}
