// conv2d_tma.cu: the wgmma convolution with TMA loads — the forward,
// conv_wg_fwd_tma_<BN>, and the weight gradient, conv_wg_dw_tma_<BN>
// (conv2d_wg.cuh's conv_wg_fwd and conv_wg_dw on cw_mainloop_ws with one
// producer thread issuing the im2col and tiled copies; tma.cuh), in a
// module of its own. ops/conv2d.go's convTMA launches it by default where
// the wgmma kernels run (GPUKIT_CONV_TMA=0: not), with the tensor maps
// libgpu/cuda encodes for each launch. scripts/cuda-check.sh compiles the
// wgmma code with GPUKIT_CHECK_SM90 defined.
#include "conv2d_wg.cuh"

#ifdef GPUKIT_WGMMA
// conv_wg_fwd_tma_<BN>: conv_wg_fwd_ws_<BN> with TMA loads (ops/conv2d.go's
// convTMA; the shapes wgOK takes, without a fused input map).
extern "C" __global__ void __launch_bounds__(CW_WS_THREADS, 1) conv_wg_fwd_tma_64(const __grid_constant__ conv_tma_args t) {
  conv_wg_fwd<64, 4, true, true>(t.a, &t);
}
extern "C" __global__ void __launch_bounds__(CW_WS_THREADS, 1) conv_wg_fwd_tma_128(const __grid_constant__ conv_tma_args t) {
  conv_wg_fwd<128, 4, true, true>(t.a, &t);
}
extern "C" __global__ void __launch_bounds__(CW_WS_THREADS, 1) conv_wg_fwd_tma_256(const __grid_constant__ conv_tma_args t) {
  conv_wg_fwd<256, 4, true, true>(t.a, &t);
}
// conv_wg_dw_tma_<BN>: conv_wg_dw_ws_<BN> with TMA loads (ops/conv2d.go's
// convWgDW with convTMA).
extern "C" __global__ void __launch_bounds__(CW_WS_THREADS, 1) conv_wg_dw_tma_64(const __grid_constant__ conv_tma_dw_args t) {
  conv_wg_dw<64, 4, true, true>(t.a, &t);
}
extern "C" __global__ void __launch_bounds__(CW_WS_THREADS, 1) conv_wg_dw_tma_128(const __grid_constant__ conv_tma_dw_args t) {
  conv_wg_dw<128, 4, true, true>(t.a, &t);
}
#else
// Compiled for a target without wgmma: ops/conv2d.go launches these only
// where conv2d_wg.cu's kernels exist (the same target).
extern "C" __global__ void conv_tma_unavailable() {}
#endif  // GPUKIT_WGMMA
