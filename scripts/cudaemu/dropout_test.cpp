// dropout_test.cpp: runs libgpu/kernels/dropout.cu under the host emulation
// (emu.h) with the launch geometry of libgpu/ops/dropout.go (gridFor((n+3)/4,
// 256)) and checks the element offset of data-parallel shards: a tensor of
// S·n elements dropped at offset 0, and each of its S shards of n elements
// dropped at offset r·n, give bitwise the same elements (f32 and bf16,
// vectorised and scalar instances, forward and accumulating backward), for
// n a multiple of 4 (groups stay aligned) and not (one draw per element);
// and the masks follow ops.DropoutKeep's rule, computed here from a C copy
// of Philox4x32-10. Usage: scripts/cuda-emu.sh dropout
#include "emu.h"

// What emu.h leaves out and this kernel uses.
inline unsigned __umulhi(unsigned a, unsigned b) { return (unsigned)(((uint64_t)a * b) >> 32); }

// clang-format off
#include "../../libgpu/kernels/dropout.cu"
// clang-format on
#include "emutest.h"

// keep is ops.DropoutKeep: word i mod 4 of Philox4x32-10 at counter
// (i/4 low, i/4 high, site, step) under the seed, u = top 24 bits · 2⁻²⁴.
static bool keep(uint64_t s, unsigned site, unsigned step, long long i, float p) {
  unsigned c[4] = {(unsigned)(i / 4), (unsigned)((uint64_t)(i / 4) >> 32), site, step};
  unsigned k0 = (unsigned)s, k1 = (unsigned)(s >> 32);
  for (int r = 0; r < 10; r++) {
    if (r > 0) {
      k0 += 0x9E3779B9u;
      k1 += 0xBB67AE85u;
    }
    uint64_t a = (uint64_t)0xD2511F53u * c[0], b = (uint64_t)0xCD9E8D57u * c[2];
    unsigned n0 = (unsigned)(b >> 32) ^ c[1] ^ k0, n2 = (unsigned)(a >> 32) ^ c[3] ^ k1;
    c[0] = n0;
    c[1] = (unsigned)b;
    c[2] = n2;
    c[3] = (unsigned)a;
  }
  return (float)(c[i % 4] >> 8) * (1.0f / (1 << 24)) >= p;
}

static void run(Buf& y, Buf& x, long long n, float p, uint64_t s, unsigned site, const int* ctr, int acc, long long off,
                bool vec) {
  const float scale = 1 / (1 - p);
  const unsigned g = (unsigned)std::min(std::max((((n + 3) / 4) + 255) / 256, 1LL), 65535LL);
  emu::launch({g, 1, 1}, {256, 1, 1}, 0, seed++, [&] {
    if (x.bf) {
      if (vec)
        dropout_v_bf16(y.h(), x.h(), n, p, scale, s, site, ctr, acc, off);
      else
        dropout_s_bf16(y.h(), x.h(), n, p, scale, s, site, ctr, acc, off);
    } else {
      if (vec)
        dropout_v_f32(y.f(), x.f(), n, p, scale, s, site, ctr, acc, off);
      else
        dropout_s_f32(y.f(), x.f(), n, p, scale, s, site, ctr, acc, off);
    }
  });
}

int main() {
  const uint64_t s = 0x9e3779b97f4a7c15ull;
  const float p = 0.3f;
  const unsigned site = 5;
  int counter = 41;
  for (bool bf : {false, true})
    for (bool vec : {false, true})
      for (long long n : {36LL, 13LL, 1030LL})
        for (int acc : {0, 1}) {
          const int S = 3;
          const long long N = S * n;
          Buf x, y, ys, base;
          x.alloc(N, bf);
          y.alloc(N, bf);
          ys.alloc(N, bf);
          base.alloc(N, bf);
          x.fill(N, 1);
          std::vector<double> b0 = base.fill(N, 1);
          for (long long i = 0; i < N; i++) {
            y.set(i, b0[i]);
            ys.set(i, b0[i]);
          }
          emu::untrack();
          x.track();
          y.track();
          ys.track();
          run(y, x, N, p, s, site, &counter, acc, 0, vec);
          for (int r = 0; r < S; r++) {
            Buf xs, yr;
            xs.alloc(n, bf);
            yr.alloc(n, bf);
            for (long long i = 0; i < n; i++) {
              xs.set(i, x.get(r * n + i));
              yr.set(i, b0[r * n + i]);
            }
            xs.track();
            yr.track();
            run(yr, xs, n, p, s, site, &counter, acc, r * n, vec);
            for (long long i = 0; i < n; i++) ys.set(r * n + i, yr.get(i));
          }
          std::vector<double> want(N);
          long long kept = 0;
          for (long long i = 0; i < N; i++) {
            bool k = keep(s, site, (unsigned)counter, i, p);
            kept += k;
            float v = k ? (float)x.get(i) * (1 / (1 - p)) : 0.0f;
            if (acc) v += (float)b0[i];
            Buf one;
            one.alloc(1, bf);
            one.set(0, v);
            want[i] = one.get(0);
          }
          char name[96];
          snprintf(name, sizeof name, "%s %s n=%lld acc=%d: %d shards = whole", bf ? "bf16" : "f32", vec ? "v" : "s", n, acc,
                   S);
          check(name, ys.read(N), y.read(N), 0);
          snprintf(name, sizeof name, "%s %s n=%lld acc=%d: whole = DropoutKeep (kept %lld of %lld)", bf ? "bf16" : "f32",
                   vec ? "v" : "s", n, acc, kept, N);
          check(name, y.read(N), want, 0);
        }
  return finish();
}
