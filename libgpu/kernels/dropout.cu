// dropout.cu: dropout with a counter-based RNG (libgpu/ops/dropout.go):
//
//   y = x·m/(1−p)  (y += ... with acc), m = [u ≥ p], u uniform in [0, 1)
//
// u comes from Philox4x32-10 (Salmon, Moraes, Dror & Shaw, "Parallel random
// numbers: as easy as 1, 2, 3", SC'11), keyed by the 64-bit seed (k0 low
// word, k1 high) at counter (q low, q high, site, step) for the group of
// elements q = i/4; element i takes word i mod 4, r, and u = (r >> 8)·2⁻²⁴.
// step is read here, on the device, from the i32 counter (null: 0), so a
// captured graph draws a new mask each time the counter moves. off shifts
// the element numbering (element i is drawn as element off + i): a
// data-parallel rank holding rows [r·b, (r+1)·b) of a global batch passes
// off = r·n and draws the masks a single process would for those rows.
// With off a multiple of 4 the groups stay aligned (one draw per 4
// elements); otherwise each element draws its own group. The Go host
// backend computes the same bits (ops.Philox4x32); the backward is this
// kernel on dy with the same seed, site, counter and offset.
#include "common.cuh"
#include "vec.cuh"

// philox4x32_10 applies ten rounds to c in place (Random123's
// philox4x32_R(10, c, k): bump the key before each round but the first).
__device__ __forceinline__ void philox4x32_10(unsigned int* c, unsigned int k0, unsigned int k1) {
#pragma unroll
  for (int r = 0; r < 10; r++) {
    if (r > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    const unsigned int hi0 = __umulhi(0xD2511F53u, c[0]), lo0 = 0xD2511F53u * c[0];
    const unsigned int hi1 = __umulhi(0xCD9E8D57u, c[2]), lo1 = 0xCD9E8D57u * c[2];
    const unsigned int n0 = hi1 ^ c[1] ^ k0, n2 = hi0 ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = lo1;
    c[2] = n2;
    c[3] = lo0;
  }
}

// Philox test hook: out[4] = philox4x32_10(ctr, key) for one counter.
extern "C" __global__ void philox4x32_10_kat(unsigned int* out, unsigned int c0, unsigned int c1,
                                             unsigned int c2, unsigned int c3, unsigned int k0,
                                             unsigned int k1) {
  unsigned int c[4] = {c0, c1, c2, c3};
  philox4x32_10(c, k0, k1);
  for (int i = 0; i < 4; i++) out[i] = c[i];
}

template <typename T, int VEC>
__device__ void dropout(T* y, const T* x, long long n, float p, float scale, unsigned long long seed,
                        unsigned int site, const int* counter, int acc, long long off) {
  const unsigned int k0 = (unsigned int)seed, k1 = (unsigned int)(seed >> 32);
  const unsigned int step = counter ? (unsigned int)*counter : 0u;
  if (off & 3) {  // groups straddle this tensor's: one draw per element
    GPUKIT_GRID_STRIDE(i, n) {
      const long long gi = (long long)i + off, gq = gi >> 2;
      unsigned int r[4] = {(unsigned int)gq, (unsigned int)(gq >> 32), site, step};
      philox4x32_10(r, k0, k1);
      float v = (float)(r[gi & 3] >> 8) * 5.9604644775390625e-08f >= p ? gpukit_ld(x + i) * scale : 0.0f;
      if (acc) v += gpukit_ld(y + i);
      gpukit_st(y + i, v);
    }
    return;
  }
  const long long ng = (n + 3) / 4, q0 = off >> 2;
  GPUKIT_GRID_STRIDE(q, ng) {
    const long long gq = (long long)q + q0;
    unsigned int r[4] = {(unsigned int)gq, (unsigned int)(gq >> 32), site, step};
    philox4x32_10(r, k0, k1);
    const long long i0 = (long long)q * 4;
    float u[4], o[4];
    if (VEC && i0 + 4 <= n) {
      gpukit_ldv<4>(x + i0, u);
      if (acc) gpukit_ldv<4>(y + i0, o);
#pragma unroll
      for (int e = 0; e < 4; e++) {
        const float v = (float)(r[e] >> 8) * 5.9604644775390625e-08f >= p ? u[e] * scale : 0.0f;
        o[e] = acc ? o[e] + v : v;
      }
      gpukit_stv<4>(y + i0, o);
    } else {
      for (int e = 0; e < 4 && i0 + e < n; e++) {
        float v = (float)(r[e] >> 8) * 5.9604644775390625e-08f >= p ? gpukit_ld(x + i0 + e) * scale : 0.0f;
        if (acc) v += gpukit_ld(y + i0 + e);
        gpukit_st(y + i0 + e, v);
      }
    }
  }
}

// Instances: dropout_<s|v>_<dt> (v: groups of 4 moved as one aligned vector).
#define DROPOUT_INSTANCE(SUF, T, VEC)                                                             \
  extern "C" __global__ void dropout_##SUF(T* y, const T* x, long long n, float p, float scale,   \
                                           unsigned long long seed, unsigned int site,             \
                                           const int* counter, int acc, long long off) {           \
    dropout<T, VEC>(y, x, n, p, scale, seed, site, counter, acc, off);                             \
  }

DROPOUT_INSTANCE(s_f32, float, 0)
DROPOUT_INSTANCE(v_f32, float, 1)
DROPOUT_INSTANCE(s_bf16, gpukit_bf16, 0)
DROPOUT_INSTANCE(v_bf16, gpukit_bf16, 1)
