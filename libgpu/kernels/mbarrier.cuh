// mbarrier.cuh: the synchronisation a warp-specialised kernel needs
// (producer warps filling shared-memory stages, consumer warpgroups taking
// them), as small wrappers around inline PTX and, with GPUKIT_EMU defined
// (scripts/cudaemu), their host emulation. Written for FlashAttention-3's
// structure (Shah et al. 2024, §3.1: producer warps, ping-pong named
// barriers between consumer warpgroups); PTX ISA sections "mbarrier",
// "bar, barrier" and "setmaxnreg".
//
//   gpukit_mbar_init(a, n):   mbarrier.init.shared::cta.b64 — the 8-byte
//                             barrier at shared address a (8-aligned)
//                             completes a phase after n arrivals; make it
//                             visible with a block barrier before use;
//   gpukit_mbar_arrive(a):    mbarrier.arrive.shared::cta.b64 (one arrival);
//   gpukit_mbar_wait(a, p):   spins on mbarrier.try_wait.parity until the
//                             phase of parity p (0, 1, 0, ... from init)
//                             has completed;
//   gpukit_cp_mbar_arrive(a): cp.async.mbarrier.arrive.noinc — one arrival
//                             (counted in init's n) once every cp.async
//                             this thread has issued so far has landed; a
//                             consumer that waited on the phase runs
//                             gpukit_fence_proxy_async (wgmma.cuh) before
//                             the tensor cores read the bytes;
//   gpukit_bar_sync(id, n), gpukit_bar_arrive(id, n): bar.sync / bar.arrive
//                             on named barrier id (1-15; 0 is
//                             __syncthreads') of n threads, a multiple of
//                             32: one warpgroup waits, another signals;
//   gpukit_setmaxnreg_inc<N>, gpukit_setmaxnreg_dec<N>: setmaxnreg (sm_90a:
//                             a warpgroup gives registers up or takes
//                             them; N a multiple of 8 in 24..256); no-ops
//                             elsewhere and in the emulator.
//
// scripts/cudaemu/mbarrier_test.cpp checks a producer/consumer ring on
// them in the emulator. attention.cu's attn_fwd_ws (the default wgmma
// forward since it ran on a GPU machine, 2026-11-29) and conv2d_wg.cu's
// cw_mainloop_ws use them.
#pragma once
#include "common.cuh"

#ifndef GPUKIT_EMU
__device__ __forceinline__ void gpukit_mbar_init(unsigned a, int n) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(a), "r"(n) : "memory");
}
__device__ __forceinline__ void gpukit_mbar_arrive(unsigned a) {
  asm volatile("{ .reg .b64 st; mbarrier.arrive.shared::cta.b64 st, [%0]; }" ::"r"(a) : "memory");
}
__device__ __forceinline__ bool gpukit_mbar_try_wait(unsigned a, unsigned p) {
  unsigned ok;
  asm volatile(
      "{ .reg .pred q; mbarrier.try_wait.parity.shared::cta.b64 q, [%1], %2; selp.u32 %0, 1, 0, q; }"
      : "=r"(ok)
      : "r"(a), "r"(p)
      : "memory");
  return ok != 0;
}
__device__ __forceinline__ void gpukit_cp_mbar_arrive(unsigned a) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(a) : "memory");
}
__device__ __forceinline__ void gpukit_bar_sync(int id, int n) {
  asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(n) : "memory");
}
__device__ __forceinline__ void gpukit_bar_arrive(int id, int n) {
  asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(n) : "memory");
}
#else
__device__ __forceinline__ void gpukit_mbar_init(unsigned a, int n) { gpukit_emu_mbar_init(a, n); }
__device__ __forceinline__ void gpukit_mbar_arrive(unsigned a) { gpukit_emu_mbar_arrive(a); }
__device__ __forceinline__ bool gpukit_mbar_try_wait(unsigned a, unsigned p) { return gpukit_emu_mbar_try_wait(a, p); }
__device__ __forceinline__ void gpukit_cp_mbar_arrive(unsigned a) { gpukit_emu_cp_mbar_arrive(a); }
__device__ __forceinline__ void gpukit_bar_sync(int id, int n) { gpukit_emu_bar(id, n, true); }
__device__ __forceinline__ void gpukit_bar_arrive(int id, int n) { gpukit_emu_bar(id, n, false); }
#endif

__device__ __forceinline__ void gpukit_mbar_wait(unsigned a, unsigned p) {
  while (!gpukit_mbar_try_wait(a, p)) {
  }
}

template <int N>
__device__ __forceinline__ void gpukit_setmaxnreg_inc() {
#if defined(GPUKIT_WGMMA) && !defined(GPUKIT_EMU)
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(N));
#endif
}
template <int N>
__device__ __forceinline__ void gpukit_setmaxnreg_dec() {
#if defined(GPUKIT_WGMMA) && !defined(GPUKIT_EMU)
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(N));
#endif
}
