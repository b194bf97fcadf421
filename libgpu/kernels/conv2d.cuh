// conv2d.cuh: the arguments of the implicit-GEMM convolution kernels,
// shared by conv2d.cu (mma.sync) and conv2d_wg.cu (wgmma).
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
