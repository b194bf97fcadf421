// conv2d_wg.cuh: the wgmma implicit-GEMM convolution's mainloops and
// kernel bodies (conv_wg_fwd, conv_wg_dw), shared by conv2d_wg.cu (the
// wgmma and warp-specialised kernels) and conv2d_tma.cu (the forward with
// TMA loads, a module of its own). See conv2d_wg.cu for the design.
#pragma once
#include "common.cuh"
#include "conv2d.cuh"
#include "mbarrier.cuh"
#include "mma.cuh"
#include "tma.cuh"
#include "wgmma.cuh"

#ifndef CONV_DYN_SMEM
#define CONV_DYN_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

// conv_wg_fwd_<BN> computes conv_igemm_fwd's product (same arguments, same
// gather, zeros off the image) with Hopper's warpgroup MMA, on the
// mainloop of groupedgemm.cu's gg_wg (after CUTLASS 3.x's SM90 implicit
// GEMM, which gathers its A tiles the same way, and its multistage
// cp.async collective): a block computes 128 output pixels × BN output
// channels with 2 warpgroups of 64 rows; K = (kh, kw, ci) in steps of 64
// channels of one tap (Cin a multiple of 64, so a step never straddles
// taps and an A row is 128 contiguous bytes of x); a STAGES-deep ring of
// cp.async copies into 128-byte-swizzled K-major tiles (the layout
// wgmma.cuh's descriptors name), STAGES − 2 steps in flight ahead of the
// MMA and one wgmma group outstanding. A fused input map is applied by
// each thread to its own landed A chunks (conv_prologue). The epilogue
// adds the bias (and the fused per-sample bias and residual, conv_out2)
// and stores (or adds, with acc) bf16 pairs: Cout a multiple of 8; filter rows
// past Cout read as zeros and their columns are not stored. Shared memory
// (dynamic, 1 KiB of slack for the 1024-byte alignment): STAGES × (16 KiB
// + BN·128 bytes). ops/conv2d.go launches it when the shape allows (and
// conv_wg_dw below for the weight gradient), else conv2d.cu's
// conv_igemm_fwd; conv_wg_unavailable marks a module built
// without wgmma (scripts/cuda-check.sh compiles the wgmma code with
// GPUKIT_CHECK_SM90 defined).
#ifdef GPUKIT_WGMMA
#define CW_BM 128
#define CW_BK 64
#define CW_THREADS 256

// cw_mma_step issues warpgroup w's MMAs of the k-step in stage st (its 64
// rows of A, CW_BK deep, against the stage's B: K-major for T = 0,
// MN-major panels for T = 1) into d, and waits until at most this group
// is outstanding (the group before it has retired).
template <int BN, int TA, int TB>
__device__ __forceinline__ void cw_mma_step(float* d, unsigned st, int w) {
  constexpr unsigned AT = CW_BM * CW_BK * 2;
  gpukit_keep_f<BN / 2>(d);
  gpukit_wg_fence();
#pragma unroll
  for (int kk = 0; kk < CW_BK / 16; kk++) {
    const gpukit_u64 da = TA ? gpukit_wg_desc(st + w * (CW_BK * 128) + kk * 2048, CW_BK * 128, 1024)
                             : gpukit_wg_desc(st + w * 64 * 128 + kk * 32, 16, 1024);
    const gpukit_u64 db = TB ? gpukit_wg_desc(st + AT + kk * 2048, CW_BK * 128, 1024)
                             : gpukit_wg_desc(st + AT + kk * 32, 16, 1024);
    gpukit_wg_ss<BN, TA, TB>::mma(d, da, db, 1);
  }
  gpukit_wg_commit();
  gpukit_wg_wait<1>();
  gpukit_keep_f<BN / 2>(d);
}

// cw_mainloop runs a kernel's k-steps 0..nk−1 into the accumulators d (the
// warpgroup's 64 × BN product, wgmma.cuh's fragment layout): load(ks, st)
// queues the cp.async copies of k-step ks into stage st (A, CW_BM × CW_BK,
// at st; B, BN × CW_BK, at st + 16 KiB; K-major for T = 0, MN-major panels
// for T = 1), a ring of STAGES stages from s0 with STAGES − 2 steps in
// flight ahead of the MMA and one wgmma group outstanding (a stage is
// rewritten two steps after the wgmma that read it was issued, by then
// retired by its wait_group 1). pro(ks, st) runs in every thread once its
// own copies of k-step ks have landed, before the barrier and proxy fence
// that hand stage st to the MMA: the fused input map of conv_wg_fwd.
// Every thread of the block calls it.
template <int BN, int STAGES, int TA, int TB, typename Load, typename Pro>
__device__ __forceinline__ void cw_mainloop(float* d, int nk, unsigned s0, Load load, Pro pro) {
  static_assert(STAGES >= 3, "cw_mainloop needs a stage in flight beside the two in use");
  constexpr int LEAD = STAGES - 2;
  constexpr unsigned AT = CW_BM * CW_BK * 2, ST = AT + BN * CW_BK * 2;
  const int wg = threadIdx.x >> 7;
  int pk = 0;  // k-steps queued
  auto produce = [&]() {
    if (pk < nk) load(pk, s0 + (pk % STAGES) * ST);
    pk++;
    gpukit_cp_commit();  // one group per step, empty past the end: wait counts stay uniform
  };
#pragma unroll 1
  for (int i = 0; i < LEAD; i++) produce();
#pragma unroll
  for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
#pragma unroll 1
  for (int ks = 0; ks < nk; ks++) {
    const unsigned st = s0 + (ks % STAGES) * ST;
    gpukit_cp_wait<LEAD - 1>();
    pro(ks, st);
    gpukit_fence_proxy_async();
    __syncthreads();
    produce();
    cw_mma_step<BN, TA, TB>(d, st, wg);
  }
  gpukit_wg_wait<0>();
  gpukit_keep_f<BN / 2>(d);
  gpukit_cp_wait0();  // the empty groups queued past the end
}

// cw_mainloop_ws is cw_mainloop warp-specialised (CUTLASS 3.x's SM90
// "warpspecialized" collectives, FlashAttention-3 §3.1): 384 threads with
// no block barrier in the loop. Warpgroup 0 is the producer (152
// registers, setmaxnreg): its 128 threads run load(ks, st) for k-step ks
// into stage st = ks mod STAGES once the consumers have released it, and
// complete the stage's "full" mbarrier through cp.async (or, with pro_on,
// wait for their copies, run pro(ks, st) on them and arrive). Warpgroups 1
// and 2 (176 registers) each wait for "full", issue their 64 rows' MMAs,
// keep one wgmma group outstanding and, once the group that read a stage
// has retired, arrive on its "empty" mbarrier. The barriers follow the
// ring: full[s] at s0 + STAGES·ST + 8s, empty[s] 8·STAGES bytes further
// (ops/conv2d.go adds 128 bytes of shared memory). load runs in the
// producer only, for ks = 0, 1, ... in order, with threadIdx.x < 128.
// With TMA the producer is one thread (threadIdx.x 0; the warpgroup's
// other threads leave): load(ks, st, full) issues the stage's TMA copies
// and the one expect-tx arrival that completes "full" once their bytes
// land; pro is not called (no fused input map). Returns false in the
// producer (d unset), true in a consumer with d its warpgroup's 64 × BN
// product (rows 64·(warpgroup − 1)).
template <int BN, int STAGES, int TA, int TB, bool TMA = false, typename Load, typename Pro>
__device__ __forceinline__ bool cw_mainloop_ws(float* d, int nk, unsigned s0, bool pro_on, Load load, Pro pro) {
  constexpr unsigned AT = CW_BM * CW_BK * 2, ST = AT + BN * CW_BK * 2;
  const unsigned full = s0 + STAGES * ST, empty = full + 8 * STAGES;
  const int wg = threadIdx.x >> 7;
  if (threadIdx.x == 0) {
    for (int s = 0; s < STAGES; s++) {
      gpukit_mbar_init(full + 8 * s, TMA ? 1 : 128);
      gpukit_mbar_init(empty + 8 * s, 256);
    }
    if constexpr (TMA) gpukit_fence_mbar_init();  // the TMA unit completes "full"
  }
  __syncthreads();
  if (wg == 0) {
    if constexpr (!TMA) gpukit_setmaxnreg_dec<152>();
    if constexpr (TMA) {
      if (threadIdx.x == 0) {
#pragma unroll 1
        for (int ks = 0; ks < nk; ks++) {
          const int s = ks % STAGES;
          if (ks >= STAGES) gpukit_mbar_wait(empty + 8 * s, ((ks / STAGES) - 1) & 1);  // released its last k-step
          load(ks, s0 + s * ST, full + 8 * s);
        }
      }
    } else {
#pragma unroll 1
      for (int ks = 0; ks < nk; ks++) {
        const int s = ks % STAGES;
        const unsigned st = s0 + s * ST;
        if (ks >= STAGES) gpukit_mbar_wait(empty + 8 * s, ((ks / STAGES) - 1) & 1);  // released its last k-step
        load(ks, st);
        if (pro_on) {
          gpukit_cp_commit();
          gpukit_cp_wait0();
          pro(ks, st);
          gpukit_fence_proxy_async();
          gpukit_mbar_arrive(full + 8 * s);
        } else {
          gpukit_cp_mbar_arrive(full + 8 * s);
        }
      }
      gpukit_cp_wait0();  // nothing in flight at exit
    }
    return false;
  }
  // The register split assumes ptxas gave the kernel 168 registers a
  // thread (its launch bound), as the cp.async producer's code needs; the
  // TMA kernel needs fewer (154 at BN = 256), so it keeps what it has
  // rather than ask for more than the block holds.
  if constexpr (!TMA) gpukit_setmaxnreg_inc<176>();
  const int cw = wg - 1;
#pragma unroll
  for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
#pragma unroll 1
  for (int ks = 0; ks < nk; ks++) {
    const int s = ks % STAGES;
    const unsigned st = s0 + s * ST;
    gpukit_mbar_wait(full + 8 * s, (ks / STAGES) & 1);
    gpukit_fence_proxy_async();
    cw_mma_step<BN, TA, TB>(d, st, cw);
    if (ks > 0) gpukit_mbar_arrive(empty + 8 * ((ks - 1) % STAGES));  // k-step ks − 1's MMAs have retired
  }
  gpukit_wg_wait<0>();
  gpukit_keep_f<BN / 2>(d);
  return true;
}

// cw_swz is the byte offset of 16-byte chunk c of row r of a 128-byte-row
// tile in 128-byte swizzle (wgmma.cuh).
__device__ __forceinline__ unsigned cw_swz(int r, int c) { return r * 128 + ((c ^ (r & 7)) << 4); }

// conv_tma_args are conv_wg_fwd_tma_<BN>'s arguments: conv_igemm_args
// (no fused input map: pro_scale null) and the tensor maps ops/conv2d.go
// encodes for them — tx, an im2col map of x (64 channels × 128 pixels a
// copy, traversal strides the convolution's, bounding box −pad ..
// pad − (KH − 1)) and tw, a tiled map of w as [Cout, KH·KW·Cin] (boxes of
// 64 × BN), both 128-byte swizzled.
struct conv_tma_args {
  gpukit_tmap tx;
  gpukit_tmap tw;
  conv_igemm_args a;
};
static_assert(sizeof(conv_tma_args) == 384, "conv_tma_args layout: launch.ConvTmaArgs is generated from it (go generate ./libgpu/kernels/launch)");

// WS: on cw_mainloop_ws (conv_wg_fwd_ws_<BN>, 384 threads): the
// producer's 128 threads copy (each CW_BM/16 A rows and BN/16 W rows) and
// the consumers store rows 64·(warpgroup − 1). TMA (with WS; t the
// arguments' tensor maps): one producer thread issues each k-step's two
// TMA copies, the A tile gathered by the im2col map from the block's first
// output pixel's window at the k-step's filter tap (the hardware walks
// the 128 pixels, zero-filling the padding and the rows past the last
// image), the W tile from the tiled map (rows past Cout zeros).
template <int BN, int STAGES, bool WS = false, bool TMA = false>
__device__ __forceinline__ void conv_wg_fwd(const conv_igemm_args& a, const conv_tma_args* t = nullptr) {
  static_assert(!TMA || WS, "conv_wg_fwd: TMA loads need the warp-specialised mainloop");
  static_assert(BN % 32 == 0, "conv_wg_fwd tile");
  constexpr unsigned AT = CW_BM * CW_BK * 2;
  constexpr int RS = (WS ? 128 : CW_THREADS) / 8;  // rows one pass of the copying threads covers
  CONV_DYN_SMEM(conv_smem);
  const unsigned s0 = (gpukit_smem_addr(conv_smem) + 1023u) & ~1023u;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  const int ct = WS ? tid & 127 : tid;  // this thread's place among the copying threads
  const int mw = WS ? wg - 1 : wg;      // the warpgroup's 64 rows (WS: warpgroup 0 copies)
  const long long P = (long long)a.n * a.ho * a.wo;
  const long long p0 = (long long)blockIdx.x * CW_BM;
  const int co0 = blockIdx.y * BN;
  const int K = a.kh * a.kw * a.cin, cpt = a.cin / CW_BK;
  const int cc = ct & 7;  // this thread's 16-byte chunk of a 128-byte tile row

  // The A rows (output pixels) and W rows (output channels) this thread
  // copies, fixed for the block: rows ct/8 + RS·i.
  conv_pix arow[CW_BM / RS];
#pragma unroll
  for (int i = 0; i < CW_BM / RS; i++) arow[i] = conv_pixel(a, p0 + (ct >> 3) + RS * i);
  bool brow[BN / RS];
  const gpukit_bf16* wrow[BN / RS];
#pragma unroll
  for (int i = 0; i < BN / RS; i++) {
    const int co = co0 + (ct >> 3) + RS * i;
    brow[i] = co < a.cout;
    wrow[i] = a.w + (long long)(brow[i] ? co : 0) * K + 8 * cc;
  }
  float d[BN / 2];
  const unsigned sbase = gpukit_smem_addr(conv_smem);
  auto load = [&](int ks, unsigned st) {
    const int tap = ks / cpt, ci0 = (ks - tap * cpt) * CW_BK;
    const int dh = tap / a.kw, dw = tap - dh * a.kw;
#pragma unroll
    for (int i = 0; i < CW_BM / RS; i++) {
      const gpukit_bf16* src = conv_src(a, arow[i], dh, dw, ci0 + 8 * cc);
      gpukit_cp16(st + cw_swz((ct >> 3) + RS * i, cc), src ? src : a.x, src != nullptr);
    }
#pragma unroll
    for (int i = 0; i < BN / RS; i++) {
      gpukit_cp16(st + AT + cw_swz((ct >> 3) + RS * i, cc), brow[i] ? wrow[i] + (long long)ks * CW_BK : a.w, brow[i]);
    }
  };
  auto pro = [&](int ks, unsigned st) {  // the fused input map on this thread's landed A chunks in the image
    if (!a.pro_scale) return;
    const int tap = ks / cpt, ci0 = (ks - tap * cpt) * CW_BK;
    const int dh = tap / a.kw, dw = tap - dh * a.kw;
#pragma unroll
    for (int i = 0; i < CW_BM / RS; i++) {
      if (conv_src(a, arow[i], dh, dw, ci0 + 8 * cc))
        conv_prologue(conv_smem + (st - sbase) + cw_swz((ct >> 3) + RS * i, cc), a, arow[i].img, ci0 + 8 * cc);
    }
  };
  if constexpr (TMA) {
    const int q0 = (int)(p0 % a.wo), o0 = (int)(p0 / a.wo % a.ho), n0 = (int)(p0 / ((long long)a.wo * a.ho));
    const int w0 = q0 * a.stride - a.pad, h0 = o0 * a.stride - a.pad;
    auto load_tma = [&](int ks, unsigned st, unsigned bar) {
      const int tap = ks / cpt, ci0 = (ks - tap * cpt) * CW_BK;
      const int dh = tap / a.kw, dw = tap - dh * a.kw;
      gpukit_mbar_expect_tx(bar, AT + BN * CW_BK * 2);
      gpukit_tma_im2col_4d(st, &t->tx, bar, ci0, w0, h0, n0, dw, dh);
      gpukit_tma_tile_2d(st + AT, &t->tw, bar, ks * CW_BK, co0);
    };
    if (!cw_mainloop_ws<BN, STAGES, 0, 0, true>(d, K / CW_BK, s0, false, load_tma, pro)) return;  // the producer
  } else if constexpr (WS) {
    if (!cw_mainloop_ws<BN, STAGES, 0, 0>(d, K / CW_BK, s0, a.pro_scale != nullptr, load, pro)) return;  // the producer
  } else {
    cw_mainloop<BN, STAGES, 0, 0>(d, K / CW_BK, s0, load, pro);
  }

  // Epilogue: rows 64·mw + 16·warp + lane/4 (+8), channels 8j + 2·(lane%4).
  const long long rbase = p0 + mw * 64 + warp * 16 + (lane >> 2);
#pragma unroll
  for (int j = 0; j < BN / 8; j++) {
    const int n = co0 + 8 * j + 2 * (lane & 3);
    if (n >= a.cout) continue;
    float b0 = 0.0f, b1 = 0.0f;
    if (a.bias) {
      b0 = gpukit_ld(a.bias + n);
      b1 = gpukit_ld(a.bias + n + 1);
    }
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const long long row = rbase + 8 * h;
      if (row < P) conv_out2(a, row, n, d[4 * j + 2 * h] + b0, d[4 * j + 2 * h + 1] + b1);
    }
  }
}

// conv_wg_dw_<BN>: the weight gradient as an implicit GEMM on wgmma,
//
//   part[z][co][k] = Σ_{p in split z} dY[p, co]·A[p, k],  k = (kh, kw, ci),
//
// A the gathered input of conv_igemm_fwd (zeros off the image): M = Cout
// (128 a block, two warpgroups of 64), N = BN channels of one tap (Cin a
// multiple of BN), and the reduction over the output pixels P in k-steps
// of 64, split over gridDim.z ranges of a.chunk pixels (a multiple of 64)
// so that a layer with few (Cout × K) tiles still fills the GPU. Both
// operands are MN-major in shared memory (dY's rows are 64-channel runs of
// one pixel, the gathered input's rows BN-channel runs), in the layout and
// ring of groupedgemm.cu's dw pass. Each split writes f32 partial sums;
// conv_dw_reduce adds them in split order (deterministic, no atomics).
// Cout a multiple of 8.
struct conv_wg_dw_args {
  const gpukit_bf16* x;   // [N, H, W, Cin]
  const gpukit_bf16* dy;  // [N, Ho, Wo, Cout]
  float* part;            // [gridDim.z, Cout, KH·KW·Cin]
  int n, h, w_, cin;
  int ho, wo, cout, kh;
  int kw, stride, pad, chunk;
};
static_assert(sizeof(conv_wg_dw_args) == 72, "conv_wg_dw_args layout: launch.ConvWgDwArgs is generated from it (go generate ./libgpu/kernels/launch)");

// conv_tma_dw_args are conv_wg_dw_tma_<BN>'s arguments: conv_wg_dw_args and
// the tensor maps ops/conv2d.go encodes for them — tdy, a tiled map of dY
// as [P, Cout] (boxes of 64 channels × 64 pixels), and tx, an im2col map
// of x (64 channels × 64 pixels a copy; traversal strides and bounding box
// as conv_tma_args' tx), both 128-byte swizzled.
struct conv_tma_dw_args {
  gpukit_tmap tdy;
  gpukit_tmap tx;
  conv_wg_dw_args a;
};
static_assert(sizeof(conv_tma_dw_args) == 384, "conv_tma_dw_args layout: launch.ConvTmaDwArgs is generated from it (go generate ./libgpu/kernels/launch)");

// WS: on cw_mainloop_ws (conv_wg_dw_ws_<BN>, 384 threads): the producer's
// 128 threads copy, the consumers store output channel rows
// 64·(warpgroup − 1). TMA (with WS; t the arguments' tensor maps): one
// producer thread issues each k-step's copies — dY's two 64-channel panels
// from the tiled map, the gathered input's BN/64 panels from the im2col
// map, whose walk over the k-step's 64 output pixels (from the first one's
// window at the block's tap) zero-fills the padding and the pixels past
// the last image. The split boundaries are multiples of 64 pixels, so
// only the last k-step of all runs past P, where both maps read zeros.
template <int BN, int STAGES, bool WS = false, bool TMA = false>
__device__ __forceinline__ void conv_wg_dw(const conv_wg_dw_args& a, const conv_tma_dw_args* t = nullptr) {
  static_assert(BN % 64 == 0, "conv_wg_dw tile");
  static_assert(!TMA || WS, "conv_wg_dw: TMA loads need the warp-specialised mainloop");
  constexpr unsigned AT = CW_BK * CW_BM * 2;
  CONV_DYN_SMEM(conv_smem);
  const unsigned s0 = (gpukit_smem_addr(conv_smem) + 1023u) & ~1023u;
  const int tid = threadIdx.x, wg = tid >> 7, warp = (tid >> 5) & 3, lane = tid & 31;
  constexpr int NT = WS ? 128 : CW_THREADS;  // the threads that copy
  const int ct = WS ? tid & 127 : tid;       // this thread's place among them
  const int mw = WS ? wg - 1 : wg;           // the warpgroup's 64 rows (WS: warpgroup 0 copies)
  const long long P = (long long)a.n * a.ho * a.wo;
  const int K = a.kh * a.kw * a.cin;
  const int m0 = blockIdx.x * CW_BM, n0 = blockIdx.y * BN;
  const int tap = n0 / a.cin, ci0 = n0 - tap * a.cin, dh = tap / a.kw, dw = tap - dh * a.kw;
  const long long pbeg = (long long)blockIdx.z * a.chunk, pend = P < pbeg + a.chunk ? P : pbeg + a.chunk;
  const int nk = pend > pbeg ? (int)((pend - pbeg + CW_BK - 1) / CW_BK) : 0;
  float d[BN / 2];
  // The gathered rows this thread copies: pixels pbeg + CW_BK·ks + ct/CPR
  // + RPP·i, kept as (image, output row, output column) and stepped by
  // CW_BK pixels a k-step; a 64-bit division (conv_pixel) per copy per
  // k-step was most of this kernel's address work.
  constexpr int CPR = BN / 8, RPP = NT / CPR, NR = CW_BK / RPP;
  const int c = ct % CPR, sy = CW_BK / a.wo, sx = CW_BK - sy * a.wo;
  int img[NR], oy[NR], ox[NR];
#pragma unroll
  for (int i = 0; i < NR; i++) {
    const conv_pix q = conv_pixel(a, pbeg + ct / CPR + RPP * i);
    img[i] = q.img;
    oy[i] = (q.ih0 + a.pad) / a.stride;
    ox[i] = (q.iw0 + a.pad) / a.stride;
  }
  // k-step ks: 64 pixels × 128 output channels of dY (16 chunks a row, two
  // panels of 64) and × BN gathered input channels (BN/64 panels).
  auto load = [&](int ks, unsigned st) {
    const long long pk = pbeg + (long long)ks * CW_BK;
    {
      const int c = ct & 15;
#pragma unroll
      for (int i = 0; i < CW_BK / (NT / 16); i++) {
        const int r = (ct >> 4) + (NT / 16) * i, co = m0 + 8 * c;
        const long long p = pk + r;
        const bool ok = p < pend && co < a.cout;
        gpukit_cp16(st + (c >> 3) * (CW_BK * 128) + cw_swz(r, c & 7), ok ? a.dy + p * a.cout + co : a.dy, ok);
      }
    }
#pragma unroll
    for (int i = 0; i < NR; i++) {
      const int r = ct / CPR + RPP * i;
      const gpukit_bf16* src = nullptr;
      if (pk + r < pend) {
        conv_pix q;
        q.ok = true;
        q.img = img[i];
        q.base = (long long)img[i] * a.h * a.w_;
        q.ih0 = oy[i] * a.stride - a.pad;
        q.iw0 = ox[i] * a.stride - a.pad;
        src = conv_src(a, q, dh, dw, ci0 + 8 * c);
      }
      gpukit_cp16(st + AT + (c >> 3) * (CW_BK * 128) + cw_swz(r, c & 7), src ? src : a.x, src != nullptr);
      // The row's pixel CW_BK on, for the next k-step (load runs for ks = 0, 1, ... in order).
      ox[i] += sx;
      oy[i] += sy;
      if (ox[i] >= a.wo) {
        ox[i] -= a.wo;
        oy[i]++;
      }
      while (oy[i] >= a.ho) {
        oy[i] -= a.ho;
        img[i]++;
      }
    }
  };
  if constexpr (TMA) {
    // The k-step's first output pixel as (image, row, column), stepped by
    // CW_BK pixels a k-step (the producer thread alone runs load_tma, for
    // ks = 0, 1, ... in order).
    const conv_pix q0 = conv_pixel(a, pbeg);
    int qi = q0.img, qy = (q0.ih0 + a.pad) / a.stride, qx = (q0.iw0 + a.pad) / a.stride;
    auto load_tma = [&](int ks, unsigned st, unsigned bar) {
      const int pk = (int)(pbeg + (long long)ks * CW_BK);
      gpukit_mbar_expect_tx(bar, AT + BN * CW_BK * 2);
#pragma unroll
      for (int h = 0; h < CW_BM / 64; h++) gpukit_tma_tile_2d(st + h * (CW_BK * 128), &t->tdy, bar, m0 + 64 * h, pk);
#pragma unroll
      for (int h = 0; h < BN / 64; h++)
        gpukit_tma_im2col_4d(st + AT + h * (CW_BK * 128), &t->tx, bar, ci0 + 64 * h, qx * a.stride - a.pad, qy * a.stride - a.pad,
                             qi, dw, dh);
      qx += sx;
      qy += sy;
      if (qx >= a.wo) {
        qx -= a.wo;
        qy++;
      }
      while (qy >= a.ho) {
        qy -= a.ho;
        qi++;
      }
    };
    if (!cw_mainloop_ws<BN, STAGES, 1, 1, true>(d, nk, s0, false, load_tma, [](int, unsigned) {})) return;  // the producer
  } else if constexpr (WS) {
    if (!cw_mainloop_ws<BN, STAGES, 1, 1>(d, nk, s0, false, load, [](int, unsigned) {})) return;  // the producer
  } else {
    cw_mainloop<BN, STAGES, 1, 1>(d, nk, s0, load, [](int, unsigned) {});
  }

  // Epilogue: output channel rows 64·mw + 16·warp + lane/4 (+8), columns
  // n0 + 8j + 2·(lane%4) of K; a split with no pixels writes zeros.
  float* part = a.part + (long long)blockIdx.z * a.cout * K;
  const int rbase = m0 + mw * 64 + warp * 16 + (lane >> 2);
#pragma unroll
  for (int j = 0; j < BN / 8; j++) {
    const int n = n0 + 8 * j + 2 * (lane & 3);
#pragma unroll
    for (int h = 0; h < 2; h++) {
      const int co = rbase + 8 * h;
      if (co >= a.cout) continue;
      float2 v;
      v.x = d[4 * j + 2 * h];
      v.y = d[4 * j + 2 * h + 1];
      *(float2*)(part + (long long)co * K + n) = v;
    }
  }
}
// The warp-specialised kernels' block size (cw_mainloop_ws).
#define CW_WS_THREADS 384
#endif  // GPUKIT_WGMMA
