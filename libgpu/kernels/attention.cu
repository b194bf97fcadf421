// attention.cu: scaled dot-product attention (libgpu/ops/attention.go).
//
//   O = softmax(Q·Kᵀ·scale + mask)·V,   lse = log Σ_j exp(Q·Kᵀ·scale + mask)
//
// per batch item b and head h, with q [B,Tq,H,D], k and v [B,Tk,H,D], o
// [B,Tq,H,D] (any strides, the last dimension contiguous) and lse [B,H,Tq]
// f32. causal masks key j > query i (Tq == Tk). The algorithm is
// FlashAttention-2's (Dao, "FlashAttention-2: Faster Attention with Better
// Parallelism and Work Partitioning", 2023): K and V are streamed through
// shared memory in tiles while each query row keeps a running maximum m, a
// running sum l and an unnormalised output (the online softmax), so no
// Tq×Tk matrix is ever stored; lse = m + log l is saved for the backward,
// which recomputes P = exp(S − lse) tile by tile:
//
//   δ_i = Σ_d dO_id·O_id,   dS = P ∘ (dO·Vᵀ − δ),
//   dV = Pᵀ·dO,   dK = scale·dSᵀ·Q,   dQ = scale·dS·K.
//
// The backward is two passes, both deterministic (fixed summation order,
// no atomics): one over key blocks (dK, dV; loops over query tiles) and
// one over query blocks (dQ; loops over key tiles). FA2 accumulates dQ
// with float atomics from the key-block pass instead; the second pass
// costs two more tile products (S and dP recomputed) but makes the
// gradients bitwise reproducible, which graph-versus-eager checks need.
//
// Two implementations:
//
//   - *_tc_d64 / *_tc_d128: bf16 on tensor cores (mma.sync m16n8k16 bf16
//     with f32 accumulation, fragments loaded with ldmatrix, tiles copied
//     with cp.async double buffering). 64-row query and key tiles, 4 warps
//     of 16 rows each. They need 16-byte aligned rows: every base address
//     and every stride a multiple of 8 elements (ops checks).
//   - *_simt_{f32,bf16}: plain FMA on CUDA cores, any D ≤ 128, any
//     alignment: f32 inputs (full f32 accuracy) and the bf16 cases the
//     tensor-core kernels do not take.
//
// Plus attn_bwd_delta (δ), attn_decode (one query against a KV cache up to
// a position read on the device) and attn_kv_write (a step's k or v into
// the cache at that position).
//
// Dropout on P (nanoGPT's attn_dropout; FlashAttention's dropout, Dao et
// al. 2022, Algorithm 2): the *_drop kernels (attn_args.drop_p > 0; the
// plain ones are the p = 0 path, untouched) keep element (i, j) of head h
// of batch row b with the rule of dropout.cu — Philox4x32-10 under key
// seed at counter (q low, q high, site, step) for the group q = n/4 of the
// element index n = ((b0 + b)·H + h)·Tq + i)·Tk + j, word n mod 4, kept
// when u ≥ p — and scale kept elements by 1/(1−p):
//
//   O = (P∘Z)·V (lse the undropped one),   Z = mask/(1−p),
//   dV = (P∘Z)ᵀ·dO,   dS = P ∘ (Z∘(dO·Vᵀ) − δ),   δ_i = Σ_d dO_id·O_id
//
// (δ = Σ_j P_ij Z_ij dP_ij since O includes the dropout). The masks are
// recomputed, not stored; 1/(1−p) is applied to O and dV once at the end.
//
// The inline PTX sits in the wrappers of mma.cuh and wgmma.cuh (and
// attn_ex2 below); with GPUKIT_EMU defined (scripts/cudaemu) they are
// replaced by a host emulation of the same instructions, so the kernels
// can be run and checked on a machine without a GPU. Each tile loop is
// written once, from the templates under "tile steps" (and
// attn_tc_gemm_*, attn_wg_gemm_*): the variants (head dim, dropout,
// dtype) are template arguments of one kernel template per pass.
#include "common.cuh"
#include "mma.cuh"
#include "philox.cuh"
#include "vec.cuh"
#include "wgmma.cuh"
#include "mbarrier.cuh"

#define ATTN_INF __int_as_float(0x7f800000)
#define ATTN_LAZY 8.0f  // attn_softmax_frag's lazy rescale threshold, log2 units
#define ATTN_LOG2E 1.4426950408889634f
#define ATTN_LN2 0.6931471805599453f

// attn_args is the one parameter of every attention kernel except decode
// and kv_write; ops/attention.go mirrors it field for field (attnArgs).
// Strides are in elements: [0] batch, [1] time, [2] head.
struct attn_args {
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;        // [B,H,Tq]: written by the forward (may be null), read by the backward
  const void* dout;  // dO, o's shape
  void* dq;          // q's shape; null: not wanted
  void* dk;          // k's shape; null: not wanted
  void* dv;          // v's shape; null: not wanted
  float* delta;      // [B,H,Tq] f32: δ, written by attn_bwd_delta
  long long sq[3], sk[3], sv[3], so[3], sdo[3], sdq[3], sdk[3], sdv[3];
  int B, H, Tq, Tk;
  int D, causal;
  int acc_q, acc_k;  // add into dq / dk instead of overwriting
  int acc_v;
  int group;         // heads (b, h pairs) per group of the launch order (attn_block); 0: all in one
  float scale;       // the softmax scale (usually 1/√D)
  float scale_log2;  // scale·log2(e): scores are kept in base 2
  // Dropout on P (the *_drop kernels only): the i32 step counter (null:
  // step 0), the Philox key, the batch index of row 0 in the whole batch
  // (a data-parallel shard's first row), p and 1/(1−p), the call-site.
  const int* drop_counter;
  unsigned long long drop_seed;
  long long drop_b0;
  float drop_p, drop_scale;
  unsigned drop_site;
  int pad2;
};
static_assert(sizeof(attn_args) == 360, "attn_args layout: launch.AttnArgs is generated from it (go generate ./libgpu/kernels/launch)");

#ifndef ATTN_DYN_SMEM
#define ATTN_DYN_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

// ---- PTX wrappers ----
//
// mma.sync, ldmatrix and cp.async come from mma.cuh, wgmma from wgmma.cuh
// (both with their host emulation under GPUKIT_EMU); bf16 packing from
// vec.cuh.

#ifndef GPUKIT_EMU
// attn_ex2: 2^x on the multi-function unit (ex2.approx.ftz: relative error
// about 2^-22, −∞ → +0).
__device__ __forceinline__ float attn_ex2(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}
#else
__device__ __forceinline__ float attn_ex2(float x) { return exp2f(x); }
#endif

// attn_exp2 is 2^x by the kernel's choice: ex2.approx.ftz (EX2: the wgmma
// kernels) or exp2f (the mma.sync and CUDA-core kernels).
template <bool EX2>
__device__ __forceinline__ float attn_exp2(float x) {
  return EX2 ? attn_ex2(x) : exp2f(x);
}

// attn_unpack_lo / attn_unpack_hi widen the halves of a packed bf16 pair.
__device__ __forceinline__ float attn_unpack_lo(unsigned x) { return __uint_as_float(x << 16); }
__device__ __forceinline__ float attn_unpack_hi(unsigned x) { return __uint_as_float(x & 0xffff0000u); }

// attn_quad_max / attn_quad_sum reduce over the 4 lanes of a quad (lanes
// that share g = lane/4, i.e. one row of an mma fragment).
__device__ __forceinline__ float attn_quad_max(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float attn_quad_sum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// ---- dropout masks ----

// attn_dctx is a kernel's dropout state for one (b, h): the Philox key,
// site and step, p, and the element index of (query 0, key 0).
struct attn_dctx {
  unsigned k0, k1, site, step;
  float p;
  long long base;
};

__device__ __forceinline__ attn_dctx attn_dctx_make(const attn_args& a, int b, int h) {
  attn_dctx c;
  c.k0 = (unsigned)a.drop_seed;
  c.k1 = (unsigned)(a.drop_seed >> 32);
  c.site = a.drop_site;
  c.step = a.drop_counter ? (unsigned)*a.drop_counter : 0u;
  c.p = a.drop_p;
  c.base = ((a.drop_b0 + b) * a.H + h) * (long long)a.Tq * a.Tk;
  return c;
}

// attn_pick is r[w] without indexing a register array at run time.
__device__ __forceinline__ unsigned attn_pick(const unsigned r[4], int w) {
  return w == 0 ? r[0] : w == 1 ? r[1] : w == 2 ? r[2] : r[3];
}

// attn_keep_bit: 1 when the uniform (r >> 8)·2⁻²⁴ is ≥ p (dropout.cu's rule).
__device__ __forceinline__ unsigned attn_keep_bit(unsigned r, float p) {
  return (float)(r >> 8) * 5.9604644775390625e-08f >= p ? 1u : 0u;
}

// attn_keep1 is the keep bit of element n (n ≥ 0).
__device__ __forceinline__ unsigned attn_keep1(const attn_dctx& c, long long n) {
  const unsigned long long q = (unsigned long long)n >> 2;
  unsigned r[4] = {(unsigned)q, (unsigned)(q >> 32), c.site, c.step};
  gpukit_philox4x32_10(r, c.k0, c.k1);
  return attn_keep_bit(attn_pick(r, (int)(n & 3)), c.p);
}

// attn_keep2 is the keep bits of elements n (bit 0) and n + dn (bit 1):
// one Philox call when both fall in one group of 4.
__device__ __forceinline__ unsigned attn_keep2(const attn_dctx& c, long long n, long long dn) {
  const unsigned long long q = (unsigned long long)n >> 2;
  unsigned r[4] = {(unsigned)q, (unsigned)(q >> 32), c.site, c.step};
  gpukit_philox4x32_10(r, c.k0, c.k1);
  const int w = (int)(n & 3);
  const unsigned k = attn_keep_bit(attn_pick(r, w), c.p);
  if (dn == 1 && w < 3) return k | attn_keep_bit(attn_pick(r, w + 1), c.p) << 1;
  return k | attn_keep1(c, n + dn) << 1;
}

// attn_keep4 is the keep bits of the aligned group of four elements n .. n+3
// (n % 4 == 0): bit i for element n + i, from one Philox call (the four
// words attn_keep1 would draw one at a time).
__device__ __forceinline__ unsigned attn_keep4(const attn_dctx& c, long long n) {
  const unsigned long long q = (unsigned long long)n >> 2;
  unsigned r[4] = {(unsigned)q, (unsigned)(q >> 32), c.site, c.step};
  gpukit_philox4x32_10(r, c.k0, c.k1);
  return attn_keep_bit(r[0], c.p) | attn_keep_bit(r[1], c.p) << 1 | attn_keep_bit(r[2], c.p) << 2 |
         attn_keep_bit(r[3], c.p) << 3;
}

// attn_drop_bits is the keep mask of this thread's elements of an mma
// accumulator fragment of NJ n-tiles (16 rows from row0 by 8·NJ columns
// from col0): bit 4j+e for element (j, e), at row row0 + lane/4 + 8(e/2),
// column col0 + 8j + 2(lane%4) + e%2, whose element index is c.base +
// row·rs + column·cs (rs = Tk, cs = 1 for rows of queries; rs = 1, cs =
// Tk for the transposed products, rows of keys). Called by whole warps.
//
// Each Philox call gives the keep bits of an aligned group of 4 elements
// (attn_keep4), and a group's elements lie in 2 lanes (rows of queries:
// lanes t, t^1 of a row) or 4 (rows of keys: the 4 lanes of one column
// whose rows g share g/4). When the groups are aligned to the fragment
// (Tk and the first element a multiple of 4), each lane draws one group
// per n-tile and the lanes swap them by shuffles: one Philox call per 8
// elements of a warp's tile instead of one per 2 (rows of queries) or per
// element (rows of keys). The mask is the same element for element.
template <int NJ>
__device__ __forceinline__ unsigned long long attn_drop_bits(const attn_dctx& c, int row0, int col0, long long rs,
                                                             long long cs) {
  static_assert(NJ <= 16, "attn_drop_bits: 4 bits per n-tile in 64");
  const int lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
  const long long n00 = c.base + (long long)row0 * rs + (long long)col0 * cs;
  constexpr unsigned long long ONES = ~0ull >> (64 - 4 * NJ);  // a 1 in every nibble's 4 bits
  constexpr unsigned long long B0 = ONES / 15;                 // bit 0 of every nibble
  if (((n00 | (cs == 1 ? rs : cs)) & 3) == 0) {
    unsigned long long mine = 0;  // nibble j: the keep bits of this lane's group of n-tile j
    if (cs == 1) {
      // Rows of queries: lane t draws row g + 8(t&1)'s group of columns
      // 8j + 4(t/2) .. +3; its own columns are 2(t&1), 2(t&1)+1 of the
      // group, and its partner t^1 drew the other row's group.
      const int h = t & 1;
#pragma unroll
      for (int j = 0; j < NJ; j++)
        mine |= (unsigned long long)attn_keep4(c, n00 + (long long)(g + 8 * h) * rs + 8 * j + 4 * (t >> 1)) << (4 * j);
      const unsigned long long other = __shfl_xor_sync(0xffffffffu, mine, 1);
      const unsigned long long a = (mine >> (2 * h)) & (3 * B0), b = (other >> (2 * h)) & (3 * B0);
      return h == 0 ? a | b << 2 : b | a << 2;
    }
    // Rows of keys: lane q = g&3 of a column's quad draws the group of
    // rows 4(g/4) + 8r .. +3 at column 8j + 2t + e, (r, e) = (q/2, q&1);
    // it needs bit q of each of the quad's 4 groups.
    const int q = g & 3;
#pragma unroll
    for (int j = 0; j < NJ; j++)
      mine |= (unsigned long long)attn_keep4(c, n00 + 4 * (g >> 2) + 8 * (q >> 1) + (long long)(8 * j + 2 * t + (q & 1)) * cs)
              << (4 * j);
    unsigned long long bits = 0;
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const unsigned long long w = __shfl_sync(0xffffffffu, mine, (lane & ~12) | (e << 2));
      bits |= ((w >> q) & B0) << e;
    }
    return bits;
  }
  // Unaligned (Tk not a multiple of 4): two elements per call where they
  // share a group (attn_keep2).
  unsigned long long bits = 0;
#pragma unroll 1
  for (int j = 0; j < NJ; j++) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const long long n = c.base + (long long)(row0 + g + 8 * r) * rs + (long long)(col0 + 8 * j + 2 * t) * cs;
      bits |= (unsigned long long)attn_keep2(c, n, cs) << (4 * j + 2 * r);
    }
  }
  return bits;
}

// attn_drop_f zeroes the dropped elements of a fragment s[4j+e].
template <int NJ>
__device__ __forceinline__ void attn_drop_f(float* s, unsigned long long bits) {
#pragma unroll
  for (int i = 0; i < 4 * NJ; i++)
    if (!((bits >> i) & 1)) s[i] = 0.0f;
}

// attn_half_mask turns 2 keep bits into the mask of a packed bf16 pair.
__device__ __forceinline__ unsigned attn_half_mask(unsigned long long b2) {
  return ((b2 & 1) ? 0x0000ffffu : 0u) | ((b2 & 2) ? 0xffff0000u : 0u);
}

// ---- tile steps shared by the kernels ----
//
// An accumulator fragment (mma.sync's 16 × 8·NJ, or a warp's 16 rows of a
// wgmma 64 × 8·NJ product) is float x[4·NJ]: x[4j+e] is row lane/4 +
// 8·(e/2), column 8j + 2·(lane%4) + e%2 (float x[NJ][4] is the same
// memory). Every kernel's tile loop is written from these steps.

// attn_head is row 0 of head h of batch item b of a [B,T,H,D] tensor p
// with strides st (batch, time, head; elements).
template <typename T>
__device__ __forceinline__ T* attn_head(const void* p, const long long st[3], int b, int h) {
  return (T*)p + b * st[0] + h * st[2];
}

// attn_store_pair writes two adjacent outputs (4-byte aligned bf16 pair),
// adding what is there when acc.
__device__ __forceinline__ void attn_store_pair(gpukit_bf16* p, float x0, float x1, int acc) {
  unsigned* u = (unsigned*)p;
  if (acc) {
    unsigned old = *u;
    x0 += attn_unpack_lo(old);
    x1 += attn_unpack_hi(old);
  }
  *u = gpukit_pack_bf16x2(x0, x1);
}

// attn_tile_masked: whether any element of a key tile of BN keys from
// kbase can be masked for queries from row0 on (keys past Tk; causal: keys
// after the query); attn_key_masked: whether element e of n-tile j of a
// fragment of that tile (key kbase + 8j + 2·(lane%4) + e%2, query qrow +
// 8·(e/2)) is.
__device__ __forceinline__ bool attn_tile_masked(int kbase, int BN, int row0, const attn_args& a) {
  return kbase + BN > a.Tk || (a.causal && kbase + BN - 1 > row0);
}
__device__ __forceinline__ bool attn_key_masked(int kbase, int j, int e, int qrow, const attn_args& a) {
  const int key = kbase + j * 8 + 2 * (threadIdx.x & 3) + (e & 1), qi = qrow + (e >> 1) * 8;
  return key >= a.Tk || (a.causal && key > qi);
}

// attn_pos is a block's place in the work: batch row b, head h, and z, its
// row block along gridDim.z (query blocks, or key blocks for dK/dV).
struct attn_pos {
  int b, h, z;
};

// attn_block maps the launch order to the work (the grid is (H, B, row
// blocks); blocks start in the order of x + X·(y + Y·z)) so that blocks
// reading the same K and V (forward, dQ) or Q and dO (dK/dV) run at the
// same time and find them in L2: the B·H heads are taken in groups of
// a.group, and a group's row blocks start before the next group's, z
// slowest within it (the longest rows first: see attn_qblock), the heads
// of the group fastest. group 0 is one group of all heads: z slowest over
// the whole grid (the order before groups; with 128 heads of 1 MiB K and V
// at T = 2048, D = 128, every tile then came from DRAM again for each query
// block: 14% L2 hits against cuDNN's 74%, ncu, one H200). The host sizes
// a group so that its K and V fit in a part of L2 (ops/attention.go).
template <typename I>
__device__ __forceinline__ attn_pos attn_block_in(I X, I bh, I nz, I G) {
  const I i = blockIdx.x + X * (blockIdx.y + (I)gridDim.y * blockIdx.z);
  const I first = i / (G * nz) * G;    // this group's first head
  const I gs = min(G, bh - first);     // heads in this group (the last may have fewer)
  const I r = i - first * nz;
  const I hb = first + r % gs;  // b·H + h
  return attn_pos{(int)(hb / X), (int)(hb % X), (int)(r / gs)};
}
__device__ __forceinline__ attn_pos attn_block(const attn_args& a) {
  const unsigned long long X = gridDim.x, nz = gridDim.z, bh = X * gridDim.y;
  if (a.group <= 0 || (unsigned long long)a.group >= bh) return attn_pos{(int)blockIdx.y, (int)blockIdx.x, (int)blockIdx.z};
  if (bh * nz <= 0xffffffffull)  // 32-bit divisions where the block count allows
    return attn_block_in<unsigned>((unsigned)X, (unsigned)bh, (unsigned)nz, (unsigned)a.group);
  return attn_block_in<unsigned long long>(X, bh, nz, (unsigned long long)a.group);
}

// attn_qblock is the first query row of this block of BM rows: the row
// blocks run in reverse (the longest causal rows start first).
__device__ __forceinline__ int attn_qblock(int BM, const attn_pos& p) { return ((int)gridDim.z - 1 - p.z) * BM; }

// attn_key_tiles is how many key tiles of BN the query rows [q0, q0+BM)
// see: every key, or (causal) the keys up to the block's last row.
__device__ __forceinline__ int attn_key_tiles(int q0, int BM, int BN, const attn_args& a) {
  const int kend = a.causal ? min(a.Tk, q0 + BM) : a.Tk;
  return (kend + BN - 1) / BN;
}

template <int N>
__device__ __forceinline__ void attn_zero(float* x) {
#pragma unroll
  for (int i = 0; i < N; i++) x[i] = 0.0f;
}

// attn_softmax_frag turns s (this thread's two rows, qrow and qrow + 8, of
// a 16 × 8·NJ score fragment of key tile kbase) into unnormalised
// probabilities in place: scaled to base 2, masked (keys past Tk; causal:
// keys after the query; row0 is the first query row the tile can hold,
// which decides whether any element needs the test), the running maximum m
// updated, the row sums l rescaled and added to; alpha[r] is the factor
// the rows' output accumulators must be multiplied by (attn_rescale).
// The per-element test is compiled only into the masked variant and the
// tile branches between the two: a single body with `mask && test` was
// if-converted by ptxas, so every tile paid the test and a select on all
// its elements (the wgmma forward's loop: 149 ISETP and 66 FSEL of 1,159
// instructions, sm_90a SASS).
//
// RAW (the wgmma forward) takes the maximum over the raw scores and folds
// the scale into the exponent, p = 2^(s·c − m) as one FFMA before ex2
// (FlashAttention-2's softmax_scale_log2), which saves a multiply per
// score; it needs c = scale·log2 e > 0 (so that −∞·c = −∞ for masked
// scores), so the kernel negates Q when the scale is negative
// (attn_wg_negate) and passes attn_raw_c(a): |c|, and the smallest normal
// float for a zero scale (every finite s·c then rounds to 0, as it should).
// m is in the scaled (base-2) domain either way; c is a.scale_log2 when
// !RAW.
//
// RAW also rescales lazily (FlashAttention-4's conditional rescaling): the
// running maximum m a row's probabilities are taken against moves only when
// the tile's maximum exceeds it by more than ATTN_LAZY = 8 (so P ≤ 2^8 and
// the sums stay far from overflow) in some row of the warp; otherwise alpha
// is 1 and the function returns false, and the caller skips multiplying
// the output accumulators. O/l and lse = m + log2 l are the same
// quantities against any m, so only rounding differs.
template <int NJ, bool EX2, bool MASK, bool RAW>
__device__ __forceinline__ bool attn_softmax_frag_m(float* s, float m[2], float l[2], float alpha[2], int kbase,
                                                    int qrow, float c, const attn_args& a) {
#pragma unroll
  for (int j = 0; j < NJ; j++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float x = RAW ? s[4 * j + e] : s[4 * j + e] * c;
      if (MASK && attn_key_masked(kbase, j, e, qrow, a)) x = -ATTN_INF;
      s[4 * j + e] = x;
    }
  }
  float mx[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    mx[r] = -ATTN_INF;
#pragma unroll
    for (int j = 0; j < NJ; j++) mx[r] = fmaxf(mx[r], fmaxf(s[4 * j + 2 * r], s[4 * j + 2 * r + 1]));
    mx[r] = attn_quad_max(mx[r]);
    if (RAW) mx[r] *= c;
  }
  // RAW: the maximum moves only when some row of the warp grew by more than
  // ATTN_LAZY (log2 units), else the stale one stays and no rescale is due.
  const bool upd = !RAW || __any_sync(0xffffffffu, mx[0] > m[0] + ATTN_LAZY || mx[1] > m[1] + ATTN_LAZY);
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const float mnew = upd ? fmaxf(m[r], mx[r]) : m[r];
    const float mu = mnew == -ATTN_INF ? 0.0f : mnew;  // a row with every key masked so far
    alpha[r] = upd ? attn_exp2<EX2>(m[r] - mu) : 1.0f;
    float rs = 0.0f;
#pragma unroll
    for (int j = 0; j < NJ; j++) {
      float p[2];
#pragma unroll
      for (int e = 0; e < 2; e++) {
        const float x = s[4 * j + 2 * r + e];
        p[e] = attn_exp2<EX2>(RAW ? fmaf(x, c, -mu) : x - mu);
        s[4 * j + 2 * r + e] = p[e];
      }
      rs += p[0] + p[1];
    }
    l[r] = (upd ? l[r] * alpha[r] : l[r]) + rs;  // this thread's part of the row sum; quads add up at the end
    m[r] = mnew;
  }
  return upd;
}
template <int NJ, bool EX2, bool RAW = false>
__device__ __forceinline__ bool attn_softmax_frag(float* s, float m[2], float l[2], float alpha[2], int kbase,
                                                  int row0, int qrow, float c, const attn_args& a) {
  if (attn_tile_masked(kbase, 8 * NJ, row0, a))
    return attn_softmax_frag_m<NJ, EX2, true, RAW>(s, m, l, alpha, kbase, qrow, c, a);
  return attn_softmax_frag_m<NJ, EX2, false, RAW>(s, m, l, alpha, kbase, qrow, c, a);
}

// attn_raw_c is attn_softmax_frag's c for RAW (see there).
__device__ __forceinline__ float attn_raw_c(const attn_args& a) { return fmaxf(fabsf(a.scale_log2), 1.17549435e-38f); }

// attn_rescale multiplies an output fragment's two rows by alpha[0], alpha[1].
template <int NJ>
__device__ __forceinline__ void attn_rescale(float* o, const float alpha[2]) {
#pragma unroll
  for (int i = 0; i < NJ; i++) {
    o[4 * i + 0] *= alpha[0];
    o[4 * i + 1] *= alpha[0];
    o[4 * i + 2] *= alpha[1];
    o[4 * i + 3] *= alpha[1];
  }
}

// attn_pack_frag rounds a 16 × 8·NJ fragment s to the bf16 A fragments of
// a product over its columns: k-step kk (columns 16kk..16kk+15) is n-tiles
// 2kk and 2kk+1.
template <int NJ>
__device__ __forceinline__ void attn_pack_frag(unsigned p[][4], const float* s) {
#pragma unroll
  for (int kk = 0; kk < NJ / 2; kk++) {
    p[kk][0] = gpukit_pack_bf16x2(s[8 * kk + 0], s[8 * kk + 1]);
    p[kk][1] = gpukit_pack_bf16x2(s[8 * kk + 2], s[8 * kk + 3]);
    p[kk][2] = gpukit_pack_bf16x2(s[8 * kk + 4], s[8 * kk + 5]);
    p[kk][3] = gpukit_pack_bf16x2(s[8 * kk + 6], s[8 * kk + 7]);
  }
}

// gpukit_keep_frag_mask is p with the dropped elements of keep mask km (bit
// 4j+e per element, attn_drop_bits) zeroed, for packed fragments p[NJ/2].
template <int NJ>
__device__ __forceinline__ void gpukit_keep_frag_mask(unsigned out[][4], const unsigned p[][4], unsigned long long km) {
#pragma unroll
  for (int kk = 0; kk < NJ / 2; kk++) {
#pragma unroll
    for (int w = 0; w < 4; w++) out[kk][w] = p[kk][w] & attn_half_mask(km >> (8 * kk + 2 * w));
  }
}

// attn_bwd_p: P = exp2(S·scale·log2e − lse·log2e) in place over a score
// fragment s of queries × keys (rows qrow, qrow + 8; lse2 their lse·log2e),
// zero where masked (keys past Tk; causal: keys after the query; row0 as
// in attn_softmax_frag, and like it the test only in the masked variant).
template <int NJ, bool EX2, bool MASK>
__device__ __forceinline__ void attn_bwd_p_m(float* s, const float lse2[2], int kbase, int qrow, const attn_args& a) {
#pragma unroll
  for (int j = 0; j < NJ; j++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      float p = attn_exp2<EX2>(s[4 * j + e] * a.scale_log2 - lse2[e >> 1]);
      if (MASK && attn_key_masked(kbase, j, e, qrow, a)) p = 0.0f;
      s[4 * j + e] = p;
    }
  }
}
template <int NJ, bool EX2>
__device__ __forceinline__ void attn_bwd_p(float* s, const float lse2[2], int kbase, int row0, int qrow,
                                           const attn_args& a) {
  if (attn_tile_masked(kbase, 8 * NJ, row0, a))
    attn_bwd_p_m<NJ, EX2, true>(s, lse2, kbase, qrow, a);
  else
    attn_bwd_p_m<NJ, EX2, false>(s, lse2, kbase, qrow, a);
}

// attn_bwd_ds: dS = P ∘ (dP − δ) into dp, over the fragment of attn_bwd_p
// (dl: the rows' δ). Dropout: dP of dropped elements is 0, of kept ones
// dP/(1−p) (km as in gpukit_keep_frag_mask).
template <int NJ, bool DROP>
__device__ __forceinline__ void attn_bwd_ds(float* dp, const float* p, const float dl[2], unsigned long long km,
                                            float drop_scale) {
#pragma unroll
  for (int i = 0; i < 4 * NJ; i++) {
    float dpv = dp[i];
    if (DROP) dpv = ((km >> i) & 1) ? dpv * drop_scale : 0.0f;
    dp[i] = p[i] * (dpv - dl[(i >> 1) & 1]);
  }
}

// attn_bwd_pt: Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e) in place over a
// transposed score fragment st (keys krow, krow + 8 × queries qbase +
// column; lt: the tile's lse·log2e by column, +∞ past Tq so P is 0 there),
// zero where mask (the tile may cross the causal diagonal) and the key is
// after the query (the test only in the masked variant, as in
// attn_softmax_frag).
template <int NJ, bool EX2, bool MASK>
__device__ __forceinline__ void attn_bwd_pt_m(float* st, const float* lt, int qbase, int krow, const attn_args& a) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < NJ; j++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const int qc = j * 8 + 2 * t + (e & 1);
      float p = attn_exp2<EX2>(st[4 * j + e] * a.scale_log2 - lt[qc]);
      if (MASK && krow + (e >> 1) * 8 > qbase + qc) p = 0.0f;
      st[4 * j + e] = p;
    }
  }
}
template <int NJ, bool EX2>
__device__ __forceinline__ void attn_bwd_pt(float* st, const float* lt, int qbase, int krow, bool mask,
                                            const attn_args& a) {
  if (mask)
    attn_bwd_pt_m<NJ, EX2, true>(st, lt, qbase, krow, a);
  else
    attn_bwd_pt_m<NJ, EX2, false>(st, lt, qbase, krow, a);
}

// attn_bwd_dst: dSᵀ = Pᵀ ∘ (dPᵀ − δ) into dpt, Pᵀ from its packed bf16
// copy pp (attn_pack_frag), dt the tile's δ by column; dropout as in
// attn_bwd_ds.
template <int NJ, bool DROP>
__device__ __forceinline__ void attn_bwd_dst(float* dpt, const unsigned pp[][4], const float* dt,
                                             unsigned long long km, float drop_scale) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int j = 0; j < NJ; j++) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
      const unsigned w = pp[j >> 1][(j & 1) * 2 + (e >> 1)];
      const float p = (e & 1) ? attn_unpack_hi(w) : attn_unpack_lo(w);
      float dpv = dpt[4 * j + e];
      if (DROP) dpv = ((km >> (4 * j + e)) & 1) ? dpv * drop_scale : 0.0f;
      dpt[4 * j + e] = p * (dpv - dt[j * 8 + 2 * t + (e & 1)]);
    }
  }
}

// attn_store_frag writes the rows row, row + 8 (those < T) of an output
// fragment x of 8·ND columns, times scale, to the bf16 matrix at base (row
// stride ld), adding what is there when acc.
template <int ND>
__device__ __forceinline__ void attn_store_frag(gpukit_bf16* base, long long ld, int row, int T, const float* x,
                                                float scale, int acc) {
  const int t = threadIdx.x & 3;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int i = row + r * 8;
    if (i >= T) continue;
    gpukit_bf16* p = base + (long long)i * ld;
#pragma unroll
    for (int j = 0; j < ND; j++) attn_store_pair(p + j * 8 + 2 * t, x[4 * j + 2 * r] * scale, x[4 * j + 2 * r + 1] * scale, acc);
  }
}

// attn_fwd_out is the forward's end: row r of O = o/l·(drop scale) (l
// summed over the quad here), lse = m + log l (natural log; −∞ for a row
// with no key).
template <int ND, bool DROP>
__device__ __forceinline__ void attn_fwd_out(const float* o, const float m[2], const float l[2], int qrow, int b,
                                             int h, const attn_args& a) {
  const int t = threadIdx.x & 3;
  gpukit_bf16* O = attn_head<gpukit_bf16>(a.o, a.so, b, h);
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const float lr = attn_quad_sum(l[r]);
    const int qi = qrow + r * 8;
    if (qi >= a.Tq) continue;
    const float inv = lr > 0.0f ? (DROP ? a.drop_scale : 1.0f) / lr : 0.0f;
    gpukit_bf16* orow = O + (long long)qi * a.so[1];
#pragma unroll
    for (int j = 0; j < ND; j++) attn_store_pair(orow + j * 8 + 2 * t, o[4 * j + 2 * r] * inv, o[4 * j + 2 * r + 1] * inv, 0);
    if (t == 0 && a.lse) {
      a.lse[((long long)b * a.H + h) * a.Tq + qi] = lr > 0.0f ? (m[r] + log2f(lr)) * ATTN_LN2 : -ATTN_INF;
    }
  }
}

// attn_row_stats reads the lse·log2e and δ of this thread's query rows
// qrow, qrow + 8 (0 past Tq).
__device__ __forceinline__ void attn_row_stats(float lse2[2], float dl[2], int qrow, long long bh, const attn_args& a) {
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int qi = qrow + r * 8;
    lse2[r] = qi < a.Tq ? a.lse[bh + qi] * ATTN_LOG2E : 0.0f;
    dl[r] = qi < a.Tq ? a.delta[bh + qi] : 0.0f;
  }
}

// attn_tile_stats fills n entries of a tile's lse·log2e (+∞ past Tq) and δ
// (0 past Tq) for the queries from qbase (plain shared stores, threads
// 0..n−1: a barrier orders them before use).
__device__ __forceinline__ void attn_tile_stats(float* sl, float* sd, int n, int qbase, long long bh,
                                                const attn_args& a) {
  if ((int)threadIdx.x < n) {
    const int qi = qbase + threadIdx.x;
    sl[threadIdx.x] = qi < a.Tq ? a.lse[bh + qi] * ATTN_LOG2E : ATTN_INF;
    sd[threadIdx.x] = qi < a.Tq ? a.delta[bh + qi] : 0.0f;
  }
}

// ---- tensor-core kernels (bf16, D = 64 or 128) ----
//
// Shared tiles are 64 rows of D bf16, rows padded to D+8 elements so that
// the 8 rows an ldmatrix reads fall in 8 different 16-byte bank groups.
// Every block has 128 threads: warp w owns rows 16w..16w+15 of its block's
// 64 queries (forward, dQ) or keys (dK/dV).

#define ATTN_TC_THREADS 128

// attn_tile_load queues the cp.async copies of rows [r0, r0+64) of a
// [T, D] matrix whose row 0 is at g (row stride ld elements) into the
// shared tile at address s; rows at or past T are zero-filled.
template <int D>
__device__ __forceinline__ void attn_tile_load(unsigned s, const gpukit_bf16* g, long long ld, int r0, int T) {
  constexpr int LDS = D + 8, CH = D / 8;  // 16-byte chunks per row
#pragma unroll
  for (int i = 0; i < 64 * CH / ATTN_TC_THREADS; i++) {
    int c = threadIdx.x + i * ATTN_TC_THREADS;
    int r = c / CH, col = (c % CH) * 8;
    int row = r0 + r;
    bool ok = row < T;
    gpukit_cp16(s + (r * LDS + col) * 2, ok ? g + (long long)row * ld + col : g, ok);
  }
}

// Fragment addresses for ldmatrix.x4 on a padded tile (row stride LDS):
// gpukit_a_addr, gpukit_b_addr and gpukit_bt_addr (mma.cuh).

// attn_tc_mma_nt is one k-step of C += A·Bᵀ over 64 columns: a the A
// fragment (16 rows × 16 of k), B's 64 rows (n) × 16 columns from column
// k0 of the tile at s stored [n][k] (row stride LDS); c[8][4].
template <int LDS>
__device__ __forceinline__ void attn_tc_mma_nt(float c[][4], const unsigned a[4], unsigned s, int k0, int lane) {
#pragma unroll
  for (int np = 0; np < 4; np++) {
    unsigned kb[4];
    gpukit_ldsm_x4(kb, gpukit_b_addr<LDS>(s, np * 16, k0, lane));
    gpukit_mma_bf16(c[2 * np], a, kb[0], kb[1]);
    gpukit_mma_bf16(c[2 * np + 1], a, kb[2], kb[3]);
  }
}

// attn_tc_gemm_nt: C (16 × 64) += A·Bᵀ over KD k-steps, A the 16 rows from
// row a0 of the tile at sa, B the 64 rows of the tile at sb (both [row][k]).
template <int LDS, int KD>
__device__ __forceinline__ void attn_tc_gemm_nt(float c[][4], unsigned sa, int a0, unsigned sb, int lane) {
#pragma unroll
  for (int kk = 0; kk < KD; kk++) {
    unsigned af[4];
    gpukit_ldsm_x4(af, gpukit_a_addr<LDS>(sa, a0, kk * 16, lane));
    attn_tc_mma_nt<LDS>(c, af, sb, kk * 16, lane);
  }
}

// attn_tc_gemm_nn: C (16 × 8·ND) += P·B, P the packed A fragments of a 16
// × 64 fragment (attn_pack_frag: 4 k-steps), B the 64 × 8·ND tile at sb
// stored [k][n] (read with .trans).
template <int LDS, int ND>
__device__ __forceinline__ void attn_tc_gemm_nn(float c[][4], const unsigned p[][4], unsigned sb, int lane) {
#pragma unroll
  for (int kk = 0; kk < 4; kk++) {
#pragma unroll
    for (int np = 0; np < ND / 2; np++) {
      unsigned vb[4];
      gpukit_ldsm_x4_t(vb, gpukit_bt_addr<LDS>(sb, kk * 16, np * 16, lane));
      gpukit_mma_bf16(c[2 * np], p[kk], vb[0], vb[1]);
      gpukit_mma_bf16(c[2 * np + 1], p[kk], vb[2], vb[3]);
    }
  }
}

// attn_fwd_tc: grid (H, B, ⌈Tq/64⌉), the query blocks in reverse (the
// longest causal rows start first). Shared memory: K and V tiles, two of
// each (the next pair is copied while the current one is used); the Q tile
// borrows the second K tile until it is in registers. 4·64·(D+8)·2 bytes.
template <int D, bool DROP>
__device__ __forceinline__ void attn_fwd_tc(const attn_args& a) {
  constexpr int LDS = D + 8, TILE = 64 * LDS * 2 /* bytes */, KD = D / 16, ND = D / 8;
  ATTN_DYN_SMEM(attn_smem);
  const unsigned sK = gpukit_smem_addr(attn_smem);
  const unsigned sV = sK + 2 * TILE;
  const unsigned sQ = sK + TILE;
  const attn_pos pos = attn_block(a);
  const int h = pos.h, b = pos.b;
  const int q0 = attn_qblock(64, pos);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
  const gpukit_bf16* Q = attn_head<const gpukit_bf16>(a.q, a.sq, b, h);
  const gpukit_bf16* K = attn_head<const gpukit_bf16>(a.k, a.sk, b, h);
  const gpukit_bf16* V = attn_head<const gpukit_bf16>(a.v, a.sv, b, h);
  const int ntiles = attn_key_tiles(q0, 64, 64, a);

  attn_tile_load<D>(sQ, Q, a.sq[1], q0, a.Tq);
  attn_tile_load<D>(sK, K, a.sk[1], 0, a.Tk);
  attn_tile_load<D>(sV, V, a.sv[1], 0, a.Tk);
  gpukit_cp_commit();
  gpukit_cp_wait0();
  __syncthreads();
  unsigned qf[KD][4];
#pragma unroll
  for (int kk = 0; kk < KD; kk++) gpukit_ldsm_x4(qf[kk], gpukit_a_addr<LDS>(sQ, warp * 16, kk * 16, lane));
  __syncthreads();  // the Q tile's space (K buffer 1) is free

  float o[ND][4];
  attn_zero<D / 2>(&o[0][0]);
  float m[2] = {-ATTN_INF, -ATTN_INF}, l[2] = {0.0f, 0.0f}, alpha[2];
  const int qrow = q0 + warp * 16 + g;  // this thread's rows: qrow, qrow + 8
  const attn_dctx dc = DROP ? attn_dctx_make(a, b, h) : attn_dctx{};

  for (int it = 0; it < ntiles; it++) {
    const int buf = it & 1, kbase = it * 64;
    if (it + 1 < ntiles) {
      attn_tile_load<D>(sK + (buf ^ 1) * TILE, K, a.sk[1], kbase + 64, a.Tk);
      attn_tile_load<D>(sV + (buf ^ 1) * TILE, V, a.sv[1], kbase + 64, a.Tk);
      gpukit_cp_commit();
    }
    const unsigned ks = sK + buf * TILE, vs = sV + buf * TILE;

    // S = Q·Kᵀ: 16 rows × 64 keys per warp, 8 n-tiles of 8 keys.
    float s[8][4];
    attn_zero<32>(&s[0][0]);
#pragma unroll
    for (int kk = 0; kk < KD; kk++) attn_tc_mma_nt<LDS>(s, qf[kk], ks, kk * 16, lane);
    attn_softmax_frag<8, false>(&s[0][0], m, l, alpha, kbase, q0, qrow, a.scale_log2, a);
    attn_rescale<ND>(&o[0][0], alpha);
    // Dropout: l has the undropped sums; P·V takes the kept elements.
    if (DROP) attn_drop_f<8>(&s[0][0], attn_drop_bits<8>(dc, q0 + warp * 16, kbase, a.Tk, 1));
    // O += P·V: P's accumulator fragments are the A fragments of the
    // product (16 keys per k-step), V is stored [key][d]: .trans.
    unsigned pa[4][4];
    attn_pack_frag<8>(pa, &s[0][0]);
    attn_tc_gemm_nn<LDS, ND>(o, pa, vs, lane);
    if (it + 1 < ntiles) gpukit_cp_wait0();
    __syncthreads();  // the next tiles have landed; this pair may be overwritten
  }
  attn_fwd_out<ND, DROP>(&o[0][0], m, l, qrow, b, h, a);
}

// attn_bwd_dq_tc: dQ = scale·dS·K over key tiles, grid (H, B, ⌈Tq/64⌉) in
// reverse like the forward. Shared memory: the Q and dO tiles (resident)
// and two K and two V tiles: 6·64·(D+8)·2 bytes.
template <int D, bool DROP>
__device__ __forceinline__ void attn_bwd_dq_tc(const attn_args& a) {
  constexpr int LDS = D + 8, TILE = 64 * LDS * 2 /* bytes */, KD = D / 16, ND = D / 8;
  ATTN_DYN_SMEM(attn_smem);
  const unsigned sQ = gpukit_smem_addr(attn_smem);
  const unsigned sO = sQ + TILE;  // dO
  const unsigned sK = sQ + 2 * TILE;
  const unsigned sV = sQ + 4 * TILE;
  const attn_pos pos = attn_block(a);
  const int h = pos.h, b = pos.b;
  const int q0 = attn_qblock(64, pos);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
  const gpukit_bf16* Q = attn_head<const gpukit_bf16>(a.q, a.sq, b, h);
  const gpukit_bf16* dO = attn_head<const gpukit_bf16>(a.dout, a.sdo, b, h);
  const gpukit_bf16* K = attn_head<const gpukit_bf16>(a.k, a.sk, b, h);
  const gpukit_bf16* V = attn_head<const gpukit_bf16>(a.v, a.sv, b, h);
  const int ntiles = attn_key_tiles(q0, 64, 64, a);

  attn_tile_load<D>(sQ, Q, a.sq[1], q0, a.Tq);
  attn_tile_load<D>(sO, dO, a.sdo[1], q0, a.Tq);
  attn_tile_load<D>(sK, K, a.sk[1], 0, a.Tk);
  attn_tile_load<D>(sV, V, a.sv[1], 0, a.Tk);
  gpukit_cp_commit();

  const int qrow = q0 + warp * 16 + g;
  const long long bh = ((long long)b * a.H + h) * a.Tq;
  float lse2[2], dl[2];
  attn_row_stats(lse2, dl, qrow, bh, a);
  float dq[ND][4];
  attn_zero<D / 2>(&dq[0][0]);
  const attn_dctx dc = DROP ? attn_dctx_make(a, b, h) : attn_dctx{};
  gpukit_cp_wait0();
  __syncthreads();

  for (int it = 0; it < ntiles; it++) {
    const int buf = it & 1, kbase = it * 64;
    if (it + 1 < ntiles) {
      attn_tile_load<D>(sK + (buf ^ 1) * TILE, K, a.sk[1], kbase + 64, a.Tk);
      attn_tile_load<D>(sV + (buf ^ 1) * TILE, V, a.sv[1], kbase + 64, a.Tk);
      gpukit_cp_commit();
    }
    const unsigned ks = sK + buf * TILE, vs = sV + buf * TILE;
    // S = Q·Kᵀ and dP = dO·Vᵀ (both 16 × 64 per warp).
    float s[8][4], dp[8][4];
    attn_zero<32>(&s[0][0]);
    attn_zero<32>(&dp[0][0]);
    attn_tc_gemm_nt<LDS, KD>(s, sQ, warp * 16, ks, lane);
    attn_tc_gemm_nt<LDS, KD>(dp, sO, warp * 16, vs, lane);
    // dS = P ∘ (dP − δ), P = exp2(S·scale·log2e − lse·log2e); masked → 0.
    // Dropout: dP of dropped elements is 0, of kept ones dP/(1−p).
    const unsigned long long km = DROP ? attn_drop_bits<8>(dc, q0 + warp * 16, kbase, a.Tk, 1) : 0ull;
    attn_bwd_p<8, false>(&s[0][0], lse2, kbase, q0, qrow, a);
    attn_bwd_ds<8, DROP>(&dp[0][0], &s[0][0], dl, km, a.drop_scale);
    // dQ += dS·K: K is stored [key][d], the k dimension: .trans.
    unsigned da[4][4];
    attn_pack_frag<8>(da, &dp[0][0]);
    attn_tc_gemm_nn<LDS, ND>(dq, da, ks, lane);
    if (it + 1 < ntiles) gpukit_cp_wait0();
    __syncthreads();
  }
  attn_store_frag<ND>(attn_head<gpukit_bf16>(a.dq, a.sdq, b, h), a.sdq[1], qrow, a.Tq, &dq[0][0], a.scale, a.acc_q);
}

// attn_bwd_dkdv_tc: dV = Pᵀ·dO and dK = scale·dSᵀ·Q over query tiles, grid
// (H, B, ⌈Tk/64⌉) (key block 0, which sees every query under causal, first).
// Each warp works on the transposed products (its 16 keys × 64 queries).
// Shared memory: the K and V tiles (resident), two Q and two dO tiles, and
// two tiles each of lse·log2e and δ: 6·64·(D+8)·2 + 4·64·4 bytes.
template <int D, bool DROP>
__device__ __forceinline__ void attn_bwd_dkdv_tc(const attn_args& a) {
  constexpr int LDS = D + 8, TILE = 64 * LDS * 2 /* bytes */, KD = D / 16, ND = D / 8;
  ATTN_DYN_SMEM(attn_smem);
  const unsigned sK = gpukit_smem_addr(attn_smem);
  const unsigned sV = sK + TILE;
  const unsigned sQ = sK + 2 * TILE;  // [2]
  const unsigned sO = sK + 4 * TILE;  // dO [2]
  float* sL = (float*)(attn_smem + 6 * TILE);  // [2][64] lse·log2e (+∞ past Tq)
  float* sD = sL + 128;                 // [2][64] δ
  const attn_pos pos = attn_block(a);
  const int h = pos.h, b = pos.b;
  const int k0 = pos.z * 64;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2;
  const gpukit_bf16* Q = attn_head<const gpukit_bf16>(a.q, a.sq, b, h);
  const gpukit_bf16* dO = attn_head<const gpukit_bf16>(a.dout, a.sdo, b, h);
  const gpukit_bf16* K = attn_head<const gpukit_bf16>(a.k, a.sk, b, h);
  const gpukit_bf16* V = attn_head<const gpukit_bf16>(a.v, a.sv, b, h);
  const long long bh = ((long long)b * a.H + h) * a.Tq;
  const int qstart = a.causal ? k0 / 64 : 0;  // causal: queries before k0 see none of these keys
  const int qtiles = (a.Tq + 63) / 64;

  attn_tile_load<D>(sK, K, a.sk[1], k0, a.Tk);
  attn_tile_load<D>(sV, V, a.sv[1], k0, a.Tk);
  if (qstart < qtiles) {
    attn_tile_load<D>(sQ, Q, a.sq[1], qstart * 64, a.Tq);
    attn_tile_load<D>(sO, dO, a.sdo[1], qstart * 64, a.Tq);
    attn_tile_stats(sL, sD, 64, qstart * 64, bh, a);
  }
  gpukit_cp_commit();

  float dk[ND][4], dv[ND][4];
  attn_zero<D / 2>(&dk[0][0]);
  attn_zero<D / 2>(&dv[0][0]);
  const int krow = k0 + warp * 16 + g;  // this thread's keys: krow, krow + 8
  const attn_dctx dc = DROP ? attn_dctx_make(a, b, h) : attn_dctx{};
  gpukit_cp_wait0();
  __syncthreads();

  for (int qt = qstart; qt < qtiles; qt++) {
    const int buf = (qt - qstart) & 1, qbase = qt * 64;
    if (qt + 1 < qtiles) {
      attn_tile_load<D>(sQ + (buf ^ 1) * TILE, Q, a.sq[1], qbase + 64, a.Tq);
      attn_tile_load<D>(sO + (buf ^ 1) * TILE, dO, a.sdo[1], qbase + 64, a.Tq);
      gpukit_cp_commit();
      attn_tile_stats(sL + (buf ^ 1) * 64, sD + (buf ^ 1) * 64, 64, qbase + 64, bh, a);
    }
    const unsigned qs = sQ + buf * TILE, os = sO + buf * TILE;
    const float* lt = sL + buf * 64;
    const float* dt = sD + buf * 64;

    // Sᵀ = K·Qᵀ (16 keys × 64 queries per warp); Pᵀ = exp2(Sᵀ·scale·log2e −
    // lse·log2e), zero where masked (and past Tq, where lse is +∞).
    float st[8][4];
    attn_zero<32>(&st[0][0]);
    attn_tc_gemm_nt<LDS, KD>(st, sK, warp * 16, qs, lane);
    attn_bwd_pt<8, false>(&st[0][0], lt, qbase, krow, a.causal && qbase < k0 + 64 /* the diagonal tile */, a);
    // Pᵀ packed to bf16: the A fragments of dV += Pᵀ·dO (16 queries per k-step).
    unsigned pp[4][4];
    attn_pack_frag<8>(pp, &st[0][0]);
    // Dropout: the keep mask of Pᵀ (keys × queries: element index
    // base + query·Tk + key); dV takes the kept elements, dS all of P.
    const unsigned long long km = DROP ? attn_drop_bits<8>(dc, k0 + warp * 16, qbase, 1, a.Tk) : 0ull;
    // dV += Pᵀ·dO: dO is stored [query][d], the k dimension: .trans.
    if (DROP) {
      unsigned pk[4][4];
      gpukit_keep_frag_mask<8>(pk, pp, km);
      attn_tc_gemm_nn<LDS, ND>(dv, pk, os, lane);
    } else {
      attn_tc_gemm_nn<LDS, ND>(dv, pp, os, lane);
    }
    // dPᵀ = V·dOᵀ, then dSᵀ = Pᵀ ∘ (dPᵀ − δ) (Pᵀ from its bf16 copy).
    float dpt[8][4];
    attn_zero<32>(&dpt[0][0]);
    attn_tc_gemm_nt<LDS, KD>(dpt, sV, warp * 16, os, lane);
    attn_bwd_dst<8, DROP>(&dpt[0][0], pp, dt, km, a.drop_scale);
    attn_pack_frag<8>(pp, &dpt[0][0]);
    // dK += dSᵀ·Q: Q is stored [query][d]: .trans.
    attn_tc_gemm_nn<LDS, ND>(dk, pp, qs, lane);
    if (qt + 1 < qtiles) gpukit_cp_wait0();
    __syncthreads();
  }

  if (a.dk) attn_store_frag<ND>(attn_head<gpukit_bf16>(a.dk, a.sdk, b, h), a.sdk[1], krow, a.Tk, &dk[0][0], a.scale, a.acc_k);
  if (a.dv)
    attn_store_frag<ND>(attn_head<gpukit_bf16>(a.dv, a.sdv, b, h), a.sdv[1], krow, a.Tk, &dv[0][0],
                        DROP ? a.drop_scale : 1.0f, a.acc_v);
}

// Instances: attn_<fwd|bwd_dq|bwd_dkdv>_tc[_drop]_d<D> (_drop: dropout on P).
#define ATTN_TC_INSTANCES(DROPSUF, DROP)                                                                              \
  extern "C" __global__ void __launch_bounds__(ATTN_TC_THREADS) attn_fwd_tc##DROPSUF##_d64(const attn_args a) {       \
    if constexpr (GPUKIT_KEEP(attn_fwd_tc##DROPSUF##_d64)) attn_fwd_tc<64, DROP>(a);                                  \
  }                                                                                                                   \
  extern "C" __global__ void __launch_bounds__(ATTN_TC_THREADS) attn_fwd_tc##DROPSUF##_d128(const attn_args a) {      \
    if constexpr (GPUKIT_KEEP(attn_fwd_tc##DROPSUF##_d128)) attn_fwd_tc<128, DROP>(a);                                \
  }                                                                                                                   \
  extern "C" __global__ void __launch_bounds__(ATTN_TC_THREADS) attn_bwd_dq_tc##DROPSUF##_d64(const attn_args a) {    \
    if constexpr (GPUKIT_KEEP(attn_bwd_dq_tc##DROPSUF##_d64)) attn_bwd_dq_tc<64, DROP>(a);                            \
  }                                                                                                                   \
  extern "C" __global__ void __launch_bounds__(ATTN_TC_THREADS) attn_bwd_dq_tc##DROPSUF##_d128(const attn_args a) {   \
    if constexpr (GPUKIT_KEEP(attn_bwd_dq_tc##DROPSUF##_d128)) attn_bwd_dq_tc<128, DROP>(a);                          \
  }                                                                                                                   \
  extern "C" __global__ void __launch_bounds__(ATTN_TC_THREADS) attn_bwd_dkdv_tc##DROPSUF##_d64(const attn_args a) {  \
    if constexpr (GPUKIT_KEEP(attn_bwd_dkdv_tc##DROPSUF##_d64)) attn_bwd_dkdv_tc<64, DROP>(a);                        \
  }                                                                                                                   \
  extern "C" __global__ void __launch_bounds__(ATTN_TC_THREADS) attn_bwd_dkdv_tc##DROPSUF##_d128(const attn_args a) { \
    if constexpr (GPUKIT_KEEP(attn_bwd_dkdv_tc##DROPSUF##_d128)) attn_bwd_dkdv_tc<128, DROP>(a);                      \
  }
ATTN_TC_INSTANCES(, false)
ATTN_TC_INSTANCES(_drop, true)

// ---- Hopper kernels (sm_90a): wgmma ----
//
// The forward on warpgroup MMA (wgmma.mma_async, sm_90a only): the
// algorithm of the kernels above with FlashAttention-3's structure for one
// consumer warpgroup per 64 query rows (Shah et al., "FlashAttention-3:
// Fast and Accurate Attention with Asynchrony and Low-precision", 2024):
// S = Q·Kᵀ with Q and K in shared memory, O += P·V with P from registers
// (the S accumulators, rounded to bf16, are the A fragments as they are)
// and V in shared memory read N-major (no transpose copy), and the
// intra-warpgroup overlap: the S product of key tile j and the P·V product
// of tile j−1 are issued together, and the softmax of tile j (exp2 on the
// multi-function unit) runs while the tensor cores do P·V. Tiles arrive by
// cp.async (all threads, double buffered, one tile ahead), made visible to
// the tensor cores' async proxy by fence.proxy.async before the barrier.
// No TMA and no producer warps (a later step).
//
// Shared tiles are 128-byte swizzled, the layout wgmma's descriptors name
// with swizzle mode 1: a tile of R rows × D bf16 is D/64 panels of R rows ×
// 128 bytes (64 columns), panel p at p·R·128; 16-byte chunk c of row r of a
// panel sits at r·128 + ((c ^ (r%8))·16); every tile starts on a 1024-byte
// boundary. K-major operands (Q, K: rows are M or N, 16 elements of K per
// wgmma) use start = panel + row offset + 32·(k-step % 4), stride byte
// offset (8-row groups) 1024; the N-major V (rows are keys = K of P·V)
// uses start = tile + 2048·k-step, leading byte offset (64-column panels)
// R·128 and stride byte offset (8-key groups) 1024. The PTX ISA's
// "Asynchronous Warpgroup Level Matrix Shared Memory Layout" defines these;
// scripts/cudaemu emulates wgmma on exactly these layouts.
//
// Block: 256 threads (two warpgroups), 128 query rows (warpgroup w owns
// rows 64w..64w+63, warp w' of it rows 16w'.. as in the mma.sync kernels),
// key tiles of 128. Accumulator fragments: s[4j+e] (and o[4j+e]) is row
// 16·warp + lane/4 + 8·(e/2), column 8j + 2·(lane%4) + e%2 of the
// warpgroup's 64 × N product.

// wgmma.cuh defines GPUKIT_WGMMA for sm_90a (NVRTC's
// __CUDA_ARCH_FEAT_SM90_ALL, or __CUDA_ARCH_SPECIFIC__ = 900 from CUDA
// 12.9); for sm_90 and other targets the kernels below are stubs and
// ops/attention.go does not launch them.

#define ATTN_WG_THREADS 256
#define ATTN_WG_BM 128  // query rows per block
#define ATTN_WG_BN 128  // keys per tile

#ifdef GPUKIT_WGMMA
// attn_wg_landed waits for this thread's cp.async copies, makes them
// visible to the tensor cores (fence.proxy.async) and meets the block's
// barrier: every thread's copies are in, every earlier read is done.
__device__ __forceinline__ void attn_wg_landed() {
  gpukit_cp_wait0();
  gpukit_fence_proxy_async();
  __syncthreads();
}

// attn_wg_load queues the cp.async copies of rows [r0, r0+R) of a [T, D]
// bf16 matrix (row 0 at g, row stride ld) into the swizzled tile at
// shared address s; rows at or past T are zero-filled. NT threads copy
// (threadIdx.x < NT: 256 in the kernels whose two warpgroups load their
// own tiles, 128 for a producer warpgroup); thread t copies chunk t%CH
// (CH = D/8 chunks of 16 bytes a row) of rows t/CH + i·RS (RS = NT/CH, a
// multiple of 8, so the swizzle term is the same for every i): its shared
// addresses step by RS·128 bytes and its global ones by RS rows, and only
// a tile that crosses T tests rows. (Written as c = t + 256·i, r = c/CH
// per copy, the addressing took ~300 of the forward loop's ~900
// instructions a tile, sm_90a SASS.)
//
// attn_wg_chunk is this thread's first chunk of such a tile: its shared
// byte offset in the tile (so), its row (r) and column chunk (ch); its
// i-th chunk is RS rows (RS·128 bytes) further.
template <int D, int R, int NT>
struct attn_wg_chunk {
  static constexpr int CH = D / 8, RS = NT / CH, N = R / RS;
  static_assert(RS % 8 == 0 && R % RS == 0, "attn_wg_chunk: tile shape");
  int r, ch;
  unsigned so;
  __device__ __forceinline__ attn_wg_chunk()
      : r(threadIdx.x / CH), ch(threadIdx.x % CH), so((ch >> 3) * (R * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4)) {}
};
template <int D, int R, int NT = ATTN_WG_THREADS>
__device__ __forceinline__ void attn_wg_load(unsigned s, const gpukit_bf16* g, long long ld, int r0, int T) {
  if constexpr (D > 128) {  // D/128 tiles of 128 columns: two 64-column panels each
#pragma unroll
    for (int p = 0; p < D / 128; p++) attn_wg_load<128, R, NT>(s + p * 2 * (R * 128), g + p * 128, ld, r0, T);
  } else {
    using C = attn_wg_chunk<D, R, NT>;
    constexpr int RS = C::RS, N = C::N;
    const C k;
    const int r = k.r;
    const unsigned so = s + k.so;
    const gpukit_bf16* p = g + (long long)(r0 + r) * ld + k.ch * 8;
    const long long step = (long long)RS * ld;
    if (r0 + R <= T) {
#pragma unroll
      for (int i = 0; i < N; i++) gpukit_cp16(so + i * (RS * 128), p + i * step, true);
    } else {
#pragma unroll
      for (int i = 0; i < N; i++) {
        const bool ok = r0 + r + i * RS < T;
        gpukit_cp16(so + i * (RS * 128), ok ? p + i * step : g, ok);
      }
    }
  }
}

// attn_wg_negate flips the sign of the elements this thread copied into
// the tile of R rows at shared address s with attn_wg_load (base: the
// dynamic block, at shared address sbase), between its wait for them and
// the fence and barrier that hand the tile to the tensor cores.
template <int D, int R, int NT = ATTN_WG_THREADS>
__device__ __forceinline__ void attn_wg_negate(unsigned char* base, unsigned sbase, unsigned s) {
  if constexpr (D > 128) {  // as attn_wg_load
#pragma unroll
    for (int p = 0; p < D / 128; p++) attn_wg_negate<128, R, NT>(base, sbase, s + p * 2 * (R * 128));
  } else {
    using C = attn_wg_chunk<D, R, NT>;
    const unsigned so = s - sbase + C().so;
#pragma unroll
    for (int i = 0; i < C::N; i++) {
      unsigned* x = (unsigned*)(base + so + i * (C::RS * 128));
#pragma unroll
      for (int w = 0; w < 4; w++) x[w] ^= 0x80008000u;  // the sign bits of 8 bf16
    }
  }
}

// attn_wg_gemm_ss: D (64 × N) = A·Bᵀ over KD k-steps, both operands
// K-major in swizzled tiles (attn_wg_load): A the warpgroup's 64 rows
// starting at address a of a tile of AR rows, B the N rows of the tile at
// b (BR rows). The first k-step overwrites d.
template <int N, int KD, int AR, int BR>
__device__ __forceinline__ void attn_wg_gemm_ss(float* d, unsigned a, unsigned b) {
#pragma unroll
  for (int kk = 0; kk < KD; kk++)
    gpukit_wg_ss<N, 0, 0>::mma(d, gpukit_wg_desc(a + (kk >> 2) * (AR * 128) + (kk & 3) * 32, 16, 1024),
                          gpukit_wg_desc(b + (kk >> 2) * (BR * 128) + (kk & 3) * 32, 16, 1024), kk > 0);
}

// attn_wg_scores_now: S = Q·Kᵀ (attn_wg_gemm_ss) issued alone and waited
// for: a forward's first key tile, with no P·V to overlap.
template <int BN, int KD, int AR>
__device__ __forceinline__ void attn_wg_scores_now(float* s, unsigned qa, unsigned kt) {
  gpukit_keep_f<BN / 2>(s);
  gpukit_wg_fence();
  attn_wg_gemm_ss<BN, KD, AR, BN>(s, qa, kt);
  gpukit_wg_commit();
  gpukit_wg_wait<0>();
  gpukit_keep_f<BN / 2>(s);
}

// attn_wg_gemm_rs: D (64 × N) += P·B, P's KS k-steps from registers
// (attn_pack_frag), B the 16·KS × N swizzled tile at b read N-major (R
// rows: the tile's row count).
template <int N, int KS, int R>
__device__ __forceinline__ void attn_wg_gemm_rs(float* d, const unsigned p[][4], unsigned b) {
#pragma unroll
  for (int kk = 0; kk < KS; kk++) gpukit_wg_rs<N, 1>::mma(d, p[kk], gpukit_wg_desc(b + kk * 2048, R * 128, 1024), 1);
}

// attn_fwd_wg: grid (H, B, ⌈Tq/128⌉), the query blocks in reverse (the
// longest causal rows start first). Shared memory (from the first 1024-byte
// boundary of the dynamic block, 1 KiB of slack requested): Q [128][D],
// two K and two V tiles [128][D]: 160 KiB for D = 128, 80 KiB for D = 64.
// Iteration j: (1) wait for this thread's copies, fence.proxy.async,
// barrier: K_j and V_{j−1} are in, and every warpgroup is done with K_{j−1}
// and V_{j−2}; (2) queue K_{j+1} and V_j into those buffers; (3) issue
// S_j = Q·K_jᵀ and O += P_{j−1}·V_{j−1}; wait for S_j; softmax; wait for
// P·V; rescale O; P_j = bf16(S_j). Tile 0 is peeled off (no P·V), so the
// loop issues and waits for the same wgmma groups every time.
template <int D, bool DROP>
__device__ __forceinline__ void attn_fwd_wg(const attn_args& a) {
  constexpr int BM = ATTN_WG_BM, BN = ATTN_WG_BN, KD = D / 16, ND = D / 8;
  constexpr unsigned QT = BM * D * 2, KT = BN * D * 2;  // tile bytes
  ATTN_DYN_SMEM(attn_smem);
  const unsigned sQ = (gpukit_smem_addr(attn_smem) + 1023u) & ~1023u;
  const unsigned sK = sQ + QT, sV = sK + 2 * KT;
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2;
  const attn_pos pos = attn_block(a);
  const int h = pos.h, b = pos.b;
  const int q0 = attn_qblock(BM, pos);
  const gpukit_bf16* Q = attn_head<const gpukit_bf16>(a.q, a.sq, b, h);
  const gpukit_bf16* K = attn_head<const gpukit_bf16>(a.k, a.sk, b, h);
  const gpukit_bf16* V = attn_head<const gpukit_bf16>(a.v, a.sv, b, h);
  const int ntiles = attn_key_tiles(q0, BM, BN, a);
  const int row0 = q0 + wg * 64 + warp * 16;  // this warp's first query
  const int qrow = row0 + g;                  // this thread's queries: qrow, qrow + 8
  // This warpgroup's Q rows, k-step kk: panel kk/4, 32 bytes per k-step.
  const unsigned qa = sQ + wg * 64 * 128;

  attn_wg_load<D, BM>(sQ, Q, a.sq[1], q0, a.Tq);
  attn_wg_load<D, BN>(sK, K, a.sk[1], 0, a.Tk);
  gpukit_cp_commit();

  float s[BN / 2], o[D / 2];
  unsigned p[BN / 16][4];
  attn_zero<BN / 2>(s);
  attn_zero<D / 2>(o);
  float m[2] = {-ATTN_INF, -ATTN_INF}, l[2] = {0.0f, 0.0f}, alpha[2];
  const attn_dctx dc = DROP ? attn_dctx_make(a, b, h) : attn_dctx{};
  const float c = attn_raw_c(a);  // attn_softmax_frag's RAW form; Q negated below when scale < 0

  // Tile 0: S_0 alone (no P·V before it).
  gpukit_cp_wait0();
  if (a.scale_log2 < 0.0f) attn_wg_negate<D, BM>(attn_smem, gpukit_smem_addr(attn_smem), sQ);
  gpukit_fence_proxy_async();
  __syncthreads();
  if (ntiles > 1) attn_wg_load<D, BN>(sK + KT, K, a.sk[1], BN, a.Tk);
  attn_wg_load<D, BN>(sV, V, a.sv[1], 0, a.Tk);
  gpukit_cp_commit();
  attn_wg_scores_now<BN, KD, BM>(s, qa, sK);
  attn_softmax_frag<BN / 8, true, true>(s, m, l, alpha, 0, row0, qrow, c, a);
  if (DROP) attn_drop_f<BN / 8>(s, attn_drop_bits<BN / 8>(dc, row0, 0, a.Tk, 1));  // l is undropped
  attn_pack_frag<BN / 8>(p, s);

  for (int j = 1; j < ntiles; j++) {
    attn_wg_landed();
    if (j + 1 < ntiles) attn_wg_load<D, BN>(sK + ((j + 1) & 1) * KT, K, a.sk[1], (j + 1) * BN, a.Tk);
    attn_wg_load<D, BN>(sV + (j & 1) * KT, V, a.sv[1], j * BN, a.Tk);
    gpukit_cp_commit();

    gpukit_keep_f<BN / 2>(s);
    gpukit_keep_f<D / 2>(o);
    gpukit_keep_u<BN / 4>(&p[0][0]);
    gpukit_wg_fence();
    attn_wg_gemm_ss<BN, KD, BM, BN>(s, qa, sK + (j & 1) * KT);
    gpukit_wg_commit();
    attn_wg_gemm_rs<D, BN / 16, BN>(o, p, sV + ((j - 1) & 1) * KT);
    gpukit_wg_commit();
    gpukit_wg_wait<1>();
    gpukit_keep_f<BN / 2>(s);
    const bool resc = attn_softmax_frag<BN / 8, true, true>(s, m, l, alpha, j * BN, row0, qrow, c, a);
    if (DROP) attn_drop_f<BN / 8>(s, attn_drop_bits<BN / 8>(dc, row0, j * BN, a.Tk, 1));
    gpukit_wg_wait<0>();
    gpukit_keep_f<D / 2>(o);
    gpukit_keep_u<BN / 4>(&p[0][0]);
    if (resc) attn_rescale<ND>(o, alpha);
    attn_pack_frag<BN / 8>(p, s);
  }
  // The last P·V.
  attn_wg_landed();
  gpukit_keep_f<D / 2>(o);
  gpukit_keep_u<BN / 4>(&p[0][0]);
  gpukit_wg_fence();
  attn_wg_gemm_rs<D, BN / 16, BN>(o, p, sV + ((ntiles - 1) & 1) * KT);
  gpukit_wg_commit();
  gpukit_wg_wait<0>();
  gpukit_keep_f<D / 2>(o);
  attn_fwd_out<ND, DROP>(o, m, l, qrow, b, h, a);
}


// attn_dkdv_regs is one warpgroup's registers in the dK/dV pass on wgmma
// (attn_bwd_dkdv_wg, attn_bwd_dkdv_ws): the dK and dV accumulators of its
// 64 keys, Sᵀ and dPᵀ of a BM-query tile, and packed Pᵀ and dSᵀ, zeroed
// (the first tile's waits read them).
template <int D, int BM>
struct attn_dkdv_regs {
  float dk[D / 2], dv[D / 2], st[BM / 2], dpt[BM / 2];
  unsigned pp[BM / 16][4], ds[BM / 16][4];
  __device__ __forceinline__ attn_dkdv_regs() {
    attn_zero<D / 2>(dk);
    attn_zero<D / 2>(dv);
    attn_zero<BM / 2>(st);
    attn_zero<BM / 2>(dpt);
#pragma unroll
    for (int i = 0; i < BM / 16; i++) pp[i][0] = pp[i][1] = pp[i][2] = pp[i][3] = ds[i][0] = ds[i][1] = ds[i][2] = ds[i][3] = 0u;
  }
  // store waits for the last dV and dK and writes them (rows krow,
  // krow + 8; dK times scale, dV times 1/(1−p) with dropout).
  template <bool DROP>
  __device__ __forceinline__ void store(int krow, int b, int h, const attn_args& a) {
    gpukit_wg_wait<0>();
    gpukit_keep_f<D / 2>(dk);
    gpukit_keep_f<D / 2>(dv);
    if (a.dk) attn_store_frag<D / 8>(attn_head<gpukit_bf16>(a.dk, a.sdk, b, h), a.sdk[1], krow, a.Tk, dk, a.scale, a.acc_k);
    if (a.dv)
      attn_store_frag<D / 8>(attn_head<gpukit_bf16>(a.dv, a.sdv, b, h), a.sdv[1], krow, a.Tk, dv,
                             DROP ? a.drop_scale : 1.0f, a.acc_v);
  }
};

// attn_dq_regs is one warpgroup's registers in the dQ pass on wgmma
// (attn_bwd_dq_wg, attn_bwd_dq_ws): the dQ accumulator of its 64 queries,
// S and dP of a BN-key tile and packed dS, zeroed.
template <int D, int BN>
struct attn_dq_regs {
  float dq[D / 2], s[BN / 2], dp[BN / 2];
  unsigned ds[BN / 16][4];
  __device__ __forceinline__ attn_dq_regs() {
    attn_zero<D / 2>(dq);
    attn_zero<BN / 2>(s);
    attn_zero<BN / 2>(dp);
#pragma unroll
    for (int i = 0; i < BN / 16; i++) ds[i][0] = ds[i][1] = ds[i][2] = ds[i][3] = 0u;
  }
  // store issues the last dQ += dS·K (K of the last of n tiles at klast),
  // waits, and writes dQ times scale (rows qrow, qrow + 8).
  __device__ __forceinline__ void store(int n, unsigned klast, int qrow, int b, int h, const attn_args& a) {
    if (n > 0) {
      gpukit_keep_u<BN / 4>(&ds[0][0]);
      gpukit_keep_f<D / 2>(dq);
      gpukit_wg_fence();
      attn_wg_gemm_rs<D, BN / 16, BN>(dq, ds, klast);
      gpukit_wg_commit();
    }
    gpukit_wg_wait<0>();
    gpukit_keep_f<D / 2>(dq);
    attn_store_frag<D / 8>(attn_head<gpukit_bf16>(a.dq, a.sdq, b, h), a.sdq[1], qrow, a.Tq, dq, a.scale, a.acc_q);
  }
};

// attn_dkdv_tile is query tile qbase of the dK/dV pass on wgmma for one
// warpgroup's 64 keys (attn_bwd_dkdv_wg's order, see there): Sᵀ and dPᵀ
// from K and V rows ka, va and the tile's Q and dO at qt, ot; Pᵀ with the
// tile's lse·log2e lt; dV += Pᵀ·dO; dSᵀ with its δ dt; dK += dSᵀ·Q, left in
// flight. after_s runs once the wait after Sᵀ has retired the previous
// tile's dV and dK (attn_bwd_dkdv_ws releases that tile's stage there).
// BM = 64 queries a tile, BN = 128 keys a block.
template <int D, bool DROP, class AfterS>
__device__ __forceinline__ void attn_dkdv_tile(float* dk, float* dv, float* st, float* dpt, unsigned pp[][4],
                                               unsigned ds[][4], unsigned ka, unsigned va, unsigned qt, unsigned ot,
                                               const float* lt, const float* dt, int qbase, int krow0,
                                               const attn_dctx& dc, const attn_args& a, AfterS after_s) {
  constexpr int BM = 64, BN = 128, KD = D / 16;
  const int krow = krow0 + ((threadIdx.x & 31) >> 2);  // this thread's keys: krow, krow + 8
  gpukit_keep_f<BM / 2>(st);
  gpukit_keep_f<BM / 2>(dpt);
  gpukit_wg_fence();
  attn_wg_gemm_ss<BM, KD, BN, BM>(st, ka, qt);
  gpukit_wg_commit();
  attn_wg_gemm_ss<BM, KD, BN, BM>(dpt, va, ot);
  gpukit_wg_commit();
  // Dropout: the keep mask of Pᵀ (keys × queries: element index base +
  // query·Tk + key), drawn while Sᵀ and dPᵀ are on the tensor cores.
  const unsigned long long km = DROP ? attn_drop_bits<BM / 8>(dc, krow0, qbase, 1, a.Tk) : 0ull;
  gpukit_wg_wait<1>();
  gpukit_keep_f<BM / 2>(st);
  gpukit_keep_u<BM / 4>(&pp[0][0]);
  gpukit_keep_u<BM / 4>(&ds[0][0]);
  after_s();

  // Pᵀ, zero where masked (causal: key after the query) and past Tq (lse +∞).
  attn_bwd_pt<BM / 8, true>(st, lt, qbase, krow, a.causal && qbase < krow0 + 15, a);
  attn_pack_frag<BM / 8>(pp, st);
  gpukit_keep_u<BM / 4>(&pp[0][0]);
  if (DROP) {
    // dV's A operand is the kept part of Pᵀ, in ds (free: dK of i−1 has
    // retired); pp keeps all of Pᵀ for dS.
    gpukit_keep_frag_mask<BM / 8>(ds, pp, km);
    gpukit_keep_u<BM / 4>(&ds[0][0]);
  }
  gpukit_wg_fence();
  // dV += Pᵀ·dO (dO N-major: 16 queries per k-step).
  attn_wg_gemm_rs<D, BM / 16, BM>(dv, DROP ? ds : pp, ot);
  gpukit_wg_commit();
  if (DROP) {
    gpukit_wg_wait<0>();  // dV has read ds before dS overwrites it
    gpukit_keep_u<BM / 4>(&ds[0][0]);
  } else {
    gpukit_wg_wait<1>();
  }
  gpukit_keep_f<BM / 2>(dpt);
  // dSᵀ = Pᵀ ∘ (dPᵀ − δ), Pᵀ from its bf16 copy.
  attn_bwd_dst<BM / 8, DROP>(dpt, pp, dt, km, a.drop_scale);
  attn_pack_frag<BM / 8>(ds, dpt);
  gpukit_keep_u<BM / 4>(&ds[0][0]);
  gpukit_wg_fence();
  // dK += dSᵀ·Q (Q N-major).
  attn_wg_gemm_rs<D, BM / 16, BM>(dk, ds, qt);
  gpukit_wg_commit();
}

// attn_bwd_dkdv_wg: dV = Pᵀ·dO and dK = scale·dSᵀ·Q over query tiles of 64,
// grid (H, B, ⌈Tk/128⌉) (key block 0, which sees every query under causal,
// first). 256 threads: warpgroup w owns keys 64w..64w+63 of the block and
// works on the transposed products (keys × queries) so that Pᵀ and dSᵀ are
// the A operands of dV and dK straight from their accumulators:
//   Sᵀ = K·Qᵀ, dPᵀ = V·dOᵀ (m64n64k16, both operands in shared memory),
//   Pᵀ = exp2(Sᵀ·scale·log2e − lse·log2e), dSᵀ = Pᵀ ∘ (dPᵀ − δ),
//   dV += Pᵀ·dO, dK += dSᵀ·Q (m64nDk16, A from registers, dO and Q N-major).
// Shared memory (from a 1024-byte boundary): K and V [128][D] resident,
// three stages of Q and dO [64][D] and of lse·log2e and δ [64] f32. Query
// tile i: (1) wait, fence.proxy.async, barrier; (2) queue tile i+1 (its
// stage held tile i−2, whose last reader, dK of i−2, retired during i−1);
// (3) issue Sᵀ and dPᵀ; wait for Sᵀ (this also retires dV and dK of i−1);
// Pᵀ; issue dV; wait for dPᵀ; dSᵀ; issue dK — so the exponentials run
// while dPᵀ is on the tensor cores, dSᵀ while dV is, and dK overlaps the
// next tile's start.
template <int D, bool DROP>
__device__ __forceinline__ void attn_bwd_dkdv_wg(const attn_args& a) {
  constexpr int BN = 128, BM = 64;
  constexpr unsigned KT = BN * D * 2, QT = BM * D * 2;
  ATTN_DYN_SMEM(attn_smem);
  const unsigned s0 = gpukit_smem_addr(attn_smem), base = (s0 + 1023u) & ~1023u;
  const unsigned sK = base, sV = base + KT, sQ = base + 2 * KT, sO = sQ + 3 * QT;  // sQ, sO: [3]
  float* sL = (float*)(attn_smem + (base - s0) + 2 * KT + 6 * QT);  // [3][64] lse·log2e (+∞ past Tq)
  float* sD = sL + 3 * BM;                                          // [3][64] δ
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2;
  const attn_pos pos = attn_block(a);
  const int h = pos.h, b = pos.b;
  const int k0 = pos.z * BN;
  const gpukit_bf16* Q = attn_head<const gpukit_bf16>(a.q, a.sq, b, h);
  const gpukit_bf16* dO = attn_head<const gpukit_bf16>(a.dout, a.sdo, b, h);
  const gpukit_bf16* K = attn_head<const gpukit_bf16>(a.k, a.sk, b, h);
  const gpukit_bf16* V = attn_head<const gpukit_bf16>(a.v, a.sv, b, h);
  const long long bh = ((long long)b * a.H + h) * a.Tq;
  const int qstart = a.causal ? k0 / BM : 0;  // causal: queries before k0 see none of these keys
  const int n = max((a.Tq + BM - 1) / BM - qstart, 0);
  const int krow0 = k0 + wg * 64 + warp * 16;  // this warp's first key
  const int krow = krow0 + g;                  // this thread's keys: krow, krow + 8
  const unsigned ka = sK + wg * 64 * 128, va = sV + wg * 64 * 128;  // this warpgroup's K and V rows

  attn_wg_load<D, BN>(sK, K, a.sk[1], k0, a.Tk);
  attn_wg_load<D, BN>(sV, V, a.sv[1], k0, a.Tk);
  if (n > 0) {
    attn_wg_load<D, BM>(sQ, Q, a.sq[1], qstart * BM, a.Tq);
    attn_wg_load<D, BM>(sO, dO, a.sdo[1], qstart * BM, a.Tq);
    attn_tile_stats(sL, sD, BM, qstart * BM, bh, a);
  }
  gpukit_cp_commit();

  attn_dkdv_regs<D, BM> r;
  const attn_dctx dc = DROP ? attn_dctx_make(a, b, h) : attn_dctx{};

  for (int i = 0; i < n; i++) {
    const int stg = i % 3, qbase = (qstart + i) * BM;
    attn_wg_landed();
    if (i + 1 < n) {
      const int nx = (i + 1) % 3;
      attn_wg_load<D, BM>(sQ + nx * QT, Q, a.sq[1], qbase + BM, a.Tq);
      attn_wg_load<D, BM>(sO + nx * QT, dO, a.sdo[1], qbase + BM, a.Tq);
      attn_tile_stats(sL + nx * BM, sD + nx * BM, BM, qbase + BM, bh, a);
    }
    gpukit_cp_commit();
    attn_dkdv_tile<D, DROP>(r.dk, r.dv, r.st, r.dpt, r.pp, r.ds, ka, va, sQ + stg * QT, sO + stg * QT,
                            sL + stg * BM, sD + stg * BM, qbase, krow0, dc, a, [] {});
  }
  r.template store<DROP>(krow, b, h, a);
}

// attn_dq_tile is key tile kbase of the dQ pass on wgmma for one
// warpgroup's 64 queries (attn_bwd_dq_wg's order, see there): S and dP
// from the warpgroup's Q and dO rows qa, oa and the tile's K and V at kt,
// vt, issued with dQ += dS_{j−1}·K_{j−1} when prev (the previous tile's K
// at kprev); P with the rows' lse·log2e; dS with their δ
// into ds. after_p runs once the wait after P has retired all three
// (attn_bwd_dq_ws releases the previous tile's stage there). BM = 128
// queries a block, BN = 64 keys a tile.
template <int D, bool DROP, class AfterP>
__device__ __forceinline__ void attn_dq_tile(float* dq, float* s, float* dp, unsigned ds[][4], unsigned qa, unsigned oa,
                                             unsigned kt, unsigned vt, bool prev, unsigned kprev, const float lse2[2],
                                             const float dl[2], int kbase, int row0, const attn_dctx& dc,
                                             const attn_args& a, AfterP after_p) {
  constexpr int BM = 128, BN = 64, KD = D / 16;
  const int qrow = row0 + ((threadIdx.x & 31) >> 2);  // this thread's queries: qrow, qrow + 8
  gpukit_keep_f<BN / 2>(s);
  gpukit_keep_f<BN / 2>(dp);
  gpukit_keep_f<D / 2>(dq);
  gpukit_keep_u<BN / 4>(&ds[0][0]);
  gpukit_wg_fence();
  attn_wg_gemm_ss<BN, KD, BM, BN>(s, qa, kt);
  gpukit_wg_commit();
  attn_wg_gemm_ss<BN, KD, BM, BN>(dp, oa, vt);
  gpukit_wg_commit();
  // dQ += dS_{j−1}·K_{j−1} (K N-major: 16 keys per k-step).
  if (prev) attn_wg_gemm_rs<D, BN / 16, BN>(dq, ds, kprev);
  gpukit_wg_commit();
  // Dropout: the keep mask, drawn while S and dP are on the tensor cores.
  const unsigned long long km = DROP ? attn_drop_bits<BN / 8>(dc, row0, kbase, a.Tk, 1) : 0ull;
  gpukit_wg_wait<2>();
  gpukit_keep_f<BN / 2>(s);
  // P = exp2(S·scale·log2e − lse·log2e); masked → 0.
  attn_bwd_p<BN / 8, true>(s, lse2, kbase, row0, qrow, a);
  gpukit_wg_wait<0>();
  gpukit_keep_f<BN / 2>(dp);
  gpukit_keep_f<D / 2>(dq);
  gpukit_keep_u<BN / 4>(&ds[0][0]);
  after_p();
  attn_bwd_ds<BN / 8, DROP>(dp, s, dl, km, a.drop_scale);
  attn_pack_frag<BN / 8>(ds, dp);
}

// attn_bwd_dq_wg: dQ = scale·dS·K over key tiles of 64, grid (H, B,
// ⌈Tq/128⌉) in reverse like the forward. 256 threads, warpgroup w owns
// queries 64w..64w+63: S = Q·Kᵀ and dP = dO·Vᵀ (m64n64k16, Q and dO
// resident in shared memory), dS = P ∘ (dP − δ), dQ += dS·K (m64nDk16, A
// from registers, K N-major). Shared memory (from a 1024-byte boundary): Q
// and dO [128][D], three stages of K and V [64][D]. Key tile j: (1) wait,
// fence.proxy.async, barrier; (2) queue tile j+1 (its stage held tile j−2,
// whose K was last read by dQ of j−2, retired during j−1); (3) issue S_j,
// dP_j and dQ += dS_{j−1}·K_{j−1}; wait for S_j; P; wait for the rest; dS_j
// into ds. The last tile's dQ follows the loop. dQ of tile j−1 goes to the
// tensor cores behind S_j and dP_j, as dK/dV's dV does behind dPᵀ: issued
// after dS (the loop's first order), ptxas gave the packed dS the
// registers of dP's accumulators, rewrote them under each in-flight k-step
// and serialized every wgmma of the kernel (C7515, sm_90a SASS).
template <int D, bool DROP>
__device__ __forceinline__ void attn_bwd_dq_wg(const attn_args& a) {
  constexpr int BM = 128, BN = 64;
  constexpr unsigned QT = BM * D * 2, KT = BN * D * 2;
  ATTN_DYN_SMEM(attn_smem);
  const unsigned sQ = (gpukit_smem_addr(attn_smem) + 1023u) & ~1023u;
  const unsigned sO = sQ + QT, sK = sQ + 2 * QT, sV = sK + 3 * KT;  // sK, sV: [3]
  const int wg = threadIdx.x >> 7, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2;
  const attn_pos pos = attn_block(a);
  const int h = pos.h, b = pos.b;
  const int q0 = attn_qblock(BM, pos);
  const gpukit_bf16* Q = attn_head<const gpukit_bf16>(a.q, a.sq, b, h);
  const gpukit_bf16* dO = attn_head<const gpukit_bf16>(a.dout, a.sdo, b, h);
  const gpukit_bf16* K = attn_head<const gpukit_bf16>(a.k, a.sk, b, h);
  const gpukit_bf16* V = attn_head<const gpukit_bf16>(a.v, a.sv, b, h);
  const int n = attn_key_tiles(q0, BM, BN, a);
  const int row0 = q0 + wg * 64 + warp * 16;  // this warp's first query
  const int qrow = row0 + g;                  // this thread's queries: qrow, qrow + 8
  const unsigned qa = sQ + wg * 64 * 128, oa = sO + wg * 64 * 128;

  attn_wg_load<D, BM>(sQ, Q, a.sq[1], q0, a.Tq);
  attn_wg_load<D, BM>(sO, dO, a.sdo[1], q0, a.Tq);
  attn_wg_load<D, BN>(sK, K, a.sk[1], 0, a.Tk);
  attn_wg_load<D, BN>(sV, V, a.sv[1], 0, a.Tk);
  gpukit_cp_commit();
  const long long bh = ((long long)b * a.H + h) * a.Tq;
  float lse2[2], dl[2];
  attn_row_stats(lse2, dl, qrow, bh, a);
  attn_dq_regs<D, BN> r;
  const attn_dctx dc = DROP ? attn_dctx_make(a, b, h) : attn_dctx{};

  for (int j = 0; j < n; j++) {
    const int stg = j % 3, kbase = j * BN;
    attn_wg_landed();
    if (j + 1 < n) {
      const int nx = (j + 1) % 3;
      attn_wg_load<D, BN>(sK + nx * KT, K, a.sk[1], kbase + BN, a.Tk);
      attn_wg_load<D, BN>(sV + nx * KT, V, a.sv[1], kbase + BN, a.Tk);
    }
    gpukit_cp_commit();
    attn_dq_tile<D, DROP>(r.dq, r.s, r.dp, r.ds, qa, oa, sK + stg * KT, sV + stg * KT, j > 0,
                          sK + ((j + 2) % 3) * KT, lse2, dl, kbase, row0, dc, a, [] {});
  }
  r.store(n, sK + ((n + 2) % 3) * KT, qrow, b, h, a);
}

// attn_fwd_ws: the forward warp-specialised (FlashAttention-3, Shah et al.
// 2024, §3.1-3.2), grid and tiles as attn_fwd_wg; DROP: dropout on P as
// attn_fwd_wg's (the keep mask drawn by the consumers after each softmax).
// 384 threads (512 with three consumers, NC below): warpgroup 0 is the
// producer, which keeps few registers (setmaxnreg: see the split below)
// and only copies: Q once, then K_j and V_j into a ring of two stages, each
// completing its stage's "full" mbarrier through cp.async (every producer
// thread arrives once its own copies have landed), and refilling a stage
// when the consumers have arrived on its "empty" one. The other
// warpgroups are the consumers, 64 query rows each, with no block barrier
// between them: a consumer waits for K_j, issues S_j = Q·K_jᵀ and O +=
// P_{j−1}·V_{j−1}, releases K_j's stage when S_j is done and V_{j−1}'s when
// P·V is, and the consumers take turns to issue their products through
// named barriers (ping-pong: one warpgroup's softmax runs while another's
// products are on the tensor cores). Shared memory: Q's tile, two K and
// two V tiles from a 1024-byte boundary, then 10 mbarriers. A negative
// scale: the producer negates its own copies of Q before it arrives on
// Q's barrier (attn_softmax_frag's RAW form needs c ≥ 0).

// attn_ws_tile is the work of tile i of the persistent attn_fwd_ws (PERSIST):
// attn_block's launch order walked by index instead of by blockIdx, for a
// logical grid of (H, B, nz) blocks. (attn_block_in could be this with i
// from blockIdx; it is left as it is until a GPU run shows the default
// kernels unchanged by that.)
__device__ __forceinline__ attn_pos attn_ws_tile(const attn_args& a, long long i, int nz) {
  const long long X = a.H, bh = (long long)a.B * a.H;
  const long long G = a.group <= 0 || a.group >= bh ? bh : a.group;
  const long long first = i / (G * nz) * G, gs = min(G, bh - first), r = i - first * nz, hb = first + r % gs;
  return attn_pos{(int)(hb / X), (int)(hb % X), (int)(r / gs)};
}

// attn_ws_work is tile t's work in attn_fwd_ws, blocks of BM query rows
// and key tiles of BN: its place, first query row and key tile count
// (PERSIST: tile t of nz row blocks a head; else this block's, from
// blockIdx).
template <bool PERSIST, int BM, int BN>
struct attn_ws_work {
  attn_pos pos;
  int q0, n;
  __device__ __forceinline__ attn_ws_work(const attn_args& a, long long t, int nz)
      : pos(PERSIST ? attn_ws_tile(a, t, nz) : attn_block(a)),
        q0(PERSIST ? (nz - 1 - pos.z) * BM : attn_qblock(BM, pos)),
        n(attn_key_tiles(q0, BM, BN, a)) {}
};

// PERSIST (FlashAttention-3's persistent kernel, §3.1): the grid is at most
// one block per multiprocessor and each block walks tiles blockIdx.x,
// blockIdx.x + gridDim.x, ... of attn_block's order (longest causal rows
// first), so that the producer copies the next tile's Q, K_0 and V_0 while
// the consumers finish the last P·V and store O. The K/V ring's stages and
// phases run on across tiles (gj counts K/V tiles since the block began);
// a tenth mbarrier, qempty, hands Q back to the producer once both
// consumers' last S of a tile has retired, and the consumers release the
// last V stage too. Without PERSIST the tile loop runs once: the code is
// the non-persistent kernel's.
//
// NC is the number of consumer warpgroups (128·(NC+1) threads, 64·NC query
// rows a block): 2, or 3 at D = 64 (FlashAttention-3's 192-row block for
// head dimension 64: a K/V tile serves 192 queries, and with 3 consumers
// taking turns two are in their softmax while one issues products). The
// turn passes 0 → 1 → … → NC−1 → 0 through named barriers 1..NC.
//
// D = 256 (two consumers, not persistent, no dropout): key tiles of 64
// (BN), so that a consumer's O (128 registers), S (32) and P (16) fit in
// its 232 registers, and shared memory holds Q [128][256] and two stages
// of K and V [64][256] (192 KiB); P·V is m64n256k16, the widest wgmma.
template <int D, bool PERSIST = false, bool DROP = false, int NC = 2>
__device__ __forceinline__ void attn_fwd_ws(const attn_args& a) {
  static_assert(NC == 2 || (NC == 3 && D == 64), "attn_fwd_ws: 2 consumers, or 3 at D = 64");
  static_assert(D != 256 || (NC == 2 && !PERSIST && !DROP), "attn_fwd_ws: D = 256 has one instance");
  constexpr int BM = 64 * NC, BN = D == 256 ? 64 : ATTN_WG_BN, KD = D / 16, ND = D / 8, PT = 128;
  constexpr unsigned QT = BM * D * 2, KT = BN * D * 2;
  ATTN_DYN_SMEM(attn_smem);
  const unsigned s0 = gpukit_smem_addr(attn_smem);
  const unsigned sQ = (s0 + 1023u) & ~1023u;
  const unsigned sK = sQ + QT, sV = sK + 2 * KT;  // [2] each
  const unsigned qfull = sV + 2 * KT, kfull = qfull + 8, vfull = kfull + 16, kempty = vfull + 16, vempty = kempty + 16;
  const unsigned qempty = vempty + 16;  // PERSIST only
  const int nz = PERSIST ? (a.Tq + BM - 1) / BM : 1;
  const long long ntile = PERSIST ? (long long)a.B * a.H * nz : 1, tstep = PERSIST ? gridDim.x : 1;
  const int wg = threadIdx.x >> 7;
  if (threadIdx.x == 0) {
    gpukit_mbar_init(qfull, PT);
    if (PERSIST) gpukit_mbar_init(qempty, NC * 128);
    for (int st = 0; st < 2; st++) {
      gpukit_mbar_init(kfull + 8 * st, PT);
      gpukit_mbar_init(vfull + 8 * st, PT);
      gpukit_mbar_init(kempty + 8 * st, NC * 128);
      gpukit_mbar_init(vempty + 8 * st, NC * 128);
    }
  }
  __syncthreads();

  // Registers (setmaxnreg; L at launch, 128·P + 128·NC·C = 128·(NC+1)·L):
  // two consumers (L = 168): the producer P = 40, the consumers C = 232;
  // persistent, the producer keeps the tile walk too: 56 and 224. Three
  // (L = 128): 32 and 160 (FlashAttention-3's split), persistent 56 and
  // 152.
  constexpr int LREG = NC == 2 ? 168 : 128;
  constexpr int PREG = PERSIST ? 56 : NC == 2 ? 40 : 32, CREG = ((NC + 1) * LREG - PREG) / NC;
  static_assert(CREG % 8 == 0 && PREG + NC * CREG <= (NC + 1) * LREG, "attn_fwd_ws: register split");
  if (wg == 0) {  // the producer
    gpukit_setmaxnreg_dec<PREG>();
    unsigned gj = 0;  // K/V tiles copied so far
    long long it = 0;
    for (long long t = PERSIST ? blockIdx.x : 0; t < ntile; t += tstep, it++) {
      const attn_ws_work<PERSIST, BM, BN> w(a, t, nz);
      const attn_pos pos = w.pos;
      const gpukit_bf16* Q = attn_head<const gpukit_bf16>(a.q, a.sq, pos.b, pos.h);
      const gpukit_bf16* K = attn_head<const gpukit_bf16>(a.k, a.sk, pos.b, pos.h);
      const gpukit_bf16* V = attn_head<const gpukit_bf16>(a.v, a.sv, pos.b, pos.h);
      if (PERSIST && it > 0) gpukit_mbar_wait(qempty, (unsigned)((it - 1) & 1));  // the last tile's S are done with Q
      attn_wg_load<D, BM, PT>(sQ, Q, a.sq[1], w.q0, a.Tq);
      gpukit_cp_commit();
      gpukit_cp_wait0();
      if (a.scale_log2 < 0.0f) attn_wg_negate<D, BM, PT>(attn_smem, s0, sQ);
      gpukit_fence_proxy_async();
      gpukit_mbar_arrive(qfull);
      for (int j = 0; j < w.n; j++, gj++) {
        const int st = gj & 1;
        const unsigned par = ((gj >> 1) & 1) ^ 1;  // the phase that released this stage's last tile, gj − 2
        if (gj >= 2) gpukit_mbar_wait(kempty + 8 * st, par);
        attn_wg_load<D, BN, PT>(sK + st * KT, K, a.sk[1], j * BN, a.Tk);
        gpukit_cp_mbar_arrive(kfull + 8 * st);
        if (gj >= 2) gpukit_mbar_wait(vempty + 8 * st, par);
        attn_wg_load<D, BN, PT>(sV + st * KT, V, a.sv[1], j * BN, a.Tk);
        gpukit_cp_mbar_arrive(vfull + 8 * st);
      }
    }
    gpukit_cp_wait0();  // nothing in flight at exit
    return;
  }

  gpukit_setmaxnreg_inc<CREG>();
  const int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2;
  const unsigned qa = sQ + cw * 64 * 128;
  const float c = attn_raw_c(a);
  unsigned gj = 0;  // K/V tiles consumed so far
  long long it = 0;
  for (long long t = PERSIST ? blockIdx.x : 0; t < ntile; t += tstep, it++) {
    const attn_ws_work<PERSIST, BM, BN> w(a, t, nz);
    const attn_pos pos = w.pos;
    const int n = w.n;
    const int row0 = w.q0 + cw * 64 + warp * 16;  // this warp's first query
    const int qrow = row0 + g;                  // this thread's queries: qrow, qrow + 8
    float s[BN / 2], o[D / 2];
    unsigned p[BN / 16][4];
    attn_zero<BN / 2>(s);
    attn_zero<D / 2>(o);
    float m[2] = {-ATTN_INF, -ATTN_INF}, l[2] = {0.0f, 0.0f}, alpha[2];
    const attn_dctx dc = DROP ? attn_dctx_make(a, pos.b, pos.h) : attn_dctx{};

    const int st0 = gj & 1;
    gpukit_mbar_wait(qfull, (unsigned)(it & 1));
    gpukit_mbar_wait(kfull + 8 * st0, (gj >> 1) & 1);
    gpukit_fence_proxy_async();
    attn_wg_scores_now<BN, KD, BM>(s, qa, sK + st0 * KT);
    gpukit_mbar_arrive(kempty + 8 * st0);
    if (PERSIST && n == 1) gpukit_mbar_arrive(qempty);
    attn_softmax_frag<BN / 8, true, true>(s, m, l, alpha, 0, row0, qrow, c, a);
    if (DROP) attn_drop_f<BN / 8>(s, attn_drop_bits<BN / 8>(dc, row0, 0, a.Tk, 1));  // l is undropped
    attn_pack_frag<BN / 8>(p, s);
    // Ping-pong: consumer cw issues its products after bar.sync on barrier
    // 1 + cw and lets the next (cw + 1 mod NC) go with bar.arrive on its
    // barrier; the last consumer opens the first turn of a tile for
    // consumer 0, and its last turn is not handed on (so each tile's
    // arrivals and waits balance).
    const int nextbar = 1 + (cw + 1) % NC;
    if (cw == NC - 1 && n > 1) gpukit_bar_arrive(1, 256);

    for (int j = 1; j < n; j++) {
      const unsigned gk = gj + j;
      const int st = gk & 1, pst = (gk - 1) & 1;
      gpukit_mbar_wait(kfull + 8 * st, (gk >> 1) & 1);
      gpukit_mbar_wait(vfull + 8 * pst, ((gk - 1) >> 1) & 1);
      gpukit_fence_proxy_async();
      gpukit_bar_sync(1 + cw, 256);
      gpukit_keep_f<BN / 2>(s);
      gpukit_keep_f<D / 2>(o);
      gpukit_keep_u<BN / 4>(&p[0][0]);
      gpukit_wg_fence();
      attn_wg_gemm_ss<BN, KD, BM, BN>(s, qa, sK + st * KT);
      gpukit_wg_commit();
      attn_wg_gemm_rs<D, BN / 16, BN>(o, p, sV + pst * KT);
      gpukit_wg_commit();
      if (cw < NC - 1 || j + 1 < n) gpukit_bar_arrive(nextbar, 256);
      gpukit_wg_wait<1>();
      gpukit_keep_f<BN / 2>(s);
      gpukit_mbar_arrive(kempty + 8 * st);
      if (PERSIST && j + 1 == n) gpukit_mbar_arrive(qempty);  // this tile's last S has retired
      const bool resc = attn_softmax_frag<BN / 8, true, true>(s, m, l, alpha, j * BN, row0, qrow, c, a);
      if (DROP) attn_drop_f<BN / 8>(s, attn_drop_bits<BN / 8>(dc, row0, j * BN, a.Tk, 1));
      gpukit_wg_wait<0>();
      gpukit_keep_f<D / 2>(o);
      gpukit_keep_u<BN / 4>(&p[0][0]);
      gpukit_mbar_arrive(vempty + 8 * pst);
      if (resc) attn_rescale<ND>(o, alpha);
      attn_pack_frag<BN / 8>(p, s);
    }
    // The last P·V.
    const unsigned gl = gj + n - 1;
    const int lst = gl & 1;
    gpukit_mbar_wait(vfull + 8 * lst, (gl >> 1) & 1);
    gpukit_fence_proxy_async();
    gpukit_keep_f<D / 2>(o);
    gpukit_keep_u<BN / 4>(&p[0][0]);
    gpukit_wg_fence();
    attn_wg_gemm_rs<D, BN / 16, BN>(o, p, sV + lst * KT);
    gpukit_wg_commit();
    gpukit_wg_wait<0>();
    gpukit_keep_f<D / 2>(o);
    if (PERSIST) gpukit_mbar_arrive(vempty + 8 * lst);  // the producer refills it for a later tile
    gj += n;
    attn_fwd_out<ND, DROP>(o, m, l, qrow, pos.b, pos.h, a);
  }
}
// Instances: attn_fwd_ws_d<D>, attn_fwd_ws_pers_d<D> (PERSIST),
// attn_fwd_ws_drop_d<D> (dropout on P, as attn_fwd_wg_drop), and
// attn_fwd_ws_c3[_pers]_d64 (three consumer warpgroups, 512 threads) and
// attn_fwd_ws_d256 (key tiles of 64).
#define ATTN_WS_INSTANCE(INST, D, PERSIST, DROP, NC)                                                            \
  extern "C" __global__ void __launch_bounds__(128 * ((NC) + 1), 1) attn_fwd_ws_##INST(const attn_args a) { \
    if constexpr (GPUKIT_KEEP(attn_fwd_ws_##INST)) attn_fwd_ws<D, PERSIST, DROP, NC>(a);                     \
  }
ATTN_WS_INSTANCE(d64, 64, false, false, 2)
ATTN_WS_INSTANCE(d128, 128, false, false, 2)
ATTN_WS_INSTANCE(pers_d64, 64, true, false, 2)
ATTN_WS_INSTANCE(pers_d128, 128, true, false, 2)
ATTN_WS_INSTANCE(drop_d64, 64, false, true, 2)
ATTN_WS_INSTANCE(drop_d128, 128, false, true, 2)
ATTN_WS_INSTANCE(c3_d64, 64, false, false, 3)
ATTN_WS_INSTANCE(c3_pers_d64, 64, true, false, 3)
ATTN_WS_INSTANCE(d256, 256, false, false, 2)

// Instances: attn_<fwd|bwd_dkdv|bwd_dq>_wg[_drop]_d<D> (_drop: dropout on P).
#define ATTN_WG_INSTANCES(DROPSUF, DROP)                                                                                 \
  extern "C" __global__ void __launch_bounds__(ATTN_WG_THREADS, 1) attn_fwd_wg##DROPSUF##_d64(const attn_args a) {       \
    if constexpr (GPUKIT_KEEP(attn_fwd_wg##DROPSUF##_d64)) attn_fwd_wg<64, DROP>(a);                                     \
  }                                                                                                                      \
  extern "C" __global__ void __launch_bounds__(ATTN_WG_THREADS, 1) attn_fwd_wg##DROPSUF##_d128(const attn_args a) {      \
    if constexpr (GPUKIT_KEEP(attn_fwd_wg##DROPSUF##_d128)) attn_fwd_wg<128, DROP>(a);                                   \
  }                                                                                                                      \
  extern "C" __global__ void __launch_bounds__(ATTN_WG_THREADS, 1) attn_bwd_dkdv_wg##DROPSUF##_d64(const attn_args a) {  \
    if constexpr (GPUKIT_KEEP(attn_bwd_dkdv_wg##DROPSUF##_d64)) attn_bwd_dkdv_wg<64, DROP>(a);                           \
  }                                                                                                                      \
  extern "C" __global__ void __launch_bounds__(ATTN_WG_THREADS, 1) attn_bwd_dkdv_wg##DROPSUF##_d128(const attn_args a) { \
    if constexpr (GPUKIT_KEEP(attn_bwd_dkdv_wg##DROPSUF##_d128)) attn_bwd_dkdv_wg<128, DROP>(a);                         \
  }                                                                                                                      \
  extern "C" __global__ void __launch_bounds__(ATTN_WG_THREADS, 1) attn_bwd_dq_wg##DROPSUF##_d64(const attn_args a) {    \
    if constexpr (GPUKIT_KEEP(attn_bwd_dq_wg##DROPSUF##_d64)) attn_bwd_dq_wg<64, DROP>(a);                               \
  }                                                                                                                      \
  extern "C" __global__ void __launch_bounds__(ATTN_WG_THREADS, 1) attn_bwd_dq_wg##DROPSUF##_d128(const attn_args a) {   \
    if constexpr (GPUKIT_KEEP(attn_bwd_dq_wg##DROPSUF##_d128)) attn_bwd_dq_wg<128, DROP>(a);                             \
  }
ATTN_WG_INSTANCES(, false)
ATTN_WG_INSTANCES(_drop, true)

// attn_bwd_dkdv_ws: attn_bwd_dkdv_wg warp-specialised (FlashAttention-3's
// producer and consumers, Shah et al. 2024, §3.1, applied to the dK/dV
// pass); DROP: dropout on P as attn_bwd_dkdv_wg_drop. 384 threads:
// warpgroup 0, the producer (setmaxnreg 40; 24 at D = 128), copies K and
// V once and then Q, dO, lse·log2e and δ of each query tile of 64 into a
// ring of three stages (one H200, 2026-11-29: 0.95–0.97× the time of two
// at D = 64 from T = 1024, the same at D = 128); a stage's "full"
// mbarrier completes when every producer thread's cp.async have landed
// (cp.async.mbarrier.arrive) and it has stored its statistics (an
// ordinary arrive, release semantics): 2·128 arrivals. Warpgroups 1 and 2
// (232 registers; 240 at D = 128) own keys 64(w−1)..64(w−1)+63 and do
// attn_bwd_dkdv_wg's products in its order with no block barrier; a
// consumer releases stage i−1 (its "empty" mbarrier, 2·128 arrivals) once
// the wait after Sᵀ_i has retired dV_{i−1} and dK_{i−1}, the last readers
// of its Q and dO. Grid and outputs as attn_bwd_dkdv_wg. Shared memory
// (from a 1024-byte boundary): K and V [128][D], three stages of Q and dO
// [64][D], three of lse·log2e and δ [64] f32, then 7 mbarriers.
template <int D, bool DROP = false>
__device__ __forceinline__ void attn_bwd_dkdv_ws(const attn_args& a) {
  constexpr int BM = 64, BN = 128, PT = 128, NS = 3;
  constexpr unsigned KT = BN * D * 2, QT = BM * D * 2;
  ATTN_DYN_SMEM(attn_smem);
  const unsigned s0 = gpukit_smem_addr(attn_smem), base = (s0 + 1023u) & ~1023u;
  const unsigned sK = base, sV = base + KT, sQ = base + 2 * KT, sO = sQ + NS * QT;  // sQ, sO: [NS]
  float* sL = (float*)(attn_smem + (sO + NS * QT - s0));                           // [NS][BM] lse·log2e
  float* sD = sL + NS * BM;                                                         // [NS][BM] δ
  const unsigned kvfull = sO + NS * QT + 2 * NS * BM * 4, full = kvfull + 8, empty = full + 8 * NS;
  const int wg = threadIdx.x >> 7;
  const attn_pos pos = attn_block(a);
  const int h = pos.h, b = pos.b, k0 = pos.z * BN;
  const long long bh = ((long long)b * a.H + h) * a.Tq;
  const int qstart = a.causal ? k0 / BM : 0;  // causal: queries before k0 see none of these keys
  const int n = max((a.Tq + BM - 1) / BM - qstart, 0);
  if (threadIdx.x == 0) {
    gpukit_mbar_init(kvfull, PT);
    for (int st = 0; st < NS; st++) {
      gpukit_mbar_init(full + 8 * st, 2 * PT);
      gpukit_mbar_init(empty + 8 * st, 2 * 128);
    }
  }
  __syncthreads();

  // Registers (setmaxnreg; 168 at launch, P + 2·C = 3·168).
  constexpr int PREG = D == 128 ? 24 : 40, CREG = (3 * 168 - PREG) / 2;
  if (wg == 0) {  // the producer
    gpukit_setmaxnreg_dec<PREG>();
    const gpukit_bf16* Q = attn_head<const gpukit_bf16>(a.q, a.sq, b, h);
    const gpukit_bf16* dO = attn_head<const gpukit_bf16>(a.dout, a.sdo, b, h);
    attn_wg_load<D, BN, PT>(sK, attn_head<const gpukit_bf16>(a.k, a.sk, b, h), a.sk[1], k0, a.Tk);
    attn_wg_load<D, BN, PT>(sV, attn_head<const gpukit_bf16>(a.v, a.sv, b, h), a.sv[1], k0, a.Tk);
    gpukit_cp_mbar_arrive(kvfull);
    for (int i = 0; i < n; i++) {
      const int st = i % NS, qbase = (qstart + i) * BM;
      if (i >= NS) gpukit_mbar_wait(empty + 8 * st, ((i / NS) & 1) ^ 1);  // tile i − NS released it
      attn_wg_load<D, BM, PT>(sQ + st * QT, Q, a.sq[1], qbase, a.Tq);
      attn_wg_load<D, BM, PT>(sO + st * QT, dO, a.sdo[1], qbase, a.Tq);
      gpukit_cp_mbar_arrive(full + 8 * st);
      attn_tile_stats(sL + st * BM, sD + st * BM, BM, qbase, bh, a);
      gpukit_mbar_arrive(full + 8 * st);
    }
    gpukit_cp_wait0();  // nothing in flight at exit
    return;
  }

  gpukit_setmaxnreg_inc<CREG>();
  const int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2;
  const int krow0 = k0 + cw * 64 + warp * 16;  // this warp's first key
  const int krow = krow0 + g;                  // this thread's keys: krow, krow + 8
  const unsigned ka = sK + cw * 64 * 128, va = sV + cw * 64 * 128;  // this warpgroup's K and V rows
  attn_dkdv_regs<D, BM> r;
  const attn_dctx dc = DROP ? attn_dctx_make(a, b, h) : attn_dctx{};
  gpukit_mbar_wait(kvfull, 0);
  for (int i = 0; i < n; i++) {
    const int stg = i % NS, qbase = (qstart + i) * BM;
    gpukit_mbar_wait(full + 8 * stg, (i / NS) & 1);
    gpukit_fence_proxy_async();
    attn_dkdv_tile<D, DROP>(r.dk, r.dv, r.st, r.dpt, r.pp, r.ds, ka, va, sQ + stg * QT, sO + stg * QT,
                                sL + stg * BM, sD + stg * BM, qbase, krow0, dc, a, [&] {
                                  if (i > 0) gpukit_mbar_arrive(empty + 8 * ((i - 1) % NS));  // dV and dK of i − 1 have retired
                                });
  }
  r.template store<DROP>(krow, b, h, a);
}
// attn_bwd_dq_ws: attn_bwd_dq_wg warp-specialised (DROP: dropout on P as
// attn_bwd_dq_wg_drop). 384 threads: warpgroup 0, the producer (40
// registers), copies Q and dO of the block's 128 queries once (their
// mbarrier completes through cp.async) and then K_j and V_j, key tiles of
// 64, into a ring of three stages; warpgroups 1 and 2 (232 registers) own queries 64(w−1).. and do
// attn_bwd_dq_wg's products in its order with no block barrier: S_j, dP_j
// and dQ += dS_{j−1}·K_{j−1} issued together, P while dP is on the tensor
// cores, and stage j−1 released once the wait for dP_j has retired
// dQ_{j−1} (three stages keep the producer a tile ahead). Grid and outputs
// as attn_bwd_dq_wg. Shared memory (from a 1024-byte boundary): Q and dO
// [128][D], three stages of K and V [64][D], then 7 mbarriers.
template <int D, bool DROP = false>
__device__ __forceinline__ void attn_bwd_dq_ws(const attn_args& a) {
  constexpr int BM = 128, BN = 64, PT = 128, NS = 3;
  constexpr unsigned QT = BM * D * 2, KT = BN * D * 2;
  ATTN_DYN_SMEM(attn_smem);
  const unsigned sQ = (gpukit_smem_addr(attn_smem) + 1023u) & ~1023u;
  const unsigned sO = sQ + QT, sK = sQ + 2 * QT, sV = sK + NS * KT;  // sK, sV: [NS]
  const unsigned qfull = sV + NS * KT, full = qfull + 8, empty = full + 8 * NS;
  const int wg = threadIdx.x >> 7;
  const attn_pos pos = attn_block(a);
  const int h = pos.h, b = pos.b;
  const int q0 = attn_qblock(BM, pos);
  const int n = attn_key_tiles(q0, BM, BN, a);
  if (threadIdx.x == 0) {
    gpukit_mbar_init(qfull, PT);
    for (int st = 0; st < NS; st++) {
      gpukit_mbar_init(full + 8 * st, PT);
      gpukit_mbar_init(empty + 8 * st, 2 * 128);
    }
  }
  __syncthreads();

  if (wg == 0) {  // the producer
    gpukit_setmaxnreg_dec<40>();
    const gpukit_bf16* K = attn_head<const gpukit_bf16>(a.k, a.sk, b, h);
    const gpukit_bf16* V = attn_head<const gpukit_bf16>(a.v, a.sv, b, h);
    attn_wg_load<D, BM, PT>(sQ, attn_head<const gpukit_bf16>(a.q, a.sq, b, h), a.sq[1], q0, a.Tq);
    attn_wg_load<D, BM, PT>(sO, attn_head<const gpukit_bf16>(a.dout, a.sdo, b, h), a.sdo[1], q0, a.Tq);
    gpukit_cp_mbar_arrive(qfull);
    for (int j = 0; j < n; j++) {
      const int st = j % NS;
      if (j >= NS) gpukit_mbar_wait(empty + 8 * st, ((j / NS) & 1) ^ 1);  // tile j − NS released it
      attn_wg_load<D, BN, PT>(sK + st * KT, K, a.sk[1], j * BN, a.Tk);
      attn_wg_load<D, BN, PT>(sV + st * KT, V, a.sv[1], j * BN, a.Tk);
      gpukit_cp_mbar_arrive(full + 8 * st);
    }
    gpukit_cp_wait0();  // nothing in flight at exit
    return;
  }

  gpukit_setmaxnreg_inc<232>();
  const int cw = wg - 1, warp = (threadIdx.x >> 5) & 3, lane = threadIdx.x & 31, g = lane >> 2;
  const int row0 = q0 + cw * 64 + warp * 16;  // this warp's first query
  const int qrow = row0 + g;                  // this thread's queries: qrow, qrow + 8
  const unsigned qa = sQ + cw * 64 * 128, oa = sO + cw * 64 * 128;
  const long long bh = ((long long)b * a.H + h) * a.Tq;
  float lse2[2], dl[2];
  attn_row_stats(lse2, dl, qrow, bh, a);
  attn_dq_regs<D, BN> r;
  const attn_dctx dc = DROP ? attn_dctx_make(a, b, h) : attn_dctx{};
  gpukit_mbar_wait(qfull, 0);
  for (int j = 0; j < n; j++) {
    const int stg = j % NS, kbase = j * BN;
    gpukit_mbar_wait(full + 8 * stg, (j / NS) & 1);
    gpukit_fence_proxy_async();
    attn_dq_tile<D, DROP>(r.dq, r.s, r.dp, r.ds, qa, oa, sK + stg * KT, sV + stg * KT, j > 0,
                          sK + ((j + NS - 1) % NS) * KT, lse2, dl, kbase, row0, dc, a, [&] {
                            if (j > 0) gpukit_mbar_arrive(empty + 8 * ((j - 1) % NS));  // dQ_{j−1} has read K_{j−1}
                          });
  }
  r.store(n, sK + ((n + NS - 1) % NS) * KT, qrow, b, h, a);
}
// Instances: attn_bwd_dkdv_ws[_drop]_d<D>, attn_bwd_dq_ws[_drop]_d<D>
// (_drop: dropout on P, as attn_bwd_*_wg_drop).
#define ATTN_BWD_WS_INSTANCE(INST, D, DROP)                                                          \
  extern "C" __global__ void __launch_bounds__(384, 1) attn_bwd_dkdv_ws_##INST(const attn_args a) { \
    if constexpr (GPUKIT_KEEP(attn_bwd_dkdv_ws_##INST)) attn_bwd_dkdv_ws<D, DROP>(a);                \
  }                                                                                                  \
  extern "C" __global__ void __launch_bounds__(384, 1) attn_bwd_dq_ws_##INST(const attn_args a) {   \
    if constexpr (GPUKIT_KEEP(attn_bwd_dq_ws_##INST)) attn_bwd_dq_ws<D, DROP>(a);                    \
  }
ATTN_BWD_WS_INSTANCE(d64, 64, false)
ATTN_BWD_WS_INSTANCE(d128, 128, false)
ATTN_BWD_WS_INSTANCE(drop_d64, 64, true)
ATTN_BWD_WS_INSTANCE(drop_d128, 128, true)
#else
// Not sm_90a: the symbols exist (one module for every GPU) but are never
// launched (ops/attention.go launches them only on sm_90a, and only when
// this marker is absent).
extern "C" __global__ void attn_wg_unavailable() {}
extern "C" __global__ void attn_fwd_ws_d64(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_fwd_ws_d128(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_fwd_ws_pers_d64(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_fwd_ws_pers_d128(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_fwd_ws_drop_d64(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_fwd_ws_drop_d128(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_fwd_ws_c3_d64(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_fwd_ws_c3_pers_d64(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_fwd_ws_d256(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_bwd_dkdv_ws_d64(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_bwd_dkdv_ws_d128(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_bwd_dq_ws_d64(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_bwd_dq_ws_d128(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_bwd_dkdv_ws_drop_d64(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_bwd_dkdv_ws_drop_d128(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_bwd_dq_ws_drop_d64(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_bwd_dq_ws_drop_d128(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_fwd_wg_d64(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_fwd_wg_d128(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_bwd_dkdv_wg_d64(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_bwd_dkdv_wg_d128(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_bwd_dq_wg_d64(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_bwd_dq_wg_d128(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_fwd_wg_drop_d64(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_fwd_wg_drop_d128(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_bwd_dkdv_wg_drop_d64(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_bwd_dkdv_wg_drop_d128(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_bwd_dq_wg_drop_d64(const attn_args) { asm volatile("trap;"); }
extern "C" __global__ void attn_bwd_dq_wg_drop_d128(const attn_args) { asm volatile("trap;"); }
#endif

// ---- CUDA-core kernels (f32 or bf16, any D ≤ 128) ----
//
// 128 threads (4 warps). Each warp owns 4 rows of its block's 16 (queries
// for the forward and dQ, keys for dK/dV) and streams tiles of 32 rows of
// the other side through shared memory (f32), one lane per streamed row
// for the dot products (tiles padded to D+1 columns so those reads are
// free of bank conflicts) and one lane per output column (d = lane + 32c)
// for the accumulations.

#define ATTN_S_THREADS 128
#define ATTN_S_ROWS 16  // owned rows per block
#define ATTN_S_TILE 32  // streamed rows per tile

// attn_s_load fills n rows × D columns of shared f32 (row stride lds) from
// rows [r0, r0+n) of a [T, D] matrix at g (row stride ld); zeros past T.
template <typename T>
__device__ __forceinline__ void attn_s_load(float* s, int lds, const T* g, long long ld, int r0, int n, int T_, int D) {
  for (int i = threadIdx.x; i < n * D; i += ATTN_S_THREADS) {
    int r = i / D, c = i % D, row = r0 + r;
    s[r * lds + c] = row < T_ ? gpukit_ld(g + (long long)row * ld + c) : 0.0f;
  }
}

// attn_s_store writes out[c] = x (or out[c] + x when acc) for this lane's
// columns of a row.
template <typename T>
__device__ __forceinline__ void attn_s_store(T* row, const float x[4], int D, int acc) {
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int c = 0; c < 4; c++) {
    int d = lane + 32 * c;
    if (d < D) {
      float v = x[c];
      if (acc) v += gpukit_ld(row + d);
      gpukit_st(row + d, v);
    }
  }
}

// attn_s_dot is Σ_d x[d]·y[d] over d < D, in order.
__device__ __forceinline__ float attn_s_dot(const float* x, const float* y, int D) {
  float s = 0.0f;
  for (int d = 0; d < D; d++) s += x[d] * y[d];
  return s;
}

// attn_s_axpy adds Σ_j x_j·rows[j·lds + d] to this lane's columns d = lane
// + 32c (acc[c]) for the ATTN_S_TILE rows of a tile, x_j being lane j's x
// (broadcast by shuffle), j in order.
__device__ __forceinline__ void attn_s_axpy(float acc[4], float x, const float* rows, int lds, int D) {
  const int lane = threadIdx.x & 31;
  for (int j = 0; j < ATTN_S_TILE; j++) {
    const float xj = __shfl_sync(0xffffffffu, x, j);
    const float* r = rows + j * lds;
#pragma unroll
    for (int c = 0; c < 4; c++) {
      int d = lane + 32 * c;
      if (d < D) acc[c] += xj * r[d];
    }
  }
}

// attn_s_store_scaled is attn_s_store of x·scale.
template <typename T>
__device__ __forceinline__ void attn_s_store_scaled(T* row, const float x[4], float scale, int D, int acc) {
  float y[4];
#pragma unroll
  for (int c = 0; c < 4; c++) y[c] = x[c] * scale;
  attn_s_store(row, y, D, acc);
}

// attn_fwd_simt: grid (H, B, ⌈Tq/16⌉) in reverse. Shared memory: Q [16][D],
// K [32][D+1], V [32][D] in f32.
template <typename T, bool DROP>
__device__ __forceinline__ void attn_fwd_simt(const attn_args& a) {
  ATTN_DYN_SMEM(attn_smem);
  const int D = a.D;
  float* sQ = (float*)attn_smem;
  float* sK = sQ + ATTN_S_ROWS * D;
  float* sV = sK + ATTN_S_TILE * (D + 1);
  const attn_pos pos = attn_block(a);
  const int h = pos.h, b = pos.b;
  const int q0 = attn_qblock(ATTN_S_ROWS, pos);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const T* Q = attn_head<const T>(a.q, a.sq, b, h);
  const T* K = attn_head<const T>(a.k, a.sk, b, h);
  const T* V = attn_head<const T>(a.v, a.sv, b, h);
  const int kend = a.causal ? min(a.Tk, q0 + ATTN_S_ROWS) : a.Tk;

  attn_s_load(sQ, D, Q, a.sq[1], q0, ATTN_S_ROWS, a.Tq, D);
  const attn_dctx dc = DROP ? attn_dctx_make(a, b, h) : attn_dctx{};
  float m[4], l[4], acc[4][4];
#pragma unroll
  for (int u = 0; u < 4; u++) {
    m[u] = -ATTN_INF;
    l[u] = 0.0f;
  }
  attn_zero<16>(&acc[0][0]);
  for (int kbase = 0; kbase < kend; kbase += ATTN_S_TILE) {
    __syncthreads();  // the previous tile is used up (and sQ is written)
    attn_s_load(sK, D + 1, K, a.sk[1], kbase, ATTN_S_TILE, a.Tk, D);
    attn_s_load(sV, D, V, a.sv[1], kbase, ATTN_S_TILE, a.Tk, D);
    __syncthreads();
    const int key = kbase + lane;
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int row = warp * 4 + u, qi = q0 + row;
      float x = attn_s_dot(sQ + row * D, sK + lane * (D + 1), D) * a.scale_log2;
      if (key >= a.Tk || (a.causal && key > qi)) x = -ATTN_INF;
      const float mnew = fmaxf(m[u], gpukit_warp_max(x));
      const float mu = mnew == -ATTN_INF ? 0.0f : mnew;
      const float alpha = exp2f(m[u] - mu);
      float p = exp2f(x - mu);
      l[u] = l[u] * alpha + gpukit_warp_sum(p);
      m[u] = mnew;
      if (DROP && !attn_keep1(dc, dc.base + (long long)qi * a.Tk + key)) p = 0.0f;  // l is undropped
#pragma unroll
      for (int c = 0; c < 4; c++) acc[u][c] *= alpha;
      attn_s_axpy(acc[u], p, sV, D, D);
    }
  }
  T* O = attn_head<T>(a.o, a.so, b, h);
#pragma unroll
  for (int u = 0; u < 4; u++) {
    const int qi = q0 + warp * 4 + u;
    if (qi >= a.Tq) continue;
    const float inv = l[u] > 0.0f ? (DROP ? a.drop_scale : 1.0f) / l[u] : 0.0f;
    attn_s_store_scaled(O + (long long)qi * a.so[1], acc[u], inv, D, 0);
    if (lane == 0 && a.lse) {
      a.lse[((long long)b * a.H + h) * a.Tq + qi] = l[u] > 0.0f ? (m[u] + log2f(l[u])) * ATTN_LN2 : -ATTN_INF;
    }
  }
}

// attn_bwd_dq_simt: grid (H, B, ⌈Tq/16⌉) in reverse. Shared memory: Q and
// dO [16][D], K and V [32][D+1] in f32.
template <typename T, bool DROP>
__device__ __forceinline__ void attn_bwd_dq_simt(const attn_args& a) {
  ATTN_DYN_SMEM(attn_smem);
  const int D = a.D;
  float* sQ = (float*)attn_smem;
  float* sO = sQ + ATTN_S_ROWS * D;
  float* sK = sO + ATTN_S_ROWS * D;
  float* sV = sK + ATTN_S_TILE * (D + 1);
  const attn_pos pos = attn_block(a);
  const int h = pos.h, b = pos.b;
  const int q0 = attn_qblock(ATTN_S_ROWS, pos);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const T* Q = attn_head<const T>(a.q, a.sq, b, h);
  const T* dO = attn_head<const T>(a.dout, a.sdo, b, h);
  const T* K = attn_head<const T>(a.k, a.sk, b, h);
  const T* V = attn_head<const T>(a.v, a.sv, b, h);
  const long long bh = ((long long)b * a.H + h) * a.Tq;
  const int kend = a.causal ? min(a.Tk, q0 + ATTN_S_ROWS) : a.Tk;

  attn_s_load(sQ, D, Q, a.sq[1], q0, ATTN_S_ROWS, a.Tq, D);
  attn_s_load(sO, D, dO, a.sdo[1], q0, ATTN_S_ROWS, a.Tq, D);
  const attn_dctx dc = DROP ? attn_dctx_make(a, b, h) : attn_dctx{};
  float lse2[4], dl[4], acc[4][4];
#pragma unroll
  for (int u = 0; u < 4; u++) {
    const int qi = q0 + warp * 4 + u;
    lse2[u] = qi < a.Tq ? a.lse[bh + qi] * ATTN_LOG2E : 0.0f;
    dl[u] = qi < a.Tq ? a.delta[bh + qi] : 0.0f;
  }
  attn_zero<16>(&acc[0][0]);
  for (int kbase = 0; kbase < kend; kbase += ATTN_S_TILE) {
    __syncthreads();
    attn_s_load(sK, D + 1, K, a.sk[1], kbase, ATTN_S_TILE, a.Tk, D);
    attn_s_load(sV, D + 1, V, a.sv[1], kbase, ATTN_S_TILE, a.Tk, D);
    __syncthreads();
    const int key = kbase + lane;
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int row = warp * 4 + u, qi = q0 + row;
      const float s = attn_s_dot(sQ + row * D, sK + lane * (D + 1), D);
      float dp = attn_s_dot(sO + row * D, sV + lane * (D + 1), D);
      float p = exp2f(s * a.scale_log2 - lse2[u]);
      if (key >= a.Tk || (a.causal && key > qi)) p = 0.0f;
      if (DROP) dp = attn_keep1(dc, dc.base + (long long)qi * a.Tk + key) ? dp * a.drop_scale : 0.0f;
      attn_s_axpy(acc[u], p * (dp - dl[u]), sK, D + 1, D);  // dQ += dS·K
    }
  }
  T* dQ = attn_head<T>(a.dq, a.sdq, b, h);
#pragma unroll
  for (int u = 0; u < 4; u++) {
    const int qi = q0 + warp * 4 + u;
    if (qi < a.Tq) attn_s_store_scaled(dQ + (long long)qi * a.sdq[1], acc[u], a.scale, D, a.acc_q);
  }
}

// attn_bwd_dkdv_simt: grid (H, B, ⌈Tk/16⌉). Shared memory: K and V [16][D]
// (resident), Q and dO [32][D+1], lse·log2e and δ [32] in f32.
template <typename T, bool DROP>
__device__ __forceinline__ void attn_bwd_dkdv_simt(const attn_args& a) {
  ATTN_DYN_SMEM(attn_smem);
  const int D = a.D;
  float* sK = (float*)attn_smem;
  float* sV = sK + ATTN_S_ROWS * D;
  float* sQ = sV + ATTN_S_ROWS * D;
  float* sO = sQ + ATTN_S_TILE * (D + 1);
  float* sL = sO + ATTN_S_TILE * (D + 1);
  float* sD = sL + ATTN_S_TILE;
  const attn_pos pos = attn_block(a);
  const int h = pos.h, b = pos.b;
  const int k0 = pos.z * ATTN_S_ROWS;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const T* Q = attn_head<const T>(a.q, a.sq, b, h);
  const T* dO = attn_head<const T>(a.dout, a.sdo, b, h);
  const T* K = attn_head<const T>(a.k, a.sk, b, h);
  const T* V = attn_head<const T>(a.v, a.sv, b, h);
  const long long bh = ((long long)b * a.H + h) * a.Tq;
  // causal: the first query tile holding a query ≥ k0
  const int qstart = a.causal ? (k0 / ATTN_S_TILE) * ATTN_S_TILE : 0;

  attn_s_load(sK, D, K, a.sk[1], k0, ATTN_S_ROWS, a.Tk, D);
  attn_s_load(sV, D, V, a.sv[1], k0, ATTN_S_ROWS, a.Tk, D);
  const attn_dctx dc = DROP ? attn_dctx_make(a, b, h) : attn_dctx{};
  float dk[4][4], dv[4][4];
  attn_zero<16>(&dk[0][0]);
  attn_zero<16>(&dv[0][0]);
  for (int qbase = qstart; qbase < a.Tq; qbase += ATTN_S_TILE) {
    __syncthreads();
    attn_s_load(sQ, D + 1, Q, a.sq[1], qbase, ATTN_S_TILE, a.Tq, D);
    attn_s_load(sO, D + 1, dO, a.sdo[1], qbase, ATTN_S_TILE, a.Tq, D);
    attn_tile_stats(sL, sD, ATTN_S_TILE, qbase, bh, a);
    __syncthreads();
    const int qi = qbase + lane;
#pragma unroll
    for (int u = 0; u < 4; u++) {
      const int row = warp * 4 + u, kj = k0 + row;
      const float s = attn_s_dot(sK + row * D, sQ + lane * (D + 1), D);
      float dp = attn_s_dot(sV + row * D, sO + lane * (D + 1), D);
      float p = exp2f(s * a.scale_log2 - sL[lane]);  // 0 past Tq (lse +∞)
      if (a.causal && kj > qi) p = 0.0f;
      float pd = p;  // P∘mask for dV (1/(1−p) at the end)
      if (DROP) {
        const bool keep = attn_keep1(dc, dc.base + (long long)qi * a.Tk + kj);
        dp = keep ? dp * a.drop_scale : 0.0f;
        pd = keep ? p : 0.0f;
      }
      attn_s_axpy(dv[u], pd, sO, D + 1, D);                    // dV += P·dO
      attn_s_axpy(dk[u], p * (dp - sD[lane]), sQ, D + 1, D);  // dK += dS·Q
    }
  }
  T* dK = attn_head<T>(a.dk, a.sdk, b, h);
  T* dV = attn_head<T>(a.dv, a.sdv, b, h);
#pragma unroll
  for (int u = 0; u < 4; u++) {
    const int kj = k0 + warp * 4 + u;
    if (kj >= a.Tk) continue;
    if (a.dk) attn_s_store_scaled(dK + (long long)kj * a.sdk[1], dk[u], a.scale, D, a.acc_k);
    if (a.dv) attn_s_store_scaled(dV + (long long)kj * a.sdv[1], dv[u], DROP ? a.drop_scale : 1.0f, D, a.acc_v);
  }
}

// attn_bwd_delta: δ[b,h,i] = Σ_d dO[b,i,h,d]·O[b,i,h,d] in f32, one warp
// per row (grid-stride over the B·Tq·H rows, 4 warps per block).
template <typename T>
__device__ __forceinline__ void attn_bwd_delta(const attn_args& a) {
  const int lane = threadIdx.x & 31;
  const long long rows = (long long)a.B * a.Tq * a.H;
  for (long long r = ((long long)blockIdx.x * blockDim.x + threadIdx.x) >> 5; r < rows;
       r += ((long long)gridDim.x * blockDim.x) >> 5) {
    const int h = (int)(r % a.H);
    const long long bi = r / a.H;
    const int i = (int)(bi % a.Tq), b = (int)(bi / a.Tq);
    const T* o = (const T*)a.o + b * a.so[0] + (long long)i * a.so[1] + h * a.so[2];
    const T* g = (const T*)a.dout + b * a.sdo[0] + (long long)i * a.sdo[1] + h * a.sdo[2];
    float s = 0.0f;
    for (int d = lane; d < a.D; d += 32) s += gpukit_ld(o + d) * gpukit_ld(g + d);
    s = gpukit_warp_sum(s);
    if (lane == 0) a.delta[((long long)b * a.H + h) * a.Tq + i] = s;
  }
}

// attn_bwd_delta_v: attn_bwd_delta at memory bandwidth. A row of D
// elements is read as L = D/V 16-byte vectors (V = 16/sizeof(T)) by L
// consecutive lanes (L a power of two ≤ 32, so a row's lanes sit in one
// warp), which add their 8-element dot products with log₂ L shuffles.
// Rows are taken in (b, i, h) order, so a warp reads 32/L consecutive heads
// of one token: contiguous memory in the usual [B,T,H,D] layouts. Each
// thread takes two rows' vectors per round (four 16-byte loads in flight
// before the first use). Needs every base address and stride a multiple of
// V elements and B·Tq·H·L < 2³¹ (ops checks; attn_bwd_delta otherwise).
__device__ __forceinline__ float attn_dot16(const float* o, const float* g) {
  const gpukit_u32x4 u = *reinterpret_cast<const gpukit_u32x4*>(o), w = *reinterpret_cast<const gpukit_u32x4*>(g);
  float s = __uint_as_float(u.a) * __uint_as_float(w.a);
  s = fmaf(__uint_as_float(u.b), __uint_as_float(w.b), s);
  s = fmaf(__uint_as_float(u.c), __uint_as_float(w.c), s);
  return fmaf(__uint_as_float(u.d), __uint_as_float(w.d), s);
}
__device__ __forceinline__ float attn_dot16(const gpukit_bf16* o, const gpukit_bf16* g) {
  const gpukit_u32x4 u = *reinterpret_cast<const gpukit_u32x4*>(o), w = *reinterpret_cast<const gpukit_u32x4*>(g);
  const unsigned int uu[4] = {u.a, u.b, u.c, u.d}, ww[4] = {w.a, w.b, w.c, w.d};
  float s = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; k++) {
    s = fmaf(__uint_as_float(uu[k] << 16), __uint_as_float(ww[k] << 16), s);
    s = fmaf(__uint_as_float(uu[k] & 0xffff0000u), __uint_as_float(ww[k] & 0xffff0000u), s);
  }
  return s;
}

template <typename T>
__device__ __forceinline__ void attn_bwd_delta_v(const attn_args& a) {
  constexpr int V = 16 / sizeof(T);
  const int L = a.D / V, lg = __ffs(L) - 1;
  const int lane = threadIdx.x & 31, sub = lane & (L - 1);
  const unsigned int total = (unsigned int)a.B * a.Tq * a.H * L;
  const unsigned int G = gridDim.x * blockDim.x;
  const unsigned int q0 = blockIdx.x * blockDim.x + threadIdx.x;
  // Loop bounds are uniform over a warp (G is a multiple of 32), so every
  // lane reaches the shuffles.
  for (unsigned int base = q0 - lane; base < total; base += 2 * G) {
    float s[2];
    long long out[2];
#pragma unroll
    for (int u = 0; u < 2; u++) {
      const unsigned int q = base + lane + u * G;
      s[u] = 0.0f;
      out[u] = -1;
      if (q < total) {
        const unsigned int r = q >> lg, h = r % a.H, bi = r / a.H, i = bi % a.Tq, b = bi / a.Tq;
        const T* o = (const T*)a.o + b * a.so[0] + (long long)i * a.so[1] + h * a.so[2] + sub * V;
        const T* g = (const T*)a.dout + b * a.sdo[0] + (long long)i * a.sdo[1] + h * a.sdo[2] + sub * V;
        s[u] = attn_dot16(o, g);
        out[u] = ((long long)b * a.H + h) * a.Tq + i;
      }
    }
    for (int o = L >> 1; o > 0; o >>= 1) {
      s[0] += __shfl_xor_sync(0xffffffffu, s[0], o);
      s[1] += __shfl_xor_sync(0xffffffffu, s[1], o);
    }
#pragma unroll
    for (int u = 0; u < 2; u++) {
      if (out[u] >= 0 && sub == 0) a.delta[out[u]] = s[u];
    }
  }
}

// Instances: attn_<fwd|bwd_dq|bwd_dkdv>_simt[_drop]_<dt> (_drop: dropout on P).
#define ATTN_SIMT_INSTANCES(DROPSUF, DROP)                                                                             \
  extern "C" __global__ void __launch_bounds__(ATTN_S_THREADS) attn_fwd_simt##DROPSUF##_f32(const attn_args a) {       \
    if constexpr (GPUKIT_KEEP(attn_fwd_simt##DROPSUF##_f32)) attn_fwd_simt<float, DROP>(a);                            \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(ATTN_S_THREADS) attn_fwd_simt##DROPSUF##_bf16(const attn_args a) {      \
    if constexpr (GPUKIT_KEEP(attn_fwd_simt##DROPSUF##_bf16)) attn_fwd_simt<gpukit_bf16, DROP>(a);                     \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(ATTN_S_THREADS) attn_bwd_dq_simt##DROPSUF##_f32(const attn_args a) {    \
    if constexpr (GPUKIT_KEEP(attn_bwd_dq_simt##DROPSUF##_f32)) attn_bwd_dq_simt<float, DROP>(a);                      \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(ATTN_S_THREADS) attn_bwd_dq_simt##DROPSUF##_bf16(const attn_args a) {   \
    if constexpr (GPUKIT_KEEP(attn_bwd_dq_simt##DROPSUF##_bf16)) attn_bwd_dq_simt<gpukit_bf16, DROP>(a);               \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(ATTN_S_THREADS) attn_bwd_dkdv_simt##DROPSUF##_f32(const attn_args a) {  \
    if constexpr (GPUKIT_KEEP(attn_bwd_dkdv_simt##DROPSUF##_f32)) attn_bwd_dkdv_simt<float, DROP>(a);                  \
  }                                                                                                                    \
  extern "C" __global__ void __launch_bounds__(ATTN_S_THREADS) attn_bwd_dkdv_simt##DROPSUF##_bf16(const attn_args a) { \
    if constexpr (GPUKIT_KEEP(attn_bwd_dkdv_simt##DROPSUF##_bf16)) attn_bwd_dkdv_simt<gpukit_bf16, DROP>(a);           \
  }
ATTN_SIMT_INSTANCES(, false)
ATTN_SIMT_INSTANCES(_drop, true)
extern "C" __global__ void attn_bwd_delta_f32(const attn_args a) { if constexpr (GPUKIT_KEEP(attn_bwd_delta_f32)) attn_bwd_delta<float>(a); }
extern "C" __global__ void attn_bwd_delta_bf16(const attn_args a) { if constexpr (GPUKIT_KEEP(attn_bwd_delta_bf16)) attn_bwd_delta<gpukit_bf16>(a); }
extern "C" __global__ void attn_bwd_delta_v_f32(const attn_args a) { if constexpr (GPUKIT_KEEP(attn_bwd_delta_v_f32)) attn_bwd_delta_v<float>(a); }
extern "C" __global__ void attn_bwd_delta_v_bf16(const attn_args a) { if constexpr (GPUKIT_KEEP(attn_bwd_delta_v_bf16)) attn_bwd_delta_v<gpukit_bf16>(a); }

// ---- decoding with a KV cache ----

#define ATTN_DEC_WARPS 4

// attn_decode: o[b,0,h,:] = softmax(q·Kᵀ·scale)·V over keys 0..pos of the
// caches k, v [B,Tmax,H,D] (pos read on the device, clamped to
// [0, Tmax−1]). Grid (H, B), 4 warps: warp w takes keys w, w+4, ... with
// its own online softmax (lane owns d = lane + 32c); the warps' partial
// results are merged in a fixed order. Strides as in attn_args: q, k, v, o
// each [3] (batch, time, head).
template <typename T>
__device__ __forceinline__ void attn_decode(T* o, const T* q, const T* k, const T* v, const int* pos,
                                            const long long* st, int Tmax, int D, float scale_log2) {
  __shared__ float sm[ATTN_DEC_WARPS], sl[ATTN_DEC_WARPS], sacc[ATTN_DEC_WARPS][128];
  const int h = blockIdx.x, b = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int n = min(max(*pos, 0), Tmax - 1) + 1;
  const T* qr = q + b * st[0] + h * st[2];
  const T* kb = k + b * st[3] + h * st[5];
  const T* vb = v + b * st[6] + h * st[8];
  float qv[4], acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int c = 0; c < 4; c++) {
    int d = lane + 32 * c;
    qv[c] = d < D ? gpukit_ld(qr + d) : 0.0f;
  }
  float m = -ATTN_INF, l = 0.0f;
  for (int j = warp; j < n; j += ATTN_DEC_WARPS) {
    const T* kr = kb + (long long)j * st[4];
    const T* vr = vb + (long long)j * st[7];
    float s = 0.0f;
#pragma unroll
    for (int c = 0; c < 4; c++) {
      int d = lane + 32 * c;
      if (d < D) s += qv[c] * gpukit_ld(kr + d);
    }
    s = gpukit_warp_sum(s) * scale_log2;
    const float mnew = fmaxf(m, s);
    const float alpha = exp2f(m - mnew), p = exp2f(s - mnew);
    l = l * alpha + p;
    m = mnew;
#pragma unroll
    for (int c = 0; c < 4; c++) {
      int d = lane + 32 * c;
      acc[c] = acc[c] * alpha + (d < D ? p * gpukit_ld(vr + d) : 0.0f);
    }
  }
  if (lane == 0) {
    sm[warp] = m;
    sl[warp] = l;
  }
#pragma unroll
  for (int c = 0; c < 4; c++) sacc[warp][lane + 32 * c] = acc[c];
  __syncthreads();
  if (warp != 0) return;
  float M = -ATTN_INF;
  for (int w = 0; w < ATTN_DEC_WARPS; w++) M = fmaxf(M, sm[w]);
  float L = 0.0f, out[4] = {0.0f, 0.0f, 0.0f, 0.0f};
  for (int w = 0; w < ATTN_DEC_WARPS; w++) {
    const float f = sm[w] == -ATTN_INF ? 0.0f : exp2f(sm[w] - M);
    L += f * sl[w];
#pragma unroll
    for (int c = 0; c < 4; c++) out[c] += f * sacc[w][lane + 32 * c];
  }
  T* orow = o + b * st[9] + h * st[11];
#pragma unroll
  for (int c = 0; c < 4; c++) {
    int d = lane + 32 * c;
    if (d < D) gpukit_st(orow + d, out[c] / L);
  }
}

// st: q's batch/time/head strides, then k's, v's and o's (12 values).
struct attn_dec_strides {
  long long s[12];
};

extern "C" __global__ void attn_decode_f32(float* o, const float* q, const float* k, const float* v,
                                           const int* pos, const attn_dec_strides st, int Tmax, int D,
                                           float scale_log2) {
  if constexpr (GPUKIT_KEEP(attn_decode_f32)) attn_decode<float>(o, q, k, v, pos, st.s, Tmax, D, scale_log2);
}
extern "C" __global__ void attn_decode_bf16(gpukit_bf16* o, const gpukit_bf16* q, const gpukit_bf16* k,
                                            const gpukit_bf16* v, const int* pos, const attn_dec_strides st,
                                            int Tmax, int D, float scale_log2) {
  if constexpr (GPUKIT_KEEP(attn_decode_bf16)) attn_decode<gpukit_bf16>(o, q, k, v, pos, st.s, Tmax, D, scale_log2);
}

// attn_kv_write: cache[b, pos, h, d] = x[b, 0, h, d] for every b, h and
// d < D, pos read on the device; nothing is written when pos is outside
// [0, Tmax). Strides: cache (batch, time, head), x (batch, head).
template <typename T>
__device__ __forceinline__ void attn_kv_write(T* cache, const T* x, const int* pos, int B, int H, int D, int Tmax,
                                              long long cb, long long ct, long long ch, long long xb, long long xh) {
  const int p = *pos;
  if (p < 0 || p >= Tmax) return;
  GPUKIT_GRID_STRIDE(i, (long long)B * H * D) {
    const int d = (int)(i % D);
    const long long bh = (long long)(i / D);
    const int h = (int)(bh % H), b = (int)(bh / H);
    cache[b * cb + (long long)p * ct + h * ch + d] = x[b * xb + h * xh + d];
  }
}

extern "C" __global__ void attn_kv_write_f32(float* cache, const float* x, const int* pos, int B, int H, int D,
                                             int Tmax, long long cb, long long ct, long long ch, long long xb,
                                             long long xh) {
  if constexpr (GPUKIT_KEEP(attn_kv_write_f32)) attn_kv_write<float>(cache, x, pos, B, H, D, Tmax, cb, ct, ch, xb, xh);
}
extern "C" __global__ void attn_kv_write_bf16(gpukit_bf16* cache, const gpukit_bf16* x, const int* pos, int B, int H,
                                              int D, int Tmax, long long cb, long long ct, long long ch, long long xb,
                                              long long xh) {
  if constexpr (GPUKIT_KEEP(attn_kv_write_bf16)) attn_kv_write<gpukit_bf16>(cache, x, pos, B, H, D, Tmax, cb, ct, ch, xb, xh);
}
