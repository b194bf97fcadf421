// conv2d.cuh: what the implicit-GEMM convolution kernels of conv2d.cu
// (mma.sync) and conv2d_wg.cu (wgmma) share: their arguments, the gather
// of an output pixel's input (conv_pixel, conv_src) and the epilogue's
// store of a pair of output channels (conv_store2).
#pragma once
#include "common.cuh"

struct conv_igemm_args {
  const gpukit_bf16* x;     // [N, H, W, Cin]
  const gpukit_bf16* w;     // [Cout, KH, KW, Cin]
  const gpukit_bf16* bias;  // [Cout], or null
  gpukit_bf16* y;           // [N, Ho, Wo, Cout]
  int n, h, w_, cin;
  int ho, wo, cout, kh;
  int kw, stride, pad, acc;
};
static_assert(sizeof(conv_igemm_args) == 80, "conv_igemm_args layout: launch.ConvIgemmArgs is generated from it (go generate ./libgpu/kernels/launch)");

// conv_pix is output pixel p's window in the input: its image's first
// pixel (base, in pixels), the input row and column of the window's top
// left (ih0, iw0: may be negative, in the padding), and whether p is an
// output pixel at all (p < N·Ho·Wo).
struct conv_pix {
  long long base;
  int ih0, iw0;
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
