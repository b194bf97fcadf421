// tma.cuh: the Tensor Memory Accelerator's copies (sm_90: one thread
// issues a whole tile's copy from global to shared memory, the hardware
// computes every address and completes the tile's bytes on an mbarrier),
// as small wrappers around inline PTX and, with GPUKIT_EMU defined
// (scripts/cudaemu), their host emulation. PTX ISA sections
// "cp.async.bulk.tensor" (tiled and im2col modes) and "mbarrier"
// (expect-tx); the tensor maps are made on the host by libgpu/cuda's
// EncodeTiled and EncodeIm2col (cuTensorMapEncode*).
//
//   gpukit_tmap:                a CUtensorMap, 128 opaque bytes, 64-byte
//                               aligned; a kernel takes it inside a
//                               __grid_constant__ argument struct, so the
//                               copies read it from parameter space;
//   gpukit_fence_mbar_init():   fence.mbarrier_init — makes the mbarriers
//                               this thread initialised visible to the
//                               async proxy (the TMA unit completes their
//                               transactions); before the block barrier
//                               that publishes them (CUTLASS's
//                               fence_barrier_init);
//   gpukit_mbar_expect_tx(a, b): mbarrier.arrive.expect_tx — one arrival
//                               on the mbarrier at shared address a, and b
//                               more transaction bytes before its phase
//                               completes;
//   gpukit_tma_tile_2d(dst, m, a, x, y): the box of tensor map m at
//                               element (x innermost, y) into shared
//                               memory at dst (1024-byte aligned with the
//                               128-byte swizzle), its bytes completing on
//                               the mbarrier at a; zeros outside the
//                               tensor;
//   gpukit_tma_im2col_4d(dst, m, a, c, w, h, n, ow, oh): an im2col tensor
//                               map's pixels-per-column pixels of an NHWC
//                               tensor, from the base position (w, h, n)
//                               walking W by the traversal stride within
//                               the map's bounding box, then H, then N,
//                               each pixel's channels c.. read at
//                               (w + ow, h + oh, n), zeros outside the
//                               tensor: a convolution's A tile for filter
//                               tap (oh, ow) (Cutlass 3.x's
//                               SM90_TMA_LOAD_IM2COL).
//
// conv2d_wg.cu's conv_wg_fwd_tma (cw_mainloop_ws with a TMA producer) uses
// them; scripts/cudaemu/unet_test.cpp checks it in the emulator.
#pragma once
#include "common.cuh"

struct __align__(64) gpukit_tmap {
  unsigned long long v[16];
};

#ifndef GPUKIT_EMU
__device__ __forceinline__ void gpukit_fence_mbar_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }
__device__ __forceinline__ void gpukit_mbar_expect_tx(unsigned a, unsigned bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(a), "r"(bytes) : "memory");
}
__device__ __forceinline__ void gpukit_tma_tile_2d(unsigned dst, const gpukit_tmap* m, unsigned a, int x, int y) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];" ::"r"(dst),
      "l"(m), "r"(x), "r"(y), "r"(a)
      : "memory");
}
__device__ __forceinline__ void gpukit_tma_im2col_4d(unsigned dst, const gpukit_tmap* m, unsigned a, int c, int w, int h, int n,
                                                     int ow, int oh) {
  const unsigned short ow16 = (unsigned short)ow, oh16 = (unsigned short)oh;
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.im2col.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6], {%7, %8};" ::"r"(dst),
      "l"(m), "r"(c), "r"(w), "r"(h), "r"(n), "r"(a), "h"(ow16), "h"(oh16)
      : "memory");
}
#else
__device__ __forceinline__ void gpukit_fence_mbar_init() {}
__device__ __forceinline__ void gpukit_mbar_expect_tx(unsigned a, unsigned bytes) { gpukit_emu_mbar_expect_tx(a, bytes); }
__device__ __forceinline__ void gpukit_tma_tile_2d(unsigned dst, const gpukit_tmap* m, unsigned a, int x, int y) {
  gpukit_emu_tma_tile_2d(dst, m, a, x, y);
}
__device__ __forceinline__ void gpukit_tma_im2col_4d(unsigned dst, const gpukit_tmap* m, unsigned a, int c, int w, int h, int n,
                                                     int ow, int oh) {
  gpukit_emu_tma_im2col_4d(dst, m, a, c, w, h, n, ow, oh);
}
#endif
