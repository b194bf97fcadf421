// groupedgemm.cu: grouped GEMMs for Mixture-of-Experts layers
// (libgpu/ops/groupedgemm.go): E products over rows grouped contiguously
// by expert, the groups' row offsets read from device memory, so that no
// host synchronisation is needed and a captured CUDA graph replays any
// routing. Per group e, rows [off[e], off[e+1]):
//
//   fwd: Y[r, n]  (+)= Σ_k X[r, k]·W[e, n, k] (+ bias[e, n])     W [E, N, K]
//   dx:  dX[r, k] (+)= Σ_n dY[r, n]·W[e, n, k]
//   dw:  dW[e, n, k] (+)= Σ_{r in e} dY[r, n]·X[r, k]
//
// all three written as one logical product per group C_e[m, n] = Σ_k
// A_e(m, k)·B_e(n, k) whose operands are either K-major (k contiguous) or
// MN-major (m or n contiguous), with the grouped index either m (fwd, dx:
// M_e = rows of e) or k (dw: K_e = rows of e, so an empty group's dW tile
// is a product over nothing: zeros, or nothing added with acc). The
// template flags are TA (A MN-major), TB (B MN-major) and GK (rows grouped
// along k):
//
//   fwd: A = X (K-major), B = W[e] (K-major), m grouped;
//   dx:  A = dY (K-major), B(n, k) = W[e][k][n] (MN-major), m grouped;
//   dw:  A(m, r) = dY[r][m], B(n, r) = X[r][n] (both MN-major), k grouped.
//
// Scheduling (both kernels): a persistent grid; each block reads the E+1
// offsets once into shared memory (clamped to [0, rows] and made
// non-decreasing, so bad offsets cannot send a block outside its tensors),
// counts each group's output tiles, scans them into tile starts, and then
// takes tiles blockIdx.x, blockIdx.x + gridDim.x, ... of the whole
// problem, finding a tile's group by binary search: a block never idles
// on an empty group and the grid does not depend on the routing (the
// persistent tile scheduler of CUTLASS's grouped GEMM, where the problem
// visitor walks group sizes on the device).
//
// gg_wg_*: bf16 on Hopper tensor cores (wgmma.mma_async, sm_90a): 256
// threads (two consumer warpgroups, 64 rows each) per 128 × BN tile, K in
// steps of 64; both operands stream into 128-byte-swizzled shared tiles by
// cp.async through a ring of STAGES stages, LEAD = STAGES − 2 ahead; the
// stream of (tile, k-step) pairs is flat across a block's tiles, so the
// next tile's first stages load during this tile's epilogue. Step s:
// wait for this thread's copies of stage s, fence.proxy.async, barrier
// (every copy of s landed; every warpgroup retired the wgmma of s − 2);
// queue stage s + LEAD into the buffer of s − 2; issue stage s's four
// k16 wgmmas; wait_group 1 (retires s − 1). Accumulators f32; the epilogue
// adds the bias and stores (adds, with acc) pairs to f32 or bf16 outputs.
// Shapes: every dimension that is contiguous in memory (K for fwd, N for
// dx, N and K for dw) a multiple of 8, tensors 16-byte aligned; chunks
// past an edge are zero-filled. Measured on an H100 (BENCHMARKS.md, issue
// 20): the main loop alone reaches 863 TFLOP/s at 8 × 4096 × 768 → 3072;
// the epilogue's stores, which do not overlap it, bound the forward at
// ~340 (the PROBE instances below measure this).
//
// gg_simt_*: any dtype (f32 or bf16 in, f32 accumulation) and shape on CUDA
// cores, 64 × 64 tiles, K in steps of 16, 4 × 4 outputs per thread: the f32
// path (products in full f32, TF32 precision included) and the fallback of
// bf16 where the wgmma kernels do not apply.
//
// gg_colsum_*: the bias gradient db[e, n] (+)= Σ_{r in e} dY[r, n].
//
// The wgmma kernels exist only for sm_90a (wgmma.cuh's GPUKIT_WGMMA guard;
// scripts/cuda-check.sh compiles them with GPUKIT_CHECK_SM90).
#include "common.cuh"
#include "mma.cuh"
#include "wgmma.cuh"

#ifndef GG_DYN_SMEM
#define GG_DYN_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

// GG_MAXE bounds the groups of one launch (the scheduler's shared arrays).
#define GG_MAXE 1024
#define GG_THREADS 256

struct gg_args {
  const void* a;        // A operand base
  const void* b;        // B operand base
  void* c;              // output base
  const void* bias;     // [E, N] (fwd), or null
  const int* offsets;   // [E + 1] row offsets of the groups
  long long lda, ldb, ldc;  // row strides, elements
  long long sb, sc;     // per-group strides of B (W[e]) and of C (dW[e]); 0 where unused
  int E, rows;          // groups; rows of the grouped tensors
  int M, N, K;          // fixed dimensions: M of dw; N (columns of C) always; K of fwd and dx
  int acc;              // add to C instead of overwriting it
};
static_assert(sizeof(gg_args) == 104, "gg_args layout: launch.GgArgs is generated from it (go generate ./libgpu/kernels/launch)");

// gg_schedule fills off_s[0..E] with the clamped, non-decreasing offsets
// and ts_s[0..E] with each group's first tile (ts_s[E] = total tiles), for
// tiles of BM rows × BN columns of C: ⌈M_e/BM⌉·⌈N/BN⌉ tiles per group, M_e
// the group's rows (GK false) or the fixed M (GK true). Returns the total.
// Every thread of the block calls it.
template <int BM, int BN, bool GK>
__device__ __forceinline__ int gg_schedule(const gg_args& a, int* off_s, int* ts_s) {
  const int E = a.E;
  for (int i = threadIdx.x; i <= E; i += blockDim.x) off_s[i] = a.offsets[i];
  __syncthreads();
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    int carry = 0;
    for (int base = 0; base <= E; base += 32) {  // offsets: prefix maximum of the clamped values
      const int i = base + lane;
      int v = i <= E ? min(max(off_s[i], 0), a.rows) : 0;
      for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, v, o);
        if (lane >= o) v = max(v, u);
      }
      v = max(v, carry);
      __syncwarp();
      if (i <= E) off_s[i] = v;
      carry = __shfl_sync(0xffffffffu, v, 31);
    }
    __syncwarp();
    const int ntn = (a.N + BN - 1) / BN, fixed = (a.M + BM - 1) / BM * ntn;
    if (lane == 0) ts_s[0] = 0;
    carry = 0;
    for (int base = 0; base < E; base += 32) {  // tile starts: prefix sum
      const int e = base + lane;
      int n = 0;
      if (e < E) n = GK ? fixed : (off_s[e + 1] - off_s[e] + BM - 1) / BM * ntn;
      for (int o = 1; o < 32; o <<= 1) {
        const int u = __shfl_up_sync(0xffffffffu, n, o);
        if (lane >= o) n += u;
      }
      n += carry;
      if (e < E) ts_s[e + 1] = n;
      carry = __shfl_sync(0xffffffffu, n, 31);
    }
  }
  __syncthreads();
  return ts_s[E];
}

// gg_tile is one output tile: group e, its first row (off[e]), the rows
// of the group (me: M_e for GK false, the fixed M for GK true), its
// reduction length ke, and the tile's origin (m0, n0) in C_e.
struct gg_tile {
  int e, me, ke, m0, n0;
  long long row0;
};

template <int BM, int BN, bool GK>
__device__ __forceinline__ gg_tile gg_decode(const gg_args& a, const int* off_s, const int* ts_s, int t) {
  gg_tile r;
  r.e = gpukit_mt_find(ts_s, a.E, t);
  const int local = t - ts_s[r.e], ntn = (a.N + BN - 1) / BN;
  r.m0 = local / ntn * BM;
  r.n0 = local % ntn * BN;
  r.row0 = off_s[r.e];
  const int cnt = off_s[r.e + 1] - off_s[r.e];
  r.me = GK ? a.M : cnt;
  r.ke = GK ? cnt : a.K;
  return r;
}

// gg_store writes (or, with acc, adds) the pair (v0, v1) at p, columns n
// and n + 1 of a row (n even; both inside the row).
__device__ __forceinline__ void gg_store2(float* p, float v0, float v1, int acc) {
  float2* q = (float2*)p;
  if (acc) {
    const float2 o = *q;
    v0 += o.x;
    v1 += o.y;
  }
  float2 r;
  r.x = v0;
  r.y = v1;
  *q = r;
}
__device__ __forceinline__ void gg_store2(gpukit_bf16* p, float v0, float v1, int acc) {
  unsigned* u = (unsigned*)p;
  if (acc) {
    const unsigned o = *u;
    v0 += __uint_as_float(o << 16);
    v1 += __uint_as_float(o & 0xffff0000u);
  }
  *u = (unsigned)gpukit_f32_to_bf16(v0) | ((unsigned)gpukit_f32_to_bf16(v1) << 16);
}

// ---- wgmma (sm_90a) ----

#ifdef GPUKIT_WGMMA
#define GG_BM 128
#define GG_BK 64
#define GG_ATILE (GG_BM * GG_BK * 2)  // bytes of an A stage

// gg_wg_load queues the cp.async copies of k-step ks of tile t into stage
// buffers sa (A) and sb (B).
template <int BN, bool TA, bool TB, bool GK>
__device__ __forceinline__ void gg_wg_load(const gg_args& a, const gg_tile& t, int ks, unsigned sa, unsigned sb) {
  const gpukit_bf16* A = (const gpukit_bf16*)a.a;
  const gpukit_bf16* B = (const gpukit_bf16*)a.b;
  const int tid = threadIdx.x, k0 = ks * GG_BK;
  if (!TA) {  // A K-major: 128 rows (m) × 8 chunks of 8 k
    const int c = tid & 7;
#pragma unroll
    for (int i = 0; i < GG_BM / 32; i++) {
      const int r = (tid >> 3) + 32 * i, m = t.m0 + r, k = k0 + 8 * c;
      const bool ok = m < t.me && k < t.ke;
      const gpukit_bf16* src = ok ? A + (t.row0 + m) * a.lda + k : A;
      gpukit_cp16(sa + r * 128 + ((c ^ (r & 7)) << 4), src, ok);
    }
  } else {  // A MN-major (dw: A(m, r) = dY[r][m]): 64 rows (k) × 16 chunks of 8 m, two panels
    const int c = tid & 15;
#pragma unroll
    for (int i = 0; i < GG_BK / 16; i++) {
      const int r = (tid >> 4) + 16 * i, k = k0 + r, m = t.m0 + 8 * c;
      const bool ok = k < t.ke && m < t.me;
      const gpukit_bf16* src = ok ? A + (t.row0 + k) * a.lda + m : A;
      gpukit_cp16(sa + (c >> 3) * (GG_BK * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4), src, ok);
    }
  }
  if (!TB) {  // B K-major (fwd: W[e][n][k]): BN rows (n) × 8 chunks
    const int c = tid & 7;
    const gpukit_bf16* W = B + (long long)t.e * a.sb;
#pragma unroll
    for (int i = 0; i < BN / 32; i++) {
      const int r = (tid >> 3) + 32 * i, n = t.n0 + r, k = k0 + 8 * c;
      const bool ok = n < a.N && k < t.ke;
      const gpukit_bf16* src = ok ? W + (long long)n * a.ldb + k : B;
      gpukit_cp16(sb + r * 128 + ((c ^ (r & 7)) << 4), src, ok);
    }
  } else {  // B MN-major: 64 rows (k) × BN/8 chunks of 8 n, BN/64 panels
    constexpr int CPR = BN / 8, RPP = GG_THREADS / CPR;
    const int c = tid % CPR;
    const gpukit_bf16* base = GK ? B + t.row0 * a.ldb : B + (long long)t.e * a.sb;
#pragma unroll
    for (int i = 0; i < GG_BK / RPP; i++) {
      const int r = tid / CPR + RPP * i, k = k0 + r, n = t.n0 + 8 * c;
      const bool ok = k < t.ke && n < a.N;
      const gpukit_bf16* src = ok ? base + (long long)k * a.ldb + n : B;
      gpukit_cp16(sb + (c >> 3) * (GG_BK * 128) + r * 128 + (((c & 7) ^ (r & 7)) << 4), src, ok);
    }
  }
}

// gg_wg: see the file comment. Shared memory (dynamic, from a 1024-byte
// boundary: 1 KiB of slack): STAGES × (A 16 KiB + B BN·128 bytes). PROBE
// instances measure what bounds the kernel (ops' benchmarks only; their
// results are wrong): 1 skips the wgmma (the loads and barriers alone),
// 2 skips the loads (the wgmma on whatever shared memory holds), 3 skips
// the epilogue's stores.
template <int BN, int STAGES, bool TA, bool TB, bool GK, typename TO, int PROBE = 0>
__device__ __forceinline__ void gg_wg(const gg_args& a) {
  constexpr int LEAD = STAGES - 2;
  constexpr unsigned BT = BN * GG_BK * 2, ST = GG_ATILE + BT;
  GG_DYN_SMEM(gg_smem);
  __shared__ int off_s[GG_MAXE + 1], ts_s[GG_MAXE + 1];
  const unsigned s0 = (gpukit_smem_addr(gg_smem) + 1023u) & ~1023u;
  const int total = gg_schedule<GG_BM, BN, GK>(a, off_s, ts_s);
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31;

  // The producer's cursor: tile pt (its decoded pg) and k-step pk; tiles
  // without k-steps (empty dw groups) load nothing.
  int pt = blockIdx.x, pk = 0;
  gg_tile pg;
  auto seek = [&]() {
    while (pt < total) {
      pg = gg_decode<GG_BM, BN, GK>(a, off_s, ts_s, pt);
      if (pg.ke > 0) return;
      pt += gridDim.x;
    }
  };
  seek();
  unsigned ps = 0;  // stages queued
  auto produce = [&]() {
    if (pt < total) {
      const unsigned st = s0 + (ps % STAGES) * ST;
      if (PROBE != 2) gg_wg_load<BN, TA, TB, GK>(a, pg, pk, st, st + GG_ATILE);
      if (++pk * GG_BK >= pg.ke) {
        pk = 0;
        pt += gridDim.x;
        seek();
      }
    }
    ps++;
    gpukit_cp_commit();  // one group per stage, empty past the end: wait counts stay uniform
  };
#pragma unroll 1
  for (int i = 0; i < LEAD; i++) produce();

  float d[BN / 2];
  unsigned cs = 0;  // stages consumed
#pragma unroll 1
  for (int t = blockIdx.x; t < total; t += gridDim.x) {
    const gg_tile g = gg_decode<GG_BM, BN, GK>(a, off_s, ts_s, t);
    const int nk = (g.ke + GG_BK - 1) / GG_BK;
#pragma unroll
    for (int i = 0; i < BN / 2; i++) d[i] = 0.0f;
#pragma unroll 1
    for (int ks = 0; ks < nk; ks++) {
      gpukit_cp_wait<LEAD - 1>();
      gpukit_fence_proxy_async();
      __syncthreads();
      produce();
      const unsigned st = s0 + (cs % STAGES) * ST, sb = st + GG_ATILE;
      gpukit_keep_f<BN / 2>(d);
      gpukit_wg_fence();
#pragma unroll
      for (int kk = 0; kk < GG_BK / 16; kk++) {
        const gpukit_u64 da = TA ? gpukit_wg_desc(st + wg * (GG_BK * 128) + kk * 2048, GG_BK * 128, 1024)
                                 : gpukit_wg_desc(st + wg * 64 * 128 + kk * 32, 16, 1024);
        const gpukit_u64 db = TB ? gpukit_wg_desc(sb + kk * 2048, GG_BK * 128, 1024) : gpukit_wg_desc(sb + kk * 32, 16, 1024);
        if (PROBE != 1) gpukit_wg_ss<BN, TA, TB>::mma(d, da, db, 1);
      }
      gpukit_wg_commit();
      gpukit_wg_wait<1>();
      gpukit_keep_f<BN / 2>(d);
      cs++;
    }
    gpukit_wg_wait<0>();
    gpukit_keep_f<BN / 2>(d);

    // Epilogue: rows 64·wg + 16·warp + lane/4 (+8), columns 8j + 2·(lane%4).
    if (PROBE == 3) continue;
    const int rbase = g.m0 + wg * 64 + warp * 16 + (lane >> 2);
    TO* C = GK ? (TO*)a.c + (long long)g.e * a.sc : (TO*)a.c;
    const gpukit_bf16* bias = (!GK && a.bias) ? (const gpukit_bf16*)a.bias + (long long)g.e * a.N : nullptr;
#pragma unroll
    for (int j = 0; j < BN / 8; j++) {
      const int n = g.n0 + 8 * j + 2 * (lane & 3);
      if (n >= a.N) continue;
      float b0 = 0.0f, b1 = 0.0f;
      if (bias) {
        b0 = gpukit_ld(bias + n);
        b1 = gpukit_ld(bias + n + 1);
      }
#pragma unroll
      for (int h = 0; h < 2; h++) {
        const int m = rbase + 8 * h;
        if (m >= g.me) continue;
        const long long row = GK ? m : g.row0 + m;
        gg_store2(C + row * a.ldc + n, d[4 * j + 2 * h] + b0, d[4 * j + 2 * h + 1] + b1, a.acc);
      }
    }
  }
  gpukit_cp_wait0();  // the empty groups queued past the end
}

#define GG_WG_INSTANCE(NAME, BN, ST, TA, TB, GK, OSUF, TO)                                                     \
  extern "C" __global__ void __launch_bounds__(GG_THREADS, 1) gg_wg_##NAME##_##BN##OSUF(const gg_args a) { \
    gg_wg<BN, ST, TA, TB, GK, TO>(a);                                                                       \
  }
#define GG_WG_PROBE(P)                                                                                   \
  extern "C" __global__ void __launch_bounds__(GG_THREADS, 1) gg_wg_fwd_256_bf16_probe##P(const gg_args a) { \
    gg_wg<256, 4, false, false, false, gpukit_bf16, P>(a);                                              \
  }
GG_WG_PROBE(1)
GG_WG_PROBE(2)
GG_WG_PROBE(3)
#define GG_WG_INSTANCES(BN, ST)                                   \
  GG_WG_INSTANCE(fwd, BN, ST, false, false, false, _f32, float)   \
  GG_WG_INSTANCE(fwd, BN, ST, false, false, false, _bf16, gpukit_bf16) \
  GG_WG_INSTANCE(dx, BN, ST, false, true, false, _f32, float)     \
  GG_WG_INSTANCE(dx, BN, ST, false, true, false, _bf16, gpukit_bf16) \
  GG_WG_INSTANCE(dw, BN, ST, true, true, true, _f32, float)       \
  GG_WG_INSTANCE(dw, BN, ST, true, true, true, _bf16, gpukit_bf16)
GG_WG_INSTANCES(256, 4)
GG_WG_INSTANCES(128, 6)
#else
// Compiled for a target without wgmma: ops/groupedgemm.go finds this
// marker and launches gg_simt instead.
extern "C" __global__ void gg_wg_unavailable() {}
#endif  // GPUKIT_WGMMA

// ---- CUDA cores (any dtype) ----

#define GS_BM 64
#define GS_BN 64
#define GS_BK 16

// gs_at is the address of element (i, j) of a matrix with row stride ld
// at p (i the row).
template <typename T>
__device__ __forceinline__ float gs_ld(const T* p, long long i, long long j, long long ld) {
  return gpukit_ld(p + i * ld + j);
}

template <typename T, typename TO, bool TA, bool TB, bool GK>
__device__ __forceinline__ void gg_simt(const gg_args& a) {
  __shared__ int off_s[GG_MAXE + 1], ts_s[GG_MAXE + 1];
  __shared__ float As[GS_BK][GS_BM], Bs[GS_BK][GS_BN + 4];
  const int total = gg_schedule<GS_BM, GS_BN, GK>(a, off_s, ts_s);
  const int tid = threadIdx.x, tx = tid & 15, ty = tid >> 4;
  const T* A = (const T*)a.a;
  const T* B = (const T*)a.b;
#pragma unroll 1
  for (int t = blockIdx.x; t < total; t += gridDim.x) {
    const gg_tile g = gg_decode<GS_BM, GS_BN, GK>(a, off_s, ts_s, t);
    const T* Bg = GK ? B + g.row0 * a.ldb : B + (long long)g.e * a.sb;
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
      for (int j = 0; j < 4; j++) acc[i][j] = 0.0f;
#pragma unroll 1
    for (int k0 = 0; k0 < g.ke; k0 += GS_BK) {
#pragma unroll
      for (int i = 0; i < GS_BM * GS_BK / GG_THREADS; i++) {
        const int idx = tid + GG_THREADS * i;
        // K-major: k fastest across threads; MN-major: m (n) fastest.
        const int kk = TA ? idx / GS_BM : idx % GS_BK, mm = TA ? idx % GS_BM : idx / GS_BK;
        const int m = g.m0 + mm, k = k0 + kk;
        float v = 0.0f;
        if (m < g.me && k < g.ke) v = TA ? gs_ld(A, g.row0 + k, m, a.lda) : gs_ld(A, g.row0 + m, k, a.lda);
        As[kk][mm] = v;
        const int kb = TB ? idx / GS_BN : idx % GS_BK, nn = TB ? idx % GS_BN : idx / GS_BK;
        const int n = g.n0 + nn, kn = k0 + kb;
        float w = 0.0f;
        if (n < a.N && kn < g.ke) w = TB ? gs_ld(Bg, kn, n, a.ldb) : gs_ld(Bg, n, kn, a.ldb);
        Bs[kb][nn] = w;
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < GS_BK; kk++) {
        float av[4], bv[4];
#pragma unroll
        for (int i = 0; i < 4; i++) av[i] = As[kk][ty + 16 * i];
#pragma unroll
        for (int j = 0; j < 4; j++) bv[j] = Bs[kk][tx + 16 * j];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
          for (int j = 0; j < 4; j++) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
      }
      __syncthreads();
    }
    TO* C = GK ? (TO*)a.c + (long long)g.e * a.sc : (TO*)a.c;
    const T* bias = (!GK && a.bias) ? (const T*)a.bias + (long long)g.e * a.N : nullptr;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const int m = g.m0 + ty + 16 * i;
      if (m >= g.me) continue;
      const long long row = GK ? m : g.row0 + m;
#pragma unroll
      for (int j = 0; j < 4; j++) {
        const int n = g.n0 + tx + 16 * j;
        if (n >= a.N) continue;
        float v = acc[i][j];
        if (bias) v += gpukit_ld(bias + n);
        TO* p = C + row * a.ldc + n;
        if (a.acc) v += gpukit_ld(p);
        gpukit_st(p, v);
      }
    }
  }
}

#define GG_SIMT_INSTANCE(NAME, TA, TB, GK, SUF, T, TO)                                                   \
  extern "C" __global__ void __launch_bounds__(GG_THREADS) gg_simt_##NAME##SUF(const gg_args a) {       \
    gg_simt<T, TO, TA, TB, GK>(a);                                                                      \
  }
#define GG_SIMT_INSTANCES(NAME, TA, TB, GK)                                    \
  GG_SIMT_INSTANCE(NAME, TA, TB, GK, _f32_f32, float, float)                   \
  GG_SIMT_INSTANCE(NAME, TA, TB, GK, _bf16_f32, gpukit_bf16, float)            \
  GG_SIMT_INSTANCE(NAME, TA, TB, GK, _bf16_bf16, gpukit_bf16, gpukit_bf16)
GG_SIMT_INSTANCES(fwd, false, false, false)
GG_SIMT_INSTANCES(dx, false, true, false)
GG_SIMT_INSTANCES(dw, true, true, true)

// gg_colsum: db[e, n] (+)= Σ_{r in group e} dy[r, n]; grid (⌈N/32⌉, E),
// block (32, 8): each column's 8 partial sums meet in shared memory in a
// fixed order (deterministic).
template <typename T, typename TO>
__device__ __forceinline__ void gg_colsum(TO* db, const T* dy, const int* offsets, int rows, int N, long long ld,
                                          int acc) {
  __shared__ float part[8][33];
  const int e = blockIdx.y, n = blockIdx.x * 32 + threadIdx.x;
  const int lo = min(max(offsets[0], 0), rows);
  int r0 = lo, r1 = lo;
  for (int i = 0; i <= e; i++) {  // the clamped, non-decreasing offsets of gg_schedule
    r0 = r1;
    r1 = max(r0, min(max(offsets[i + 1], 0), rows));
  }
  float s = 0.0f;
  if (n < N)
    for (int r = r0 + threadIdx.y; r < r1; r += 8) s += gpukit_ld(dy + (long long)r * ld + n);
  part[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && n < N) {
    float t = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) t += part[i][threadIdx.x];
    TO* p = db + (long long)e * N + n;
    if (acc) t += gpukit_ld(p);
    gpukit_st(p, t);
  }
}

#define GG_COLSUM_INSTANCE(SUF, T, TO)                                                                     \
  extern "C" __global__ void gg_colsum##SUF(TO* db, const T* dy, const int* offsets, int rows, int N,      \
                                           long long ld, int acc) {                                       \
    gg_colsum<T, TO>(db, dy, offsets, rows, N, ld, acc);                                                   \
  }
GG_COLSUM_INSTANCE(_f32_f32, float, float)
GG_COLSUM_INSTANCE(_bf16_f32, gpukit_bf16, float)
GG_COLSUM_INSTANCE(_bf16_bf16, gpukit_bf16, gpukit_bf16)
