// conv2d_wg.cu: 2-D convolution as implicit GEMMs on Hopper's warpgroup
// MMA (sm_90a), beside conv2d.cu's mma.sync kernel: the forward (and, on
// flipped filters, the stride-1 input gradient) and the weight gradient,
// channels-last bf16 with f32 accumulation. A file of its own so that a
// module that does not build leaves conv2d.cu's kernels working:
// libgpu/ops/conv2d.go launches these only when this module has them
// (convHopper). The mainloops and kernel bodies are conv2d_wg.cuh's (the
// TMA forward, conv2d_tma.cu, shares them); scripts/cuda-check.sh compiles
// the wgmma code with GPUKIT_CHECK_SM90 defined.
#include "conv2d_wg.cuh"

#ifdef GPUKIT_WGMMA
extern "C" __global__ void __launch_bounds__(CW_THREADS, 1) conv_wg_dw_64(const conv_wg_dw_args a) { conv_wg_dw<64, 4>(a); }
extern "C" __global__ void __launch_bounds__(CW_THREADS, 1) conv_wg_dw_128(const conv_wg_dw_args a) { conv_wg_dw<128, 4>(a); }
extern "C" __global__ void __launch_bounds__(CW_THREADS, 1) conv_wg_fwd_64(const conv_igemm_args a) { conv_wg_fwd<64, 4>(a); }
extern "C" __global__ void __launch_bounds__(CW_THREADS, 1) conv_wg_fwd_128(const conv_igemm_args a) { conv_wg_fwd<128, 4>(a); }
extern "C" __global__ void __launch_bounds__(CW_THREADS, 1) conv_wg_fwd_256(const conv_igemm_args a) { conv_wg_fwd<256, 4>(a); }
// The warp-specialised forward (cw_mainloop_ws): not the default
// (ops/conv2d.go's convWS).
extern "C" __global__ void __launch_bounds__(CW_WS_THREADS, 1) conv_wg_fwd_ws_64(const conv_igemm_args a) { conv_wg_fwd<64, 4, true>(a); }
extern "C" __global__ void __launch_bounds__(CW_WS_THREADS, 1) conv_wg_fwd_ws_128(const conv_igemm_args a) { conv_wg_fwd<128, 4, true>(a); }
extern "C" __global__ void __launch_bounds__(CW_WS_THREADS, 1) conv_wg_fwd_ws_256(const conv_igemm_args a) { conv_wg_fwd<256, 4, true>(a); }
extern "C" __global__ void __launch_bounds__(CW_WS_THREADS, 1) conv_wg_dw_ws_64(const conv_wg_dw_args a) { conv_wg_dw<64, 4, true>(a); }
extern "C" __global__ void __launch_bounds__(CW_WS_THREADS, 1) conv_wg_dw_ws_128(const conv_wg_dw_args a) { conv_wg_dw<128, 4, true>(a); }
#else
// Compiled for a target without wgmma: ops/conv2d.go finds this marker and
// launches conv_igemm_fwd instead.
extern "C" __global__ void conv_wg_unavailable() {}
#endif  // GPUKIT_WGMMA

// conv_dw_reduce: dw[i] = (acc ? dw[i] : 0) + Σ_z part[z·n + i] for i < n,
// the splits of conv_wg_dw added in order (f32).
extern "C" __global__ void conv_dw_reduce(float* __restrict__ dw, const float* __restrict__ part, long long n, int splits, int acc) {
  GPUKIT_GRID_STRIDE(i, n) {
    float s = acc ? dw[i] : 0.0f;
    for (int z = 0; z < splits; z++) s += part[(long long)z * n + i];
    dw[i] = s;
  }
}
