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
#include "common.cuh"
#include "vec.cuh"

struct conv_args {
  int n0, nc, h, w, c;
  int kh, kw, ho, wo;
  int stride, pad, acc;
};

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

// Instances: conv_im2col_<s|v>_<dt>, conv_col2im_<dt>.
#define CONV_INSTANCE(DT, T)                                                                        \
  extern "C" __global__ void conv_im2col_s_##DT(T* col, const T* x, const conv_args a) {            \
    conv_im2col<T, 1>(col, x, a);                                                                   \
  }                                                                                                 \
  extern "C" __global__ void conv_im2col_v_##DT(T* col, const T* x, const conv_args a) {            \
    conv_im2col<T, 16 / sizeof(T)>(col, x, a);                                                      \
  }                                                                                                 \
  extern "C" __global__ void conv_col2im_##DT(T* dx, const T* dcol, const conv_args a) {            \
    conv_col2im<T>(dx, dcol, a);                                                                    \
  }

CONV_INSTANCE(f32, float)
CONV_INSTANCE(bf16, gpukit_bf16)
