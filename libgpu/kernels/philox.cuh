// philox.cuh: Philox4x32-10 (Salmon, Moraes, Dror & Shaw, "Parallel random
// numbers: as easy as 1, 2, 3", SC'11; Random123's philox4x32_R(10, c, k):
// the key is bumped before every round but the first), the counter-based
// generator of dropout.cu, shared here by the kernels that draw normal
// noise (diffusion.cu). The Go host backend computes the same bits
// (ops.Philox4x32).
#pragma once
#include "common.cuh"

__device__ __forceinline__ void gpukit_philox4x32_10(unsigned int* c, unsigned int k0, unsigned int k1) {
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

// gpukit_normal4 draws four standard normals z[0..4) for group q of the
// stream (seed, stream, step): the Philox words r of counter (q low,
// q high, stream, step) under key (seed low, seed high), paired by the
// Box–Muller transform (Box & Muller 1958): u1 = ((r0 >> 8) + 1)·2⁻²⁴ in
// (0, 1], u2 = (r1 >> 8)·2⁻²⁴ in [0, 1), z0 = √(−2 ln u1)·cos 2πu2,
// z1 = √(−2 ln u1)·sin 2πu2; z2, z3 likewise from r2, r3.
__device__ __forceinline__ void gpukit_normal4(unsigned long long q, unsigned long long seed, unsigned int stream,
                                               unsigned int step, float* z) {
  unsigned int r[4] = {(unsigned int)q, (unsigned int)(q >> 32), stream, step};
  gpukit_philox4x32_10(r, (unsigned int)seed, (unsigned int)(seed >> 32));
#pragma unroll
  for (int k = 0; k < 4; k += 2) {
    const float u1 = (float)((r[k] >> 8) + 1u) * 5.9604644775390625e-08f;
    const float u2 = (float)(r[k + 1] >> 8) * 5.9604644775390625e-08f;
    const float rad = sqrtf(-2.0f * logf(u1));
    float sn, cs;
    sincospif(2.0f * u2, &sn, &cs);
    z[k] = rad * cs;
    z[k + 1] = rad * sn;
  }
}
