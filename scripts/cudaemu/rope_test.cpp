// rope_test.cpp: runs libgpu/kernels/rope.cu under the host emulation
// (emu.h) with the launch of libgpu/ops/rope.go (vec 4 or 1, 32- or 64-bit
// indices, a grid of at most 65535 blocks of 256 threads) and checks the
// forward and backward, written and accumulated, f32 and bf16, on a [B, T,
// 3H, D] view of a fused qkv projection (the first 2H heads rotated, v
// copied) and on a plain [B, T, H, D] tensor, against float64 references;
// the elements outside the view stay poisoned.
// Usage: scripts/cuda-emu.sh rope
#include "emu.h"
// clang-format off
#include "../../libgpu/kernels/rope.cu"
// clang-format on
#include <cmath>
#include <cstddef>

#include "emutest.h"

static_assert(offsetof(rope_args, T) == 88, "rope_args");
static_assert(offsetof(rope_args, vec) == 112, "rope_args");

// run checks one launch: x is [B, T, Hx, D] inside rows of ld elements
// per (b, t) (ld ≥ Hx·D, the rest of the row untouched), rot heads rotated.
static void run(int B, int T, int Hx, int D, int rot, int ld, bool bf, bool bwd, bool acc, int vec, bool narrow) {
  char name[160];
  snprintf(name, sizeof name, "%dx%dx%dx%d rot=%d ld=%d %s %s acc=%d vec=%d narrow=%d", B, T, Hx, D, rot, ld, bf ? "bf16" : "f32",
           bwd ? "bwd" : "fwd", acc, vec, narrow);
  const int half = D / 2;
  const long long rows = (long long)B * T;
  Buf x, y, cs, sn;
  x.alloc(rows * ld, bf);
  y.alloc(rows * ld, bf);
  cs.alloc((long long)(T + 1) * D, false);
  sn.alloc((long long)(T + 1) * D, false);
  std::vector<double> c(T * D), s(T * D);
  for (int t = 0; t < T; t++)
    for (int i = 0; i < half; i++) {
      double f = t * pow(10000.0, -2.0 * i / D);
      for (int k : {i, i + half}) {
        cs.set(t * D + k, cos(f));
        sn.set(t * D + k, sin(f));
        c[t * D + k] = cs.get(t * D + k);
        s[t * D + k] = sn.get(t * D + k);
      }
    }
  std::vector<double> xv(rows * Hx * D), old(rows * Hx * D), want(rows * Hx * D), got(rows * Hx * D);
  for (long long r = 0; r < rows; r++)
    for (int e = 0; e < Hx * D; e++) {
      x.set(r * ld + e, randn());
      xv[r * Hx * D + e] = x.get(r * ld + e);
      if (acc) {
        y.set(r * ld + e, randn());
        old[r * Hx * D + e] = y.get(r * ld + e);
      }
    }
  for (long long r = 0; r < rows; r++) {
    const int t = (int)(r % T);
    for (int h = 0; h < Hx; h++)
      for (int i = 0; i < half; i++) {
        const long long o = r * Hx * D + (long long)h * D + i;
        double p1 = xv[o], p2 = xv[o + half], o1 = p1, o2 = p2;
        if (h < rot) {
          double c1 = c[t * D + i], c2 = c[t * D + i + half], s1 = s[t * D + i], s2 = s[t * D + i + half];
          o1 = bwd ? p1 * c1 + p2 * s2 : p1 * c1 - p2 * s1;
          o2 = bwd ? p2 * c2 - p1 * s1 : p2 * c2 + p1 * s2;
        }
        want[o] = o1 + (acc ? old[o] : 0);
        want[o + half] = o2 + (acc ? old[o + half] : 0);
      }
  }
  rope_args a{};
  a.y = y.ptr();
  a.x = x.ptr();
  a.cos = cs.f();
  a.sin = sn.f();
  a.n = rows * Hx * half;
  a.xs0 = a.ys0 = (long long)T * ld;
  a.xs1 = a.ys1 = ld;
  a.xs2 = a.ys2 = D;
  a.T = T, a.H = Hx, a.half = half, a.rot = rot, a.bwd = bwd, a.acc = acc, a.vec = vec, a.narrow = narrow;
  const long long items = a.n / vec;
  const unsigned grid = (unsigned)std::min<long long>(std::max<long long>((items + 255) / 256, 1), 65535);
  emu::launch({grid, 1, 1}, {256, 1, 1}, 0, seed++, [&] {
    if (bf) {
      rope_bf16(a);
    } else {
      rope_f32(a);
    }
  });
  bool outside = true;
  for (long long r = 0; r < rows; r++) {
    for (int e = 0; e < Hx * D; e++) got[r * Hx * D + e] = y.get(r * ld + e);
    for (int e = Hx * D; e < ld; e++) outside = outside && std::isnan(y.get(r * ld + e));
  }
  check(name, got, want, bf ? 1e-2 : 1e-6);
  if (!outside) {
    printf("FAIL %s: written outside the view\n", name);
    failures++;
  }
}

int main() {
  for (bool bf : {false, true})
    for (bool bwd : {false, true})
      for (bool acc : {false, true}) {
        // HRM's fused qkv: [B, T, 3H, D] with q and k rotated, rows padded.
        run(2, 5, 6, 16, 4, 6 * 16 + 8, bf, bwd, acc, 4, true);
        run(2, 5, 6, 16, 4, 6 * 16 + 8, bf, bwd, acc, 4, false);
        run(2, 5, 6, 16, 4, 6 * 16 + 8, bf, bwd, acc, 1, true);
        // D = 6 (half 3: the element kernel only), all heads rotated.
        run(3, 4, 2, 6, 2, 2 * 6, bf, bwd, acc, 1, false);
      }
  return finish();
}
