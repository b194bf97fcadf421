// conv2d.cu: the gathers of 2-D convolution as im2col + GEMM
// (libgpu/ops/conv2d.go), channels-last:
//
//   im2col: col[p][(kh·KW + kw)·C + c] = x[n, oh·s−pad+kh, ow·s−pad+kw, c]
//           (0 outside the image), p = ((n−n0)·Ho + oh)·Wo + ow
//   col2im: dx[n,h,w,c] (+)= Σ_{kh,kw: h = oh·s−pad+kh, w = ow·s−pad+kw}
//           dcol[p(n,oh,ow)][(kh·KW + kw)·C + c]
//
// over the images [n0, n0+nc) of one chunk; x and dx are [N,H,W,C], col
// and dcol [nc·Ho·Wo, KH·KW·C], all contiguous. The GEMMs (columns times
// the [Cout, KH·KW·C] filters) are cuBLASLt's. col2im gathers: each dx
// element sums its ≤ KH·KW terms in (kh, kw) order, so it is deterministic
// and needs no atomics. The "v" instances move 16-byte vectors of channels
// (C a multiple of 16/sizeof(T), 16-byte aligned pointers).
//
// conv_igemm_fwd is the forward as an implicit GEMM on tensor cores (bf16):
// no column matrix, the gather folded into the tile loads (see below);
// conv2d_wg.cu has the same products on Hopper's wgmma.
//
// conv_direct_fwd, conv_direct_dx and conv_direct_dw (at the end) compute
// convolutions with a dilation or groups above 1 directly, one output
// element a thread (the weight gradient: a warp): the general path, not
// a tuned one.
#include "common.cuh"
#include "mma.cuh"
#include "vec.cuh"

#ifndef CONV_DYN_SMEM
#define CONV_DYN_SMEM(name) extern __shared__ __align__(16) unsigned char name[]
#endif

struct conv_args {
  int n0, nc, h, w, c;
  int kh, kw, ho, wo;
  int stride, pad, acc;
};
static_assert(sizeof(conv_args) == 48, "conv_args layout: launch.ConvArgs is generated from it (go generate ./libgpu/kernels/launch)");

// conv_im2col: thread i writes vector i of the chunk's columns (V
// channels); the flat index of (p, kh, kw, c) is exactly i·V.
template <typename T, int V>
__device__ void conv_im2col(T* __restrict__ col, const T* __restrict__ x, const conv_args a) {
  const int cv = a.c / V;
  const long long nvec = (long long)a.nc * a.ho * a.wo * a.kh * a.kw * cv;
  GPUKIT_GRID_STRIDE(i, nvec) {
    long long j = (long long)i;
    const int c = (int)(j % cv) * V;
    j /= cv;
    const int kw = (int)(j % a.kw);
    j /= a.kw;
    const int kh = (int)(j % a.kh);
    j /= a.kh;
    const int ow = (int)(j % a.wo);
    j /= a.wo;
    const int oh = (int)(j % a.ho);
    const int n = a.n0 + (int)(j / a.ho);
    const int h = oh * a.stride - a.pad + kh, w = ow * a.stride - a.pad + kw;
    T* dst = col + (long long)i * V;
    if (h < 0 || h >= a.h || w < 0 || w >= a.w) {
      if constexpr (V * sizeof(T) == 16) {
        *reinterpret_cast<gpukit_u32x4*>(dst) = gpukit_u32x4{0u, 0u, 0u, 0u};
      } else {
#pragma unroll
        for (int k = 0; k < V; k++) dst[k] = T(0);
      }
      continue;
    }
    const T* src = x + (((long long)n * a.h + h) * a.w + w) * a.c + c;
    if constexpr (V * sizeof(T) == 16) {
      *reinterpret_cast<gpukit_u32x4*>(dst) = *reinterpret_cast<const gpukit_u32x4*>(src);
    } else {
#pragma unroll
      for (int k = 0; k < V; k++) dst[k] = src[k];
    }
  }
}

// conv_col2im: thread i owns element i of the chunk's images of dx.
template <typename T>
__device__ void conv_col2im(T* __restrict__ dx, const T* __restrict__ dcol, const conv_args a) {
  const long long n = (long long)a.nc * a.h * a.w * a.c;
  const long long K = (long long)a.kh * a.kw * a.c;
  T* base = dx + (long long)a.n0 * a.h * a.w * a.c;
  GPUKIT_GRID_STRIDE(i, n) {
    long long j = (long long)i;
    const int c = (int)(j % a.c);
    j /= a.c;
    const int w = (int)(j % a.w);
    j /= a.w;
    const int h = (int)(j % a.h);
    const int m = (int)(j / a.h);  // image within the chunk
    float s = 0.0f;
    for (int kh = 0; kh < a.kh; kh++) {
      const int th = h + a.pad - kh;
      if (th < 0 || th % a.stride != 0) continue;
      const int oh = th / a.stride;
      if (oh >= a.ho) continue;
      for (int kw = 0; kw < a.kw; kw++) {
        const int tw = w + a.pad - kw;
        if (tw < 0 || tw % a.stride != 0) continue;
        const int ow = tw / a.stride;
        if (ow >= a.wo) continue;
        const long long p = ((long long)m * a.ho + oh) * a.wo + ow;
        s += gpukit_ld(dcol + p * K + (kh * a.kw + kw) * a.c + c);
      }
    }
    if (a.acc) s += gpukit_ld(base + i);
    gpukit_st(base + i, s);
  }
}

// ---- implicit GEMM (bf16, tensor cores) ----
//
// Y[p, co] = bias[co] + Σ_k A[p, k]·W[co, k] with p = (n, oh, ow), k = (kh,
// kw, ci) and A[p, k] = x[n, oh·s − pad + kh, ow·s − pad + kw, ci] (0 outside
// the image): the im2col GEMM with A never stored. A block computes 128
// rows p × 64 output channels with 4 warps (2 × 2, each 64 × 32: 4 × 4
// mma.m16n8k16 tiles, f32 accumulators), stepping through K in chunks of
// 32 channels of one tap (Cin a multiple of 32, so a chunk never straddles
// taps): the chunk's A tile is 128 rows of 64 contiguous bytes of x (a
// row's pixel, or zeros: cp.async with src-size 0 off the image), its W
// tile 64 rows of 64 contiguous bytes, both in padded shared rows (40
// elements: 8 ldmatrix rows hit 8 distinct 16-byte bank groups), double
// buffered (the next chunk's copies fly while this one's mma run). The
// epilogue adds the bias (and the fused per-sample bias and residual,
// conv_out2) and stores (or adds, with acc) bf16 pairs (single values for
// an odd Cout: a conv_out to one channel; no fused terms there). With a
// fused input map each thread maps its own landed A chunks in place
// (conv_prologue) before the barrier that hands the buffer to the MMA. Rows past P and
// channels past Cout are masked (their W rows read as zeros). The backward
// of the input for stride 1 is this kernel on dY with the filters flipped
// (conv_flip_w).

#include "conv2d.cuh"

#define CI_BM 128
#define CI_BN 64
#define CI_BK 32
#define CI_LDS 40
#define CI_ATILE (CI_BM * CI_LDS * 2)  // bytes
#define CI_BTILE (CI_BN * CI_LDS * 2)

extern "C" __global__ void __launch_bounds__(128) conv_igemm_fwd(const conv_igemm_args a) {
  CONV_DYN_SMEM(conv_smem);
  const unsigned sA = gpukit_smem_addr(conv_smem);
  const unsigned sB = sA + 2 * CI_ATILE;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
  const int wm = warp >> 1, wn = warp & 1;
  const long long P = (long long)a.n * a.ho * a.wo;
  const long long p0 = (long long)blockIdx.x * CI_BM;
  const int co0 = blockIdx.y * CI_BN;
  const int K = a.kh * a.kw * a.cin, nchunks = K / CI_BK, cpt = a.cin / CI_BK;
  const int cc = (tid & 3) * 8;  // this thread's 16-byte column chunk of a tile row

  // The four A rows and two W rows this thread copies, fixed for the block.
  conv_pix arow[4];
#pragma unroll
  for (int i = 0; i < 4; i++) arow[i] = conv_pixel(a, p0 + (tid >> 2) + 32 * i);
  bool brow[2];
  const gpukit_bf16* wrow[2];
#pragma unroll
  for (int i = 0; i < 2; i++) {
    const int co = co0 + (tid >> 2) + 32 * i;
    brow[i] = co < a.cout;
    wrow[i] = a.w + (long long)(brow[i] ? co : 0) * K + cc;
  }
  auto load = [&](int buf, int c) {
    const int tap = c / cpt, ci0 = (c - tap * cpt) * CI_BK;
    const int dh = tap / a.kw, dw = tap - dh * a.kw;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      const gpukit_bf16* src = conv_src(a, arow[i], dh, dw, ci0 + cc);
      gpukit_cp16(sA + buf * CI_ATILE + (((tid >> 2) + 32 * i) * CI_LDS + cc) * 2, src ? src : a.x, src != nullptr);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
      gpukit_cp16(sB + buf * CI_BTILE + (((tid >> 2) + 32 * i) * CI_LDS + cc) * 2,
                  brow[i] ? wrow[i] + (long long)c * CI_BK : a.w, brow[i]);
    }
  };

  float acc[4][4][4];
#pragma unroll
  for (int mi = 0; mi < 4; mi++)
#pragma unroll
    for (int nj = 0; nj < 4; nj++) acc[mi][nj][0] = acc[mi][nj][1] = acc[mi][nj][2] = acc[mi][nj][3] = 0.0f;

  // prologue maps this thread's landed A chunks of chunk c in buffer buf
  // (the fused input map; chunks off the image stay zero).
  auto prologue = [&](int buf, int c) {
    if (!a.pro_scale) return;
    const int tap = c / cpt, ci0 = (c - tap * cpt) * CI_BK;
    const int dh = tap / a.kw, dw = tap - dh * a.kw;
#pragma unroll
    for (int i = 0; i < 4; i++) {
      if (conv_src(a, arow[i], dh, dw, ci0 + cc))
        conv_prologue(conv_smem + buf * CI_ATILE + (((tid >> 2) + 32 * i) * CI_LDS + cc) * 2, a, arow[i].img, ci0 + cc);
    }
  };
  load(0, 0);
  gpukit_cp_commit();
  gpukit_cp_wait0();
  prologue(0, 0);
  __syncthreads();
  for (int c = 0; c < nchunks; c++) {
    const int buf = c & 1;
    if (c + 1 < nchunks) {
      load(buf ^ 1, c + 1);
      gpukit_cp_commit();
    }
    const unsigned as = sA + buf * CI_ATILE, bs = sB + buf * CI_BTILE;
#pragma unroll
    for (int kk = 0; kk < CI_BK / 16; kk++) {
      unsigned af[4][4];
#pragma unroll
      for (int mi = 0; mi < 4; mi++) gpukit_ldsm_x4(af[mi], gpukit_a_addr<CI_LDS>(as, wm * 64 + mi * 16, kk * 16, lane));
#pragma unroll
      for (int np = 0; np < 2; np++) {
        unsigned bf[4];
        gpukit_ldsm_x4(bf, gpukit_b_addr<CI_LDS>(bs, wn * 32 + np * 16, kk * 16, lane));
#pragma unroll
        for (int mi = 0; mi < 4; mi++) {
          gpukit_mma_bf16(acc[mi][2 * np], af[mi], bf[0], bf[1]);
          gpukit_mma_bf16(acc[mi][2 * np + 1], af[mi], bf[2], bf[3]);
        }
      }
    }
    gpukit_cp_wait0();
    if (c + 1 < nchunks) prologue(buf ^ 1, c + 1);
    __syncthreads();
  }

  const bool pairs = (a.cout & 1) == 0;  // bf16 pairs at 4-byte aligned addresses; else one by one
#pragma unroll
  for (int nj = 0; nj < 4; nj++) {
    const int col = co0 + wn * 32 + nj * 8 + 2 * t;
    if (col >= a.cout) continue;
    const bool two = col + 1 < a.cout;
    float b0 = 0.0f, b1 = 0.0f;
    if (a.bias) {
      b0 = gpukit_ld(a.bias + col);
      if (two) b1 = gpukit_ld(a.bias + col + 1);
    }
#pragma unroll
    for (int mi = 0; mi < 4; mi++) {
#pragma unroll
      for (int hf = 0; hf < 2; hf++) {
        const long long row = p0 + wm * 64 + mi * 16 + g + 8 * hf;
        if (row >= P) continue;
        gpukit_bf16* dst = a.y + row * a.cout + col;
        float v0 = acc[mi][nj][2 * hf] + b0, v1 = acc[mi][nj][2 * hf + 1] + b1;
        if (pairs) {
          conv_out2(a, row, col, v0, v1);
          continue;
        }
        if (a.acc) v0 += gpukit_ld(dst);
        gpukit_st(dst, v0);
        if (two) {
          if (a.acc) v1 += gpukit_ld(dst + 1);
          gpukit_st(dst + 1, v1);
        }
      }
    }
  }
}


// conv_flip_w: wf[ci][kh][kw][co] = w[co][KH−1−kh][KW−1−kw][ci], the filters
// of the transposed convolution that computes dx from dy (stride 1).
extern "C" __global__ void conv_flip_w(gpukit_bf16* wf, const gpukit_bf16* w, int cout, int kh, int kw, int cin) {
  const long long n = (long long)cout * kh * kw * cin;
  GPUKIT_GRID_STRIDE(i, n) {
    long long j = (long long)i;
    const int co = (int)(j % cout);
    j /= cout;
    const int x = (int)(j % kw);
    j /= kw;
    const int y = (int)(j % kh);
    const int ci = (int)(j / kh);
    wf[i] = w[(((long long)co * kh + (kh - 1 - y)) * kw + (kw - 1 - x)) * cin + ci];
  }
}

// ---- direct kernels: dilation and groups ----
//
// For stride s, padding p, dilation d and G groups (g the group of output
// channel o, Cig = Cin/G and Cog = Cout/G channels a group; x [N,H,W,Cin],
// w [Cout,KH,KW,Cig], y and dy [N,Ho,Wo,Cout], all contiguous):
//
//   fwd: y[n,i,j,o] (+)= bias[o] + Σ_{kh,kw,c<Cig} x[n, i·s−p+kh·d, j·s−p+kw·d, g·Cig+c]·w[o,kh,kw,c]
//   dx:  dx[n,h,w,g·Cig+c] (+)= Σ_{kh,kw,o in g: h = i·s−p+kh·d, w = j·s−p+kw·d} dy[n,i,j,o]·w[o,kh,kw,c]
//   dw:  dw[o,kh,kw,c] (+)= Σ_{n,i,j} dy[n,i,j,o]·x[n, i·s−p+kh·d, j·s−p+kw·d, g·Cig+c]
//
// (x is 0 off the image; (+)= adds with acc). One thread an element of y
// or dx, summing its terms in the order written (kh, kw, then c or o) in
// f32; one warp an element of dw, lane l summing positions l, l+32, ... in
// order and gpukit_warp_sum adding the lanes in a fixed butterfly. No
// atomics, so every result is deterministic. Correct at every shape, not
// tuned (libgpu/ops runs its GEMM paths where d = 1 and G = 1).

struct conv_direct_args {
  int n, h, w, cin, cout;
  int kh, kw, ho, wo;
  int stride, pad, dil, groups, acc;
};
static_assert(sizeof(conv_direct_args) == 56, "conv_direct_args layout: launch.ConvDirectArgs is generated from it (go generate ./libgpu/kernels/launch)");

template <typename T>
__device__ void conv_direct_fwd(T* __restrict__ y, const T* __restrict__ x, const T* __restrict__ w,
                                const T* __restrict__ bias, const conv_direct_args a) {
  const int cig = a.cin / a.groups, cog = a.cout / a.groups;
  const long long taps = (long long)a.kh * a.kw * cig;
  const long long total = (long long)a.n * a.ho * a.wo * a.cout;
  GPUKIT_GRID_STRIDE(i, total) {
    long long j = (long long)i;
    const int o = (int)(j % a.cout);
    j /= a.cout;
    const int ow = (int)(j % a.wo);
    j /= a.wo;
    const int oh = (int)(j % a.ho);
    const long long img = j / a.ho;
    const int c0 = (o / cog) * cig;
    const T* wrow = w + (long long)o * taps;
    float s = 0.0f;
    for (int kh = 0; kh < a.kh; kh++) {
      const int h = oh * a.stride - a.pad + kh * a.dil;
      if (h < 0 || h >= a.h) continue;
      for (int kw = 0; kw < a.kw; kw++) {
        const int ww = ow * a.stride - a.pad + kw * a.dil;
        if (ww < 0 || ww >= a.w) continue;
        const T* xr = x + ((img * a.h + h) * a.w + ww) * a.cin + c0;
        const T* wr = wrow + (long long)(kh * a.kw + kw) * cig;
        for (int c = 0; c < cig; c++) s += gpukit_ld(xr + c) * gpukit_ld(wr + c);
      }
    }
    if (bias) s += gpukit_ld(bias + o);
    if (a.acc) s += gpukit_ld(y + i);
    gpukit_st(y + i, s);
  }
}

template <typename T>
__device__ void conv_direct_dx(T* __restrict__ dx, const T* __restrict__ dy, const T* __restrict__ w,
                               const conv_direct_args a) {
  const int cig = a.cin / a.groups, cog = a.cout / a.groups;
  const long long taps = (long long)a.kh * a.kw * cig;  // w's elements per output channel
  const long long total = (long long)a.n * a.h * a.w * a.cin;
  GPUKIT_GRID_STRIDE(i, total) {
    long long j = (long long)i;
    const int ci = (int)(j % a.cin);
    j /= a.cin;
    const int ww = (int)(j % a.w);
    j /= a.w;
    const int h = (int)(j % a.h);
    const long long img = j / a.h;
    const int g = ci / cig, c = ci - g * cig;
    float s = 0.0f;
    for (int kh = 0; kh < a.kh; kh++) {
      const int th = h + a.pad - kh * a.dil;
      if (th < 0 || th % a.stride != 0) continue;
      const int oh = th / a.stride;
      if (oh >= a.ho) continue;
      for (int kw = 0; kw < a.kw; kw++) {
        const int tw = ww + a.pad - kw * a.dil;
        if (tw < 0 || tw % a.stride != 0) continue;
        const int ow = tw / a.stride;
        if (ow >= a.wo) continue;
        const T* dyr = dy + ((img * a.ho + oh) * a.wo + ow) * a.cout + (long long)g * cog;
        const T* wr = w + (long long)g * cog * taps + (long long)(kh * a.kw + kw) * cig + c;
        for (int o = 0; o < cog; o++) s += gpukit_ld(dyr + o) * gpukit_ld(wr + o * taps);
      }
    }
    if (a.acc) s += gpukit_ld(dx + i);
    gpukit_st(dx + i, s);
  }
}

// conv_direct_dw: warp e of the grid (grid-stride over the warps) owns dw
// element e; blockDim.x must be a multiple of 32 (every lane of a warp
// runs the same iterations, so the shuffles see the whole warp).
template <typename T, typename G>
__device__ void conv_direct_dw(G* __restrict__ dw, const T* __restrict__ dy, const T* __restrict__ x,
                               const conv_direct_args a) {
  const int cig = a.cin / a.groups, cog = a.cout / a.groups;
  const long long total = (long long)a.cout * a.kh * a.kw * cig;
  const long long P = (long long)a.n * a.ho * a.wo;
  const int lane = threadIdx.x & 31;
  const long long wpb = blockDim.x >> 5;
  for (long long e = (long long)blockIdx.x * wpb + (threadIdx.x >> 5); e < total; e += (long long)gridDim.x * wpb) {
    long long j = e;
    const int c = (int)(j % cig);
    j /= cig;
    const int kw = (int)(j % a.kw);
    j /= a.kw;
    const int kh = (int)(j % a.kh);
    const int o = (int)(j / a.kh);
    const int ci = (o / cog) * cig + c;
    float s = 0.0f;
    for (long long p = lane; p < P; p += 32) {
      long long q = p;
      const int ow = (int)(q % a.wo);
      q /= a.wo;
      const int oh = (int)(q % a.ho);
      const long long img = q / a.ho;
      const int h = oh * a.stride - a.pad + kh * a.dil, ww = ow * a.stride - a.pad + kw * a.dil;
      if (h < 0 || h >= a.h || ww < 0 || ww >= a.w) continue;
      s += gpukit_ld(dy + p * a.cout + o) * gpukit_ld(x + ((img * a.h + h) * a.w + ww) * a.cin + ci);
    }
    s = gpukit_warp_sum(s);
    if (lane == 0) {
      if (a.acc) s += gpukit_ld(dw + e);
      gpukit_st(dw + e, s);
    }
  }
}

// Instances: conv_im2col_<s|v>_<dt>, conv_col2im_<dt>, conv_direct_fwd_<dt>,
// conv_direct_dx_<dt>; conv_direct_dw_<dt>_<dw dt> (dw f32 or x's dtype).
#define CONV_INSTANCE(DT, T)                                                                        \
  extern "C" __global__ void conv_im2col_s_##DT(T* col, const T* x, const conv_args a) {            \
    conv_im2col<T, 1>(col, x, a);                                                                   \
  }                                                                                                 \
  extern "C" __global__ void conv_im2col_v_##DT(T* col, const T* x, const conv_args a) {            \
    conv_im2col<T, 16 / sizeof(T)>(col, x, a);                                                      \
  }                                                                                                 \
  extern "C" __global__ void conv_col2im_##DT(T* dx, const T* dcol, const conv_args a) {            \
    conv_col2im<T>(dx, dcol, a);                                                                    \
  }                                                                                                 \
  extern "C" __global__ void conv_direct_fwd_##DT(T* y, const T* x, const T* w, const T* bias,      \
                                                  const conv_direct_args a) {                       \
    conv_direct_fwd<T>(y, x, w, bias, a);                                                           \
  }                                                                                                 \
  extern "C" __global__ void conv_direct_dx_##DT(T* dx, const T* dy, const T* w,                    \
                                                 const conv_direct_args a) {                        \
    conv_direct_dx<T>(dx, dy, w, a);                                                                \
  }

#define CONV_DIRECT_DW_INSTANCE(DT, T, GDT, G)                                                      \
  extern "C" __global__ void conv_direct_dw_##DT##_##GDT(G* dw, const T* dy, const T* x,            \
                                                         const conv_direct_args a) {                \
    conv_direct_dw<T, G>(dw, dy, x, a);                                                             \
  }

CONV_INSTANCE(f32, float)
CONV_INSTANCE(bf16, gpukit_bf16)
CONV_DIRECT_DW_INSTANCE(f32, float, f32, float)
CONV_DIRECT_DW_INSTANCE(bf16, gpukit_bf16, bf16, gpukit_bf16)
CONV_DIRECT_DW_INSTANCE(bf16, gpukit_bf16, f32, float)
